"""The dialler against real py-libp2p hosts in one process: the negative dial cache and the
stale first address that make ``host.connect`` refuse a peer that has moved."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from mesh.addressbook import AddressBook
from mesh.bootstrap import Candidate
from mesh.dialer import Libp2pDialer, bootstrap_candidates, join_candidates
from mesh.host import HostError, build_host, parse_multiaddr
from mesh.identity import Identity


def dead_addr() -> str:
    """A loopback port that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"/ip4/127.0.0.1/tcp/{port}"


@asynccontextmanager
async def running_host() -> AsyncIterator[tuple[Any, str, str]]:
    ident = Identity.generate()
    host = build_host(ident, ["/ip4/127.0.0.1/tcp/0"])
    async with host.run([parse_multiaddr("/ip4/127.0.0.1/tcp/0")]):
        addr = str(host.get_addrs()[0]).split("/p2p/")[0]
        yield host, ident.peer_id, addr


async def test_a_moved_peer_is_reached_despite_the_negative_cache_and_its_stale_address() -> None:
    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import PeerInfo

    async with running_host() as (a, _, _), running_host() as (_, b_id, b_addr):
        pid = ID.from_base58(b_id)
        stale = parse_multiaddr(dead_addr())
        with pytest.raises(Exception):  # noqa: B017 - any dial error
            with trio.fail_after(10):
                await a.connect(PeerInfo(pid, [stale]))
        # py-libp2p now refuses the peer for 60 s, at any address...
        with pytest.raises(Exception, match="negative cache"):
            await a.connect(PeerInfo(pid, [parse_multiaddr(b_addr)]))
        a.get_network().unblock_peer(pid)
        # ...and, unblocked, still dials the first stored address (the stale one) only.
        with pytest.raises(Exception):  # noqa: B017
            with trio.fail_after(10):
                await a.connect(PeerInfo(pid, [parse_multiaddr(b_addr)]))
        assert pid not in a.get_connected_peers()

        with trio.fail_after(10):
            await Libp2pDialer(a)(b_id, b_addr)
        assert pid in a.get_connected_peers()
        stored = [str(x) for x in a.get_peerstore().addrs(pid)]
        assert stored[0] == b_addr and str(stale) in stored[1:]


async def test_a_failed_address_is_not_left_first_in_the_peerstore() -> None:
    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import PeerInfo

    async with running_host() as (a, _, _), running_host() as (_, b_id, b_addr):
        pid = ID.from_base58(b_id)
        a.get_peerstore().add_addrs(pid, [parse_multiaddr(b_addr)], 3600)
        stale = dead_addr()
        with pytest.raises(Exception), trio.fail_after(10):  # noqa: B017
            await Libp2pDialer(a)(b_id, stale)
        assert [str(x) for x in a.get_peerstore().addrs(pid)] == [b_addr]
        with trio.fail_after(10):  # no negative cache in the way of the next dial
            await a.connect(PeerInfo(pid, []))
        assert pid in a.get_connected_peers()


def test_candidates_put_the_bootstrap_first_with_what_the_book_knows() -> None:
    me, boot, other = (Identity.generate().peer_id for _ in range(3))
    book = AddressBook(None, me)
    book.reached(other, "/ip4/10.0.0.3/tcp/4001")
    book.seen(boot, ["/ip4/10.0.0.2/tcp/5002"])  # the bootstrap peer moved since the command line
    cands = bootstrap_candidates([f"/ip4/10.0.0.2/tcp/4001/p2p/{boot}", f"/ip4/10.0.0.1/tcp/1/p2p/{me}"], me)
    assert cands == [Candidate(boot, ("/ip4/10.0.0.2/tcp/4001",), "bootstrap")]  # never itself
    got = join_candidates(cands, book, exclude=set(), limit=8)
    assert got == [Candidate(boot, ("/ip4/10.0.0.2/tcp/4001", "/ip4/10.0.0.2/tcp/5002"), "bootstrap"),
                   Candidate(other, ("/ip4/10.0.0.3/tcp/4001",), "book")]
    assert join_candidates(cands, book, exclude={boot}, limit=8) == got[1:]
    with pytest.raises(HostError, match="needs a /p2p/<peer id> part"):
        bootstrap_candidates(["/ip4/10.0.0.2/tcp/4001"], me)
    with pytest.raises(HostError, match="invalid bootstrap address"):
        bootstrap_candidates(["not an address"], me)


def test_relay_circuits_are_left_to_the_relay_client() -> None:
    me, relayed, relay = (Identity.generate().peer_id for _ in range(3))
    book = AddressBook(None, me)
    book.seen(relayed, [f"/ip4/10.0.0.9/tcp/4001/p2p/{relay}/p2p-circuit", "/ip4/192.168.1.5/tcp/4001"])
    book.seen(Identity.generate().peer_id, [f"/ip4/10.0.0.9/tcp/4001/p2p/{relay}/p2p-circuit"])
    got = join_candidates([], book, exclude=set(), limit=8)
    assert got == [Candidate(relayed, ("/ip4/192.168.1.5/tcp/4001",), "book")]


async def test_a_peer_the_mesh_only_heard_of_is_not_dialled_behind_its_back() -> None:
    """py-libp2p's auto-connector dialled every peer in the peerstore (where peer exchange and
    the DHT put every peer a node hears of) every 10 s while a node held fewer than 100
    connections, so connections grew with the mesh whatever the keep set; it never starts now."""
    from libp2p.peer.id import ID

    async with running_host() as (a, _, _), running_host() as (_, c_id, c_addr):
        assert not a.get_network().auto_connector._started
        a.get_peerstore().add_addrs(ID.from_base58(c_id), [parse_multiaddr(c_addr)], 3600)  # heard of
        await trio.sleep(11.0)  # the auto-connector's period below its floor was 10 s
        assert a.get_connected_peers() == []
