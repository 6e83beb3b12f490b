"""Home machines behind NAT, as real node processes in network namespaces.

One topology serves the module (``gpuflex.testing.nat``): a public host and four homes behind
nftables NAT routers with 20 Mbit uplinks, every router mapping each connection to a random
port (``masquerade fully-random``), so no hole can be punched and only a relay can join two
homes. Three meshes start at once, so their start-up costs overlap:

* the main mesh: the public node and four home nodes (two on the first home's LAN), each home
  node started with the public node's address and no other flag;
* the LAN pair: two nodes on the fourth home's LAN with no bootstrap address at all;
* the stall mesh: a second public node whose relay service is off, and a node in each of two
  homes (``--no-mdns``, so the main mesh's LAN nodes stay out of it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuflex.localmesh import LocalMesh
from gpuflex.testing.nat import NatTopology, NetnsUnavailable
from tests.integration.conftest import digits_spec, load_factor

ROUNDS = 2
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass
class World:
    topo: NatTopology
    main: LocalMesh
    lan: LocalMesh
    stall: LocalMesh
    job: str = ""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    try:
        topo = NatTopology((2, 1, 1, 2), uplink_mbit=20, random_ports=True)
    except NetnsUnavailable as exc:
        pytest.skip(f"no NAT topology here: {exc}")
    base = tmp_path_factory.mktemp("nat")
    h1a, h1b = topo.homes[0].hosts
    h2a, h3a = topo.homes[1].hosts[0], topo.homes[2].hosts[0]
    lan_hosts = topo.homes[3].hosts
    main_hosts = [topo.public, h1a, h1b, h2a, h3a]
    stall_hosts = [topo.public, h2a, h3a]
    main = LocalMesh(base / "main", 5, placement=lambda i: main_hosts[i].placement())
    lan = LocalMesh(base / "lan", 2, placement=lambda i: lan_hosts[i].placement())
    stall = LocalMesh(base / "stall", 3, placement=lambda i: stall_hosts[i].placement(),
                      node_args=lambda i: ["--no-mdns"] + (["--no-relay-service"] if i == 0 else []))
    lan.bootstrap = None  # and it stays so: these two find each other by mDNS alone
    try:
        main.start_node(0, wait=False)
        stall.start_node(0, wait=False)
        lan.start_node(0, wait=False)
        lan.start_node(1, wait=False)
        for mesh in (main, stall):
            mesh.wait_api(0, 90)
            mesh.bootstrap = mesh.call(0, "status")["addrs"][0]
            for i in range(1, mesh.size):
                mesh.start_node(i, wait=False)
        for mesh in (main, stall, lan):
            for i in range(mesh.size):
                mesh.wait_api(i, 90)
        yield World(topo, main, lan, stall)
    finally:
        for mesh in (main, lan, stall):  # ask every node to stop at once, then wait for each
            for i in list(mesh.procs):
                with contextlib.suppress(Exception):
                    mesh.call(i, "shutdown", timeout=2)
        for mesh in (main, lan, stall):
            mesh.close()
        topo.close()


def _nat(mesh: LocalMesh, i: int) -> dict[str, Any]:
    return dict(mesh.call(i, "status")["nat"])


def _wait_reachability(mesh: LocalMesh, want: dict[int, str], timeout: float) -> None:
    seen: dict[int, Any] = {}

    def ok() -> bool:
        seen.update({i: _nat(mesh, i) for i in want})
        return all(seen[i]["reachability"] == v for i, v in want.items())

    try:
        mesh.wait_until(ok, timeout, what=f"reachability {want}")
    except TimeoutError as exc:
        detail = {i: (n["reachability"], n["reservations"], n["refused"], n["checks"]) for i, n in seen.items()}
        raise TimeoutError(f"{exc}: {detail}") from None


@pytest.fixture(scope="module")
def main_job(world: World) -> str:
    """One job over the main mesh with min_nodes = every node, run once for the first two tests."""
    mesh = world.main
    _wait_reachability(mesh, {0: "public", 1: "relayed", 2: "relayed", 3: "relayed", 4: "relayed"}, 90)
    mesh.wait_connected(timeout=60)
    job = mesh.submit(digits_spec(rounds=ROUNDS, min_nodes=mesh.size, group_size=2), node=0)
    # Relayed homes settle their attempts slower when the machine is busy (the whole suite
    # runs beside this): the budget that holds on an idle machine, scaled by the load.
    mesh.wait_job(job, list(range(mesh.size)), timeout=120 * load_factor())
    return job


def test_only_the_public_address_commits_every_round(world: World, main_job: str) -> None:
    mesh = world.main
    ledgers = [mesh.call(i, "ledger", {"job": main_job}) for i in range(mesh.size)]
    assert all(len(led) == ROUNDS for led in ledgers)
    assert all(led == ledgers[0] for led in ledgers), "ledgers differ"
    assert len({mesh.job(i, main_job)["model_hash"] for i in range(mesh.size)}) == 1, "model hashes differ"
    ids = {mesh.call(i, "status")["peer_id"] for i in range(mesh.size)}
    for row in ledgers[0]:
        assert {c["peer"] for c in row["contributors"]} == ids, f"round {row['round']}: not every member"


def test_only_a_relay_can_carry_it(world: World, main_job: str) -> None:
    """Random port mapping on every router: homes in different houses were never joined
    directly, and the public node's relay carried the circuits between them."""
    mesh = world.main
    ids = [mesh.call(i, "status")["peer_id"] for i in range(mesh.size)]
    house = {ids[1]: 1, ids[2]: 1, ids[3]: 2, ids[4]: 3}
    for i in range(1, mesh.size):
        kinds = {p["peer_id"]: p["connection"] for p in mesh.call(i, "peers")}
        for other, h in house.items():
            if other != ids[i] and h != house[ids[i]]:
                assert kinds.get(other) in ("relayed", "none"), f"node {i} to {other[-8:]}: {kinds.get(other)}"
    load = _nat(mesh, 0)["relay_load"]
    assert load["reservations"] >= 4, load
    # Every cross-house pair needs a circuit, and the round's updates and models crossed them.
    assert load["circuits_served"] >= 5 and load["relayed_bytes"] > 100_000, load


