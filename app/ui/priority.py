"""The GUI yields the CPU to the worker it measures.

On a machine with few cores the worker's compute threads meet at a barrier after every kernel, so each time the GUI
wakes (lane text, plots, telemetry) and takes a core for a moment, the whole forward waits: what the window uses of
a core comes out of the lanes' tokens/s (the worker measures the wait: LaneStats.cpu_wait_s). Workers are started
from one thread kept at the original priority (app.worker.client.spawn_from_a_steady_thread), so they are never
lowered with the window. The window's own threads (and threads they start later, which inherit it) then run in one
of these modes, chosen by `SPECDECK_GUI_PRIORITY`:

``batch`` (the default on Linux)
    nice +10 (:data:`NICE`) and SCHED_BATCH (no wake-up preemption of running threads): the window still gets a share of
    a core when the lanes use every core, and draws in frames (app.ui.run_controller) to keep that share small.
``idle``
    SCHED_IDLE: the window runs only on CPU time the worker leaves unused. Lanes that leave none (PyTorch's compute
    threads spin between kernels) starve it: the window may not draw at all until the lanes end (app.ui.load times
    its event loop and says so after the run). The lanes' figures then match headless, but nothing is live: for
    measurements, not demos. A high nice value with SCHED_BATCH does not fix that.
``normal``
    left as started.

Qt's raster engine also hands every large fill (96 or more spans) to a pool of helper threads and waits for them;
each hand-off wakes threads that may push a lane's compute thread off its core. On a machine with few cores
:func:`serial_painting` turns that pool off (Qt's ``QT_NO_GUI_THREADPOOL``): the fills run on the window's own
thread, and no pool thread is ever started.

What each choice measured (event-loop ticks under ``idle``, wake-ups a second with and without the pool, the
window's CPU): resources/bench/README.md, "The GUI's cost on few cores" (``gui_cost.py``, ``gui_vs_headless.py``).

Linux only (elsewhere the window keeps its priority). Lowering is one-way for an unprivileged user: the kernel lets
a thread leave SCHED_IDLE, or lower its nice value, only with CAP_SYS_NICE or RLIMIT_NICE, so the mode is fixed
for the window's lifetime.
"""

from __future__ import annotations

import os
import sys

__all__ = ["NICE", "MODES", "DEFAULT_MODE", "requested_mode", "yield_to_worker", "gui_priority", "serial_painting",
           "NO_POOL_ENV"]

NICE = 10
MODES = ("idle", "batch", "normal")
DEFAULT_MODE = "batch"

_applied = "normal"

#: Qt reads this once, at the first fill big enough for its GUI thread pool: set, the pool is never made
NO_POOL_ENV = "QT_NO_GUI_THREADPOOL"


def serial_painting(cores: int | None = None, environ: dict[str, str] | None = None) -> bool:
    """On a machine with few cores (app.ui.load.few_cores), keep Qt's painting on the window's own threads: sets
    :data:`NO_POOL_ENV` unless the user set it (Qt turns the pool off when it is set at all, even empty). Call
    before the QApplication exists.

    Returns:
        whether Qt's GUI thread pool is off (set here or by the user).
    """
    from app.ui.load import few_cores

    env = os.environ if environ is None else environ
    if NO_POOL_ENV in env:
        return True
    if not few_cores(cores):
        return False
    env[NO_POOL_ENV] = "1"
    return True


def requested_mode() -> str:
    """The mode `SPECDECK_GUI_PRIORITY` asks for (DEFAULT_MODE when unset or empty).

    Raises:
        ValueError: not one of MODES (the message names them).
    """
    mode = os.environ.get("SPECDECK_GUI_PRIORITY", "").strip().lower() or DEFAULT_MODE
    if mode not in MODES:
        raise ValueError(f"SPECDECK_GUI_PRIORITY={os.environ.get('SPECDECK_GUI_PRIORITY')!r} is not a mode: use one of "
                         f"{', '.join(MODES)} (default {DEFAULT_MODE})")
    return mode


def gui_priority() -> str:
    """The mode the window's threads run in ("normal" until :func:`yield_to_worker` lowered them)."""
    return _applied


def yield_to_worker(keep: set[int] | None = None) -> str:
    """Lower every thread of this process but `keep` (native thread ids) to the requested mode; threads made later
    by a lowered thread inherit it.

    Returns:
        "" when done, else why not (a bad `SPECDECK_GUI_PRIORITY`, not Linux, the kernel refused; "normal" asked).
    """
    global _applied
    try:
        mode = requested_mode()
    except ValueError as e:
        return f"kept at normal priority: {e}"
    if mode == "normal":
        return "kept at normal priority (SPECDECK_GUI_PRIORITY=normal)"
    if not sys.platform.startswith("linux"):
        return f"not lowered ({sys.platform})"
    keep = keep or set()
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError as e:
        return f"not lowered ({e})"
    for tid in tids:
        if tid in keep:
            continue
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(NICE, os.getpriority(os.PRIO_PROCESS, tid)))
            os.sched_setscheduler(tid, os.SCHED_IDLE if mode == "idle" else os.SCHED_BATCH, os.sched_param(0))
        except (OSError, AttributeError) as e:
            return f"not lowered ({e})"
    _applied = mode
    return ""
