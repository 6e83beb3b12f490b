"""Peer-supplied text (job names, NodeInfo fields, event messages) is drawn as text: Rich
markup in it is neither applied nor a crash, and terminal control characters are shown
escaped instead of reaching the terminal."""

from __future__ import annotations

from rich.text import Text
from textual.pilot import Pilot

from tests.tui.capture import screen_text
from tests.tui.conftest import drive, loaded, make_app, until
from tests.tui.fake_source import FakeSource
from tui import format as fmt
from tui.app import DashboardApp

EVIL = "[/evil][bold red]x\x1b[2J\r\x07y"
SHOWN = "[/evil][bold red]x\\x1b[2J\\r\\x07y"  # what a person sees: every character, escaped


def test_literal_keeps_markup_and_escapes_control_characters() -> None:
    text = fmt.literal(EVIL, style="bold")
    assert isinstance(text, Text) and text.plain == SHOWN and not text.spans
    assert fmt.literal("\u202eevil\u200b").plain == "\\u202eevil\\u200b"  # bidi override, zero width
    assert fmt.literal("plain name").plain == "plain name"
    assert len(fmt.literal("x" * 1000).plain) <= fmt.MAX_TEXT


def hostile_source() -> FakeSource:
    source = FakeSource()
    source.job_list[0]["name"] = EVIL
    source.job_list[0]["waiting"] = f"waiting for {EVIL}"
    source.job_list[0]["gone"] = [{"peer": f"12D3KooW{EVIL}", "reason": f"gone for {EVIL}"}]
    info = source.peer_list[0]["info"]
    info["os"] = EVIL
    info["torch"] = "[link=file:///etc/passwd]t[/link]"
    info["accelerators"][0]["name"] = EVIL
    info["addrs"] = [EVIL]
    source.emit("job_received", f"job a1b2 ({EVIL}): 3 rounds")
    return source


def test_hostile_names_are_drawn_as_text_on_every_screen() -> None:
    source = hostile_source()

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: loaded(app))
        overview = screen_text(app)
        assert "[/evil][bold red]x\\x1b" in overview  # the job panel and the event log
        await pilot.press("2")
        await until(pilot, lambda: "\\x1b[2J" in screen_text(app), what="the peer's NodeInfo")
        peers = screen_text(app)
        assert "[/evil]" in peers and "[link=file:///etc/passwd]" in peers
        await pilot.press("3")
        await until(pilot, lambda: "ledger of" in screen_text(app), what="the jobs screen")
        jobs = screen_text(app)
        assert "[/evil][bold red]" in jobs and "waiting for [/evil]" in jobs
        assert f"the job failed there (gone for {SHOWN})" in jobs
        for shown in (overview, peers, jobs):
            assert "\x1b" not in shown and "\r" not in shown and "\x07" not in shown

    drive(make_app(source), scenario, size=(160, 48))
