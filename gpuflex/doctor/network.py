"""The checks that ask the node running for this home: is the listen port free or its own,
and how far off are the clocks of the node and its peers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuflex.doctor.findings import FAIL, OK, WARN, Finding

# Signed messages older or newer than this are rejected as stale (mesh.codec.ReplayGuard).
REPLAY_WINDOW_S = 300.0
SKEW_WARN_S = 30.0
DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/4001"


def listen_multiaddr(listen: str) -> str:
    """Accept a multiaddr, ``HOST:PORT`` or a bare port."""
    if listen.startswith("/"):
        return listen
    host, sep, port = listen.rpartition(":")
    return f"/ip4/{host if sep and host else '0.0.0.0'}/tcp/{port if sep else listen}"


def node_listen_addrs(node: dict[str, Any] | None) -> list[str]:
    """The running node's own TCP listen addresses (relayed ones left out), without /p2p/."""
    addrs = []
    for text in (node or {}).get("addrs", []):
        if isinstance(text, str) and "/tcp/" in text and "p2p-circuit" not in text:
            addrs.append(text.split("/p2p/")[0])
    return addrs


def check_port(listen: str | None, node: dict[str, Any] | None) -> Finding:
    """With ``listen`` None: the running node's own address, else the default one."""
    from mesh.host import HostError, check_tcp_port_free

    own = node_listen_addrs(node)
    if listen is None and own:
        return Finding("port", OK, f"this home's node listens on {', '.join(own)}", data={"listen": own[0]})
    addr = listen_multiaddr(listen or DEFAULT_LISTEN)
    port = addr.rstrip("/").rsplit("/", 1)[-1]
    if any(a.endswith(f"/tcp/{port}") for a in own):
        return Finding("port", OK, f"port {port} is served by this home's own node", data={"listen": addr})
    try:
        check_tcp_port_free(addr)
    except HostError as exc:
        return Finding("port", FAIL, str(exc), "stop whatever holds the port (ss -ltnp), or choose another "
                       "with gpuflex node start --listen /ip4/0.0.0.0/tcp/<port>", {"listen": addr})
    return Finding("port", OK, f"{addr} is free", data={"listen": addr})


def query_node(home: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any] | None]:
    """(status, peers, clock sample) of the node serving ``home``, or Nones when none answers."""
    from gpuflex.client import ControlClient, ControlError

    try:
        with ControlClient.for_home(home, timeout=3) as client:
            status, peers = client.status(), client.peers()
            try:
                t0 = time.time()
                remote = float(client.call("clock")["now"])
                t1 = time.time()
                clock = {"offset_s": remote - (t0 + t1) / 2, "precision_s": (t1 - t0) / 2}
            except ControlError:  # a node from before the clock method
                clock = None
    except (ControlError, OSError, ValueError, KeyError, TypeError):
        return None, [], None
    return status, peers, clock


def check_clock(node: dict[str, Any] | None, peers: list[dict[str, Any]], clock: dict[str, Any] | None) -> Finding:
    """A coarse, honest skew estimate.

    The node's own clock is sampled NTP-style (precision ± half the round trip), which matters
    when the node runs on another machine behind an SSH tunnel. For peers only their signed
    NodeInfo timestamp is at hand; it is taken when the peer signs, before it travels, so it can
    prove that a peer runs *ahead* but never that one runs behind.
    """
    if node is None:
        return Finding("clock", WARN, "no node is running for this home, so no mesh to compare clocks with",
                       "start the node (gpuflex node start) and rerun the doctor; keep NTP on "
                       "(timedatectl set-ntp true)", {"reachable": False})
    now = time.time()
    ahead = {p["peer_id"]: float(p["info"]["ts"]) - now for p in peers
             if isinstance(p.get("info"), dict) and isinstance(p["info"].get("ts"), (int, float))}
    worst_peer, worst = max(ahead.items(), key=lambda kv: kv[1], default=(None, 0.0))
    own = abs(clock["offset_s"]) if clock else 0.0
    data = {"reachable": True, "node_offset_s": clock and round(clock["offset_s"], 4),
            "node_precision_s": clock and round(clock["precision_s"], 4), "peers_compared": len(ahead),
            "max_peer_ahead_s": round(max(worst, 0.0), 3), "method": "node: NTP-style sample; peers: "
            "NodeInfo timestamps, a one-sided bound (detects clocks ahead only)"}
    skew = max(own, worst)
    fix = (f"turn on NTP on every machine (timedatectl set-ntp true); signed messages more than "
           f"{REPLAY_WINDOW_S:.0f}s off are rejected as stale")
    who = f"peer …{str(worst_peer)[-8:]}" if worst >= own and worst_peer else "the node"
    if skew > REPLAY_WINDOW_S:
        return Finding("clock", FAIL, f"{who} is {skew:.0f}s off this machine's clock", fix, data)
    if skew > SKEW_WARN_S:
        return Finding("clock", WARN, f"{who} is {skew:.0f}s off this machine's clock", fix, data)
    precision = f" ± {clock['precision_s'] * 1000:.1f} ms" if clock else ""
    return Finding("clock", OK, f"node clock offset {own * 1000:.1f} ms{precision}; no peer of {len(ahead)} "
                   f"is detectably ahead (peers behind cannot be measured from NodeInfo)", data=data)
