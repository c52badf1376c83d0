"""Host readings through psutil: system CPU % and, per watched (role, pid), process CPU % and RSS.

``psutil.Process`` objects are kept between samples, because ``cpu_percent(interval=None)`` measures the
interval since the previous call on the *same* object; the first reading of a new process has no interval
and is reported as NaN rather than psutil's meaningless 0.0. A process that exited (or that we may not
read) gives NaN, never an exception.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import psutil

from app.telemetry.samples import HostSample, ProcSample

__all__ = ["HostReader"]

log = logging.getLogger(__name__)

_MIB = float(1 << 20)  # bytes per MiB
_NAN = float("nan")


class HostReader:
    """Reads system and per-process CPU / memory. Not thread-safe by itself (the sampler holds a lock)."""

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # start the system-wide interval now
        self._procs: dict[int, psutil.Process | None] = {}  # pid → live handle (None: gone or unreadable)
        self._logged: set[tuple[int, str]] = set()

    def prime(self, pids: Mapping[str, int]) -> None:
        """Start the CPU interval of these processes now, so the next :meth:`sample` has a real value."""
        for pid in pids.values():
            self._handle(int(pid))

    def _handle(self, pid: int) -> tuple[psutil.Process | None, bool]:
        """(handle, is_new). A new handle has its CPU interval started here."""
        if pid in self._procs:
            return self._procs[pid], False
        proc: psutil.Process | None
        try:
            proc = psutil.Process(pid)
            proc.cpu_percent(interval=None)
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
        try:
            with proc.oneshot():
                cpu = proc.cpu_percent(interval=None)  # % of one core since the previous call
                rss = proc.memory_info().rss / _MIB
        except psutil.Error as err:  # exited since the last sample, or access denied
            self._log_once(pid, err)
            self._procs[pid] = None
            return ProcSample(pid=pid, role=role, cpu_pct=_NAN, rss_mib=_NAN)
        return ProcSample(pid=pid, role=role, cpu_pct=_NAN if new else float(cpu), rss_mib=float(rss))

    def sample(self, pids: Mapping[str, int]) -> HostSample:
        """Read the system and each (role, pid) now.

        Args:
            pids: role → pid, e.g. ``{"gui": 1234, "worker": 1240}``.

        Returns:
            A :class:`HostSample` with one :class:`ProcSample` per entry, in mapping order. Never raises.
        """
        try:
            cpu = float(psutil.cpu_percent(interval=None))  # % of all cores since the previous call
        except Exception as err:  # pragma: no cover - psutil reads /proc/stat; only a broken /proc fails
            log.warning("system CPU could not be read: %s", err)
            cpu = _NAN
        procs = tuple(self._read(str(role), int(pid)) for role, pid in pids.items())
        # Forget handles of pids no longer watched (a restarted worker gets a new pid).
        wanted = {p.pid for p in procs}
        for pid in [p for p in self._procs if p not in wanted]:
            del self._procs[pid]
        return HostSample(cpu_pct=cpu if math.isfinite(cpu) else _NAN, procs=procs)
