"""The doctor's findings vocabulary: one ``Finding`` per check, its ``Status``, and the report
a list of them makes (text, JSON, exit code). Every check module speaks it; it imports none of
them, so the doctor has no import circle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from mesh.compat import StrEnum


class Status(StrEnum):
    """A finding's verdict: FAIL makes ``gpuflex doctor`` exit non-zero."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


OK, WARN, FAIL = Status.OK, Status.WARN, Status.FAIL


@dataclass
class Finding:
    """One line of the report: what was checked, the verdict, and what to do about it."""

    check: str
    status: Status
    message: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)


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
