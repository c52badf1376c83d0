"""How much CPU the window itself took while the lanes ran, from the telemetry samples (a run sink).

On a machine with few cores the worker's lanes and the window share them: every percent the window paints with
is a percent a lane's clock may lose. :class:`LoadMeter` notes when the recorded lanes started and ended, and
:func:`run_load` averages the window's ("gui") and the worker's CPU over that stretch; :meth:`LoadMeter.evaluate`
adds the lanes' own CPU wait and gives the notes the window shows when the figures may be distorted. The window's
telemetry sampler (:func:`start_sampler`, the samples these figures come from) is started here too.

The window's threads run at lowered priority (app.ui.priority); the lower, the less they slow the lanes but the
more a worker that leaves no CPU idle starves them. So the meter also times the window's own event loop while the
lanes run (a precise timer every :data:`LAG_TICK_MS`; how late each tick came) and the note says when the window
lagged.
"""

from __future__ import annotations

import math
import os
import time

from app.core.events import LaneStarted
from app.core.metrics import cpu_wait_share
from app.worker.plan import RunPlan, RunResults

__all__ = ["LoadMeter", "run_load", "cpu_cores", "few_cores", "load_notes", "lag_summary", "start_sampler", "prepare_sampler", "FEW_CORES",
           "GUI_CPU_NOTE_PCT", "LANES_WAIT_NOTE_PCT", "LAG_TICK_MS", "LAG_NOTE_MS", "TELEMETRY_HZ", "FEW_CORES_TELEMETRY_HZ"]

#: a machine with at most this many cores shares them between the window and the worker's lanes
FEW_CORES = 4
#: the window's mean CPU use (percent of one core) while the lanes ran above which a few-core machine gets the note
#: (where the lanes' own CPU wait is not measured)
GUI_CPU_NOTE_PCT = 5.0
#: the recorded lanes waited for a CPU this share of their time (percent): the window says their figures may be low
LANES_WAIT_NOTE_PCT = 5.0
#: while the lanes run the window's event loop is timed by a tick this often (ms)
LAG_TICK_MS = 250
#: a tick this late (ms) means the window could not answer the user promptly: the note says so
LAG_NOTE_MS = 1000.0
#: telemetry samples a second in the window (the plot shows CPU over half-second windows, and every sample is
#: work taken from the lanes on a machine with few cores)…
TELEMETRY_HZ = 5.0
#: …and on a machine with at most FEW_CORES cores, where the sampler's reads come out of the lanes' cores
FEW_CORES_TELEMETRY_HZ = 2.0


def few_cores(cores: int | None = None) -> bool:
    """Whether a machine with `cores` cores (default: the ones this process may use) shares them between the window
    and the lanes (at most :data:`FEW_CORES`): the window then draws and samples less often."""
    return (cpu_cores() if cores is None else cores) <= FEW_CORES


def cpu_cores() -> int:
    """Cores this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_notes(gui_cpu_pct: float | None, cores: int, lag_max_ms: float | None = None, priority: str = "",
               lanes_wait_pct: float | None = None) -> list[tuple[str, str]]:
    """(headline, note) for each way the window and the lanes got in each other's way during a run, empty when none.

    `lanes_wait_pct`: how long the worker's threads waited for a CPU, in percent of the recorded lanes' time
    (LaneStats.cpu_wait_s; None where not measured). When it is known it decides: at :data:`LANES_WAIT_NOTE_PCT` or
    more the lanes were slowed by other processes, this window among them. Where it is not, the window's own CPU use
    (`gui_cpu_pct`, percent of one core) on a machine with few cores stands in. `lag_max_ms`: the window's own event
    loop ran that late at worst (the lanes starved it)."""
    notes = []
    fix = "untick View ▸ Live plots during runs, close other programs, or use `python -m app bench` for figures to quote"
    if lanes_wait_pct is not None:
        if lanes_wait_pct >= LANES_WAIT_NOTE_PCT:
            used = f"; the window used {gui_cpu_pct:.0f}% of a core" if gui_cpu_pct is not None else ""
            notes.append((f"the lanes waited for a CPU {lanes_wait_pct:.0f}% of their time",
                          f"the lanes waited for a CPU core {lanes_wait_pct:.0f}% of their time (other processes had it{used}): "
                          f"their tokens/s may read up to that much low: {fix}"))
    elif gui_cpu_pct is not None and gui_cpu_pct >= GUI_CPU_NOTE_PCT and cores <= FEW_CORES:
        notes.append((f"the window used {gui_cpu_pct:.0f}% of a core",
                      f"the window used {gui_cpu_pct:.0f}% of a core during the run; on {cores} cores that can slow the lanes: {fix}"))
    if lag_max_ms is not None and lag_max_ms >= LAG_NOTE_MS:
        why = (" (SPECDECK_GUI_PRIORITY=idle runs it only on CPU time the lanes leave; the default, batch, keeps it "
               "responsive)") if priority == "idle" else ""
        notes.append((f"the window lagged up to {lag_max_ms / 1000:.1f} s",
                      f"the lanes left the window little CPU: it answered up to {lag_max_ms / 1000:.1f} s late{why}"))
    return notes


def lag_summary(lags_ms) -> dict:
    """{"lag_p95_ms", "lag_max_ms", "lag_ticks"} of the event loop's tick lateness (ms); {} without ticks."""
    xs = sorted(lags_ms)
    if not xs:
        return {}
    return {"lag_p95_ms": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1), "lag_max_ms": round(xs[-1], 1), "lag_ticks": len(xs)}


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


