"""How much CPU the window itself took while the lanes ran, from the telemetry samples (a run sink).

On a machine with few cores the worker's lanes and the window share them: every percent the window paints with
is a percent a lane's clock may lose. :class:`LoadMeter` notes when the recorded lanes started and ended, and
:func:`run_load` averages the window's ("gui") and the worker's CPU over that stretch; the window shows
:func:`load_note` when the share looks large enough to distort the figures.
"""

from __future__ import annotations

import math
import os
import time

from app.core.events import LaneStarted
from app.worker.plan import RunPlan, RunResults

__all__ = ["LoadMeter", "run_load", "cpu_cores", "load_note", "FEW_CORES", "GUI_CPU_NOTE_PCT"]

#: a machine with at most this many cores shares them between the window and the worker's lanes
FEW_CORES = 4
#: the window's mean CPU use (percent of one core) while the lanes ran above which a few-core machine gets the note
GUI_CPU_NOTE_PCT = 5.0


def cpu_cores() -> int:
    """Cores this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_note(gui_cpu_pct: float, cores: int) -> str:
    """The note shown when the window's own CPU use may have slowed the lanes it measured ("" when not)."""
    if not (gui_cpu_pct >= GUI_CPU_NOTE_PCT) or cores > FEW_CORES:
        return ""
    return (f"the window used {gui_cpu_pct:.0f}% of a core during the run; on {cores} cores that can slow the lanes: "
            "untick View ▸ Live plots during runs, or use `python -m app bench` for figures to quote")


def run_load(samples, t0: float, t1: float, cores: int) -> dict:
    """Mean CPU of the window and the worker between monotonic times `t0` and `t1`.

    Args:
        samples: TelemetrySamples (app.telemetry.samples), any order; those outside [t0, t1] are ignored.
        t0, t1: the stretch of the recorded lanes, monotonic seconds.
        cores: CPU cores available.

    Returns:
        {"gui_cpu_pct", "worker_cpu_pct" (percent of one core; None without readings), "cores", "samples",
        "seconds"}.
    """
    vals: dict[str, list[float]] = {"gui": [], "worker": []}
    n = 0
    for s in samples:
        if not t0 <= s.t_mono <= t1:
            continue
        n += 1
        for role, out in vals.items():
            p = s.host.proc(role)
            if p is not None and math.isfinite(p.cpu_pct):
                out.append(p.cpu_pct)

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 1) if xs else None

    return {"gui_cpu_pct": mean(vals["gui"]), "worker_cpu_pct": mean(vals["worker"]), "cores": cores, "samples": n,
            "seconds": round(max(0.0, t1 - t0), 2)}


class LoadMeter:
    """A run sink that only keeps time: from the first recorded lane's start to the run's end (monotonic)."""

    def __init__(self) -> None:
        self.t_lanes: float | None = None
        self.t_end: float | None = None

    def start_run(self, plan: RunPlan, results: RunResults) -> None:
        self.t_lanes = self.t_end = None

    def on_event(self, ev: object, t_recv: float) -> None:
        if self.t_lanes is None and isinstance(ev, LaneStarted) and not RunPlan.is_warmup(ev.lane_id):
            self.t_lanes = t_recv

    def finish(self, results: RunResults) -> None:
        self.t_end = time.monotonic()

    def set_theme(self, theme) -> None:
        pass

    def measure(self, samples, cores: int | None = None) -> dict:
        """:func:`run_load` over the recorded lanes of the last run ({} before any lane started)."""
        if self.t_lanes is None:
            return {}
        return run_load(samples, self.t_lanes, self.t_end if self.t_end is not None else time.monotonic(), cores or cpu_cores())
