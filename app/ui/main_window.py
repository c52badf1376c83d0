"""SpecDeck's main window: pick a target and 1–4 setups, a prompt and sampling; Run; watch the lanes race.

Layout: toolbar (preset, target, mode, Run/Stop) · left dock (lanes' setup editors, sampling, prompt) ·
centre (legend, lane views) over tabs (live plots, results) · status bar (task, loading progress, worker).

The window builds the layout and keeps sessions and settings; a :class:`RunController` runs the
:class:`RunPlan` and fans its events out to the run sinks (lanes area, plots, results, status bar).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QDockWidget,
    QFileDialog,
    QFrame,
    QLabel,
    QMainWindow,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import SpecDeckError
from app.core.prompts import Prompt
from app.core.report import build_report
from app.ui.cost_plot import CostPanel
from app.ui.lanes_area import LanesArea
from app.ui.load import LoadMeter, prepare_sampler, start_sampler
from app.ui.plots import PlotPanel
from app.ui.priority import gui_priority
from app.ui.results import ResultsPanel
from app.ui.run_controller import RunController
from app.ui.session import PRESETS, Session, default_preset_name
from app.ui.setup_dock import MAX_LANES, WARMUP_TOKENS, SetupPanel
from app.ui.setup_editor import engine_name, fill_engine_combo
from app.ui.status_bar import RunStatusBar
from app.ui.theme import DARK, LIGHT, apply_palette
from app.worker.group import WorkerGroup
from app.worker.plan import RunPlan

__all__ = ["MainWindow", "MAX_LANES", "engine_statuses", "engine_scan"]


def engine_scan():
    """(statuses, problems): every engine whose manifest loads, and the broken manifests beside them
    (app.engines.registry.ManifestProblem). Never raises: the GUI must start whatever the manifests hold."""
    from app.core.errors import EngineError
    from app.engines.manifest import ManifestProblem

    try:
        from app.engines.status import scan_status

        return scan_status()
    except Exception as e:
        return [], [ManifestProblem("engines", Path("engines"), EngineError(f"the engine manifests could not be listed: {e}"))]


def engine_statuses():
    """Every engine whose manifest loads (broken manifests are left out; see :func:`engine_scan`)."""
    return engine_scan()[0]


class MainWindow(QMainWindow):
    """The app window. `settings` defaults to QSettings("SpecDeck", "SpecDeck"); tests pass their own, and a
    `client_factory` standing in for the worker client.

    Signals:
        runStarted(str): run id, after the command was handed to the worker bridge.
        runEnded(str): run id, after every lane ended (done, cancelled, failed) and results are shown.
    """

    runStarted = Signal(str)
    runEnded = Signal(str)

    def __init__(self, settings: QSettings | None = None, session: Session | None = None, statuses=None, telemetry: bool = True,
                 client_factory=WorkerGroup, manifest_problems=None) -> None:
        super().__init__()
        self.setWindowTitle("SpecDeck — speculative decoding, side by side")
        self.settings = settings if settings is not None else QSettings("SpecDeck", "SpecDeck")
        if statuses is not None:
            self.statuses, self.manifest_problems = list(statuses), list(manifest_problems or ())
        else:
            self.statuses, self.manifest_problems = engine_scan()
        self.startup_notes: list[str] = []  # said in the status bar once the window is built
        self.theme = DARK if self._setting("ui/dark", False, bool) else LIGHT
        self._run_counter = 0
        self.run_load: dict = {}  # the last run's CPU use (window, worker, cores) and its note
        self._build_toolbar()
        self._build_dock()
        self._build_centre()
        self.status = RunStatusBar(self.statusBar())
        self._build_menus()
        self.load_meter = LoadMeter()
        self.controller = RunController(self, [self.lanes, self.plots, self.results, self.costs, self.status, self.load_meter],
                                        client_factory)
        self.controller.runStarted.connect(self._run_started)
        self.controller.runEnded.connect(self._run_ended)
        self.controller.workerState.connect(self.status.set_worker)
        self.setup_panel.lanesChanged.connect(self._lanes_changed)

        first = session if session is not None else self._remembered_session()
        try:
            self.apply_session(first)
        except SpecDeckError as e:
            self.startup_notes.append(f"⚠ the session given could not be shown ({e.message}); started from a preset")
            self.apply_session(self._default_preset())
        self.apply_theme(self.theme)
        self.lanes.hide_rejected.setChecked(self._setting("ui/hide_rejected", False, bool))
        self.setup_panel.warmup_check.setChecked(self._setting("ui/warmup", True, bool))
        self.live_plots_action.setChecked(self._setting("ui/live_plots", True, bool))
        geo = self._setting("ui/geometry", None, None)
        if geo is not None:
            try:
                self.restoreGeometry(geo)
            except (TypeError, ValueError):
                pass
        self.sampler = None
        if telemetry:
            self._start_telemetry()
        if self.manifest_problems:
            self.status.set_engine_problems(self.manifest_problems)
        if self.startup_notes:
            self.status.show_message(" · ".join([*self.startup_notes, *([self.status.label.text()] if self.manifest_problems else [])]))

    # ================================================================================= UI building
    def _build_toolbar(self) -> None:
        tb = QToolBar("Run")
        tb.setObjectName("runToolbar")
        tb.setMovable(False)
        self.addToolBar(tb)
        self.preset_combo = QComboBox()
        self.preset_combo.addItem("Preset…", None)
        for name in PRESETS:
            self.preset_combo.addItem(name, name)
        self.preset_combo.activated.connect(self._preset_chosen)
        self.target_combo = QComboBox()
        self.target_combo.setEditable(True)
        self.target_combo.setMinimumContentsLength(26)
        self.target_combo.setToolTip("target model: an engine name or a model folder")
        fill_engine_combo(self.target_combo, self.statuses, keep="", problems=self.manifest_problems)
        self.target_combo.currentTextChanged.connect(self._target_changed)
        self.mode_combo = QComboBox()
        self.mode_combo.addItem("interleaved (race)", "interleaved")
        self.mode_combo.addItem("sequential", "sequential")
        self.mode_combo.setToolTip(
            "interleaved: lanes advance one step each in turn, each timed on its own clock;\nsequential: one lane after another"
        )
        self.run_btn = QPushButton("▶  Run")
        self.run_btn.setObjectName("runButton")
        self.run_btn.setToolTip("Run (Ctrl+Enter)")
        self.run_btn.clicked.connect(self.run)
        self.stop_btn = QPushButton("■  Stop")
        self.stop_btn.setToolTip("Stop (Esc): lanes stop within one step")
        self.stop_btn.setEnabled(False)
        self.stop_btn.clicked.connect(self.stop)
        for w in (QLabel(" Preset "), self.preset_combo, None, QLabel(" Target "), self.target_combo, QLabel("  Mode "),
                  self.mode_combo, None, self.run_btn, self.stop_btn):
            tb.addSeparator() if w is None else tb.addWidget(w)
        spacer = QWidget()
        spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        tb.addWidget(spacer)
        self.dark_action = QAction("Dark", self)
        self.dark_action.setCheckable(True)
        self.dark_action.setToolTip("light / dark palette")
        self.dark_action.toggled.connect(lambda on: self.apply_theme(DARK if on else LIGHT))
        tb.addAction(self.dark_action)
        for seq in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(seq), self, activated=self.run, context=Qt.ShortcutContext.ApplicationShortcut)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.stop, context=Qt.ShortcutContext.ApplicationShortcut)

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        for text, slot, key in (
            ("Open session…", self.open_session, QKeySequence.StandardKey.Open),
            ("Save session…", self.save_session, QKeySequence.StandardKey.Save),
            (None, None, None),
            ("Export results JSON…", self.export_json, None),
            ("Export results CSV…", self.export_csv, None),
            ("Save window as PNG…", self.save_window_png, None),
            ("Save plots as PNG…", self.save_plots_png, None),
            (None, None, None),
            ("Quit", self.close, QKeySequence.StandardKey.Quit),
        ):
            if text is None:
                m.addSeparator()
                continue
            a = m.addAction(text)
            a.triggered.connect(lambda _=False, s=slot: s())
            if key is not None:
                a.setShortcut(key)
        v = self.menuBar().addMenu("&View")
        v.addAction(self.dark_action)
        self.hide_rejected_action = v.addAction("Hide rejected drafts")
        self.hide_rejected_action.setCheckable(True)
        self.hide_rejected_action.toggled.connect(self.lanes.hide_rejected.setChecked)
        self.lanes.hide_rejected.toggled.connect(self.hide_rejected_action.setChecked)
        self.live_plots_action = v.addAction("Live plots during runs")
        self.live_plots_action.setCheckable(True)
        self.live_plots_action.setChecked(True)
        self.live_plots_action.setToolTip("untick to draw the plots once, when the run ends: on a machine with few cores the\n"
                                          "window's drawing takes CPU from the lanes it measures")
        self.live_plots_action.toggled.connect(self.plots.set_live)

    def _build_dock(self) -> None:
        self.setup_panel = SetupPanel()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(self.setup_panel)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.setup_dock = QDockWidget("Setup", self)
        self.setup_dock.setObjectName("setupDock")
        self.setup_dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        self.setup_dock.setWidget(scroll)
        self.setup_dock.setMinimumWidth(370)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.setup_dock)

    def _build_centre(self) -> None:
        centre = QWidget()
        cl = QVBoxLayout(centre)
        cl.setContentsMargins(4, 4, 4, 0)
        self.lanes = LanesArea(self.theme)
        cl.addWidget(self.lanes)
        self.plots = PlotPanel(self.theme)
        self.results = ResultsPanel(self.theme)
        self.costs = CostPanel(self.theme)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.plots, "Live plots")
        self.tabs.addTab(self.results, "Results")
        self.tabs.addTab(self.costs, "Costs")
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(centre)
        split.addWidget(self.tabs)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setChildrenCollapsible(False)
        self.splitter = split
        self.setCentralWidget(split)
        self.resize(1560, 980)

    # ================================================================================= shortcuts to parts
    @property
    def bridge(self):
        return self.controller.bridge

    @property
    def running(self) -> bool:
        return self.controller.running

    @property
    def lane_views(self):
        return self.lanes.views

    @property
    def lane_by_id(self):
        return self.lanes.by_id

    @property
    def lane_rows(self):
        return self.setup_panel.rows

    @property
    def status_label(self):
        return self.status.label

    def add_lane(self, setup: str = "baseline", after: int | None = None):
        return self.setup_panel.add_lane(setup, after)

    def remove_lane(self, i: int) -> None:
        self.setup_panel.remove_lane(i)

    def set_setups(self, setups) -> None:
        self.setup_panel.set_setups(setups)

    def setups(self) -> list[str]:
        return self.setup_panel.setups()

    def _lanes_changed(self) -> None:
        self.run_btn.setEnabled(self.setup_panel.invalid_lane() is None and not self.running)
        if not self.running:
            self.lanes.set_setups(self.setups())

    # ================================================================================= target
    def _target_status(self):
        name = self.target()
        return next((s for s in self.statuses if s.name == name), None)

    def _target_changed(self, _text: str) -> None:
        self.setup_panel.set_engines(self.statuses, self._target_status())

    def target(self) -> str:
        return engine_name(self.target_combo.currentText())

    # ================================================================================= sessions
    def session(self) -> Session:
        p = self.setup_panel
        return Session(target=self.target(), setups=tuple(self.setups()), prompt=p.prompt(), prompt_id=p.prompt_id,
                       chat=p.chat_check.isChecked(), mode=self.mode_combo.currentData(), sampling=p.sampling())

    def apply_session(self, s: Session) -> None:
        """Show session `s`, all or nothing.

        Raises:
            SpecDeckError: `s` is not a usable session (a type, a range, a setup that does not parse); the window is
                left as it was.
        """
        s = s.validated()
        before = self.session()
        try:
            self._apply_session(s)
        except Exception:
            if before.setups:
                self._apply_session(before)
            raise

    def _apply_session(self, s: Session) -> None:
        self.target_combo.setEditText(s.target)
        self._target_changed(s.target)
        p = self.setup_panel
        p.set_setups(s.setups)
        p.set_prompt(s.prompt, s.prompt_id)
        p.chat_check.setChecked(s.chat)
        self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(s.mode)))
        p.set_sampling(s.sampling)

    def apply_preset(self, name: str) -> None:
        self.apply_session(PRESETS[name])
        i = self.preset_combo.findData(name)
        if i >= 0:
            self.preset_combo.setCurrentIndex(i)

    def _preset_chosen(self, i: int) -> None:
        name = self.preset_combo.itemData(i)
        if name:
            self.apply_preset(name)

    def _default_preset(self) -> Session:
        usable = {s.name for s in self.statuses if s.usable}
        return PRESETS[default_preset_name(usable)]

    def _setting(self, key: str, default, typ):
        """A remembered setting, or `default` when it is missing or unreadable (a hand-edited or damaged file)."""
        try:
            v = self.settings.value(key, default, type=typ) if typ is not None else self.settings.value(key, default)
        except Exception:
            return default
        return v if typ is None or isinstance(v, typ) else default

    def _remembered_session(self) -> Session:
        """The session of the last launch; the default preset when there is none or it cannot be used (then the
        status bar says why once the window is up)."""
        try:
            raw = self.settings.value("session/last")
        except Exception as e:
            raw, why = None, f"the settings file could not be read ({e})"
        else:
            why = ""
        if raw:
            try:
                if not isinstance(raw, str):
                    raise SpecDeckError(f"not a SpecDeck session (text was expected, got {type(raw).__name__})")
                return Session.from_json(json.loads(raw))
            except SpecDeckError as e:
                why = e.message
            except (ValueError, RecursionError) as e:  # not JSON
                why = f"not JSON ({e})"
        name = default_preset_name({s.name for s in self.statuses if s.usable})
        if why:
            where = self.settings.fileName()
            self.startup_notes.append(f"⚠ the remembered session in {where} was unreadable ({why}); started from the preset “{name}”")
        return PRESETS[name]

    def save_settings(self) -> None:
        self.settings.setValue("session/last", json.dumps(self.session().to_json()))
        self.settings.setValue("ui/dark", self.theme.dark)
        self.settings.setValue("ui/hide_rejected", self.lanes.hide_rejected.isChecked())
        self.settings.setValue("ui/warmup", self.setup_panel.warmup_check.isChecked())
        self.settings.setValue("ui/live_plots", self.live_plots_action.isChecked())
        self.settings.setValue("ui/geometry", self.saveGeometry())
        self.settings.sync()

    def save_session(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save session", "specdeck-session.json", "SpecDeck session (*.json)")
            if not path:
                return None
        self.session().save(path)
        self.status.show_message(f"session saved to {path}")
        return path

    def open_session(self, path: str | None = None) -> bool:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open session", "", "SpecDeck session (*.json)")
            if not path:
                return False
        try:
            self.apply_session(Session.load(path))
        except SpecDeckError as e:
            self.status.show_message(f"⚠ {e.message}")
            return False
        self.status.show_message(f"session loaded from {path}")
        return True

    # ================================================================================= run / stop
    def plan(self) -> RunPlan:
        """The run the current fields describe.

        Raises:
            SpecDeckError: an invalid lane, no target, no prompt, bad sampling (the message says which).
        """
        bad = self.setup_panel.invalid_lane()
        if bad is not None:
            raise SpecDeckError(f"lane {bad[0] + 1}: {bad[1].error_text.splitlines()[0]}")
        p = self.setup_panel
        sampling = p.sampling().validated()
        if not self.target():
            raise SpecDeckError("pick a target model")
        if not p.prompt().strip():
            raise SpecDeckError("type a prompt or pick one")
        self._run_counter += 1
        return RunPlan(self.target(), tuple(self.setups()), (Prompt(p.prompt_id, p.prompt()),), sampling,
                       mode=self.mode_combo.currentData(), chat=p.chat_check.isChecked(),
                       warmup_tokens=WARMUP_TOKENS if p.warmup_check.isChecked() else 0,
                       run_id=f"run{self._run_counter}-{int(time.time()) % 100000}")

    def run(self) -> str | None:
        """Start a run with the current setup; returns its id (None when refused, with the reason shown)."""
        if self.running:
            return None
        try:
            plan = self.plan()
        except SpecDeckError as e:
            self.status.show_message(f"⚠ {e.message}")
            return None
        if self.sampler is not None and (warning := prepare_sampler(self.sampler, plan.target, plan.setups)):
            self.status.show_message(f"⚠ {warning}")
        self.save_settings()
        return self.controller.start(plan)

    def stop(self) -> None:
        """Cancel the current run (lanes stop within one step)."""
        if self.running:
            self.status.show_message("stopping…")
            self.controller.stop()

    def _set_running_ui(self, running: bool) -> None:
        self.run_btn.setEnabled(not running and self.setup_panel.invalid_lane() is None)
        self.stop_btn.setEnabled(running)
        for w in (self.setup_panel, self.target_combo, self.preset_combo, self.mode_combo):
            w.setEnabled(not running)

    def _run_started(self, run_id: str) -> None:
        self._set_running_ui(True)
        self.runStarted.emit(run_id)

    def _run_ended(self, run_id: str) -> None:
        self._set_running_ui(False)
        self._measure_load()
        r = self.controller.results
        if r is not None and not r.stopped and r.by_lane():
            self.tabs.setCurrentWidget(self.results)
        self.runEnded.emit(run_id)

    def _measure_load(self) -> None:
        """The window's and the worker's CPU while the lanes ran, the lanes' CPU wait and the window's lag; a note in
        the results and the status bar when the figures may be distorted (app.ui.load)."""
        samples = self.sampler.samples() if self.sampler is not None else []
        self.run_load, notes = self.load_meter.evaluate(samples, self.controller.results, gui_priority())
        self.results.set_load_note(("⚠ " + self.run_load["note"]) if notes else "")
        if notes:
            self.status.show_message(f"{self.status.label.text()} · ⚠ {' · '.join(h for h, _ in notes)} (see Results)")

    def _start_telemetry(self) -> None:
        def pids():
            d = {"gui": os.getpid()}
            if self.bridge.pid:
                d["worker"] = self.bridge.pid
            return d

        self.sampler, state = start_sampler(self.plots.add_sample, pids)
        self.plots.set_gpu_state(state)

    # ================================================================================= exports
    def report(self) -> dict:
        """The run report (the bench JSON schema) with `telemetry[]` and `gui{…}`."""
        r, plan = self.controller.results, self.controller.plan
        st = next((s for s in self.statuses if s.name == (plan.target if plan else self.target())), None)
        device, dtype = (st.device, st.dtype) if st else ("auto", "auto")
        gui = {
            "mode": plan.mode if plan else self.mode_combo.currentData(),
            "chat": plan.chat if plan else self.setup_panel.chat_check.isChecked(),
            "warmup_tokens": plan.warmup_tokens if plan else 0,
            "lanes": [{"lane": s.lane_id, "setup": s.setup, "error": r.lane_error(s.lane_id) if r else None} for s in (plan.lanes if plan else ())],
            "worker": self.controller.worker_info,
            "load": self.run_load,
            "live_plots": self.live_plots_action.isChecked(),
        }
        extra = {"telemetry": self.sampler.to_json() if self.sampler is not None else [], "gui": gui}
        if r is None:
            return build_report(self.target(), device, dtype, [], sampling=asdict(self.setup_panel.sampling()), extra=extra)
        return r.report(device, dtype, extra)

    def export_json(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export results JSON", "specdeck-run.json", "JSON (*.json)")
            if not path:
                return None
        Path(path).write_text(json.dumps(self.report(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        self.status.show_message(f"results written to {path}")
        return path

    def export_csv(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export results CSV", "specdeck-run.csv", "CSV (*.csv)")
            if not path:
                return None
        self.results.write_csv(path)
        self.status.show_message(f"results written to {path}")
        return path

    def save_window_png(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save window as PNG", "specdeck.png", "PNG (*.png)")
            if not path:
                return None
        self.lanes.flush()
        self.grab().save(path)
        return path

    def save_plots_png(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save plots as PNG", "specdeck-plots.png", "PNG (*.png)")
            if not path:
                return None
        self.plots.save_png(path)
        return path

    # ================================================================================= theme, close
    def apply_theme(self, theme) -> None:
        self.theme = theme
        app = QApplication.instance()
        if app is not None:
            apply_palette(app, theme)
        if self.dark_action.isChecked() != theme.dark:
            self.dark_action.blockSignals(True)
            self.dark_action.setChecked(theme.dark)
            self.dark_action.blockSignals(False)
        for sink in self.controller.sinks:
            sink.set_theme(theme)
        self.run_btn.setStyleSheet("QPushButton#runButton { font-weight:600; padding:4px 14px }")

    def shutdown(self) -> None:
        """Stop timers, telemetry and the worker (idempotent)."""
        self.controller.frame.stop()
        self.plots.timer.stop()
        if self.sampler is not None:
            try:
                self.sampler.close()
            except Exception:
                pass
            self.sampler = None
        self.controller.shutdown()

    def closeEvent(self, ev) -> None:  # noqa: N802 (Qt's name)
        try:
            self.save_settings()
        finally:
            self.shutdown()
        super().closeEvent(ev)
