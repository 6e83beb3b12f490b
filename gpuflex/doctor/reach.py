"""``gpuflex doctor``'s answer to "can others reach me?", from the running node's own view.

The node asks peers off its LAN to dial it back on a fresh connection (``mesh.reachability``),
holds relay reservations when it cannot be reached (``mesh.relay``), and says both in its
status. The doctor turns that into one finding with the fix: nothing to do when the node is
public; nothing to do, but a direct path would be faster, when a relay carries it; forward the
TCP port on the router (or ``--announce`` a reachable address) when it is private with no
relay. UPnP is not used: GPUFlex opens no port on a router by itself.
"""

from __future__ import annotations

from typing import Any

from gpuflex.doctor.findings import FAIL, OK, WARN, Finding


def _port(addrs: list[str]) -> str:
    for text in addrs:
        parts = text.split("/")
        if "p2p-circuit" not in parts and len(parts) > 4 and parts[3] == "tcp":
            return parts[4]
    return "4001"


def loopback_only(addrs: list[str]) -> list[str]:
    """The node's direct addresses when every one of them is on loopback (127.0.0.0/8, ::1),
    else []: such a node serves nothing to other machines, whatever its peers said."""
    direct = [a.split("/p2p/")[0] for a in addrs if isinstance(a, str) and "p2p-circuit" not in a]
    if direct and all(a.startswith(("/ip4/127.", "/ip6/::1/")) for a in direct):
        return direct
    return []


def check_reachability(node: dict[str, Any] | None) -> Finding:
    from mesh.reachability import Reachability, parse  # trio and the codec: only when checked

    if node is None:
        return Finding("reachability", WARN, "no node is running for this home, so nobody has tried to dial it",
                       "start the node (gpuflex node start) and rerun the doctor",
                       {"reachability": Reachability.UNKNOWN})
    nat = node.get("nat") or {}
    verdict = parse(nat.get("reachability"))
    port = _port(node.get("addrs", []))
    relays = [str(r) for r in nat.get("reservations", [])]
    data = {"reachability": verdict, "reached_at": nat.get("reached_at", []), "reservations": relays,
            "refused": nat.get("refused", {}), "checks": nat.get("checks", []), "dht_mode": nat.get("dht_mode"),
            "relay_service": nat.get("relay_service", False), "upnp": "not used"}
    loopback = loopback_only(node.get("addrs", []))
    if loopback:
        return Finding("reachability", WARN, f"the node listens on loopback only ({', '.join(loopback)}): "
                       "only this machine can reach it", f"to join peers on other machines, start it with "
                       f"--listen /ip4/0.0.0.0/tcp/{port}", {**data, "loopback_only": True})
    forward = (f"forward TCP port {port} on your router to this machine (and start the node with "
               f"--listen /ip4/0.0.0.0/tcp/{port}), or --announce an address others can dial")
    if verdict == Reachability.PUBLIC:
        at = ", ".join(nat.get("reached_at", [])) or "its listen address"
        service = " and relays for nodes behind NAT" if nat.get("relay_service") else ""
        return Finding("reachability", OK, f"peers dialled this node back at {at}; it serves the DHT{service}",
                       "", data)
    if verdict == Reachability.RELAYED:
        via = ", ".join(f"…{r[-8:]}" for r in relays)
        return Finding("reachability", OK, f"behind NAT; relay {via} carries connections to it, and hole punching "
                       f"upgrades them where the routers allow (nothing to do)",
                       f"optional, for speed: {forward}", data)
    if verdict == Reachability.PRIVATE:
        refused = nat.get("refused") or {}
        why = ("; relays refused: " + "; ".join(f"…{r[-8:]} {w}" for r, w in refused.items())) if refused else \
            "; no peer offers a relay"
        return Finding("reachability", FAIL, f"others cannot reach this node: behind NAT, no relay reservation{why}",
                       f"{forward}; or join a mesh with a public node that relays (--relay-service is on by default)",
                       data)
    checks = nat.get("checks", [])
    return Finding("reachability", WARN, "not known yet: " + ("no peer off this LAN has answered a dial-back"
                   if not checks else "the answers are too old"),
                   "wait a few seconds after the node joins the mesh, then rerun the doctor", data)
