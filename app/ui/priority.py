"""The GUI yields the CPU to the worker it measures.

On a 2-core machine the worker's two compute threads meet at a barrier after every kernel, so each time the GUI
wakes (20 Hz text, 5 Hz plots, telemetry) and takes a core for a moment, the whole forward waits: the GUI's 7–8 %
of one core cost the lanes 10–20 % of their tokens/s. Here the GUI's own threads drop to nice +10 and SCHED_BATCH
(no wake-up preemption of running threads); workers are started from one thread kept at the original priority
(app.worker.client.spawn_from_a_steady_thread), so they are not lowered with it. Measured on SmolLM2, 3 lanes, 96
tokens, 2 cores, under Xvfb: one back-to-back pair of GUI runs gave 0.86–0.90 of headless at normal priority and
0.90–1.04 lowered; resources/bench/gui_vs_headless.py (2 rounds, lowered) then gave 0.87–0.91 offscreen and
0.89–0.91 under Xvfb, with headless itself varying by ±10 % between rounds — not yet the 5 % asked.

`SPECDECK_GUI_PRIORITY=idle` goes further: SCHED_IDLE, so the window runs only on CPU time the worker leaves
unused and never delays its threads; the text and plots may then lag behind the lanes. Measured the same way (4
rounds, Xvfb): 0.93 / 1.00 / 1.01 of headless (baseline / ngram / draft k=4), the window at 2 % of a core, against
0.91–0.94 / 0.92–0.93 / 0.92–0.99 with the default. For GUI figures to quote on a 2-core machine.

Linux only; `SPECDECK_GUI_PRIORITY=normal` keeps the GUI at normal priority.
"""

from __future__ import annotations

import os
import sys

__all__ = ["NICE", "yield_to_worker"]

NICE = 10


def yield_to_worker(keep: set[int] | None = None) -> str:
    """Lower every thread of this process (but `keep`, native thread ids) to nice NICE and SCHED_BATCH (SCHED_IDLE
    with SPECDECK_GUI_PRIORITY=idle); threads made later by a lowered thread inherit it.

    Returns:
        What was done, or why not ("" when it was done).
    """
    mode = os.environ.get("SPECDECK_GUI_PRIORITY", "").lower()
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
    return ""
