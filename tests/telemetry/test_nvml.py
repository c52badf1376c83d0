"""NVML path of app.telemetry against ``fake_pynvml``: a FAKE of the pynvml module that follows its documented
API (function names, NVML units, NVMLError classes). The real library is exercised by the ``gpu``-marked test at
the end, which runs on a GPU machine when one is available and skips elsewhere."""

from __future__ import annotations

import logging
import math
import os

import pytest

from app.telemetry.nvml import CLOSED_STATE, NO_GPU_STATE, NvmlReader
from app.telemetry.sampler import TelemetrySampler
from app.telemetry.samples import GPU_OK

from . import fake_pynvml as fake
from .fake_pynvml import FakeGpu, FakeNvml

MIB = 1 << 20
WORKER = 424242


def test_values_are_converted_to_plot_units() -> None:
    nv = FakeNvml([FakeGpu(), FakeGpu(name=b"NVIDIA Old Bytes Name", power_mw=70_500, mem_used_b=0)])
    r = NvmlReader(nv)
    assert r.available and r.state == GPU_OK and r.device_count == 2
    g0, g1 = r.sample()
    assert g0.index == 0 and g0.name == "NVIDIA Fake H200"
    assert g0.util_pct == 37.0
    assert g0.mem_used_mib == 3 * 1024.0  # 3 GiB in bytes → MiB
    assert g0.mem_total_mib == 141 * 1024.0
    assert g0.power_w == pytest.approx(123.456)  # mW → W
    assert g0.sm_clock_mhz == 1980.0
    assert g0.temp_c == 41.0
    assert math.isnan(g0.worker_mem_mib)  # no worker pid given
    assert g1.index == 1 and g1.name == "NVIDIA Old Bytes Name"  # older pynvml returns bytes
    assert g1.power_w == pytest.approx(70.5) and g1.mem_used_mib == 0.0


def test_worker_memory_is_summed_over_the_worker_pid_only() -> None:
    gpu0 = FakeGpu(procs=[(WORKER, 512 * MIB), (1, 4096 * MIB), (WORKER, 256 * MIB)])
    gpu1 = FakeGpu(procs=[(1, 100 * MIB)])  # worker holds nothing here
    gpu2 = FakeGpu(procs=[(WORKER, None)])  # driver cannot tell (WDDM)
    r = NvmlReader(FakeNvml([gpu0, gpu1, gpu2]))
    s0, s1, s2 = r.sample([WORKER])
    assert s0.worker_mem_mib == 768.0
    assert s1.worker_mem_mib == 0.0
    assert math.isnan(s2.worker_mem_mib)


def test_sampler_picks_worker_role_pids_for_gpu_memory() -> None:
    nv = FakeNvml([FakeGpu(procs=[(WORKER, 300 * MIB), (os.getpid(), 9 * MIB)])])
    s = TelemetrySampler(pids={"gui": os.getpid(), "worker": WORKER}, nvml_module=nv)
    try:
        sample = s.sample_once()
    finally:
        s.close()
    assert s.gpu_available is False  # closed
    assert sample.gpu_state == GPU_OK
    assert sample.gpus[0].worker_mem_mib == 300.0
    assert sample.host.proc("worker") is not None and math.isnan(sample.host.proc("worker").rss_mib)  # no such pid here


def test_a_failing_query_gives_nan_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    gpu = FakeGpu(failing={"nvmlDeviceGetPowerUsage": fake.NVMLError_NotSupported(), "nvmlDeviceGetMemoryInfo": fake.NVMLError_GpuIsLost()})
    nv = FakeNvml([gpu, FakeGpu()])
    r = NvmlReader(nv)
    caplog.set_level(logging.DEBUG, logger="app.telemetry")
    for _ in range(50):
        g0, g1 = r.sample([WORKER])
        assert math.isnan(g0.power_w) and math.isnan(g0.mem_used_mib) and math.isnan(g0.mem_total_mib)
        assert g0.temp_c == 41.0 and g0.util_pct == 37.0  # the other series keep going
        assert g1.power_w == pytest.approx(123.456)  # the other GPU is unaffected
    assert nv.calls["nvmlDeviceGetPowerUsage"] == 100  # still asked every sample (it may come back)
    msgs = [rec.getMessage() for rec in caplog.records]
    assert len([m for m in msgs if "power" in m]) == 1, msgs
    assert len([m for m in msgs if "memory" in m and "worker" not in m]) == 1, msgs
    assert len(msgs) == 2
    assert "Not Supported" in " ".join(msgs) and "GPU 0" in " ".join(msgs)


def test_library_not_found_is_the_no_gpu_state(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app.telemetry")
    nv = FakeNvml(init_error=fake.NVMLError_LibraryNotFound())
    s = TelemetrySampler(nvml_module=nv)
    for _ in range(5):
        sample = s.sample_once()
    assert s.gpu_available is False and s.gpu_state == NO_GPU_STATE == "No NVIDIA GPU — showing CPU"
    assert sample.gpus == () and sample.gpu_state == NO_GPU_STATE
    assert nv.calls["nvmlInit"] == 1
    assert len([r for r in caplog.records if NO_GPU_STATE in r.getMessage()]) == 1
    s.close()
    assert nv.calls["nvmlShutdown"] == 0  # never initialised → nothing to shut down


def test_driver_error_is_a_state_with_the_nvml_message(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app.telemetry")
    s = TelemetrySampler(nvml_module=FakeNvml(init_error=fake.NVMLError_DriverNotLoaded()))
    s.sample_once()
    assert s.gpu_state == "NVIDIA driver error: Driver Not Loaded — showing CPU"
    assert not s.gpu_available
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_zero_devices_is_the_no_gpu_state() -> None:
    r = NvmlReader(FakeNvml([]))
    assert r.state == NO_GPU_STATE and r.sample() == ()


def test_close_shuts_nvml_down_once() -> None:
    nv = FakeNvml()
    r = NvmlReader(nv)
    r.close()
    r.close()
    assert nv.calls["nvmlShutdown"] == 1 and nv.refcount == 0
    assert r.state == CLOSED_STATE and r.sample() == ()


def _real_nvml_available() -> bool:
    r = NvmlReader()
    try:
        return r.available
    finally:
        r.close()


@pytest.mark.gpu
@pytest.mark.skipif(not _real_nvml_available(), reason="needs an NVIDIA GPU with a working driver")
def test_real_nvml_reads_every_series() -> None:
    s = TelemetrySampler(pids={"worker": os.getpid()})
    try:
        sample = s.sample_once()
    finally:
        s.close()
    assert sample.gpu_state == GPU_OK and sample.gpus
    for g in sample.gpus:
        assert g.name and 0 <= g.util_pct <= 100
        assert 0 < g.mem_used_mib <= g.mem_total_mib < 1e7  # MiB, not bytes
        assert 1 < g.power_w < 2000  # W, not mW
        assert 100 < g.sm_clock_mhz < 5000 and 0 < g.temp_c < 120
        assert g.worker_mem_mib >= 0 or math.isnan(g.worker_mem_mib)
