"""A hostile peer's claims cost the claimant, not the node: real node processes on loopback
keep their memory, disk, peer table and address book within stated budgets, whatever a peer
claims of its ledger, its blobs, its jobs and the peers it knows, and the honest job keeps
committing with one ledger.

One mesh serves the module: nodes 0 and 1 run an honest job through every attack, and node 2
joins late, through the hostile peer alone (the blob attack). Node 0 runs with small caps
(peer table, address book, model budget) so that a flood fills them in seconds. The hostile
peer is a bare ``MeshNode`` of our own library in this process, with its own key; everything it
sends is signed, as any peer could.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from gpuflex.localmesh import LocalMesh
from gpuflex.node.core.ledger import Ledger
from gpuflex.node.core.messages import ABORT, JOB, PLAN, PRESENCE, RESULT, SYNC, parse_result
from gpuflex.node.core.modelblob import model_blob_limit
from gpuflex.node.jobs import job_id_of
from mesh.addressbook import AddressBook
from mesh.blob import BLOB_PROTOCOL
from mesh.codec import open_envelope, seal
from mesh.dialer import join_candidates
from mesh.framing import read_obj, write_frame, write_obj
from mesh.health import HealthConfig
from mesh.host import build_host
from mesh.identity import Identity
from mesh.liveness import DOWN_PER_PERIOD, FIRST_CONTACTS_PER_PERIOD, PING_PROTOCOL
from mesh.messaging import GOSSIP_PROTOCOL, Inbound
from mesh.node import MeshConfig, MeshNode
from mesh.peertable import hint_quota, stranger_quota
from mesh.pex import PEERS_REQUEST
from tests.integration.conftest import HONEST_PACE, light_spec, load_factor
from tests.integration.honest_job import assert_paced
from tests.integration.hostile_peer import send_raw
from tests.integration.test_hostile_resources import assert_one_ledger, rss_mib

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
#: Node 0's caps: small, so a flood from this process fills them at once.
MAX_PEERS, BOOK_SIZE, MODEL_BUDGET = 32, 16, 20_000_000
#: Node 0 asks its peers for theirs this often once settled (20 s by default), so the tests
#: that pass it made-up peers meet its next ask in seconds.
PEX_S = 4
#: What an attack may add to node 0's resident memory.
RSS_BUDGET_MIB = 64
FAST = {"local_epochs": 1, "plan_timeout_s": 3.0, "train_timeout_s": 12.0, "reduce_timeout_s": 2.0}
#: The ledger page the hostile peer answers with (garbage), and how many it serves at most.
BOMB_PAGE, BOMB_PAGES = 4 << 20, 24
#: Fresh keys signing one gossiped message each.
SIGNERS = 300
#: The size a hostile model server announces.
HUGE = 3 << 29
PLAY = "FIRST CITIZEN:\nBefore we proceed any further, hear me speak.\n\nALL:\nSpeak, speak.\n\n" * 200


@dataclass
class Scene:
    mesh: LocalMesh
    ids: list[str]
    job: str = ""

    def rounds(self, nodes: tuple[int, ...] = (0, 1)) -> int:
        return min(self.mesh.job(i, self.job)["round"] for i in nodes)

    def keeps_training(self, since: int, nodes: tuple[int, ...] = (0, 1)) -> None:
        self.mesh.wait_until(lambda: self.rounds(nodes) > since, 120 * load_factor(), interval=0.5,
                             what=f"the honest job committing past round {since}")

    def peers(self, i: int = 0) -> dict[str, dict[str, Any]]:
        return {r["peer_id"]: r for r in self.mesh.call(i, "peers")}

    def log(self, i: int) -> str:
        return self.mesh.log_path(i).read_text(errors="replace")


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    base = tmp_path_factory.mktemp("claims")
    (base / "plays.txt").write_text(PLAY)
    victim = ["--max-peers", str(MAX_PEERS), "--address-book-size", str(BOOK_SIZE), "--pex-interval", str(PEX_S),
              "--max-model-params", str(MODEL_BUDGET), "--data", f"shakespeare={base / 'plays.txt'}"]
    mesh = LocalMesh(base, 3, extra_args=["--no-mdns"], node_args=lambda i: victim if i == 0 else [])
    try:
        mesh.start(timeout=120, count=2)
        mesh.wait_connected(60 * load_factor())
        scene = Scene(mesh, [mesh.call(i, "status")["peer_id"] for i in range(2)])
        scene.job = mesh.submit(light_spec(rounds=1000, min_nodes=2, **FAST, **HONEST_PACE))
        scene.keeps_training(0)
        yield scene
    finally:
        mesh.close()


# -- the hostile peer --------------------------------------------------------------------------------

@dataclass
class Claimant:
    """What the hostile peer claims, and what the nodes asked of it."""

    node: MeshNode
    pages: dict[str, int] = field(default_factory=dict)  # ledger pages asked, per asker
    pex_asks: dict[str, int] = field(default_factory=dict)  # peer exchange requests, per asker
    passed_on: list[str] = field(default_factory=list)  # made-up peers it passed on
    blob_asks: int = 0
    serves: dict[str, Any] = field(default_factory=dict)  # sync: the job frame and ledger it serves

    async def bomb_sync(self, msg: Inbound) -> dict[str, Any]:
        """Claims a far heavier ledger of every job it is asked about; every ledger page is
        4 MiB of garbage with more to come (at most ``BOMB_PAGES`` of them)."""
        body = msg.envelope.body
        if "job" not in body:
            job = str(self.serves["job"])
            return {"jobs": [], "heights": {job: 10**5}, "weights": {job: 10**9}, "heads": {}, "more": None}
        asked = self.pages[msg.envelope.sender] = self.pages.get(msg.envelope.sender, 0) + 1
        return {"ledger": [random.randbytes(BOMB_PAGE)], "more": asked < BOMB_PAGES}

    async def honest_sync(self, msg: Inbound) -> dict[str, Any]:
        """The honest job and ledger, copied from node 0: every frame verifies."""
        body = msg.envelope.body
        frames, job = self.serves["frames"], self.serves["job"]
        if "job" in body:
            return {"ledger": frames[int(body.get("from", 0)):], "more": False}
        return {"jobs": [self.serves["frame"]], "heights": {job: len(frames)}, "weights": {job: 10**6},
                "heads": {}, "more": None}

    async def made_up_peers(self, msg: Inbound) -> list[bytes]:
        """64 peers a peer exchange answer passes on: signed NodeInfo of fresh keys, at ports
        where nothing listens."""
        self.pex_asks[msg.envelope.sender] = self.pex_asks.get(msg.envelope.sender, 0) + 1
        out = []
        for _ in range(64):
            key = Identity.generate()
            self.passed_on.append(key.peer_id)
            out.append(seal(key, "nodeinfo", {"peer_id": key.peer_id, "ts": time.time(), "reachability": "public",
                                              "addrs": [f"/ip4/127.0.0.1/tcp/{random.randrange(20000, 60000)}"]}))
        return out

    async def no_peers(self, msg: Inbound) -> list[bytes]:
        """A peer exchange answer that passes on nobody: a node that joined through this peer
        alone syncs from it first, instead of from an honest peer it would learn of here."""
        return []

    async def huge_blob(self, stream: Any) -> None:
        """Whatever blob is asked for, it announces ``HUGE`` bytes, then sends nothing."""
        with contextlib.suppress(Exception):
            await read_obj(stream)
            self.blob_asks += 1
            await write_obj(stream, {"ok": True, "size": HUGE})
            await trio.sleep(20)


async def ignore(msg: Inbound) -> None:
    return None


@asynccontextmanager
async def claimant(scene: Scene, base: Path) -> AsyncIterator[Claimant]:
    cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=[str(scene.mesh.bootstrap)],
                     data_dir=base / f"hostile-{time.monotonic_ns()}", mdns=False, reachability="public")
    async with MeshNode.start(Identity.generate(), cfg) as node:
        for kind in (PRESENCE, JOB, PLAN, RESULT, ABORT):  # heard, and left alone
            node.handlers.register(kind, ignore)
        yield Claimant(node, serves={"job": scene.job})
        node.stop()


def wait(scene: Scene, predicate: Any, seconds: float, what: str) -> None:
    scene.mesh.wait_until(predicate, seconds * load_factor(), interval=0.25, what=what)


# -- 2. claims cost the claimant ----------------------------------------------------------------------

async def test_a_claimed_heavier_ledger_costs_one_page_and_a_penalty(scene: Scene, tmp_path: Path) -> None:
    since, pid = scene.rounds(), scene.mesh.procs[0].pid
    rss_before = rss_mib(pid)
    async with claimant(scene, tmp_path) as hostile:
        hostile.node.handlers.register(SYNC, hostile.bomb_sync)
        peak = rss_before
        for _ in range(3):  # presence, as any member sends it: a ledger far heavier than the mesh's
            await hostile.node.broadcast(seal(hostile.node.identity, PRESENCE, {
                "jobs": {scene.job: 10**5}, "weights": {scene.job: 10**9}}))
            await trio.sleep(1.5)
        await trio.to_thread.run_sync(wait, scene, lambda: scene.ids[0] in hostile.pages, 30, "node 0 asking")
        for _ in range(24):  # 6 s in which node 0 could ask for more
            peak = max(peak, rss_mib(pid))
            await trio.sleep(0.25)
        penalty = scene.peers(0)[hostile.node.peer_id]["penalty"]
    print(f"ledger pages asked of the claimant: {hostile.pages}; node 0 grew {peak - rss_before:.0f} MiB")
    assert hostile.pages[scene.ids[0]] <= 2, f"node 0 fetched {hostile.pages[scene.ids[0]]} pages of garbage"
    assert all(n <= 2 for n in hostile.pages.values()), hostile.pages
    assert penalty >= 1, "the page that did not verify was not penalised"
    assert peak - rss_before < RSS_BUDGET_MIB, f"node 0 grew by {peak - rss_before:.0f} MiB"
    assert f"sync page of job {scene.job}" in scene.log(0)
    scene.keeps_training(since)


async def test_a_language_model_over_the_budget_is_refused_before_anything_is_built(scene: Scene,
                                                                                  tmp_path: Path) -> None:
    since, pid = scene.rounds(), scene.mesh.procs[0].pid
    rss_before = rss_mib(pid)
    llm = {"config": {"hidden_size": 512, "num_hidden_layers": 16, "intermediate_size": 2048,
                      "num_attention_heads": 8}, "base_hash": "ab" * 32, "tokenizer_hash": "cd" * 32}
    spec = {"model": "llama", "data": "shakespeare", "rounds": 2, "name": "big", "llm": llm}
    async with claimant(scene, tmp_path) as hostile:
        frame = seal(hostile.node.identity, JOB, {"spec": spec, "members": [hostile.node.peer_id, *scene.ids],
                                                  "created": time.time()})
        job = job_id_of(open_envelope(frame))
        with trio.fail_after(30):
            await hostile.node.request(scene.ids[0], frame)
        line = f"job {job} (big) from …{hostile.node.peer_id[-8:]} not taken on"
        await trio.to_thread.run_sync(wait, scene, lambda: line in scene.log(0), 30, "node 0 refusing the job")
        peak = rss_before
        for _ in range(20):
            peak = max(peak, rss_mib(pid))
            await trio.sleep(0.25)
    refusal = next(ln for ln in scene.log(0).splitlines() if line in ln)
    assert "parameters, more than this node's budget of 20M" in refusal, refusal
    assert job not in {j["job_id"] for j in scene.mesh.call(0, "jobs")}
    assert not (scene.mesh.home(0) / "jobs" / job).exists()
    assert peak - rss_before < RSS_BUDGET_MIB, f"node 0 grew by {peak - rss_before:.0f} MiB"
    scene.keeps_training(since)


# -- 3. bounded peer state ------------------------------------------------------------------------------

async def test_fresh_signers_get_no_peer_entry_and_passed_on_peers_stay_within_the_table_cap(
        scene: Scene, tmp_path: Path) -> None:
    since, target = scene.rounds(), scene.ids[0]
    signers = [Identity.generate() for _ in range(SIGNERS)]
    async with claimant(scene, tmp_path) as hostile:
        hostile.node.handlers.register(PEERS_REQUEST, hostile.made_up_peers)

        async def gossip(first: int) -> None:  # a message node 0 rejects, each from a fresh key
            for key in signers[first::8]:
                with contextlib.suppress(Exception):
                    await send_raw(hostile.node, target, seal(key, PRESENCE, {"jobs": "none"}), tries=3)

        async with trio.open_nursery() as nursery:
            for first in range(8):
                nursery.start_soon(gossip, first)
        # Node 0 asks its peers for theirs every PEX_S seconds once it is past its first half minute.
        await trio.to_thread.run_sync(wait, scene, lambda: hostile.pex_asks.get(target, 0) >= 1, 40,
                                      "node 0 asking for peers")
        await trio.sleep(3)  # what it learnt settles: probes of the made-up peers fail
        rows = scene.peers(0)
        status = scene.mesh.call(0, "status")
        log = scene.log(0)
    rejected = sum(f"rejected input from {k.peer_id[-8:]}" in log for k in signers)
    ids = set(rows)
    hints = [r for r in rows.values() if r["last_seen"] is None]
    print(f"node 0: {len(rows)} peer entries ({len(hints)} never heard from) after {SIGNERS} signers "
          f"({rejected} rejected) and {len(hostile.passed_on)} passed-on peers; mesh {status['mesh']}")
    assert rejected >= SIGNERS // 2, f"only {rejected} of the signers' messages reached node 0"
    assert not ids & {k.peer_id for k in signers}, "a key seen only as a signer got a peer entry"
    assert ids & set(hostile.passed_on), "no passed-on peer reached node 0's table"
    assert len(rows) <= MAX_PEERS and len(hints) <= hint_quota(MAX_PEERS), (len(rows), len(hints))
    assert rows[scene.ids[1]]["state"] == "up"
    scene.keeps_training(since)


def book_entry(scene: Scene, peer: str) -> Any:
    """Node 0's saved address book (read from a copy: a book that fails to load is moved
    aside), and ``peer``'s entry in it."""
    copy = scene.mesh.base / "book-copy.json"
    copy.write_bytes((scene.mesh.home(0) / "peers.json").read_bytes())
    book = AddressBook(copy, scene.ids[0])
    book.load()
    return book, book.get(peer)


