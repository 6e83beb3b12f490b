"""The hardware report is plain JSON and sane on any machine."""

from __future__ import annotations

import json

from gpuflex.hardware import _is_legacy, collect_hardware


def test_report_is_json_and_complete():
    report = collect_hardware()
    json.dumps(report)
    assert report["cpu_count"] >= 1 and report["ram_bytes"] > 0
    assert isinstance(report["accelerators"], list)
    assert report["legacy"] == any(_is_legacy(a["capability"]) for a in report["accelerators"])


def test_legacy_threshold():
    assert _is_legacy("6.1") and not _is_legacy("7.0") and not _is_legacy("8.6")
    assert not _is_legacy(None)
