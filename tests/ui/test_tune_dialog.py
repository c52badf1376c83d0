"""Run ▸ Find the fastest setup: the finder's dialog runs `python -m app tune` as a process, shows its report,
and turns the winners into lanes."""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from app.ui.tune_dialog import TuneDialog, command_line, winner_lanes


@pytest.mark.xdist_group("tune_report")  # one xdist worker computes the session fixture for both
def test_the_report_fills_the_table_and_the_winners_become_lanes(qtbot, fake_window, tune_report):
    doc, _, path = tune_report
    w = fake_window()
    d = w.find_fastest_setup()
    qtbot.waitExposed(d)
    assert d.target == "tiny-target" and w.find_fastest_setup() is d  # one dialog per target
    assert "--target" in d.arguments() and d.arguments()[d.arguments().index("--kinds") + 1] == "draft,ngram,tree"
    # the report as the finished finder leaves it: read from its --json file
    shutil.copy(path, d._json)
    d._finished(0)
    rows = [d.table.item(r, 1).text() for r in range(d.table.rowCount())]
    assert doc["winner"]["setup"] in rows and any(",k=auto" in s for s in rows)
    head = next(c for c in doc["candidates"] if c["kind"] == "redrafter")  # the head's best tree: priced and confirmed
    r = rows.index(head["setup"])
    assert d.table.item(r, 0).text() == str(head["rank"]) and "head levels × c" in d.table.item(r, 7).text()
    assert d.status.text().startswith("fastest here:") and d.summary.toPlainText().startswith("fastest here:")
    # ranked by prediction; the winner (measured) is the one bold row, whatever its rank
    bold = [rows[r] for r in range(len(rows)) if d.table.item(r, 1).font().bold()]
    assert bold == [doc["winner"]["setup"]] and all(d.table.item(rows.index(bold[0]), col).font().bold() for col in range(8))
    # the table and the summary share the height: the table its rows' height, at most 70 %, the summary the rest
    top, bottom = d.split.sizes()
    t = d.table
    rows_h = t.horizontalHeader().height() + sum(t.rowHeight(r) for r in range(t.rowCount()))
    assert top > 0 and bottom >= 0.3 * (top + bottom) - 1 and top <= 0.7 * (top + bottom) + 1
    assert top >= min(rows_h, int(0.7 * (top + bottom)))  # every row shown, or the table at its 70 %
    summary = d.summary.toPlainText().splitlines()
    not_tried = summary[summary.index("not tried:") + 1:]  # one line each, to the end
    assert "break-even:" in d.summary.toPlainText() and any("redrafter:tiny-misfit did not run" in x for x in not_tried)
    for cat, x in doc["winners_by_category"].items():  # each category's winner, and on how many prompts it won
        n = x["prompts"]
        assert any(y.startswith(f"{cat}: {x['setup']} (predicted ") and y.endswith(f" on {n} prompt{'s' if n != 1 else ''})") for y in summary)
    assert all(x.startswith("  • ") for x in not_tried)
    dyn = next(c for c in doc["candidates"] if c["kind"] == "tree" and not c["shape"])  # the best dynamic tree: priced and confirmed
    assert dyn["measured"] and rows.index(dyn["setup"]) >= 0
    # the line where the run's verifies moved the curve
    assert ("verify cost:" in d.summary.toPlainText()) == (doc["verify_curve"] != doc["profile_verify_curve"])
    assert w.costs.break_even.isVisibleTo(w.costs) and "to beat" in w.costs.break_even.text()
    assert d.use_btn.isEnabled()
    d.use_btn.click()
    assert w.setups() == winner_lanes(doc) and w.setups()[0] == "baseline" and doc["winner"]["setup"] in w.setups()
    d.close()


@pytest.mark.parametrize("mark", ["tune [", "worker pid"])
def test_stop_ends_the_finder_and_says_so(qtbot, tiny_pair, mark):
    """A real finder process, stopped as it starts its worker ("tune [": the stop lands inside the worker's spawn) or
    while it loads ("worker pid"): it ends by itself with 130 (no hang, no traceback, not killed) and the dialog says
    nothing was measured."""
    t, dr = (str(p) for p in tiny_pair)
    d = TuneDialog(t, ["quick"])
    qtbot.addWidget(d)
    d.drafts_edit.setText(dr)
    d.suite_box.setCurrentText("quick")
    d.start()
    assert d.running and not d.start_btn.isEnabled() and d.stop_btn.isEnabled()
    qtbot.waitUntil(lambda: any(x.startswith(mark) for x in d.output), timeout=120_000)
    assert d.progress.value() >= 0 and d.status.text()
    d.stop()
    qtbot.waitUntil(lambda: not d.running, timeout=120_000)
    assert d.start_btn.isEnabled() and not d.stop_btn.isEnabled()
    assert not d.killed and d.exit_code == 130, d.output[-20:]
    assert not any("Traceback" in x for x in d.output), d.output[-20:]
    assert d.stopped and d.status.text() == "Stopped before anything was measured."


