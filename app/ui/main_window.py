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
from PySide6.QtGui import QAction, QFont, QKeySequence, QShortcut
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
from app.ui.run_controller import REPLAY_SPEEDS, RunController
from app.ui.session import PRESETS, Session, UnusableSession, default_preset_name
from app.ui.setup_dock import MAX_LANES, WARMUP_TOKENS, SetupPanel
from app.ui.setup_editor import engine_name, fill_engine_combo
from app.ui.status_bar import RunStatusBar
from app.ui.theme import DARK, LIGHT, apply_palette
from app.worker.group import WorkerGroup
from app.worker.plan import RunPlan
from app.worker.runfile import SUFFIX, RunFileError, RunRecord, beside, load, machine_info, save

__all__ = ["MainWindow", "MAX_LANES", "engine_statuses", "engine_scan", "PRESENT_PX"]

#: lane text in presentation mode at zoom 1, in pixels: readable from about 5 m on a 1080p projector
PRESENT_PX = 28
#: presentation zoom range (Ctrl+= / Ctrl+−) and its step
PRESENT_ZOOM = (0.6, 3.0, 1.125)


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
        self.controller.replaySample.connect(self._replayed_sample)
        self.record: RunRecord | None = None  # the run shown: the last live run's recording, or a run file opened
        self._record_setup_note = ""  # why the setup panel does not show the opened run's setup ("": it does)
        self.record_path: str | None = None  # where `record` was read from or saved to
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
        self.presenting = False
        self._before_present: tuple | None = None
        self.present_zoom = min(PRESENT_ZOOM[1], max(PRESENT_ZOOM[0], self._setting("ui/present_zoom", 1.0, float)))
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
        self.mode_combo.addItem("paced (fair timing)", "paced")
        self.mode_combo.addItem("sequential", "sequential")
        self.mode_combo.setToolTip(
            "interleaved: lanes advance one step each in turn, each timed on its own clock (a faster lane shows ahead);\n"
            "paced: the lane with the fewest tokens steps next, so all lanes share one stretch of time\n"
            "(speedups that hold on a busy machine; the lanes' text grows together);\nsequential: one lane after another"
        )
        self.run_btn = QPushButton("▶  Run")
        self.run_btn.setObjectName("runButton")
        self.run_btn.setToolTip("Run (Ctrl+Enter)")
        self.run_btn.clicked.connect(self.run)
        self.stop_btn = QPushButton("■  Stop")
        self.stop_btn.setToolTip("Stop (Esc): lanes stop within one step")
        self.stop_btn.setEnabled(False)
        self.stop_btn.clicked.connect(self.stop)
        self.replay_btn = QPushButton("⟲  Replay")
        self.replay_btn.setToolTip("Replay the run shown at its recorded pace, with no worker and no model (Ctrl+R)")
        self.replay_btn.setEnabled(False)
        self.replay_btn.clicked.connect(lambda: self.replay())
        self.speed_combo = QComboBox()
        for speed in REPLAY_SPEEDS:
            self.speed_combo.addItem(f"{speed:g}x" if speed else "at once", speed)
        self.speed_combo.setToolTip("replay speed: the recorded pace, faster, or the run as it finished")
        for w in (QLabel(" Preset "), self.preset_combo, None, QLabel(" Target "), self.target_combo, QLabel("  Mode "),
                  self.mode_combo, None, self.run_btn, self.stop_btn, None, self.replay_btn, self.speed_combo):
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
        QShortcut(QKeySequence("Ctrl+R"), self, activated=lambda: self.replay(), context=Qt.ShortcutContext.ApplicationShortcut)
        for seq, step in (("Ctrl+=", 1), ("Ctrl++", 1), ("Ctrl+-", -1)):
            QShortcut(QKeySequence(seq), self, activated=lambda d=step: self.zoom(d), context=Qt.ShortcutContext.ApplicationShortcut)

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        for text, slot, key in (
            ("Open session…", self.open_session, QKeySequence.StandardKey.Open),
            ("Save session…", self.save_session, QKeySequence.StandardKey.Save),
            (None, None, None),
            ("Open run…", self.open_run, QKeySequence("Ctrl+Shift+O")),
            ("Open run beside…", self.open_run_beside, QKeySequence("Ctrl+Shift+B")),
            ("Save run…", self.save_run, QKeySequence("Ctrl+Shift+S")),
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
        r = self.menuBar().addMenu("&Run")
        self.tune_action = r.addAction("Find the fastest setup…")
        self.tune_action.setShortcut(QKeySequence("Ctrl+Shift+F"))
        self.tune_action.setToolTip("calibrate the drafters, price every setup of a grid with this machine's costs, confirm the best")
        self.tune_action.triggered.connect(lambda: self.find_fastest_setup())
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
        self.machine_action = v.addAction("Machine name…")
        self.machine_action.setToolTip("how run files saved here name this machine (e.g. \"laptop\"); runs put beside each other show it")
        self.machine_action.triggered.connect(lambda: self.ask_machine_label())
        v.addSeparator()
        self.present_action = v.addAction("Present")
        self.present_action.setCheckable(True)
        self.present_action.setShortcut(QKeySequence(Qt.Key.Key_F11))
        self.present_action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        self.present_action.setToolTip("full screen, the setup hidden, large text and one tokens/s plot (F11; Ctrl+= / Ctrl+− text size)")
        self.present_action.toggled.connect(self.present)
        self.addAction(self.present_action)  # F11 works with the menu bar hidden

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

    def find_fastest_setup(self):
        """Run ▸ Find the fastest setup: the finder's dialog for the current target (one at a time); its winners
        become lanes on request, its break-even line goes to the Costs tab."""
        from app.core.prompts import list_suites
        from app.ui.tune_dialog import TuneDialog

        d = getattr(self, "tune_dialog", None)
        if d is None or d.target != self.target():
            if d is not None and d.running:
                d.raise_()
                return d
            d = self.tune_dialog = TuneDialog(self.target(), list_suites(), self, busy=lambda: self.running)
            d.useLanes.connect(self.set_setups)
            d.report.connect(lambda doc: self.costs.set_break_even(doc.get("break_even_text", [])))
        d.show()
        d.raise_()
        return d

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
        self.settings.setValue("ui/present_zoom", self.present_zoom)
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
        self.replay_btn.setEnabled(not running and self.record is not None)
        for w in (self.setup_panel, self.target_combo, self.preset_combo, self.mode_combo):
            w.setEnabled(not running)

    def _run_started(self, run_id: str) -> None:
        if self.controller.replaying is None:
            self.record, self.record_path, self._record_setup_note = None, None, ""
            self.plots.show_live_telemetry()
            self._set_title()
        self._set_running_ui(True)
        self.runStarted.emit(run_id)

    def _run_ended(self, run_id: str) -> None:
        rec = self.controller.replaying
        if rec is None:
            self._measure_load()
            self._keep_record()
        else:
            note = (rec.report.get("gui") or {}).get("load", {}).get("note", "") if isinstance(rec.report.get("gui"), dict) else ""
            self.results.set_load_note(f"⚠ {note}" if note else "")
            self.status.show_message(f"{self._record_line(rec)} · Replay (Ctrl+R) plays it again"
                                     + (f" · {self._record_setup_note}" if self._record_setup_note else ""))
        self._set_running_ui(False)
        r = self.controller.results
        if r is not None and not r.stopped and r.by_lane():
            self.tabs.setCurrentWidget(self.results)
        self.runEnded.emit(run_id)

    # ================================================================================= presentation
    def present(self, on: bool = True) -> None:
        """Presentation mode: full screen, the setup panel and menu hidden, the lanes and one large tokens/s plot,
        text at :data:`PRESENT_PX` × the remembered zoom; Run (Ctrl+Enter), Stop (Esc) and Replay (Ctrl+R) from the
        keyboard; F11 leaves it, restoring the window as it was."""
        on = bool(on)
        if on == self.presenting:
            return
        self.presenting = on
        if self.present_action.isChecked() != on:
            self.present_action.blockSignals(True)
            self.present_action.setChecked(on)
            self.present_action.blockSignals(False)
        if on:
            self._before_present = (self.windowState(), self.setup_dock.isVisible(), self.tabs.currentIndex(), self.splitter.sizes(),
                                    self.geometry())
            self.setup_dock.hide()
            self.menuBar().hide()
            self.tabs.setCurrentWidget(self.plots)
            screen = self.screen()
            if screen is not None:  # without a window manager (Xvfb, kiosks) full screen is only a state: fill it
                self.setGeometry(screen.geometry())
            self.showFullScreen()
            self.splitter.setSizes([3, 2])
            self.status.show_message("presenting · F11 leaves · Ctrl+= / Ctrl+− text size · Ctrl+Enter run · Esc stop · Ctrl+R replay")
        else:
            state, dock, tab, sizes = (self._before_present or (Qt.WindowState.WindowNoState, True, 0, []))[:4]
            self.menuBar().show()
            self.setup_dock.setVisible(dock)
            self.setWindowState(state)
            if self._before_present is not None and len(self._before_present) > 4:
                self.setGeometry(self._before_present[4])
            self.tabs.setCurrentIndex(tab)
            if sizes:
                self.splitter.setSizes(sizes)
        self._apply_present_px()

    def present_px(self) -> int | None:
        """Lane text size in presentation mode (None: not presenting)."""
        return round(PRESENT_PX * self.present_zoom) if self.presenting else None

    def zoom(self, step: int) -> None:
        """Presentation text one step larger (+1) or smaller (−1), remembered between launches."""
        if not self.presenting:
            return
        lo, hi, f = PRESENT_ZOOM
        self.present_zoom = min(hi, max(lo, self.present_zoom * (f if step > 0 else 1 / f)))
        self.settings.setValue("ui/present_zoom", self.present_zoom)
        self._apply_present_px()
        self.status.show_message(f"presentation text {self.present_px()} px ({self.present_zoom:.0%})")

    def _apply_present_px(self) -> None:
        px = self.present_px()
        self.lanes.set_text_px(px)
        self.results.set_text_px(None if px is None else round(px * 0.8))
        self.plots.set_presentation(None if px is None else round(px * 0.8))
        f = self.font() if px is None else QFont(self.font())
        if px is not None:
            f.setPixelSize(round(px * 0.6))
        self.tabs.tabBar().setFont(f)

    # ================================================================================= run files
    def _keep_record(self) -> None:
        """The live run that just ended, as a run file would hold it (File ▸ Save run writes it)."""
        rec = self.controller.recorder
        r = self.controller.results
        if rec is None or r is None:
            return
        samples = self.sampler.samples() if self.sampler is not None else []
        gpus = tuple(g.name for g in samples[-1].gpus) if samples else ()
        rec.machine = machine_info(self.machine_label(), gpus)
        rec.finish(self.report(), samples, stopped=r.stopped)
        self.record, self.record_path = rec.record(), None
        self._set_title()

    def machine_label(self) -> str:
        """How run files name this machine ("" : its GPU's name, else its host name); View ▸ Machine name sets it."""
        return str(self._setting("ui/machine_label", "", str))

    def ask_machine_label(self, label: str | None = None) -> str:
        """Set how run files saved here name this machine (asked in a dialog when `label` is None); "" : automatic."""
        if label is None:
            from PySide6.QtWidgets import QInputDialog

            label, ok = QInputDialog.getText(self, "Machine name", "Run files saved here name this machine (empty: its GPU, "
                                             "else its host name):", text=self.machine_label())
            if not ok:
                return self.machine_label()
        label = " ".join(str(label).split())[:40]
        self.settings.setValue("ui/machine_label", label)
        if self.record is not None and self.controller.replaying is None and self.controller.recorder is not None:
            self.record.machine = {**self.record.machine, "label": machine_info(label).get("label")}
        return label

    @staticmethod
    def _record_line(rec: RunRecord) -> str:
        when = rec.saved[:16].replace("T", " ")
        cpu = rec.machine.get("cpu")
        return f"recorded on {rec.label}" + (f" ({cpu})" if cpu else "") + f", {when}"

    def _set_title(self) -> None:
        base = "SpecDeck — speculative decoding, side by side"
        if self.record is not None and self.record_path:
            self.setWindowTitle(f"{Path(self.record_path).name} — {self._record_line(self.record)} — SpecDeck")
        else:
            self.setWindowTitle(base)

    def save_run(self, path: str | None = None) -> str | None:
        """Write the run shown (the last live run, or the run file opened) to a run file; returns where."""
        if self.record is None:
            self.status.show_message("⚠ no run to save yet: press Run, or open a run file")
            return None
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save run", f"specdeck-run{SUFFIX}", f"SpecDeck run (*{SUFFIX})")
            if not path:
                return None
        try:
            save(self.record, path)
        except OSError as e:
            self.status.show_message(f"⚠ could not save the run to {path}: {e.strerror or e}")
            return None
        self.record_path = path
        self._set_title()
        self.status.show_message(f"run saved to {path} (open it with File ▸ Open run, or `specdeck gui {path}`)")
        return path

    def _run_file(self, path: str | None, title: str) -> str | None:
        """The run file to open: `path`, or one the user picks; None (said in the status bar) while a run is going."""
        if self.running:
            self.status.show_message("⚠ a run is going: stop it before opening a run file")
            return None
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, title, "", f"SpecDeck run (*{SUFFIX});;All files (*)")
        return path or None

    def open_run(self, path: str | None = None, speed: float = 0.0) -> bool:
        """Show a run file: as it finished (`speed` 0) or replayed at `speed` times its pace. A file that cannot be
        shown leaves the window as it was and says why in the status bar."""
        path = self._run_file(path, "Open run")
        if path is None:
            return False
        try:
            rec = load(path)
        except RunFileError as e:
            self.status.show_message(f"⚠ {e}")
            return False
        self.show_record(rec, path, speed)
        return True

    def open_run_beside(self, path: str | None = None, speed: float = 0.0) -> bool:
        """Put a run file beside the run shown (the last live run or a run file): its lanes join the view labelled with
        their machine, Results ranks them together (each lane against its own run's baseline), and Replay races
        them from the same start. A file that cannot be put beside leaves the window as it was and says why."""
        if self.record is None and not self.running:
            self.status.show_message("⚠ no run to put it beside: run one, or open a run file first (File ▸ Open run)")
            return False
        path = self._run_file(path, "Open run beside this one")
        if path is None:
            return False
        try:
            both = beside(self.record, load(path))
        except RunFileError as e:
            self.status.show_message(f"⚠ {e}")
            return False
        first = Path(self.record_path).name if self.record_path else "this run"
        self.show_record(both, None, speed)
        self.setWindowTitle(f"{first} beside {Path(path).name} — {both.label} — SpecDeck")
        return True

    def show_record(self, rec: RunRecord, path: str | None = None, speed: float = 0.0) -> str | None:
        """Show `rec` in the window (its setup in the panel, its run in the lanes, plots and tables)."""
        self.record, self.record_path = rec, path
        p = rec.plan
        self._record_setup_note = ""
        try:
            self.apply_session(Session(target=p.target, setups=p.setups, prompt=p.prompts[0].prompt, prompt_id=p.prompts[0].id,
                                       chat=p.chat, mode=p.mode, sampling=p.sampling))
        except SpecDeckError as e:  # a setup this window cannot edit: the run is still shown, and the panel says whose it is
            why = e.reason if isinstance(e, UnusableSession) else e.message
            self._record_setup_note = f"the setup panel keeps your own lanes, not this run's ({why})"
        self._set_title()
        return self.replay(speed)

    def replay(self, speed: float | None = None) -> str | None:
        """Play the run shown again (`speed`: times its recorded pace, 0 at once; default: the speed box)."""
        if self.running or self.record is None:
            return None
        if speed is None:
            speed = float(self.speed_combo.currentData())
        self.plots.show_recorded_telemetry()
        return self.controller.replay(self.record, speed)

    def _replayed_sample(self, t_mono: float, data: dict) -> None:
        from app.telemetry.samples import TelemetrySample

        try:
            s = TelemetrySample.from_json({**data, "t_mono": t_mono})
        except (KeyError, TypeError, ValueError):
            return  # a damaged sample: the others still draw
        self.plots.add_recorded_sample(s)

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
        """The run report (the bench JSON schema) with `telemetry[]` and `gui{…}`; a replayed run's is the one it
        was recorded with."""
        if self.controller.replaying is not None:
            return json.loads(json.dumps(self.controller.replaying.report))
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
