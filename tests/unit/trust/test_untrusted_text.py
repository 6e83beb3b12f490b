"""Peer text in the CLI, the node's log and plot labels is inert: control characters are shown
escaped, lengths are bounded, and a peer's string where a number belongs does not break output."""

from __future__ import annotations

import logging
from pathlib import Path

from gpuflex.cli.common import hardware_summary, number, text
from gpuflex.cli.job_cmd import format_rows, format_spec, format_status
from gpuflex.logs import TextFormatter
from gpuflex.plot import plot_label, plot_metrics
from gpuflex.safetext import MAX_CHARS, printable

EVIL = "[/evil]\x1b[2J\x1b]0;pwned\x07\rforged line\n\u202etxt.exe\x9b31m"


def test_printable_escapes_every_control_and_formatting_character() -> None:
    shown = printable(EVIL)
    assert shown == "[/evil]\\x1b[2J\\x1b]0;pwned\\x07\\rforged line\\n\\u202etxt.exe\\x9b31m"
    assert shown.isprintable()
    assert printable("a\nb", keep_newlines=True) == "a\nb" and printable("a\nb") == "a\\nb"
    assert len(printable("x" * 10_000)) == MAX_CHARS and printable("x" * 10_000, None) == "x" * 10_000
    assert printable("naïve 数据 ✓") == "naïve 数据 ✓"


def summary(**over: object) -> dict:
    js = {"job_id": "a1b2c3d4e5f6a7b8", "name": EVIL, "state": "running", "round": 2, "rounds": 5,
          "phase": "train", "coordinator": "12D3KooW\x1b[2J", "is_coordinator": False, "role": "member",
          "members": ["12D3KooWabc\rdef"], "error": f"plug-in {EVIL} failed", "waiting": EVIL, "stalled": "",
          "write_error": "", "epsilon": None,
          "metrics": [{"round": 1, "loss": "\x1b[2J", "accuracy": 0.5, "train_loss": None, "contributors": [1],
                       "duration_s": 1.5}]}
    js.update(over)
    return js


def test_job_status_and_list_print_hostile_text_as_text() -> None:
    out = format_status(summary()) + "\n" + "\n".join(format_rows([summary()]))
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out and "\u202e" not in out
    assert "[/evil]\\x1b[2J" in out and "forged line\\n" in out
    assert "1        -    0.5000           -      -" in out  # a string where the loss belongs prints as '-'
    assert number(True, ">6") == "     -" and number(3, ">6") == "     3"


def test_job_spec_prints_one_escaped_line_per_key() -> None:
    spec = {"name": EVIL, "model": "digits-cnn", "rule_params": {"f\x1b": 1}, "allowlist": ["12D3\rKooW"]}
    out = format_spec(summary(spec=spec, publisher="12D3KooW\x1b[2Jabcdefgh"))
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert out.splitlines()[0].startswith("spec ") and len(out.splitlines()) == 1 + len(spec)
    assert 'model                = "digits-cnn"' in out and "[/evil]" in out
    assert format_spec(summary()) == "spec         (this node does not report it)"


def test_peer_hardware_from_node_info_is_escaped() -> None:
    info = {"accelerators": [{"name": EVIL, "memory_bytes": "lots"}], "cpu_count": "\x1b[2J", "ram_bytes": -1}
    line = hardware_summary(info)
    assert "\x1b" not in line and "\\x1b[2J cpu" in line and "[/evil]" in line
    assert text(None) == "-"


def test_log_lines_stay_one_inert_line() -> None:
    record = logging.LogRecord("gpuflex.jobs", logging.INFO, __file__, 1, "job x (%s) refused", (EVIL,), None)
    line = TextFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line and "(\\u202e" not in line[:8]
    assert "[/evil]\\x1b[2J" in line


def test_plot_labels_are_text(tmp_path: Path) -> None:
    assert plot_label("job $\\x$ \x1b[2J") == "job $\\x$ \\x1b[2J"
    rows = [{"round": 1, "loss": 1.0, "train_loss": 1.2, "accuracy": 0.5}]
    out = plot_metrics(rows, tmp_path / "m.png", title=f"job {EVIL} $\\frac{{1}}{{0}}$")
    assert out is not None and out.read_bytes()[:4] == b"\x89PNG"
