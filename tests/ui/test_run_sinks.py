"""The window's run controller and its sinks, driven by events fed through the bridge (a fake worker client):
warm-up and lane ids from the RunPlan, results rows as lanes end, rate axes without SI prefixes, the whole
task in the status bar, the loading phase on the plots, stop and a dying worker."""

from __future__ import annotations

import time

import pytest

from .helpers import SETUPS, FakeClient, make_stats, make_step


@pytest.fixture
def win(fake_window):
    return fake_window(max_new_tokens=4)


def _start(qtbot, w):
    client = w.bridge.client
    before = len(client.sent) if client is not None else 0
    with qtbot.waitSignal(w.runStarted, timeout=2000):
        rid = w.run()
    assert rid is not None, w.status_label.text()
    client = FakeClient.instances[-1]
    qtbot.waitUntil(lambda: len(client.sent) == before + 2, timeout=5000)  # sent once the (fake) worker is ready
    return rid, client


def _done(w, lane_id, stats, t=None):
    from app.core.events import LaneDone

    w.bridge.feed(LaneDone(lane_id, stats), t)


def test_run_sends_the_plan_warm_up_first(qtbot, win):
    rid, client = _start(qtbot, win)
    warm, main = client.sent
    assert warm.run_id == f"{rid}-warmup" and [x.lane_id for x in warm.lanes] == ["warm/L1", "warm/L2", "warm/L3"]
    assert warm.sampling.max_new_tokens == 4 and main.run_id == rid
    assert [(x.lane_id, x.setup) for x in main.lanes] == [("L1", SETUPS[0]), ("L2", SETUPS[1]), ("L3", SETUPS[2])]
    assert not win.run_btn.isEnabled() and win.stop_btn.isEnabled() and not win.setup_panel.isEnabled()
    # a warm-up step says so in its lane, and is neither shown nor counted
    win.bridge.feed(make_step("warm/L2", 0))
    assert win.lane_by_id["L2"].status.text() == "warming up…" and win.lane_by_id["L2"].acc.steps == 0
    assert win.controller.results.tokens == 0


def test_results_rows_appear_as_lanes_end_with_the_baseline_comparison_once_it_is_in(qtbot, win):
    from app.core.events import LaneStarted
    from app.worker.messages import RunFinished

    rid, _ = _start(qtbot, win)
    for lid, s in zip(("L1", "L2", "L3"), SETUPS, strict=True):
        win.bridge.feed(LaneStarted(lid, s, "custom", 0, (1, 2), "Write a poem."))
    table = win.results.table
    assert table.rowCount() == 0
    _done(win, "L2", make_stats(SETUPS[1], (5, 6, 7, 8), 0.5, drafted=4, accepted=2))
    assert table.rowCount() == 1 and "1 of 3 lanes finished" in win.results.summary.text()
    row = {table.horizontalHeaderItem(j).text(): table.item(0, j).text() for j in range(table.columnCount())}
    assert row["setup"] == SETUPS[1] and row["speedup"] == "—" and row["vs baseline"] == "—"  # no baseline yet
    assert win.lane_by_id["L2"].state == "done" and win.lane_by_id["L2"].badge.isHidden()
    _done(win, "L1", make_stats("baseline", (5, 6, 7, 8), 1.0))
    assert table.rowCount() == 2
    col = {table.horizontalHeaderItem(j).text(): j for j in range(table.columnCount())}
    rows = {table.item(i, 1).text(): table.item(i, col["vs baseline"]).text() for i in range(2)}
    speed = {table.item(i, 1).text(): table.item(i, col["speedup"]).text() for i in range(2)}
    assert rows == {"baseline": "baseline", SETUPS[1]: "identical"} and speed[SETUPS[1]] == "2.00×"
    assert win.lane_by_id["L2"].badge.text() == "✓ identical to baseline" and win.lane_by_id["L1"].badge.text() == "baseline"
    assert "running… 2/3 lanes finished" == win.status_label.text()
    _done(win, "L3", make_stats(SETUPS[2], (5, 6, 9, 9), 0.8, drafted=3, accepted=1))
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(RunFinished(rid))
    assert table.rowCount() == 3 and "wins" in win.results.summary.text()
    assert win.lane_by_id["L3"].badge.text() == "≠ diverges at token 2"
    assert win.status_label.text().startswith("run finished: 3/3 lanes completed · winner: Lane 2")
    assert win.tabs.currentWidget() is win.results and win.run_btn.isEnabled()
    assert win.controller.results.all_completed