def start_sampler(on_sample, pids) -> tuple[object | None, str]:
    """The window's telemetry sampler, started (TELEMETRY_HZ, FEW_CORES_TELEMETRY_HZ on few cores): (sampler, its GPU
    state line), or (None, why) when telemetry is unavailable (the package is optional for the GUI)."""
    try:
        from app.telemetry.sampler import TelemetrySampler

        hz = FEW_CORES_TELEMETRY_HZ if few_cores() else TELEMETRY_HZ
        sampler = TelemetrySampler(rate_hz=hz, pids=pids, on_sample=on_sample)
        sampler.start()
        return sampler, sampler.gpu_state
    except Exception as e:
        return None, f"telemetry unavailable ({e})"


def prepare_sampler(sampler, target: str, setups) -> str:
    """A run begins: clear the sampler, have it sample now (a run shorter than its period still records the machine's
    state), and add the GPUs of a served lane (its manifest's DCGM exporter) to the GPU plot. Returns a warning (""
    when all went well); never raises."""
    sampler.clear()
    warning = ""
    try:
        from app.engines.registry import gpu_metrics_sources

        sampler.set_remote_gpus(gpu_metrics_sources(target, setups))
    except Exception as e:  # never stops a run
        warning = f"server GPU metrics unavailable: {e}"
    sampler.sample_soon()
    return warning


class LoadMeter:
    """A run sink that keeps time: from the first recorded lane's start to the run's end (monotonic), and how late
    the window's event loop ran in that stretch (a precise Qt timer's ticks; Qt is imported only then)."""

    def __init__(self, tick_ms: int = LAG_TICK_MS) -> None:
        self.t_lanes: float | None = None
        self.t_end: float | None = None
        self.tick_ms = tick_ms
        self.lags_ms: list[float] = []
        self._timer = None
        self._last_tick = 0.0

    def start_run(self, plan: RunPlan, results: RunResults) -> None:
        self.t_lanes = self.t_end = None
        self.lags_ms = []
        self._stop_ticks()

    def on_event(self, ev: object, t_recv: float) -> None:
        if self.t_lanes is None and isinstance(ev, LaneStarted) and not RunPlan.is_warmup(ev.lane_id):
            self.t_lanes = t_recv
            self._start_ticks()

    def finish(self, results: RunResults) -> None:
        self.t_end = time.monotonic()
        self._stop_ticks()

    def _start_ticks(self) -> None:
        from PySide6.QtCore import Qt, QTimer

        if self._timer is None:
            self._timer = QTimer()
            self._timer.setTimerType(Qt.TimerType.PreciseTimer)
            self._timer.setInterval(self.tick_ms)
            self._timer.timeout.connect(self._tick)
        self._last_tick = time.monotonic()
        self._timer.start()

    def _stop_ticks(self) -> None:
        if self._timer is not None:
            self._timer.stop()

    def _tick(self) -> None:
        now = time.monotonic()
        self.lags_ms.append(max(0.0, (now - self._last_tick) * 1000.0 - self.tick_ms))
        self._last_tick = now

    def set_theme(self, theme) -> None:
        pass

    def evaluate(self, samples, results, priority: str) -> tuple[dict, list[tuple[str, str]]]:
        """The last run's load as the window reports it: :meth:`measure`, the window's priority mode, the recorded
        lanes' CPU wait (`results`: RunResults or None) and the note; with :func:`load_notes`' (headline, note) pairs.
        ({}, []) before any recorded lane started."""
        load = self.measure(samples)
        if not load:
            return {}, []
        share = cpu_wait_share(results.completed()) if results is not None else None
        load["priority"] = priority
        load["lanes_cpu_wait_pct"] = round(100 * share, 1) if share is not None else None
        notes = load_notes(load.get("gui_cpu_pct"), load["cores"], load.get("lag_max_ms"), priority, load["lanes_cpu_wait_pct"])
        return {**load, "note": "; ".join(n for _, n in notes)}, notes

    def measure(self, samples, cores: int | None = None) -> dict:
        """:func:`run_load` over the recorded lanes of the last run ({} before any lane started)."""
        if self.t_lanes is None:
            return {}
        load = run_load(samples, self.t_lanes, self.t_end if self.t_end is not None else time.monotonic(), cores or cpu_cores())
        return {**load, **lag_summary(self.lags_ms)}
