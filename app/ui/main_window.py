"""SpecDeck's main window: pick a target and 1–4 setups, a prompt and sampling; Run; watch the lanes race.

Layout: toolbar (preset, target, mode, Run/Stop) · left dock (lanes' setup editors, sampling, prompt) ·
centre (legend, lane views) over tabs (live plots, results) · status bar (worker state, loading progress).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QDockWidget,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QToolBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import SpecDeckError
from app.core.events import LaneStarted, Progress, RunDone, RunError, StepEvent
from app.core.prompts import list_suites, load_suite
from app.core.report import build_report
from app.core.setups import Sampling
from app.ui.bridge import WorkerBridge
from app.ui.lane_view import LaneView
from app.ui.plots import PlotPanel
from app.ui.results import ResultsPanel
from app.ui.session import PRESETS, Session, default_preset_name
from app.ui.setup_editor import SetupEditor, fill_engine_combo
from app.ui.theme import DARK, KIND_LABELS, LANE_COLORS, LIGHT, apply_palette, token_format
from app.worker.messages import LaneSpec, RunFinished, RunLanes, WorkerDied, WorkerReady

__all__ = ["MainWindow", "MAX_LANES"]

MAX_LANES = 4


def _engine_statuses():
    try:
        from app.engines.status import all_status

        return all_status()
    except Exception:  # a broken manifest must not stop the GUI; the picker stays free text
        return []


class _LaneRow(QFrame):
    """A lane's row in the setup dock: colour swatch, setup editor, duplicate and remove buttons."""

    def __init__(self, setup: str) -> None:
        super().__init__()
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.swatch = QLabel()
        self.swatch.setFixedWidth(16)
        self.swatch.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignHCenter)
        self.editor = SetupEditor(setup)
        self.dup = QToolButton()
        self.dup.setText("dup")
        self.dup.setToolTip("duplicate this lane")
        self.remove = QToolButton()
        self.remove.setText("✕")
        self.remove.setToolTip("remove this lane")
        btns = QVBoxLayout()
        btns.setSpacing(2)
        btns.addWidget(self.dup)
        btns.addWidget(self.remove)
        btns.addStretch(1)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.swatch)
        lay.addWidget(self.editor, 1)
        lay.addLayout(btns)

    def set_index(self, i: int) -> None:
        self.swatch.setText(f"<span style='color:{LANE_COLORS[i % len(LANE_COLORS)]}; font-size:16px'>■</span><br><b>{i + 1}</b>")


