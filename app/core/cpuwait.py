"""How long this process's threads waited for a CPU: the run-queue delay the kernel keeps per thread.

A lane's tokens/s is wall-clock throughput, so anything else that takes the lane's cores — the GUI painting, a
browser, another benchmark — lowers it, and on a 2-core machine the worker's compute threads meet at a barrier after
every kernel, so one preempted thread stalls them all. The kernel counts, for every thread, the time it was
runnable but waiting on a run queue (the second field of ``/proc/<pid>/task/<tid>/schedstat``, nanoseconds). The
scheduler (app.worker.scheduler) reads it around each step and puts the lane's share into its LaneStats
(``cpu_wait_s``): a lane that waited for a core for a noticeable part of its time was slowed by something else on
the machine, and displays say so. Linux only (None elsewhere).
"""

from __future__ import annotations

import os

__all__ = ["CpuWait"]

_TASKS = "/proc/self/task"


class CpuWait:
    """Sums the run-queue delay of this process's threads (seconds, since this object was made).

    Files stay open between reads (one ``pread`` per thread, a few microseconds each); threads that appear are
    opened, threads that end keep their last figure.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._gone_ns = 0
        self._base: float | None = None
        self.available = os.path.isdir(_TASKS) and os.path.exists(f"{_TASKS}/{os.getpid()}/schedstat")
        if self.available:
            self._base = self._total()

    def _total(self) -> float:
        try:
            tids = set(os.listdir(_TASKS))
        except OSError:
            tids = set(self._fds)
        for tid in list(self._fds):
            if tid not in tids:
                os.close(self._fds.pop(tid))
                self._gone_ns += self._last.pop(tid, 0)
        for tid in tids - set(self._fds):
            try:
                self._fds[tid] = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                continue
        for tid, fd in self._fds.items():
            try:
                self._last[tid] = int(os.pread(fd, 128, 0).split()[1])
            except (OSError, IndexError, ValueError):
                pass
        return (self._gone_ns + sum(self._last.values())) / 1e9

    def read(self) -> float | None:
        """Seconds waited for a CPU by this process's threads since this object was made (None: not Linux)."""
        if not self.available or self._base is None:
            return None
        return self._total() - self._base

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
