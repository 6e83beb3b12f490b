"""``redundancy = 2`` catches a lying server, as real node processes on loopback.

Three nodes serve the same tiny model (same hash). The third is a test adversary: its own
operator set ``GPUFLEX_TEST_SERVE_ADVERSARY=wrong-tokens`` in its environment (gpuflex/adversary.py,
loopback only), so it answers with the least likely tokens while speaking the protocol. The
first node takes requests in and checks every one on a second server; a mismatch is settled by
the third, and the liar, and only the liar, is reported and penalised, as the control API shows.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gpuflex.adversary import SERVE_ENV
from tests.integration.conftest import scaled_wait
from tests.integration.test_serving import SERVE, api_url, servers_of, tiny_model_dir
from tests.needs import needs

httpx = pytest.importorskip("httpx")
pytestmark = [needs("transformers"), pytest.mark.integration, pytest.mark.timeout(420)]


def complete(url: str, prompt: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 8,
                                                     "temperature": 0}, timeout=120)


def test_a_server_whose_answers_differ_is_reported_and_penalised_by_the_redundancy_check(
        mesh_factory: Any, tmp_path: Path) -> None:
    model_dir = tiny_model_dir(tmp_path)
    mesh = mesh_factory(3)
    for i in range(3):
        mesh.home(i).mkdir(parents=True, exist_ok=True)
        checks = "redundancy = 2\ncheck_fraction = 1.0\n" if i == 0 else ""
        models = f'[serve.models]\ntiny = "{model_dir}"\n'
        (mesh.home(i) / "node.toml").write_text(SERVE.format(batch=4) + checks + models)
    mesh.start(timeout=120, count=2)
    mesh.env[SERVE_ENV] = "wrong-tokens"  # the third node's own environment, nothing on the wire
    mesh.start_node(2, timeout=120)
    mesh.wait_connected(90)
    ids = [mesh.call(i, "status")["peer_id"] for i in range(3)]
    honest, liar = ids[1], ids[2]
    url = api_url(mesh, 0)
    wait = scaled_wait(mesh, 60)
    wait(lambda: servers_of(url, "tiny") == 3, "three servers of the model")

    # The liar's own answers differ from an honest server's, on the same model.
    said = {i: complete(api_url(mesh, i), "ROMEO:").json()["choices"][0]["text"] for i in (1, 2)}
    assert said[1] != said[2], said

    # Requests through node 0, a few at a time so that they spread over the servers, until a
    # check has involved the liar (every request is checked; which servers answer is routing's
    # choice, by load and round-trip time).
    batch = [0]

    def caught() -> bool:
        codes: list[int] = []
        threads = [threading.Thread(target=lambda k=k: codes.append(complete(url, f"line {batch[0]}.{k}:").status_code))
                   for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        batch[0] += 1
        assert codes == [200] * 4, codes
        return liar in mesh.call(0, "status")["serve"]["redundancy"]["penalised"]

    wait(caught, "the redundancy check catching the lying server", timeout=180)
    checks = mesh.call(0, "status")["serve"]["redundancy"]
    assert checks["level"] == 2 and checks["checked"] >= 1
    assert set(checks["penalised"]) == {liar} and checks["mismatches"][liar] >= 1, checks
    assert checks["mismatches"].get(honest, 0) <= checks["mismatches"][liar]
    report = next(r for r in checks["reports"] if f"{liar[-8:]} disagrees with a third server too" in r)
    assert "greedy tokens differ" in report and "is penalised" in report
    # The penalty is the mesh's own (as for bad input on the wire): node 0's peer table shows it.
    peers = {p["peer_id"]: p for p in mesh.call(0, "peers")}
    assert peers[liar]["penalty"] > 0 and peers[honest]["penalty"] == 0, (peers[liar], peers[honest])
    # The honest servers, checked against each other, were never reported.
    assert honest not in checks["penalised"] and ids[0] not in checks["penalised"]
