"""The "Costs" tab: what a forward over n tokens costs on this machine, per engine (app.core.costs).

One curve per target engine: V(n) = one forward over n tokens ÷ one over a single token (a step verifying k drafts
costs V(k + 1) decode steps), so a flat curve (verifying is nearly free: speculation pays) and a steep one
(llama.cpp on a CPU: every drafted token costs almost a decode step to verify) are told apart at a glance. Each
draft model is a dashed horizontal line at c = its one-token forward ÷ its target's: what a drafted token costs
in the target's decode steps. The profiles arrive as ProfileReady events (cached per machine, or measured when a
lane first needs them). A run sink (app.ui.sinks).
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.core.costs import CostProfile
from app.core.events import ProfileReady
from app.core.setups import parse_setup
from app.ui.theme import LANE_COLORS, LIGHT, Theme
from app.worker.plan import RunPlan, RunResults

__all__ = ["CostPanel"]


class CostPanel(QWidget):
    """V(n) per target engine and each draft's cost, from the run's cost profiles."""

    def __init__(self, theme: Theme = LIGHT, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.profiles: dict[str, CostProfile] = {}  # by key, in arrival order
        self.targets: list[str] = []  # engine names the plan runs lanes on
        self.drafts: dict[tuple[str, str | None], str] = {}  # (draft engine, precision or None) -> its target
        self.glw = pg.GraphicsLayoutWidget()
        self.plot = self.glw.addPlot(title="verify cost V(n): one forward over n tokens ÷ one token")
        self.plot.setLabel("bottom", "tokens in one target forward (n = drafts + 1)")
        self.plot.setLabel("left", "V(n), in decode steps")
        self.plot.showGrid(x=True, y=True, alpha=0.25)
        self.plot.addLegend(offset=(5, 5), labelTextSize="8pt")
        for ax in ("left", "bottom"):
            self.plot.getAxis(ax).enableAutoSIPrefix(False)
        self.note = QLabel("No cost profile yet: a run with a drafting lane measures its engines once per machine "
                           "(or run python -m app profile ENGINE).")
        self.note.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.break_even = QLabel("")  # the setup finder's break-even line (Run ▸ Find the fastest setup)
        self.break_even.setWordWrap(True)
        self.break_even.hide()
        lay.addWidget(self.glw, 1)
        lay.addWidget(self.note)
        lay.addWidget(self.break_even)
        self.set_theme(theme)

    # --- run sink --------------------------------------------------------------------------------
    def start_run(self, plan: RunPlan, results: RunResults) -> None:
        setups = [parse_setup(s) for s in plan.setups]
        self.targets = list(dict.fromkeys([plan.target, *(s.target for s in setups if s.target)]))
        self.drafts = {d: s.target or plan.target for s in setups for d in s.draft_engines}
        self.redraw()

    def on_event(self, ev: object, t_recv: float) -> None:
        if isinstance(ev, ProfileReady):
            self.add_profile(ev.profile)

    def finish(self, results: RunResults) -> None:
        for p in results.profiles.values():
            if p.key not in self.profiles:
                self.profiles[p.key] = p
        self.redraw()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.glw.setBackground(theme.plot_bg)
        for ax in ("left", "bottom"):
            self.plot.getAxis(ax).setPen(theme.plot_fg)
            self.plot.getAxis(ax).setTextPen(theme.plot_fg)
        self.redraw()

    def set_break_even(self, lines: list[str]) -> None:
        """Show the setup finder's break-even lines (what α or V(k + 1) a drafter needs here to beat the baseline and
        the winner) under the curves."""
        self.break_even.setText("Break-even on this machine (setup finder):\n" + "\n".join(f"• {t}" for t in lines) if lines else "")
        self.break_even.setVisible(bool(lines))

    # --- content ---------------------------------------------------------------------------------
    def add_profile(self, p: CostProfile) -> None:
        self.profiles[p.key] = p
        self.redraw()

    def _target_profile(self, engine: str) -> CostProfile | None:
        # the newest profile of that engine (precision as loaded)
        found = [p for p in self.profiles.values() if p.engine == engine]
        return found[-1] if found else None

    def lines(self) -> list[tuple[str, str, float | list[float]]]:
        """What is drawn: ("curve", label, V(1..N)) per target engine, ("draft", label, c) per draft (tests)."""
        out: list[tuple[str, str, float | list[float]]] = []
        drafts = [(name, prec) for name, prec in self.drafts]
        draft_names = {name for name, _ in drafts}
        shown_targets = [t for t in self.targets if self._target_profile(t) is not None]
        # profiles of engines the plan does not name as a target or draft (e.g. `profile` results) are curves too
        extra = [p.engine for p in self.profiles.values() if p.engine not in self.targets and p.engine not in draft_names]
        for name in dict.fromkeys([*shown_targets, *extra]):
            p = self._target_profile(name)
            if p is not None:
                out.append(("curve", f"{p.engine} ({p.backend} {p.precision}) · T(1) {p.t1_s * 1e3:.0f} ms", list(p.curve())))
        for (name, prec), target in self.drafts.items():
            tp = self._target_profile(target)
            dps = [p for p in self.profiles.values() if p.engine == name and (prec is None or p.precision == prec)]
            if tp is None or not dps or name == target and prec is None:
                continue
            dp = dps[-1]
            out.append(("draft", f"draft {dp.engine} ({dp.precision}) for {target}: c = {dp.t1_s / tp.t1_s:.2f}", dp.t1_s / tp.t1_s))
        return out

    def redraw(self) -> None:
        self.plot.clear()
        if self.plot.legend is not None:
            self.plot.legend.clear()
        items = self.lines()
        for i, (kind, label, y) in enumerate(items):
            color = LANE_COLORS[i % len(LANE_COLORS)]
            if kind == "curve":
                assert isinstance(y, list)
                self.plot.plot(list(range(1, len(y) + 1)), y, pen=pg.mkPen(color, width=2), symbol="o", symbolSize=4,
                               symbolBrush=color, name=label)
            else:
                assert isinstance(y, float)
                line = pg.InfiniteLine(pos=y, angle=0, pen=pg.mkPen(color, width=2, style=Qt.PenStyle.DashLine))
                self.plot.addItem(line)
                self.plot.plot([1], [y], pen=None, symbol="t", symbolBrush=color, name=label)  # its legend entry
        if items:
            machine = next(iter(self.profiles.values())).machine_text
            self.note.setText(f"Measured on {machine or 'this machine'} (cached per engine, precision and machine). A step that "
                              "verifies k drafts costs V(k+1) decode steps; a drafted token costs c of one. Speculation pays where "
                              "accepted tokens outweigh both: k=auto decides this every step.")
        self.plot.enableAutoRange()
