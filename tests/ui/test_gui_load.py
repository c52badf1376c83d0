"""The window takes as little CPU as it can from the lanes it measures (they share the machine's cores): plots at
most 10 Hz and lane text at most 20 Hz during a run (1 Hz and 10 Hz on few cores), steps delivered in frames rather
than one wake-up each, per-step plot figures computed once (not per frame over the whole history), axes cached and
ranges grown in steps, opaque lanes (new text does not repaint the window), live plots that can be switched off;
and it says when the lanes waited for a CPU, when its own CPU use may have slowed them, and when they starved it."""

from __future__ import annotations

import math
import random
import time

import numpy as np
import pytest

from .helpers import SETUPS, FakeClient, make_stats, make_step


@pytest.fixture
def win(fake_window):
    return fake_window(max_new_tokens=4000)


def _start(qtbot, w):
    with qtbot.waitSignal(w.runStarted, timeout=2000):
        rid = w.run()
    assert rid is not None, w.status_label.text()
    qtbot.waitUntil(lambda: len(FakeClient.instances[-1].sent) >= 2, timeout=5000)
    return rid


@pytest.mark.parametrize("x, want", [(0.7, 0.75), (0.76, 1.0), (1.0, 1.0), (1.2, 1.5), (4.1, 5.0), (7.5, 7.5), (8.0, 10.0), (31, 50.0),
                                     (0.0, 1.0), (math.nan, 1.0)])
def test_ranges_grow_in_steps(x, want):
    from app.ui.plots import nice_ceiling

    assert nice_ceiling(x) == pytest.approx(want)


def test_rolling_figures_are_computed_once_per_step_and_match_the_whole_history_formula(qtbot):
    """The plots used to recompute every point's smoothed rate and α on every frame; now each step's figures are
    computed as it arrives. They must equal the old whole-history formula."""
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.ui.plot_parts import COL_ALPHA, COL_RATE
    from app.ui.plots import PlotPanel
    from app.worker.plan import RunPlan

    plots = PlotPanel(window_s=0.3, alpha_window=4)
    qtbot.addWidget(plots)
    plots.start_run(RunPlan("t", ("draft:x,k=4",), (Prompt("p", "x"),), Sampling()), None, t0=0.0)
    rng = random.Random(1)
    t = 0.0
    for i in range(200):
        t += rng.choice((0.01, 0.05, 0.2, 0.5))
        a = rng.randint(0, 4)
        plots.add_step(make_step("L1", i, drafted=(1, 2, 3, 4), accepted=a, t_s=t), 10.0 + t)
    v = plots.lanes["L1"].ring.view()
    ts, tok, acc, dr = v[:, 1], v[:, 2], v[:, 3], v[:, 4]
    idx = np.arange(len(v))
    j = np.minimum(np.searchsorted(ts, ts - 0.3, side="left"), idx)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(ts - ts[j] > 1e-9, (tok - tok[j]) / (ts - ts[j]), np.where(ts > 0, tok / ts, np.nan))
        ja = np.maximum(idx - 4, 0)
        da = np.where(idx > 0, acc - acc[ja], acc)
        dd = np.where(idx > 0, dr - dr[ja], dr)
        alpha = np.where(dd > 0, da / dd, np.nan)
    np.testing.assert_allclose(v[:, COL_RATE], rate)
    np.testing.assert_allclose(v[:, COL_ALPHA], alpha)


