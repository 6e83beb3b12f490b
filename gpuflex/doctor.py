"""``gpuflex doctor``: can this machine join a mesh, and how should torch be installed?

The classic failure this exists for is silent: a Pascal card (GTX 1080, sm_61) on a current
CUDA build of torch. ``torch.cuda.is_available()`` says yes, and the first real kernel dies
with "no kernel image is available for execution on the device". A table of which wheel
ships which architecture goes stale with every torch release, so the doctor launches a tiny
kernel on every GPU and believes only that.

Every finding is OK, WARN or FAIL with the fix spelled out; the command exits non-zero when
anything FAILs, so it also works as a pre-flight check in scripts.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, WARN, FAIL = "OK", "WARN", "FAIL"

# The install paths the README documents; the doctor quotes them verbatim.
INSTALL_PATHS: dict[str, dict[str, str]] = {
    "CPU": {"torch": "torch==2.13.0", "index": ""},
    "NEW": {"torch": "torch==2.13.0", "index": "https://download.pytorch.org/whl/cu128"},
    "LEGACY": {"torch": "torch==2.7.1", "index": "https://download.pytorch.org/whl/cu118"},
}
LEGACY_BELOW = (7, 0)
MIN_PYTHON = (3, 10)
DISK_WARN_BYTES = 5 << 30
DISK_FAIL_BYTES = 1 << 30
# Signed messages older or newer than this are rejected as stale (mesh.codec.ReplayGuard).
REPLAY_WINDOW_S = 300.0
SKEW_WARN_S = 30.0
DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/4001"


@dataclass
class Finding:
    """One line of the report: what was checked, the verdict, and what to do about it."""

    check: str
    status: str
    message: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def install_command(path: str) -> str:
    """The README's ``just setup`` line for an install path."""
    p = INSTALL_PATHS[path]
    if not p["index"]:
        return "just setup"
    return f'GPUFLEX_TORCH="{p["torch"]}" GPUFLEX_TORCH_INDEX={p["index"]} just setup'


def pip_command(path: str) -> str:
    """The same install as a plain pip command, for people who do not use ``just``."""
    p = INSTALL_PATHS[path]
    index = f" --index-url {p['index']}" if p["index"] else ""
    return f'pip install "{p["torch"]}"{index}'


def _fix_for(path: str) -> str:
    return f"{install_command(path)}   (or: {pip_command(path)})"


def _capability(text: str | None) -> tuple[int, int] | None:
    try:
        major, _, minor = str(text).partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return None


def path_for_capability(capability: str | None) -> str:
    """NEW for compute capability 7.0 and up, LEGACY below (Pascal and older)."""
    cc = _capability(capability)
    return "LEGACY" if cc is not None and cc < LEGACY_BELOW else "NEW"


# --- Python and torch ------------------------------------------------------------------------


def check_python() -> Finding:
    version = platform.python_version()
    if sys.version_info[:2] < MIN_PYTHON:
        return Finding("python", FAIL, f"Python {version} is too old", "install Python 3.10 or newer",
                       {"version": version})
    return Finding("python", OK, f"Python {version} ({sys.executable})", data={"version": version})


def import_torch() -> tuple[Any, Finding]:
    try:
        import torch
    except Exception as exc:  # a broken install can raise more than ImportError
        return None, Finding("torch", FAIL, f"torch does not import: {exc}", _fix_for("CPU"))
    flavour = (f"CUDA {torch.version.cuda}" if getattr(torch.version, "cuda", None)
               else f"ROCm {torch.version.hip}" if getattr(torch.version, "hip", None) else "CPU-only build")
    data = {"version": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
            "hip": getattr(torch.version, "hip", None)}
    mps = getattr(torch.backends, "mps", None)
    data["mps"] = bool(mps is not None and mps.is_built())
    return torch, Finding("torch", OK, f"torch {torch.__version__}, {flavour}", data=data)


def probe_kernel(torch: Any, device: str) -> str | None:
    """Run one tiny kernel on ``device``; None when it worked, else the error text."""
    try:
        value = (torch.ones(8, device=device) * 2).sum().item()
        if value != 16:
            return f"the kernel returned {value}, expected 16"
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"


