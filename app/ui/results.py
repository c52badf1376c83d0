"""Results table: one row per finished lane, sortable, the winner highlighted; CSV export.

A run sink: each lane's row appears as the lane ends (its baseline comparison filled in once the baseline
lane is in). Reads the same stats objects as the CLI table and the JSON export (RunResults, LaneStats,
summarize()).

A run of several prompts (or repeats) — a `bench --record` run file shown in the window — has a row per lane per
prompt, with a prompt column, and its winner is the lane fastest over all of them (:func:`lane_totals`: Σ of the
baseline's walls ÷ Σ of the lane's, as `bench` pools a setup), not its fastest single row.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from app.core.events import LaneDone, RunError
from app.core.metrics import LaneStats, baseline_of, is_baseline, summarize
from app.core.report import attach_baseline
from app.ui.theme import LANE_COLORS, LIGHT, Theme
from app.worker.plan import RunPlan, RunResults

__all__ = ["ResultsPanel", "ResultRow", "LaneTotal", "result_rows", "lane_totals", "fastest", "run_winner", "lane_label", "lane_color",
           "COLUMNS"]

COLUMNS = ("lane", "setup", "prompt", "tokens/s", "speedup", "α", "τ", "TTFT s", "theor. speedup", "tokens", "steps", "vs baseline")


class ResultRow:
    """One lane's row: display strings and the numbers they sort by.

    `base_stall_s` is the stall in the baseline lane this row's speedup is measured against: a stall in either
    clock makes the speedup untrustworthy, marked "!" with a tooltip (as the CLI's table does).
    """

    def __init__(self, lane: str, color: str, stats: LaneStats, theo: float | None, note: str = "", base_stall_s: float = 0.0) -> None:
        self.lane = lane
        self.color = color
        self.stats = stats
        self.theo = theo
        self.note = note
        self.base_stall_s = base_stall_s

    @property
    def stalled(self) -> bool:
        """This lane's clock, or its baseline's, includes a stall."""
        return self.stats.stall_s > 0 or (self.stats.speedup is not None and self.base_stall_s > 0)

    def stall_tip(self) -> str:
        """Why the row is marked "!" ("" when it is not)."""
        s = self.stats
        parts = []
        if s.stall_s > 0:
            parts.append(f"{s.stall_s:.1f} s of this lane's {s.wall_s:.1f} s were a stall")
        if s.speedup is not None and self.base_stall_s > 0 and not is_baseline(s.setup):
            parts.append(f"the baseline's clock includes a {self.base_stall_s:.1f} s stall")
        if not parts:
            return ""
        return ("; ".join(parts) + " (the worker was stopped or starved of CPU): this speedup is not trustworthy; "
                "rerun on a quiet machine")

    def notes_tip(self) -> str:
        """Where α's counts come from when not counted step by step, and the lane's notes ("" when none)."""
        s = self.stats
        parts = list(s.notes)
        if s.counts_source == "engine":
            parts.insert(0, "α from the engine's own per-request counters")
        return "\n".join(parts)

    def values(self) -> list[tuple[str, float | str | None]]:
        s = self.stats

        def f(x, spec):
            return ("—", None) if x is None or (isinstance(x, float) and math.isnan(x)) else (format(x, spec), float(x))

        if is_baseline(s.setup) or s.identical_to_baseline is None:
            vs = ("baseline" if is_baseline(s.setup) else "—", "")
        elif s.identical_to_baseline:
            vs = ("identical", "identical")
        else:
            vs = (f"diverges at token {s.first_divergence}", "diverges")
        if self.note:
            vs = (self.note, self.note)
        prompt = s.prompt_id + (f" #{s.repeat + 1}" if s.repeat else "")
        return [
            (self.lane, self.lane),
            (s.setup, s.setup),
            (prompt, prompt),
            f(s.tokens_per_s, ".2f"),
            (f"{s.speedup:.2f}×" + ("!" if self.stalled else ""), s.speedup) if s.speedup is not None else ("!" if self.stalled else "—", None),
            (("~" + format(s.acceptance_rate, ".3f")) if s.counts_source == "streamed" else format(s.acceptance_rate, ".3f"), s.acceptance_rate)
            if s.acceptance_rate is not None else ("—", None),
            f(s.mean_accepted_len, ".2f"),
            f(s.ttft_s, ".3f"),
            (f"{self.theo:.2f}×", self.theo) if self.theo is not None and math.isfinite(self.theo) else ("—", None),
            (str(s.new_tokens), float(s.new_tokens)),
            (str(s.steps), float(s.steps)),
            vs,
        ]


@dataclass(frozen=True)
class LaneTotal:
    """One lane of the window (a setup on its machine) over every prompt and repeat it finished.

    Attributes:
        speedup: Σ of its baseline's walls ÷ Σ of its walls, over the prompts and repeats both finished (None: no
            baseline to compare with); tokens_per_s: Σ new tokens ÷ Σ wall; identical / compared: its outputs equal
            to the baseline's, of those compared.
    """

    lane: str
    color: str
    setup: str
    runs: int
    tokens_per_s: float
    speedup: float | None
    identical: int
    compared: int


def lane_totals(rows: Sequence[ResultRow]) -> list[LaneTotal]:
    """Each lane's rows pooled, in first-seen order (rows of a lane: the same label, so the same setup on the same
    machine)."""
    by: dict[str, list[ResultRow]] = {}
    for r in rows:
        by.setdefault(r.lane, []).append(r)
    out = []
    for lane, rs in by.items():
        st = [r.stats for r in rs if r.stats.new_tokens > 0 and r.stats.wall_s > 0]
        if not st:
            continue
        paired = [s for s in st if s.speedup is not None and math.isfinite(s.speedup)]
        wall = sum(s.wall_s for s in paired)
        speedup = sum(s.wall_s * s.speedup for s in paired) / wall if paired and wall > 0 else None
        compared = [s for s in st if s.identical_to_baseline is not None]
        out.append(LaneTotal(lane, rs[0].color, rs[0].stats.setup, len(st), sum(s.new_tokens for s in st) / sum(s.wall_s for s in st),
                             speedup, sum(1 for s in compared if s.identical_to_baseline), len(compared)))
    return out


def _groups(stats: Sequence[LaneStats]) -> int:
    """How many (prompt, repeat) groups the lanes ran: more than one, and a lane's rows pool."""
    return len({(s.prompt_id, s.repeat) for s in stats})


