"""The worker measures how long its threads waited for a CPU (app.core.cpuwait) and puts it into each lane's
LaneStats (app.worker.scheduler.with_cpu_wait), so a lane slowed by another process says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from app.core.events import LaneDone, LaneStarted, RunError
from app.core.metrics import LaneStats, cpu_wait_share

linux = pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="run-queue delay via /proc schedstat: Linux only")

CONTENDED = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from app.core.cpuwait import CpuWait

    cpu = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {cpu})
    w = CpuWait()

    def spin(seconds):
        t = time.monotonic()
        while time.monotonic() - t < seconds:
            pass

    def ran(pid):  # seconds the process has been on a CPU
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    time.sleep(0.2)
    before, hog_before, t0 = w.read(), ran(hog.pid), time.monotonic()
    # until the hog has had 0.2 s on the core (a fixed 1 s gave it 0.04 s while the rest of the suite loaded the
    # machine); at most 20 s
    while ran(hog.pid) - hog_before < 0.2 and time.monotonic() - t0 < 20.0:
        spin(0.1)
    waited, hog_ran, wall = w.read() - before, ran(hog.pid) - hog_before, time.monotonic() - t0
    hog.kill()
    print(json.dumps({"waited": waited, "hog_ran": hog_ran, "wall": wall}))
""")


@linux
def test_a_process_sharing_its_core_waits_for_it():
    """Pinned to one core with a busy process pinned beside it, this always-runnable process waits for the core
    whenever the other one runs there: its measured wait is at least the other's time on the CPU (a busier machine
    only adds to the wait, so this holds under any load), and at most the time that passed."""
    out = subprocess.run([sys.executable, "-c", CONTENDED], capture_output=True, text=True, timeout=60, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["hog_ran"] > 0.05, r  # the busy process did share the core
    assert 0.9 * r["hog_ran"] <= r["waited"] <= r["wall"] + 0.01, r


@linux
def test_threads_that_end_keep_their_wait():
    import threading

    from app.core.cpuwait import CpuWait

    w = CpuWait()
    t = threading.Thread(target=lambda: sum(range(200_000)))
    t.start()
    t.join()
    a = w.read()
    b = w.read()
    assert a is not None and b is not None and b >= a >= 0.0
    w.close()


def _stats(wall: float, wait: float | None) -> LaneStats:
    return LaneStats(setup="baseline", prompt_id="p", repeat=0, new_tokens=10, wall_s=wall, ttft_s=0.1, prefill_s=0.1, steps=10,
                     drafted=0, accepted=0, draft_forwards=0, t_draft_s=0.0, t_verify_s=wall, output_ids=(1,), output_text="x",
                     cpu_wait_s=wait)


class ScriptedWaits:
    """A CpuWait whose readings are given (the real one cannot be made to wait a chosen amount)."""

    available = True

    def __init__(self, readings):
        self.readings = iter(readings)

    def read(self):
        return next(self.readings)


def test_a_lanes_wait_counts_its_steps_not_the_engine_loading_before_it():
    from app.worker.scheduler import with_cpu_wait

    events = [LaneStarted("L1", "baseline", "p", 0, (1,), "x"), "step-1", "step-2", LaneDone("L1", _stats(2.0, None))]
    # reads around each next(): loading (0 -> 5) is before LaneStarted and not counted; the steps wait 0.1 and 0.2,
    # the last next() (the LaneDone) 0.05
    waits = ScriptedWaits([0.0, 5.0, 5.0, 5.1, 5.1, 5.3, 5.3, 5.35, 5.35])
    out = list(with_cpu_wait(iter(events), waits))
    assert out[:3] == events[:3]
    assert out[3].stats.cpu_wait_s == pytest.approx(0.35)
    assert out[3].lane_id == "L1" and out[3].stats.wall_s == 2.0


def test_errors_pass_through_unchanged():
    from app.worker.scheduler import with_cpu_wait

    err = RunError("L1", "boom", kind="internal")
    assert list(with_cpu_wait(iter([err]), ScriptedWaits([0.0, 1.0, 1.0]))) == [err]


def test_cpu_wait_share_over_lanes():
    assert cpu_wait_share([_stats(2.0, 0.1), _stats(3.0, 0.4)]) == pytest.approx(0.1)
    assert cpu_wait_share([_stats(2.0, 0.1), _stats(3.0, None)]) is None  # one lane not measured: no figure
    assert cpu_wait_share([]) is None


def test_bench_warns_of_setups_whose_lanes_waited_for_a_cpu():
    from dataclasses import replace

    from app.core.report_text import cpu_wait_warnings

    quiet = [_stats(2.0, 0.02)]
    busy = [replace(_stats(2.0, 0.3), setup="ngram")]
    said = cpu_wait_warnings(quiet + busy)
    assert len(said) == 1 and said[0].startswith("ngram: the worker's threads waited for a CPU 15% of its lanes' time")
    # one lane of many that waited: diluted in the setup's share (2 %), named on its own
    many = [replace(_stats(5.0, 0.05), prompt_id=f"p{i}") for i in range(20)] + [replace(_stats(7.9, 2.16), prompt_id="sum-1")]
    said = cpu_wait_warnings(many)
    assert len(said) == 1 and said[0].startswith("baseline: on sum-1 27% of the lane's time the worker's threads waited for a CPU")
    assert cpu_wait_warnings(many[:20]) == []  # quiet lanes: nothing to say


@linux
def test_bench_report_carries_each_lanes_cpu_wait(tiny_pair, tmp_path):
    """A real bench run: every lane's stats and every setup's summary carry the measured wait."""
    target, _ = tiny_pair
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "app", "bench", "--target", str(target), "--setup", "ngram:n=2,k=4", "--prompt", "Tell a story.",
                        "--max-new-tokens", "8", "--quiet", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert all(isinstance(x["cpu_wait_s"], float) and x["cpu_wait_s"] >= 0.0 for x in doc["runs"])
    assert all(s["cpu_wait_share"] is not None for s in doc["summary"])