class MainWindow(QMainWindow):
    """The app window. `settings` defaults to QSettings("SpecDeck", "SpecDeck"); tests pass their own.

    Signals:
        runStarted(str): run id, after the command was handed to the bridge.
        runEnded(str): run id, after every lane ended (done, cancelled, failed) and results are shown.
    """

    runStarted = Signal(str)
    runEnded = Signal(str)

    def __init__(self, settings: QSettings | None = None, session: Session | None = None, statuses=None, telemetry: bool = True) -> None:
        super().__init__()
        self.setWindowTitle("SpecDeck — speculative decoding, side by side")
        self.settings = settings if settings is not None else QSettings("SpecDeck", "SpecDeck")
        self.statuses = list(statuses) if statuses is not None else _engine_statuses()
        self.theme = DARK if self.settings.value("ui/dark", False, type=bool) else LIGHT
        self.bridge = WorkerBridge(self)
        self.run_id: str | None = None
        self.running = False
        self.run_t0 = 0.0
        self.lane_views: list[LaneView] = []
        self.lane_by_id: dict[str, LaneView] = {}
        self.lane_specs: list[LaneSpec] = []
        self.done_stats: dict[str, object] = {}
        self.lane_errors: dict[str, str] = {}
        self._run_counter = 0
        self._prompt_programmatic = False
        self.prompt_id = "custom"
        self.last_target = ""
        self.last_sampling = Sampling()
        self.worker_info = ""

        self._build_ui()
        self._connect_bridge()

        if session is None:
            session = self._remembered_session()
        self.apply_session(session)
        self.apply_theme(self.theme)
        self.hide_rejected.setChecked(self.settings.value("ui/hide_rejected", False, type=bool))
        self.warmup_check.setChecked(self.settings.value("ui/warmup", True, type=bool))
        geo = self.settings.value("ui/geometry")
        if geo is not None:
            self.restoreGeometry(geo)

        self.sampler = None
        if telemetry:
            self._start_telemetry()

        self.render_timer = QTimer(self)
        self.render_timer.setInterval(33)  # ~30 Hz: lane text and headers
        self.render_timer.timeout.connect(self._render_tick)
        self.render_timer.start()

    # ================================================================================= UI building
    def _build_ui(self) -> None:
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
        fill_engine_combo(self.target_combo, self.statuses, keep="")
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
        tb.addWidget(QLabel(" Preset "))
        tb.addWidget(self.preset_combo)
        tb.addSeparator()
        tb.addWidget(QLabel(" Target "))
        tb.addWidget(self.target_combo)
        tb.addWidget(QLabel("  Mode "))
        tb.addWidget(self.mode_combo)
        tb.addSeparator()
        tb.addWidget(self.run_btn)
        tb.addWidget(self.stop_btn)
        spacer = QWidget()
        spacer.setSizePolicy(spacer.sizePolicy().horizontalPolicy().Expanding, spacer.sizePolicy().verticalPolicy().Preferred)
        tb.addWidget(spacer)
        self.dark_action = QAction("Dark", self)
        self.dark_action.setCheckable(True)
        self.dark_action.setToolTip("light / dark palette")
        self.dark_action.toggled.connect(lambda on: self.apply_theme(DARK if on else LIGHT))
        tb.addAction(self.dark_action)

        # menus
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

        # setup dock
        dock_w = QWidget()
        dl = QVBoxLayout(dock_w)
        dl.setContentsMargins(6, 6, 6, 6)
        self.lanes_box = QGroupBox("Lanes (1–4)")
        self.lanes_layout = QVBoxLayout(self.lanes_box)
        self.lanes_layout.setSpacing(4)
        self.add_lane_btn = QPushButton("+ Add lane")
        self.add_lane_btn.clicked.connect(lambda: self.add_lane("ngram"))
        self.lanes_layout.addWidget(self.add_lane_btn)
        self.lane_rows: list[_LaneRow] = []
        dl.addWidget(self.lanes_box)

        samp = QGroupBox("Sampling")
        fl = QFormLayout(samp)
        self.temp_spin = QDoubleSpinBox()
        self.temp_spin.setRange(0.0, 5.0)
        self.temp_spin.setSingleStep(0.1)
        self.temp_spin.setDecimals(2)
        self.temp_spin.setToolTip("0 = greedy (speculative lanes must then match the baseline exactly)")
        self.top_p_spin = QDoubleSpinBox()
        self.top_p_spin.setRange(0.01, 1.0)
        self.top_p_spin.setSingleStep(0.05)
        self.top_k_spin = QSpinBox()
        self.top_k_spin.setRange(0, 100000)
        self.top_k_spin.setSpecialValueText("off")
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(0, 2**31 - 1)
        self.max_tok_spin = QSpinBox()
        self.max_tok_spin.setRange(1, 100000)
        fl.addRow("temperature", self.temp_spin)
        fl.addRow("top-p", self.top_p_spin)
        fl.addRow("top-k", self.top_k_spin)
        fl.addRow("seed", self.seed_spin)
        fl.addRow("max new tokens", self.max_tok_spin)
        dl.addWidget(samp)

        pr = QGroupBox("Prompt")
        pl = QVBoxLayout(pr)
        row = QHBoxLayout()
        self.suite_combo = QComboBox()
        self.suite_combo.addItems(list_suites())
        self.suite_combo.currentTextChanged.connect(self._fill_prompt_combo)
        self.prompt_combo = QComboBox()
        self.prompt_combo.setToolTip("built-in prompts, by category")
        self.prompt_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.prompt_combo.setMinimumContentsLength(12)
        if self.suite_combo.findText("specbench-mini") >= 0:
            self.suite_combo.setCurrentText("specbench-mini")
        self.prompt_combo.activated.connect(self._prompt_chosen)
        row.addWidget(self.suite_combo)
        row.addWidget(self.prompt_combo, 1)
        pl.addLayout(row)
        self.prompt_edit = QPlainTextEdit()
        self.prompt_edit.setPlaceholderText("Type a prompt, or pick one above")
        self.prompt_edit.setMinimumHeight(90)
        self.prompt_edit.textChanged.connect(self._prompt_edited)
        pl.addWidget(self.prompt_edit, 1)
        self.chat_check = QCheckBox("apply the chat template")
        self.chat_check.setChecked(True)
        pl.addWidget(self.chat_check)
        self.warmup_check = QCheckBox("warm up first (4 tokens per lane, not recorded)")
        self.warmup_check.setToolTip(
            "an unrecorded short run first, so the first lane does not pay for one-time start-up costs\n(the CLI's bench does the same)"
        )
        self.warmup_check.setChecked(True)
        pl.addWidget(self.warmup_check)
        dl.addWidget(pr, 1)
        self._fill_prompt_combo(self.suite_combo.currentText())

        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(dock_w)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.setup_dock = QDockWidget("Setup", self)
        self.setup_dock.setObjectName("setupDock")
        self.setup_dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        self.setup_dock.setWidget(scroll)
        self.setup_dock.setMinimumWidth(370)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.setup_dock)
        self.setup_panel = dock_w

        # centre: legend + lanes over plots/results
        centre = QWidget()
        cl = QVBoxLayout(centre)
        cl.setContentsMargins(4, 4, 4, 0)
        cl.setSpacing(4)
        self.legend = QLabel()
        self.legend.setObjectName("legend")
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.hide_rejected = QCheckBox("hide rejected drafts")
        self.hide_rejected.toggled.connect(self._set_hide_rejected)
        self.hide_rejected_action.toggled.connect(self.hide_rejected.setChecked)
        lrow = QHBoxLayout()
        lrow.addWidget(self.legend, 1)
        lrow.addWidget(self.hide_rejected)
        cl.addLayout(lrow)
        self.lanes_area = QWidget()
        self.lanes_grid = QGridLayout(self.lanes_area)
        self.lanes_grid.setContentsMargins(0, 0, 0, 0)
        self.lanes_grid.setSpacing(6)
        cl.addWidget(self.lanes_area, 1)

        self.plots = PlotPanel(self.theme)
        self.results = ResultsPanel(self.theme)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.plots, "Live plots")
        self.tabs.addTab(self.results, "Results")
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(centre)
        split.addWidget(self.tabs)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setChildrenCollapsible(False)
        self.splitter = split
        self.setCentralWidget(split)

        # status bar
        sb = self.statusBar()
        self.status_label = QLabel("ready")
        self.progress_bar = QProgressBar()
        self.progress_bar.setMaximumWidth(260)
        self.progress_bar.setTextVisible(True)
        self.progress_bar.hide()
        self.worker_label = QLabel("worker: not started")
        self.worker_label.setObjectName("workerLabel")
        sb.addWidget(self.status_label, 1)
        sb.addPermanentWidget(self.progress_bar)
        sb.addPermanentWidget(self.worker_label)

        for seq in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(seq), self, activated=self.run, context=Qt.ShortcutContext.ApplicationShortcut)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.stop, context=Qt.ShortcutContext.ApplicationShortcut)
        self.resize(1560, 980)

    def _connect_bridge(self) -> None:
        b = self.bridge
        b.stepEvent.connect(self._on_step)
        b.laneStarted.connect(self._on_lane_started)
        b.laneDone.connect(self._on_lane_done)
        b.laneError.connect(self._on_lane_error)
        b.progress.connect(self._on_progress)
        b.runFinished.connect(self._on_run_finished)
        b.workerReady.connect(self._on_worker_ready)
        b.workerDied.connect(self._on_worker_died)
        b.state.connect(self._on_worker_state)

    def _start_telemetry(self) -> None:
        try:
            from app.telemetry.sampler import TelemetrySampler
        except Exception as e:  # the telemetry package is optional for the GUI
            self.plots.set_gpu_state(f"telemetry unavailable ({e})")
            return

        def pids():
            d = {"gui": os.getpid()}
            if self.bridge.pid:
                d["worker"] = self.bridge.pid
            return d

        try:
            self.sampler = TelemetrySampler(rate_hz=10.0, pids=pids, on_sample=self.plots.add_sample)
            self.plots.set_gpu_state(self.sampler.gpu_state)
            self.sampler.start()
        except Exception as e:
            self.sampler = None
            self.plots.set_gpu_state(f"telemetry unavailable ({e})")

    # ================================================================================= lanes (setup)
    def add_lane(self, setup: str = "baseline", after: int | None = None) -> _LaneRow | None:
        if len(self.lane_rows) >= MAX_LANES:
            return None
        row = _LaneRow(setup)
        row.editor.set_engines(self.statuses, self._target_status())
        row.editor.changed.connect(self._setups_changed)
        row.dup.clicked.connect(lambda: self.add_lane(row.editor.setup(), after=self.lane_rows.index(row)))
        row.remove.clicked.connect(lambda: self.remove_lane(self.lane_rows.index(row)))
        pos = len(self.lane_rows) if after is None else after + 1
        self.lane_rows.insert(pos, row)
        self.lanes_layout.insertWidget(pos, row)
        self._lanes_changed()
        return row

    def remove_lane(self, i: int) -> None:
        if len(self.lane_rows) <= 1 or not 0 <= i < len(self.lane_rows):
            return
        row = self.lane_rows.pop(i)
        self.lanes_layout.removeWidget(row)
        row.deleteLater()
        self._lanes_changed()

    def set_setups(self, setups) -> None:
        setups = list(setups)[:MAX_LANES] or ["baseline"]
        while len(self.lane_rows) > len(setups):
            row = self.lane_rows.pop()
            self.lanes_layout.removeWidget(row)
            row.deleteLater()
        for i, s in enumerate(setups):
            if i < len(self.lane_rows):
                self.lane_rows[i].editor.set_setup(s)
            else:
                self.add_lane(s)
        self._lanes_changed()

    def setups(self) -> list[str]:
        return [r.editor.setup() for r in self.lane_rows]

    def _lanes_changed(self) -> None:
        for i, r in enumerate(self.lane_rows):
            r.set_index(i)
            r.remove.setEnabled(len(self.lane_rows) > 1)
            r.dup.setEnabled(len(self.lane_rows) < MAX_LANES)
        self.add_lane_btn.setEnabled(len(self.lane_rows) < MAX_LANES)
        if not self.running:
            self._sync_lane_views()
        self._setups_changed()

    def _setups_changed(self, *_a) -> None:
        valid = all(r.editor.valid for r in self.lane_rows)
        self.run_btn.setEnabled(valid and not self.running)
        if not self.running:
            for v, r in zip(self.lane_views, self.lane_rows, strict=False):
                v.set_setup(r.editor.setup())

    def _sync_lane_views(self) -> None:
        """One LaneView per lane row, laid out side by side (2×2 for four)."""
        n = len(self.lane_rows)
        while len(self.lane_views) > n:
            v = self.lane_views.pop()
            self.lanes_grid.removeWidget(v)
            v.deleteLater()
        while len(self.lane_views) < n:
            i = len(self.lane_views)
            v = LaneView(i, LANE_COLORS[i % len(LANE_COLORS)], self.theme)
            v.set_show_rejected(not self.hide_rejected.isChecked())
            self.lane_views.append(v)
        cols = 2 if n == 4 else n
        for i, v in enumerate(self.lane_views):
            self.lanes_grid.addWidget(v, i // cols, i % cols)
            v.set_setup(self.lane_rows[i].editor.setup())
        for c in range(4):
            self.lanes_grid.setColumnStretch(c, 1 if c < cols else 0)

    def _target_status(self):
        name = self.target_combo.currentText().split("  (")[0].strip()
        return next((s for s in self.statuses if s.name == name), None)

    def _target_changed(self, _text: str) -> None:
        st = self._target_status()
        for r in self.lane_rows:
            r.editor.set_engines(self.statuses, st)

    def target(self) -> str:
        return self.target_combo.currentText().split("  (")[0].strip()

    # ================================================================================= prompt
    def _fill_prompt_combo(self, suite: str) -> None:
        self.prompt_combo.clear()
        self.prompt_combo.addItem("— built-in prompts —", None)
        try:
            prompts = load_suite(suite) if suite else []
        except SpecDeckError:
            prompts = []
        by_cat: dict[str, list] = {}
        for p in prompts:
            by_cat.setdefault(p.category or "other", []).append(p)
        for cat, ps in by_cat.items():
            self.prompt_combo.addItem(f"[{cat}]", None)
            idx = self.prompt_combo.count() - 1
            self.prompt_combo.model().item(idx).setEnabled(False)
            for p in ps:
                first = p.prompt.strip().splitlines()[0] if p.prompt.strip() else ""
                self.prompt_combo.addItem(f"   {p.id}: {first[:48]}", (p.id, p.prompt))
                self.prompt_combo.setItemData(self.prompt_combo.count() - 1, p.prompt, Qt.ItemDataRole.ToolTipRole)

    def _prompt_chosen(self, i: int) -> None:
        d = self.prompt_combo.itemData(i)
        if d:
            self.set_prompt(d[1], d[0])

    def set_prompt(self, text: str, prompt_id: str = "custom") -> None:
        self._prompt_programmatic = True
        try:
            self.prompt_edit.setPlainText(text)
        finally:
            self._prompt_programmatic = False
        self.prompt_id = prompt_id

    def _prompt_edited(self) -> None:
        if not self._prompt_programmatic:
            self.prompt_id = "custom"

    # ================================================================================= sessions
    def sampling(self) -> Sampling:
        return Sampling(
            temperature=float(self.temp_spin.value()),
            top_p=float(self.top_p_spin.value()),
            top_k=int(self.top_k_spin.value()),
            seed=int(self.seed_spin.value()),
            max_new_tokens=int(self.max_tok_spin.value()),
        )

    def session(self) -> Session:
        return Session(
            target=self.target(),
            setups=tuple(self.setups()),
            prompt=self.prompt_edit.toPlainText(),
            prompt_id=self.prompt_id,
            chat=self.chat_check.isChecked(),
            mode=self.mode_combo.currentData(),
            sampling=self.sampling(),
        )

    def apply_session(self, s: Session) -> None:
        self.target_combo.setEditText(s.target)
        self._target_changed(s.target)
        self.set_setups(s.setups)
        self._target_changed(s.target)
        self.set_prompt(s.prompt, s.prompt_id)
        self.chat_check.setChecked(s.chat)
        self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(s.mode)))
        sp = s.sampling
        self.temp_spin.setValue(sp.temperature)
        self.top_p_spin.setValue(sp.top_p)
        self.top_k_spin.setValue(sp.top_k)
        self.seed_spin.setValue(sp.seed)
        self.max_tok_spin.setValue(sp.max_new_tokens)

    def apply_preset(self, name: str) -> None:
        self.apply_session(PRESETS[name])
        i = self.preset_combo.findData(name)
        if i >= 0:
            self.preset_combo.setCurrentIndex(i)

    def _preset_chosen(self, i: int) -> None:
        name = self.preset_combo.itemData(i)
        if name:
            self.apply_preset(name)

    def _remembered_session(self) -> Session:
        raw = self.settings.value("session/last")
        if raw:
            try:
                return Session.from_json(json.loads(str(raw)))
            except (SpecDeckError, ValueError):
                pass
        usable = {s.name for s in self.statuses if s.usable}
        return PRESETS[default_preset_name(usable)]

    def save_settings(self) -> None:
        self.settings.setValue("session/last", json.dumps(self.session().to_json()))
        self.settings.setValue("ui/dark", self.theme.dark)
        self.settings.setValue("ui/hide_rejected", self.hide_rejected.isChecked())
        self.settings.setValue("ui/warmup", self.warmup_check.isChecked())
        self.settings.setValue("ui/geometry", self.saveGeometry())
        self.settings.sync()

    def save_session(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save session", "specdeck-session.json", "SpecDeck session (*.json)")
            if not path:
                return None
        self.session().save(path)
        self.status_label.setText(f"session saved to {path}")
        return path

    def open_session(self, path: str | None = None) -> bool:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open session", "", "SpecDeck session (*.json)")
            if not path:
                return False
        try:
            self.apply_session(Session.load(path))
        except SpecDeckError as e:
            self.status_label.setText(f"⚠ {e.message}")
            return False
        self.status_label.setText(f"session loaded from {path}")
        return True

    # ================================================================================= run / stop
    def run(self) -> str | None:
        """Start a run with the current setup; returns its id (None when refused, with the reason shown)."""
        if self.running:
            return None
        bad = [(i, r.editor) for i, r in enumerate(self.lane_rows) if not r.editor.valid]
        if bad:
            self.status_label.setText(f"⚠ lane {bad[0][0] + 1}: {bad[0][1].error_text.splitlines()[0]}")
            return None
        try:
            sampling = self.sampling().validated()
        except SpecDeckError as e:
            self.status_label.setText(f"⚠ {e.message}")
            return None
        target = self.target()
        prompt = self.prompt_edit.toPlainText()
        if not target:
            self.status_label.setText("⚠ pick a target model")
            return None
        if not prompt.strip():
            self.status_label.setText("⚠ type a prompt or pick one")
            return None
        self._run_counter += 1
        run_id = f"run{self._run_counter}-{int(time.time()) % 100000}"
        self.run_id = run_id
        self.running = True
        self.run_t0 = time.monotonic()
        self.done_stats = {}
        self.lane_errors = {}
        self.last_target = target
        self.last_sampling = sampling
        self._sync_lane_views()
        mode = self.mode_combo.currentData()
        specs = []
        self.lane_by_id = {}
        for i, (row, view) in enumerate(zip(self.lane_rows, self.lane_views, strict=False)):
            lane_id = f"L{i + 1}"
            spec = LaneSpec(lane_id=lane_id, setup=row.editor.setup(), prompt_id=self.prompt_id, prompt=prompt)
            specs.append(spec)
            view.reset()
            view.set_setup(spec.setup)
            view.set_state("waiting", "starting worker…" if not self.bridge.alive else "waiting")
            self.lane_by_id[lane_id] = view
        self.lane_specs = specs
        self.plots.start_run([(s.lane_id, s.setup, v.color) for s, v in zip(specs, self.lane_views, strict=False)], self.run_t0)
        self.results.clear()
        if self.sampler is not None:
            self.sampler.clear()
        self._set_running_ui(True)
        self.status_label.setText("starting worker…" if not self.bridge.alive else "running…")
        self.save_settings()
        chat = self.chat_check.isChecked()
        if self.warmup_check.isChecked():
            warm = tuple(LaneSpec(f"warm-{s.lane_id}", s.setup, s.prompt_id, s.prompt, group="warmup") for s in specs)
            wsamp = Sampling(sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed, min(4, sampling.max_new_tokens))
            self.bridge.run(RunLanes(f"{run_id}-warmup", target, warm, wsamp, mode=mode, chat=chat))
        self.bridge.run(RunLanes(run_id, target, tuple(specs), sampling, mode=mode, chat=chat))
        self.runStarted.emit(run_id)
        return run_id

    def stop(self) -> None:
        """Cancel the current run (lanes stop within one step)."""
        if not self.running or self.run_id is None:
            return
        self.status_label.setText("stopping…")
        self.bridge.cancel(f"{self.run_id}-warmup")
        self.bridge.cancel(self.run_id)

    def _set_running_ui(self, running: bool) -> None:
        self.run_btn.setEnabled(not running and all(r.editor.valid for r in self.lane_rows))
        self.stop_btn.setEnabled(running)
        self.setup_panel.setEnabled(not running)
        self.target_combo.setEnabled(not running)
        self.preset_combo.setEnabled(not running)
        self.mode_combo.setEnabled(not running)

    # ================================================================================= events
    def _view(self, lane_id) -> LaneView | None:
        return self.lane_by_id.get(lane_id) if lane_id is not None else None

    def _on_step(self, ev: StepEvent, t: float) -> None:
        v = self._view(ev.lane_id)
        if v is None:
            w = self._view(ev.lane_id[5:]) if ev.lane_id.startswith("warm-") else None
            if w is not None and w.state == "waiting" and w.status.text() != "warming up…":
                w.set_state("waiting", "warming up…")
            return
        v.add_step(ev, t)
        self.plots.add_step(ev, t)

    def _on_lane_started(self, ev: LaneStarted) -> None:
        v = self._view(ev.lane_id)
        if v is not None:
            v.set_state("running", "prefill…")
        self.progress_bar.hide()
        self.status_label.setText("running…")

    def _on_lane_done(self, ev: RunDone) -> None:
        v = self._view(ev.lane_id)
        if v is None:
            return
        v.finish(ev.stats, ev.cancelled)
        if ev.stats is not None and not ev.cancelled:
            self.done_stats[ev.lane_id] = ev.stats
        elif ev.stats is not None:
            self.done_stats[ev.lane_id] = ev.stats  # partial results are kept (marked cancelled)
            self.lane_errors.setdefault(ev.lane_id, "cancelled")

    def _on_lane_error(self, ev: RunError) -> None:
        if not self.running or (ev.lane_id or "").startswith("warm-"):
            return  # a warm-up lane's error shows again, in its own lane, in the recorded run
        views = (
            [self._view(ev.lane_id)]
            if ev.lane_id is not None
            else [v for v in self.lane_by_id.values() if v.state not in ("done", "cancelled", "error")]
        )
        for v in views:
            if v is None:
                continue
            v.show_error(ev.message)
            lid = next((k for k, x in self.lane_by_id.items() if x is v), None)
            if lid:
                self.lane_errors[lid] = ev.message.splitlines()[0]
        if ev.lane_id is None:
            self.status_label.setText("⚠ " + ev.message.splitlines()[0])

    def _on_progress(self, ev: Progress) -> None:
        bar = self.progress_bar
        bar.show()
        if ev.total > 0:
            bar.setRange(0, 1000)
            bar.setValue(int(1000 * min(1.0, ev.done / ev.total)))
            if ev.done >= ev.total:
                bar.hide()
        else:
            bar.setRange(0, 0)
        task = ev.task + (f" — {ev.message}" if ev.message else "")
        unit = f" {ev.unit}" if ev.unit else ""
        detail = f" ({ev.done:.0f}/{ev.total:.0f}{unit})" if ev.total > 0 and ev.unit else ""
        bar.setFormat(f"{ev.task.split(':')[-1].strip()[:28]} %p%")
        self.status_label.setText(f"{task}{detail}")
        for v in [self._view(ev.lane_id)] if ev.lane_id else self.lane_by_id.values():
            if v is not None and v.state == "waiting":
                v.set_state("waiting", "loading…")

    def _on_run_finished(self, ev: RunFinished) -> None:
        if ev.run_id != self.run_id:
            return
        self._finish_run(cancelled=ev.cancelled)

    def _on_worker_ready(self, ev: WorkerReady) -> None:
        self.worker_info = f"worker pid {ev.pid} · {ev.device_info} · torch {ev.torch_version} · ready in {ev.startup_s:.1f} s"
        self.worker_label.setText(self.worker_info)
        for v in self.lane_by_id.values():
            if v.state == "waiting":
                v.set_state("waiting", "loading…")

    def _on_worker_state(self, state: str) -> None:
        if state == "starting":
            self.worker_label.setText("worker: starting…")
        elif state == "dead":
            self.worker_label.setText("worker: stopped (Run restarts it)")

    def _on_worker_died(self, ev: WorkerDied) -> None:
        self.worker_label.setText("worker: died (Run restarts it)")
        if not self.running:
            return
        msg = f"{ev.message}. Results received so far are kept; press Run to restart the worker."
        for lid, v in self.lane_by_id.items():
            if v.state not in ("done", "cancelled", "error"):
                v.show_error(msg)
                self.lane_errors[lid] = ev.message
        self.status_label.setText("⚠ " + ev.message)
        self._finish_run(cancelled=False)

    def _finish_run(self, cancelled: bool) -> None:
        if not self.running:
            return
        self.running = False
        for v in self.lane_views:
            v.flush()
            if v.state in ("waiting", "running"):
                v.set_state("cancelled" if cancelled else "error", "stopped" if cancelled else "no result")
        self._set_running_ui(False)
        self.progress_bar.hide()
        self._show_results()
        n_ok = sum(1 for lid in self.done_stats if lid not in self.lane_errors)
        word = "stopped" if cancelled else "finished"
        self.status_label.setText(
            f"run {word}: {n_ok}/{len(self.lane_specs)} lanes completed"
            + (f" · winner: {self.results.winner.lane} {self.results.winner.stats.setup}" if self.results.winner and not cancelled else "")
        )
        if not cancelled and self.done_stats:
            self.tabs.setCurrentWidget(self.results)
        self.plots.redraw()
        self.runEnded.emit(self.run_id or "")

    def _show_results(self) -> None:
        order = [s.lane_id for s in self.lane_specs if s.lane_id in self.done_stats]
        complete = [lid for lid in order if self.lane_errors.get(lid) != "cancelled"]
        lanes = [(f"Lane {lid[1:]}", self.lane_by_id[lid].color, self.done_stats[lid]) for lid in complete]
        notes = {f"Lane {lid[1:]}": msg for lid, msg in self.lane_errors.items() if msg != "cancelled"}
        self.results.set_results(lanes, notes)
        stats_by_lane = {r.lane: r.stats for r in self.results.rows}
        for lid in order:
            v = self.lane_by_id[lid]
            if self.lane_errors.get(lid) == "cancelled":
                v.set_badge(f"cancelled after {v.acc.new_tokens} tokens", None)
                continue
            s = stats_by_lane.get(f"Lane {lid[1:]}")
            if s is None:
                continue
            if s.setup == "baseline":
                v.set_badge("baseline", None)
            elif s.identical_to_baseline:
                v.set_badge("✓ identical to baseline", True)
            elif s.identical_to_baseline is False:
                v.set_badge(f"≠ diverges at token {s.first_divergence}", False)
            v.update_header()

    def _render_tick(self) -> None:
        for v in self.lane_views:
            v.flush()

    # ================================================================================= exports
    def report(self) -> dict:
        """The run report (the bench JSON schema) with telemetry and GUI metadata."""
        st = next((s for s in self.statuses if s.name == self.last_target), None)
        device = st.device if st else "auto"
        dtype = st.dtype if st else "auto"
        runs = [
            self.done_stats[s.lane_id]
            for s in self.lane_specs
            if s.lane_id in self.done_stats and self.lane_errors.get(s.lane_id) != "cancelled"
        ]
        extra = {
            "telemetry": self.sampler.to_json() if self.sampler is not None else [],
            "gui": {
                "mode": self.mode_combo.currentData(),
                "chat": self.chat_check.isChecked(),
                "lanes": [{"lane": s.lane_id, "setup": s.setup, "error": self.lane_errors.get(s.lane_id)} for s in self.lane_specs],
                "worker": self.worker_info,
            },
        }
        return build_report(self.last_target, device, dtype, runs, sampling=asdict(self.last_sampling), extra=extra)

    def export_json(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export results JSON", "specdeck-run.json", "JSON (*.json)")
            if not path:
                return None
        Path(path).write_text(json.dumps(self.report(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        self.status_label.setText(f"results written to {path}")
        return path

    def export_csv(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export results CSV", "specdeck-run.csv", "CSV (*.csv)")
            if not path:
                return None
        self.results.write_csv(path)
        self.status_label.setText(f"results written to {path}")
        return path

    def save_window_png(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save window as PNG", "specdeck.png", "PNG (*.png)")
            if not path:
                return None
        self._render_tick()
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
        self.legend.setText(self._legend_html())
        for v in self.lane_views:
            v.set_theme(theme)
        self.plots.set_theme(theme)
        self.results.set_theme(theme)
        self.run_btn.setStyleSheet("QPushButton#runButton { font-weight:600; padding:4px 14px }")

    def _legend_html(self) -> str:
        t = self.theme
        parts = []
        for kind, sample in (
            ("accepted", "accepted draft"),
            ("rejected", "rejected draft"),
            ("correction", "correction"),
            ("bonus", "bonus"),
            ("plain", "baseline / target"),
        ):
            f = token_format(t, kind)
            style = f"color:{t.kind_color(kind)};"
            if kind == "accepted":
                style += f"background:{t.accepted_bg};"
            if f.fontStrikeOut():
                style += "text-decoration:line-through;"
            if kind in ("correction", "bonus"):
                style += "text-decoration:underline; font-weight:600;"
            parts.append(f"<span style='{style} padding:0 4px'>{sample}</span>")
        _ = KIND_LABELS
        return "<b>Legend</b>&nbsp; " + " &nbsp;·&nbsp; ".join(parts)

    def _set_hide_rejected(self, hide: bool) -> None:
        if self.hide_rejected_action.isChecked() != hide:
            self.hide_rejected_action.setChecked(hide)
        for v in self.lane_views:
            v.set_show_rejected(not hide)

    def shutdown(self) -> None:
        """Stop timers, telemetry and the worker (idempotent)."""
        self.render_timer.stop()
        self.plots.timer.stop()
        if self.sampler is not None:
            try:
                self.sampler.close()
            except Exception:
                pass
            self.sampler = None
        self.bridge.shutdown()

    def closeEvent(self, ev) -> None:
        try:
            self.save_settings()
        finally:
            self.shutdown()
        super().closeEvent(ev)
