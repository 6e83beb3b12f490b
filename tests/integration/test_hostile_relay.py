"""Hostile peers use a public node's relay service; it serves the mesh within its budgets.

Real node processes on loopback: node 0 is public (its relay service on, circuits capped at
``CIRCUIT_S``), node 1 is private and holds a reservation on node 0, and both run an honest job
throughout. The hostile peers are bare ``MeshNode``s of our own library in this process, each
with its own key, speaking circuit relay v2 to node 0 directly: ``flooder`` floods and squats,
``accomplice`` holds a reservation and takes whatever reaches it, ``prober`` is a second source.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import trio

from gpuflex.localmesh import LocalMesh
from mesh.identity import Identity
from mesh.node import MeshConfig, MeshNode
from tests.integration.conftest import HONEST_PACE, light_spec, load_factor
from tests.integration.honest_job import assert_one_ledger, committed, keeps_committing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
CIRCUIT_S = 20  # node 0's --relay-max-duration
FAST = {"local_epochs": 1, "plan_timeout_s": 3.0, "train_timeout_s": 12.0, "reduce_timeout_s": 2.0}


class Relay:
    """The module's mesh: node 0 public and relaying, node 1 (and later node 2) private."""

    def __init__(self, mesh: LocalMesh) -> None:
        self.mesh = mesh
        self.ids = [mesh.call(i, "status")["peer_id"] for i in range(2)]
        self.job = ""

    def nat(self, i: int) -> dict[str, Any]:
        return dict(self.mesh.call(i, "status")["nat"])

    def rounds(self) -> int:
        return committed(self.mesh, self.job)

    def keeps_training(self, since: int) -> None:
        keeps_committing(self.mesh, self.job, since)


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    def args(i: int) -> list[str]:
        if i == 0:
            return ["--reachability", "public", "--relay-max-duration", str(CIRCUIT_S)]
        return ["--reachability", "private"]

    mesh = LocalMesh(tmp_path_factory.mktemp("relay"), 3, node_args=args)
    try:
        mesh.start(timeout=120, count=2)
        mesh.wait_connected(60)
        world = Relay(mesh)
        world.job = mesh.submit(light_spec(rounds=1000, min_nodes=2, **FAST, **HONEST_PACE))
        mesh.wait_until(lambda: world.ids[0] in world.nat(1)["reservations"], 90, interval=0.5,
                        what="node 1 holding a reservation on node 0")
        world.keeps_training(0)
        yield world
    finally:
        mesh.close()


# -- circuit relay v2 spoken by hand ---------------------------------------------------------------

@asynccontextmanager
async def hostile(relay: Relay, tmp_path: Path, name: str) -> AsyncIterator[MeshNode]:
    """A bare MeshNode with a fresh key, known to node 0 as a peer of the mesh."""
    cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=[str(relay.mesh.bootstrap)],
                     data_dir=tmp_path / name, mdns=False, reachability="public")
    async with MeshNode.start(Identity.generate(), cfg) as node:
        def known() -> bool:
            return any(r["peer_id"] == node.peer_id and r.get("reachability", "unknown") != "unknown"
                       for r in relay.mesh.call(0, "peers"))

        await trio.to_thread.run_sync(
            lambda: relay.mesh.wait_until(known, 60 * load_factor(), what=f"node 0 knowing {name}"))
        yield node
        node.stop()


async def hop_stream(node: MeshNode, relay_id: str) -> Any:
    from libp2p.peer.id import ID
    from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID

    pid = ID.from_base58(relay_id)
    for attempt in range(3):  # negotiation times out at 10 s, which a loaded machine can take
        try:
            with trio.fail_after(20):
                return await node.host.new_stream(pid, [PROTOCOL_ID])
        except Exception:
            if attempt == 2:
                raise
            with trio.move_on_after(5), suppress(Exception):  # a dead connection: dial afresh
                await node.host.disconnect(pid)
    raise AssertionError("unreachable")


async def ask(stream: Any, msg: Any) -> Any:
    from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
    from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg

    with trio.fail_after(20):
        await write_delimited_msg(stream, msg)
        return await read_delimited_msg(stream, HopMessage)


def reserve_msg(for_peer: bytes | None = None) -> Any:
    from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage

    msg = HopMessage(type=HopMessage.RESERVE)
    if for_peer is not None:
        msg.peer.id = for_peer
    return msg


async def connect(node: MeshNode, relay_id: str, dst: str, tries: int = 3) -> tuple[Any, int]:
    """A circuit from ``node`` to ``dst`` through ``relay_id``: (stream, status code)."""
    from libp2p.peer.id import ID
    from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage

    msg = HopMessage(type=HopMessage.CONNECT)
    msg.peer.id = ID.from_base58(dst).to_bytes()
    for _ in range(tries):  # a loaded machine may time the exchange out: that is no refusal
        stream = await hop_stream(node, relay_id)
        try:
            return stream, int((await ask(stream, msg)).status)
        except Exception as exc:  # a reset with no status, or a timeout
            print(f"CONNECT through the relay got no status: {exc!r}")
    return stream, -1


