"""``gpuflex doctor``: can this machine join a mesh, and how should torch be installed?

Every finding is OK, WARN or FAIL with the fix spelled out (``findings``); the command exits
non-zero when anything FAILs, so it also works as a pre-flight check in scripts. One module
per concern: ``machine`` (Python, torch, GPUs, disk), ``network`` (the port, the clocks),
``reach`` (can others reach this node), ``fit`` (how a job would run here, ``--job``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from gpuflex.doctor.findings import (
    FAIL,
    OK,
    WARN,
    Finding,
    Status,
    exit_code,
    format_finding,
    summary_line,
    to_json,
    to_text,
)
from gpuflex.doctor.machine import (
    INSTALL_PATHS,
    check_disk,
    check_gpus,
    check_install_path,
    check_machine,
    check_python,
    import_torch,
    install_command,
    path_for_capability,
    pip_command,
    probe_kernel,
)
from gpuflex.doctor.network import (
    DEFAULT_LISTEN,
    check_clock,
    check_port,
    listen_multiaddr,
    query_node,
)
from gpuflex.doctor.reach import check_reachability

__all__ = [
    "DEFAULT_LISTEN", "FAIL", "INSTALL_PATHS", "OK", "WARN", "Finding", "Status", "check_clock", "check_disk",
    "check_gpus", "check_install_path", "check_machine", "check_port", "check_python", "check_reachability",
    "exit_code", "format_finding", "import_torch", "install_command", "iter_checks", "listen_multiaddr",
    "path_for_capability", "pip_command", "probe_kernel", "query_node", "run_checks", "summary_line", "to_json",
    "to_text",
]


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
    yield check_reachability(node)
    torch, torch_finding = import_torch()
    yield torch_finding
    gpus = check_gpus(torch)
    yield from gpus
    if torch is not None:
        yield check_install_path(gpus)


def run_checks(home: str | os.PathLike[str] | None = None, listen: str | None = None) -> list[Finding]:
    return list(iter_checks(home, listen))
