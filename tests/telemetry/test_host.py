"""Host path (real psutil, real NVML import) on a machine without an NVIDIA GPU: CPU numbers, never a crash; CPU %
over a window of readings, so samples taken back to back never read as thousands of percent."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import threading
import time

import pytest

from app.telemetry.host import MIN_INTERVAL_S, WINDOW_S, CpuRate, HostReader
from app.telemetry.nvml import NO_GPU_STATE, NvmlReader
from app.telemetry.sampler import TelemetrySampler


def _real_nvml_available() -> bool:
    r = NvmlReader()
    try:
        return r.available
    finally:
        r.close()


@contextlib.contextmanager
def _burning_cpu():
    """A thread spinning in Python for the duration of the block (real CPU use, no sleep)."""
    stop = threading.Event()

    def burn() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    th = threading.Thread(target=burn, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


@pytest.mark.skipif(_real_nvml_available(), reason="this machine has a working NVIDIA GPU")
def test_without_nvml_the_sampler_reports_the_no_gpu_state_and_real_cpu_numbers() -> None:
    s = TelemetrySampler(pids={"test": os.getpid()})  # real pynvml: nvmlInit raises NVMLError_LibraryNotFound here
    assert s.gpu_available is False and s.gpu_state == NO_GPU_STATE
    s.sample_once()
    t_first = time.monotonic()
    # Burn CPU in a thread until this process has used >= 0.1 s more CPU (a condition, not a sleep).
    start_cpu = time.process_time()
    with _burning_cpu():
        deadline = time.monotonic() + 5.0
        while time.process_time() - start_cpu < 0.1 and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(max(0.0, MIN_INTERVAL_S + 0.05 - (time.monotonic() - t_first)))
    sample = s.sample_once()
    s.close()
    me = sample.host.proc("test")
    assert me is not None and me.pid == os.getpid()
    assert me.cpu_pct > 0 and me.rss_mib > 0
    assert 0 <= sample.host.cpu_pct <= 100
    assert sample.gpus == () and sample.gpu_state == NO_GPU_STATE


def test_an_exited_pid_gives_nan() -> None:
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        s = TelemetrySampler(pids={"gone": gone.pid, "child": child.pid}, nvml_module=None)
        time.sleep(MIN_INTERVAL_S + 0.05)
        first = s.sample_once()
        assert math.isnan(first.host.proc("gone").cpu_pct) and math.isnan(first.host.proc("gone").rss_mib)
        assert first.host.proc("child").rss_mib > 0
        assert first.host.proc("child").cpu_pct >= 0  # primed in the constructor: a real value
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    after = s.sample_once()  # exited between two samples
    assert math.isnan(after.host.proc("child").cpu_pct) and math.isnan(after.host.proc("child").rss_mib)
    s.close()


def test_pids_callable_follows_a_new_pid_whose_first_cpu_reading_is_nan() -> None:
    pids = {"gui": os.getpid()}
    s = TelemetrySampler(pids=lambda: dict(pids))
    assert [p.role for p in s.sample_once().host.procs] == ["gui"]
    pids["worker"] = os.getppid()
    w = s.sample_once().host.proc("worker")
    assert w is not None and math.isnan(w.cpu_pct)  # no interval yet for a process first seen now
    time.sleep(MIN_INTERVAL_S + 0.05)
    w2 = s.sample_once().host.proc("worker")
    assert w2 is not None and w2.cpu_pct >= 0
    s.close()


def test_default_watches_the_current_process() -> None:
    s = TelemetrySampler()
    procs = s.sample_once().host.procs
    s.close()
    assert [(p.role, p.pid) for p in procs] == [("self", os.getpid())]


# --- CPU % over a window: readings 10 ms ticks apart ------------------------------------------------------------


@pytest.mark.parametrize(
    "readings, expected",
    [
        # (t_s, cpu_s) readings of a process on a 2-core machine → the last value
        ([(0.0, 0.0), (0.001, 0.01)], math.nan),  # one tick 1 ms later: psutil's interval=None read 1000 %
        ([(0.0, 0.0), (0.1, 0.05)], 50.0),  # half a core over 100 ms
        ([(0.0, 0.0), (0.5, 0.5), (0.5005, 0.52)], 104.0),  # back to back: still measured over the window
        ([(0.0, 0.0), (0.2, 0.4), (0.4, 0.8)], 200.0),  # two cores busy: 200 % is real
        ([(0.0, 0.0), (0.1, 0.5)], 200.0),  # more than two cores' worth is impossible: clamped
        ([(0.0, 1.0), (0.2, 0.5), (0.4, 0.6)], 50.0),  # a counter that went back (pid reused) starts again
    ],
)
def test_cpu_rate_never_divides_a_tick_by_a_moment(readings, expected):
    r = CpuRate(limit_pct=200.0)
    for t, cpu in readings:
        got = r.add(t, cpu)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, rel=1e-2)


def test_cpu_rate_uses_the_newest_reading_a_window_old():
    r = CpuRate(limit_pct=100.0, window_s=0.5)
    for i in range(20):  # 10 Hz: idle for a second…
        r.add(i * 0.1, 0.0)
    got = [r.add(2.0 + i * 0.1, (i + 1) * 0.1) for i in range(10)]  # …then busy: 100 % a core
    assert got[-1] == pytest.approx(100.0)
    assert all(0.0 <= x <= 100.0 for x in got) and got == sorted(got)  # ramps up, never overshoots


def test_system_cpu_is_a_share_of_every_core():
    r = CpuRate(limit_pct=100.0)
    r.add(0.0, busy_s=10.0, total_s=40.0)
    assert r.add(0.5, busy_s=10.5, total_s=41.0) == pytest.approx(50.0)  # 0.5 busy of 1.0 CPU-second


def test_back_to_back_samples_of_a_busy_process_stay_within_the_machine():
    """The GUI's plot once showed its own CPU at 1300–2000 % on 2 cores: samples taken a moment apart (the sampler
    catching up) divided a 10 ms tick by a fraction of a millisecond. Sampled as fast as possible while a thread
    burns CPU, every reading stays within 100 % per core."""
    import psutil

    reader = HostReader()
    vals = []
    with _burning_cpu():
        reader.prime({"me": os.getpid()})
        # At least a second and 30 samples, whichever comes later (a loaded 2-core CI machine, with the burning
        # thread holding the GIL, managed 48 in one second); at most 10 s.
        start = time.monotonic()
        while time.monotonic() - start < 10.0 and (time.monotonic() - start < 1.0 or len(vals) < 30):
            s = reader.sample({"me": os.getpid()})
            vals.append((s.proc("me").cpu_pct, s.cpu_pct))
    cores = psutil.cpu_count() or 1
    procs = [p for p, _ in vals if not math.isnan(p)]
    system = [c for _, c in vals if not math.isnan(c)]
    assert len(vals) >= 30 and procs and system
    assert max(procs) <= 100.0 * cores and min(procs) >= 0.0
    assert max(system) <= 100.0 and min(system) >= 0.0
    assert procs[-1] > 5.0  # the burning thread shows (measured over WINDOW_S, not over one sample)
    assert WINDOW_S >= 5 * 0.01  # a 10 ms tick is at most a fifth of the window