def test_rate_axes_show_plain_values_below_one_token_per_second(qtbot):
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.ui.plots import PlotPanel
    from app.worker.plan import RunPlan

    plots = PlotPanel(window_s=0.01)
    qtbot.addWidget(plots)
    plots.resize(900, 500)
    plots.show()
    plan = RunPlan("t", ("baseline",), (Prompt("p", "x"),), Sampling())
    t0 = time.monotonic()
    plots.start_run(plan, None, t0=t0)
    for i, rate in enumerate((0.2, 0.3, 0.4, 0.5, 0.6, 0.7)):  # a slow CPU lane: 0.2 → 0.7 tok/s
        t_s = (i + 1) / rate
        plots.on_event(make_step("L1", i, t_s=t_s), t0 + 100 + t_s)
    plots.redraw(force=True)
    qtbot.wait(50)
    ax = plots.p_tps.getAxis("left")
    lo, hi = plots.p_tps.viewRange()[1]
    assert 0.7 <= hi < 1.0  # the range where pyqtgraph would scale a unitless axis by 1000
    assert ax.autoSIPrefixScale == 1.0 and ax.labelString().count("x0.001") == 0 and "tok/s" in ax.labelString()
    assert ax.tickStrings([0.5], ax.autoSIPrefixScale, 0.1) == ["0.5"]  # not "500"


def test_status_bar_shows_the_whole_task_and_elides_only_when_needed(qtbot, win):
    from app.core.events import Progress
    from app.ui.status_bar import ElidedLabel

    _start(qtbot, win)
    task = "qwen2.5-coder-1.5b-instruct: load qwen2.5-coder-1.5b-instruct"
    win.bridge.feed(Progress(task, 0, 1))
    qtbot.wait(20)
    label = win.status_label
    assert label.text() == "load qwen2.5-coder-1.5b-instruct" == label.shown_text() and label.toolTip() == ""
    assert win.status.progress.format() == "%p%" and win.status.progress.maximum() == 0  # busy, no clipped text
    win.bridge.feed(Progress("smollm2-135m-instruct: verify GGUF", 12, 40, "MiB"))
    assert label.text() == "smollm2-135m-instruct: verify GGUF (12/40 MiB)" and win.status.progress.value() == 300
    narrow = ElidedLabel("load qwen2.5-coder-1.5b-instruct")
    qtbot.addWidget(narrow)
    narrow.resize(120, 20)
    narrow.show()
    shown = narrow.shown_text()
    assert "…" in shown and shown.startswith("lo") and shown.endswith("ct")  # elided in the middle
    assert narrow.toolTip() == narrow.text() == "load qwen2.5-coder-1.5b-instruct"


def test_plots_mark_engine_loading_and_warm_up_before_the_lanes(qtbot, win):
    from app.core.events import LaneStarted, Progress

    _start(qtbot, win)
    plots = win.plots
    t0 = plots.t0
    win.bridge.feed(Progress("tiny-target: load tiny-target", 0, 1), t0 + 1.0)
    assert [p.label for p in plots.phases] == ["loading engines"] and plots.phases[0].end is None
    win.bridge.feed(LaneStarted("warm/L1", SETUPS[0], "custom", 0, (1,), "x"), t0 + 110.0)
    win.bridge.feed(LaneStarted("warm/L2", SETUPS[1], "custom", 0, (1,), "x"), t0 + 110.5)
    win.bridge.feed(LaneStarted("L1", SETUPS[0], "custom", 0, (1,), "x"), t0 + 112.0)
    win.bridge.feed(make_step("L1", 0, t_s=0.1), t0 + 112.1)
    load, warm = plots.phases
    assert (load.label, warm.label) == ("loading engines", "warm-up")
    assert (load.start, load.end, warm.start, warm.end) == pytest.approx((0.0, 110.0, 110.0, 112.0))
    assert load.regions[0].getRegion() == pytest.approx((0.0, 110.0)) and load.regions[0] in plots.p_tps.items
    assert plots.lanes["L1"].ring.view()[0, 0] == pytest.approx(112.1)  # the curve starts where its lane does
    plots.redraw(force=True)
    assert warm.regions[0].getRegion() == pytest.approx((110.0, 112.0))  # closed phases stop growing


def test_stop_and_a_dying_worker_end_the_run(qtbot, win):
    from app.worker.messages import Cancel, RunFinished, WorkerDied

    rid, client = _start(qtbot, win)
    win.bridge.feed(make_step("L1", 0))
    win.stop()
    assert [c for c in client.sent if isinstance(c, Cancel)] == [Cancel(f"{rid}-warmup"), Cancel(rid)]
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(RunFinished(rid, cancelled=True))
    assert {v.state for v in win.lane_views} == {"cancelled"} and win.controller.results.stopped
    assert win.status_label.text().startswith("run stopped: 0/3")
    rid, client = _start(qtbot, win)
    _done(win, "L1", make_stats("baseline", (1, 2), 1.0))
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(WorkerDied(-9, "worker process died: SIGKILL (killed)"))
    assert win.lane_by_id["L1"].state == "done"
    for lid in ("L2", "L3"):
        v = win.lane_by_id[lid]
        assert v.state == "error" and "worker process died" in v.error.text() and "press Run" in v.error.text()
    assert win.status.worker.text() == "worker: died (Run restarts it)"
    doc = win.report()
    assert len(doc["runs"]) == 1 and doc["telemetry"] == [] and doc["gui"]["lanes"][1]["error"].startswith("worker process died")
    assert "worker process died" in win.results.summary.text()


