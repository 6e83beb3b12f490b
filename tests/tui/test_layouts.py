"""The dashboard where a new user first looks: the Jobs ledger following a running job, the
round detail pane, the peers table at 80 and 120 columns, the chart at 80x24. Driven through
Textual's pilot against the in-memory fake node."""

from __future__ import annotations

from textual.pilot import Pilot

from tests.tui.capture import screen_text
from tests.tui.conftest import drive, loaded, make_app, until
from tests.tui.fake_source import JOB_ID, FakeSource, job_row
from tui.app import DashboardApp
from tui.screens.jobs import JobsScreen, round_key
from tui.widgets.keyed_table import KeyedTable
from tui.widgets.metrics_chart import MetricsChart


def run_to(source: FakeSource, round_: int) -> None:
    """The fake job, committed up to ``round_`` (of many), with each round's metrics."""
    source.metrics = [(r, 2.0 / r, min(0.99, 0.5 + r / 200)) for r in range(1, 101)]
    row = job_row(6)
    row.update(round=round_, rounds=100, metrics=[
        {"round": r, "loss": loss, "accuracy": acc, "train_loss": loss, "contributors": 4, "duration_s": 1.0,
         "perplexity": None, "update_bytes": 4 * 10_000} for r, loss, acc in source.metrics[:round_]])
    source.job_list[0] = row


def ledger(app: DashboardApp) -> KeyedTable:
    return app.screen.query_one("#ledger-table", KeyedTable)


def detail(app: DashboardApp) -> str:
    """The round-detail pane's text, as drawn."""
    pane = app.screen.query_one("#round-detail")
    text = screen_text(app).splitlines()
    return "\n".join(text[pane.region.y:pane.region.y + pane.region.height])


def test_the_ledger_follows_new_rounds_and_the_detail_pane_its_own_job() -> None:
    source = FakeSource()
    run_to(source, 40)

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: loaded(app))
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen) and JOB_ID in app.screen.ledgers,
                    what="the ledger")
        await pilot.press("enter")  # down into the ledger, on its newest round
        await until(pilot, lambda: ledger(app).selected_key() == round_key(JOB_ID, 40), what="round 40")
        for target in (41, 75):  # the job moves on: the cursor, and the detail, go with it
            run_to(source, target)
            await until(pilot, lambda t=target: ledger(app).selected_key() == round_key(JOB_ID, t),
                        what=f"round {target} under the cursor")
            await until(pilot, lambda t=target: f"round {t}" in detail(app), what=f"round {target} in detail")
        # A cursor moved down to an older round stays on it as rounds arrive.
        await pilot.press("down", "down")
        assert ledger(app).selected_key() == round_key(JOB_ID, 73)
        run_to(source, 76)
        await until(pilot, lambda: ledger(app).row_count == 76, what="round 76")
        assert ledger(app).selected_key() == round_key(JOB_ID, 73) and "round 73" in detail(app)
        # Scrolled so that the cursor's round is off screen: the pane shows no round.
        ledger(app).scroll_to(y=60, animate=False)
        await pilot.pause()
        app.screen._show_round()
        assert "no committed round selected" in detail(app)
        # Another job: its (empty) ledger, never a round of the first job.
        await pilot.press("escape", "down")
        await until(pilot, lambda: "no committed round selected" in detail(app), what="the other job's detail")
        assert all(not str(r.key.value).startswith(JOB_ID) for r in ledger(app).ordered_rows)

    drive(make_app(source), scenario, size=(100, 40))


def peers_screen(size: tuple[int, int]) -> str:
    captured: list[str] = []

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: loaded(app))
        await pilot.press("2")
        await until(pilot, lambda: bool(app.screen.query_one("#peer-table", KeyedTable).border_subtitle),
                    what="the scroll hint")
        captured.append(screen_text(app))

    drive(make_app(interval=60), scenario, size)
    return captured[0]


def test_the_peers_table_shows_the_work_columns_at_80_and_120_columns_and_says_more_scroll() -> None:
    for size in ((80, 24), (120, 30)):
        text = peers_screen(size)
        header = next(line for line in text.splitlines() if "peer " in line and "state" in line)
        for column in ("device", "smp/s", "shr", "stp", "pen"):
            assert column in header, (size, header)
        assert "more columns" in text and "scroll" in text, text


def test_the_chart_at_80x24_is_tall_enough_and_its_legend_stays_off_the_plot() -> None:
    captured: list[str] = []
    heights: list[int] = []

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: loaded(app))
        await pilot.pause(0.1)
        heights.append(app.screen.query_one(MetricsChart).size.height)
        captured.append(screen_text(app))

    drive(make_app(interval=60), scenario, (80, 24))
    assert heights[0] >= 10, heights
    text = captured[0]
    assert "loss (red, left) · accuracy (green, right)" in text
    plot = [line for line in text.splitlines() if "┤" in line]
    assert len(plot) >= 6 and not any("loss" in line or "accuracy" in line for line in plot), text
