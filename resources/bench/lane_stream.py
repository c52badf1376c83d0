"""How the lane view holds up under a token stream far faster than any model: responsiveness figures, no model.

10,000 single-token steps (half of them with rejected drafts) are pushed through the real worker bridge from a
background thread (like the worker's draining thread, ~4 events per ms) into a LaneView and a PlotPanel, with the
lane text flushed every 33 ms as the window does, while a 10 ms heartbeat timer measures how long the event loop
was kept from running. Printed: the wall time, the heartbeat gaps (p50/p90/p99/max), the token-to-screen latency
and how the main thread's CPU per flush grows as the text grows (first 20 flushes against the last 20).

    python resources/bench/lane_stream.py --tokens 10000           # QT_QPA_PLATFORM=offscreen is set unless given

These are wall-clock figures: they depend on the machine and on what else it runs (a busy 2-core machine once showed
a 2.8 s gap), so they live here and not in a unit test. tests/ui/test_lane_view.py asserts the load-independent part
(every token shown, bounded memory, the CPU a flush costs does not grow with the text).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def step(i: int, t_s: float):
    """A synthetic step: even steps plain target tokens, odd ones drafting 4 of which 0–2 are accepted."""
    from app.core.events import StepEvent

    drafted = (1, 2, 3, 4) if i % 2 else ()
    accepted = min(len(drafted), i % 3)
    target = None if drafted and accepted >= len(drafted) else 7
    emitted = (*drafted[:accepted], target) if target is not None else drafted[:accepted]
    kind = "baseline" if not drafted else ("bonus" if accepted == len(drafted) else "correction")
    pieces = tuple(f"a{i}.{j} " for j in range(accepted)) + ((f"t{i} ",) if target is not None else ())
    return StepEvent(lane_id="L1", step=i, drafted_ids=drafted, accepted_count=accepted, target_id=target, target_kind=kind,
                     t_draft_s=0.001, t_verify_s=0.002, t_wall_s=0.003, emitted_ids=tuple(emitted), pieces=pieces,
                     rejected_pieces=tuple(f"r{i}.{j} " for j in range(accepted, len(drafted))),
                     draft_probs=tuple(0.5 for _ in drafted) or None, target_probs=None, t_s=t_s)


def stream(n: int) -> dict:
    """Push `n` steps through the bridge as fast as the worker's draining thread could; returns the figures."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.ui.bridge import WorkerBridge
    from app.ui.lane_view import LaneView
    from app.ui.plots import PlotPanel
    from app.ui.theme import LIGHT

    app = QApplication.instance() or QApplication([])
    bridge = WorkerBridge()
    view = LaneView(0, "#0072B2", LIGHT)
    plots = PlotPanel(LIGHT, capacity=2048)
    view.resize(600, 400)
    view.show()
    plots.show()
    plots.reset([("L1", "draft:x,k=4", "#0072B2")], time.monotonic())
    bridge.event.connect(view.add_step)
    bridge.event.connect(plots.add_step)
    flush_cpu: list[float] = []

    def flush() -> None:
        c0 = time.thread_time()
        if view.flush():
            flush_cpu.append(time.thread_time() - c0)

    render = QTimer()
    render.setInterval(33)
    render.timeout.connect(flush)
    gaps: list[float] = []
    last = [time.monotonic()]

    def beat() -> None:
        now = time.monotonic()
        gaps.append(now - last[0])
        last[0] = now

    hb = QTimer()
    hb.setInterval(10)
    hb.timeout.connect(beat)

    def produce() -> None:
        t = 0.0
        for i in range(n):
            t += 0.0005
            bridge._on_event(step(i, t))  # what the draining thread calls for each event
            if i % 40 == 0:
                time.sleep(0.01)

    th = threading.Thread(target=produce)
    render.start()
    hb.start()
    t0 = time.monotonic()
    th.start()
    while view.events_seen < n or view._pending:
        app.processEvents()
        time.sleep(0.001)
    th.join()
    elapsed = time.monotonic() - t0
    hb.stop()
    render.stop()
    qs = sorted(gaps)
    k = min(20, len(flush_cpu) // 2)
    points = plots.buffer_len("L1")
    lat_max, lat_mean = view.latency_max_s, view.latency_mean_s
    import shiboken6

    for w in (view, plots, bridge):  # deleted here: left to interpreter exit, PySide + pyqtgraph can crash tearing down
        shiboken6.delete(w)
    return {"tokens": n, "wall_s": elapsed, "gaps_ms": [1000 * qs[int(q * (len(qs) - 1))] for q in (0.5, 0.9, 0.99, 1.0)],
            "latency_max_ms": 1000 * lat_max, "latency_mean_ms": 1000 * lat_mean,
            "flushes": len(flush_cpu), "flush_cpu_first_ms": 1000 * sorted(flush_cpu[:k])[k // 2],
            "flush_cpu_last_ms": 1000 * sorted(flush_cpu[-k:])[k // 2], "plot_points": points}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=10_000)
    args = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    sys.path.insert(0, str(ROOT))
    from app.core.costs import machine_summary

    f = stream(args.tokens)
    print(f"machine: {machine_summary()}; Qt platform {os.environ['QT_QPA_PLATFORM']}")
    print(f"{f['tokens']:,} steps in {f['wall_s']:.2f} s; heartbeat gaps ms p50/p90/p99/max "
          f"{' / '.join(f'{g:.0f}' for g in f['gaps_ms'])}; token-to-screen latency max {f['latency_max_ms']:.0f} ms, "
          f"mean {f['latency_mean_ms']:.1f} ms")
    print(f"{f['flushes']} flushes; main-thread CPU per flush, median of the first 20 / last 20: "
          f"{f['flush_cpu_first_ms']:.2f} / {f['flush_cpu_last_ms']:.2f} ms; plot points kept {f['plot_points']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