def accept_circuits(node: MeshNode, received: list[int]) -> None:
    """``node`` takes every circuit offered to it and counts the bytes that arrive on it."""
    from libp2p.relay.circuit_v2.pb.circuit_pb2 import StopMessage
    from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID
    from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg

    async def on_stop(stream: Any) -> None:
        with suppress(Exception):
            await read_delimited_msg(stream, StopMessage)
            await write_delimited_msg(stream, StopMessage(type=StopMessage.STATUS, status=100))
            while data := await stream.read(65536):
                received[0] += len(data)

    node.host.set_stream_handler(STOP_PROTOCOL_ID, on_stop)


async def ended_within(stream: Any, seconds: float) -> bool:
    with trio.move_on_after(seconds):
        try:
            while await stream.read(65536):
                pass
        except Exception:  # py-libp2p's reset and EOF errors share no base class
            pass
        return True
    return False


async def reserved_circuit(relay_id: str, accomplice: MeshNode, source: MeshNode) -> Any:
    """``accomplice`` reserves a slot and ``source`` opens a circuit to it: the circuit's stream.
    Both are asked again (three times at most) where a loaded machine drops a connection or
    times a step out; what the relay refuses on purpose is not asked again."""
    status = -1
    for _ in range(3):
        if (await ask(await hop_stream(accomplice, relay_id), reserve_msg())).status != OK:
            continue
        stream, status = await connect(source, relay_id, accomplice.peer_id)
        if status == OK:
            return stream
        if status not in (-1, 203, 204):  # 203, 204: the relay could not reach the accomplice in time
            break
    raise AssertionError(f"no circuit through the relay: status {status}")


NOISE_OPENING = b"\x13/multistream/1.0.0\n\x07/noise\n"
OK, REFUSED = 100, 200


# -- the attacks ------------------------------------------------------------------------------------

async def test_a_reservation_flood_of_made_up_ids_takes_one_slot(relay: Relay, tmp_path: Path) -> None:
    """One connection asks for 40 reservations naming made-up peers: node 0 reserves only for
    the peer actually connected, for at most 15 minutes, and a home node that arrives after the
    flood still gets its slot."""
    from libp2p.peer.id import ID

    since = await trio.to_thread.run_sync(relay.rounds)
    async with hostile(relay, tmp_path, "flooder") as flooder:
        stream = await hop_stream(flooder, relay.ids[0])
        answers = []
        for _ in range(40):  # on one stream while the relay keeps it open, then on a new one each
            made_up = ID.from_base58(Identity.generate().peer_id).to_bytes()
            try:
                answers.append(await ask(stream, reserve_msg(made_up)))
            except Exception:
                stream = await hop_stream(flooder, relay.ids[0])
                answers.append(await ask(stream, reserve_msg(made_up)))
        held = (await trio.to_thread.run_sync(relay.nat, 0))["relay_load"]["reservations"]
        print(f"40 made-up reservations: node 0 holds {held}; answers {sorted({a.status for a in answers})}")
        assert held <= 3, f"node 0 holds {held} reservations after one connection asked for 40"
        lifetimes = [a.reservation.expire - time.time() for a in answers if a.status == OK]
        assert lifetimes and max(lifetimes) <= 900 + 5, f"a reservation lasts {max(lifetimes, default=0):.0f} s"

        relay.mesh.start_node(2)
        me = relay.ids[0]
        await trio.to_thread.run_sync(lambda: relay.mesh.wait_until(
            lambda: me in relay.nat(2)["reservations"], 90, what="node 2 holding a reservation on node 0"))
    assert relay.ids[0] in (await trio.to_thread.run_sync(relay.nat, 1))["reservations"]
    await trio.to_thread.run_sync(relay.keeps_training, since)


async def test_one_source_cannot_take_every_circuit_of_a_reserved_peer(relay: Relay, tmp_path: Path) -> None:
    """The flooder opens every circuit it can to a reserved peer and holds them: it gets two of
    the eight, and another source still gets one."""
    async with AsyncExitStack() as stack:
        accomplice = await stack.enter_async_context(hostile(relay, tmp_path, "accomplice"))
        flooder = await stack.enter_async_context(hostile(relay, tmp_path, "flooder"))
        prober = await stack.enter_async_context(hostile(relay, tmp_path, "prober"))
        accept_circuits(accomplice, [0])
        assert (await ask(await hop_stream(accomplice, relay.ids[0]), reserve_msg())).status == OK
        held, statuses = [], []
        for _ in range(8):  # one after another, each asked again while a loaded machine gives no answer
            stream, status = await connect(flooder, relay.ids[0], accomplice.peer_id)
            statuses.append(status)
            if status == OK:
                await stream.write(NOISE_OPENING)
                held.append(stream)
            elif status != -1:
                break  # refused: this source has what it may have
        open_now = [s for s in held if not await ended_within(s, 0.5)]
        print(f"one source asked for 8 circuits to a reserved peer and holds {len(open_now)} "
              f"(answers {statuses})")
        assert 1 <= len(open_now) <= 2, "the source should hold some circuits, and no more than its share"
        _second, status = await connect(prober, relay.ids[0], accomplice.peer_id)
        assert status == OK, f"a second source was refused ({status}) while the first held {len(held)} circuits"


