"""What each page shows, as plain context built from one Snapshot.

A page is a set of named regions. The server renders each region from a partial template,
both for the first page load and for every live update it pushes, so there is one renderer
and the browser's script only swaps finished, escaped HTML into place. Sorting and filtering
of the peers table happen here too (and again in the script as the user types, with the same
rule: a case-insensitive substring of the row's search text).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from gpuflex_web.charts import bar_chart, line_chart
from gpuflex_web.credit import compute_credit, top
from gpuflex_web.hub import Snapshot
from gpuflex_web.model import MEMBER_FIELDS, Job, LedgerRound, Peer, human_bytes
from gpuflex_web.qr import qr_svg
from gpuflex_web.serving import serving_view

Params = Mapping[str, str]

STATE_ORDER = {"up": 0, "suspect": 1, "down": 2}
REACH_ORDER = {"public": 0, "relayed": 1, "private": 2, "unknown": 3}
PEER_COLUMNS: dict[str, tuple[str, Callable[[Peer], Any]]] = {
    "state": ("State", lambda p: (STATE_ORDER.get(p.state, 3), p.peer_id)),
    "peer": ("Peer", lambda p: p.peer_id),
    "rtt": ("RTT", lambda p: (p.rtt_ms is None, p.rtt_ms or 0.0)),
    "seen": ("Last seen", lambda p: (p.last_seen is None, -(p.last_seen or 0.0))),
    "device": ("Device", lambda p: p.device.lower()),
    "memory": ("Memory", lambda p: _memory_bytes(p)),
    "reach": ("Reachability", lambda p: REACH_ORDER.get(p.reachability, 3)),
    "legacy": ("Legacy GPU", lambda p: {True: 0, False: 1, None: 2}[p.legacy]),
    "rounds": ("Rounds", lambda p: p.rounds_contributed),
    "penalty": ("Penalty", lambda p: p.penalty),
}


def _memory_bytes(p: Peer) -> float:
    if p.info is None:
        return -1.0
    return p.memory_bytes or 0.0


def peer_search_text(p: Peer) -> str:
    legacy = {True: "legacy", False: "", None: ""}[p.legacy]
    os_name = p.info.os if p.info else ""
    words = [p.peer_id, p.state, p.device, human_bytes(p.memory_bytes), p.reachability, legacy, os_name]
    return " ".join(words).lower()


@dataclass(frozen=True)
class PeerRow:
    peer: Peer
    search: str
    hidden: bool


def peers_view(snap: Snapshot, params: Params) -> dict[str, Any]:
    sort = params.get("sort", "state")
    sort = sort if sort in PEER_COLUMNS else "state"
    desc = params.get("dir") == "desc"
    query = params.get("q", "")[:100].strip().lower()
    peers = sorted(snap.peers, key=PEER_COLUMNS[sort][1], reverse=desc)
    rows = [PeerRow(p, s, bool(query) and query not in s)
            for p in peers for s in (peer_search_text(p),)]

    def header(key: str, label: str) -> dict[str, Any]:
        # A column sorts ascending first; selecting the sorted column again reverses it.
        current = key == sort
        next_dir = "desc" if current and not desc else "asc"
        return {"key": key, "label": label, "sorted": current,
                "aria": ("descending" if desc else "ascending") if current else None,
                "href": f"?sort={key}&dir={next_dir}"}

    headers = [header(key, label) for key, (label, _) in PEER_COLUMNS.items()]
    shown = sum(1 for r in rows if not r.hidden)
    return {"rows": rows, "headers": headers, "query": query, "shown": shown, "total": len(rows)}


def job_card(job: Job) -> dict[str, Any]:
    """A job with its loss and accuracy charts (and perplexity, for a language model), as the
    overview and the job page show it."""
    loss = [(p.round, p.loss) for p in job.metrics if p.loss is not None]
    acc = [(p.round, p.accuracy) for p in job.metrics if p.accuracy is not None]
    ppl = [(p.round, p.perplexity) for p in job.metrics if p.perplexity is not None]
    last = job.metrics[-1] if job.metrics else None
    return {
        "job": job,
        "loss_chart": line_chart(loss, title=f"Loss of {job.label}", series="loss",
                                 caption="Test loss", y_min=0.0),
        "acc_chart": line_chart(acc, title=f"Accuracy of {job.label}", series="accuracy",
                                caption="Next-token accuracy" if ppl else "Test accuracy", y_min=0.0, y_max=1.0),
        "ppl_chart": line_chart(ppl, title=f"Perplexity of {job.label}", series="perplexity",
                                caption="Perplexity", y_min=1.0) if ppl else Markup(""),
        "last": last,
        "sent": last.sent_bytes if last else None,
    }


def overview_view(snap: Snapshot, params: Params) -> dict[str, Any]:
    cards = [job_card(job) for job in snap.jobs[:5]]
    mesh = snap.status.mesh if snap.status else None
    return {"cards": cards, "mesh": mesh, "status": snap.status, "events": snap.events[:15],
            "current": snap.current_job}


def jobs_view(snap: Snapshot, params: Params) -> dict[str, Any]:
    return {"jobs": snap.jobs}


#: Ledger rounds per page of the job page, newest first: a 400-round job is eight pages,
#: not one page of every round.
LEDGER_PAGE = 50


def ledger_page(ledger: tuple[LedgerRound, ...], params: Params) -> dict[str, Any]:
    """One page of the ledger, newest round first, with what the pager needs."""
    pages = max(1, -(-len(ledger) // LEDGER_PAGE))
    try:
        page = min(pages, max(1, int(params.get("page", "1"))))
    except ValueError:
        page = 1
    newest_first = tuple(reversed(ledger))
    rows = newest_first[(page - 1) * LEDGER_PAGE: page * LEDGER_PAGE]
    return {"ledger": rows, "ledger_pages": pages, "ledger_page_no": page, "ledger_total": len(ledger)}


def job_view(snap: Snapshot, params: Params) -> dict[str, Any]:
    job = snap.job(params.get("job", ""))
    states = {p.peer_id: p for p in snap.peers}
    self_id = snap.status.peer_id if snap.status else ""
    members = [{"peer_id": m, "peer": states.get(m), "is_self": m == self_id}
               for m in (job.members if job else ())]
    ledger = snap.ledgers.get(job.job_id, ()) if job else ()
    page = ledger_page(ledger, params)
    shown = {k for r in page["ledger"] for c in r.contributors for k in c.extra}
    extra_keys = [label for label in MEMBER_FIELDS.values() if label in shown]
    ppl = any(r.perplexity is not None for r in ledger)
    return {"job": job, "card": job_card(job) if job else None, "members": members, **page,
            "extra_keys": extra_keys, "has_perplexity": ppl,
            "sent_by_round": {p.round: p.sent_bytes for p in job.metrics} if job else {}}


def contributions_view(snap: Snapshot, params: Params) -> dict[str, Any]:
    credit = compute_credit(snap.ledgers)
    devices = {p.peer_id: p.device for p in snap.peers}
    if snap.status and snap.status.node_info:
        devices[snap.status.peer_id] = snap.status.node_info.device
    bars = [(f"…{row.peer[-8:]}", row.share, f"{row.share * 100:.1f}%") for row in top(credit)]
    labels = {j.job_id: j.label for j in snap.jobs}
    # Serving credit, from the shared serving view (gpuflex.serve.view): tokens each peer made
    # for this node's callers, and what the redundancy checks found against it.
    served = snap.serving.credit
    total = sum(c.tokens for c in served)
    return {"credit": credit, "devices": devices, "labels": labels,
            "chart": bar_chart(bars, title="Share of compute per peer"),
            "served": [(c, c.tokens / total if total else 0.0) for c in served],
            "self_id": snap.status.peer_id if snap.status else ""}


def join_view(snap: Snapshot, params: Params) -> dict[str, Any]:
    addrs = list(snap.status.addrs) if snap.status else []
    # A loopback address only works for a machine that is this one; prefer one others can dial.
    addrs.sort(key=lambda a: ("/127." in a or "/::1/" in a or "/localhost/" in a, a))
    best = addrs[0] if addrs else ""
    return {"addrs": addrs, "best": best, "loopback_only": bool(addrs) and all(
        "/127." in a or "/::1/" in a for a in addrs),
            "qr": qr_svg(best) if best else Markup("")}


@dataclass(frozen=True)
class Page:
    """One page: its template, its title, its live regions and how to build their context."""

    name: str
    title: str
    template: str
    regions: tuple[str, ...]
    view: Callable[[Snapshot, Params], dict[str, Any]]


PAGES: dict[str, Page] = {p.name: p for p in (
    Page("overview", "Overview", "overview.html", ("status", "jobs", "events"), overview_view),
    Page("peers", "Peers", "peers.html", ("peers",), peers_view),
    Page("jobs", "Jobs", "jobs.html", ("jobs",), jobs_view),
    Page("job", "Job", "job.html", ("job", "spec", "files", "ledger"), job_view),
    Page("contributions", "Contributions", "contributions.html", ("credit",), contributions_view),
    Page("join", "Join", "join.html", ("join",), join_view),
    Page("serving", "Serving", "serving.html", ("serving",), serving_view),
    Page("playground", "Playground", "playground.html", (), serving_view),
)}
