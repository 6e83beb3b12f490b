"""A request that times out says the stage that held it (``mesh.node.Stage``), under trio's
MockClock on the modelled transport.

At a thousand simulated nodes a leader's partial to the root timed out as "did not answer
within 40s", and nothing told whether routing, dialling, the upload or the root's handler had
taken the time."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio

from mesh.codec import register_kind, seal
from mesh.identity import Identity
from mesh.messaging import Inbound, SendError
from mesh.node import MeshConfig, MeshNode, Stage
from mesh.testing.simnet import SimNetwork

KIND = "stage_test"
register_kind(KIND)


def config(net: SimNetwork, home: Path, bootstrap: list[str]) -> MeshConfig:
    return MeshConfig(listen=["/ip4/0.0.0.0/tcp/4001"], bootstrap=bootstrap, data_dir=home, bulk_channel=False,
                      mdns=False, bootstrap_timeout_s=30.0, transport=net)


async def failed_request(tmp_path: Path, crash_receiver: bool) -> str:
    """The SendError of a request from one node to another whose handler never answers (or which
    went silent, crashed, before the request)."""
    net = SimNetwork(0)
    a, b = Identity(bytes(range(32))), Identity(bytes(range(1, 33)))

    async def never_answers(msg: Inbound) -> None:
        await trio.sleep(math.inf)

    async with MeshNode.start(b, config(net, tmp_path / "b", [])) as receiver:
        receiver.handlers.register(KIND, never_answers)
        async with MeshNode.start(a, config(net, tmp_path / "a", receiver.multiaddrs())) as sender:
            if crash_receiver:
                net.hang_up(sender.host, b.peer_id)  # no connection, so the request must dial...
                net.crash(b.peer_id)  # ...a node gone silent: the dial never completes
            with pytest.raises(SendError) as failed:
                await sender.request(b.peer_id, seal(a, KIND, {}), timeout=5.0)
            return str(failed.value)


async def test_a_handler_that_never_answers_is_named_as_the_stage(autojump_clock, tmp_path: Path) -> None:
    message = await failed_request(tmp_path, crash_receiver=False)
    assert "did not answer within 5s" in message and f"({Stage.REPLY})" in message


async def test_a_dial_that_never_completes_is_named_as_the_stage(autojump_clock, tmp_path: Path) -> None:
    message = await failed_request(tmp_path, crash_receiver=True)
    assert "did not answer within 5s" in message and f"({Stage.OPEN})" in message