def test_during_a_run_plots_and_lane_text_draw_at_capped_rates(qtbot, win):
    """Plots at most 5 Hz and lane text at most 20 Hz (every 2 s and 4 Hz on a machine with few cores, like CI's),
    headers at most 2 Hz (1 Hz), however fast the steps come."""
    from PySide6.QtWidgets import QGraphicsItem

    from app.core.events import LaneStarted
    from app.ui.plots import RUN_INTERVAL_MS
    from app.ui.run_controller import FRAME_MS, frame_ms

    assert RUN_INTERVAL_MS >= 100 and FRAME_MS >= 50
    _start(qtbot, win)
    for i, s in enumerate(SETUPS):
        win.bridge.feed(LaneStarted(f"L{i + 1}", s, "custom", 0, (1,), "x"))
    plots, lanes = win.plots, win.lanes
    r0, f0 = plots.redraws, lanes.frames
    headers = []
    view = win.lane_by_id["L1"]
    orig = view.update_header

    def counted() -> None:
        headers.append(time.monotonic())
        orig()

    view.update_header = counted
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < max(2.0, 2.5 * plots.interval_ms / 1000):  # ~200 steps a second: more than a CPU model makes
        n += 1
        win.bridge.feed(make_step(f"L{n % 3 + 1}", n // 3, t_s=n * 0.005))
        qtbot.wait(5)
    elapsed = time.monotonic() - t0
    assert plots.redraws - r0 <= elapsed * 1000 / plots.interval_ms + 2, (plots.redraws - r0, elapsed)
    assert lanes.frames - f0 <= elapsed * 1000 / frame_ms() + 2, (lanes.frames - f0, elapsed)
    assert len(headers) <= elapsed / view.header_s + 2
    assert plots.redraws - r0 >= 1 and lanes.frames - f0 >= 3  # and they do draw
    for p in (plots.p_tps, plots.p_alpha, plots.p_pos, plots.p_sys):
        for ax in ("left", "bottom"):
            assert p.getAxis(ax).cacheMode() == QGraphicsItem.CacheMode.DeviceCoordinateCache
    # ranges grow in steps: the x axis was set a handful of times, not once a frame
    lo, hi = plots.p_tps.viewRange()[0]
    assert lo == -1.0 and hi in (5.0, 7.5, 10.0)


def test_live_plots_off_draws_once_at_the_end(qtbot, win):
    from app.core.events import LaneDone
    from app.worker.messages import RunFinished

    win.live_plots_action.setChecked(False)
    rid = _start(qtbot, win)
    r0 = win.plots.redraws
    for i in range(40):
        win.bridge.feed(make_step("L1", i))
        qtbot.wait(10)
    assert win.plots.redraws == r0 and win.plots.buffer_len("L1") == 40  # the data is kept
    for lid, s in zip(("L1", "L2", "L3"), SETUPS, strict=True):
        win.bridge.feed(LaneDone(lid, make_stats(s, (1, 2, 3), 1.0)))
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(RunFinished(rid))
    assert win.plots.redraws == r0 + 1 and len(win.plots._series["1: baseline tok/s"][0]) == 40
    win.save_settings()
    assert win.settings.value("ui/live_plots", True, type=bool) is False


def test_a_user_zoom_is_left_alone(qtbot, win):
    from app.core.events import LaneStarted

    _start(qtbot, win)
    win.bridge.feed(LaneStarted("L1", SETUPS[0], "custom", 0, (1,), "x"))
    win.plots.p_tps.vb.setXRange(2.0, 3.0, padding=0)
    win.plots.p_tps.vb.sigRangeChangedManually.emit([True, True])  # what a mouse zoom sends
    for i in range(30):
        win.bridge.feed(make_step("L1", i, t_s=i * 0.5))
    win.plots.redraw(force=True)
    assert win.plots.p_tps.viewRange()[0] == pytest.approx([2.0, 3.0])


# --- the window's own load ----------------------------------------------------------------------------------------


def _samples(gui: float, worker: float, t0: float, n: int = 10):
    from app.telemetry.samples import HostSample, ProcSample, TelemetrySample

    return [TelemetrySample(t=0.0, t_mono=t0 + i * 0.1, gpus=(), gpu_state="No NVIDIA GPU — showing CPU",
                            host=HostSample(50.0, (ProcSample(1, "gui", gui, 100.0), ProcSample(2, "worker", worker if i else math.nan, 900.0))))
            for i in range(n)]


def test_run_load_averages_the_recorded_stretch():
    from app.ui.load import run_load

    s = _samples(10.0, 180.0, t0=100.0) + _samples(90.0, 10.0, t0=50.0)  # the second batch is before the lanes
    load = run_load(s, 100.0, 101.0, cores=2)
    assert load == {"gui_cpu_pct": 10.0, "worker_cpu_pct": 180.0, "cores": 2, "samples": 10, "seconds": 1.0}


@pytest.mark.parametrize("gui, cores, said", [(12.0, 2, True), (4.0, 2, False), (30.0, 16, False), (5.0, 4, True)])
def test_load_note_only_on_few_cores_and_a_busy_window(gui, cores, said):
    from app.ui.load import load_notes

    note = "; ".join(n for _, n in load_notes(gui, cores))
    assert bool(note) == said
    if said:
        assert note.startswith(f"the window used {gui:.0f}% of a core during the run; on {cores} cores that can slow the lanes")
        assert "Live plots" in note and "bench" in note


def test_the_window_says_when_its_own_load_may_have_slowed_the_lanes(qtbot, win, monkeypatch):
    from app.core.events import LaneDone, LaneStarted
    from app.worker.messages import RunFinished

    class FakeSampler:
        def samples(self):  # ten readings a second while the lanes ran
            t0 = win.load_meter.t_lanes
            n = int((time.monotonic() - t0) / 0.1)
            return _samples(90.0, 10.0, t0 - 5.0, n=40) + _samples(14.0, 170.0, t0 + 0.001, n=n)

        def clear(self) -> None:
            pass

        def to_json(self):
            return []

        def close(self) -> None:
            pass

    monkeypatch.setattr("app.ui.load.cpu_cores", lambda: 2)
    rid = _start(qtbot, win)
    win.sampler = FakeSampler()
    win.bridge.feed(LaneStarted("L1", SETUPS[0], "custom", 0, (1,), "x"))
    qtbot.wait(500)
    for lid, s in zip(("L1", "L2", "L3"), SETUPS, strict=True):
        win.bridge.feed(LaneDone(lid, make_stats(s, (1, 2, 3), 1.0)))
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(RunFinished(rid))
    note = "the window used 14% of a core during the run; on 2 cores that can slow the lanes"
    assert note in win.results.summary.text()
    assert win.status_label.text().endswith("· ⚠ the window used 14% of a core (see Results)")
    doc = win.report()
    assert doc["gui"]["load"]["gui_cpu_pct"] == 14.0 and doc["gui"]["load"]["worker_cpu_pct"] == 170.0
    assert doc["gui"]["load"]["note"].startswith(note) and doc["gui"]["live_plots"] is True


@pytest.mark.slow
def test_gui_export_writes_the_run_report_when_the_run_ends(tiny_pair, tmp_path):
    """`gui --autorun --quit-after-run --export PATH` (what resources/bench/gui_vs_headless.py runs): the bench schema,
    telemetry and the window's own CPU use while the lanes ran."""
    import json
    import os
    import subprocess
    import sys

    target, _ = tiny_pair
    out = tmp_path / "run.json"
    args = ["--target", str(target), "--setup", "baseline", "--setup", "ngram:n=2,k=4", "--max-new-tokens", "12", "--prompt", "Tell a story.",
            "--mode", "interleaved", "--autorun", "--quit-after-run", "--export", str(out), "--settings", str(tmp_path / "s.ini")]
    code = f"import sys\nfrom app.ui.main import main\nsys.exit(main({args!r}))\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert [x["setup"] for x in doc["runs"]] == ["baseline", "ngram:n=2,k=4"] and all(x["new_tokens"] == 12 for x in doc["runs"])
    assert doc["mode"] == "interleaved" and doc["telemetry"] and doc["gui"]["live_plots"] is True
    load = doc["gui"]["load"]
    assert load["cores"] >= 1 and load["seconds"] > 0 and set(load) >= {"gui_cpu_pct", "worker_cpu_pct", "note"}


def test_the_load_meter_sees_an_event_loop_that_could_not_run(qtbot):
    """The window times its own event loop while the lanes run: a loop held for 1.2 s shows as a tick that late,
    and the window then says the lanes starved it."""
    from app.core.events import LaneStarted
    from app.ui.load import LoadMeter, load_notes

    m = LoadMeter(tick_ms=50)
    m.on_event(LaneStarted("L1", "baseline", "p", 0, (1,), "x"), time.monotonic())
    qtbot.wait(200)
    time.sleep(1.2)  # the GUI thread is busy: no tick can run
    qtbot.wait(200)
    m.finish(None)
    n = len(m.lags_ms)
    qtbot.wait(150)
    assert len(m.lags_ms) == n  # stopped with the run
    load = m.measure([], cores=2)
    assert load["lag_max_ms"] >= 1100 and load["lag_ticks"] >= 4
    notes = load_notes(None, 2, load["lag_max_ms"], "idle")
    assert notes and notes[-1][0].startswith("the window lagged up to 1.")
    assert "SPECDECK_GUI_PRIORITY=idle" in notes[-1][1]


@pytest.mark.parametrize("wait, gui, said", [(7.0, 3.0, "the lanes waited for a CPU 7% of their time"), (2.0, 12.0, None),
                                             (None, 12.0, "the window used 12% of a core")])
def test_the_lanes_own_cpu_wait_decides_the_note(wait, gui, said):
    """Where the worker measured how long the lanes waited for a CPU, that decides (not the window's CPU use)."""
    from app.ui.load import load_notes

    notes = load_notes(gui, 2, lanes_wait_pct=wait)
    assert [h for h, _ in notes] == ([said] if said else [])
    if said and wait is not None:
        assert f"the window used {gui:.0f}% of a core" in notes[0][1] and "bench" in notes[0][1]


def test_during_a_run_steps_wait_for_the_next_frame(qtbot):
    """While batching, a step does not wake the GUI thread: it is delivered by the next frame's pump(); a run's end
    and the worker's death still come at once."""
    from app.ui.bridge import WorkerBridge
    from app.worker.messages import RunFinished

    b = WorkerBridge()
    got = []
    b.event.connect(lambda ev, t: got.append(ev))
    b.set_batching(True)
    b._on_event(make_step("L1", 0))  # as the draining thread does
    qtbot.wait(100)
    assert got == []
    b.pump()
    assert len(got) == 1
    b._on_event(make_step("L1", 1))
    b._on_event(RunFinished("run1"))  # not batched: wakes the GUI thread, and the step before it goes too
    qtbot.waitUntil(lambda: len(got) == 3, timeout=2000)
    assert isinstance(got[-1], RunFinished)
    b._on_event(make_step("L1", 2))
    b.set_batching(False)  # the run ended: what waits goes out now
    assert len(got) == 4


def test_frames_are_slower_on_a_machine_with_few_cores(qtbot, monkeypatch):
    from app.ui.run_controller import FEW_CORES_FRAME_MS, FRAME_MS, frame_ms

    assert frame_ms(cores=2) == FEW_CORES_FRAME_MS == 250 and frame_ms(cores=16) == FRAME_MS == 50
    from app.ui import plots as P

    monkeypatch.setattr("app.ui.load.cpu_cores", lambda: 2)
    few = P.PlotPanel()
    qtbot.addWidget(few)
    monkeypatch.setattr("app.ui.load.cpu_cores", lambda: 32)
    many = P.PlotPanel()
    qtbot.addWidget(many)
    assert (few.interval_ms, few.frame_budget) == (P.FEW_CORES_INTERVAL_MS, P.FEW_CORES_FRAME_BUDGET) == (2000, 0.01)
    assert (many.interval_ms, many.frame_budget) == (P.RUN_INTERVAL_MS, P.FRAME_BUDGET)


def test_new_lane_text_repaints_the_lane_not_the_window(qtbot, win):
    """A lane's text area and the lane itself are opaque: a frame of new tokens repaints the text, not the lanes
    area and the window beneath it (with a style sheet on the text area it repainted the whole window each frame)."""
    from PySide6.QtCore import QEvent, QObject, QPoint, QRect

    from app.core.events import LaneStarted

    _start(qtbot, win)
    for i, s in enumerate(SETUPS):
        win.bridge.feed(LaneStarted(f"L{i + 1}", s, "custom", 0, (1,), "x"))
    qtbot.wait(300)
    painted: dict[str, int] = {}

    class Count(QObject):
        def eventFilter(self, obj, ev):
            if ev.type() == QEvent.Type.Paint:
                painted[obj.objectName() or type(obj).__name__] = painted.get(obj.objectName() or type(obj).__name__, 0) + 1
                if obj is win:
                    window_rects.append(ev.rect())
            return False

    window_rects: list = []

    f = Count()
    view = win.lane_by_id["L1"]
    for w in (win, win.lanes, view, view.text.viewport()):
        w.installEventFilter(f)
    for n in range(10):
        win.bridge.feed(make_step("L1", n))
        qtbot.wait(120)
    assert painted.get("qt_scrollarea_viewport", 0) >= 3  # the text did repaint
    lanes_rect = QRect(win.lanes.mapTo(win, QPoint(0, 0)), win.lanes.size())
    assert painted.get("LanesArea", 0) == 0, painted
    # the lane itself repaints for its status chip as the lane starts running, not under every frame of text, and
    # not for its header's figures either: the title and figures labels are opaque (transparent, every new figure
    # repainted the lane beneath them: 4 lane paints in 1.2 s)
    assert painted.get("LaneView", 0) <= 2, painted
    assert not [r for r in window_rects if r.intersects(lanes_rect)], (window_rects, lanes_rect)


def test_on_few_cores_the_plot_view_is_held_between_redraws(qtbot, win, monkeypatch):
    """During a run on a machine with few cores the plot view paints right after a redraw and is held between them
    (its items asked for two or three repaints per redraw); the mouse over the plots releases it, the run's end too."""
    from PySide6.QtCore import QEvent, QPointF
    from PySide6.QtGui import QEnterEvent
    from PySide6.QtWidgets import QApplication

    from app.core.events import LaneDone, LaneStarted
    from app.ui import plots as plots_module
    from app.ui.plots import HOLD_AFTER_MS
    from app.worker.messages import RunFinished

    plots = win.plots
    plots.hold_between_redraws = True
    monkeypatch.setattr(plots_module, "HOLD_AFTER_MS", 60_000)  # only the redraw's own paint may hold it again
    rid = _start(qtbot, win)
    win.bridge.feed(LaneStarted("L1", SETUPS[0], "custom", 0, (1,), "x"))
    for i in range(20):
        win.bridge.feed(make_step("L1", i))
    r0, p0 = plots.redraws, plots.paints
    plots.redraw(force=True)
    qtbot.waitUntil(lambda: plots.paints > p0, timeout=2000)  # the redraw is painted…
    QApplication.processEvents()
    # …and the view is held as soon as it was painted (held HOLD_AFTER_MS later, pyqtgraph's items got a second,
    # partial paint in between: two paints per redraw)
    assert not plots.glw.updatesEnabled()
    assert plots.redraws == r0 + 1
    held = plots.paints
    for i in range(20, 40):
        win.bridge.feed(make_step("L1", i))
    plots.glw.update()
    qtbot.wait(200)
    assert plots.paints == held  # nothing painted while held
    vp = plots.glw.viewport()
    QApplication.sendEvent(vp, QEnterEvent(QPointF(5, 5), QPointF(5, 5), QPointF(5, 5)))
    assert plots.glw.updatesEnabled()  # the user looks at the plots: live again
    QApplication.sendEvent(vp, QEvent(QEvent.Type.Leave))
    for lid, s in zip(("L1", "L2", "L3"), SETUPS, strict=True):
        win.bridge.feed(LaneDone(lid, make_stats(s, (1, 2, 3), 1.0)))
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(RunFinished(rid))
    qtbot.wait(HOLD_AFTER_MS + 100)
    assert plots.glw.updatesEnabled()  # the run ended: never held between runs


def test_a_lanes_scroll_bar_is_held_during_a_run_on_few_cores(qtbot, win, monkeypatch):
    """On a machine with few cores a lane's scroll bar is not repainted while tokens arrive (each new line moved its
    thumb and refilled its tall groove on the lanes' cores): held from the frame after it appeared, still painted once
    every SCROLLBAR_REFRESH_S, released by the mouse over the lane and at the run's end; on many cores never held."""
    from PySide6.QtCore import QEvent, QPointF
    from PySide6.QtGui import QEnterEvent
    from PySide6.QtWidgets import QApplication

    from app.core.events import LaneDone, LaneStarted
    from app.ui import lane_view
    from app.worker.messages import RunFinished

    monkeypatch.setattr("app.ui.load.cpu_cores", lambda: 2)
    monkeypatch.setattr(lane_view, "SCROLLBAR_REFRESH_S", 60.0)  # no refresh within the test (checked below)
    rid = _start(qtbot, win)
    for i, s in enumerate(SETUPS):
        win.bridge.feed(LaneStarted(f"L{i + 1}", s, "custom", 0, (1,), "x"))
    view = win.lane_by_id["L1"]
    sb = view.text.verticalScrollBar()
    lines = tuple(f"line {i}\n" for i in range(8))
    n = 0
    while not sb.isVisible() and n < 60:  # until the text overflows the lane
        win.bridge.feed(make_step("L1", n, pieces=lines))
        n += 1
        qtbot.wait(30)
    assert sb.isVisible() and sb.maximum() > 0
    for i in range(n, n + 3):  # the next frames hold it
        win.bridge.feed(make_step("L1", i, pieces=lines))
        qtbot.wait(250)
    assert not sb.updatesEnabled()
    assert sb.value() == sb.maximum()  # still following the text
    QApplication.sendEvent(view, QEnterEvent(QPointF(5, 5), QPointF(5, 5), QPointF(5, 5)))
    assert sb.updatesEnabled()  # the user looks at the lane: the bar is live
    win.bridge.feed(make_step("L1", n + 3, pieces=lines))
    qtbot.wait(250)
    assert sb.updatesEnabled()  # …and stays live under the mouse
    QApplication.sendEvent(view, QEvent(QEvent.Type.Leave))
    win.bridge.feed(make_step("L1", n + 4, pieces=lines))
    qtbot.wait(250)
    assert not sb.updatesEnabled()
    # still repainted now and then while held: released for one frame every SCROLLBAR_REFRESH_S
    monkeypatch.setattr(lane_view, "SCROLLBAR_REFRESH_S", 0.5)
    seen = []
    for i in range(n + 5, n + 17):
        win.bridge.feed(make_step("L1", i, pieces=lines))
        qtbot.wait(110)
        seen.append(sb.updatesEnabled())
    assert any(seen) and seen.count(True) <= len(seen) // 2, seen
    win.bridge.feed(LaneDone("L1", make_stats(SETUPS[0], (1, 2, 3), 1.0)))
    assert sb.updatesEnabled()  # the lane ended (no more text): its bar is painted where it stopped
    for lid, s in zip(("L2", "L3"), SETUPS[1:], strict=True):
        win.bridge.feed(LaneDone(lid, make_stats(s, (1, 2, 3), 1.0)))
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(RunFinished(rid))
    assert sb.updatesEnabled()  # the run ended: never held between runs

    monkeypatch.setattr("app.ui.load.cpu_cores", lambda: 16)
    _start(qtbot, win)
    win.bridge.feed(LaneStarted("L1", SETUPS[0], "custom", 0, (1,), "x"))
    view = win.lane_by_id["L1"]
    for i in range(40):
        win.bridge.feed(make_step("L1", i, pieces=lines))
    qtbot.wait(300)
    assert view.text.verticalScrollBar().isVisible() and view.text.verticalScrollBar().updatesEnabled()


def test_gui_cost_replays_a_run_into_the_window_and_reports_its_cpu():
    """resources/bench/gui_cost.py (the steady measure of the window's own CPU while lanes run) drives the real
    window with a replayed three-lane run and prints the window's CPU for each round."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "resources" / "bench" / "gui_cost.py"
    r = subprocess.run([sys.executable, str(script), "--tokens", "12", "--rounds", "2", "--platform", "offscreen"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert r.returncode == 0, r.stderr[-3000:]
    rounds = re.findall(r"round \d: lanes ([\d.]+) s · window main thread ([\d.]+) % of a core · whole process ([\d.]+) %", r.stdout)
    assert len(rounds) == 2, r.stdout
    for secs, main_pct, proc_pct in rounds:
        # 12 tokens a lane at 22, 26 and 20 tok/s: about 1.6 s of lanes
        assert 1.0 < float(secs) < 10.0 and 0.0 <= float(main_pct) <= float(proc_pct) + 1.0 < 100.0, r.stdout
    woke = re.findall(r"wake-ups a second .*: main thread (\d+) · Qt pool threads (\d+) · other threads (\d+)", r.stdout)
    assert len(woke) == 2, r.stdout
    from app.ui.load import few_cores

    for main, pool, _other in woke:
        assert int(main) >= 1, r.stdout  # the frame timer alone wakes it 4–20 times a second
        if few_cores():  # like CI's 2 cores: Qt's painting stays on the window's own threads
            assert int(pool) == 0, r.stdout


def test_gui_vs_headless_pairs_each_round_and_says_what_the_rounds_show(tmp_path):
    """resources/bench/gui_vs_headless.py --reports DIR: each round's GUI run is compared with its own headless run
    (the machine's drift between rounds cancels), with a bootstrapped interval and a verdict on "within 5 %" that
    says when the rounds cannot decide it."""
    import importlib.util
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "resources" / "bench" / "gui_vs_headless.py"
    spec = importlib.util.spec_from_file_location("gui_vs_headless", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    med, lo, hi = mod.paired_summary([0.97, 0.98, 0.99, 0.98, 0.97, 0.99])
    assert lo <= med <= hi and lo >= 0.95 and mod.verdict(lo, hi) == "within 5 % of headless"
    assert mod.verdict(*mod.paired_summary([0.90, 0.91, 0.92, 0.90])[1:]) == "more than 5 % slower than headless"
    assert mod.verdict(*mod.paired_summary([0.90, 1.00, 0.93, 0.99, 0.96])[1:]).startswith("not decided")
    assert mod.paired_summary([0.90, 1.00, 0.93]) == mod.paired_summary([0.90, 1.00, 0.93])  # seeded: reproducible
    assert mod.paired_summary([0.95]) == (0.95, 0.95, 0.95)  # one round: nothing to resample

    # each round pooled over its setups (geometric mean); a setup missing on one side leaves that round's others
    pooled = mod.pooled_round_ratios({"a": {0: 10.0, 1: 10.0}, "b": {0: 20.0, 1: 20.0}},
                                     {"a": {0: 9.0, 1: 8.0}, "b": {0: 10.0}})
    assert pooled == pytest.approx({0: (0.9 * 0.5) ** 0.5, 1: 0.8})
    assert mod.round_wait_increments({"a": {0: 1.0, 1: 1.0}, "b": {0: 2.0}}, {"a": {0: 4.0, 1: 3.0}, "b": {0: 3.0}}) == {0: 2.0, 1: 2.0}

    # the machine slows down round by round; the GUI run of each round is 2 % below its headless run for the
    # baseline, 4 % for the n-gram lane
    for rnd, speed in enumerate((20.0, 18.0, 16.0, 14.0)):
        for kind, f, f2 in (("bench", 1.0, 1.0), ("xvfb", 0.98, 0.96)):
            doc = {"runs": [{"setup": "baseline", "tokens_per_s": speed * f}, {"setup": "ngram", "tokens_per_s": 1.5 * speed * f2}],
                   "summary": [{"setup": "baseline", "cpu_wait_share": 0.01 if kind == "bench" else 0.03}]}
            if kind == "xvfb":
                doc["gui"] = {"load": {"gui_cpu_pct": 3.0, "worker_cpu_pct": 190.0, "lag_max_ms": 120.0}}
            (tmp_path / f"{kind}-{rnd}.json").write_text(json.dumps(doc), encoding="utf-8")
    r = subprocess.run([sys.executable, str(script), "--reports", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("xvfb baseline:"))
    assert "GUI/headless 0.980" in line and "4 pairs" in line and "+2.0 points" in line and "within 5 % of headless" in line, line
    pooled_line = next(x for x in r.stdout.splitlines() if x.strip().startswith("xvfb all setups"))
    assert "GUI/headless 0.970" in pooled_line and "4 rounds" in pooled_line and "within 5 % of headless" in pooled_line, pooled_line
    rounds_line = r.stdout.splitlines()[r.stdout.splitlines().index(pooled_line) + 2]
    assert [x.strip() for x in rounds_line.split(",")] == ["0.970 +2.0"] * 4, rounds_line  # each round's pooled ratio beside its extra wait
    assert "xvfb/headless" in r.stdout  # the side-by-side table too


def _live_vs_frozen():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "resources" / "bench" / "gui_live_vs_frozen.py"
    spec = importlib.util.spec_from_file_location("gui_live_vs_frozen", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return script, mod


def test_live_vs_frozen_alternates_the_passes_and_pools_each_pair():
    """resources/bench/gui_live_vs_frozen.py: after a warm-up, pairs alternate which mode goes first (a steady drift
    of the machine cancels); each pair pools its setups (geometric mean of live / frozen); a pair cut short is left
    out and a pair of two passes of one mode is an error."""
    _, mod = _live_vs_frozen()
    assert mod.pass_order(3) == ["warm-up", "live", "frozen", "frozen", "live", "live", "frozen"]
    passes = [("warm-up", {"a": 1.0}), ("live", {"a": 9.0, "b": 18.0}), ("frozen", {"a": 10.0, "b": 20.0}),
              ("frozen", {"a": 10.0}), ("live", {"a": 11.0, "b": 5.0}), ("live", {"a": 1.0})]
    assert mod.pair_ratios(passes) == pytest.approx([0.9, 1.1])  # b left out of the 2nd pair: no frozen figure
    with pytest.raises(ValueError, match="one live and one frozen"):
        mod.pair_ratios([("live", {"a": 1.0}), ("live", {"a": 1.0})])


def test_live_vs_frozen_says_what_is_wrong_with_a_bad_setup():
    """A setup the window refuses: exit 1 with one error line naming the options to check, before any model loads."""
    import os
    import subprocess
    import sys

    script, _ = _live_vs_frozen()
    r = subprocess.run([sys.executable, str(script), "--setup", "nonsense:x", "--platform", "offscreen"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "unknown method 'nonsense'" in errors[0] and "check --target, --setup" in errors[0], r.stderr


@pytest.mark.slow
def test_live_vs_frozen_runs_real_lanes_and_the_frozen_window_runs_nothing(tiny_pair):
    """The script end to end (offscreen) on a real worker with tiny models: a warm-up pass, then one live and one
    frozen pass of the same lanes. In the frozen pass the window's event loop did not run while the lanes ran (no tick
    of its load meter, or one or two on a loaded machine); in the live pass it ran all along; the summary says one
    pair is too few for an interval."""
    import os
    import re
    import subprocess
    import sys

    script, _ = _live_vs_frozen()
    target, _ = tiny_pair
    r = subprocess.run([sys.executable, str(script), "--target", str(target), "--setup", "baseline", "--setup", "ngram:n=2,k=4",
                        "--prompt", "Tell a story.", "--max-new-tokens", "200", "--pairs", "1", "--platform", "offscreen"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    passes = re.findall(r"pass +\d+ +(warm-up|live|frozen): baseline ([\d.]+), ngram:n=2,k=4 ([\d.]+) tok/s .* event-loop ticks (\d+) "
                        r"in ([\d.]+) s", r.stdout)
    assert [p[0] for p in passes] == ["warm-up", "live", "frozen"], r.stdout
    assert all(float(p[1]) > 0 and float(p[2]) > 0 for p in passes), r.stdout
    ticks = {p[0]: int(p[3]) for p in passes}
    secs = {p[0]: float(p[4]) for p in passes}
    # frozen: 0 on a quiet machine; on a loaded one the window may run a tick while it draws the frozen pass's backlog,
    # between the lanes' last events. live: the loop ran all along — a tick every LAG_TICK_MS of the pass, or at least
    # a good share of them on a loaded machine (late ticks are counted once) — however fast the lanes were
    from app.ui.load import LAG_TICK_MS

    assert ticks["frozen"] <= 2 and ticks["live"] >= 2, r.stdout
    assert ticks["live"] >= 0.3 * (secs["live"] - 1.0) * 1000 / LAG_TICK_MS, r.stdout  # the pass's time includes its prefill
    assert re.search(r"live / frozen [\d.]+ \(1 pair: too few for an interval", r.stdout), r.stdout
