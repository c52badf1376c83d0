"""The "Costs" tab: what a forward over n tokens costs on this machine, per engine (app.core.costs).

One curve per target engine: V(n) = one forward over n tokens ÷ one over a single token (a step verifying k drafts
costs V(k + 1) decode steps), so a flat curve (verifying is nearly free: speculation pays) and a steep one
(llama.cpp on a CPU: every drafted token costs almost a decode step to verify) are told apart at a glance. Each
draft model is a dashed horizontal line at c = its one-token forward ÷ its target's: what a drafted token costs
in the target's decode steps. The profiles arrive as ProfileReady events (cached per machine, or measured when a
lane first needs them). A run sink (app.ui.sinks).

Under the curves, for each target–draft pair of the run: what k=auto has saved of it on this machine (the memory its
next lane starts from: app.speculative.policy.saved_summary), read when profiles arrive and when a run ends, with a
button that forgets it (policy.forget_saved) — a live demo can start k=auto from its priors again. Where that memory
says the pair's verifies cost 3 % or more off the profile (AutoK.verify_factor: a lane's verify follows the draft's
forwards, the profile's follows the target's own), the target's curve as k=auto prices it is drawn dotted beside it.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

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
        self.memory = QLabel("")  # what k=auto saved of the run's target–draft pairs (refresh_memory)
        self.memory.setWordWrap(True)
        self.forget = QPushButton("Forget what k=auto learnt")
        self.forget.setToolTip("Delete what k=auto saved of these pairs on this machine: their next k=auto lane starts "
                               "from its priors (python -m app profile TARGET --draft DRAFT --forget-kauto does the same)")
        self.forget.clicked.connect(self.forget_memory)
        self._saved: dict[tuple[str, str], dict] = {}  # what is saved of the pairs shown, by key (refresh_memory)
        row = QHBoxLayout()
        row.addWidget(self.memory, 1)
        row.addWidget(self.forget, 0, Qt.AlignmentFlag.AlignTop)
        self.memory_row = QWidget()
        self.memory_row.setLayout(row)
        row.setContentsMargins(0, 0, 0, 0)
        self.memory_row.hide()
        lay.addWidget(self.glw, 1)
        lay.addWidget(self.note)
        lay.addWidget(self.break_even)
        lay.addWidget(self.memory_row)
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
        self.refresh_memory()  # the run's k=auto lanes saved what they learnt when they ended; redraws

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
        self.refresh_memory()  # redraws

    def pairs(self) -> list[tuple[str, tuple[str, str]]]:
        """The run's target–draft pairs with both profiles: (label, the key a k=auto lane saves under: the two profiles'
        keys, as app.lanes.draft makes it)."""
        return [(f"draft {dp.engine} ({dp.precision}) for {target}", (tp.key, dp.key)) for target, tp, dp, _ in self._draft_profiles()]

    def _draft_profiles(self) -> list[tuple[str, CostProfile, CostProfile, str | None]]:
        """(target, its profile, the draft's newest profile at the plan's precision, that precision or None) per draft
        of the plan whose two profiles have arrived."""
        out = []
        for (name, prec), target in self.drafts.items():
            tp = self._target_profile(target)
            dps = [p for p in self.profiles.values() if p.engine == name and (prec is None or p.precision == prec)]
            if tp is not None and dps:
                out.append((target, tp, dps[-1], prec))
        return out

    def refresh_memory(self) -> None:
        """Read what k=auto saved of each pair of the run and show it (nothing saved, or the memory off: the row hides),
        then redraw (the curves as its memory prices them)."""
        from app.speculative.policy import saved_summary, saving_words, sure_words

        lines, self._saved = [], {}
        for label, key in self.pairs():
            s = saved_summary(key)
            if s is None:
                continue
            self._saved[key] = s
            kept = ", ".join(f"{b} {v:.0%}" for b, v in s["kept"].items())
            lines.append(f"• {label}: over {s['answers']} answer(s), saved {s['saved']}; drafts kept by confidence: {kept}; "
                         f"{sure_words(s)}; {saving_words(s)}; verifies cost {s['verify']:.2f}x the profile's")
        if lines:
            self.memory.setText("k=auto starts from what it learnt of these pairs on this machine:\n" + "\n".join(lines))
        self.memory_row.setVisible(bool(lines))
        self.forget.setEnabled(bool(lines))
        self.redraw()

    def forget_memory(self) -> None:
        """Delete what k=auto saved of the pairs shown: their next k=auto lane starts from its priors."""
        from app.speculative.policy import forget_saved

        gone = [key for key in self._saved if forget_saved(key) is not None]
        self._saved = {}
        self.memory.setText(f"Forgot what k=auto learnt of {len(gone)} pair(s): their next k=auto lane starts from its priors.")
        self.redraw()  # the curves k=auto's memory priced go with it
        self.memory_row.setVisible(True)
        self.forget.setEnabled(False)

    def _target_profile(self, engine: str) -> CostProfile | None:
        # the newest profile of that engine (precision as loaded)
        found = [p for p in self.profiles.values() if p.engine == engine]
        return found[-1] if found else None

    def lines(self) -> list[tuple[str, str, float | list[float]]]:
        """What is drawn: ("curve", label, V(1..N)) per target engine, ("draft", label, c) per draft, and ("lanes", label,
        V(1..N) times the pair's verify factor from 2 tokens) per pair whose saved k=auto memory, as refresh_memory last
        read it, prices verifies 3 % or more off the profile (tests)."""
        from app.speculative.policy import scaled_verify

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
        for target, tp, dp, prec in self._draft_profiles():
            if dp.engine == target and prec is None:
                continue
            out.append(("draft", f"draft {dp.engine} ({dp.precision}) for {target}: c = {dp.t1_s / tp.t1_s:.2f}", dp.t1_s / tp.t1_s))
        for target, tp, dp, _ in self._draft_profiles():
            s = self._saved.get((tp.key, dp.key))
            if s is None or abs(s["verify"] - 1.0) < 0.03:
                continue
            out.append(("lanes", f"{target} as k=auto's lanes with {dp.engine} paid it: ×{s['verify']:.2f} from 2 tokens",
                        list(scaled_verify(tp.curve(), s["verify"]))))
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
            elif kind == "lanes":
                assert isinstance(y, list)
                self.plot.plot(list(range(1, len(y) + 1)), y, pen=pg.mkPen(color, width=2, style=Qt.PenStyle.DotLine), name=label)
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
