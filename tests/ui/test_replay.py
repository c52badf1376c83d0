"""Replays in the window (real widgets, a recorded run made here: no worker, no model): at 4x a run takes about a
quarter of its recorded time and ends as it ended; Stop ends a replay where it is; a run file that cannot be shown
leaves the window as it was and says why; a live run after a replay is live again."""

from __future__ import annotations

import time

import numpy as np
import pytest

from app.ui.results import COLUMNS, run_winner

from .helpers import SETUPS, expected_runs, make_stats, make_step


def _no_worker(*a, **k):
    raise AssertionError("a replay needs no worker")


@pytest.fixture
def window(qtbot, settings):
    from app.core.setups import Sampling
    from app.ui.main_window import MainWindow
    from app.ui.session import Session

    s = Session(target="smollm2-135m-instruct", setups=("baseline",), prompt="Write a poem.", sampling=Sampling(max_new_tokens=4))
    w = MainWindow(settings=settings, session=s, statuses=[], telemetry=False, client_factory=_no_worker)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    yield w
    w.shutdown()


def _record(duration: float = 2.0, steps: int = 8, label: str = "H200"):
    """Three lanes racing for `duration` seconds, `steps` steps each, then done (baseline, n-gram, draft)."""
    from app.core.events import LaneDone, LaneStarted
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.worker.plan import RunPlan
    from app.worker.runfile import RunRecorder

    plan = RunPlan("smollm2-135m-instruct", SETUPS, (Prompt("custom", "Write a poem."),), Sampling(max_new_tokens=64),
                   mode="interleaved", run_id="rec")
    rec = RunRecorder(plan, machine={"label": label, "cpu": "test"}, t0=0.0)
    events = {}
    for i, lid in enumerate(("L1", "L2", "L3")):
        rec.event(LaneStarted(lid, SETUPS[i], "custom", 0, (1, 2), "Write a poem."), 0.05)
    for s in range(steps):
        for i, lid in enumerate(("L1", "L2", "L3")):
            ev = make_step(lid, s, drafted=(3, 4, 5) if i else (), accepted=2 if i else 0, t_s=(s + 1) * duration / steps * 0.9)
            events.setdefault(lid, []).append(ev)
            rec.event(ev, 0.1 + s * duration / steps * 0.8 + i * 0.01)
    for i, lid in enumerate(("L1", "L2", "L3")):
        ids = tuple(x for e in events[lid] for x in e.emitted_ids)
        wall = duration * 0.9 / (1 + i)  # the speculative lanes faster than the baseline: speedups 1x, 2x, 3x
        st = make_stats(SETUPS[i], ids, wall_s=wall, drafted=3 * steps if i else 0, accepted=2 * steps if i else 0)
        rec.event(LaneDone(lid, st), duration * 0.95)
    rec.finish({"summary": [{"setup": "baseline"}], "gui": {"load": {"note": ""}}}, (), t_end=duration)
    return rec.record(), events


def test_a_4x_replay_keeps_a_quarter_of_the_pace_and_ends_as_the_run_ended(qtbot, window):
    r, events = _record(duration=2.0)
    with qtbot.waitSignal(window.runEnded, timeout=5000):
        window.show_record(r, None, 0.0)
    at_once = {lid: v.document_runs() for lid, v in window.lane_by_id.items()}
    assert all(at_once[lid] == expected_runs(events[lid]) for lid in events)
    t0 = time.monotonic()
    with qtbot.waitSignal(window.runEnded, timeout=30_000):
        window.replay(4.0)
        assert window.running and not window.run_btn.isEnabled() and window.stop_btn.isEnabled()
    took = time.monotonic() - t0
    assert took >= 2.0 / 4 - 0.05  # its recorded pace, 4x: not at once (a loaded machine may only be later)
    assert {lid: v.document_runs() for lid, v in window.lane_by_id.items()} == at_once
    assert window.results.table.rowCount() == 3 and "H200" in window.status_label.text()


def test_stop_ends_a_replay_where_it_is(qtbot, window):
    r, events = _record(duration=6.0)
    with qtbot.waitSignal(window.runStarted, timeout=5000):
        window.show_record(r, None, 1.0)
    qtbot.waitUntil(lambda: window.plots.buffer_len("L1") >= 2, timeout=10_000)
    with qtbot.waitSignal(window.runEnded, timeout=5000):
        window.stop()
    assert window.controller.results.stopped and not window.controller.results.by_lane()  # no lane had finished
    assert window.plots.buffer_len("L1") < len(events["L1"])
    assert window.replay_btn.isEnabled() and not window.running


