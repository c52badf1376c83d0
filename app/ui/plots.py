"""Live plots (pyqtgraph): tokens/s and acceptance rate per lane, per-position acceptance, GPU or CPU use.

Data arrives into preallocated ring buffers (StepEvents on the GUI thread, telemetry samples from the
sampler's thread through a deque). Each step's smoothed tokens/s and rolling α are computed when it arrives
(O(log n), nothing per frame that grows with the history), and a timer redraws what changed with one
``setData`` per series: at most 5 Hz while a run is going, and less on a slow machine (a frame may take
:data:`FRAME_BUDGET` of a core); on a machine with few cores (app.ui.load.FEW_CORES), where every frame is taken
from the lanes' cores, every 2 s at most and within 1 % of a core, and the view is held between redraws: released
for a redraw's paint and held again as soon as that paint is done (pyqtgraph's items would otherwise repaint it
several times per redraw: ranges, labels, regions; what they ask for later waits for the next redraw's full paint;
the mouse over the plots releases it);
per-position bars at 1 Hz, telemetry at 2 Hz; 1 Hz between runs; never while the panel is hidden or live plots
are off (:meth:`PlotPanel.set_live`; the run's end draws everything once).
The window shares a few-core machine with the lanes it measures, so drawing is kept cheap: axes are cached as
pixmaps (a plot's grid lines make its axis repaint whenever a curve changes otherwise), and ranges grow in
steps (1, 1.5, 2, 3, 5, 7.5 × 10^k) instead of auto-ranging on every point, so axes are laid out again a few
times per run, not on every frame.
Time plots share one x axis: seconds since Run was clicked (monotonic clock), with the start marked and the
phases before the first recorded lane shaded ("loading engines" until the first lane starts, then "warm-up"),
so engine loading never reads as a slow run. A run sink (app.ui.sinks).

The rates and budgets below are the contract; what they cost and what faster rates cost were measured with
resources/bench/gui_cost.py (resources/bench/README.md, "The GUI's cost on few cores").
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import QGraphicsItem, QVBoxLayout, QWidget

from app.core.events import LaneStarted, StepEvent
from app.ui.load import few_cores
from app.ui.plot_parts import (
    COL_ACCEPTED,
    COL_ALPHA,
    COL_DRAFTED,
    COL_LANE_S,
    COL_RATE,
    COL_RECV_S,
    COL_TOKENS,
    LEGEND_NAME_CHARS,
    SYS_CURVES,
    LaneSeries,
    Phase,
    Ring,
    TimedLayout,
    elide,
    fit_legend,
    nice_ceiling,
    telemetry_row,
    veil_legend,
)
from app.ui.theme import LANE_COLORS, LIGHT, Theme
from app.worker.plan import RunPlan, RunResults

__all__ = ["Ring", "PlotPanel", "Phase", "nice_ceiling", "RUN_INTERVAL_MS", "IDLE_INTERVAL_MS", "TELEMETRY_INTERVAL_S",
           "BARS_INTERVAL_S", "FRAME_BUDGET", "FEW_CORES_INTERVAL_MS", "FEW_CORES_FRAME_BUDGET",
           "HOLD_AFTER_MS"]

pg.setConfigOptions(antialias=True, useOpenGL=False)

#: redraw period while a run is going (5 Hz: the plots' CPU on a 2-core machine comes out of the lanes' tokens/s)
#: and between runs
RUN_INTERVAL_MS = 200
IDLE_INTERVAL_MS = 1000
#: telemetry curves and per-position bars (slow-moving figures) are redrawn at most this often during a run
TELEMETRY_INTERVAL_S = 0.5
BARS_INTERVAL_S = 1.0
#: during a run the plots draw no more often than their measured cost per frame allows within this share of one
#: core (a 10 ms frame: at most 3 frames a second)
FRAME_BUDGET = 0.03
#: the same on a machine with few cores: the window's CPU there comes straight out of the lanes' tokens/s
FEW_CORES_INTERVAL_MS = 2000
FEW_CORES_FRAME_BUDGET = 0.01
#: on few cores the view is held again once the redraw's paint is done, or this long after the redraw released it
#: where no paint came (a hidden view)
HOLD_AFTER_MS = 40


class PlotPanel(QWidget):
    """The plot dock's content.

    Args:
        capacity: points kept per lane series and for telemetry (older halves are dropped beyond it).
        window_s: smoothing window of tokens/s, lane-clock seconds.
        alpha_window: steps in the rolling acceptance-rate window.
        interval_ms: redraw period during a run (default :data:`RUN_INTERVAL_MS`, :data:`FEW_CORES_INTERVAL_MS` on
            a machine with few cores).
    """

    def __init__(
        self, theme: Theme = LIGHT, capacity: int = 4096, window_s: float = 1.5, alpha_window: int = 8, interval_ms: int | None = None,
        parent=None,
    ) -> None:
        super().__init__(parent)
        self.theme = theme
        self.capacity = capacity
        self.window_s = window_s
        self.alpha_window = alpha_window
        self.t0: float | None = None
        self.clock = time.monotonic  # the run's clock (a replay's, set by the run controller)
        self.presenting_px: int | None = None  # presentation mode's text size (None: not presenting)
        self.live_telemetry = True  # False while a recorded run is shown: its own samples, not this machine's
        self.lanes: dict[str, LaneSeries] = {}
        self._series_of: dict[str, str] = {}  # lane id → its series (a run of several prompts: its setup's)
        self.phases: list[Phase] = []
        self._inbox: deque = deque()
        self.tele = Ring(capacity, 7)  # t_mono, util/cpu_w, mem/rss_w, cpu_g, rss_g, mem_total, cpu_sys
        self._tele_dirty = False
        self.gpu_state = "telemetry starting…"
        self.gpu_mode: bool | None = None
        self.redraws = 0
        self.live = True  # redraw during runs (False: once, at the run's end)
        self.running = False
        few = few_cores()
        self.interval_ms = (FEW_CORES_INTERVAL_MS if few else RUN_INTERVAL_MS) if interval_ms is None else interval_ms
        self.frame_budget = FEW_CORES_FRAME_BUDGET if few else FRAME_BUDGET
        self.hold_between_redraws = few  # during a run the view paints only after a redraw (or under the mouse)
        self._hover = False
        self._hold_after_paint = False
        self.paints = 0  # paint events of the plot view (tests)
        self._manual: set = set()  # view boxes the user panned or zoomed: their ranges are left alone until the next run
        self._ranges: dict = {}  # (view box, axis) → range last set
        self._last_redraw = 0.0
        self.frame_s = 0.0  # CPU of the last redraw's setData calls (its painting is glw.last_paint_s)
        self._last_tele_draw = 0.0
        self._last_bars_draw = 0.0
        self._last_phase_tick = 0.0
        self.setdata_calls = 0
        self._series: dict[str, tuple[np.ndarray, np.ndarray, str, str]] = {}  # name → (x, y, color, unit)

        self.glw = TimedLayout()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.glw)
        self._build_plots()
        self._build_sys_plot()
        self._proxy = pg.SignalProxy(self.glw.scene().sigMouseMoved, rateLimit=30, slot=self._mouse_moved)
        self.glw.viewport().installEventFilter(self)
        self.set_theme(theme)
        self._setup_sys_curves(gpu=False)
        self.timer = QTimer(self)
        self.timer.setInterval(IDLE_INTERVAL_MS)
        self.timer.timeout.connect(self.redraw)
        self.timer.start()

    # --- setup -----------------------------------------------------------------------------------
    def _build_plots(self) -> None:
        self.readout = self.glw.addLabel("", row=0, col=0, colspan=2, justify="left")
        self.p_tps = self.glw.addPlot(row=1, col=0, title="tokens/s per lane (smoothed)")
        self.p_alpha = self.glw.addPlot(row=1, col=1, title="acceptance rate α (rolling)")
        self.p_pos = self.glw.addPlot(row=2, col=0, title="acceptance by draft position")
        self.p_sys = self.glw.addPlot(row=2, col=1, title="system")
        self.time_plots = (self.p_tps, self.p_alpha, self.p_sys)
        for p in (self.p_tps, self.p_alpha, self.p_sys, self.p_pos):
            p.showGrid(x=True, y=True, alpha=0.25)
            p.setMenuEnabled(True)
        for p in self.time_plots:
            p.setClipToView(True)
            p.setDownsampling(auto=True, mode="peak")
            p.setLabel("bottom", "time since Run was clicked", units="s")
            if p is not self.p_tps:
                p.setXLink(self.p_tps)
        for p in (self.p_tps, self.p_alpha, self.p_pos, self.p_sys):
            for ax in ("left", "right"):  # "tok/s (x0.001)" with values 200-800 reads as a fast lane
                p.getAxis(ax).enableAutoSIPrefix(False)
            for ax in ("left", "bottom", "right"):
                # with grid lines an axis spans its whole plot, so any curve update would replay its QPicture
                # (ticks, text, grid); cached as a pixmap it is redrawn only when its range changes
                p.getAxis(ax).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            p.titleLabel.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            p.vb.sigRangeChangedManually.connect(lambda *_a, vb=p.vb: self._manual.add(vb))
        self.p_tps.setXRange(-1.0, 5.0, padding=0)  # before any run: the first seconds of one, not ±0.5 s in ms
        self.p_tps.setLabel("left", "tok/s")
        self.p_alpha.setLabel("left", "α")
        self.p_alpha.setYRange(0, 1.02, padding=0)
        self.p_alpha.enableAutoRange(axis="y", enable=False)
        self.p_pos.setLabel("bottom", "draft position")
        self.p_pos.setLabel("left", "accepted fraction")
        self.p_pos.setYRange(0, 1.02, padding=0)
        self.p_pos.enableAutoRange(axis="y", enable=False)
        # top right, clear of the phase labels at the left: the range is set by the early peaks, the settled rates
        # run below them later on
        self.p_tps.addLegend(offset=(-5, 5), labelTextSize="8pt")
        self.p_tps.legend.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)

        # run-start markers and crosshair lines
        self.start_lines = []
        self.cross_lines = []
        for p in self.time_plots:
            ln = pg.InfiniteLine(pos=0, angle=90, movable=False)  # Run clicked (the loading phase is labelled)
            ln.setPen(pg.mkPen("#888888", width=1, style=Qt.PenStyle.DashLine))
            p.addItem(ln)  # counted in auto-range: the run's start stays in view
            self.start_lines.append(ln)
            cl = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#999999", width=1, style=Qt.PenStyle.DotLine))
            cl.hide()
            p.addItem(cl, ignoreBounds=True)
            self.cross_lines.append(cl)

    def _build_sys_plot(self) -> None:
        """System plot: left axis percent, right axis MiB (a second view box)."""
        self.p_sys.setLabel("left", "%")
        self.p_sys.showAxis("right")
        self.p_sys.setLabel("right", "MiB")
        self.sys_vb2 = pg.ViewBox()
        self.p_sys.scene().addItem(self.sys_vb2)
        self.p_sys.getAxis("right").linkToView(self.sys_vb2)
        self.sys_vb2.setXLink(self.p_sys)
        self.p_sys.vb.sigResized.connect(self._sync_sys_views)
        self.sys_legend = self.p_sys.addLegend(offset=(5, 5), labelTextSize="8pt", colCount=2)
        self.sys_legend.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self._sys_curves: dict[str, pg.PlotDataItem] = {}
        self.p_sys.vb.sigResized.connect(self.fit_legends)
        self.p_tps.vb.sigResized.connect(self.fit_legends)

    def fit_legends(self) -> None:
        """Show a legend only where its plot has room for it (app.ui.plot_parts.fit_legend)."""
        fit_legend(self.p_tps, self.p_tps.legend)
        fit_legend(self.p_sys, self.sys_legend)

    def _sync_sys_views(self) -> None:
        self.sys_vb2.setGeometry(self.p_sys.vb.sceneBoundingRect())
        self.sys_vb2.linkedViewChanged(self.p_sys.vb, self.sys_vb2.XAxis)

    def _setup_sys_curves(self, gpu: bool) -> None:
        if self.gpu_mode == gpu:
            return
        self.gpu_mode = gpu
        for c in self._sys_curves.values():
            self.sys_legend.removeItem(c)
            (c.getViewBox() or self.p_sys.vb).removeItem(c)
        self._sys_curves = {}
        for name, color, right, style in SYS_CURVES[gpu]:
            c = pg.PlotDataItem(pen=pg.mkPen(color, width=2, style=style), name=name, connect="finite")
            if right:
                self.sys_vb2.addItem(c)
                self.sys_legend.addItem(c, name)
            else:
                self.p_sys.addItem(c)
            self._sys_curves[name] = c
        self.p_sys.setLabel("left", "GPU util %" if gpu else "CPU % (of one core)")
        self.p_sys.setLabel("right", "GPU memory MiB" if gpu else "RSS MiB")
        self._update_sys_title()
        self.fit_legends()

    def _update_sys_title(self) -> None:
        state = self.gpu_state
        title = "GPU utilisation and memory" if self.gpu_mode else f"CPU and memory — {state}"
        self.p_sys.setTitle(title)

    def set_presentation(self, px: int | None) -> None:
        """Presentation mode: the tokens/s plot alone across the panel, its title, ticks and legend at `px` pixels
        (readable from the back of a room); None: the four plots at their usual sizes."""
        ci = self.glw.ci
        others = ((self.p_alpha, 1, 1), (self.p_pos, 2, 0), (self.p_sys, 2, 1))
        if px is not None and self.presenting_px is None:
            for p, _r, _c in others:
                ci.removeItem(p)
                p.hide()
            ci.removeItem(self.p_tps)
            ci.addItem(self.p_tps, row=1, col=0, colspan=2)
        elif px is None and self.presenting_px is not None:
            ci.removeItem(self.p_tps)
            ci.addItem(self.p_tps, row=1, col=0)
            for p, r, c in others:
                ci.addItem(p, row=r, col=c)
                p.show()
        self.presenting_px = px
        tick = QFont()
        if px is not None:
            tick.setPixelSize(max(10, round(px * 0.75)))
        for ax in ("left", "bottom"):
            a = self.p_tps.getAxis(ax)
            a.setStyle(tickFont=tick)
            a.label.setFont(tick)
        size = "8pt" if px is None else f"{max(10, round(px * 0.75))}px"
        self.p_tps.legend.setLabelTextSize(size)  # lanes added later…
        for _sample, label in self.p_tps.legend.items:  # …and those shown now
            label.setText(label.text, size=size)
        self._title(self.p_tps)

    def _title(self, p) -> None:
        size = f"{self.presenting_px}px" if p is self.p_tps and self.presenting_px is not None else None
        kw = {"size": size} if size else {}
        p.setTitle(p.titleLabel.text, color=self.theme.plot_fg, **kw)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.glw.setBackground(theme.plot_bg)
        fg = pg.mkColor(theme.plot_fg)
        for p in (self.p_tps, self.p_alpha, self.p_pos, self.p_sys):
            for ax in ("left", "bottom", "right"):
                a = p.getAxis(ax)
                a.setPen(pg.mkPen(theme.muted))
                a.setTextPen(pg.mkPen(fg))
            self._title(p)
        for legend in (self.p_tps.legend, self.sys_legend):
            veil_legend(legend, theme.plot_bg, theme.plot_fg)
        for ph in self.phases:
            for r in ph.regions:
                r.setBrush(pg.mkBrush(self._phase_color(ph.label)))
        self.readout.setText(self.readout.text or "<i>hover a time plot to read values</i>", color=theme.muted, size="8pt")

    # --- RunSink -----------------------------------------------------------------------------------
    def start_run(self, plan: RunPlan, results: RunResults | None = None, t0: float | None = None) -> None:
        """A run begins now (or at monotonic `t0`): one series per lane, colours by setup, "loading engines"
        shaded until the first lane starts. A run of several prompts or repeats (a bench run file) has one series
        per setup, its lanes one after another (they never overlap: a run goes prompt by prompt)."""
        lanes = []
        pooled = len({spec.group for spec in plan.lanes}) > 1
        self._series_of = {}
        for spec in plan.lanes:
            i = plan.setup_index(spec.lane_id) or 0
            machine = plan.machine_of(spec.lane_id)
            key = f"setup {i + 1}" if pooled else spec.lane_id
            if key not in self._series_of.values():  # a setup's later lanes join its series
                lanes.append((key, f"{spec.setup} · {machine}" if machine else spec.setup, LANE_COLORS[i % len(LANE_COLORS)]))
            self._series_of[spec.lane_id] = key
        self.reset(lanes, time.monotonic() if t0 is None else t0)
        self.phases.append(Phase("loading engines", 0.0, self.time_plots, self._phase_color("loading engines")))
        self.running = True
        self.timer.setInterval(self.interval_ms)

    def on_event(self, ev: object, t_recv: float) -> None:
        if isinstance(ev, StepEvent):
            self.add_step(ev, t_recv)
        elif isinstance(ev, LaneStarted) and self.t0 is not None:
            self._lane_started(RunPlan.is_warmup(ev.lane_id), t_recv - self.t0)

    def _lane_started(self, warmup: bool, t: float) -> None:
        """The first lane ends "loading engines"; a warm-up lane opens "warm-up", a recorded one ends it."""
        cur = self.phases[-1] if self.phases and self.phases[-1].end is None else None
        if cur is not None and cur.label == "loading engines":
            cur.extend(t, close=True)
            if t - cur.start < 0.5:  # engines already loaded (a warm worker): nothing worth marking
                cur.remove()
                self.phases.remove(cur)
            if warmup:
                self.phases.append(Phase("warm-up", t, self.time_plots, self._phase_color("warm-up"), label_pos=0.22))
        elif cur is not None and not warmup:
            cur.extend(t, close=True)

    def eventFilter(self, obj, ev) -> bool:
        t = ev.type()
        if t == QEvent.Type.Paint:
            self.paints += 1
            if self._hold_after_paint:  # the redraw's paint: hold again as soon as it is done (pyqtgraph items
                self._hold_after_paint = False  # ask for further, partial paints just after it; the next
                QTimer.singleShot(0, self, lambda: self._hold(True))  # redraw's full paint covers them)
        elif t == QEvent.Type.Enter:  # the user looks at the plots: live crosshair, no hold
            self._hover = True
            self._hold(False)
        elif t == QEvent.Type.Leave:
            self._hover = False
        return False

    def _hold(self, hold: bool) -> None:
        """Hold the plot view's painting (a run on few cores, between redraws) or release it (a release repaints)."""
        hold = hold and self.hold_between_redraws and self.running and not self._hover
        if self.glw.updatesEnabled() == hold:
            self.glw.setUpdatesEnabled(not hold)

    def finish(self, results: RunResults | None = None) -> None:
        self.running = False
        self.timer.setInterval(IDLE_INTERVAL_MS)
        if self.t0 is not None:
            for ph in self.phases:
                ph.extend(self.clock() - self.t0, close=True)
        self.redraw(force=True)

    def set_live(self, live: bool) -> None:
        """Draw during runs (True), or only when a run ends (False: the least CPU taken from the lanes)."""
        self.live = bool(live)
        if self.live:
            self.redraw(force=True)

    def _phase_color(self, label: str) -> QColor:
        c = QColor(self.theme.muted)
        c.setAlpha(40 if label == "loading engines" else 22)
        return c

    # --- data in ---------------------------------------------------------------------------------
    def reset(self, lanes: list[tuple[str, str, str]], t0: float) -> None:
        """New run: `lanes` = (lane_id, label, colour); `t0` = monotonic time of its start."""
        for ph in self.phases:
            ph.remove()
        self.phases = []
        for ln in self.lanes.values():
            for item in (ln.tps_curve, ln.alpha_curve, ln.bars):
                if item is not None:
                    item.getViewBox().removeItem(item) if item.getViewBox() else None
            if ln.tps_curve is not None and self.p_tps.legend is not None:
                self.p_tps.legend.removeItem(ln.tps_curve)
        self.lanes = {}
        self.t0 = t0
        n = max(1, len(lanes))
        for i, (lane_id, label, color) in enumerate(lanes):
            ln = LaneSeries(lane_id, label, color, self.capacity)
            pen = pg.mkPen(color, width=2)
            ln.tps_curve = self.p_tps.plot([], [], pen=pen, name=f"{i + 1}: {elide(label, LEGEND_NAME_CHARS)}", connect="finite")
            ln.alpha_curve = self.p_alpha.plot([], [], pen=pen, connect="finite")
            w = 0.8 / n
            ln.bars = pg.BarGraphItem(x=[], height=[], width=w, brush=pg.mkBrush(color), pen=pg.mkPen(None))
            ln.bar_offset = (i - (n - 1) / 2) * w
            self.p_pos.addItem(ln.bars)
            self.lanes[lane_id] = ln
        self.fit_legends()
        # keep a little telemetry from before the start for context
        v = self.tele.view()
        keep = v[v[:, 0] >= t0 - 3.0].copy() if len(v) else v
        self.tele.clear()
        for row in keep:
            self.tele.append(row)
        self._tele_dirty = True
        self._manual.clear()
        self._ranges.clear()
        self._set_range(self.p_tps.vb, "x", -1.0, 5.0)

    def add_step(self, ev: StepEvent, t_recv: float) -> None:
        """GUI thread: fold one step of a recorded lane in (warm-up lanes have no series)."""
        ln = self.lanes.get(self._series_of.get(ev.lane_id, ev.lane_id))
        if ln is None or self.t0 is None:
            return
        if ev.lane_id != ln.current:  # a setup's next lane (a run of several prompts): its clock goes on from the last
            v = ln.ring.view()
            ln.current, ln.clock_offset = ev.lane_id, float(v[-1, COL_LANE_S]) if len(v) else 0.0
        ts = ln.clock_offset + ev.t_s
        a = ln.acc
        a.add(ev)
        rate, alpha = self._rolling(ln, ts, a.new_tokens, a.accepted, a.drafted)
        if rate > ln.rate_max:
            ln.rate_max = rate
        ln.ring.append((t_recv - self.t0, ts, a.new_tokens, a.accepted, a.drafted, rate, alpha))
        ln.dirty = True

    def _rolling(self, ln: LaneSeries, ts: float, tok: int, acc: int, dr: int) -> tuple[float, float]:
        """Smoothed tokens/s (over `window_s` of lane clock) and rolling α (over `alpha_window` steps) of a step
        about to be appended: a binary search and a lookup, whatever the history's length."""
        v = ln.ring.view()
        n = len(v)
        rate = math.nan
        if n:
            j = int(np.searchsorted(v[:, COL_LANE_S], ts - self.window_s, side="left"))
            if j < n:
                dt = ts - v[j, COL_LANE_S]
                rate = (tok - v[j, COL_TOKENS]) / dt if dt > 1e-9 else math.nan
        if math.isnan(rate) and ts > 0:
            rate = tok / ts
        if n:
            b = v[max(0, n - self.alpha_window)]
            da, dd = acc - b[COL_ACCEPTED], dr - b[COL_DRAFTED]
        else:
            da, dd = acc, dr
        alpha = da / dd if dd > 0 else math.nan
        return rate, alpha

    def add_sample(self, sample) -> None:
        """Any thread (the sampler's on_sample): queue a TelemetrySample for the next redraw (dropped while a recorded
        run is shown: :attr:`live_telemetry`)."""
        if self.live_telemetry:
            self._inbox.append(sample)

    def show_recorded_telemetry(self) -> None:
        """A recorded run is shown from now on: this machine's samples stop, the recording's come through
        :meth:`add_recorded_sample` (the next :meth:`show_live_telemetry` undoes it)."""
        self.live_telemetry = False
        self._inbox.clear()
        self.tele.clear()
        self._tele_dirty = True

    def show_live_telemetry(self) -> None:
        self.live_telemetry = True

    def add_recorded_sample(self, sample) -> None:
        """GUI thread: a TelemetrySample of a recorded run, its t_mono already on the replay's clock."""
        self._inbox.append(sample)

    def set_gpu_state(self, state: str) -> None:
        self.gpu_state = state
        self._update_sys_title()

    def _drain_telemetry(self) -> None:
        while self._inbox:
            s = self._inbox.popleft()
            if s.gpu_state != self.gpu_state:
                self.gpu_state = s.gpu_state
                self._update_sys_title()
            self._setup_sys_curves(bool(s.gpus))
            self.tele.append(telemetry_row(s))
            self._tele_dirty = True

    # --- drawing ---------------------------------------------------------------------------------
    def _set(self, item, name: str, x: np.ndarray, y: np.ndarray, color: str, unit: str) -> None:
        if len(y) and not np.isfinite(y).any():
            x, y = x[:0], y[:0]
        item.setData(x, y, connect="finite")
        self.setdata_calls += 1
        self._series[name] = (x, y, color, unit)

    def redraw(self, force: bool = False) -> None:
        """Timer tick: one setData per changed series, and ranges grown in steps where the data left them.

        Skipped while the panel is hidden or live plots are off during a run, and backed off during a run so that
        a frame (setData and painting) takes at most :data:`FRAME_BUDGET` of a core: a slow machine draws less
        often instead of taking CPU from the lanes; data waits in the rings. `force` draws now whatever the state
        (the run's end, exports).
        """
        self._drain_telemetry()
        if self.t0 is None:
            return
        now = time.monotonic()
        if not force:
            if not self.isVisible() or (self.running and not self.live):
                return
            cost = self.frame_s + self.glw.last_paint_s
            if now - self._last_redraw < cost / (self.frame_budget if self.running else 0.2):
                return
            lanes_dirty = any(ln.dirty for ln in self.lanes.values())
            tele_due = self._tele_dirty and now - self._last_tele_draw >= TELEMETRY_INTERVAL_S
            if not lanes_dirty and not tele_due:
                return
        self._last_redraw = now
        if self.hold_between_redraws:  # paint this redraw, then hold again once it is on screen
            self._hold(False)
            self._hold_after_paint = True
            QTimer.singleShot(HOLD_AFTER_MS, self, lambda: self._hold(True))  # in case no paint comes
        c0 = time.thread_time()
        run_now = self.clock()
        if now - self._last_phase_tick >= 0.5:  # an open phase grows in half-second steps (each one repaints)
            self._last_phase_tick = now
            for ph in self.phases:
                ph.extend(run_now - self.t0)
        t_max = max((ph.end if ph.end is not None else run_now - self.t0) for ph in self.phases) if self.phases else 0.0
        y_tps = 0.0
        k_max = 0
        bars_due = force or not self.running or now - self._last_bars_draw >= BARS_INTERVAL_S
        if bars_due:
            self._last_bars_draw = now
        for i, ln in enumerate(self.lanes.values()):
            v = ln.ring.view()
            if len(v):
                t_max = max(t_max, float(v[-1, COL_RECV_S]))
            y_tps = max(y_tps, ln.rate_max)
            k_max = max(k_max, len(ln.acc.per_position_drafted))
            if ln.dirty:
                ln.dirty = False
                ln.bars_dirty = True
                x = v[:, COL_RECV_S]
                self._set(ln.tps_curve, f"{i + 1}: {ln.label} tok/s", x, v[:, COL_RATE], ln.color, "tok/s")
                self._set(ln.alpha_curve, f"{i + 1}: {ln.label} α", x, v[:, COL_ALPHA], ln.color, "")
            if bars_due and ln.bars_dirty and ln.acc.per_position_drafted:
                ln.bars_dirty = False
                pos = np.arange(1, len(ln.acc.per_position_drafted) + 1, dtype=float)
                h = np.array(ln.acc.per_position_accepted, dtype=float) / np.maximum(np.array(ln.acc.per_position_drafted, dtype=float), 1.0)
                ln.bars.setOpts(x=pos + ln.bar_offset, height=h)
                self.setdata_calls += 1
        if self._tele_dirty and (force or now - self._last_tele_draw >= TELEMETRY_INTERVAL_S or not self.running):
            self._tele_dirty = False
            self._last_tele_draw = now
            v = self.tele.view()
            x = v[:, 0] - self.t0
            names = list(self._sys_curves)
            cols = (1, 2, 3, 4) if self.gpu_mode else (1, 3, 2, 4)
            for name, col in zip(names, cols, strict=False):
                c = self._sys_curves[name]
                self._set(c, name, x, v[:, col], pg.mkPen(c.opts["pen"]).color().name(), "MiB" if "MiB" in name else "%")
            self._sys_ranges(v)
        self._set_range(self.p_tps.vb, "x", -1.0, nice_ceiling(max(5.0, t_max * 1.05)))
        self._set_range(self.p_tps.vb, "y", 0.0, nice_ceiling(max(y_tps * 1.05, 1e-3)) if y_tps > 0 else 1.0)
        if k_max:
            self._set_range(self.p_pos.vb, "x", 0.4, k_max + 0.6)
        self.redraws += 1
        self.frame_s = time.thread_time() - c0

    def _sys_ranges(self, v: np.ndarray) -> None:
        """Grow the system plot's two y axes (percent left, MiB right) in steps."""
        left = (1, 3)
        right = (2, 4, 5) if self.gpu_mode else (2, 4)

        def top(cols) -> float:
            vals = v[:, list(cols)] if len(v) else np.empty((0, 0))
            finite = vals[np.isfinite(vals)]
            return float(finite.max()) if finite.size else 0.0

        self._set_range(self.p_sys.vb, "y", 0.0, nice_ceiling(max(top(left) * 1.05, 10.0)))
        self._set_range(self.sys_vb2, "y", 0.0, nice_ceiling(max(top(right) * 1.05, 1.0)))

    def _set_range(self, vb, axis: str, lo: float, hi: float) -> None:
        """Set a view box's range when it differs from the one set last (and the user has not moved it): axes are
        laid out again only when a range grows, not on every frame as auto-range would."""
        if vb in self._manual or self._ranges.get((vb, axis)) == (lo, hi):
            return
        self._ranges[(vb, axis)] = (lo, hi)
        if axis == "x":
            vb.setXRange(lo, hi, padding=0)
        else:
            vb.setYRange(lo, hi, padding=0)

    # --- crosshair -------------------------------------------------------------------------------
    def _mouse_moved(self, args) -> None:
        pos = args[0]
        for p in self.time_plots:
            if p.sceneBoundingRect().contains(pos):
                x = p.vb.mapSceneToView(pos).x()
                self.show_crosshair(x)
                return
        for cl in self.cross_lines:
            cl.hide()

    def show_crosshair(self, x: float) -> str:
        """Move the crosshair to time `x` and write the nearest values of every series; returns the text."""
        for cl in self.cross_lines:
            cl.setPos(x)
            cl.show()
        parts = [f"<b>t = {x:.2f} s</b>"]
        for name, (xs, ys, color, _unit) in self._series.items():
            if not len(xs):
                continue
            i = int(np.clip(np.searchsorted(xs, x), 0, len(xs) - 1))
            if i > 0 and abs(xs[i - 1] - x) < abs(xs[i] - x):
                i -= 1
            y = ys[i]
            if not np.isfinite(y):
                continue
            parts.append(f"<span style='color:{color}'>{name}</span> {y:.2f}")
        text = " &nbsp;·&nbsp; ".join(parts)
        self.readout.setText(text, color=self.theme.plot_fg, size="8pt")
        return text

    def save_png(self, path: str) -> bool:
        self.redraw(force=True)
        return self.glw.grab().save(str(path))

    def buffer_len(self, lane_id: str) -> int:
        ln = self.lanes.get(self._series_of.get(lane_id, lane_id))
        return len(ln.ring) if ln else 0

    def lane_data(self, lane_id: str) -> np.ndarray:
        """A copy of a lane's plotted rows (a run of several prompts: its setup's series): (receive time since the
        start, lane clock, tokens, accepted, drafted, tokens/s, rolling α) per step; empty for a lane without one."""
        ln = self.lanes.get(self._series_of.get(lane_id, lane_id))
        return ln.ring.view().copy() if ln else np.empty((0, 7))
