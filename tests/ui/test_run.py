"""The real window with a real worker process and tiny random models (SmolLM2 tokenizer): lanes fill with
tokens whose kinds match the StepEvents, a bad lane fails alone, Stop cancels, JSON export follows the bench
schema, a killed worker is reported and restarted by the next Run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from .helpers import expected_runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def win(qapp, tiny_pair, tmp_path_factory):
    from PySide6.QtCore import QSettings

    from app.core.events import StepEvent
    from app.core.setups import Sampling
    from app.ui.main_window import MainWindow
    from app.ui.session import Session
    from app.worker.plan import RunPlan

    target, draft = tiny_pair
    settings = QSettings(str(tmp_path_factory.mktemp("ui") / "s.ini"), QSettings.Format.IniFormat)
    s = Session(
        target=str(target),
        setups=("baseline", f"draft:{draft},k=3", "ngram:n=2,k=4"),
        prompt="Write a short story about a robot who learns to paint.",
        sampling=Sampling(max_new_tokens=24),
    )
    w = MainWindow(settings=settings, session=s)
    w.resize(1400, 900)
    w.show()
    w.bridge.ensure_started()  # the worker starts in the background while the first test sets up
    w.collected = {}
    w.draft_setup = f"draft:{draft},k=3"

    def collect(ev, _t):
        # recorded lanes only: the unrecorded warm-up lanes ("warm/L1", …) are not shown
        if isinstance(ev, StepEvent) and not RunPlan.is_warmup(ev.lane_id):
            w.collected.setdefault(ev.lane_id, []).append(ev)

    w.bridge.event.connect(collect)
    yield w
    w.close()


def _run(qtbot, w, timeout=90_000, **kw):
    w.collected.clear()
    with qtbot.waitSignal(w.runEnded, timeout=timeout):
        rid = w.run()
        assert rid is not None, w.status_label.text()
    return rid


def test_run_fills_lanes_with_matching_kinds_and_colours(qtbot, win):
    from PySide6.QtGui import QColor, QTextCursor

    from app.ui.theme import KIND_PROPERTY, KINDS

    win.setup_panel.max_tok_spin.setValue(24)
    win.set_setups(["baseline", win.draft_setup, "ngram:n=2,k=4"])
    _run(qtbot, win)
    assert set(win.collected) == {"L1", "L2", "L3"}
    kinds_seen = set()
    for lid, view in win.lane_by_id.items():
        evs = win.collected[lid]
        assert view.state == "done", (lid, view.error.text())
        assert view.document_runs() == expected_runs(evs), lid
        kinds_seen |= {k for _, k in view.document_runs()}
        doc = view.text.document()
        cur = QTextCursor(doc)
        for pos in range(1, doc.characterCount()):
            cur.setPosition(pos)
            f = cur.charFormat()
            kind = KINDS[int(f.property(KIND_PROPERTY))]
            if kind != "plain":
                assert f.foreground().color() == QColor(view.theme.kind_color(kind))
        assert view.stats.new_tokens == sum(len(e.emitted_ids) for e in evs) <= 24
    assert "accepted" in kinds_seen and ({"correction", "bonus"} & kinds_seen)
    # greedy: speculative lanes must reproduce the baseline, and say so
    assert win.lane_by_id["L1"].badge.text() == "baseline"
    for lid in ("L2", "L3"):
        assert "identical to baseline" in win.lane_by_id[lid].badge.text()
    # results table: three rows, a winner, speedup vs baseline
    assert win.results.table.rowCount() == 3 and win.results.winner is not None
    assert "faster" in win.results.summary.text() or "Baseline wins" in win.results.summary.text()
    # plots got the lanes' data and telemetry
    assert all(win.plots.buffer_len(lid) == len(win.collected[lid]) for lid in win.lane_by_id)
    qtbot.waitUntil(lambda: len(win.plots.tele) > 0, timeout=5000)
    win.plots.redraw(force=True)
    assert "tok/s" in win.plots.show_crosshair(0.5)


def test_export_json_matches_bench_schema(qtbot, win, tmp_path):
    from app.core.report import RUN_KEYS

    if win.controller.results is None or len(win.controller.results.by_lane()) != 3:
        win.set_setups(["baseline", win.draft_setup, "ngram:n=2,k=4"])
        win.setup_panel.max_tok_spin.setValue(24)
        _run(qtbot, win)
    p = win.export_json(str(tmp_path / "run.json"))
    doc = json.loads(open(p, encoding="utf-8").read())
    assert {"target", "device", "dtype", "runs", "summary", "sampling", "telemetry"} <= set(doc)
    assert len(doc["runs"]) == 3
    for r in doc["runs"]:
        assert set(RUN_KEYS) <= set(r)
        assert isinstance(r["output_ids"], list) and r["new_tokens"] == len(r["output_ids"])
    base = next(r for r in doc["runs"] if r["setup"] == "baseline")
    assert base["speedup"] == pytest.approx(1.0)
    assert all(r["identical_to_baseline"] is True for r in doc["runs"])
    assert {"setup", "tokens_per_s", "speedup", "acceptance_rate", "mean_accepted_len", "theoretical_speedup"} <= set(doc["summary"][0])
    assert isinstance(doc["telemetry"], list) and doc["telemetry"] and "host" in doc["telemetry"][0]
    assert [x["lane"] for x in doc["gui"]["lanes"]] == ["L1", "L2", "L3"] and doc["gui"]["worker"].startswith("worker pid")
    assert doc["mode"] == "interleaved" and doc["errors"] == [] and doc["bench_wall_s"] > 0
    csv = win.export_csv(str(tmp_path / "run.csv"))
    lines = open(csv, encoding="utf-8").read().splitlines()
    assert lines[0].startswith("lane,setup") and len(lines) == 4
    assert win.save_plots_png(str(tmp_path / "plots.png")) and (tmp_path / "plots.png").stat().st_size > 5000
    assert win.save_window_png(str(tmp_path / "win.png")) and (tmp_path / "win.png").stat().st_size > 5000


def test_failing_lane_shows_error_while_the_other_finishes(qtbot, win):
    win.set_setups(["baseline", "draft:no-such-engine,k=3"])
    win.setup_panel.max_tok_spin.setValue(12)
    _run(qtbot, win)
    ok, bad = win.lane_by_id["L1"], win.lane_by_id["L2"]
    assert ok.state == "done" and ok.stats.new_tokens == 12
    assert bad.state == "error" and not bad.error.isHidden() and "no-such-engine" in bad.error.text()
    assert win.results.table.rowCount() == 1 and "Lane 2" in win.results.summary.text()


def test_stop_cancels_within_a_step(qtbot, win):
    win.set_setups(["baseline", "ngram:n=2,k=4"])
    win.setup_panel.max_tok_spin.setValue(2000)
    win.collected.clear()
    win.run()
    qtbot.waitUntil(lambda: sum(len(v) for v in win.collected.values()) >= 5, timeout=60_000)
    with qtbot.waitSignal(win.runEnded, timeout=20_000):
        win.stop()
    states = {lid: v.state for lid, v in win.lane_by_id.items()}
    assert "cancelled" in states.values() and "running" not in states.values(), states
    assert all((v.stats is None or v.stats.new_tokens < 2000) for v in win.lane_by_id.values())
    assert not win.running and win.run_btn.isEnabled()


def test_killed_worker_is_reported_and_the_next_run_restarts_it(qtbot, win):
    win.set_setups(["baseline"])
    win.setup_panel.max_tok_spin.setValue(2000)
    win.collected.clear()
    win.run()
    qtbot.waitUntil(lambda: len(win.collected.get("L1", [])) >= 3, timeout=60_000)
    old_pid = win.bridge.pid
    with qtbot.waitSignal(win.runEnded, timeout=20_000):
        win.bridge.kill()
    v = win.lane_by_id["L1"]
    assert v.state == "error" and "worker process died" in v.error.text()
    assert v.acc.new_tokens >= 3  # what was received stays on screen
    assert v.text.toPlainText()
    win.setup_panel.max_tok_spin.setValue(6)
    _run(qtbot, win)
    assert win.lane_by_id["L1"].state == "done" and win.bridge.pid != old_pid
    assert not math.isnan(win.lane_by_id["L1"].stats.tokens_per_s)


def _table(results) -> list[list[str]]:
    t = results.table
    return [[t.item(r, c).text() if t.item(r, c) else "" for c in range(t.columnCount())] for r in range(t.rowCount())]


def _shown(w) -> dict:
    """What a window shows of its run: the Results table, each lane's text by kind and header, and each lane's plot rows."""
    w.plots.redraw(force=True)
    return {"table": _table(w.results), "summary": w.results.summary.text(),
            "lanes": {lid: (v.document_runs(), v.badge.text(), v.state) for lid, v in w.lane_by_id.items()},
            "plots": {lid: w.plots.lane_data(lid) for lid in w.lane_by_id}}


def test_a_saved_run_reopens_as_it_finished_and_replays_at_its_pace(qtbot, win, tmp_path):
    """Save the live run to a run file; a second window with no worker (its worker factory fails the test) shows it
    exactly as it finished — same Results table, same per-token kinds, same plot data — and a 4x replay takes about
    a quarter of the recorded time (never less: it keeps the recorded pace) and ends in the same state."""
    import time

    from PySide6.QtCore import QSettings

    from app.ui.main_window import MainWindow
    from app.worker.runfile import load

    win.setup_panel.max_tok_spin.setValue(24)
    win.set_setups(["baseline", win.draft_setup, "ngram:n=2,k=4"])
    _run(qtbot, win)
    live = _shown(win)
    path = win.save_run(str(tmp_path / "run.specdeck"))
    assert path and (tmp_path / "run.specdeck").stat().st_size < 200_000
    rec = load(path)
    assert rec.report["summary"] == win.report()["summary"] and rec.telemetry and rec.machine["cpu"]

    def no_worker(*a, **k):
        raise AssertionError("a recorded run needs no worker")

    other = MainWindow(settings=QSettings(str(tmp_path / "o.ini"), QSettings.Format.IniFormat), telemetry=False, client_factory=no_worker)
    other.resize(1400, 900)
    other.show()
    try:
        with qtbot.waitSignal(other.runEnded, timeout=10_000):
            assert other.open_run(path)
        shown = _shown(other)
        assert shown["table"] == live["table"] and shown["summary"] == live["summary"]
        assert shown["lanes"] == live["lanes"]
        for lid, rows in live["plots"].items():
            assert rows.shape == shown["plots"][lid].shape and len(rows) > 0
            assert np.allclose(rows[:, 1:], shown["plots"][lid][:, 1:], equal_nan=True)  # lane clock, counts, tok/s, α
            assert np.allclose(rows[:, 0], shown["plots"][lid][:, 0], atol=0.05)  # receive times: the recorded ones
        assert other.report()["summary"] == rec.report["summary"]  # its export is the recorded report
        assert "run.specdeck" in other.windowTitle() and other.replay_btn.isEnabled()

        t0 = time.monotonic()
        with qtbot.waitSignal(other.runEnded, timeout=int(1000 * (rec.duration_s + 30))):
            assert other.replay(4.0) is not None
        took = time.monotonic() - t0
        assert took >= rec.duration_s / 4 - 0.1, (took, rec.duration_s)  # it keeps the pace (4x, not at once)
        assert took <= rec.duration_s / 4 + 20, (took, rec.duration_s)  # about a quarter (a loaded machine may lag)
        again = _shown(other)
        assert again["table"] == live["table"] and again["lanes"] == live["lanes"]
    finally:
        other.shutdown()
        other.close()
