"""Measure the worker path itself: start-up time, event latency (ping → pong round trip, and one-way
worker → client delivery), and cancel latency on a running lane. `python -m app worker-stats`."""

from __future__ import annotations

import statistics
import time

from app.core.events import LaneDone, StepEvent
from app.core.setups import Sampling
from app.worker.client import WorkerClient
from app.worker.messages import Cancel, LaneSpec, Ping, Pong, RunFinished, RunLanes

__all__ = ["measure"]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def measure(target: str = "smollm2-135m-instruct", pings: int = 500, cancels: int = 5) -> dict:
    """Returns figures in milliseconds (start-up in seconds)."""
    t0 = time.perf_counter()
    c = WorkerClient()
    ready = c.start()
    startup_client_s = time.perf_counter() - t0
    try:
        rtt, one_way = [], []
        for i in range(pings):
            t = time.perf_counter()
            c.send(Ping(str(i)))
            while True:
                ev = c.get(timeout=10)
                if isinstance(ev, Pong):
                    break
            now = time.perf_counter()
            rtt.append(now - t)
            one_way.append(time.time() - ev.t_sent)
        # cancel latency: a long lane, cancel after a few steps, time until the lane's LaneDone
        cancel_ms = []
        for j in range(cancels):
            run = f"c{j}"
            c.send(RunLanes(run, target, (LaneSpec("l", "ngram", "p", "Count from 1 to 1000: 1, 2, 3,"),), Sampling(max_new_tokens=4000)))
            steps = 0
            while steps < 4:
                ev = c.get(timeout=300)
                steps += isinstance(ev, StepEvent)
            t = time.perf_counter()
            c.send(Cancel(run))
            while True:
                ev = c.get(timeout=60)
                if isinstance(ev, LaneDone):
                    cancel_ms.append(1000 * (time.perf_counter() - t))
                if isinstance(ev, RunFinished):
                    break
        return {
            "worker_startup_s": round(ready.startup_s, 3),
            "client_start_s": round(startup_client_s, 3),
            "rtt_ms_median": round(1000 * statistics.median(rtt), 3),
            "rtt_ms_p99": round(1000 * _pct(rtt, 0.99), 3),
            "worker_to_client_ms_median": round(1000 * statistics.median(one_way), 3),
            "worker_to_client_ms_p99": round(1000 * _pct(one_way, 0.99), 3),
            "cancel_ms_median": round(statistics.median(cancel_ms), 1),
            "cancel_ms_max": round(max(cancel_ms), 1),
        }
    finally:
        c.stop()