def test_a_run_file_that_cannot_be_shown_leaves_the_window_as_it_was(qtbot, window, tmp_path):
    from app.worker.runfile import save

    r, _ = _record(duration=0.5)
    good = save(r, tmp_path / "good.specdeck")
    with qtbot.waitSignal(window.runEnded, timeout=5000):
        assert window.open_run(str(good))
    before = ({lid: v.document_runs() for lid, v in window.lane_by_id.items()}, window.windowTitle(), window.setups())
    bad = tmp_path / "bad.specdeck"
    bad.write_bytes(good.read_bytes()[:100])
    assert not window.open_run(str(bad))
    assert "damaged run file" in window.status_label.text() and str(bad) in window.status_label.text()
    assert ({lid: v.document_runs() for lid, v in window.lane_by_id.items()}, window.windowTitle(), window.setups()) == before


def test_the_window_says_its_icon_and_desktop_name(qapp):
    from app.ui.main import DESKTOP_ID, ICON, set_identity

    set_identity(qapp)
    assert qapp.desktopFileName() == DESKTOP_ID and not qapp.windowIcon().isNull() and ICON.is_file()
    assert qapp.windowIcon().pixmap(64, 64).width() == 64


def test_a_run_beside_another_races_with_it_and_ranks_against_its_own_baseline(qtbot, window, tmp_path):
    """A GPU run beside a laptop run: six lanes labelled with their machines, one Results table in which each lane's
    speedup is against its own run's baseline (the laptop's lanes are 4x slower, their speedups the same), both
    replayed from one start; a run with too many lanes is refused with the window left as it was."""
    from app.worker.runfile import beside, save

    gpu, _ = _record(duration=1.0, label="H200")
    laptop, _ = _record(duration=4.0, label="laptop")
    gpu_path, laptop_path = save(gpu, tmp_path / "h200.specdeck"), save(laptop, tmp_path / "laptop.specdeck")
    with qtbot.waitSignal(window.runEnded, timeout=5000):
        assert window.open_run(str(gpu_path))
    with qtbot.waitSignal(window.runEnded, timeout=5000):
        assert window.open_run_beside(str(laptop_path))
    sp = COLUMNS.index("speedup")
    rows = {window.results.table.item(r, 0).text(): window.results.table.item(r, sp).text() for r in range(window.results.table.rowCount())}
    assert len(rows) == 6 and {"Lane 4 · laptop", "Lane 1 · H200"} <= {k.lstrip("★ ") for k in rows}, rows
    speedups = sorted(rows.values())
    assert speedups == sorted(["1.00×", "2.00×", "3.00×"] * 2), rows  # each against its own baseline
    views = window.lane_by_id
    assert "H200" in views["L1"].title.text() and "laptop" in views["L4"].title.text() and len(views) == 6
    assert all(v.state == "done" for v in views.values())
    assert "laptop.specdeck" in window.windowTitle() and "beside" in window.windowTitle()
    # six lanes do not fit the setup panel (at most four): it keeps the user's lanes, and the status bar says so
    assert "the setup panel keeps your own lanes, not this run's (a session has 1 to 4 setups, got 6)" in window.status_label.text()
    t0 = time.monotonic()
    with qtbot.waitSignal(window.runEnded, timeout=30_000):
        window.replay(4.0)
    assert time.monotonic() - t0 >= 4.0 / 4 - 0.05  # the longer run's time sets the race's

    before = (window.windowTitle(), _table_text(window))
    save(beside(gpu, laptop), tmp_path / "six.specdeck")
    assert not window.open_run_beside(str(tmp_path / "h200.specdeck"))  # six lanes shown, three more make nine
    assert "6 + 3 lanes: at most 8 lanes" in window.status_label.text()
    assert (window.windowTitle(), _table_text(window)) == before


