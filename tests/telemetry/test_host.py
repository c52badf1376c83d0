"""Host path (real psutil, real NVML import) on a machine without an NVIDIA GPU: CPU numbers, never a crash."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time

import pytest

from app.telemetry.nvml import NO_GPU_STATE, NvmlReader
from app.telemetry.sampler import TelemetrySampler


def _real_nvml_available() -> bool:
    r = NvmlReader()
    try:
        return r.available
    finally:
        r.close()


@pytest.mark.skipif(_real_nvml_available(), reason="this machine has a working NVIDIA GPU")
def test_without_nvml_the_sampler_reports_the_no_gpu_state_and_real_cpu_numbers() -> None:
    s = TelemetrySampler(pids={"test": os.getpid()})  # real pynvml: nvmlInit raises NVMLError_LibraryNotFound here
    assert s.gpu_available is False and s.gpu_state == NO_GPU_STATE
    s.sample_once()
    # Burn CPU in a thread until this process has used >= 0.1 s more CPU (a condition, not a sleep).
    stop = threading.Event()
    start_cpu = time.process_time()

    def burn() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    th = threading.Thread(target=burn, daemon=True)
    th.start()
    deadline = time.monotonic() + 5.0
    while time.process_time() - start_cpu < 0.1 and time.monotonic() < deadline:
        stop.wait(0.01)
    stop.set()
    th.join()
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
    w2 = s.sample_once().host.proc("worker")
    assert w2 is not None and w2.cpu_pct >= 0
    s.close()


def test_default_watches_the_current_process() -> None:
    s = TelemetrySampler()
    procs = s.sample_once().host.procs
    s.close()
    assert [(p.role, p.pid) for p in procs] == [("self", os.getpid())]
