// GPUFlex web portal: live updates, the peers filter, the audit button and copy buttons.
// The server renders every region (escaped); this script only swaps finished HTML in, so the
// page works without it (minus live updates) and no data ever becomes markup here.
"use strict";

(function () {
  const body = document.body;

  function setPortalDown(down) {
    const el = document.getElementById("portal-banner");
    if (el) el.hidden = !down;
  }

  // Replace a region's content, keeping keyboard focus on the same link or control.
  function swap(name, html) {
    const region = document.querySelector('[data-region="' + name + '"]');
    if (!region) return;
    const active = document.activeElement;
    let key = null;
    if (active && region.contains(active)) {
      key = active.id ? "#" + CSS.escape(active.id)
        : active.getAttribute("href") ? '[href="' + CSS.escape(active.getAttribute("href")) + '"]'
        : null;
    }
    const doc = new DOMParser().parseFromString("<!doctype html><body>" + html, "text/html");
    region.replaceChildren(...Array.from(doc.body.childNodes));
    if (key) {
      const again = region.querySelector(key);
      if (again) again.focus();
    }
  }

  // The peers filter: the same rule as the server (a case-insensitive substring of the row's
  // search text), applied as the user types and after every live update.
  function applyFilter() {
    const input = document.getElementById("peer-filter");
    if (!input) return;
    const q = input.value.trim().toLowerCase();
    let shown = 0;
    document.querySelectorAll("tr[data-search]").forEach(function (row) {
      row.hidden = q !== "" && !row.dataset.search.includes(q);
      if (!row.hidden) shown += 1;
    });
    const count = document.querySelector("[data-shown]");
    if (count) count.textContent = String(shown);
  }

  function watchFilter() {
    const input = document.getElementById("peer-filter");
    if (!input) return;
    input.addEventListener("input", function () {
      applyFilter();
      const url = new URL(window.location.href);
      if (input.value.trim()) url.searchParams.set("q", input.value.trim());
      else url.searchParams.delete("q");
      window.history.replaceState(null, "", url);
    });
  }

  let source = null;
  function connect() {
    const live = body.dataset.live;
    if (!live || !window.EventSource) return;
    source = new EventSource(live);
    source.addEventListener("update", function (e) {
      const msg = JSON.parse(e.data);
      Object.keys(msg.regions).forEach(function (name) { swap(name, msg.regions[name]); });
      setPortalDown(false);
      applyFilter();
    });
    source.addEventListener("open", function () { setPortalDown(false); });
    source.addEventListener("error", function () {
      setPortalDown(true);
      // The browser retries an interrupted stream by itself; one refused outright stays
      // closed, so start over a little later.
      if (source.readyState === EventSource.CLOSED) {
        source.close();
        window.setTimeout(connect, 3000);
      }
    });
  }

  function watchAudit() {
    const form = document.getElementById("audit-form");
    if (!form) return;
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      const out = document.getElementById("audit-result");
      const button = document.getElementById("audit-button");
      button.disabled = true;
      out.replaceChildren();
      const p = document.createElement("p");
      p.className = "verdict wait";
      p.textContent = "Auditing: fetching the signed ledger from the node and checking every round…";
      out.appendChild(p);
      fetch(form.action, { method: "POST", headers: { Accept: "application/json" } })
        .then(function (r) { return r.json(); })
        .then(function (v) {
          p.className = "verdict " + (v.ok ? "ok" : "bad");
          p.textContent = v.text;
        })
        .catch(function () {
          p.className = "verdict bad";
          p.textContent = "The portal did not answer; try again.";
        })
        .finally(function () { button.disabled = false; });
    });
  }

  function watchCopy() {
    document.addEventListener("click", function (e) {
      const button = e.target.closest("button[data-copy]");
      if (!button) return;
      const code = document.getElementById(button.dataset.copy);
      if (!code) return;
      const done = function () { button.textContent = "Copied"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(code.textContent).then(done);
      } else {
        const range = document.createRange();
        range.selectNodeContents(code);
        const sel = window.getSelection();
        sel.removeAllRanges();
        sel.addRange(range);
        button.textContent = "Selected: press Ctrl+C";
      }
    });
  }

  watchFilter();
  applyFilter();
  watchAudit();
  watchCopy();
  connect();
})();