def test_export_json_keeps_the_bench_schema_with_gui_and_telemetry(qtbot, win, tmp_path):
    import json

    from app.core.report import RUN_KEYS
    from app.worker.messages import RunFinished

    rid, _ = _start(qtbot, win)
    _done(win, "L1", make_stats("baseline", (5, 6, 7, 8), 1.0))
    _done(win, "L2", make_stats(SETUPS[1], (5, 6, 7, 8), 0.5, drafted=4, accepted=2))
    _done(win, "L3", make_stats(SETUPS[2], (5, 6, 7, 8), 0.8, drafted=3, accepted=1))
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(RunFinished(rid))
    doc = json.loads(open(win.export_json(str(tmp_path / "r.json")), encoding="utf-8").read())
    assert {"target", "device", "dtype", "runs", "summary", "sampling", "created", "machine", "mode", "repeats", "prompts",
            "categories", "bench_wall_s", "errors", "telemetry", "gui"} <= set(doc)
    assert [r["setup"] for r in doc["runs"]] == list(SETUPS) and all(set(RUN_KEYS) <= set(r) for r in doc["runs"])
    assert doc["runs"][1]["speedup"] == pytest.approx(2.0) and doc["sampling"]["max_new_tokens"] == 4
    assert doc["gui"]["lanes"] == [{"lane": f"L{i + 1}", "setup": s, "error": None} for i, s in enumerate(SETUPS)]
    assert doc["gui"]["warmup_tokens"] == 4 and doc["gui"]["worker"].startswith("worker pid 4242")
    wall = doc["bench_wall_s"]
    time.sleep(0.05)
    assert win.report()["bench_wall_s"] == wall  # frozen when the run ended


def test_panels_are_run_sinks_subscribed_in_one_list(win):
    from app.ui.sinks import RunSink

    sinks = win.controller.sinks
    assert sinks == [win.lanes, win.plots, win.results, win.costs, win.status, win.load_meter]
    assert all(isinstance(s, RunSink) for s in sinks)
    win.hide_rejected_action.setChecked(True)  # the View menu and the checkbox stay in step
    assert win.lanes.hide_rejected.isChecked() and not any(v.show_rejected for v in win.lane_views)
    win.lanes.hide_rejected.setChecked(False)
    assert not win.hide_rejected_action.isChecked()


def test_plot_legends_are_veiled_in_the_themes_background_so_curves_under_them_do_not_hide_the_names(qtbot):
    from PySide6.QtGui import QColor

    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.ui.plot_parts import LEGEND_VEIL_ALPHA
    from app.ui.plots import PlotPanel
    from app.ui.theme import DARK, LIGHT
    from app.worker.plan import RunPlan

    plots = PlotPanel(window_s=0.01)
    qtbot.addWidget(plots)
    plots.start_run(RunPlan("t", ("baseline", "ngram"), (Prompt("p", "x"),), Sampling()), None, t0=time.monotonic())
    for theme in (DARK, LIGHT):
        plots.set_theme(theme)
        for legend in (plots.p_tps.legend, plots.sys_legend):
            veil = legend.brush().color()
            assert (veil.name(), veil.alpha()) == (QColor(theme.plot_bg).name(), LEGEND_VEIL_ALPHA)
            assert 0 < LEGEND_VEIL_ALPHA < 255  # the curves still show through, muted
            assert legend.items, "the legend lists the lanes / series"
            for _sample, label in legend.items:
                assert QColor(label.opts["color"]).name() == QColor(theme.plot_fg).name()
    long = "draft:qwen2.5-coder-0.5b-instruct,k=4,schedule=constant"
    plots.start_run(RunPlan("t", ("ngram", long), (Prompt("p", "x"),), Sampling()), None, t0=time.monotonic())  # new names
    labels = [label for _s, label in plots.p_tps.legend.items]
    assert [QColor(label.opts["color"]).name() for label in labels] == [QColor(LIGHT.plot_fg).name()] * 2
    from app.ui.plot_parts import LEGEND_NAME_CHARS

    # long setups cut short (their lane headers keep them whole): the legend stays narrow over the data
    assert labels[0].text == "1: ngram" and labels[1].text == "2: " + long[: LEGEND_NAME_CHARS - 1] + "…"


def test_a_legend_shows_only_where_its_plot_has_room_for_it(qtbot):
    """A plot squeezed short (a small window, tall lanes) would be half covered by its legend: it is hidden there and
    shown again when the plot grows."""
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.ui.plot_parts import LEGEND_ROOM
    from app.ui.plots import PlotPanel
    from app.worker.plan import RunPlan

    plots = PlotPanel(window_s=0.01)
    qtbot.addWidget(plots)
    plots.resize(1000, 700)
    plots.show()
    plots.start_run(RunPlan("t", ("baseline", "ngram", "ngram:n=2,k=4"), (Prompt("p", "x"),), Sampling()), None,
                    t0=time.monotonic())
    legend = plots.p_tps.legend

    def shown_when(height: int) -> bool:
        plots.resize(1000, height)
        qtbot.wait(50)
        assert (plots.p_tps.vb.height() >= LEGEND_ROOM * legend.boundingRect().height()) == legend.isVisible()
        return legend.isVisible()

    assert shown_when(700) and not shown_when(260) and shown_when(700)