async def test_passed_on_peers_never_push_verified_ones_out_of_the_address_book(scene: Scene,
                                                                                 tmp_path: Path) -> None:
    """Node 1 stops, and node 0's dials to it fail, as they do for a peer that restarts.
    Meanwhile a peer passes on made-up peers to node 0 (whose address book holds 16): node 1
    stays in the book, ahead of every hint, so node 0 dials it first when it starts again."""
    mesh, (me, other) = scene.mesh, scene.ids

    def failed_or_gone() -> bool:
        entry = book_entry(scene, other)[1]
        return entry is None or entry.failures >= 3

    async with claimant(scene, tmp_path) as hostile:
        hostile.node.handlers.register(PEERS_REQUEST, hostile.made_up_peers)
        mesh.call(1, "shutdown")
        await trio.to_thread.run_sync(lambda: mesh.procs[1].wait(timeout=30))
        await trio.to_thread.run_sync(wait, scene, failed_or_gone, 60, "node 0 failing to dial node 1")
        asked = hostile.pex_asks.get(me, 0)  # made-up peers passed on from now on meet a peer with failed dials
        await trio.to_thread.run_sync(wait, scene, lambda: hostile.pex_asks.get(me, 0) > asked, 40,
                                      "node 0 asking for peers")
        await trio.sleep(4)  # what it learnt reaches its book, saved every 2 s
    book, entry = book_entry(scene, other)
    made_up = set(hostile.passed_on)
    held = [e.peer_id for e in book.best()]
    print(f"node 0's book: {len(held)} entries, {len(made_up & set(held))} made up; node 1 "
          f"{'kept' if entry else 'evicted'} ({entry.failures if entry else '-'} failed dials)")
    await trio.to_thread.run_sync(lambda: mesh.start_node(1, timeout=120))
    assert entry is not None, "node 1, verified by node 0 itself, was pushed out of its book by hints"
    assert made_up & set(held), "no passed-on peer reached node 0's address book"
    order = [c.peer_id for c in join_candidates([], book, set(), 32)]  # what node 0 dials first at start
    assert other in order and all(order.index(other) < order.index(p) for p in made_up & set(order)), order
    assert all(e.verified for e in book.best()[: book.best().index(entry) + 1])
    await trio.to_thread.run_sync(lambda: mesh.wait_until(lambda: me in scene.peers(1), 60 * load_factor(),
                                                          what="node 1 back in the mesh"))


