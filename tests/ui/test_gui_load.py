"""The window takes as little CPU as it can from the lanes it measures (they share the machine's cores): plots at
most 10 Hz and lane text at most 20 Hz during a run, per-step plot figures computed once (not per frame over the
whole history), axes cached and ranges grown in steps, live plots that can be switched off; and it says when its
own CPU use may have slowed the lanes."""

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
    from app.ui.plots import _ALPHA, _RATE, PlotPanel
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
    np.testing.assert_allclose(v[:, _RATE], rate)
    np.testing.assert_allclose(v[:, _ALPHA], alpha)


def test_during_a_run_plots_draw_at_most_10_hz_and_lane_text_at_most_20_hz(qtbot, win):
    from PySide6.QtWidgets import QGraphicsItem

    from app.core.events import LaneStarted
    from app.ui.lanes_area import FRAME_MS, HEADER_HZ
    from app.ui.plots import RUN_INTERVAL_MS

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
    while time.monotonic() - t0 < 2.0:  # ~200 steps a second: far more than a CPU model makes
        n += 1
        win.bridge.feed(make_step(f"L{n % 3 + 1}", n // 3, t_s=n * 0.005))
        qtbot.wait(5)
    elapsed = time.monotonic() - t0
    assert plots.redraws - r0 <= 10 * elapsed + 2, (plots.redraws - r0, elapsed)
    assert lanes.frames - f0 <= 20 * elapsed + 2, (lanes.frames - f0, elapsed)
    assert len(headers) <= HEADER_HZ * elapsed + 2
    assert plots.redraws - r0 >= 3 and lanes.frames - f0 >= 3  # and they do draw
    for p in (plots.p_tps, plots.p_alpha, plots.p_pos, plots.p_sys):
        for ax in ("left", "bottom"):
            assert p.getAxis(ax).cacheMode() == QGraphicsItem.CacheMode.DeviceCoordinateCache
    # ranges grow in steps: the x axis was set a handful of times, not once a frame
    lo, hi = plots.p_tps.viewRange()[0]
    assert lo == -1.0 and hi in (5.0, 7.5, 10.0)


def test_live_plots_off_draws_once_at_the_end(qtbot, win):
    from app.core.events import RunDone
    from app.worker.messages import RunFinished

    win.live_plots_action.setChecked(False)
    rid = _start(qtbot, win)
    r0 = win.plots.redraws
    for i in range(40):
        win.bridge.feed(make_step("L1", i))
        qtbot.wait(10)
    assert win.plots.redraws == r0 and win.plots.buffer_len("L1") == 40  # the data is kept
    for lid, s in zip(("L1", "L2", "L3"), SETUPS, strict=True):
        win.bridge.feed(RunDone(lid, make_stats(s, (1, 2, 3), 1.0)))
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
    from app.ui.load import load_note

    note = load_note(gui, cores)
    assert bool(note) == said
    if said:
        assert note.startswith(f"the window used {gui:.0f}% of a core during the run; on {cores} cores that can slow the lanes")
        assert "Live plots" in note and "bench" in note


def test_the_window_says_when_its_own_load_may_have_slowed_the_lanes(qtbot, win, monkeypatch):
    from app.core.events import LaneStarted, RunDone
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
        win.bridge.feed(RunDone(lid, make_stats(s, (1, 2, 3), 1.0)))
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