async def test_an_idle_circuit_ends_at_its_time_cap(relay: Relay, tmp_path: Path) -> None:
    """A circuit that carries nothing after its opening is closed at node 0's duration cap.

    A circuit that ends long before the cap ended for another reason (on a loaded machine an
    in-process peer's connection can drop): it says nothing about the cap, so a new one is
    opened, three at most, and every early end is named in the failure."""
    early: list[float] = []
    async with AsyncExitStack() as stack:
        accomplice = await stack.enter_async_context(hostile(relay, tmp_path, "accomplice"))
        prober = await stack.enter_async_context(hostile(relay, tmp_path, "prober"))
        accept_circuits(accomplice, [0])
        for _ in range(3):
            stream = await reserved_circuit(relay.ids[0], accomplice, prober)
            await stream.write(NOISE_OPENING)
            start = trio.current_time()
            assert await ended_within(stream, CIRCUIT_S + 12), f"an idle circuit outlived its {CIRCUIT_S} s cap by 12 s"
            took = trio.current_time() - start
            print(f"the idle circuit ended after {took:.1f} s (cap {CIRCUIT_S} s)")
            if took > CIRCUIT_S / 2:
                return
            early.append(round(took, 1))
    raise AssertionError(f"every idle circuit ended long before its {CIRCUIT_S} s cap, not by the cap: {early} s")


async def test_a_relay_carries_only_the_mesh_connections(relay: Relay, tmp_path: Path) -> None:
    """Raw bytes through a circuit reach nobody; a real libp2p connection (Noise) still goes
    through, and node 0 carried little of the raw bytes."""
    from libp2p.peer.id import ID
    from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID
    from multiaddr import Multiaddr

    async with AsyncExitStack() as stack:
        accomplice = await stack.enter_async_context(hostile(relay, tmp_path, "accomplice"))
        prober = await stack.enter_async_context(hostile(relay, tmp_path, "prober"))
        received = [0]
        accept_circuits(accomplice, received)
        stream = await reserved_circuit(relay.ids[0], accomplice, prober)
        junk = os.urandom(1 << 20)
        with trio.move_on_after(20), suppress(Exception):
            for _ in range(4):
                await stream.write(junk)
        with trio.move_on_after(3):
            await ended_within(stream, 3)
        print(f"4 MiB of raw bytes sent through node 0: {received[0]} arrived")
        assert received[0] == 0, f"{received[0]} raw bytes were relayed"

        # The library's own stop handler again: a real relayed libp2p connection goes through.
        assert accomplice.nat.relay is not None and prober.nat.relay is not None
        accomplice.host.set_stream_handler(STOP_PROTOCOL_ID, accomplice.nat.relay.protocol._handle_stop_stream)
        base = next(a for a in relay.mesh.call(0, "status")["addrs"] if "/ip4/127.0.0.1/" in a).split("/p2p/")[0]
        circuit = f"{base}/p2p/{relay.ids[0]}/p2p-circuit/p2p/{accomplice.peer_id}"
        conn, errors = None, []
        for _ in range(3):  # a loaded machine may time the connection's negotiation out
            with trio.move_on_after(30) as timer:
                try:
                    conn = await prober.nat.relay.transport.dial(Multiaddr(circuit))
                except Exception as exc:  # py-libp2p's dial errors share no base class
                    errors.append(f"{exc.__class__.__name__}: {exc}"[:200])
                    await trio.sleep(1)  # the raw circuit's slot is freed as its end reaches node 0
            if timer.cancelled_caught:
                errors.append("no answer in 30 s")
            if conn is not None:
                break
        assert conn is not None, f"a real libp2p connection did not go through the relay: {errors}"
        conns = prober.host.get_network().connections.get(ID.from_base58(accomplice.peer_id), [])
        assert any("/p2p-circuit" in str(a) for c in conns for a in c.get_transport_addresses())


def test_the_honest_job_kept_one_ledger(relay: Relay) -> None:
    """Through every attack: one chain of committed rounds, the same on both nodes."""
    assert_one_ledger(relay.mesh, relay.job, (0, 1), at_least=3)
