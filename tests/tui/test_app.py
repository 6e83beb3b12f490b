"""The dashboard driven through Textual's pilot against the in-memory fake node."""

from __future__ import annotations

import asyncio

from textual.pilot import Pilot

from tests.tui.capture import screen_text
from tests.tui.conftest import drive, loaded, make_app, until
from tests.tui.fake_source import JOB_ID, FakeSource, peer_id
from tui import format as fmt
from tui.app import DashboardApp
from tui.screens.help import HelpScreen
from tui.screens.jobs import JobsScreen
from tui.screens.peers import PeersScreen
from tui.widgets.banner import Banner
from tui.widgets.event_log import EventLog
from tui.widgets.keyed_table import KeyedTable
from tui.widgets.masthead import Masthead


def table_keys(app: DashboardApp, selector: str = "#peer-table") -> list[str]:
    table = app.screen.query_one(selector, KeyedTable)
    return [str(row.key.value) for row in table.ordered_rows]


def masthead_text(app: DashboardApp) -> str:
    return str(app.screen.query_one(Masthead).render())


def test_screens_switch_with_numbers_tab_and_help() -> None:
    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: loaded(app))
        assert app.current_mode == "overview"
        await pilot.press("2")
        assert app.current_mode == "peers" and isinstance(app.screen, PeersScreen)
        await pilot.press("3")
        assert app.current_mode == "jobs" and isinstance(app.screen, JobsScreen)
        await pilot.press("4")
        assert app.current_mode == "serving"
        await pilot.press("tab")
        assert app.current_mode == "overview"
        await pilot.press("shift+tab")
        assert app.current_mode == "serving"
        await pilot.press("shift+tab")
        assert app.current_mode == "jobs"
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, JobsScreen)
        await pilot.press("question_mark", "1")
        assert app.current_mode == "overview" and not isinstance(app.screen, HelpScreen)
        await pilot.press("q")
        assert app.return_code == 0 or not app.is_running

    drive(make_app(), scenario)


def test_peer_table_fills_sorts_filters_and_copies() -> None:
    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await until(pilot, lambda: len(table_keys(app)) == 5, what="peer rows")
        # Default order: by state (up before suspect), then id.
        assert table_keys(app)[-1] == peer_id(4)
        await pilot.press("l")  # by RTT, fastest first
        assert table_keys(app) == [peer_id(n) for n in (1, 2, 3, 5, 4)]
        await pilot.press("l")  # same key again: reversed
        assert table_keys(app) == [peer_id(n) for n in (4, 5, 3, 2, 1)]
        await pilot.press("c")  # rounds contributed, ascending; ties keep the RTT order
        assert table_keys(app)[0] == peer_id(4)
        header = app.screen.query_one(KeyedTable).columns
        assert any(str(c.label).startswith("rnds▲") for c in header.values())

        await pilot.press("slash", *"gtx")  # letters go to the box, not to the sort keys
        await until(pilot, lambda: table_keys(app) == [peer_id(1)], what="filtered rows")
        assert app.screen.sort_column == "rounds"
        await pilot.press(*["backspace"] * 3, *"k80")
        await until(pilot, lambda: table_keys(app) == [peer_id(5)], what="filtered rows")
        await pilot.press("enter")  # keep the filter, back to the table
        await pilot.press("enter")  # select the row: full id copied, NodeInfo shown
        assert app.clipboard == peer_id(5)
        shown = screen_text(app)
        assert peer_id(5) in shown and "NVIDIA Tesla K80" in shown
        await pilot.press("escape")
        await until(pilot, lambda: len(table_keys(app)) == 5, what="filter cleared")

    drive(make_app(), scenario)


def test_peer_table_shows_and_filters_reachability() -> None:
    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await until(pilot, lambda: len(table_keys(app)) == 5, what="peer rows")
        table = app.screen.query_one(KeyedTable)
        assert str(table.get_cell(peer_id(1), "reach")) == "relayed·r"
        assert str(table.get_cell(peer_id(3), "reach")) == "private"
        await pilot.press("h")  # by reachability: private, public, public, relayed, relayed
        assert table_keys(app)[0] == peer_id(3)
        await pilot.press("slash", *"private", "enter")
        await until(pilot, lambda: table_keys(app) == [peer_id(3)], what="filtered rows")

    drive(make_app(), scenario)


