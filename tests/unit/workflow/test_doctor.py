"""``gpuflex doctor``: valid JSON on this machine, and the verdicts for GPUs it does not have."""

from __future__ import annotations

import json
import socket
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from gpuflex import doctor
from gpuflex.cli.main import app


def test_doctor_json_on_this_machine(tmp_path) -> None:
    import torch

    result = CliRunner().invoke(app, ["doctor", "--json", "--home", str(tmp_path / "home"),
                                      "--listen", "/ip4/127.0.0.1/tcp/0"])
    report = json.loads(result.stdout)
    checks = {f["check"]: f for f in report["findings"]}
    assert {"python", "machine", "torch", "install-path", "disk", "port", "clock"} <= set(checks)
    assert all(f["status"] in ("OK", "WARN", "FAIL") for f in report["findings"])
    assert result.exit_code == (0 if report["ok"] else 1)
    assert checks["torch"]["data"]["version"] == torch.__version__
    if not torch.cuda.is_available():
        assert checks["gpu"]["status"] == "WARN" and "no GPU" in checks["gpu"]["message"]
        assert checks["install-path"]["data"]["path"] == "CPU"
    assert checks["clock"]["status"] == "WARN" and not checks["clock"]["data"]["reachable"]


def test_taken_port_is_a_failure_with_a_fix() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        finding = doctor.check_port(f"127.0.0.1:{port}", None)
    assert finding.status == "FAIL" and "already in use" in finding.message and "--listen" in finding.fix
    assert doctor.check_port("/ip4/127.0.0.1/tcp/0", None).status == "OK"


def fake_torch(major: int, minor: int, kernel_error: str | None) -> Any:
    """Just enough of torch for the GPU checks: one CUDA device of the given capability."""

    def ones(n: int, device: str) -> np.ndarray:
        if kernel_error:
            raise RuntimeError(kernel_error)
        return np.ones(n)

    props = SimpleNamespace(name="NVIDIA GeForce GTX 1080" if major < 7 else "NVIDIA A100", major=major,
                            minor=minor, total_memory=8 << 30)
    cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                           get_device_properties=lambda i: props, get_arch_list=lambda: ["sm_75", "sm_80", "sm_90"])
    return SimpleNamespace(version=SimpleNamespace(cuda="12.8", hip=None), cuda=cuda, ones=ones,
                           backends=SimpleNamespace(mps=None))


def test_pascal_without_kernels_fails_and_names_the_legacy_path() -> None:
    torch = fake_torch(6, 1, "CUDA error: no kernel image is available for execution on the device")
    gpus = doctor.check_gpus(torch)
    assert [g.status for g in gpus] == ["FAIL"]
    assert "sm_61" in gpus[0].message and 'GPUFLEX_TORCH="torch==2.7.1"' in gpus[0].fix
    assert "whl/cu118" in gpus[0].fix and "pip install" in gpus[0].fix
    path = doctor.check_install_path(gpus)
    assert path.status == "FAIL" and path.data["path"] == "LEGACY"
    assert doctor.exit_code([*gpus, path]) == 1


def test_pascal_with_working_kernels_is_fine_on_the_legacy_path() -> None:
    gpus = doctor.check_gpus(fake_torch(6, 1, None))
    path = doctor.check_install_path(gpus)
    assert gpus[0].status == "OK" and path.status == "OK" and path.data["path"] == "LEGACY"


def test_new_gpu_uses_the_new_path() -> None:
    gpus = doctor.check_gpus(fake_torch(8, 0, None))
    path = doctor.check_install_path(gpus)
    assert gpus[0].status == "OK" and gpus[0].data["capability"] == "8.0"
    assert path.data["path"] == "NEW" and "whl/cu128" in path.data["command"]


@pytest.mark.parametrize(("ahead_s", "status"), [(0.0, "OK"), (60.0, "WARN"), (400.0, "FAIL")])
def test_clock_skew_thresholds(ahead_s: float, status: str) -> None:
    peers = [{"peer_id": "12D3KooWpeer", "info": {"ts": time.time() + ahead_s}}]
    clock = {"offset_s": 0.001, "precision_s": 0.0005}
    finding = doctor.check_clock({"addrs": []}, peers, clock)
    assert finding.status == status
    assert finding.data["peers_compared"] == 1