def _best(totals: Sequence[LaneTotal]) -> LaneTotal | None:
    """The fastest lane over the run, among those that finished the most prompts (a lane that failed some does not
    win on the others): by pooled speedup where lanes have one, else by pooled tokens/s."""
    if not totals:
        return None
    most = max(t.runs for t in totals)
    full = [t for t in totals if t.runs == most]
    if any(t.speedup is not None for t in full):
        return max((t for t in full if t.speedup is not None), key=lambda t: t.speedup or 0.0)
    return max(full, key=lambda t: t.tokens_per_s)


def lane_label(plan: RunPlan, lane_id: str) -> str:
    """ "Lane 2": how the GUI names a lane (1-based, in the order of the setups); "Lane 5 · H200" when runs of several
    machines are beside each other."""
    i = plan.setup_index(lane_id)
    machine = plan.machine_of(lane_id)
    return (f"Lane {i + 1}" if i is not None else lane_id) + (f" · {machine}" if machine else "")


def lane_color(plan: RunPlan, lane_id: str) -> str:
    i = plan.setup_index(lane_id) or 0
    return LANE_COLORS[i % len(LANE_COLORS)]


def fastest(results: RunResults) -> tuple[str, LaneStats] | None:
    """(lane id, stats) of the completed lane with the most tokens/s, or None."""
    done = [(lid, s) for lid, s in results.by_lane().items() if s.new_tokens > 0 and math.isfinite(s.tokens_per_s)]
    return max(done, key=lambda x: x[1].tokens_per_s) if done else None


def run_winner(plan: RunPlan, results: RunResults) -> tuple[str, str] | None:
    """(lane label, setup) of the run's winner: its fastest lane, or with several prompts or repeats the lane
    fastest over all of them (:func:`lane_totals`); None when no lane finished."""
    lanes = results.by_lane()
    if _groups(list(lanes.values())) > 1:
        rows = result_rows([(lane_label(plan, lid), lane_color(plan, lid), s) for lid, s in lanes.items()])
        best = _best(lane_totals(rows))
        return (best.lane, best.setup) if best is not None else None
    win = fastest(results)
    return (lane_label(plan, win[0]), win[1].setup) if win is not None else None