def _two_prompts():
    """A `bench --record` run of two prompts: baseline and n-gram on p1 (n-gram 4x the baseline), then on p2 (1.5x);
    the n-gram lane's steps read 'a…' on p1 and 'b…' on p2 (literal events and stats, a real run file)."""
    from app.core.events import LaneDone, LaneStarted
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.worker.plan import RunPlan
    from app.worker.runfile import RunRecorder

    plan = RunPlan("smollm2-135m-instruct", SETUPS[:2], (Prompt("p1", "One.", "coding"), Prompt("p2", "Two.", "math")),
                   Sampling(max_new_tokens=8), mode="paced", run_id="rec")
    rec = RunRecorder(plan, machine={"label": "laptop", "cpu": "test"}, t0=0.0)
    walls = {("p1", 0): 8.0, ("p1", 1): 2.0, ("p2", 0): 3.0, ("p2", 1): 2.0}
    steps = {}
    t = 0.0
    for p in plan.prompts:
        for i, setup in enumerate(plan.setups):
            lid = plan.lane_id(i, p)
            rec.event(LaneStarted(lid, setup, p.id, 0, (1, 2), p.prompt), t)
            c = "ab"[p.id == "p2"]
            if i:  # two steps of two kept drafts and the bonus: 3 4 7 3 4 7
                evs = [make_step(lid, s, drafted=(3, 4), accepted=2, pieces=(f"{c}{s}.0 ", f"{c}{s}.1 ", f"t{s} ")) for s in range(2)]
            else:  # the baseline: the same six tokens, one a step
                evs = [make_step(lid, s, target_id=x) for s, x in enumerate((3, 4, 7, 3, 4, 7))]
            for ev in evs:
                t += 0.01
                rec.event(ev, t)
            steps[lid] = evs
            ids = tuple(x for e in evs for x in e.emitted_ids)
            rec.event(LaneDone(lid, make_stats(setup, ids, walls[(p.id, i)], drafted=4 if i else 0, accepted=4 if i else 0,
                                               prompt_id=p.id)), t)
    rec.finish({"summary": [{"setup": "baseline"}]}, (), t_end=t + 0.1)
    return rec.record(), plan, steps


def test_a_run_of_several_prompts_shows_each_prompts_lanes_and_its_winner_over_all_of_them(qtbot, window, tmp_path):
    """A run file of two prompts (as `bench --record` saves a suite): the Results table has a row per lane per
    prompt, with the prompt, and names the winner over both prompts (Σ of the baseline's walls ÷ Σ of the lane's:
    11 s ÷ 4 s = 2.75×, not p1's 4×); the lanes show p1's lanes, and the prompt box switches them to p2's."""
    from app.worker.runfile import save

    rec, plan, steps = _two_prompts()
    with qtbot.waitSignal(window.runEnded, timeout=5000):
        assert window.open_run(str(save(rec, tmp_path / "suite.specdeck")))
    assert window.setups() == list(plan.setups) and "keeps your own lanes" not in window.status_label.text()
    table = window.results.table
    assert table.rowCount() == 4 and not table.isColumnHidden(COLUMNS.index("prompt"))
    prompts = sorted(table.item(r, COLUMNS.index("prompt")).text() for r in range(4))
    assert prompts == ["p1", "p1", "p2", "p2"]
    summary = window.results.summary.text()
    assert "wins over 2 prompts" in summary and "2.75× faster" in summary and "identical to baseline on 2 of 2" in summary, summary
    # the status bar's winner at a run's end (a replay's): the same lane, over both prompts
    assert run_winner(window.controller.plan, window.controller.results) == ("Lane 2", "ngram:n=3,k=8")
    box = window.lanes.prompt_box
    assert box.isVisibleTo(window) and [box.itemText(i) for i in range(box.count())] == ["p1 · coding", "p2 · math"]
    l1, l2 = (plan.lane_id(i, plan.prompts[0]) for i in range(2))
    assert set(window.lane_by_id) == {l1, l2} and window.lane_by_id[l2].document_runs() == expected_runs(steps[l2])
    box.setCurrentIndex(1)
    m1, m2 = (plan.lane_id(i, plan.prompts[1]) for i in range(2))
    assert set(window.lane_by_id) == {m1, m2}
    assert window.lane_by_id[m2].document_runs() == expected_runs(steps[m2]) and "b0.0" in window.lane_by_id[m2].text.toPlainText()
    assert all(v.state == "done" for v in window.lane_by_id.values())
    assert window.lane_by_id[m2].badge.text() == "✓ identical to baseline"
    box.setCurrentIndex(0)
    assert window.lane_by_id[l2].document_runs() == expected_runs(steps[l2])
    # the plots: one series per setup, its lanes one after another (not a series per lane and prompt)
    assert len(window.plots.lanes) == 2
    d = window.plots.lane_data(m2)
    assert len(d) == 4 and d[-1, 2] == 12 and (np.diff(d[:, 1]) > 0).all()  # 4 steps, 12 tokens, one clock end to end
    assert np.isfinite(d[:, 5]).all() and (d[:, 5] > 0).all()  # tokens/s at every step, the second lane's first too