def _nvidia_smi() -> list[dict[str, str]]:
    """GPUs the driver sees, for when torch itself cannot see them (a CPU build of torch)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            rows.append({"name": parts[0], "capability": parts[1], "memory": parts[2]})
    return rows


def check_gpus(torch: Any) -> list[Finding]:
    """One finding per GPU (kernel launch included), or a WARN when there is none."""
    if torch is None:
        return []
    findings: list[Finding] = []
    rocm = bool(getattr(torch.version, "hip", None))
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:
        findings.append(Finding("gpu", FAIL, f"the GPU driver failed: {exc}",
                                "check the driver with nvidia-smi (or rocm-smi), then rerun the doctor"))
        count = 0
    for i in range(count):
        findings.append(_check_cuda_device(torch, i, rocm))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        error = probe_kernel(torch, "mps")
        findings.append(Finding("gpu:mps", FAIL if error else OK,
                                f"Apple GPU (MPS): {'kernel failed: ' + error if error else 'kernels run'}",
                                "update macOS and torch" if error else "", {"kind": "mps"}))
    if not findings:
        smi = _nvidia_smi()
        if smi and not getattr(torch.version, "cuda", None):
            path = path_for_capability(smi[0]["capability"])
            names = ", ".join(f"{g['name']} (compute capability {g['capability']})" for g in smi)
            findings.append(Finding("gpu", FAIL, f"the driver sees {names}, but this torch is a CPU-only build",
                                    f"install the {path} path: {_fix_for(path)}", {"nvidia_smi": smi}))
        else:
            findings.append(Finding("gpu", WARN, "no GPU found: this node trains on the CPU",
                                    "nothing to do for a CPU node; with a GPU, install its driver and "
                                    "rerun the doctor for the right torch", {"devices": []}))
    return findings


def _check_cuda_device(torch: Any, i: int, rocm: bool) -> Finding:
    props = torch.cuda.get_device_properties(i)
    capability = f"{props.major}.{props.minor}"
    arch = getattr(props, "gcnArchName", "") if rocm else f"sm_{props.major}{props.minor}"
    memory = int(props.total_memory)
    data = {"index": i, "kind": "rocm" if rocm else "cuda", "name": props.name, "capability": capability,
            "arch": arch, "memory_bytes": memory}
    try:
        data["torch_arch_list"] = list(torch.cuda.get_arch_list())
    except Exception:
        data["torch_arch_list"] = []
    what = f"cuda:{i} {props.name}, {'arch ' + arch if rocm else 'compute capability ' + capability}, " \
           f"{memory / (1 << 30):.1f} GiB"
    error = probe_kernel(torch, f"cuda:{i}")
    data["kernel_ok"] = error is None
    if error is None:
        return Finding(f"gpu:{i}", OK, f"{what}: kernels run", data=data)
    if rocm:
        return Finding(f"gpu:{i}", FAIL, f"{what}: a kernel failed ({error})",
                       "install the ROCm build of torch matching your ROCm version "
                       "(GPUFLEX_TORCH_INDEX=https://download.pytorch.org/whl/rocm<version> just setup)", data)
    path = path_for_capability(capability)
    if "no kernel image" in error:
        why = (f"this torch build ships no {arch} kernels ({', '.join(data['torch_arch_list']) or 'none listed'})")
        return Finding(f"gpu:{i}", FAIL, f"{what}: {why}", f"install the {path} path: {_fix_for(path)}", data)
    return Finding(f"gpu:{i}", FAIL, f"{what}: a kernel failed ({error})",
                   f"check the driver (nvidia-smi); if it is fine, reinstall with the {path} path: {_fix_for(path)}",
                   data)


def check_install_path(gpus: list[Finding]) -> Finding:
    """Which documented install path fits this machine; FAIL when the current torch does not."""
    cuda = [g for g in gpus if g.data.get("kind") == "cuda"]
    if not cuda:
        smi = next((g.data["nvidia_smi"] for g in gpus if "nvidia_smi" in g.data), None)
        if smi:
            path = path_for_capability(smi[0]["capability"])
            return Finding("install-path", FAIL, f"{path} fits this machine", _fix_for(path), {"path": path})
        return Finding("install-path", OK, "CPU fits this machine (no NVIDIA GPU)", "",
                       {"path": "CPU", "command": install_command("CPU"), "pip": pip_command("CPU")})
    paths = {path_for_capability(g.data["capability"]) for g in cuda}
    path = "LEGACY" if "LEGACY" in paths else "NEW"
    data = {"path": path, "command": install_command(path), "pip": pip_command(path)}
    why = ("a GPU is below compute capability 7.0 (sm_61 and older need torch built with CUDA 11.8)"
           if path == "LEGACY" else "every GPU has compute capability 7.0 or newer")
    if all(g.data.get("kernel_ok") for g in cuda):
        return Finding("install-path", OK, f"{path} fits: {why}; the installed torch runs on every GPU",
                       "", data)
    return Finding("install-path", FAIL, f"{path} fits: {why}", _fix_for(path), data)


# --- the home, the port, the clock -----------------------------------------------------------


def check_disk(home: Path) -> Finding:
    probe = home
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    data = {"path": str(home), "free_bytes": free}
    text = f"{free / (1 << 30):.1f} GiB free for {home}"
    fix = "free some space, or point --home (GPUFLEX_HOME) at a larger disk"
    if free < DISK_FAIL_BYTES:
        return Finding("disk", FAIL, text + " (models and blobs need at least 1 GiB)", fix, data)
    if free < DISK_WARN_BYTES:
        return Finding("disk", WARN, text + " (less than 5 GiB: large models may not fit)", fix, data)
    return Finding("disk", OK, text, data=data)


def listen_multiaddr(listen: str) -> str:
    """Accept a multiaddr, ``HOST:PORT`` or a bare port."""
    if listen.startswith("/"):
        return listen
    host, sep, port = listen.rpartition(":")
    return f"/ip4/{host if sep and host else '0.0.0.0'}/tcp/{port if sep else listen}"


def node_listen_addrs(node: dict[str, Any] | None) -> list[str]:
    """The running node's own TCP listen addresses (relayed ones left out), without /p2p/."""
    addrs = []
    for text in (node or {}).get("addrs", []):
        if isinstance(text, str) and "/tcp/" in text and "p2p-circuit" not in text:
            addrs.append(text.split("/p2p/")[0])
    return addrs


