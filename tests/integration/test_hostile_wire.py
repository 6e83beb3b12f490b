"""A peer that sends garbage is logged, dropped and penalised; the node keeps serving."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import trio

from mesh.codec import register_kind, seal
from mesh.identity import Identity
from mesh.messaging import GOSSIP_PROTOCOL, MSG_PROTOCOL, Inbound
from mesh.node import MeshConfig, MeshNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
register_kind("echo", 4096)
register_kind("claim", 4096)


async def test_garbage_truncated_oversized_and_replayed_frames_are_rejected(tmp_path: Path) -> None:
    events: list[dict] = []

    def record(type_: str, **fields: object) -> None:
        events.append({"type": type_, **fields})

    cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], data_dir=tmp_path / "target")
    async with MeshNode.start(Identity.generate(), cfg, on_event=record) as target:
        async def echo(msg: Inbound) -> dict:
            return {"echo": msg.envelope.body}

        target.handlers.register("echo", echo)
        hostile_cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=target.multiaddrs()[:1],
                                 data_dir=tmp_path / "hostile")
        async with MeshNode.start(Identity.generate(), hostile_cfg) as hostile:
            async def raw(protocol: str, data: bytes) -> None:
                stream = await hostile.open(target.peer_id, protocol, 10)
                try:
                    await stream.write(data)
                    with trio.move_on_after(2):
                        await stream.read(1024)
                except Exception:
                    pass
                finally:
                    with contextlib.suppress(Exception):
                        await stream.close()

            await raw(MSG_PROTOCOL, os.urandom(512))  # random bytes
            valid = seal(hostile.identity, "echo", {"x": 1})
            await raw(MSG_PROTOCOL, len(valid).to_bytes(4, "big") + valid[: len(valid) // 2])  # truncated
            await raw(MSG_PROTOCOL, (1 << 30).to_bytes(4, "big") + b"x" * 64)  # oversized
            await raw(GOSSIP_PROTOCOL, (8).to_bytes(4, "big") + b"\xc1" * 8)  # garbled gossip

            # A valid message is served; the same signed frame sent again is a replay.
            assert await hostile.request(target.peer_id, valid) == {"echo": {"x": 1}}
            from mesh.messaging import SendError

            with pytest.raises(SendError):
                await hostile.request(target.peer_id, valid)

            with trio.fail_after(10):
                while len([e for e in events if e["type"] == "rejected"]) < 5:
                    await trio.sleep(0.1)
            reasons = {e["reason"] for e in events if e["type"] == "rejected"}
            assert {"truncated", "oversized", "replay"} <= reasons
            assert target.peers.get(hostile.peer_id).penalty >= 3  # five faults (a cut frame weighs less), minus decay

            # The node keeps serving everyone else.
            third_cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=target.multiaddrs()[:1],
                                   data_dir=tmp_path / "third")
            async with MeshNode.start(Identity.generate(), third_cfg) as third:
                reply = await third.request(target.peer_id, seal(third.identity, "echo", {"y": 2}))
                assert reply == {"echo": {"y": 2}}
                third.stop()
            hostile.stop()
        target.stop()


async def test_a_forgery_relayed_by_an_honest_peer_is_its_signers_fault(tmp_path: Path) -> None:
    """The forger gossips a message the target's layer refuses to an honest relay only; the relay
    passes it on unjudged. The target penalises the signer, not the relay."""
    from mesh.codec import WireError
    from mesh.framing import write_frame

    def cfg(name: str, *boot: str) -> MeshConfig:
        return MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=list(boot), data_dir=tmp_path / name)

    refused: list[str] = []
    async with MeshNode.start(Identity.generate(), cfg("target")) as target:
        async def claim(msg: Inbound) -> None:
            refused.append(msg.via)
            raise WireError("round", "a claim no honest node would make")

        target.handlers.register("claim", claim)
        async with MeshNode.start(Identity.generate(), cfg("relay", *target.multiaddrs()[:1])) as relay, \
                MeshNode.start(Identity.generate(), cfg("forger", *relay.multiaddrs()[:1])) as forger:
            with trio.fail_after(20):
                while target.peer_id not in relay.peers.alive():
                    await trio.sleep(0.1)
            stream = await forger.open(relay.peer_id, GOSSIP_PROTOCOL, 10)
            frame = seal(forger.identity, "claim", {"x": 1})
            await write_frame(stream, frame)
            await stream.close()
            with trio.fail_after(20):
                while not refused:
                    await trio.sleep(0.1)
            assert refused == [relay.peer_id]  # it came through the relay
            with trio.fail_after(5):
                while target.peers.get(forger.peer_id) is None or target.peers.get(forger.peer_id).penalty < 0.5:
                    await trio.sleep(0.1)
            rec = target.peers.get(relay.peer_id)
            assert rec is None or rec.penalty == 0, f"the honest relay was penalised: {rec.penalty}"
            forger.stop()
            relay.stop()
        target.stop()
