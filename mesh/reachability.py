"""Can other machines reach this node? A dial-back check over signed envelopes.

py-libp2p 0.8.1 ships AutoNAT v1 (``libp2p.host.autonat``), but its server "dials back" with
``host.connect``, which returns at once when a connection to the peer already exists, and one
always does: the request came over it. Measured on the namespace NAT topology
(``benchmarks/nat_probe.py``), a home node that announces its router's address with no port
forwarded gets ``OK`` from it, so it would call itself public. Its client also needs four
servers to agree before it says anything, more than a small mesh has.

So GPUFlex asks peers itself, with a signed ``dialback`` request on its own message protocol:

* the requester lists the TCP ports it listens on and the addresses it announces;
* the server dials only the IP it sees the request come from (no one can aim it at a third
  party), on a *fresh* connection (``swarm.dial_addr``, never a reused one), lets the Noise
  handshake prove the peer id at the other end, closes that connection and answers;
* peers on the requester's own private LAN are not asked (they reach it whether or not the
  internet can), and relayed connections are not asked (the IP seen is the relay's).

One server that reaches the node makes it ``public``; servers that all fail make it
``private`` (``relayed`` once a relay holds a reservation for it); no answer yet is
``unknown``. Checks repeat every few seconds until there is a verdict, then every minute.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from mesh.codec import register_kind
from mesh.compat import StrEnum

log = logging.getLogger("mesh.reachability")

DIALBACK = "dialback"
register_kind(DIALBACK, 4096)
MAX_CLAIMED = 4  # addresses a server dials for one request
DIAL_TIMEOUT_S = 5.0
SERVER_COOLDOWN_S = 10.0  # one dial-back per requester this often
VERDICT_TTL_S = 180.0  # answers older than this no longer count
_RFC1918 = [ipaddress.ip_network(n) for n in
            ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
             "fc00::/7", "fe80::/10")]


class Reachability(StrEnum):
    PUBLIC = "public"  # peers can dial it directly
    PRIVATE = "private"  # behind NAT or a firewall, no relay reservation
    RELAYED = "relayed"  # behind NAT, reachable through a relay that holds a reservation
    UNKNOWN = "unknown"  # not checked yet, or no peer could check


#: The verdicts of a node others cannot dial directly: it leads no group and hosts no bulk port.
BEHIND_NAT = frozenset({Reachability.PRIVATE, Reachability.RELAYED})


def parse(value: object) -> Reachability:
    """A peer's claim, from its NodeInfo; anything unexpected is ``unknown``."""
    try:
        return Reachability(str(value))
    except ValueError:
        return Reachability.UNKNOWN


