"""Run ▸ Find the fastest setup: the setup finder (`python -m app tune`) from the window.

The finder runs as its own process (its own worker and models), so the window stays responsive and a Stop ends it
cleanly: SIGTERM makes `tune` report what it measured so far. A finder that has not ended `stop_grace_s` after Stop
(frozen: kill -STOP, or hung) is killed, and the dialog says so. Its progress lines (``tune [ 42%] …``) drive the
progress bar; its JSON report fills the table — predicted and measured speedups, α, τ and why each setup wins or
loses — the winner per category and the break-even line, which also goes to the Costs tab. "Use as lanes" puts the
baseline, the winner and the category winners in the window's lanes with one click. "Open report…" shows a report
written earlier (`tune --json PATH`, e.g. on a machine without a display) the same way; the form then shows what that
report asked for (its `request`), so that Start measures it again here.
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QProcess, QProcessEnvironment, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.commands.tune import category_figures, headline, measured_only_why, partial_note, predicted_cell, speed_note, verify_note

__all__ = ["TuneDialog", "winner_lanes", "command_line", "read_report"]

_PROGRESS = re.compile(r"^tune \[\s*(\d+)%\] (.*)$")
_ROOT = Path(__file__).resolve().parents[2]


def command_line(target: str, drafts: list[str], kinds: list[str], suite: str, minutes: float, max_new_tokens: int,
                 json_path: str) -> list[str]:
    """The `python -m app tune` arguments the dialog runs (after the interpreter)."""
    args = ["-m", "app", "tune", "--target", target, "--kinds", ",".join(kinds), "--suite", suite, "--minutes", f"{minutes:g}",
            "--max-new-tokens", str(max_new_tokens), "--json", json_path]
    for d in drafts:
        args += ["--draft", d]
    return args


def winner_lanes(doc: dict, most: int = 4) -> list[str]:
    """The lanes a finder report suggests: the baseline, the overall winner, then each category's winner (distinct,
    at most `most` lanes in all)."""
    out = ["baseline"]
    if doc.get("winner"):
        out.append(doc["winner"]["setup"])
    for x in doc.get("winners_by_category", {}).values():
        out.append(x["setup"])
    return list(dict.fromkeys(out))[:most]


def read_report(path: str | Path) -> dict:
    """A finder report (`python -m app tune --json PATH`) from a file; ValueError with one line saying what is wrong
    with it and how to get one (a file that cannot be read, is not JSON, or is not a finder report)."""
    how = "write one with python -m app tune --target ENGINE --json PATH"
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"{Path(path).name} is not JSON ({e}); {how}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("candidates"), list) or not isinstance(doc.get("target"), str):
        raise ValueError(f"{Path(path).name} is not a setup finder report (no target and candidates); {how}")
    return doc


def _num(x, fmt: str = "{:.2f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "–"


class TuneDialog(QDialog):
    """The finder's dialog. `target`: the window's target engine; `drafts`: engines offered as drafts (none ticked:
    the finder's default choice). Emits `useLanes(list[str])` on "Use as lanes", `report(dict)` when a report is in."""

    useLanes = Signal(list)
    report = Signal(dict)

    def __init__(self, target: str, suites: list[str], parent: QWidget | None = None, busy=lambda: False) -> None:
        super().__init__(parent)
        self.setWindowTitle("Find the fastest setup")
        self.resize(1100, 640)
        self.target = target
        self.busy = busy  # the window is running lanes: measuring now would share the CPU with them
        self.proc: QProcess | None = None
        self.doc: dict | None = None
        self.stopped = False
        self.killed = False  # Stop's SIGTERM did not end the finder within stop_grace_s: it was killed
        self.exit_code: int | None = None  # the last finder's exit code
        self.stop_grace_s = 45.0
        self._json = str(Path(tempfile.mkdtemp(prefix="specdeck-tune-")) / "tune.json")
        self.output: list[str] = []

        form = QFormLayout()
        form.addRow("Target", QLabel(target))
        self.drafts_edit = QLineEdit()
        self.drafts_edit.setPlaceholderText("default: the engines sharing the target's tokenizer, smaller than it")
        self.drafts_edit.setToolTip("draft engines to try, comma-separated (each at int8 and its own precision on a CPU)")
        form.addRow("Drafts", self.drafts_edit)
        kinds = QHBoxLayout()
        self.kind_checks: dict[str, QCheckBox] = {}
        for k, on, tip in (("draft", True, "draft models: k × stop × cstop"), ("ngram", True, "prompt lookup: k"),
                           ("tree", True, "token trees of each draft: static ones (e.g. 3x1x1) priced from its chain calibration, "
                            "dynamic ones (nodes × depth × branch) from a calibration lane of their own"),
                           ("redrafter", False, "ReDrafter heads trained for the target (train-drafter): beams × depth × cstop, "
                            "priced from each head's own calibration lane")):
            cb = QCheckBox(k)
            cb.setChecked(on)
            cb.setToolTip(tip)
            self.kind_checks[k] = cb
            kinds.addWidget(cb)
        kinds.addStretch(1)
        form.addRow("Kinds", kinds)
        self.suite_box = QComboBox()
        self.suite_box.addItems(suites)
        if "specbench" in suites:
            self.suite_box.setCurrentText("specbench")
        form.addRow("Prompts (suite)", self.suite_box)
        self.minutes_spin = QDoubleSpinBox()
        self.minutes_spin.setRange(0.5, 240.0)
        self.minutes_spin.setValue(15.0)
        self.minutes_spin.setSuffix(" min")
        self.minutes_spin.setToolTip("calibration, pricing and confirmation together; what did not fit is said")
        form.addRow("Time budget", self.minutes_spin)
        self.tokens_spin = QSpinBox()
        self.tokens_spin.setRange(8, 1024)
        self.tokens_spin.setValue(64)
        form.addRow("Tokens per prompt", self.tokens_spin)

        self.start_btn = QPushButton("Start")
        self.start_btn.clicked.connect(self.start)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setEnabled(False)
        self.stop_btn.clicked.connect(self.stop)
        self.use_btn = QPushButton("Use as lanes")
        self.use_btn.setEnabled(False)
        self.use_btn.setToolTip("the baseline, the winner and each category's winner become the window's lanes")
        self.use_btn.clicked.connect(self._use)
        self.open_btn = QPushButton("Open report…")
        self.open_btn.setToolTip("show a report written earlier by python -m app tune --json PATH")
        self.open_btn.clicked.connect(self._choose_report)
        buttons = QHBoxLayout()
        for b in (self.start_btn, self.stop_btn, self.use_btn, self.open_btn):
            buttons.addWidget(b)
        buttons.addStretch(1)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.status = QLabel("Calibrates each drafter on the prompts, prices every setup of a grid with this machine's cost "
                             "profiles, then confirms the best by a real run.")
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, 8)
        self.table.setHorizontalHeaderLabels(["rank", "setup", "predicted", "measured", "meas tok/s", "α", "τ", "why"])
        self.table.horizontalHeaderItem(0).setToolTip("rank by predicted speedup; the fastest measured setup, the winner, is in bold")
        self.table.horizontalHeader().setSectionResizeMode(7, QHeaderView.ResizeMode.Stretch)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.summary = QPlainTextEdit()
        self.summary.setReadOnly(True)
        # the table and the summary share the dialog's height; the user moves the line between them
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.addWidget(self.table)
        self.split.addWidget(self.summary)
        self.split.setStretchFactor(0, 3)
        self.split.setStretchFactor(1, 1)
        self.split.setChildrenCollapsible(False)

        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(self.split, 1)

    # --- running -------------------------------------------------------------------------------------------
    def arguments(self) -> list[str]:
        drafts = [d.strip() for d in self.drafts_edit.text().split(",") if d.strip()]
        kinds = [k for k, cb in self.kind_checks.items() if cb.isChecked()]
        return command_line(self.target, drafts, kinds, self.suite_box.currentText(), self.minutes_spin.value(), self.tokens_spin.value(),
                            self._json)

    def start(self) -> None:
        if self.proc is not None:
            return
        if self.busy():
            self.status.setText("The window is running lanes: stop them first (the finder measures speed, and two runs would share the CPU).")
            return
        if not any(cb.isChecked() for cb in self.kind_checks.values()):
            self.status.setText("Tick at least one kind of drafter.")
            return
        Path(self._json).unlink(missing_ok=True)
        self.doc, self.stopped, self.killed, self.exit_code, self.output = None, False, False, None, []
        self.table.setRowCount(0)
        self.summary.clear()
        self.progress.setValue(0)
        p = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        p.setProcessEnvironment(env)
        p.setWorkingDirectory(str(_ROOT))
        p.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        p.readyReadStandardOutput.connect(self._read)
        p.finished.connect(self._finished)
        p.errorOccurred.connect(self._error)
        self.proc = p
        self.start_btn.setEnabled(False)
        self.open_btn.setEnabled(False)
        self.stop_btn.setEnabled(True)
        self.use_btn.setEnabled(False)
        self.status.setText("Starting the finder…")
        p.start(sys.executable, self.arguments())

    def stop(self) -> None:
        """Ask the finder to stop: it reports what it measured so far (SIGTERM)."""
        if self.proc is not None and self.proc.state() != QProcess.ProcessState.NotRunning:
            self.stopped = True
            self.status.setText("Stopping: the finder reports what it measured so far…")
            self.proc.terminate()
            p = self.proc
            QTimer.singleShot(int(self.stop_grace_s * 1000), self, lambda: self._kill_late(p))

    def _kill_late(self, p: QProcess) -> None:
        """Stop's grace is over and the same finder still runs: kill it (its `finished` then ends the run)."""
        if self.proc is p and p.state() != QProcess.ProcessState.NotRunning:
            self.killed = True
            p.kill()

    @property
    def running(self) -> bool:
        return self.proc is not None

    def _read(self) -> None:
        if self.proc is None:
            return
        text = bytes(self.proc.readAllStandardOutput().data()).decode("utf-8", "replace")
        for line in text.splitlines():
            self.output.append(line)
            m = _PROGRESS.match(line.strip())
            if m:
                self.progress.setValue(int(m.group(1)))
                self.status.setText(m.group(2))

    def _error(self, err) -> None:
        if err == QProcess.ProcessError.FailedToStart:
            self.status.setText(f"The finder did not start ({sys.executable} -m app tune).")
            self._done()

    def _finished(self, code: int, _status=None) -> None:
        self._read()
        self.exit_code = code
        doc = None
        try:
            doc = json.loads(Path(self._json).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass
        if doc is not None:
            self.show_report(doc)
            self.status.setText(("Stopped: " if self.stopped else "") + headline(doc)[0] + ".")
            self.progress.setValue(100)
        elif self.killed:
            self.status.setText(f"Stopped: the finder did not end within {self.stop_grace_s:g} s of Stop (frozen or hung) and was killed; "
                                "nothing it measured was reported.")
        elif self.stopped and code == 130:  # it ended as asked: its "nothing to report (stopped by the user)" says no more
            self.status.setText("Stopped before anything was measured.")
        else:
            errors = [x for x in self.output if x.startswith("error")] or self.output[-3:]
            self.status.setText(("Stopped before anything was measured. " if self.stopped else f"The finder ended (exit {code}) without a report: ")
                                + " ".join(errors)[:400])
        self._done()

    def _done(self) -> None:
        if self.proc is not None:
            self.proc.deleteLater()
        self.proc = None
        self.start_btn.setEnabled(True)
        self.open_btn.setEnabled(True)
        self.stop_btn.setEnabled(False)

    # --- the report ---------------------------------------------------------------------------------------------
    def _choose_report(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a setup finder report", "", "Finder reports (*.json);;All files (*)")
        if path:
            self.open_report(path)

    def open_report(self, path: str | Path) -> bool:
        """Show the finder report at `path` (not while a finder runs); False, with the reason in the status line,
        where it cannot be shown."""
        if self.proc is not None:
            self.status.setText("A finder is running: stop it before opening a report.")
            return False
        try:
            doc = read_report(path)
        except ValueError as e:
            self.status.setText(f"Not opened: {e}.")
            return False
        self.progress.setValue(100)  # a finished report, as after a run
        self.show_report(doc)
        text = f"{Path(path).name}: {headline(doc)[0]}."
        if doc["target"] != self.target:
            text += (f" This report is for {doc['target']}; the window's target is {self.target}: its speeds are that target's, "
                     "and Start measures this one.")
        req = doc.get("request") if isinstance(doc.get("request"), dict) else {}
        if req.get("prompts_file") or req.get("prompts_given"):
            ran_on = f"prompts from {req['prompts_file']}" if req.get("prompts_file") else "prompts given on its command line"
            text += f" It ran on {ran_on}; Start runs the suite chosen here."
        self.status.setText(text)
        return True

    def follow(self, request: dict) -> None:
        """Set the form to what a report asked for (its `request`): drafts, kinds, suite, budget and tokens; a field
        the report does not give, or a suite this install does not have, keeps its value."""
        if isinstance(request.get("drafts"), list):
            self.drafts_edit.setText(", ".join(str(d) for d in request["drafts"]))
        kinds = request.get("kinds")
        if isinstance(kinds, list) and any(k in self.kind_checks for k in kinds):
            for k, cb in self.kind_checks.items():
                cb.setChecked(k in kinds)
        suite = request.get("suite")
        if isinstance(suite, str) and self.suite_box.findText(suite) >= 0:
            self.suite_box.setCurrentText(suite)
        for spin, key in ((self.minutes_spin, "minutes"), (self.tokens_spin, "max_new_tokens")):
            x = request.get(key)
            if isinstance(x, (int, float)) and math.isfinite(x):
                spin.setValue(x if isinstance(spin, QDoubleSpinBox) else int(x))

    def show_report(self, doc: dict) -> None:
        """Fill the table (confirmed setups and the best priced ones, ranked), the summary, and offer the lanes; the
        form follows the report's request (:meth:`follow`)."""
        self.doc = doc
        if isinstance(doc.get("request"), dict):
            self.follow(doc["request"])
        rows = [c for c in doc.get("candidates", []) if c.get("measured")] + [c for c in doc.get("candidates", [])[:12] if not c.get("measured")]
        rows.sort(key=lambda c: c["rank"])
        rows += [dict(rank=None, setup=e["setup"], predicted_speedup=None, measured=e["measured"], alpha=e["measured"].get("alpha"),
                      tau=e["measured"].get("tau"), why=e.get("why") or measured_only_why(e["setup"])) for e in doc.get("other_measured", [])]
        prompts = doc.get("prompts", {})
        partial = len(prompts.get("confirmed", [])) < len(prompts.get("calibrated", []))
        self.table.setRowCount(len(rows))
        winner = (doc.get("winner") or {}).get("setup")
        for r, c in enumerate(rows):
            m = c.get("measured") or {}
            won = c["setup"] == winner  # the table ranks by prediction, the winner is measured
            cells = [str(c["rank"]) if c["rank"] else "", c["setup"], predicted_cell(c, partial),
                     (_num(m.get("speedup")) + "x") if m.get("speedup") else "–", _num(m.get("tokens_per_s"), "{:.1f}"),
                     _num(c.get("alpha")), _num(c.get("tau")), c.get("why", "")]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col == 7:
                    item.setToolTip(text)
                if col == 2 and text.endswith("*"):
                    item.setToolTip(f"predicted on the {len(prompts['confirmed'])} prompts the confirmation measured; "
                                    f"{_num(c.get('predicted_speedup'))}x on all {len(prompts['calibrated'])} calibrated")
                if col in (0, 2, 3, 4, 5, 6):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if won:
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                    if col == 1:
                        item.setToolTip("fastest here (measured): the winner")
                self.table.setItem(r, col, item)
        self.table.resizeColumnsToContents()
        self._fit_split()
        lines = headline(doc)
        if partial and any(c.get("measured") and c.get("rank") for c in rows):
            lines.append(partial_note(doc))
        for cat, x in doc.get("winners_by_category", {}).items():
            lines.append(f"{cat or '(none)'}: {x['setup']} ({category_figures(x)})")
        lines += [f"break-even: {t}" for t in doc.get("break_even_text", [])]
        lines += [note for note in (verify_note(doc), speed_note(doc)) if note]
        if doc.get("not_tried"):
            lines.append("not tried:")
            lines += [f"  • {t}" for t in doc["not_tried"]]
        self.summary.setPlainText("\n".join(lines))
        self.use_btn.setEnabled(len(winner_lanes(doc)) > 1)
        self.report.emit(doc)

    def _fit_split(self) -> None:
        """Give the table the height of its rows (at most 70 % of the two) and the summary the rest."""
        t = self.table
        need = (t.horizontalHeader().height() + sum(t.rowHeight(r) for r in range(t.rowCount()))
                + t.horizontalScrollBar().sizeHint().height() + 2 * t.frameWidth() + 4)
        h = sum(self.split.sizes())
        if h > 0:
            top = min(need, int(0.7 * h))
            self.split.setSizes([top, h - top])

    def _use(self) -> None:
        if self.doc is not None:
            self.useLanes.emit(winner_lanes(self.doc))

    def closeEvent(self, e) -> None:  # noqa: N802 - Qt's name
        if self.proc is not None:
            self.proc.kill()
            self.proc.waitForFinished(5000)
            self._done()
        super().closeEvent(e)
