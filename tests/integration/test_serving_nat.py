"""Serving across NAT: a model served in one home is asked for through a node in another
home, over the public node's relay (the routers map ports at random, so nothing else joins
the two homes), streaming, in network namespaces the test makes and deletes."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from gpuflex.localmesh import LocalMesh
from gpuflex.testing.nat import NatTopology, NetnsUnavailable
from tests.integration.test_serving import SERVE, tiny_model_dir
from tests.needs import needs

pytestmark = [needs("transformers"), pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_request_is_routed_and_streamed_over_a_relay_between_two_homes(tmp_path: Path) -> None:
    try:
        topo = NatTopology((1, 1), uplink_mbit=20, random_ports=True)
    except NetnsUnavailable as exc:
        pytest.skip(f"no NAT topology here: {exc}")
    hosts = [topo.public, topo.homes[0].hosts[0], topo.homes[1].hosts[0]]
    mesh = LocalMesh(tmp_path / "mesh", 3, placement=lambda i: hosts[i].placement())
    model_dir = tiny_model_dir(tmp_path)
    try:
        for i in range(3):
            mesh.home(i).mkdir(parents=True, exist_ok=True)
            models = f'[serve.models]\ntiny = "{model_dir}"\n' if i == 1 else ""
            (mesh.home(i) / "node.toml").write_text(SERVE.format(batch=2) + models)
        mesh.start(timeout=120)
        mesh.wait_until(lambda: all(mesh.call(i, "status")["nat"]["reachability"] == "relayed" for i in (1, 2)),
                        timeout=120)
        url = mesh.call(2, "status")["serve"]["http"]
        home_b = hosts[2]

        def listed() -> bool:
            out = home_b.run("curl", "-s", f"{url}/v1/models").stdout
            return '"tiny"' in out

        mesh.wait_until(listed, timeout=90)
        body = json.dumps({"model": "tiny", "prompt": "ROMEO:\n", "max_tokens": 8, "temperature": 0,
                           "stream": True})
        res = home_b.run("curl", "-sN", f"{url}/v1/completions", "-H", "content-type: application/json",
                         "-d", body, timeout=120)
        events = [line[6:] for line in res.stdout.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", res.stdout[-500:] + res.stderr[-500:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
        server = mesh.call(1, "status")
        assert server["serve"]["models"][0]["requests"] >= 1  # answered in the other home
        links = {p["peer_id"]: p["connection"] for p in mesh.call(2, "peers")}
        assert links[server["peer_id"]] == "relayed"
    finally:
        for i in list(mesh.procs):
            with contextlib.suppress(Exception):  # a node already gone
                mesh.call(i, "shutdown", timeout=2)
        mesh.close()
        topo.close()