#: Fresh keys that each make a live connection of their own to node 0, eight at a time: more
#: than twice what strangers may hold of its table.
CONNECTORS, AT_ONCE = 2 * stranger_quota(MAX_PEERS) + 8, 8


async def test_fresh_keys_that_connect_hold_a_bounded_share_of_the_table_and_push_no_reached_peer_out(
        scene: Scene) -> None:
    """Each key a host of its own, connected to node 0 over Noise and sending it a message: a
    stranger (connected, never reached by node 0) gets an entry only within the strangers'
    share of the table, the stranger worth least goes first, and the peers node 0 reached
    itself stay. Node 0's work on them is bounded per probe period, whatever their number."""
    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from multiaddr import Multiaddr

    since, target = scene.rounds(), scene.ids[0]
    keys = [Identity.generate() for _ in range(CONNECTORS)]
    fresh = {k.peer_id for k in keys}

    def reached_node_1() -> bool:  # node 1 may have just restarted: node 0 probes it again first
        row = scene.peers(0).get(scene.ids[1], {})
        return row.get("state") == "up" and row.get("reached", True)

    await trio.to_thread.run_sync(wait, scene, reached_node_1, 60, "node 0 reaching node 1")
    pings: list[str] = []
    connected: list[str] = []
    tried: list[str] = []
    hold, gate = trio.Event(), trio.Semaphore(AT_ONCE)

    async def connect_as(key: Identity) -> None:
        host = build_host(key, ["/ip4/127.0.0.1/tcp/0"])

        async def ping(stream: Any) -> None:  # counted, never answered
            pings.append(key.peer_id)
            with contextlib.suppress(Exception):
                await stream.close()

        with contextlib.suppress(Exception):
            async with host.run([Multiaddr("/ip4/127.0.0.1/tcp/0")]):
                host.set_stream_handler(PING_PROTOCOL, ping)
                try:
                    async with gate:
                        for attempt in range(3):  # a loaded machine drops a handshake now and then
                            try:
                                with trio.fail_after(30 * load_factor()):
                                    await host.connect(info_from_p2p_addr(Multiaddr(str(scene.mesh.bootstrap))))
                                    stream = await host.new_stream(ID.from_base58(target), [GOSSIP_PROTOCOL])
                                    await write_frame(stream, seal(key, PRESENCE, {"jobs": {}}))
                                    await stream.close()
                                break
                            except Exception:  # py-libp2p's stream errors share no base class
                                if attempt == 2:
                                    raise
                                await trio.sleep(1.0)
                        connected.append(key.peer_id)
                finally:
                    tried.append(key.peer_id)
                await hold.wait()

    def held_by_fresh_keys() -> tuple[int, int, int]:
        """Node 0's entries of the fresh keys: strangers (heard from, never reached), hints (the
        connections it lists as peers to look up; never heard from), and those it reached
        itself since (its probes redial a silent peer)."""
        rows = [r for p, r in scene.peers(0).items() if p in fresh]
        return (sum(r["last_seen"] is not None and not r.get("reached") for r in rows),
                sum(r["last_seen"] is None for r in rows), sum(bool(r.get("reached")) for r in rows))

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(connect_as, key)
        await trio.to_thread.run_sync(wait, scene, lambda: len(tried) == CONNECTORS, 120,
                                      "every fresh key trying to connect to node 0")
        await trio.to_thread.run_sync(wait, scene, lambda: sum(held_by_fresh_keys()) >= stranger_quota(MAX_PEERS),
                                      30, "node 0 taking the fresh keys in")
        held = []
        for _ in range(8):  # what node 0 holds while they stay connected
            held.append(await trio.to_thread.run_sync(held_by_fresh_keys))
            await trio.sleep(0.5)
        rows = scene.peers(0)
        elapsed = trio.current_time() - started
        hold.set()
    periods = elapsed / HealthConfig().ping_interval_s + 2
    print(f"node 0: {len(rows)} entries; (strangers, hints, reached) of the {len(connected)} fresh keys: "
          f"{held}; {len(pings)} pings to them in {elapsed:.0f}s")
    # More fresh keys connected than strangers may hold (on a loaded machine a few time out).
    assert len(connected) >= stranger_quota(MAX_PEERS) + 8, f"only {len(connected)} fresh keys connected"
    assert max(s for s, _, _ in held) <= stranger_quota(MAX_PEERS), f"strangers held {held}"
    # Evicted strangers still connected are listed as hints, within the hints' quota; a fresh
    # key is reached only by one of node 0's own probes, a bounded number per period.
    probed = (FIRST_CONTACTS_PER_PERIOD + DOWN_PER_PERIOD) * periods
    assert max(s + h for s, h, _ in held) <= stranger_quota(MAX_PEERS) + hint_quota(MAX_PEERS), held
    assert max(r for _, _, r in held) <= probed, held
    assert len(rows) <= MAX_PEERS
    assert rows[scene.ids[1]]["state"] == "up" and rows[scene.ids[1]].get("reached"), rows[scene.ids[1]]
    assert len(pings) <= probed, len(pings)
    scene.keeps_training(since)