def check_port(listen: str | None, node: dict[str, Any] | None) -> Finding:
    """With ``listen`` None: the running node's own address, else the default one."""
    from mesh.host import HostError, check_tcp_port_free

    own = node_listen_addrs(node)
    if listen is None and own:
        return Finding("port", OK, f"this home's node listens on {', '.join(own)}", data={"listen": own[0]})
    addr = listen_multiaddr(listen or DEFAULT_LISTEN)
    port = addr.rstrip("/").rsplit("/", 1)[-1]
    if any(a.endswith(f"/tcp/{port}") for a in own):
        return Finding("port", OK, f"port {port} is served by this home's own node", data={"listen": addr})
    try:
        check_tcp_port_free(addr)
    except HostError as exc:
        return Finding("port", FAIL, str(exc), "stop whatever holds the port (ss -ltnp), or choose another "
                       "with gpuflex node start --listen /ip4/0.0.0.0/tcp/<port>", {"listen": addr})
    return Finding("port", OK, f"{addr} is free", data={"listen": addr})


def query_node(home: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any] | None]:
    """(status, peers, clock sample) of the node serving ``home``, or Nones when none answers."""
    from gpuflex.client import ControlClient, ControlError

    try:
        with ControlClient.for_home(home, timeout=3) as client:
            status, peers = client.status(), client.peers()
            try:
                t0 = time.time()
                remote = float(client.call("clock")["now"])
                t1 = time.time()
                clock = {"offset_s": remote - (t0 + t1) / 2, "precision_s": (t1 - t0) / 2}
            except ControlError:  # a node from before the clock method
                clock = None
    except (ControlError, OSError, ValueError, KeyError, TypeError):
        return None, [], None
    return status, peers, clock


