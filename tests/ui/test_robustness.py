"""What a user can throw at the window without breaking it: sessions with values the fields cannot hold (refused
whole, naming the field), a damaged settings file (the window starts from a preset and says why), a broken engine
manifest (the others stay listed, the broken one is shown greyed with its error), a worker that stops answering
(said on the lanes and in the status bar, and Stop kills it), and lanes whose clocks include a stall (marked "!")."""

from __future__ import annotations

import json
import re

import pytest

from .helpers import SETUPS, FakeClient, make_stats, make_step


def _doc(**over) -> dict:
    d = {"version": 1, "target": "smollm2-135m-instruct", "setups": ["baseline", "ngram"], "prompt": "hi", "prompt_id": "custom",
         "chat": True, "mode": "interleaved",
         "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "max_new_tokens": 64}}
    for k, v in over.items():
        if k in d["sampling"]:
            d["sampling"][k] = v
        else:
            d[k] = v
    return d


# --- sessions (Qt-free) ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "over, words",
    [
        ({"max_new_tokens": 1e12}, ["sampling.max_new_tokens", "from 1 to 100000", "1e+12"]),
        ({"max_new_tokens": float("inf")}, ["sampling.max_new_tokens", "inf"]),  # what json reads for 1e400
        ({"max_new_tokens": 64.5}, ["whole number"]),
        ({"max_new_tokens": True}, ["sampling.max_new_tokens"]),
        ({"seed": 2**31}, ["sampling.seed"]),
        ({"top_p": 0.0}, ["sampling.top_p", "0.01"]),
        ({"temperature": "hot"}, ["sampling.temperature", "'hot'"]),
        ({"top_k": -1}, ["sampling.top_k"]),
        ({"setups": ["baseline", "ngram:k=0"]}, ["setup 2", "ngram:k=0"]),
        ({"setups": ["baseline", 3]}, ["setup 2", "setup string"]),
        ({"setups": []}, ["1 to 4 setups"]),
        ({"setups": "baseline"}, ["setups must be a list"]),
        ({"chat": "yes"}, ["chat must be true or false"]),
        ({"mode": "parallel"}, ["mode must be"]),
        ({"target": 5}, ["target must be text"]),
        ({"sampling": [1, 2]}, ["sampling must be a table"]),
        ({"version": 7}, ["version 7"]),
    ],
)
def test_a_session_outside_the_fields_ranges_is_refused_naming_the_field(over, words):
    from app.core.errors import SpecDeckError
    from app.ui.session import Session

    with pytest.raises(SpecDeckError) as e:
        Session.from_json(_doc(**over))
    for w in words:
        assert w in e.value.message, e.value.message


def test_session_ranges_are_the_spin_boxes_ranges(qtbot):
    from app.ui.session import SAMPLING_RANGES, Session
    from app.ui.setup_dock import SetupPanel

    p = SetupPanel()
    qtbot.addWidget(p)
    spins = {"temperature": p.temp_spin, "top_p": p.top_p_spin, "top_k": p.top_k_spin, "seed": p.seed_spin, "max_new_tokens": p.max_tok_spin}
    for name, (lo, hi) in SAMPLING_RANGES.items():
        assert (spins[name].minimum(), spins[name].maximum()) == (lo, hi), name
    edge = Session.from_json(_doc(max_new_tokens=100000.0, seed=2**31 - 1, temperature=5, top_p=0.01))
    assert edge.sampling.max_new_tokens == 100000 and isinstance(edge.sampling.max_new_tokens, int)


# --- the window: all or nothing, and a damaged settings file -------------------------------------------------------


@pytest.fixture
def win(fake_window):
    return fake_window(max_new_tokens=4)


def test_every_session_mode_is_in_the_window_and_a_paced_session_runs_paced(win, tmp_path):
    """The mode box offers exactly the modes a session may hold, and a session saved with `paced` (the scheduler's
    fair-timing mode) opens with it chosen and plans its run paced."""
    from app.ui.session import MODES

    assert sorted(win.mode_combo.itemData(i) for i in range(win.mode_combo.count())) == sorted(MODES)
    assert "paced" in MODES
    path = tmp_path / "paced.json"
    path.write_text(json.dumps(_doc(mode="paced")))
    assert win.open_session(str(path)) is True
    assert win.mode_combo.currentData() == "paced" and win.session().mode == "paced"
    assert win.plan().mode == "paced"


