"""Building blocks of the live plots (app.ui.plots): step-wise ranges, ring buffers, a lane's series, shaded
phases, a plot layout that times its own paints, the system plot's curves and telemetry rows, and legend helpers."""

from __future__ import annotations

import math
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.core.metrics import LaneAccumulator

__all__ = ["nice_ceiling", "Ring", "LaneSeries", "Phase", "TimedLayout", "COLUMNS", "COL_RECV_S", "COL_LANE_S", "COL_TOKENS",
           "COL_ACCEPTED", "COL_DRAFTED", "COL_RATE", "COL_ALPHA", "elide", "fit_legend", "veil_legend",
           "LEGEND_VEIL_ALPHA", "LEGEND_ROOM", "LEGEND_NAME_CHARS", "SYS_CURVES", "telemetry_row"]

#: the system plot's curves, GPU (True) or CPU (False): (name, colour, on the right-hand MiB axis, pen style)
SYS_CURVES: dict[bool, tuple[tuple[str, str, bool, Qt.PenStyle], ...]] = {
    True: (("GPU util %", "#76b900", False, Qt.PenStyle.SolidLine), ("GPU mem MiB", "#8250df", True, Qt.PenStyle.DashLine),
           ("server GPU util %", "#D55E00", False, Qt.PenStyle.SolidLine),
           ("server GPU mem MiB", "#CC79A7", True, Qt.PenStyle.DashLine)),
    False: (("worker CPU %", "#0072B2", False, Qt.PenStyle.SolidLine), ("GUI CPU %", "#E69F00", False, Qt.PenStyle.SolidLine),
            ("worker RSS MiB", "#0072B2", True, Qt.PenStyle.DashLine), ("GUI RSS MiB", "#E69F00", True, Qt.PenStyle.DashLine)),
}


def telemetry_row(s) -> tuple[float, ...]:
    """A TelemetrySample as one row of the plots' telemetry ring: (t, four series, total GPU memory, host CPU %).
    With GPUs: this machine's (NVML) and the served lanes' (DCGM exporters), each utilisation averaged and memory
    summed; without: the worker's and the window's CPU % and RSS MiB."""
    nan = math.nan
    if s.gpus:
        local = [x for x in s.gpus if not x.source]
        served = [x for x in s.gpus if x.source]
        return (s.t_mono, _mean_util(local), _sum_mem(local), _mean_util(served), _sum_mem(served),
                float(sum(x.mem_total_mib for x in local)) if local else nan, s.host.cpu_pct)
    w, g = s.host.proc("worker"), s.host.proc("gui")
    return (s.t_mono, w.cpu_pct if w else nan, w.rss_mib if w else nan, g.cpu_pct if g else nan,
            g.rss_mib if g else nan, nan, s.host.cpu_pct)


def _mean_util(gpus) -> float:
    vals = [g.util_pct for g in gpus if not math.isnan(g.util_pct)]
    return float(np.mean(vals)) if vals else math.nan


def _sum_mem(gpus) -> float:
    return float(sum(g.mem_used_mib for g in gpus)) if gpus else math.nan


#: opacity (0–255) of the plot-background veil behind the plots' legends
LEGEND_VEIL_ALPHA = 120
#: a legend is shown only in a plot at least this many times its height
LEGEND_ROOM = 1.5
#: a lane's name in the tokens/s legend is cut to this many characters (the lane's header and Results keep it whole)
LEGEND_NAME_CHARS = 24


def elide(text: str, n: int) -> str:
    """`text` cut to `n` characters, the last one an ellipsis where it was cut."""
    return text if len(text) <= n else text[: n - 1] + "…"


def fit_legend(plot, legend) -> None:
    """Show `legend` only where `plot` is at least :data:`LEGEND_ROOM` times its height: in a plot squeezed short
    it would cover most of the data (the lanes' colours are in their headers; hovering reads values)."""
    if legend is not None:
        legend.setVisible(plot.vb.height() >= LEGEND_ROOM * legend.boundingRect().height())


def veil_legend(legend, background: str, text: str) -> None:
    """A legend sits over the data: a veil of the plot's `background` keeps its names (in `text` colour) readable
    over the curves, which still show through it."""
    if legend is not None:
        veil = pg.mkColor(background)
        veil.setAlpha(LEGEND_VEIL_ALPHA)
        legend.setBrush(pg.mkBrush(veil))
        legend.setLabelTextColor(text)

