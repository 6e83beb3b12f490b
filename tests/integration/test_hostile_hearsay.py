"""A key known by hearsay alone is never placed in a plan, with real node processes on loopback.

A hostile peer (a bare ``MeshNode`` of our own library) holds a second key with no process
behind it. It hands that key's signed NodeInfo to every node that asks it for peers, keeps
the key "alive" with liveness rumours the key signs, and forwards presence the key signs for
the honest job: everything a member says, except that nothing ever answers for it. The key is
up on every honest node by hearsay (the overlay and gossip may count it), yet no honest node
plans it, so no round waits for an update that never comes, and no committed plan names it.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import trio

from gpuflex.node.core.ledger import Ledger
from gpuflex.node.core.messages import PRESENCE
from mesh.codec import seal
from mesh.identity import Identity
from mesh.liveness import RUMOUR
from mesh.pex import PEERS_REQUEST
from tests.integration.conftest import light_spec, load_factor, scaled_wait
from tests.integration.hostile_peer import HostilePeer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
ROUNDS = 1000  # more than the test waits for: it reads the rounds committed meanwhile
AFTER = 3
TIMING = {"local_epochs": 1, "plan_timeout_s": 2.0, "train_timeout_s": 10.0, "reduce_timeout_s": 2.0}


def test_a_key_up_by_hearsay_that_never_answers_is_in_no_committed_plan(mesh_factory, tmp_path) -> None:
    mesh = mesh_factory(2)
    mesh.start(timeout=120)
    mesh.wait_connected(60 * load_factor())

    wait = scaled_wait(mesh, 60.0)

    honest = [mesh.call(i, "status")["peer_id"] for i in range(2)]
    # The job first, so that its members are the honest nodes (the hostile peer, which answers
    # pings but holds no job, would be one of its first members, and idle every round).
    job = mesh.submit(light_spec(rounds=ROUNDS, min_nodes=2, group_size=8, **TIMING))
    wait(lambda: all(mesh.job(i, job)["round"] >= 1 for i in range(2)), "the job's first round")
    relay = HostilePeer(tmp_path / "relay", mesh.call(0, "status")["addrs"][0]).start()
    ghost = Identity.generate()  # no process: nothing ever answers for it
    assert relay.node is not None
    info = {**relay.node.node_info(), "peer_id": ghost.peer_id, "addrs": ["/ip4/127.0.0.1/tcp/9"]}

    async def peers_answer(msg: object) -> list[bytes]:  # the ghost's signed NodeInfo, freshly dated
        return [seal(ghost, "nodeinfo", {**info, "ts": time.time()})]

    async def speak_for_the_ghost() -> None:
        """What a member says, signed by the ghost and forwarded by the relay: alive, present."""
        for inc in range(1, 10_000):
            for frame in (seal(ghost, RUMOUR, {"peer": ghost.peer_id, "state": "alive", "inc": inc}),
                          seal(ghost, PRESENCE, {"jobs": {job: 0}})):
                with contextlib.suppress(Exception):
                    await relay.push_raw(honest, frame)
            await trio.sleep(0.5)

    def start() -> None:
        relay.node.handlers.register(PEERS_REQUEST, peers_answer)  # type: ignore[union-attr]
        relay._nursery.start_soon(speak_for_the_ghost)

    def ghost_rows() -> list[dict]:
        return [r for i in range(2) for r in mesh.call(i, "peers") if r["peer_id"] == ghost.peer_id]

    try:
        trio.from_thread.run_sync(start, trio_token=relay._token)
        wait(lambda: len(rows := ghost_rows()) == 2 and all(r["state"] == "up" for r in rows),
             "both honest nodes hold the ghost up by hearsay")
        assert all(r["last_seen"] is None for r in ghost_rows()), "nothing ever came from the ghost itself"
        since = min(mesh.job(i, job)["round"] for i in range(2))
        wait(lambda: all(mesh.job(i, job)["round"] >= since + AFTER for i in range(2)),
             f"{AFTER} rounds planned while the ghost is up and present")
    finally:
        relay.close()
    for i in range(2):
        ledger = Ledger(mesh.home(i) / "jobs" / job / "ledger.msgpack", job)
        ledger.load()
        assert len(ledger.results) >= since + AFTER
        planned = {p for res in ledger.results for p in res.plan.members}
        assert ghost.peer_id not in planned, f"node {i}: a committed plan names a key nothing answers for"
        assert planned == set(honest)
