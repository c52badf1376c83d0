"""The status bar as a run sink: what the run is doing (the whole task, elided in the middle only when the
bar is too narrow, full text in the tooltip), a progress bar for long work, and the worker's state."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QLabel, QProgressBar, QSizePolicy, QStatusBar, QWidget

from app.core.events import LaneDone, LaneStarted, Progress, RunError
from app.ui.results import run_winner
from app.ui.sinks import WorkerSilence
from app.ui.theme import Theme
from app.worker.messages import WorkerReady
from app.worker.plan import RunPlan, RunResults

__all__ = ["ElidedLabel", "RunStatusBar", "progress_text", "engine_problems_text"]


def engine_problems_text(problems) -> str:
    """One status-bar line for broken engine manifests: the error itself when there is one (first line, with
    its fix), else the count and the first."""
    if not problems:
        return ""
    first = " — ".join(x.strip() for x in problems[0].message.splitlines() if x.strip())
    if len(problems) == 1:
        return f"⚠ {first}; the other engines are listed"
    return f"⚠ {len(problems)} engine manifests are broken (their errors are in the tooltip of ⚠ on the right); first: {first}"


class ElidedLabel(QLabel):
    """A one-line label that shows its whole text when it fits and elides it in the middle when it does not;
    :meth:`text` and the tooltip always hold the full text."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self._full = text
        self._elide()

    def text(self) -> str:
        return self._full

    def shown_text(self) -> str:
        """What is painted (elided or whole)."""
        return super().text()

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(QFontMetrics(self.font()).horizontalAdvance(self._full) + 8, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(40, super().minimumSizeHint().height())

    def resizeEvent(self, ev) -> None:  # noqa: N802
        super().resizeEvent(ev)
        self._elide()

    def _elide(self) -> None:
        fm = QFontMetrics(self.font())
        avail = self.contentsRect().width()
        shown = self._full if fm.horizontalAdvance(self._full) <= avail else fm.elidedText(self._full, Qt.TextElideMode.ElideMiddle, avail)
        QLabel.setText(self, shown)
        self.setToolTip(self._full if shown != self._full else "")


def progress_text(ev: Progress) -> str:
    """The task of a Progress event in full, without the engine name twice ("name: load name" → "load name"),
    with its count ("(12/40 MiB)") when it has a unit."""
    name, sep, rest = ev.task.partition(": ")
    task = rest if sep and name in rest else ev.task
    unit = f" {ev.unit}" if ev.unit else ""
    detail = f" ({ev.done:.0f}/{ev.total:.0f}{unit})" if ev.total > 0 and ev.unit else ""
    return f"{task}{detail}"


class RunStatusBar:
    """Fills a QStatusBar: message (stretching), progress bar and worker label (permanent).

    Attributes:
        label: the message (an ElidedLabel; `label.text()` is the full text).
    """

    def __init__(self, bar: QStatusBar) -> None:
        bar.setAutoFillBackground(True)  # opaque: its updates do not repaint the window beneath it
        self.bar = bar
        self.label = ElidedLabel("ready")
        self.label.setObjectName("statusMessage")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(160)
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.worker = QLabel("worker: not started")
        self.worker.setObjectName("workerLabel")
        self.engines = QLabel("")  # "⚠ 1 broken engine manifest", its errors in the tooltip
        self.engines.setObjectName("engineProblems")
        self.engines.setContentsMargins(0, 0, 10, 0)
        self.engines.hide()
        bar.addWidget(self.label, 1)
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.engines)
        bar.addPermanentWidget(self.worker)
        self.plan: RunPlan | None = None
        self.results: RunResults | None = None

    def show_message(self, text: str) -> None:
        self.label.setText(text)

    def set_engine_problems(self, problems) -> None:
        """Broken engine manifests (app.engines.registry.ManifestProblem): a permanent "⚠ N broken engine
        manifest(s)" whose tooltip holds every error, and the first error (or the count) as the message."""
        if not problems:
            self.engines.hide()
            return
        n = len(problems)
        self.engines.setText(f"⚠ {n} broken engine manifest{'s' if n > 1 else ''}")
        self.engines.setToolTip("\n\n".join(p.message for p in problems))
        self.engines.show()
        self.show_message(engine_problems_text(problems))

    def set_worker(self, state: str, text: str) -> None:
        """The worker's state ("starting" | "ready" | "dead" | "died") and its line."""
        self.worker.setText(text)
        if state == "starting" and self.results is not None and self.results.t_end is None:
            self.show_message("starting the worker…")

    # --- RunSink -----------------------------------------------------------------------------------
    def start_run(self, plan: RunPlan, results: RunResults) -> None:
        self.plan, self.results = plan, results
        self.progress.hide()
        self.show_message("running…")

    def on_event(self, ev: object, _t: float) -> None:
        if isinstance(ev, Progress):
            self._progress(ev)
        elif isinstance(ev, WorkerReady):
            self.show_message("worker ready: loading engines…")
        elif isinstance(ev, LaneStarted):
            self.progress.hide()
            self.show_message("warming up…" if RunPlan.is_warmup(ev.lane_id) else self._running())
        elif isinstance(ev, LaneDone) and not RunPlan.is_warmup(ev.lane_id):
            self.show_message(self._running())
        elif isinstance(ev, RunError) and ev.lane_id is None:
            self.show_message("⚠ " + ev.message.splitlines()[0])
        elif isinstance(ev, WorkerSilence):
            self.show_message("⚠ " + ev.message if ev.silent_s else self._running() + " (the worker answered again)")

    def _running(self) -> str:
        r = self.results
        return f"running… {r.finished}/{r.total} lanes finished" if r is not None and r.finished else "running…"

    def _progress(self, ev: Progress) -> None:
        bar = self.progress
        if ev.total > 0 and (ev.unit or ev.total > 1):
            bar.setRange(0, 1000)
            bar.setValue(int(1000 * min(1.0, ev.done / ev.total)))
            bar.setVisible(ev.done < ev.total)
        else:  # one-shot work ("load X" 0/1): a busy bar until it is done
            bar.setRange(0, 0)
            bar.setVisible(not (ev.total > 0 and ev.done >= ev.total))
        bar.setFormat("%p%")
        self.show_message(progress_text(ev))

    def finish(self, results: RunResults) -> None:
        self.progress.hide()
        n_ok = len(results.by_lane())
        word = "stopped" if results.stopped else "finished"
        text = f"run {word}: {n_ok}/{results.total} lanes completed"
        win = run_winner(self.plan, results) if self.plan is not None and not results.stopped else None
        if win is not None:
            text += f" · winner: {win[0]} {win[1]}"
        if None in results.errors:  # the worker died, or Stop had to kill a silent one
            text += " · ⚠ " + results.errors[None].message.splitlines()[0]
        self.show_message(text)

    def set_theme(self, theme: Theme) -> None:
        pass