_STEPS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.5)


def nice_ceiling(x: float) -> float:
    """The smallest of 1, 1.5, 2, 3, 5, 7.5 × 10^k that is ≥ `x` (x > 0), for ranges that grow in steps."""
    if not x > 0 or not math.isfinite(x):
        return 1.0
    e = math.floor(math.log10(x))
    for m in (*_STEPS, 10.0):
        v = m * 10.0**e
        if v >= x * (1 - 1e-12):
            return v
    return 10.0 ** (e + 1)


class Ring:
    """A growing window over a preallocated float64 array [capacity, cols]; when full, the older half is
    dropped (amortised O(1) append, contiguous views for setData, bounded memory)."""

    def __init__(self, capacity: int, cols: int) -> None:
        self.capacity = int(capacity)
        self.buf = np.full((self.capacity, cols), np.nan)
        self.n = 0
        self.dropped = 0

    def append(self, row) -> None:
        if self.n == self.capacity:
            keep = self.capacity // 2
            self.buf[:keep] = self.buf[self.n - keep : self.n]
            self.dropped += self.n - keep
            self.n = keep
        self.buf[self.n] = row
        self.n += 1

    def view(self) -> np.ndarray:
        return self.buf[: self.n]

    def clear(self) -> None:
        self.n = 0
        self.dropped = 0

    def __len__(self) -> int:
        return self.n


#: a lane ring's columns: receipt time (s since Run was clicked), lane clock (s), tokens, accepted, drafted (counts so
#: far), smoothed tokens/s, rolling α
COLUMNS = COL_RECV_S, COL_LANE_S, COL_TOKENS, COL_ACCEPTED, COL_DRAFTED, COL_RATE, COL_ALPHA = range(7)


class LaneSeries:
    """One lane's ring of per-step figures and its plot items — or, in a run of several prompts, one setup's lanes
    one after another: their lane clocks laid end to end (`clock_offset`, from the lane `current` on)."""

    def __init__(self, lane_id: str, label: str, color: str, capacity: int) -> None:
        self.lane_id = lane_id
        self.current = lane_id  # the lane whose steps come in now
        self.clock_offset = 0.0  # lane clock of the lanes before `current` (a run of several prompts)
        self.label = label
        self.color = color
        self.ring = Ring(capacity, len(COLUMNS))
        self.acc = LaneAccumulator()  # the same counts the lane header and the final stats use
        self.dirty = True
        self.bars_dirty = False
        self.rate_max = 0.0  # highest smoothed tokens/s so far (the y range grows to it)
        self.tps_curve = None
        self.alpha_curve = None
        self.bars = None


class Phase:
    """A shaded stretch of the time plots before the recorded lanes ("loading engines", "warm-up"), in seconds
    since the run's start; `end` is None while it lasts."""

    def __init__(self, label: str, start: float, plots, color, label_pos: float = 0.08) -> None:
        self.label = label
        self.start = start
        self.end: float | None = None
        self.regions = []
        for i, p in enumerate(plots):
            r = pg.LinearRegionItem(values=(start, start), movable=False, brush=pg.mkBrush(color), pen=pg.mkPen(None))
            r.setZValue(-20)
            if i == 0:
                pg.InfLineLabel(r.lines[0], text=label, position=label_pos, anchors=[(0, 1), (0, 1)], color="#888")
            p.addItem(r, ignoreBounds=True)  # growing it must not re-run auto-range over every item, every tick
            self.regions.append(r)

    def extend(self, t: float, close: bool = False) -> None:
        if self.end is not None:
            return
        for r in self.regions:
            r.setRegion((self.start, max(self.start, t)))
        if close:
            self.end = max(self.start, t)

    def remove(self) -> None:
        for r in self.regions:
            vb = r.getViewBox()
            if vb is not None:
                vb.removeItem(r)


class TimedLayout(pg.GraphicsLayoutWidget):
    """Remembers how much CPU its last paint took (the redraw timer backs off when painting is slow)."""

    last_paint_s = 0.0

    def paintEvent(self, ev) -> None:
        t = time.thread_time()
        super().paintEvent(ev)
        self.last_paint_s = time.thread_time() - t