# -- 2. announced blob sizes --------------------------------------------------------------------------

async def test_a_model_server_announcing_a_huge_size_reserves_no_disk(scene: Scene, tmp_path: Path) -> None:
    """Node 2 joins through the hostile peer alone; it serves the honest job and its real ledger
    (verified), and announces 1.5 GiB for the model. Node 2 refuses the size against what the
    job's model allows, before reserving any disk, and fetches the model from an honest node."""
    mesh, job = scene.mesh, scene.job
    ledger = Ledger(mesh.home(0) / "jobs" / job / "ledger.msgpack", job)
    assert ledger.load() == []
    blobs = mesh.home(2) / "blobs"
    async with claimant(scene, tmp_path) as hostile:
        hostile.serves.update(frame=(mesh.home(0) / "jobs" / job / "job.frame").read_bytes(), frames=ledger.frames)
        hostile.node.handlers.register(SYNC, hostile.honest_sync)
        hostile.node.handlers.register(PEERS_REQUEST, hostile.no_peers)  # node 2 learns the job here first
        hostile.node.host.set_stream_handler(BLOB_PROTOCOL, hostile.huge_blob)
        victim, through = mesh.node_args, hostile.node.multiaddrs()[0]
        mesh.node_args = lambda i: ["--bootstrap", through] if i == 2 else list(victim(i) if victim else [])
        await trio.to_thread.run_sync(lambda: mesh.start_node(2, bootstrap=False, timeout=120))
        biggest = 0
        deadline = trio.current_time() + 60 * load_factor()
        while hostile.blob_asks == 0 and trio.current_time() < deadline:
            await trio.sleep(0.1)
        for _ in range(40):  # 4 s: what node 2 holds on disk for the blob announced
            parts = list(blobs.glob(".*.part")) if blobs.exists() else []
            biggest = max([biggest, *(p.stat().st_blocks * 512 for p in parts if p.exists())])
            await trio.sleep(0.1)
        asks = hostile.blob_asks
        await trio.to_thread.run_sync(wait, scene, lambda: mesh.job(2, job)["round"] >= len(ledger.frames), 90,
                                      "node 2 catching up")
        penalty = scene.peers(2).get(hostile.node.peer_id, {}).get("penalty", 0)
    # The ledger keeps its results without their evidence (ledger.kept): the update is in the frame.
    update = parse_result(open_envelope(ledger.frames[-1], expect_kind=RESULT)).updates[0]
    limit = model_blob_limit(int(open_envelope(update).body["delta_size"]))
    print(f"node 2 reserved {biggest >> 20} MiB for a blob announced at {HUGE >> 20} MiB")
    assert asks >= 1, "node 2 never asked the hostile server for the model"
    assert biggest < limit, f"node 2 reserved {biggest} bytes for the announced blob"
    assert penalty >= 1
    assert f"announced a blob of {HUGE} bytes" in scene.log(2)


def test_the_honest_job_kept_one_ledger_on_every_node(scene: Scene) -> None:
    """Through every claim: one chain of committed rounds, the same on all three nodes (node 2
    caught up on it through an honest node), as far as each has got; paced by its ``pause_s``."""
    assert_one_ledger(scene.mesh, scene.job, scene.rounds(), 3)
    assert_paced(scene.mesh, scene.job, 0, HONEST_PACE["pause_s"])
