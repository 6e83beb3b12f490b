"""Network prefixes of peer addresses: how many identities one network holds.

Keys are free, addresses are not: a Sybil attacker can make a thousand identities on one
machine, but they all connect from the same few networks. An IPv4 /24 or an IPv6 /48 is the
block one site is typically given, so an open job can cap how many of its plan's members come
from one such block. Loopback has no prefix (test meshes on one machine are exempt), and
neither does an address that does not parse: the cap is opt-in, and it is no substitute for
an allowlist.
"""

from __future__ import annotations

import ipaddress

#: Prefix lengths that count as one network.
IPV4_PREFIX, IPV6_PREFIX = 24, 48


def network_prefix(ip: str | None) -> str | None:
    """``203.0.113.0/24`` for ``203.0.113.7``; ``2001:db8:1::/48`` for an IPv6 address inside
    it; None for loopback, unspecified or unparseable addresses (nothing to count them by)."""
    if not ip:
        return None
    try:
        addr = ipaddress.ip_address(ip.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback or addr.is_unspecified:
        return None
    length = IPV4_PREFIX if addr.version == 4 else IPV6_PREFIX
    return str(ipaddress.ip_network(f"{addr}/{length}", strict=False))