def test_a_frozen_finder_is_killed_after_the_grace_and_the_dialog_says_so(qtbot, tiny_pair):
    """A finder that cannot answer Stop's SIGTERM (frozen with SIGSTOP, as a hung one would be) is killed once the
    grace is over; the dialog is usable again and says what happened."""
    t, dr = (str(p) for p in tiny_pair)
    d = TuneDialog(t, ["quick"])
    qtbot.addWidget(d)
    d.drafts_edit.setText(dr)
    d.stop_grace_s = 1.0
    d.start()
    qtbot.waitUntil(lambda: any(x.startswith("tune [") for x in d.output), timeout=120_000)
    os.kill(d.proc.processId(), signal.SIGSTOP)
    d.stop()
    qtbot.waitUntil(lambda: not d.running, timeout=60_000)
    assert d.killed and d.start_btn.isEnabled() and "was killed" in d.status.text()


def test_command_line_and_the_busy_window(qtbot):
    d = TuneDialog("t", ["quick"], busy=lambda: True)
    qtbot.addWidget(d)
    d.start()
    assert not d.running and "stop them first" in d.status.text()
    args = command_line("t", ["a", "b"], ["draft"], "quick", 2.5, 32, "/x.json")
    assert args[:3] == ["-m", "app", "tune"] and args.count("--draft") == 2 and "2.5" in args and "/x.json" in args
    assert winner_lanes({"winner": {"setup": "ngram:k=4"}, "winners_by_category": {"a": {"setup": "ngram:k=4"}, "b": {"setup": "x"}}}) == [
        "baseline", "ngram:k=4", "x"]


@pytest.mark.xdist_group("tune_report")  # one xdist worker computes the session fixture for all of them
def test_open_report_shows_a_saved_report_and_the_form_follows_it(qtbot, tune_report, tmp_path):
    """A report written earlier (`tune --json PATH`) opens in the dialog as a finished run's does — its table, its
    summary, its lanes — and the form shows what that run asked for (the fixture's: its draft, all four kinds with
    redrafter, which the dialog leaves off by default, the quick suite, 6 minutes, 12 tokens). A file that is not a
    report is refused with a line that says so and how to get one, and what was shown stays."""
    import json

    doc, _, path = tune_report
    d = TuneDialog(doc["target"], ["quick", "specbench"])
    qtbot.addWidget(d)
    assert not d.kind_checks["redrafter"].isChecked() and d.suite_box.currentText() == "specbench" and d.tokens_spin.value() == 64
    assert d.open_report(path) and d.progress.value() == 100
    rows = [d.table.item(r, 1).text() for r in range(d.table.rowCount())]
    assert doc["winner"]["setup"] in rows and d.summary.toPlainText().startswith("fastest here:")
    assert d.status.text().startswith(f"{path.name}: fastest here:") and "window's target" not in d.status.text()
    req = doc["request"]
    assert [x.strip() for x in d.drafts_edit.text().split(",")] == req["drafts"] and len(req["drafts"]) == 1
    assert [k for k, cb in d.kind_checks.items() if cb.isChecked()] == ["draft", "ngram", "tree", "redrafter"] == req["kinds"]
    assert d.suite_box.currentText() == "quick" and d.minutes_spin.value() == 6.0 and d.tokens_spin.value() == 12
    args = d.arguments()  # Start would ask for the same run
    assert args[args.index("--kinds") + 1] == "draft,ngram,tree,redrafter" and args[args.index("--max-new-tokens") + 1] == "12"
    assert d.use_btn.isEnabled()
    with qtbot.waitSignal(d.useLanes) as got:
        d.use_btn.click()
    assert got.args[0] == winner_lanes(doc)

    shown = d.table.rowCount()
    (tmp_path / "notes.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "other.json").write_text(json.dumps({"lanes": []}), encoding="utf-8")
    for name, says in (("notes.json", "is not JSON"), ("other.json", "is not a setup finder report"), ("gone.json", "cannot read")):
        assert not d.open_report(tmp_path / name)
        assert d.status.text().startswith("Not opened: ") and says in d.status.text(), d.status.text()
        assert "python -m app tune" in d.status.text() or says == "cannot read"
        assert d.table.rowCount() == shown and d.doc is not None

    # a report of another target: shown, and the status says whose speeds these are
    other = {**doc, "target": "some-other-target", "request": {**req, "prompts_file": "/data/mine.jsonl"}}
    (tmp_path / "other-target.json").write_text(json.dumps(other), encoding="utf-8")
    assert d.open_report(tmp_path / "other-target.json")
    assert "for some-other-target; the window's target is " + doc["target"] in d.status.text()
    assert "prompts from /data/mine.jsonl" in d.status.text()
    d.close()
