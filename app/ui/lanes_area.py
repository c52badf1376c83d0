"""The lanes area: the legend over one LaneView per lane, side by side (2×2 for four), as a run sink.

Lane text is rendered once per display frame while a run is going (:meth:`LanesArea.on_frame`, called by the run
controller 20 times a second, 4 on a machine with few cores: app.ui.run_controller.frame_ms): each frame inserts
every lane's new tokens in one batch; the headers' figures change at most :data:`HEADER_HZ` times a second (a
label's new text lays the lane out again; once a second on few cores), and on few cores the lanes' scroll bars
are held still during the run (LaneView.hold_scrollbar). A lane's badge ("✓ identical to baseline")
appears as it ends, once the baseline's result is in.

A run of several prompts or repeats (a `bench --record` run file shown in the window) has a view per setup, as any
run: a "prompt" box above them picks whose lanes they show (the first prompt's at first), and the events of the
others are kept, so switching draws the chosen prompt's lanes as they are.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QCheckBox, QComboBox, QGridLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.core.events import LaneDone, LaneStarted, LogEvent, Progress, RunError, StepEvent
from app.core.metrics import is_baseline
from app.ui.lane_view import LaneView
from app.ui.load import few_cores
from app.ui.sinks import WorkerSilence
from app.ui.theme import LANE_COLORS, LIGHT, Theme, token_format
from app.worker.messages import WorkerReady
from app.worker.plan import RunPlan, RunResults

__all__ = ["LanesArea", "legend_html", "HEADER_HZ", "FEW_CORES_HEADER_HZ"]

#: lane headers (tokens/s, α, τ, …) are refreshed at most this often
HEADER_HZ = 2.0
#: …and on a machine with few cores (app.ui.load.FEW_CORES), where the window's every repaint slows the lanes
FEW_CORES_HEADER_HZ = 1.0

_ENDED = ("done", "cancelled", "error")


def legend_html(t: Theme) -> str:
    """The token-kind legend, each sample drawn with its colour and second cue."""
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
    return "<b>Legend</b>&nbsp; " + " &nbsp;·&nbsp; ".join(parts)


class LanesArea(QWidget):
    """Legend, "hide rejected drafts" and the lane views.

    Attributes:
        views: one LaneView per lane, in lane order.
        by_id: lane id → view for the current run (with several prompts: the shown prompt's lanes).
        group: the prompt (and repeat) whose lanes the views show, as LaneSpec.group ("code-1#0"); None for a run
            of one.
    """

    def __init__(self, theme: Theme = LIGHT, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.views: list[LaneView] = []
        self.by_id: dict[str, LaneView] = {}
        self.plan: RunPlan | None = None
        self.results: RunResults | None = None
        self.text_px: int | None = None  # lane text size in presentation mode (None: the usual)
        self.legend = QLabel()
        self.legend.setObjectName("legend")
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.hide_rejected = QCheckBox("hide rejected drafts")
        self.hide_rejected.toggled.connect(self._set_hide_rejected)
        self.group: str | None = None
        self._history: list[tuple[object, float]] = []  # a run of several prompts: every lane event so far
        self.prompt_box = QComboBox()
        self.prompt_box.setToolTip("a run of several prompts: whose lanes to show (the Results tab has every prompt)")
        self.prompt_box.hide()
        self.prompt_box.currentIndexChanged.connect(self._prompt_chosen)
        grid_w = QWidget()
        self.grid = QGridLayout(grid_w)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setSpacing(6)
        row = QHBoxLayout()
        row.addWidget(self.legend, 1)
        row.addWidget(self.prompt_box)
        row.addWidget(self.hide_rejected)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        lay.addLayout(row)
        lay.addWidget(grid_w, 1)
        self.frames = 0  # ticks that drew something (tests)
        self.set_theme(theme)

    # --- lanes ---------------------------------------------------------------------------------------
    def set_setups(self, setups: list[str]) -> None:
        """One view per setup, labelled with it (views are kept, added or removed to match)."""
        n = len(setups)
        while len(self.views) > n:
            v = self.views.pop()
            self.grid.removeWidget(v)
            v.deleteLater()
        while len(self.views) < n:
            i = len(self.views)
            hz = FEW_CORES_HEADER_HZ if few_cores() else HEADER_HZ
            v = LaneView(i, LANE_COLORS[i % len(LANE_COLORS)], self.theme, header_hz=hz)
            v.set_show_rejected(not self.hide_rejected.isChecked())
            if self.text_px is not None:
                v.set_text_px(self.text_px)
            self.views.append(v)
        cols = 2 if n == 4 else max(1, n) if n <= 4 else (n + 1) // 2  # more than 4: runs beside each other, two rows
        for i, (v, s) in enumerate(zip(self.views, setups, strict=True)):
            self.grid.addWidget(v, i // cols, i % cols)
            v.set_setup(s, machine="")
        for c in range(max(4, cols)):
            self.grid.setColumnStretch(c, 1 if c < cols else 0)

    def set_text_px(self, px: int | None) -> None:
        """Every lane's text at `px` pixels (presentation mode; None: the usual size), lanes added later too."""
        self.text_px = px
        for v in self.views:
            v.set_text_px(px)
        f = QFont()
        if px is not None:
            f.setPixelSize(max(12, round(px * 0.7)))
        for w in (self.legend, self.hide_rejected):
            w.setFont(f)

    def on_frame(self) -> None:
        """RunSink's display frame: draw what arrived since the last one."""
        self.flush()

    def flush(self) -> None:
        """Draw every lane's pending tokens (and due headers) in one batch."""
        drew = 0
        for v in self.views:
            drew += v.flush()
        if drew:
            self.frames += 1

    def _set_hide_rejected(self, hide: bool) -> None:
        for v in self.views:
            v.set_show_rejected(not hide)

    def _view(self, lane_id: str | None) -> LaneView | None:
        if lane_id is None or self.plan is None:
            return None
        if RunPlan.is_warmup(lane_id):
            i = self.plan.setup_index(lane_id)
            return self.views[i] if i is not None and i < len(self.views) else None
        return self.by_id.get(lane_id)

    def _waiting(self, text: str) -> None:
        for v in self.by_id.values():
            if v.state == "waiting" and v.status.text() != text:
                v.set_state("waiting", text)

    # --- RunSink -------------------------------------------------------------------------------------
    def start_run(self, plan: RunPlan, results: RunResults) -> None:
        self.plan, self.results = plan, results
        self.set_setups(list(plan.setups))
        groups = list(dict.fromkeys(spec.group for spec in plan.lanes))
        self._history = []
        self.prompt_box.blockSignals(True)
        self.prompt_box.clear()
        if len(groups) > 1:
            category = {p.id: p.category for p in plan.prompts}
            for g in groups:
                pid, _, rep = g.rpartition("#")
                self.prompt_box.addItem(pid + (f" · {category[pid]}" if category.get(pid) else "")
                                        + (f" · repeat {int(rep) + 1}" if rep.isdigit() and int(rep) else ""), g)
        self.prompt_box.blockSignals(False)
        self.prompt_box.setVisible(len(groups) > 1)
        self._show_group(groups[0] if len(groups) > 1 else None)

    def _show_group(self, group: str | None) -> None:
        """Views for the lanes of `group` (None: the run's lanes, a run of one prompt), ready for their events."""
        plan = self.plan
        assert plan is not None
        self.group = group
        self.by_id = {}
        few = few_cores()
        if group is None:
            pairs = list(zip(plan.lanes, self.views, strict=False))
        else:
            pairs = [(spec, self.views[i]) for spec in plan.lanes if spec.group == group
                     and (i := plan.setup_index(spec.lane_id)) is not None and i < len(self.views)]
        for spec, v in pairs:
            v.reset()
            v.hold_scrollbar(few)
            v.set_setup(spec.setup, machine=plan.machine_of(spec.lane_id))
            v.set_state("waiting", "waiting…")
            self.by_id[spec.lane_id] = v

    def _prompt_chosen(self, i: int) -> None:
        """Show the chosen prompt's lanes: its events so far drawn at once, the rest as they come."""
        group = self.prompt_box.itemData(i)
        if group is None or group == self.group or self.plan is None:
            return
        self._show_group(group)
        for ev, t in self._history:
            lane = getattr(ev, "lane_id", None)
            if lane in self.by_id or (lane is None and isinstance(ev, RunError)):  # its lanes', and the run's errors
                self._apply(ev, t)
        for v in self.by_id.values():
            v.flush(header=True)
        if self.results is not None and self.results.t_end is not None:
            self.finish(self.results)
        self.show_badges()

    def on_event(self, ev: object, t_recv: float) -> None:
        if self.group is not None and isinstance(ev, (StepEvent, LaneStarted, LaneDone, RunError)):
            self._history.append((ev, t_recv))
        self._apply(ev, t_recv)

    def _apply(self, ev: object, t_recv: float) -> None:
        lane = ev.lane_id if isinstance(ev, (StepEvent, LaneStarted, LaneDone, RunError)) else None
        warm = RunPlan.is_warmup(lane)
        v = self._view(lane)
        if isinstance(ev, StepEvent):
            if warm and v is not None and v.state == "waiting" and v.status.text() != "warming up…":
                v.set_state("waiting", "warming up…")
            elif not warm and v is not None:
                if v.notice.isVisibleTo(v):
                    v.set_notice("")  # tokens again: a wait it showed is over
                v.add_step(ev, t_recv)
        elif isinstance(ev, LaneStarted) and not warm and v is not None:
            if ev.engine:
                v.set_setup(v.setup, ev.engine)  # which engine, backend and precision run this lane
            v.set_state("running", "prefill…")
        elif isinstance(ev, LaneDone) and not warm and v is not None:
            v.finish(ev.stats, ev.cancelled)
            self.show_badges()
        elif isinstance(ev, RunError) and not warm:
            views = [v] if lane is not None else [x for x in self.by_id.values() if x.state not in _ENDED]
            for x in views:
                if x is not None:
                    x.show_error(ev.message)
        elif isinstance(ev, (Progress, WorkerReady)):
            self._waiting("loading…")
        elif isinstance(ev, LogEvent) and isinstance(ev.extra, dict) and "waiting_s" in ev.extra:
            w = self._view(ev.extra.get("lane"))
            if w is not None and not RunPlan.is_warmup(ev.extra.get("lane")) and w.state not in _ENDED:
                w.set_notice(ev.message)  # a remote lane waiting on its server: for how long, and the setting
        elif isinstance(ev, WorkerSilence):
            for x in self.by_id.values():
                x.set_notice(ev.message if ev.silent_s and x.state not in _ENDED else "")

    def finish(self, results: RunResults) -> None:
        for v in self.views:
            v.set_notice("")
            v.flush(header=True)
            v.hold_scrollbar(False)
            if v.state in ("waiting", "running"):
                v.set_state("cancelled" if results.stopped else "error", "stopped" if results.stopped else "no result")
        self.show_badges()

    def show_badges(self) -> None:
        """Badges of the lanes that ended: baseline, identical or diverging (once the baseline is in), cancelled."""
        r = self.results
        if r is None:
            return
        by_lane = r.by_lane()
        for lid, v in self.by_id.items():
            if lid in r.cancelled:
                v.set_badge(f"cancelled after {v.acc.new_tokens} tokens", None)
                continue
            s = by_lane.get(lid)
            if s is None:
                continue
            if is_baseline(s.setup):
                v.set_badge("baseline", None)
            elif s.identical_to_baseline:
                v.set_badge("✓ identical to baseline", True)
            elif s.identical_to_baseline is False:
                v.set_badge(f"≠ diverges at token {s.first_divergence}", False)
            v.update_header()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.legend.setText(legend_html(theme))
        for v in self.views:
            v.set_theme(theme)