def test_opening_a_session_with_a_huge_token_limit_changes_nothing(win, tmp_path):
    before = win.session()
    bad = tmp_path / "big.json"
    bad.write_text(json.dumps(_doc(max_new_tokens=1e12, target="other-target", setups=["ngram"])))
    assert win.open_session(str(bad)) is False  # was: OverflowError with target and setups already applied
    assert win.session() == before
    msg = win.status_label.text()
    assert msg.startswith("⚠ ") and str(bad) in msg and "sampling.max_new_tokens must be a whole number from 1 to 100000, got 1e+12" in msg
    # a session made in code gets the same check before anything changes
    from dataclasses import replace

    from app.core.errors import SpecDeckError

    with pytest.raises(SpecDeckError, match="max_new_tokens"):
        win.apply_session(before.with_(target="x", sampling=replace(before.sampling, max_new_tokens=10**12)))
    assert win.session() == before


def test_a_settings_file_whose_last_session_is_unreadable_starts_from_the_preset(qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    from app.ui.main_window import MainWindow
    from app.ui.session import PRESETS, SMOL_PRESET

    ini = tmp_path / "damaged.ini"
    s = QSettings(str(ini), QSettings.Format.IniFormat)
    s.setValue("session/last", json.dumps(_doc()).replace('"max_new_tokens": 64', '"max_new_tokens": 1e400'))
    s.setValue("ui/geometry", "not a geometry")
    s.setValue("ui/dark", "banana")
    s.sync()
    w = MainWindow(settings=QSettings(str(ini), QSettings.Format.IniFormat), statuses=[], telemetry=False, client_factory=FakeClient)
    qtbot.addWidget(w)  # was: OverflowError from int(inf): the window never opened
    assert w.session() == PRESETS[SMOL_PRESET]
    msg = w.status_label.text()
    assert msg.startswith("⚠ the remembered session in ") and str(ini) in msg
    assert "was unreadable (" in msg and "sampling.max_new_tokens" in msg and "inf" in msg and "“SmolLM2 quick”" in msg
    w.shutdown()
    # not JSON at all
    s.setValue("session/last", "{oops")
    s.sync()
    w2 = MainWindow(settings=QSettings(str(ini), QSettings.Format.IniFormat), statuses=[], telemetry=False, client_factory=FakeClient)
    qtbot.addWidget(w2)
    assert "not JSON" in w2.status_label.text() and w2.session() == PRESETS[SMOL_PRESET]
    w2.shutdown()


def test_gui_main_refuses_a_token_limit_the_field_cannot_hold(tmp_path):
    import os
    import subprocess
    import sys

    args = ["--max-new-tokens", str(10**12), "--settings", str(tmp_path / "s.ini"), "--autorun", "--quit-after-run"]
    code = f"import sys\nfrom app.ui.main import main\nsys.exit(main({args!r}))\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: not a usable SpecDeck session: sampling.max_new_tokens must be a whole number from 1 to 100000" in r.stderr


# --- a broken engine manifest -------------------------------------------------------------------------------------


def test_one_broken_manifest_is_shown_and_the_other_engines_stay_listed(qtbot, settings, tmp_path, monkeypatch):
    from PySide6.QtCore import Qt

    from app.ui.main_window import MainWindow

    (tmp_path / "aaa-broken.toml").write_text('backend = "hf"\n[source]\ngguff = "x.gguf"\n')
    (tmp_path / "mine.toml").write_text(f'backend = "hf"\ntokenizer = "t"\n[source]\nhf_dir = "{tmp_path}"\n')
    monkeypatch.setenv("SPECDECK_ENGINES_PATH", str(tmp_path))
    w = MainWindow(settings=settings, telemetry=False, client_factory=FakeClient)
    qtbot.addWidget(w)
    names = {s.name for s in w.statuses}
    assert {"mine", "smollm2-135m-instruct"} <= names  # was: [] (every engine lost to one file)
    model = w.target_combo.model()
    rows = {model.item(r).text(): model.item(r) for r in range(model.rowCount())}
    broken = rows["aaa-broken  (broken manifest)"]
    assert not broken.isEnabled() and "unknown key 'gguff'" in broken.toolTip() and "did you mean 'gguf'" in broken.toolTip()
    assert rows["mine"].isEnabled() or "mine  (unavailable)" in rows
    assert broken.data(Qt.ItemDataRole.UserRole) == "aaa-broken"
    msg = w.status_label.text()
    assert msg.startswith("⚠ engine manifest ") and "aaa-broken.toml: unknown key 'gguff'" in msg and msg.endswith("the other engines are listed")
    assert w.status.engines.text() == "⚠ 1 broken engine manifest" and "gguff" in w.status.engines.toolTip()
    w.shutdown()


# --- a worker that stops answering --------------------------------------------------------------------------------


def _start(qtbot, w):
    with qtbot.waitSignal(w.runStarted, timeout=2000):
        rid = w.run()
    assert rid is not None, w.status_label.text()
    client = FakeClient.instances[-1]
    qtbot.waitUntil(lambda: len(client.sent) >= 2, timeout=5000)
    return rid, client


def test_a_silent_worker_is_reported_and_stop_kills_it(qtbot, win):
    from app.worker.messages import Cancel, Heartbeat, WorkerDied

    win.controller.silent_s = 0.4
    rid, client = _start(qtbot, win)
    win.bridge.feed(make_step("L1", 0))
    qtbot.waitUntil(lambda: win.controller.silent, timeout=5000)
    said = win.status_label.text()
    assert re.fullmatch(r"⚠ the worker has not answered for \d+ s: stopped or hung\? Stop kills it", said)  # 20 s by default
    waiting = [v for v in win.lane_views if v.state in ("waiting", "running")]
    assert len(waiting) == 3 and all(v.notice.isVisible() and v.notice.text() == said for v in waiting)
    # it answers again: the notice goes
    win.bridge.feed(Heartbeat(0.0))
    assert not win.controller.silent and not any(v.notice.isVisible() for v in win.lane_views)
    assert "the worker answered again" in win.status_label.text()
    # silent again; Stop kills it instead of sending a Cancel nobody would read
    qtbot.waitUntil(lambda: win.controller.silent, timeout=5000)
    n_sent = len(client.sent)
    win.stop()
    assert not client.alive and len(client.sent) == n_sent and not any(isinstance(c, Cancel) for c in client.sent)
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(WorkerDied(-9, "worker process died: SIGKILL (killed)"))
    for v in win.lane_views:
        assert v.state in ("error", "cancelled") and not v.notice.isVisible()
    assert "did not answer for" in win.lane_views[1].error.text() and "Stop killed it" in win.lane_views[1].error.text()
    assert win.controller.results.stopped and win.run_btn.isEnabled()


def test_heartbeats_keep_a_slow_worker_from_being_called_silent(qtbot, win):
    """Each heartbeat counts as hearing from the worker, so one that beats more often than `silent_s` is never called
    silent. Load-proof: under a loaded CI the event loop can stall past any threshold between two beats, so the
    no-notice assertion holds where the beats' gaps (measured) stayed under it, and every beat must have moved the
    controller's last-heard time (it failed once with 0.6 s and 150 ms beats under xdist load)."""
    import time

    from app.worker.messages import Heartbeat

    c = win.controller
    c.silent_s = 2.0
    _start(qtbot, win)
    prev, gaps = c.last_heard, []
    for _ in range(12):
        qtbot.wait(100)
        fed = time.monotonic()
        win.bridge.feed(Heartbeat(0.0))
        assert c.last_heard >= fed  # heard
        gaps.append(fed - prev)
        prev = fed
    assert not c.silent
    if max(gaps) < c.silent_s:  # no gap between two hearings reached the threshold: nothing to report
        assert "answered" not in win.status_label.text()


# --- stalled lane clocks ------------------------------------------------------------------------------------------


def _finish_with(qtbot, win, lane2):
    """A run whose lane 2 ends with `lane2` (baseline and lane 3 ordinary); returns (table, column index, row index
    by setup) of the results."""
    from app.core.events import LaneDone
    from app.worker.messages import RunFinished

    rid, _ = _start(qtbot, win)
    win.bridge.feed(LaneDone("L1", make_stats("baseline", (5, 6, 7, 8), 1.0)))
    win.bridge.feed(LaneDone("L2", lane2))
    win.bridge.feed(LaneDone("L3", make_stats(SETUPS[2], (5, 6, 7, 8), 0.8, drafted=3, accepted=1)))
    with qtbot.waitSignal(win.runEnded, timeout=2000):
        win.bridge.feed(RunFinished(rid))
    t = win.results.table
    col = {t.horizontalHeaderItem(j).text(): j for j in range(t.columnCount())}
    return t, col, {t.item(i, col["setup"]).text(): i for i in range(t.rowCount())}


def test_a_stalled_lane_is_flagged_in_the_results(qtbot, win):
    from dataclasses import replace


    t, col, rows = _finish_with(qtbot, win, replace(make_stats(SETUPS[1], (5, 6, 7, 8), 0.5, drafted=4, accepted=2), stall_s=2.5))
    stalled = t.item(rows[SETUPS[1]], col["speedup"])
    assert stalled.text() == "2.00×!" and "2.5 s of this lane's 0.5 s were a stall" in stalled.toolTip()
    assert "not trustworthy" in stalled.toolTip()
    assert t.item(rows[SETUPS[2]], col["speedup"]).text() == "1.25×" and not t.item(rows[SETUPS[2]], col["speedup"]).toolTip()
    assert "! stalled lane clocks: Lane 2 (2.5 s)" in win.results.summary.text()


def test_a_stalled_baseline_flags_every_speedup_measured_against_it(qtbot):
    from dataclasses import replace

    from app.ui.results import COLUMNS, result_rows

    rows = result_rows([("Lane 1", "#000", replace(make_stats("baseline", (1, 2), 1.0), stall_s=1.0)),
                        ("Lane 2", "#111", make_stats("ngram", (1, 2), 0.5))])
    base, ng = rows
    assert base.stalled and ng.stalled and "the baseline's clock includes a 1.0 s stall" in ng.stall_tip()
    assert ng.values()[COLUMNS.index("speedup")][0] == "2.00×!"


def test_inferred_alpha_and_lane_notes_show_in_the_results(qtbot, win):
    """A lane whose α was inferred from streamed chunks (TensorRT-LLM 1.2.x reports zero counters) shows "~α"
    with the lane's notes as the cell's tooltip; an exactly counted lane shows neither."""
    from dataclasses import replace


    note = "α and the draft counts are inferred from streamed chunk sizes"
    t, col, rows = _finish_with(qtbot, win, replace(make_stats(SETUPS[1], (5, 6, 7, 8), 0.5, drafted=4, accepted=2), counts_source="streamed",
                                                     notes=(note, "decoded greedily although sampling was asked")))
    inferred = t.item(rows[SETUPS[1]], col["α"])
    assert inferred.text() == "~0.500" and note in inferred.toolTip() and "greedily" in inferred.toolTip()
    exact = t.item(rows[SETUPS[2]], col["α"])
    assert exact.text() == "0.333" and not exact.toolTip()


def test_each_lane_header_says_engine_backend_and_precision(qtbot, win):
    """LaneStarted carries what runs the lane (engine · backend · precision); the lane's header shows it."""
    from app.core.events import LaneStarted

    _start(qtbot, win)
    win.bridge.feed(LaneStarted("L2", SETUPS[1], "custom", 0, (1,), "x", "llamacpp-qwen2.5-coder-1.5b-instruct · llamacpp · Q4_K_M"))
    v = win.lanes.by_id["L2"]
    assert "llamacpp-qwen2.5-coder-1.5b-instruct · llamacpp · Q4_K_M" in v.title.text() and "Lane 2" in v.title.text()