def test_node_going_down_changes_colour_and_counts() -> None:
    source = FakeSource()

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await until(pilot, lambda: loaded(app))
        assert "4 up" in masthead_text(app) and "0 down" in masthead_text(app)
        table = app.screen.query_one(KeyedTable)
        assert str(table.get_cell(peer_id(1), "state").style) == "green"

        source.set_state(1, "down")
        await until(pilot, lambda: "1 down" in masthead_text(app), what="down count")
        assert "3 up" in masthead_text(app)
        assert str(table.get_cell(peer_id(1), "state").style) == "red"
        await pilot.press("1")
        log = app.screen.query_one(EventLog)
        # The poll may see the change before the event stream delivers its event.
        await until(pilot, lambda: "peer_down" in str(log.render()), what="peer_down logged")

    drive(make_app(source), scenario)


def test_disconnect_banner_appears_and_clears() -> None:
    source = FakeSource()

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: loaded(app))
        banner = app.screen.query_one(Banner)
        assert not banner.display
        source.go_down()
        await until(pilot, lambda: banner.has_class("-disconnected"), what="banner")
        assert banner.display
        assert "disconnected — retrying" in str(banner.render())
        # The last known data stays on screen while retrying.
        assert "digits" in str(app.screen.query_one("#job-title").render())
        await until(pilot, lambda: app.snapshot.attempts >= 3, what="retries")
        source.go_down(False)
        await until(pilot, lambda: not banner.display, what="banner to clear")
        assert app.snapshot.connected
        # The event stream was resubscribed as well.
        source.emit("round_committed", "round 7 committed")
        await until(pilot, lambda: app.events[-1].message == "round 7 committed")

    drive(make_app(source), scenario)


def test_jobs_screen_shows_the_ledger_of_the_selected_job() -> None:
    source = FakeSource()

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await pilot.press("3")
        await until(pilot, lambda: len(table_keys(app, "#ledger-table")) == 6, what="ledger")
        assert table_keys(app, "#job-table") == [JOB_ID, "ffee00112233"]
        assert "round 6      coordinator" in screen_text(app)
        await pilot.press("down")  # the finished job has no ledger rounds here
        await until(pilot, lambda: not table_keys(app, "#ledger-table"), what="empty ledger")
        await pilot.press("up", "enter", "down")  # into the ledger, one round back
        assert "round 5      coordinator" in screen_text(app)
        calls = source.calls.count("ledger")
        await pilot.pause(0.3)  # several polls: the ledger is not fetched again
        assert source.calls.count("ledger") == calls

    drive(make_app(source), scenario)


def test_jobs_screen_says_why_a_round_stalls() -> None:
    source = FakeSource()
    source.job_list[0]["waiting"] = "only 1 of min_nodes=2 members reachable; …Lw3SBj5a unreachable: behind NAT"

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await pilot.press("3")
        await until(pilot, lambda: "behind NAT" in screen_text(app), what="the stall line")
        assert "⚠ only 1 of min_nodes=2" in screen_text(app)

    drive(make_app(source), scenario, size=(160, 48))


def test_jobs_screen_names_the_members_whose_job_failed_there() -> None:
    source = FakeSource()
    why = "[Errno 2] No such file or directory: '<path>'"
    source.job_list[0]["gone"] = [{"peer": peer_id(n), "reason": why} for n in range(1, 6)]

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await pilot.press("3")
        await until(pilot, lambda: "round 6      coordinator" in screen_text(app), what="the round's details")
        shown = screen_text(app)
        for n in range(1, 4):
            assert f"✗ gone {fmt.short_id(peer_id(n))}: the job failed there ({why})" in shown
        assert fmt.short_id(peer_id(4)) not in shown and "✗ 2 more gone: gpuflex job status lists them" in shown
        assert "contributors ChVi…o1Gf×300" in shown, "the round's details still show below them"
        await pilot.press("down")  # the other job has no member gone
        await until(pilot, lambda: "✗" not in screen_text(app), what="the other job's pane")

    drive(make_app(source), scenario, size=(160, 48))


def test_polls_at_most_once_per_interval_even_with_many_events() -> None:
    source = FakeSource()

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: loaded(app))
        loop = asyncio.get_running_loop()
        before, started = source.calls.count("status"), loop.time()
        for i in range(50):
            source.emit("update_received", f"update {i}")
            await pilot.pause(0.01)
        polls = source.calls.count("status") - before
        elapsed = loop.time() - started
        assert polls <= elapsed / 0.2 + 2, (polls, elapsed)  # one poll per 0.2 s, not 50

    drive(make_app(source, interval=0.2), scenario)
