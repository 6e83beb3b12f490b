"""A small internet in network namespaces: one public host and homes behind NAT routers.

    inet   (the internet: a bridge, 198.51.100.1/24)
     ├── pub       198.51.100.10            public host, reachable by anyone
     ├── r1  WAN   198.51.100.21 ── LAN 192.168.1.1/24 ── h1a 192.168.1.2 [, h1b 192.168.1.3]
     ├── r2  WAN   198.51.100.22 ── LAN 192.168.2.1/24 ── h2a 192.168.2.2
     └── r3  ...

Each home router masquerades its LAN behind its WAN address (nftables), lets replies back in
and drops everything else that arrives unsolicited, and caps its uplink with ``tc tbf``. With
``random_ports`` the router maps every connection to a random port (``masquerade
fully-random``), so no address learnt from one connection can be dialled for another and hole
punching cannot work; without it Linux keeps the source port where it can, as most home
routers do.

All names carry the pid and a serial, and ``close()`` always deletes every namespace (its
interfaces, bridges, rules and queues go with it). ``nft`` is installed with apt-get when this
runs as root and it is missing; the constructor raises :class:`NetnsUnavailable` otherwise.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass

from gpuflex.localmesh import Placement
from gpuflex.testing.netns import NetnsUnavailable, _ip, ensure_tool, inside, placement_in

WAN_NET = "198.51.100"
_serial = itertools.count()


def _run(*cmd: str, stdin: str | None = None) -> None:
    proc = subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise NetnsUnavailable(f"{' '.join(cmd[:6])}: {proc.stderr.strip() or proc.returncode}")


def ensure_nft() -> None:
    """``nft`` on PATH, installed from Debian's packages if this is root and it is missing."""
    ensure_tool("nft", "nftables")


@dataclass(frozen=True)
class Host:
    """One machine: its namespace, its own address, and the address others see it by."""

    name: str
    netns: str
    addr: str
    public_addr: str

    def placement(self) -> Placement:
        return placement_in(self.netns, self.addr)

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.netns, *cmd], capture_output=True, text=True,
                              timeout=timeout)


@dataclass(frozen=True)
class Home:
    index: int
    router: str  # the router's namespace
    wan_addr: str
    hosts: tuple[Host, ...]


class NatTopology:
    """``homes`` is the number of hosts in each home, e.g. ``(2, 1, 1)``."""

    def __init__(self, homes: tuple[int, ...] = (2, 1, 1), uplink_mbit: float = 20.0,
                 random_ports: bool = False) -> None:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        if shutil.which("ip") is None or shutil.which("tc") is None:
            raise NetnsUnavailable("the 'ip' and 'tc' tools are needed")
        ensure_nft()
        self.tag = f"gn{os.getpid()}x{next(_serial)}"
        self.uplink_mbit = uplink_mbit
        self.random_ports = random_ports
        self._made: list[str] = []
        self.homes: list[Home] = []
        try:
            self.inet = self._netns("inet")
            _ip("-n", self.inet, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.inet, "addr", "add", f"{WAN_NET}.1/24", "dev", "br0")
            _ip("-n", self.inet, "link", "set", "br0", "up")
            pub_ns = self._netns("pub")
            self._wire(pub_ns, "eth0", f"{WAN_NET}.10")
            self.public = Host("pub", pub_ns, f"{WAN_NET}.10", f"{WAN_NET}.10")
            for k, count in enumerate(homes, start=1):
                self.homes.append(self._home(k, count))
        except BaseException:
            self.close()
            raise

    # -- building ----------------------------------------------------------------------------

    def _netns(self, role: str) -> str:
        name = f"{self.tag}{role}"
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    def _wire(self, ns: str, dev: str, addr: str) -> None:
        """A veth from ``ns`` into the internet bridge, with ``addr`` on the ``ns`` end."""
        outer = f"w{len(self._made)}"
        _ip("-n", ns, "link", "add", dev, "type", "veth", "peer", "name", outer, "netns", self.inet)
        _ip("-n", self.inet, "link", "set", outer, "master", "br0")
        _ip("-n", self.inet, "link", "set", outer, "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        _ip("-n", ns, "link", "set", dev, "up")

    def _home(self, k: int, count: int) -> Home:
        router = self._netns(f"r{k}")
        wan = f"{WAN_NET}.{20 + k}"
        self._wire(router, "wan", wan)
        lan = f"192.168.{k}"
        _ip("-n", router, "link", "add", "lan", "type", "bridge")
        _ip("-n", router, "addr", "add", f"{lan}.1/24", "dev", "lan")
        _ip("-n", router, "link", "set", "lan", "up")
        _run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        if os.path.exists("/proc/sys/net/bridge/bridge-nf-call-iptables"):
            # Where br_netfilter is loaded, frames between two LAN hosts would otherwise pass the
            # router's forward chain (and its drop policy) although no router sits between them.
            _run("ip", "netns", "exec", router, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0")
        hosts = []
        for j in range(count):
            letter = "abcdefgh"[j]
            ns = self._netns(f"h{k}{letter}")
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{letter}", "netns", router)
            _ip("-n", router, "link", "set", f"p{letter}", "master", "lan")
            _ip("-n", router, "link", "set", f"p{letter}", "up")
            _ip("-n", ns, "addr", "add", f"{lan}.{2 + j}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", f"{lan}.1")
            hosts.append(Host(f"h{k}{letter}", ns, f"{lan}.{2 + j}", wan))
        mapping = "masquerade fully-random" if self.random_ports else "masquerade"
        _run("ip", "netns", "exec", router, "nft", "-f", "-", stdin=f"""
table ip home {{
    chain postrouting_nat {{ type nat hook postrouting priority srcnat; oifname "wan" {mapping}; }}
    chain forward_filter {{
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
        iifname "lan" oifname "wan" accept
    }}
    chain input_filter {{
        type filter hook input priority filter; policy accept;
        iifname "wan" ct state established,related accept
        iifname "wan" drop
    }}
}}
""")
        if self.uplink_mbit:
            _run("ip", "netns", "exec", router, "tc", "qdisc", "add", "dev", "wan", "root", "tbf",
                 "rate", f"{self.uplink_mbit}mbit", "burst", "32kb", "latency", "50ms")
        return Home(k, router, wan, tuple(hosts))

    # -- use ---------------------------------------------------------------------------------

    def hosts(self) -> list[Host]:
        """Every host: the public one first, then each home's in order."""
        return [self.public, *(h for home in self.homes for h in home.hosts)]

    def isolate(self, home: Home) -> None:
        """Cut a home off the internet (its LAN still works): the 'no relay can reach it' case."""
        _ip("-n", home.router, "link", "set", "wan", "down")

    def reconnect(self, home: Home) -> None:
        _ip("-n", home.router, "link", "set", "wan", "up")

    def close(self) -> None:
        for name in reversed(self._made):
            with contextlib.suppress(NetnsUnavailable, subprocess.TimeoutExpired):
                _ip("netns", "delete", name)
        self._made.clear()

    def __enter__(self) -> NatTopology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Home", "Host", "NatTopology", "NetnsUnavailable", "ensure_nft", "inside"]
