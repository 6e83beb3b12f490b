"""Blob transfer between two real libp2p hosts over TCP on loopback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from mesh.blob import BlobError, BlobIntegrityError, BlobNotFound, blob_hash
from mesh.codec import register_kind, seal
from mesh.identity import Identity
from mesh.messaging import Inbound
from mesh.node import MeshConfig, MeshNode
from mesh.push import PUSH_MIN

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def config(tmp: Path, name: str, bootstrap: list[str] | None = None) -> MeshConfig:
    return MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=bootstrap or [], data_dir=tmp / name)


def firewall(monkeypatch: pytest.MonkeyPatch, listener: type) -> None:
    """Every one-off port of this listening class closes as soon as it opens, as if a
    firewall stood in front of it."""
    opened = listener.__init__

    def port_closed_at_once(self: Any, *args: object, **kwargs: object) -> None:
        opened(self, *args, **kwargs)
        self._listener.close()

    monkeypatch.setattr(listener, "__init__", port_closed_at_once)


async def test_200mb_blob_moves_and_its_hash_is_checked(tmp_path: Path) -> None:
    payload = os.urandom(1 << 20) * 200  # 200 MiB
    async with MeshNode.start(Identity.generate(), config(tmp_path, "a")) as a:
        digest = a.blobs.put(payload)
        async with MeshNode.start(Identity.generate(), config(tmp_path, "b", a.multiaddrs()[:1])) as b:
            path = await b.fetch_blob(digest, [a.peer_id])
            assert path.stat().st_size == len(payload)
            assert blob_hash(path.read_bytes()) == digest
            a.stop()
            b.stop()


async def test_a_peer_serving_wrong_bytes_is_detected_and_penalised(tmp_path: Path) -> None:
    honest = b"the real model weights" * 1000
    digest = blob_hash(honest)
    async with MeshNode.start(Identity.generate(), config(tmp_path, "liar")) as liar:
        # The liar's store holds other bytes under the honest hash.
        liar.blobs.path(digest).write_bytes(b"poisoned weights!!!!!" * 1000)
        async with MeshNode.start(Identity.generate(), config(tmp_path, "victim", liar.multiaddrs()[:1])) as victim:
            with pytest.raises(BlobError, match="wrong bytes"):
                await victim.fetch_blob(digest, [liar.peer_id])
            assert not victim.blobs.has(digest)
            assert victim.peers.get(liar.peer_id).penalty > 0
            assert isinstance(BlobIntegrityError("p", digest, "x"), BlobError)
            # The victim still works: it can fetch an honest blob from the same peer.
            good = liar.blobs.put(b"honest")
            assert (await victim.fetch_blob(good, [liar.peer_id])).read_bytes() == b"honest"
            liar.stop()
            victim.stop()


async def test_unknown_blob_fails_cleanly(tmp_path: Path) -> None:
    async with MeshNode.start(Identity.generate(), config(tmp_path, "a")) as a:  # noqa: SIM117 - b needs a's address
        async with MeshNode.start(Identity.generate(), config(tmp_path, "b", a.multiaddrs()[:1])) as b:
            # typed, so a member asking its tree parent for a model can tell "not yet" from a failure
            with trio.fail_after(60), pytest.raises(BlobNotFound, match=r"not found"):
                await b.fetch_blob(blob_hash(b"nobody has this"), [a.peer_id])
            a.stop()
            b.stop()


async def test_a_blob_is_found_through_dht_provider_records(tmp_path: Path) -> None:
    async with MeshNode.start(Identity.generate(), config(tmp_path, "a")) as a:
        boot = a.multiaddrs()[:1]
        async with MeshNode.start(Identity.generate(), config(tmp_path, "b", boot)) as b:  # noqa: SIM117
            async with MeshNode.start(Identity.generate(), config(tmp_path, "c", boot)) as c:
                digest = b.blobs.put(b"committed model" * 100)
                await trio.sleep(2)  # let routing tables fill
                await b.announce_blob(digest)
                with trio.fail_after(60):
                    path = await c.fetch_blob(digest)  # no provider named: the DHT must say who has it
                assert path.read_bytes() == b"committed model" * 100
                for node in (a, b, c):
                    node.stop()


@pytest.mark.parametrize(("sender_bulk", "receiver_bulk"), [(True, True), (False, True), (True, False)])
async def test_bytes_take_the_bulk_channel_when_both_sides_run_it(tmp_path: Path, sender_bulk: bool,
                                                                   receiver_bulk: bool) -> None:
    payload = os.urandom(3 << 20) + b"tail"
    a_config = config(tmp_path, "a")
    a_config.bulk_channel = sender_bulk
    async with MeshNode.start(Identity.generate(), a_config) as a:
        digest = a.blobs.put(payload)
        b_config = config(tmp_path, "b", a.multiaddrs()[:1])
        b_config.bulk_channel = receiver_bulk
        async with MeshNode.start(Identity.generate(), b_config) as b:
            with trio.fail_after(60):
                path = await b.fetch_blob(digest, [a.peer_id])
            assert path.read_bytes() == payload
            assert b.bulk_bytes_received == (len(payload) if sender_bulk and receiver_bulk else 0)
            assert b.bytes_received >= len(payload)
            a.stop()
            b.stop()


async def test_an_unreachable_bulk_port_falls_back_to_libp2p(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mesh import bulk

    firewall(monkeypatch, bulk.BulkSender)
    payload = os.urandom(1 << 20)
    async with MeshNode.start(Identity.generate(), config(tmp_path, "a")) as a:
        digest = a.blobs.put(payload)
        async with MeshNode.start(Identity.generate(), config(tmp_path, "b", a.multiaddrs()[:1])) as b:
            with trio.fail_after(60):
                path = await b.fetch_blob(digest, [a.peer_id])
            assert path.read_bytes() == payload
            assert b.bulk_bytes_received == 0
            assert a.peers.get(b.peer_id) is None or a.peers.get(b.peer_id).penalty == 0
            a.stop()
            b.stop()


register_kind("bulky", 4096)


@pytest.mark.parametrize(("sender_bulk", "receiver_bulk", "size"),
                         [(True, True, 3 << 20), (True, False, 3 << 20), (True, True, (1 << 20) - 1)])
async def test_a_large_message_payload_is_pushed_over_the_bulk_channel(
        tmp_path: Path, sender_bulk: bool, receiver_bulk: bool, size: int) -> None:
    """A member's update is a request payload: above 1 MiB it takes the side channel when the
    receiver runs it, and arrives whole either way, bound to its signed frame."""
    payload = os.urandom(size)
    got: list[tuple[str, bytes | None]] = []

    async def keep(msg: Inbound) -> dict[str, int]:
        got.append((msg.envelope.sender, msg.payload))
        return {"n": len(msg.payload or b"")}

    a_config = config(tmp_path, "a")
    a_config.bulk_channel = receiver_bulk
    async with MeshNode.start(Identity.generate(), a_config) as a:
        a.handlers.register("bulky", keep, max_payload=8 << 20)
        b_config = config(tmp_path, "b", a.multiaddrs()[:1])
        b_config.bulk_channel = sender_bulk
        async with MeshNode.start(Identity.generate(), b_config) as b:
            with trio.fail_after(60):
                reply = await b.request(a.peer_id, seal(b.identity, "bulky", {"i": 1}), payload)
            assert reply == {"n": size}
            assert got == [(b.peer_id, payload)]
            pushed = receiver_bulk and sender_bulk and size >= PUSH_MIN
            assert a.bulk_bytes_received == (size if pushed else 0)
            a.stop()
            b.stop()


async def test_a_pusher_that_cannot_dial_falls_back_to_libp2p(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mesh import bulk

    firewall(monkeypatch, bulk.BulkInbox)  # the receiver's port this time
    payload = os.urandom(2 << 20)
    got: list[bytes | None] = []

    async def keep(msg: Inbound) -> None:
        got.append(msg.payload)

    async with MeshNode.start(Identity.generate(), config(tmp_path, "a")) as a:
        a.handlers.register("bulky", keep, max_payload=8 << 20)
        async with MeshNode.start(Identity.generate(), config(tmp_path, "b", a.multiaddrs()[:1])) as b:
            with trio.fail_after(60):
                await b.request(a.peer_id, seal(b.identity, "bulky", {"i": 2}), payload)
            assert got == [payload]
            assert a.bulk_bytes_received == 0
            a.stop()
            b.stop()