def test_lan_peers_find_each_other_without_bootstrap(world: World) -> None:
    lan = world.lan
    ids = [lan.call(i, "status")["peer_id"] for i in (0, 1)]

    def found() -> bool:
        return all(any(p["peer_id"] == ids[1 - i] and p["state"] == "up" for p in lan.call(i, "peers"))
                   for i in (0, 1))

    lan.wait_until(found, 20, interval=0.2, what="LAN discovery")
    started = max(_nat(lan, i)["listening_since"] for i in (0, 1))
    for i in (0, 1):
        seen = next(p["first_seen"] for p in lan.call(i, "peers") if p["peer_id"] == ids[1 - i])
        assert seen - started < 10, f"node {i} found its LAN peer {seen - started:.1f}s after both listened"


def test_stall_names_the_unreachable_member(world: World) -> None:
    """No relay anywhere, two homes: a job among the homes cannot commit, and job status says
    within one round deadline which member is out of reach and why."""
    mesh = world.stall
    ids = [mesh.call(i, "status")["peer_id"] for i in range(3)]
    _wait_reachability(mesh, {0: "public", 1: "private", 2: "private"}, 40)
    spec = digits_spec(rounds=1, min_nodes=2, allowlist=ids[1:], plan_timeout_s=3, train_timeout_s=15)
    job = mesh.submit(spec, node=0)
    round_deadline = 15 + 5 * 4 + 10  # train deadline, reduce slack per member, grace (rounds._round_end)

    def explained() -> bool:
        st = mesh.job(1, job)
        text = f"{st.get('waiting', '')} {st.get('stalled', '')}"
        return ids[2][-8:] in text and "behind NAT, no relay reservation" in text

    mesh.wait_until(explained, round_deadline, what="an explained stall")