def check_clock(node: dict[str, Any] | None, peers: list[dict[str, Any]], clock: dict[str, Any] | None) -> Finding:
    """A coarse, honest skew estimate.

    The node's own clock is sampled NTP-style (precision ± half the round trip), which matters
    when the node runs on another machine behind an SSH tunnel. For peers only their signed
    NodeInfo timestamp is at hand; it is taken when the peer signs, before it travels, so it can
    prove that a peer runs *ahead* but never that one runs behind.
    """
    if node is None:
        return Finding("clock", WARN, "no node is running for this home, so no mesh to compare clocks with",
                       "start the node (gpuflex node start) and rerun the doctor; keep NTP on "
                       "(timedatectl set-ntp true)", {"reachable": False})
    now = time.time()
    ahead = {p["peer_id"]: float(p["info"]["ts"]) - now for p in peers
             if isinstance(p.get("info"), dict) and isinstance(p["info"].get("ts"), (int, float))}
    worst_peer, worst = max(ahead.items(), key=lambda kv: kv[1], default=(None, 0.0))
    own = abs(clock["offset_s"]) if clock else 0.0
    data = {"reachable": True, "node_offset_s": clock and round(clock["offset_s"], 4),
            "node_precision_s": clock and round(clock["precision_s"], 4), "peers_compared": len(ahead),
            "max_peer_ahead_s": round(max(worst, 0.0), 3), "method": "node: NTP-style sample; peers: "
            "NodeInfo timestamps, a one-sided bound (detects clocks ahead only)"}
    skew = max(own, worst)
    fix = (f"turn on NTP on every machine (timedatectl set-ntp true); signed messages more than "
           f"{REPLAY_WINDOW_S:.0f}s off are rejected as stale")
    who = f"peer …{str(worst_peer)[-8:]}" if worst >= own and worst_peer else "the node"
    if skew > REPLAY_WINDOW_S:
        return Finding("clock", FAIL, f"{who} is {skew:.0f}s off this machine's clock", fix, data)
    if skew > SKEW_WARN_S:
        return Finding("clock", WARN, f"{who} is {skew:.0f}s off this machine's clock", fix, data)
    precision = f" ± {clock['precision_s'] * 1000:.1f} ms" if clock else ""
    return Finding("clock", OK, f"node clock offset {own * 1000:.1f} ms{precision}; no peer of {len(ahead)} "
                   f"is detectably ahead (peers behind cannot be measured from NodeInfo)", data=data)


# --- the report -------------------------------------------------------------------------------


def check_machine() -> Finding:
    from gpuflex.hardware import ram_bytes

    ram = ram_bytes()
    text = f"{platform.system()} {platform.release()}, {os.cpu_count()} CPU cores"
    text += f", {ram / (1 << 30):.1f} GiB RAM" if ram else ""
    return Finding("machine", OK, text, data={"os": platform.platform(), "cpu_count": os.cpu_count(),
                                             "ram_bytes": ram})


def iter_checks(home: str | os.PathLike[str] | None = None, listen: str | None = None) -> Iterator[Finding]:
    """Findings in order, cheap ones first: importing torch takes seconds on a small machine,
    so the text report shows the machine, disk, port and clock before it pays for torch."""
    from gpuflex.home import resolve_home

    root = resolve_home(home)
    yield check_python()
    yield check_machine()
    yield check_disk(root)
    node, peers, clock = query_node(root)
    yield check_port(listen, node)
    yield check_clock(node, peers, clock)
    from gpuflex.doctor_reach import check_reachability

    yield check_reachability(node)
    torch, torch_finding = import_torch()
    yield torch_finding
    gpus = check_gpus(torch)
    yield from gpus
    if torch is not None:
        yield check_install_path(gpus)


def run_checks(home: str | os.PathLike[str] | None = None, listen: str | None = None) -> list[Finding]:
    return list(iter_checks(home, listen))


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.status == FAIL for f in findings) else 0


def to_json(findings: list[Finding]) -> str:
    counts = {s: sum(f.status == s for f in findings) for s in (OK, WARN, FAIL)}
    return json.dumps({"ok": counts[FAIL] == 0, "counts": counts, "findings": [asdict(f) for f in findings]},
                      indent=2, default=str)


def format_finding(f: Finding) -> str:
    lines = [f"{f.status:<4}  {f.check:<13} {f.message}"]
    if f.fix and f.status != OK:
        lines.append(f"{'':19}fix: {f.fix}")
    elif f.check == "install-path" and f.data.get("command"):
        lines.append(f"{'':19}install: {f.data['command']}   (or: {f.data['pip']})")
    return "\n".join(lines)


def summary_line(findings: list[Finding]) -> str:
    fails = sum(f.status == FAIL for f in findings)
    warns = sum(f.status == WARN for f in findings)
    line = "ready to join a mesh" if not fails else f"{fails} problem(s) to fix before joining a mesh"
    return line + (f" ({warns} warning(s))" if warns else "")


def to_text(findings: list[Finding]) -> str:
    return "\n".join([*(format_finding(f) for f in findings), "", summary_line(findings)])