def is_lan_ip(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(addr in net for net in _RFC1918 if net.version == addr.version)


def local_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The private subnets this machine sits on (its LANs)."""
    try:
        import ifaddr  # comes with zeroconf, which py-libp2p's mDNS needs
    except ImportError:
        return []
    nets: list[Any] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            host = ip.ip if isinstance(ip.ip, str) else ip.ip[0]
            if is_lan_ip(host):
                nets.append(ipaddress.ip_network(f"{host}/{ip.network_prefix}", strict=False))
    return nets


def on_my_lan(ip: str, nets: Iterable[Any]) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return is_lan_ip(ip) and any(addr in n for n in nets if n.version == addr.version)


def direct_ips(host: Any, peer_id: Any) -> list[str]:
    """The IPs this host sees ``peer_id`` connect from, on direct (not relayed) connections."""
    ips: list[str] = []
    conns = (getattr(host.get_network(), "connections", {}) or {}).get(peer_id, [])
    for conn in conns if isinstance(conns, list) else [conns]:
        try:
            addrs = [str(a) for a in conn.get_transport_addresses()]
        except Exception:
            addrs = []
        if not addrs or any("/p2p-circuit" in a for a in addrs):
            continue
        for text in addrs:
            parts = text.split("/")
            if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
                ips.append(parts[2])
    return sorted(set(ips))


def is_relayed_only(host: Any, peer_id: Any) -> bool:
    conns = (getattr(host.get_network(), "connections", {}) or {}).get(peer_id, [])
    conns = conns if isinstance(conns, list) else [conns]
    return bool(conns) and not direct_ips(host, peer_id)


# -- the server's side ---------------------------------------------------------------------------

def dial_targets(body: Any, observed: list[str]) -> list[str]:
    """Multiaddrs to dial for a request: only on the IPs the request came from, bounded."""
    if not isinstance(body, dict) or not observed:
        return []
    targets: list[str] = []
    ports = [p for p in body.get("ports", []) if isinstance(p, int) and 0 < p < 65536][:MAX_CLAIMED]
    for ip in observed:
        proto = "ip6" if ":" in ip else "ip4"
        targets += [f"/{proto}/{ip}/tcp/{p}" for p in ports]
    for text in body.get("addrs", [])[:MAX_CLAIMED]:
        if not isinstance(text, str) or len(text) > 200:
            continue
        parts = text.split("/")
        if len(parts) >= 5 and parts[1] in ("ip4", "ip6") and parts[2] in observed and parts[3] == "tcp" \
                and parts[4].isdigit() and f"/{parts[1]}/{parts[2]}/tcp/{parts[4]}" not in targets:
            targets.append(f"/{parts[1]}/{parts[2]}/tcp/{parts[4]}")
    return targets[:MAX_CLAIMED]


async def dial_back(host: Any, peer: str, targets: list[str]) -> str | None:
    """Dial ``peer`` afresh at each target; the first that answers as ``peer`` (Noise proves
    it) is returned, and the connection made for the check is closed again."""
    from libp2p.peer.id import ID
    from multiaddr import Multiaddr

    pid = ID.from_base58(peer)
    for target in targets:
        conn = None
        with trio.move_on_after(DIAL_TIMEOUT_S):
            try:
                conn = await host.get_network().dial_addr(Multiaddr(target), pid)
            except Exception as exc:
                log.debug("dial-back to %s at %s failed: %s", peer[-8:], target, exc)
        if conn is not None:
            with trio.move_on_after(2):
                with contextlib.suppress(Exception):
                    await conn.close()
            return target
    return None


# -- the requester's side ------------------------------------------------------------------------

@dataclass
class Answer:
    reached: bool
    at: float
    addr: str = ""


@dataclass
class ReachabilityState:
    """This node's own verdict, from the latest answer of each server."""

    forced: Reachability | None = None
    answers: dict[str, Answer] = field(default_factory=dict)
    checked_at: float = 0.0

    def record(self, server: str, reached: bool, addr: str = "", now: float | None = None) -> None:
        self.answers[server] = Answer(reached, time.time() if now is None else now, addr)

    def verdict(self, has_reservation: bool = False, now: float | None = None) -> Reachability:
        if self.forced is not None:
            return self.forced
        now = time.time() if now is None else now
        fresh = [a for a in self.answers.values() if now - a.at <= VERDICT_TTL_S]
        if any(a.reached for a in fresh):
            return Reachability.PUBLIC
        if fresh:
            return Reachability.RELAYED if has_reservation else Reachability.PRIVATE
        return Reachability.UNKNOWN

    def reached_at(self) -> list[str]:
        return sorted({a.addr for a in self.answers.values() if a.reached and a.addr})

    def rows(self) -> list[dict[str, Any]]:
        return [{"server": s, "reached": a.reached, "at": round(a.at, 1), "addr": a.addr}
                for s, a in sorted(self.answers.items())]


def listen_ports(addrs: Iterable[str]) -> list[int]:
    ports = []
    for text in addrs:
        parts = str(text).split("/")
        if "p2p-circuit" in parts or len(parts) < 5 or parts[3] != "tcp":
            continue
        try:
            ports.append(int(parts[4]))
        except ValueError:
            continue
    return sorted(set(ports))


def explain(info: dict[str, Any] | None, state: str, connected: bool) -> str:
    """Why a peer cannot be reached, in a few words, from its own NodeInfo claim and our view."""
    if connected:
        return "" if state == "up" else f"{state}: connected but slow to answer (busy, or a saturated uplink)"
    if info is None:
        return "unreachable: no connection and no NodeInfo (down, or behind NAT with no relay)"
    claim = parse(info.get("reachability"))
    relays = [a for a in info.get("addrs", []) if isinstance(a, str) and "/p2p-circuit" in a]
    if claim == Reachability.PRIVATE or (claim == Reachability.RELAYED and not relays):
        return "unreachable: behind NAT, no relay reservation"
    if claim == Reachability.RELAYED:
        return "unreachable: behind NAT, its relays could not connect us"
    if state == "down":
        return "down: stopped answering"
    return f"unreachable: says it is {claim.value}, but no connection could be made"
