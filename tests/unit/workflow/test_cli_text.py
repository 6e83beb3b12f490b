"""What the CLI prints for people: help that fits 80 columns without cutting an option's
name, counts with the right plural, one peer-id abbreviation shared with the portal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner

from gpuflex.cli.common import short
from gpuflex.cli.job_cmd import Snapshots, format_rows
from gpuflex.cli.main import app
from gpuflex.safetext import plural


def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, group
    if hasattr(group, "commands"):  # a group (typer ships its own click)
        for name, sub in group.commands.items():
            if not sub.hidden:
                yield from commands(sub, (*path, name))


def test_help_at_80_columns_shows_every_option_name_whole() -> None:
    runner = CliRunner()
    checked = 0
    for path, command in commands(typer.main.get_command(app)):
        out = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert out.exit_code == 0, (path, out.output)
        assert max(len(line) for line in out.output.splitlines()) <= 80, (path, out.output)
        for param in command.params:
            if getattr(param, "param_type_name", "") == "option" and not getattr(param, "hidden", False):
                for name in (*param.opts, *param.secondary_opts):
                    assert name in out.output, (path, name, out.output)
                    checked += 1
    assert checked > 60  # every command's options, node start's thirty-odd included


def test_counts_read_in_the_singular_and_the_plural() -> None:
    assert plural(1, "peer") == "1 peer" and plural(2, "peer") == "2 peers" and plural(0, "node") == "0 nodes"
    assert plural(True, "peer") == "True peers"  # not a count: no singular


def test_cli_and_portal_abbreviate_a_peer_id_alike() -> None:
    from gpuflex_web.model import short as portal_short

    peer = "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBmyqWUZy4uYmyb"
    assert short(peer) == portal_short(peer) == "…" + peer[-10:]


def test_job_list_columns_line_up_whatever_the_cell_widths() -> None:
    jobs = [{"job_id": "a" * 16, "state": "running", "round": 7, "rounds": 400, "phase": "reduce", "name": "x"},
            {"job_id": "b" * 16, "state": "done", "round": 15, "rounds": 15, "phase": "done", "name": "longer"}]
    header, *rows = format_rows(jobs)
    for word in ("STATE", "PHASE", "NAME"):
        col = header.index(word)
        assert all(row[col - 2:col] == "  " and row[col] != " " for row in rows), (header, rows)
    assert all(row.index("/") < header.index("PHASE") for row in rows)


def test_watch_into_a_pipe_prints_only_changed_lines() -> None:
    show = Snapshots(tty=False)
    first = show.next("job x\nround 1/3\n  1  0.5")
    assert first == "job x\nround 1/3\n  1  0.5\n"
    assert show.next("job x\nround 2/3\n  1  0.5\n  2  0.4") == "round 2/3\n  2  0.4\n"
    assert show.next("job x\nround 2/3\n  1  0.5\n  2  0.4") == ""
    tty = Snapshots(tty=True)
    assert tty.next("a\nb") == Snapshots.CLEAR + "a\nb\n"
