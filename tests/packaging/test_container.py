"""The container image and the compose mesh.

The structure tests always run: compose.yaml parses, starts three nodes and the portal, publishes
nothing beyond loopback, and the Dockerfile pins the torch that ``just setup`` pins. The image
test builds and runs the image where a container engine can: it needs a running daemon and the
base image already present, because this machine reaches no container registry.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "python:3.11-slim"
NODES = ("node1", "node2", "node3")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))


def test_compose_starts_three_nodes_and_the_portal(compose: dict) -> None:
    services = compose["services"]
    assert set(services) == {*NODES, "portal"}
    seeds = [n for n in NODES if services[n]["environment"].get("GPUFLEX_SEED") == "1"]
    assert seeds == ["node1"]
    for name in NODES:
        node = services[name]
        assert node["entrypoint"] == ["gpuflex-node"] and node["image"] == "gpuflex:local"
        address = node["networks"]["mesh"]["ipv4_address"]
        assert node["environment"]["GPUFLEX_IP"] == address
        assert f"{name}:/var/lib/gpuflex" in node["volumes"] and "seed:/run/gpuflex-seed" in node["volumes"]
    assert len({services[n]["networks"]["mesh"]["ipv4_address"] for n in NODES}) == 3
    portal = services["portal"]
    assert portal["entrypoint"] == ["gpuflex"] and portal["command"][0] == "web"
    # The portal reads node1's control API, which listens on loopback: same network, same home.
    assert portal["network_mode"] == "service:node1" and "node1:/var/lib/gpuflex" in portal["volumes"]
    assert "--listen" in portal["command"]  # beyond loopback, so the portal asks for its token


def test_compose_publishes_only_on_loopback(compose: dict) -> None:
    published = [(name, p) for name, s in compose["services"].items() for p in s.get("ports", [])]
    assert published == [("node1", "127.0.0.1:8470:8470")]
    assert all(str(p).startswith("127.0.0.1:") for _, p in published)


def test_dockerfile_pins_the_setup_torch_and_takes_an_index() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    justfile = (ROOT / "Justfile").read_text(encoding="utf-8")
    pinned = re.search(r'GPUFLEX_TORCH", "([^"]+)"', justfile)
    assert pinned and f"ARG TORCH_SPEC={pinned.group(1)}" in dockerfile
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in dockerfile
    assert '--index-url "${TORCH_INDEX}" "${TORCH_SPEC}"' in dockerfile
    assert "-c /tmp/torch-constraint.txt" in dockerfile  # no extra may replace that torch
    # Installed from a wheel kept in the image, which the portal's Join page then offers.
    assert "pip wheel --no-deps --wheel-dir /opt/gpuflex/dist /src" in dockerfile
    assert '"$(ls /opt/gpuflex/dist/gpuflex-*.whl)[${EXTRAS}]"' in dockerfile
    assert "USER gpuflex" in dockerfile and 'ENTRYPOINT ["gpuflex"]' in dockerfile
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert {".git", ".venv", "dist"} <= set(ignored)


def test_the_node_script_is_valid_shell_and_bounded() -> None:
    script = ROOT / "docker" / "node.sh"
    assert script.stat().st_mode & 0o111
    subprocess.run(["sh", "-n", str(script)], check=True, timeout=30)
    text = script.read_text(encoding="utf-8")
    assert '-gt 120' in text and "exit 1" in text  # the wait for the seed's address ends


def _compose_tool() -> list[str] | str:
    """A compose implementation (``docker compose``, ``docker-compose``, ``podman-compose``),
    installing Debian's docker-compose when the test runs as root; else why not."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=60).returncode == 0:
        return [docker, "compose"]
    for tool in ("docker-compose", "podman-compose"):
        if shutil.which(tool):
            return [tool]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "no compose tool is installed, and installing Debian's docker-compose needs root and apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "-o", "DPkg::Lock::Timeout=300", "update", "-q"],
                ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", "--no-install-recommends",
                 "docker-compose"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {(proc.stderr or proc.stdout).strip()[-200:]}"
    return ["docker-compose"] if shutil.which("docker-compose") else "apt-get installed no docker-compose"


@pytest.mark.timeout(1200)
def test_a_compose_tool_accepts_the_file() -> None:
    tool = _compose_tool()
    if isinstance(tool, str):
        pytest.skip(tool)
    # `config` validates the file against the compose schema and needs no daemon.
    proc = subprocess.run([*tool, "-f", str(ROOT / "compose.yaml"), "config", "-q"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]


def _engine() -> tuple[str, str]:
    """A container engine that can build here, or the reason it cannot."""
    for tool in ("docker", "podman"):
        path = shutil.which(tool)
        if path is None:
            continue
        info = subprocess.run([path, "info"], capture_output=True, text=True, timeout=60)
        if info.returncode != 0:
            why = (info.stderr.strip().splitlines() or ["no output"])[-1]
            return "", f"{tool} is installed but cannot reach its daemon ({why[:200]})"
        image = subprocess.run([path, "image", "inspect", BASE_IMAGE], capture_output=True, timeout=60)
        if image.returncode != 0:
            return "", (f"{tool} runs, but the base image {BASE_IMAGE} is not present and this machine "
                        "reaches no container registry to pull it")
        return path, ""
    return "", "no container engine (docker or podman) is installed"


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_image_builds_and_runs_the_cli(tmp_path: Path) -> None:
    engine, why = _engine()
    if not engine:
        pytest.skip(f"cannot build the image here: {why}")
    tag = "gpuflex:test"
    build = subprocess.run([engine, "build", "-t", tag, str(ROOT)], capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([engine, "run", "--rm", tag, "--version"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("gpuflex "), run.stderr[-2000:]