def test_a_run_of_one_prompt_has_no_prompt_box_or_column(qtbot, window):
    r, _ = _record(duration=0.5)
    with qtbot.waitSignal(window.runEnded, timeout=5000):
        window.show_record(r, None, 0.0)
    assert not window.lanes.prompt_box.isVisibleTo(window) and window.results.table.isColumnHidden(COLUMNS.index("prompt"))
    assert "wins:" in window.results.summary.text() and "3.00× faster" in window.results.summary.text()


def _table_text(w) -> list[list[str]]:
    t = w.results.table
    return [[t.item(r, c).text() for c in range(t.columnCount()) if t.item(r, c)] for r in range(t.rowCount())]


def test_presentation_mode_is_large_full_screen_and_remembered(qtbot, window, settings):
    """F11: full screen, the setup panel and menu hidden, lane text ≥ 24 px, one tokens/s plot; Ctrl+= grows the text
    and is remembered by the next window; Ctrl+R replays and Esc stops from the keyboard; F11 again restores."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from app.ui.main_window import MainWindow

    r, _ = _record(duration=6.0)
    with qtbot.waitSignal(window.runEnded, timeout=5000):
        window.show_record(r, None, 0.0)
    size_before = window.size()
    QTest.keyClick(window, Qt.Key.Key_F11)
    assert window.presenting and window.isFullScreen() and not window.setup_dock.isVisible() and not window.menuBar().isVisible()
    assert all(v.text_px() >= 24 for v in window.lane_views)
    assert window.plots.presenting_px and not window.plots.p_alpha.isVisible() and window.plots.p_tps.isVisible()
    px = window.lane_views[0].text_px()
    QTest.keyClick(window, Qt.Key.Key_Equal, Qt.KeyboardModifier.ControlModifier)
    assert window.lane_views[0].text_px() > px and window.results.table.font().pixelSize() > 20
    with qtbot.waitSignal(window.runStarted, timeout=5000):
        QTest.keyClick(window, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    assert window.running and window.controller.replaying is not None
    with qtbot.waitSignal(window.runEnded, timeout=5000):
        QTest.keyClick(window, Qt.Key.Key_Escape)
    QTest.keyClick(window, Qt.Key.Key_F11)
    assert not window.presenting and window.setup_dock.isVisible() and window.menuBar().isVisible()
    assert window.lane_views[0].text_px() < 24 and window.plots.p_alpha.isVisible() and window.size() == size_before
    window.save_settings()
    again = MainWindow(settings=settings, statuses=[], telemetry=False, client_factory=_no_worker)
    qtbot.addWidget(again)
    again.present(True)
    try:
        assert window.present_zoom > 1.0 and again.present_zoom == pytest.approx(window.present_zoom)
        assert again.lane_views[0].text_px() > px
    finally:
        again.present(False)
        again.shutdown()


def test_a_4_lane_500_token_run_file_is_well_under_a_megabyte(tmp_path):
    """Four lanes of 500 tokens, every step as the worker sends it (ids, pieces, drafted and rejected tokens, both
    sides' probabilities with all their digits, a k=auto reason), ten minutes of telemetry at 2 Hz: ~0.3 MB."""
    import random

    from app.core.events import LaneDone, LaneStarted, StepEvent
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.worker.plan import RunPlan
    from app.worker.runfile import RunRecorder, save

    rnd = random.Random(0)
    words = ["def", " is", "_pal", "indrome", "(s", ":", " str", ")", " ->", " bool", ":\n", "    ", "return", " s", " ==", "[::-1]"]
    setups = ("baseline", "ngram:n=3,k=8", "draft:tiny-draft,k=4", "draft:tiny-draft,k=auto")
    plan = RunPlan("smollm2-135m-instruct", setups, (Prompt("custom", "Write a poem."),), Sampling(max_new_tokens=500))
    rec = RunRecorder(plan, machine={"label": "H200"}, t0=0.0)
    t = 0.0
    for i, setup in enumerate(setups):
        lid = f"L{i + 1}"
        rec.event(LaneStarted(lid, setup, "custom", 0, tuple(range(40)), "Write a poem.", "smollm2 · hf · float32"), t)
        n = step = 0
        while n < 500:
            k = 0 if i == 0 else 4
            a = min(rnd.randint(0, k), 499 - n)
            ids = tuple(rnd.randrange(49152) for _ in range(a + 1))
            t += 0.05
            rec.event(StepEvent(lid, step, tuple(rnd.randrange(49152) for _ in range(k)), a, ids[-1], "correction" if k else "baseline",
                                0.01 * rnd.random(), 0.04 * rnd.random(), 0.05, ids, tuple(rnd.choice(words) for _ in ids),
                                tuple(rnd.choice(words) for _ in range(k - a)), tuple(rnd.random() for _ in range(k)) or None,
                                tuple(rnd.random() for _ in range(a + 1)), t, None,
                                f"k={k}: predicted {rnd.random() * 3:.2f} tok/step" if i == 3 else ""), t)
            n += len(ids)
            step += 1
        rec.event(LaneDone(lid, make_stats(setup, tuple(range(500)), wall_s=t)), t)
    samples = [_sample(x * 0.5) for x in range(1200)]
    rec.finish({"summary": []}, samples, t_end=t)
    path = save(rec.record(), tmp_path / "big.specdeck")
    assert sum(len(ev.emitted_ids) for _, ev in rec.events if isinstance(ev, StepEvent)) >= 2000
    assert path.stat().st_size < 500_000, path.stat().st_size


def _sample(t: float):
    from app.telemetry.samples import HostSample, ProcSample, TelemetrySample

    return TelemetrySample(t=1.7e9 + t, t_mono=t, gpus=(), gpu_state="No NVIDIA GPU — showing CPU",
                           host=HostSample(cpu_pct=50.0 + t % 7, procs=(ProcSample(1, "gui", 3.0 + t % 3, 400.0), ProcSample(2, "worker", 190.0, 1200.5))))


def test_a_lane_waiting_on_its_server_shows_the_wait_until_tokens_come(qtbot, window):
    """A remote lane's wait notice (app.runners.openai_stream) shows on that lane, not the others, and goes with its
    next step."""
    from app.core.events import LogEvent
    from app.worker.plan import RunResults

    r, events = _record(duration=0.5)
    lanes = window.lanes
    lanes.start_run(r.plan, RunResults(r.plan))
    wait = LogEvent("warning", "engine srv: nothing from the server for 20 s; SpecDeck gives up at timeout_s = 120 (…)",
                    {"lane": "L2", "waiting_s": 20})
    lanes.on_event(wait, 0.0)
    assert lanes.by_id["L2"].notice.isVisibleTo(lanes.by_id["L2"]) and "timeout_s = 120" in lanes.by_id["L2"].notice.text()
    assert not lanes.by_id["L1"].notice.isVisibleTo(lanes.by_id["L1"])
    lanes.on_event(events["L2"][0], 0.1)
    assert not lanes.by_id["L2"].notice.isVisibleTo(lanes.by_id["L2"])


def test_a_lane_that_missed_prompts_is_pooled_over_those_it_finished_and_says_so(qtbot):
    """Lane 3 failed on p2: it does not win on p1 alone (4x there); the lane that finished both prompts wins, and
    Lane 3's pooled speedup, over p1 only, says so."""
    from app.ui.results import ResultsPanel

    panel = ResultsPanel()
    qtbot.addWidget(panel)
    st = [("Lane 1", "#000", make_stats("baseline", (1, 2), 4.0, prompt_id="p1")), ("Lane 1", "#000", make_stats("baseline", (1, 2), 4.0, prompt_id="p2")),
          ("Lane 2", "#111", make_stats(SETUPS[1], (1, 2), 2.0, prompt_id="p1")), ("Lane 2", "#111", make_stats(SETUPS[1], (1, 2), 2.0, prompt_id="p2")),
          ("Lane 3", "#222", make_stats(SETUPS[2], (1, 2), 1.0, prompt_id="p1"))]
    panel.set_results(st)
    text = panel.summary.text()
    assert "Lane 2</b> <code>ngram:n=3,k=8</code> wins over 2 prompts: <b>2.00× faster</b> than baseline (Σ" in text, text
    assert "Then <b style='color:#222'>Lane 3</b> 4.00× (on 1 of 2)." in text