def result_rows(lanes: list[tuple[str, str, LaneStats]]) -> list[ResultRow]:
    """Rows for (lane label, colour, stats) of finished lanes, with baseline comparisons filled in."""
    stats = attach_baseline([s for _, _, s in lanes])
    theo = {x.setup: x.theoretical_speedup for x in summarize(stats)}
    base_stall = {(s.setup, s.prompt_id, s.repeat): s.stall_s for s in stats if is_baseline(s.setup)}
    return [ResultRow(label, color, s, theo.get(s.setup), base_stall_s=base_stall.get((baseline_of(s.setup), s.prompt_id, s.repeat), 0.0))
            for (label, color, _), s in zip(lanes, stats, strict=False)]


class _Item(QTableWidgetItem):
    """Sorts by its numeric key (None last)."""

    def __init__(self, text: str, key) -> None:
        super().__init__(text)
        self.key = key
        if isinstance(key, float):
            self.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

    def __lt__(self, other) -> bool:
        a, b = self.key, getattr(other, "key", None)
        if isinstance(a, float) and isinstance(b, float):
            return a < b
        if a is None or b is None:
            return b is None and a is not None  # None sorts after numbers in ascending order
        return str(a) < str(b)


class ResultsPanel(QWidget):
    """Summary line ("X wins: 1.8× faster than baseline") over the sortable table."""

    def __init__(self, theme: Theme = LIGHT, parent=None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.rows: list[ResultRow] = []
        self._notes: dict[str, str] = {}
        self.winner: ResultRow | None = None
        self.totals: list[LaneTotal] = []  # each lane over the run's prompts and repeats (a run of several; else [])
        self.load_note = ""  # "the window used X % of a core during the run…" (set by the window at the end)
        self.plan: RunPlan | None = None
        self.results: RunResults | None = None
        self.summary = QLabel("Run a comparison to see results here.")
        self.summary.setObjectName("resultsSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setSortingEnabled(True)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        tips = {
            "tokens/s": "new tokens / the lane's wall time, prefill included (Spec-Bench's convention; TTFT shows the prefill)",
            "prompt": "the prompt (and repeat) of this row: a run of several prompts has a row per lane per prompt",
            "speedup": "baseline time / this lane's time, same prompt, same run",
            "α": "acceptance rate: accepted drafts / drafted tokens",
            "τ": "mean accepted length: tokens emitted / steps (target token included)",
            "TTFT s": "time to first token (prefill)",
            "theor. speedup": "predicted from the verify-cost curve V(n) (Costs tab) and the lane's own acceptance: each step that verified k drafts costs V(k+1) decode steps, each draft forward c; – where no cost profile exists",
        }
        for i, c in enumerate(COLUMNS):
            if c in tips:
                self.table.horizontalHeaderItem(i).setToolTip(tips[c])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.summary)
        lay.addWidget(self.table, 1)

    def set_text_px(self, px: int | None) -> None:
        """The table and summary at `px` pixels (presentation mode); None: the usual size. Rows keep their bold."""
        f = QFont()
        if px is not None:
            f.setPixelSize(int(px))
        for w in (self.table, self.table.horizontalHeader(), self.summary):
            w.setFont(f)
        for r in range(self.table.rowCount()):
            for c in range(self.table.columnCount()):
                it = self.table.item(r, c)
                if it is not None and it.font().bold():
                    g = QFont(f)
                    g.setBold(True)
                    it.setFont(g)
        vh = self.table.verticalHeader()
        if not hasattr(self, "_row_px"):
            self._row_px = vh.defaultSectionSize()
        vh.setDefaultSectionSize(self._row_px if px is None else round(px * 1.6))
        self.table.resizeRowsToContents()

    def set_load_note(self, text: str) -> None:
        """A line under the summary about the run's conditions (the window's own CPU use); "" removes it."""
        self.load_note = text
        if self.rows or self.results is not None:
            self.summary.setText(self._summary_text(self._notes))

    def clear(self) -> None:
        self.rows = []
        self.winner = None
        self.totals = []
        self.load_note = ""
        self.table.setRowCount(0)
        self.summary.setText("Running…")

    # --- RunSink -----------------------------------------------------------------------------------
    def start_run(self, plan: RunPlan, results: RunResults) -> None:
        self.plan, self.results = plan, results
        self.clear()

    def on_event(self, ev: object, _t: float) -> None:
        if isinstance(ev, (LaneDone, RunError)) and not RunPlan.is_warmup(ev.lane_id):
            self.show_results()

    def finish(self, results: RunResults) -> None:
        self.results = results
        self.show_results()

    def show_results(self) -> None:
        """Rows of the lanes that completed so far, notes for the failed ones (the summary says how many are
        still running)."""
        r, plan = self.results, self.plan
        if r is None or plan is None:
            return
        lanes = [(lane_label(plan, lid), lane_color(plan, lid), s) for lid, s in r.by_lane().items()]
        notes = {}
        for spec in plan.lanes:
            why = r.lane_error(spec.lane_id)
            if why is not None and why != "cancelled" and (spec.lane_id in r.errors or r.t_end is not None):
                notes[lane_label(plan, spec.lane_id)] = why
        self.set_results(lanes, notes)

    def set_results(self, lanes: list[tuple[str, str, LaneStats]], notes: dict[str, str] | None = None) -> None:
        """Fill the table from finished lanes (label, colour, stats); failed lanes go in `notes` (label → text)."""
        self.rows = result_rows(lanes) if lanes else []
        self._fill(notes or {})

    def _fill(self, notes: dict[str, str]) -> None:
        self._notes = notes
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(self.rows))
        done = [r for r in self.rows if r.stats.new_tokens > 0 and math.isfinite(r.stats.tokens_per_s)]
        pooled = _groups([r.stats for r in self.rows]) > 1
        self.table.setColumnHidden(COLUMNS.index("prompt"), not pooled)
        self.totals = lane_totals(done) if pooled else []
        best = _best(self.totals)
        if best is not None:  # several prompts: the winner is a lane over all of them; its best row stands for it
            self.winner = max((r for r in done if r.lane == best.lane), key=lambda r: r.stats.tokens_per_s)
        else:
            self.winner = max(done, key=lambda r: r.stats.tokens_per_s) if done else None
        won = {self.winner.lane} if pooled and self.winner is not None else set()
        bold = QFont(self.table.font())  # the table's size (presentation mode scales it)
        bold.setBold(True)
        for i, r in enumerate(self.rows):
            top = r is self.winner or r.lane in won
            for j, (text, key) in enumerate(r.values()):
                it = _Item(("★ " + text) if (j == 0 and top) else text, key)
                if j == 0:
                    it.setForeground(QBrush(QColor(r.color)))
                    it.setFont(bold)
                if top:
                    it.setBackground(QBrush(QColor(self.theme.good_bg)))
                    if j > 0:
                        it.setForeground(QBrush(QColor(self.theme.text)))
                    it.setFont(bold)
                if COLUMNS[j] in ("α", "setup") and r.notes_tip():
                    it.setToolTip(r.notes_tip())
                if r.stalled and COLUMNS[j] in ("speedup", "tokens/s"):
                    it.setToolTip(r.stall_tip())
                    if COLUMNS[j] == "speedup":
                        it.setForeground(QBrush(QColor(self.theme.correction)))
                self.table.setItem(i, j, it)
        self.table.setSortingEnabled(True)
        self.table.sortItems(COLUMNS.index("tokens/s"), Qt.SortOrder.DescendingOrder)
        self.summary.setText(self._summary_text(notes))

    def _summary_text(self, notes: dict[str, str]) -> str:
        t = self.theme
        w = self.winner
        extra = "".join(f"<br><span style='color:{t.rejected}'>{k}: {v}</span>" for k, v in notes.items())
        stalled = [r for r in self.rows if r.stats.stall_s > 0]
        if stalled:
            names = ", ".join(f"{r.lane} ({r.stats.stall_s:.1f} s)" for r in stalled)
            extra += (f"<br><span style='color:{t.correction}'>! stalled lane clocks: {names}: the worker was stopped or "
                      "starved of CPU, so speedups marked ! are not trustworthy; rerun on a quiet machine</span>")
        if self.load_note:
            extra += f"<br><span style='color:{t.correction}'>{self.load_note}</span>"
        r = self.results
        if r is not None and r.t_end is None:
            head = f"Running… {r.finished} of {r.total} lanes finished"
            if w is not None:
                head += f"; fastest so far: <b style='color:{w.color}'>{w.lane}</b> <code>{w.stats.setup}</code> at {w.stats.tokens_per_s:.2f} tok/s"
            return head + "." + extra
        if w is None:
            return "No lane finished." + extra
        if self.totals:
            return self._pooled_text() + extra
        s = w.stats
        base = next((r for r in self.rows if r.stats.setup == baseline_of(s.setup)), None)
        if base is None:
            head = f"<b style='color:{w.color}'>{w.lane}</b> <code>{s.setup}</code> is fastest at <b>{s.tokens_per_s:.2f} tok/s</b> (add a baseline lane to see speedups)."
        elif w is base:
            head = f"<b>Baseline wins</b> at {s.tokens_per_s:.2f} tok/s: no speculative setup beat plain decoding here."
        else:
            sp = s.speedup if s.speedup is not None else float("nan")
            same = (
                "output identical to baseline"
                if s.identical_to_baseline
                else (f"output diverges at token {s.first_divergence}" if s.first_divergence is not None else "")
            )
            head = (
                f"<b style='color:{w.color}'>{w.lane}</b> <code>{s.setup}</code> wins: "
                f"<b>{sp:.2f}× faster</b> than baseline ({s.tokens_per_s:.2f} vs {base.stats.tokens_per_s:.2f} tok/s)"
                + (f"; {same}." if same else ".")
            )
        return head + extra

    def _pooled_text(self) -> str:
        """The summary of a run of several prompts or repeats: the lane fastest over all of them, then the others."""
        best = _best(self.totals)
        assert best is not None
        n = _groups([r.stats for r in self.rows])
        over = f"over {n} prompts" if len({r.stats.prompt_id for r in self.rows}) == n else f"over {n} prompts and repeats"

        def name(t: LaneTotal) -> str:
            return f"<b style='color:{t.color}'>{t.lane}</b>"

        def part(t: LaneTotal) -> str:  # a lane that did not finish every prompt is pooled over those it did
            return f" (on {t.runs} of {n})" if t.runs < n else ""

        if best.speedup is None:
            head = (f"{name(best)} <code>{best.setup}</code> is fastest {over} at <b>{best.tokens_per_s:.2f} tok/s</b>{part(best)} "
                    "(add a baseline lane to see speedups).")
        elif is_baseline(best.setup):
            head = f"<b>Baseline wins</b> {over}: no speculative setup beat plain decoding here."
        else:
            same = f"; output identical to baseline on {best.identical} of {best.compared}" if best.compared else ""
            head = (f"{name(best)} <code>{best.setup}</code> wins {over}: <b>{best.speedup:.2f}× faster</b> than baseline{part(best)} "
                    f"(Σ of the baseline's times ÷ Σ of its own; {best.tokens_per_s:.2f} tok/s){same}.")
        others = [t for t in self.totals if t is not best and t.speedup is not None and not is_baseline(t.setup)]
        others.sort(key=lambda t: -(t.speedup or 0.0))
        if others:
            head += " Then " + ", ".join(f"{name(t)} {t.speedup:.2f}×{part(t)}" for t in others) + "."
        return head

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        if self.rows:
            self._fill(self._notes)

    def write_csv(self, path: str | Path) -> None:
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(
                [
                    "lane",
                    "setup",
                    "prompt_id",
                    "tokens_per_s",
                    "speedup",
                    "acceptance_rate",
                    "mean_accepted_len",
                    "ttft_s",
                    "theoretical_speedup",
                    "new_tokens",
                    "steps",
                    "wall_s",
                    "identical_to_baseline",
                    "first_divergence",
                    "stall_s",
                ]
            )
            for r in self.rows:
                s = r.stats
                w.writerow(
                    [
                        r.lane,
                        s.setup,
                        s.prompt_id,
                        _n(s.tokens_per_s),
                        _n(s.speedup),
                        _n(s.acceptance_rate),
                        _n(s.mean_accepted_len),
                        _n(s.ttft_s),
                        _n(r.theo),
                        s.new_tokens,
                        s.steps,
                        _n(s.wall_s),
                        "" if s.identical_to_baseline is None else s.identical_to_baseline,
                        "" if s.first_divergence is None else s.first_divergence,
                        _n(s.stall_s),
                    ]
                )


def _n(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return f"{x:.6g}"
