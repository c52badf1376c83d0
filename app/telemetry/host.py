"""Host readings through psutil: system CPU % and, per watched (role, pid), process CPU % and RSS.

CPU percentages are computed here from CPU times, not with psutil's ``cpu_percent(interval=None)``, whose
interval is whatever time passed since the previous call. Linux counts a process's CPU time in clock ticks
(10 ms), so over a very short interval one tick reads as hundreds or thousands of percent: two samples taken
back to back (a sampler catching up after its thread was held up, as a busy GUI thread holding the GIL does)
gave a 2-core machine readings of 1300–2000 %. Here every value is the rate over the last ``window_s``
seconds of readings (at least ``min_interval_s``; NaN before that), each reading timed by the middle of the
system call that made it, and clamped to what the machine can do (100 % per core for a process, 0–100 % for the
system). The first reading of a new process has no interval and is NaN; a process that exited (or that we may
not read) gives NaN, never an exception.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Mapping

import psutil

from app.telemetry.samples import HostSample, ProcSample

__all__ = ["HostReader", "CpuRate", "WINDOW_S", "MIN_INTERVAL_S"]

log = logging.getLogger(__name__)

_MIB = float(1 << 20)  # bytes per MiB
_NAN = float("nan")

#: seconds of readings a CPU % is averaged over (a tick of 10 ms is then 2 % of one core)
WINDOW_S = 0.5
#: shortest interval that gives a CPU % at all (one tick = 10 % of one core); shorter ones read NaN
MIN_INTERVAL_S = 0.1
#: a reading whose system call took longer than this (the thread was held up) is not timed well enough to keep
MAX_READ_S = 0.05


class CpuRate:
    """CPU use (percent) from cumulative CPU-seconds readings, over a sliding window of wall time.

    Args:
        limit_pct: the most the measured thing can use (100 × cores for a process, 100 for the system).
        window_s: the rate is taken over the newest readings spanning at least this long.
        min_interval_s: below this span the rate is NaN (too few ticks to mean anything).
    """

    def __init__(self, limit_pct: float, window_s: float = WINDOW_S, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.limit_pct = limit_pct
        self.window_s = window_s
        self.min_interval_s = min_interval_s
        self._hist: deque[tuple[float, float, float]] = deque()  # (t_mono, busy_s, wall_s of the clock it shares)
        self.last_pct = _NAN

    def add(self, t: float, busy_s: float, total_s: float | None = None) -> float:
        """Add a reading at monotonic time `t` and return the current rate.

        Args:
            t: when the reading was made, monotonic seconds.
            busy_s: cumulative CPU seconds used.
            total_s: for the system, cumulative CPU seconds of all kinds (busy / total is then the share); None for
                a process (busy / wall time).

        Returns:
            Percent: of one core for a process (up to `limit_pct`), of all cores for the system; NaN while the
            readings span less than `min_interval_s`.
        """
        h = self._hist
        if h and (t < h[-1][0] or busy_s < h[-1][1]):  # a clock or counter that went back: start again
            h.clear()
        h.append((t, busy_s, t if total_s is None else total_s))
        while len(h) > 2 and t - h[1][0] >= self.window_s:
            h.popleft()  # keep the newest reading that is at least a window old as the base
        t0, b0, w0 = h[0]
        span = t - t0
        if span < self.min_interval_s:
            self.last_pct = _NAN
            return _NAN
        wall = (t if total_s is None else total_s) - w0
        pct = 100.0 * (busy_s - b0) / wall if wall > 0 else _NAN
        self.last_pct = min(max(pct, 0.0), self.limit_pct) if math.isfinite(pct) else _NAN
        return self.last_pct


def _timed(read):
    """(value, t): `read()` and the middle of the time it took, or (value, None) when it took over MAX_READ_S."""
    t_a = time.monotonic()
    v = read()
    t_b = time.monotonic()
    return v, ((t_a + t_b) / 2 if t_b - t_a <= MAX_READ_S else None)


class HostReader:
    """Reads system and per-process CPU / memory. Not thread-safe by itself (the sampler holds a lock).

    Args:
        window_s: CPU percentages are rates over this much of the latest readings (see :class:`CpuRate`).
    """

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.cores = psutil.cpu_count() or 1
        self._system = CpuRate(100.0, window_s)
        self._procs: dict[int, psutil.Process | None] = {}  # pid → live handle (None: gone or unreadable)
        self._rates: dict[int, CpuRate] = {}
        self._logged: set[tuple[int, str]] = set()
        self._read_system()  # the system's window starts now

    def prime(self, pids: Mapping[str, int]) -> None:
        """Start the CPU interval of these processes now, so a later :meth:`sample` has a real value."""
        for pid in pids.values():
            self._handle(int(pid))

    def _handle(self, pid: int) -> tuple[psutil.Process | None, bool]:
        """(handle, is_new). A new handle has its first CPU reading taken here."""
        if pid in self._procs:
            return self._procs[pid], False
        proc: psutil.Process | None
        try:
            proc = psutil.Process(pid)
            rate = self._rates[pid] = CpuRate(100.0 * self.cores, self.window_s)
            times, t = _timed(proc.cpu_times)
            if t is not None:
                rate.add(t, times.user + times.system)
        except psutil.Error as err:  # NoSuchProcess, AccessDenied, ZombieProcess
            self._log_once(pid, err)
            proc = None
        self._procs[pid] = proc
        return proc, True

    def _log_once(self, pid: int, err: BaseException) -> None:
        key = (pid, type(err).__name__)
        if key not in self._logged:
            self._logged.add(key)
            log.info("process %d cannot be read (%s); plotting it as not available", pid, type(err).__name__)

    def _read(self, role: str, pid: int) -> ProcSample:
        proc, new = self._handle(pid)
        if proc is None:
            return ProcSample(pid=pid, role=role, cpu_pct=_NAN, rss_mib=_NAN)
        rate = self._rates[pid]
        try:
            with proc.oneshot():
                times, t = _timed(proc.cpu_times)
                rss = proc.memory_info().rss / _MIB
        except psutil.Error as err:  # exited since the last sample, or access denied
            self._log_once(pid, err)
            self._procs[pid] = None
            return ProcSample(pid=pid, role=role, cpu_pct=_NAN, rss_mib=_NAN)
        if new:
            cpu = _NAN  # no interval yet for a process first seen now
        elif t is None:
            cpu = rate.last_pct  # held up mid-read: not timed well enough to use
        else:
            cpu = rate.add(t, times.user + times.system)  # % of one core over the last window
        return ProcSample(pid=pid, role=role, cpu_pct=cpu, rss_mib=float(rss))

    def _read_system(self) -> float:
        try:
            ct, t = _timed(psutil.cpu_times)
        except Exception as err:  # pragma: no cover - psutil reads /proc/stat; only a broken /proc fails
            log.warning("system CPU could not be read: %s", err)
            return _NAN
        if t is None:
            return self._system.last_pct
        total = float(sum(ct))
        idle = ct.idle + getattr(ct, "iowait", 0.0)
        return self._system.add(t, total - idle, total)

    def sample(self, pids: Mapping[str, int]) -> HostSample:
        """Read the system and each (role, pid) now.

        Args:
            pids: role → pid, e.g. ``{"gui": 1234, "worker": 1240}``.

        Returns:
            A :class:`HostSample` with one :class:`ProcSample` per entry, in mapping order. Never raises.
        """
        cpu = self._read_system()  # % of all cores over the last window
        procs = tuple(self._read(str(role), int(pid)) for role, pid in pids.items())
        # Forget handles of pids no longer watched (a restarted worker gets a new pid).
        wanted = {p.pid for p in procs}
        for pid in [p for p in self._procs if p not in wanted]:
            del self._procs[pid]
            self._rates.pop(pid, None)
        return HostSample(cpu_pct=cpu if math.isfinite(cpu) else _NAN, procs=procs)
