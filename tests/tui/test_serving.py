"""The dashboard's Serving screen (key 4) against the in-memory fake node: each server of the
mesh with its models, load, requests and tokens per second and latency; the models this node
serves; its batch inference jobs; and a node that serves nothing."""

from __future__ import annotations

from textual.pilot import Pilot

from gpuflex.serve.view import Serving
from tests.tui.capture import screen_text
from tests.tui.conftest import drive, loaded, make_app, until
from tests.tui.fake_serving import FAILED_WHY, RUN_ID, VERDICT, serve_block
from tests.tui.fake_source import SELF, FakeSource, peer_id
from tui.app import DashboardApp
from tui.screens.peers import COLUMNS
from tui.screens.serving import ServingScreen
from tui.widgets.keyed_table import KeyedTable


def rows(app: DashboardApp, selector: str) -> dict[str, list[str]]:
    table = app.screen.query_one(selector, KeyedTable)
    return {str(r.key.value): [str(c) for c in table.get_row(r.key)] for r in table.ordered_rows}


def serving_source() -> FakeSource:
    """The fake node with the serving figures of ``fake_serving``."""
    source = FakeSource()
    source.serve = serve_block()
    return source


async def open_screen(app: DashboardApp, pilot: Pilot[None], key: str) -> None:
    await until(pilot, lambda: loaded(app))
    await pilot.press(key)


def test_the_serving_screen_shows_each_server_its_figures_the_local_models_and_inference_jobs() -> None:
    source = serving_source()

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await open_screen(app, pilot, "4")
        assert app.current_mode == "serving" and isinstance(app.screen, ServingScreen)
        await until(pilot, lambda: len(rows(app, "#server-table")) == 3, what="server rows")
        servers = rows(app, "#server-table")
        busy = servers[peer_id(1)]
        assert busy[1:8] == ["bard, tiny", "7/8", "2.25", "143.5", "63ms", "1210ms", "12ms"], busy
        me = [r for r in servers.values() if "(me)" in r[0]]
        assert len(me) == 1 and me[0][2:7] == ["3/8", "1.50", "96.0", "41ms", "820ms"] and me[0][7] == "local"
        assert servers[peer_id(2)][3:7] == ["0.00", "0.0", "–", "–"]  # idle: no medians yet
        fitted = "cuda:0 bfloat16, batch 8 of 16, KV 512 MiB"  # how the model is fitted to the device
        assert rows(app, "#served-table")["bard"][3:7] == ["120", "7680", "2", fitted]
        assert rows(app, "#run-table")[RUN_ID][1:5] == ["summaries", "bard", "running", "12/24"]
        text = screen_text(app)
        assert "http://127.0.0.1:8000/v1" in text
        assert FAILED_WHY[:20] in text  # the node's words as they are, markup and all
        assert "check: servers 00000002 and 00000001 disagree" in text  # the redundancy check's report
        # The figures follow the node: a new poll with more load shows at once.
        source.serve["servers"][2]["load"] = 4
        await until(pilot, lambda: rows(app, "#server-table")[peer_id(2)][2] == "4/4", what="new load")

    drive(make_app(source), scenario, size=(160, 48))


def test_a_node_that_serves_nothing_says_how_to_start() -> None:
    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await open_screen(app, pilot, "4")
        await until(pilot, lambda: "gpuflex serve" in screen_text(app), what="hint")
        assert rows(app, "#server-table") == {}

    drive(make_app(FakeSource()), scenario)


def test_figures_of_the_wrong_type_show_as_dashes_not_errors() -> None:
    block = serve_block()
    block["servers"][0].update(rps="fast", tokens_per_s=True, load=None, models="bard")
    block["runs"] = [{"run_id": 7}]
    serving = Serving.from_status({"serve": block})
    assert serving.servers[0].figures.rps is None and serving.servers[0].figures.tokens_per_s is None
    assert serving.servers[0].load == 0 and serving.servers[0].models == ()
    assert serving.runs[0].run_id == "?"
    assert Serving.from_status({"serve": "nope"}).empty and Serving.from_status(None).empty


def test_the_peers_credit_view_shows_the_tokens_each_peer_served_and_flags_a_penalised_liar() -> None:
    source = serving_source()

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await open_screen(app, pilot, "2")
        served = [c.key for c in COLUMNS].index("served")
        await until(pilot, lambda: rows(app, "#peer-table").get(peer_id(1), [""] * 20)[served] == "800",
                    what="served tokens")
        table = rows(app, "#peer-table")
        assert table[peer_id(2)][served] == "0!"  # served nothing here, penalised by a redundancy check
        assert table[peer_id(3)][served] == "–"  # never served this node
        # Sorting by tokens served ("v") puts the biggest server first.
        await pilot.press("v", "v")
        ordered = list(rows(app, "#peer-table"))
        assert ordered[0] == peer_id(1), ordered

    drive(make_app(source), scenario, size=(160, 48))


def test_the_shared_view_reads_serving_credit_and_the_fit_leniently() -> None:
    serving = Serving.from_status({"serve": serve_block()})
    assert [(c.peer, c.tokens, c.mismatches, c.penalised) for c in serving.credit] == [
        (SELF, 1200, 0, 0), (peer_id(1), 800, 1, 0), (peer_id(2), 0, 1, 1)]
    assert serving.credit_of(peer_id(2)) is not None and serving.credit_of("nobody") is None
    assert serving.reports == (VERDICT,)
    assert serving.models[0].fit.text == "cuda:0 bfloat16, batch 8 of 16, KV 512 MiB"
    hostile = Serving.from_status({"serve": {"served_tokens": {"x": "many", "y": -3, "z": 5}, "redundancy": [1],
                                             "models": [{"name": "m", "fit": "gpu"}]}})
    assert [(c.peer, c.tokens) for c in hostile.credit] == [("z", 5), ("x", 0), ("y", 0)]
    assert hostile.models[0].fit.text == "" and hostile.reports == ()
