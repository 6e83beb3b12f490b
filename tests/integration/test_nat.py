"""Home machines behind NAT, as real node processes in network namespaces.

One topology serves the module (``nat_topology.py``): a public host and three homes behind
nftables NAT routers with 20 Mbit uplinks, two hosts on the first home's LAN. The mesh of five
nodes is started once, every node with the public node's address and no other flag. The
tests run in order: a job over this mesh; the same after every home router was switched to
random port mapping (hole punching impossible) and the home nodes restarted; LAN discovery
with no bootstrap; and a stall explained when no relay can reach a home.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuflex.localmesh import LocalMesh
from tests.integration.conftest import digits_spec
from tests.integration.nat_topology import NatTopology, NetnsUnavailable

ROUNDS = 2


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatTopology, LocalMesh]]:
    try:
        topo = NatTopology((2, 1, 1), uplink_mbit=20)
    except NetnsUnavailable as exc:
        pytest.skip(f"no NAT topology here: {exc}")
    hosts = topo.hosts()  # pub, h1a, h1b, h2a, h3a
    mesh = LocalMesh(tmp_path_factory.mktemp("nat"), len(hosts), placement=lambda i: hosts[i].placement())
    try:
        mesh.start(timeout=90)
        yield topo, mesh
    finally:
        mesh.close()
        topo.close()


def _status(mesh: LocalMesh, i: int) -> dict[str, Any]:
    return dict(mesh.call(i, "status"))


def _wait_reachability(mesh: LocalMesh, want: dict[int, set[str]], timeout: float) -> None:
    def ok() -> bool:
        return all(_status(mesh, i)["nat"]["reachability"] in states for i, states in want.items())

    mesh.wait_until(ok, timeout, what=f"reachability {want}")


def _run_job(mesh: LocalMesh, timeout: float) -> str:
    nodes = list(range(mesh.size))
    mesh.wait_connected(timeout=60)
    job = mesh.submit(digits_spec(rounds=ROUNDS, min_nodes=mesh.size, group_size=2), node=0)
    mesh.wait_job(job, nodes, timeout=timeout)
    ledgers = [mesh.call(i, "ledger", {"job": job}) for i in nodes]
    assert all(len(led) == ROUNDS for led in ledgers)
    assert all(led == ledgers[0] for led in ledgers), "ledgers differ"
    hashes = {mesh.job(i, job)["model_hash"] for i in nodes}
    assert len(hashes) == 1, f"model hashes differ: {hashes}"
    for row in ledgers[0]:
        assert row["contributors"] == mesh.size, f"round {row['round']}: {row['contributors']} contributors"
    return job


def test_only_the_public_address_commits_every_round(world: tuple[NatTopology, LocalMesh]) -> None:
    topo, mesh = world
    _wait_reachability(mesh, {0: {"public"}, **{i: {"relayed"} for i in range(1, mesh.size)}}, timeout=40)
    _run_job(mesh, timeout=90)
    peers = mesh.call(1, "peers")
    assert {p["reachability"] for p in peers} >= {"public", "relayed"}


def test_only_a_relay_can_carry_it(world: tuple[NatTopology, LocalMesh]) -> None:
    topo, mesh = world
    for home in topo.homes:
        subprocess.run(["ip", "netns", "exec", home.router, "nft", "flush", "chain", "ip", "home", "postrouting_nat"],
                       check=True, timeout=20)
        subprocess.run(["ip", "netns", "exec", home.router, "nft", "add", "rule", "ip", "home", "postrouting_nat",
                        "oifname", "wan", "masquerade", "fully-random"], check=True, timeout=20)
    homes = range(1, mesh.size)
    for i in homes:  # fresh processes: no connection made under the old mapping survives
        mesh.kill(i)
    for i in homes:
        mesh.start_node(i, wait=False)
    for i in homes:
        mesh.wait_api(i, 60)
    _wait_reachability(mesh, {i: {"relayed"} for i in homes}, timeout=40)
    relayed_before = _status(mesh, 0)["nat"]["relay_load"]
    _run_job(mesh, timeout=120)
    # Homes in different houses reach each other only through the relay.
    for i in (1, 3, 4):
        kinds = {p["peer_id"]: p["connection"] for p in mesh.call(i, "peers")}
        others = [_status(mesh, j)["peer_id"] for j in (1, 3, 4) if j != i]
        assert all(kinds.get(o) in ("relayed", "none") for o in others), kinds
    assert relayed_before is not None


def test_lan_peers_find_each_other_without_bootstrap(world: tuple[NatTopology, LocalMesh],
                                                     tmp_path: Path) -> None:
    topo, _ = world
    a, b = topo.homes[0].hosts
    lan = LocalMesh(tmp_path / "lan", 2, placement=lambda i: (a, b)[i].placement())
    try:
        lan.start_node(0, wait=False)
        lan.start_node(1, wait=False)
        lan.wait_api(0, 60)
        lan.wait_api(1, 60)
        t0 = time.time()
        ids = [lan.call(i, "status")["peer_id"] for i in (0, 1)]

        def found() -> bool:
            return all(any(p["peer_id"] == ids[1 - i] and p["state"] == "up" for p in lan.call(i, "peers"))
                       for i in (0, 1))

        lan.wait_until(found, 10, interval=0.2, what="LAN discovery")
        assert time.time() - t0 < 10
    finally:
        lan.close()


def test_stall_names_the_unreachable_member(world: tuple[NatTopology, LocalMesh], tmp_path: Path) -> None:
    """A public node that relays for no one, and two homes: a job among the homes cannot
    commit, and job status says which member is out of reach and why."""
    topo, _ = world
    places = [topo.public, topo.homes[1].hosts[0], topo.homes[2].hosts[0]]
    mesh = LocalMesh(tmp_path / "stall", 3, placement=lambda i: places[i].placement(),
                     node_args=lambda i: ["--no-mdns"] + (["--no-relay-service"] if i == 0 else []))
    try:
        mesh.start(timeout=90)
        ids = [mesh.call(i, "status")["peer_id"] for i in range(3)]
        _wait_reachability(mesh, {0: {"public"}, 1: {"private"}, 2: {"private"}}, timeout=40)
        spec = digits_spec(rounds=1, min_nodes=2, allowlist=ids[1:], plan_timeout_s=3, train_timeout_s=20)
        job = mesh.submit(spec, node=0)
        deadline = 30  # the round's train deadline plus its reduce slack

        def explained() -> bool:
            st = mesh.job(1, job)
            text = f"{st.get('waiting', '')} {st.get('stalled', '')}"
            return ids[2][-8:] in text and "behind NAT, no relay reservation" in text

        mesh.wait_until(explained, deadline, what="an explained stall")
    finally:
        mesh.close()
