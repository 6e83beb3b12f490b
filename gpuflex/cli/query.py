"""``gpuflex peers``, ``gpuflex status`` and ``gpuflex version``: fast, read-only queries."""

from __future__ import annotations

from typing import Any

import typer

from gpuflex.cli.common import (
    HomeOpt,
    JsonOpt,
    ago,
    call_node,
    emit_json,
    hardware_summary,
    number,
    short,
    text,
)
from gpuflex.safetext import plural


def peers(home: str | None = HomeOpt, json_out: bool = JsonOpt) -> None:
    """List the peers this node knows, with their health and hardware."""
    rows = call_node("peers", home=home)
    if json_out:
        emit_json(rows)
        return
    if not rows:
        typer.echo("no peers yet")
        return
    typer.echo(f"{'PEER':54} {'STATE':8} {'REACH':8} {'LINK':8} {'RTT':>8} {'LAST SEEN':>10}  HARDWARE / ADDRESSES")
    for r in rows:
        rtt = "-" if r["rtt_ms"] is None else f"{r['rtt_ms']:.1f}ms"
        typer.echo(f"{text(r['peer_id']):54} {text(r['state']):8} {text(r.get('reachability', 'unknown')):8} "
                   f"{text(r.get('connection', '-')):8} {rtt:>8} {ago(r['last_seen']):>10}  "
                   f"{hardware_summary(r['info'])}  {' '.join(text(a, 100) for a in r['addrs'][:2])}")


def status(home: str | None = HomeOpt, json_out: bool = JsonOpt) -> None:
    """Show this node's identity, mesh health and jobs."""
    st = call_node("status", home=home)
    if json_out:
        emit_json(st)
        return
    m = st["mesh"]
    typer.echo(f"node     {st['peer_id']}  (v{st['version']}, up {st['uptime_s']:.0f}s)")
    typer.echo(f"home     {st['home']}")
    for addr in st["addrs"]:
        typer.echo(f"address  {addr}")
    typer.echo(f"hardware {hardware_summary(st['node_info'])}")
    typer.echo(f"mesh     {plural(m['peers'], 'peer')}: {m['up']} up, {m['suspect']} suspect, {m['down']} down")
    if "nat" in st:
        typer.echo(f"reach    {reach_line(st['nat'])}")
    if "join" in st:
        typer.echo(f"join     {join_summary(st['join'])}")
    for job in st["jobs"]:
        typer.echo(f"job      {text(job['job_id'])} {text(job['name'])}: {text(job['state'])}, "
                   f"round {text(job['round'])}/{text(job['rounds'])}, phase {text(job['phase'])}, "
                   f"coordinator {short(job['coordinator'])}")
    for line in serve_lines(st.get("serve") or {}):
        typer.echo(line)


def serve_lines(serve: dict[str, Any]) -> list[str]:
    """What this node serves (rate, tokens/s, latency) and the models it can route to."""
    lines = [f"api      {text(serve['http'])}/v1"] if serve.get("http") else []
    for m in serve.get("models", []):
        ttft = "-" if m.get("ttft_ms_p50") is None else f"{m['ttft_ms_p50']:.0f}ms"
        lat = "-" if m.get("latency_ms_p50") is None else f"{m['latency_ms_p50']:.0f}ms"
        lines.append(f"serving  {text(m['name'])} ({text(m['source'])}): load {m['load']}/{m['capacity']}, "
                     f"{m['rps']:.2f} req/s, {m['tokens_per_s']:.1f} tok/s, first token {ttft}, "
                     f"latency {lat}, {m['requests']} requests, {m['errors']} errors")
    for name, why in (serve.get("failed") or {}).items():
        lines.append(f"serving  {text(name)}: not loaded: {text(why, 200)}")
    for name, row in sorted((serve.get("mesh_models") or {}).items()):
        lines.append(f"routes   {text(name)} -> {len(row['servers'])} server(s)")
    for srv in serve.get("servers") or []:
        lines.append(f"server   {short(srv.get('peer'))}{' (this node)' if srv.get('self') else ''} "
                     f"{text(', '.join(srv.get('models') or []))}: load {number(srv.get('load'), 'd')}/"
                     f"{number(srv.get('capacity'), 'd')}, {number(srv.get('rps'), '.2f')} req/s, "
                     f"{number(srv.get('tokens_per_s'), '.1f')} tok/s, first token "
                     f"{number(srv.get('ttft_ms_p50'), '.0f')}ms, latency {number(srv.get('latency_ms_p50'), '.0f')}ms"
                     + ("" if srv.get("self") else f", rtt {number(srv.get('rtt_ms'), '.0f')}ms"))
    return lines


def join_summary(join: dict[str, Any]) -> str:
    """One line on how this node stands with the mesh: connected, or waiting and retrying."""
    book = f"{plural(join.get('known_peers', 0), 'peer')} in the address book"
    state = join.get("state")
    if state == "waiting":
        retry = join.get("next_retry_s")
        when = f"retrying in {retry:.0f}s" if isinstance(retry, (int, float)) else "retrying"
        error = f"; last error: {join['last_error']}" if join.get("last_error") else ""
        return f"waiting: no known peer answered ({join.get('attempt', 0)} attempts), {when}; {book}{error}"
    if state == "new-mesh":
        return f"new mesh: waiting for peers to dial in; {book}"
    return f"{state}; {book}"


def reach_line(nat: dict[str, Any]) -> str:
    """One line on whether others can reach this node, and how."""
    text = f"{nat['reachability']} (DHT {nat.get('dht_mode', '?')} mode)"
    if nat.get("reservations"):
        text += f", relayed by {', '.join(short(r) for r in nat['reservations'])}"
    if nat.get("relay_service"):
        load = nat.get("relay_load", {})
        text += (f", relay service on ({load.get('reservations', 0)} reservations, "
                 f"{load.get('circuits_now', 0)} circuits)")
    if not nat.get("mdns"):
        text += ", LAN discovery off"
    return text


def version(json_out: bool = JsonOpt) -> None:
    """Print the GPUFlex version."""
    from gpuflex import __version__

    if json_out:
        emit_json({"version": __version__})
    else:
        typer.echo(f"gpuflex {__version__}")
