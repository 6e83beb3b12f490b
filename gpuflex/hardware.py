"""What this machine can offer a job: OS, CPUs, memory and accelerators.

Nodes advertise this in their Presence record and ``gpuflex doctor`` reports it. torch is
imported lazily, and its absence is an answer (``"torch": None``) rather than an error, so
the doctor can still explain how to install it.
"""

from __future__ import annotations

import os
import platform
from typing import Any

# Below compute capability 7.0 (Pascal, e.g. GTX 1080 at 6.1) current torch wheels may ship
# no kernels; such cards need the legacy install path.
LEGACY_CAPABILITY = (7, 0)


def ram_bytes() -> int | None:
    """Physical memory without psutil: sysconf where available, else /proc/meminfo."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _accelerators(torch: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    try:
        if torch.cuda.is_available():
            kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                found.append(
                    {
                        "kind": kind,
                        "name": props.name,
                        "memory_bytes": int(props.total_memory),
                        "capability": f"{props.major}.{props.minor}",
                    }
                )
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            found.append({"kind": "mps", "name": "Apple GPU", "memory_bytes": ram_bytes(), "capability": None})
    except Exception as exc:  # a broken driver must not take the report down with it
        found.append({"kind": "error", "name": f"{type(exc).__name__}: {exc}", "memory_bytes": None,
                      "capability": None})
    return found


def _is_legacy(capability: str | None) -> bool:
    if not capability:
        return False
    major, _, minor = capability.partition(".")
    try:
        return (int(major), int(minor or 0)) < LEGACY_CAPABILITY
    except ValueError:
        return False


def collect_hardware() -> dict[str, Any]:
    """A JSON-able snapshot; ``legacy`` is true when any GPU is below capability 7.0."""
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]  # no torch: the snapshot says so
    accelerators = _accelerators(torch) if torch is not None else []
    return {
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "ram_bytes": ram_bytes(),
        "torch": torch.__version__ if torch is not None else None,
        "cuda": getattr(torch.version, "cuda", None) if torch is not None else None,
        "hip": getattr(torch.version, "hip", None) if torch is not None else None,
        "accelerators": accelerators,
        "legacy": any(_is_legacy(a.get("capability")) for a in accelerators),
    }