def test_listen_forms() -> None:
    assert doctor.listen_multiaddr("4001") == "/ip4/0.0.0.0/tcp/4001"
    assert doctor.listen_multiaddr("127.0.0.1:4002") == "/ip4/127.0.0.1/tcp/4002"
    assert doctor.listen_multiaddr("/ip4/10.0.0.1/tcp/9") == "/ip4/10.0.0.1/tcp/9"


@pytest.mark.parametrize(("nat", "status", "words"), [
    (None, "WARN", "no node is running"),
    ({"reachability": "public", "reached_at": ["/ip4/203.0.113.5/tcp/4001"]}, "OK", "dialled this node back"),
    ({"reachability": "relayed", "reservations": ["12D3KooWrelayrelay"]}, "OK", "nothing to do"),
    ({"reachability": "private", "refused": {"12D3KooWrelayrelay": "full"}}, "FAIL", "no relay reservation"),
    ({"reachability": "unknown"}, "WARN", "not known yet"),
])
def test_reachability_finding_says_what_to_do(nat: dict | None, status: str, words: str) -> None:
    from gpuflex.doctor.reach import check_reachability

    node = None if nat is None else {"addrs": ["/ip4/192.168.1.2/tcp/4001/p2p/x"], "nat": nat}
    finding = check_reachability(node)
    assert finding.status == status and words in finding.message
    if status == "FAIL":
        assert "forward TCP port 4001" in finding.fix and "…layrelay full" in finding.message


def test_doctor_fits_a_job_to_each_device(tmp_path) -> None:
    import torch

    from gpuflex.doctor.fit import check_job_fit
    from gpuflex.jobspec import example_job_toml

    job = tmp_path / "job.toml"
    job.write_text(example_job_toml().replace("compute_budget_s = 0.0", "compute_budget_s = 4.0"))
    findings = list(check_job_fit(job, tmp_path / "home"))
    cpu = next(f for f in findings if f.check == "fit cpu")
    assert cpu.status == doctor.OK, cpu.message
    assert cpu.data["precision"] == "fp32" and cpu.data["micro_batch"] == cpu.data["batch_size"] == 32
    assert cpu.data["samples_per_s"] > 0 and cpu.data["threads"] >= 1
    assert "local steps in the job's 4 s budget" in cpu.message
    assert len(findings) == 1 + torch.cuda.device_count() * torch.cuda.is_available()

    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = 'many'\n")
    head, *fields = check_job_fit(bad, tmp_path / "home")
    assert head.status == doctor.FAIL and "bad.toml" in head.message
    # every error, as ``job submit`` lists them: both required fields and the bad one
    assert {f.message.split(":")[0].strip() for f in fields} == {"model", "data", "rounds"}
    assert head.data["errors"] == [f.message.strip() for f in fields]


def test_a_loopback_node_is_not_called_reachable_whatever_its_peers_said() -> None:
    from gpuflex.doctor.reach import check_reachability

    nat = {"reachability": "public", "reached_at": ["/ip4/127.0.0.1/tcp/4100"], "relay_service": True}
    finding = check_reachability({"addrs": ["/ip4/127.0.0.1/tcp/4100/p2p/x"], "nat": nat})
    assert finding.status == "WARN" and "loopback only" in finding.message and "relays" not in finding.message
    both = check_reachability({"addrs": ["/ip4/127.0.0.1/tcp/4100/p2p/x", "/ip4/192.168.1.2/tcp/4100/p2p/x"],
                               "nat": nat})
    assert both.status == "OK"


def test_port_check_follows_the_running_nodes_own_address() -> None:
    node = {"addrs": ["/ip4/127.0.0.1/tcp/4100/p2p/x", "/ip4/1.2.3.4/tcp/4002/p2p/r/p2p-circuit/p2p/x"]}
    finding = doctor.check_port(None, node)
    assert finding.status == "OK" and "/ip4/127.0.0.1/tcp/4100" in finding.message and "4002" not in finding.message
    assert doctor.check_port("127.0.0.1:4100", node).status == "OK"
