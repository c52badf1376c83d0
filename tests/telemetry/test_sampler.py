"""TelemetrySampler: background thread at a rate, prompt stop, bounded ring, callbacks, picklable snapshots.
GPU values come from ``fake_pynvml`` (a FAKE of pynvml; the real path is checked on a GPU machine)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pickle
import threading
import time

import pytest

from app.telemetry.sampler import TelemetrySampler
from app.telemetry.samples import GPU_OK, TelemetrySample

from . import fake_pynvml as fake
from .fake_pynvml import FakeGpu, FakeNvml


def test_start_stop_at_50_hz() -> None:
    got: list[TelemetrySample] = []
    enough = threading.Event()

    def on_sample(s: TelemetrySample) -> None:
        got.append(s)
        if len(got) >= 8:
            enough.set()

    s = TelemetrySampler(rate_hz=50, on_sample=on_sample, nvml_module=FakeNvml())
    s.start()
    s.start()  # no second thread
    assert s.running
    assert enough.wait(5.0), f"only {len(got)} samples in 5 s"
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < 1.0
    assert not s.running
    kept = s.samples()
    assert len(kept) >= 8 and kept == got[: len(kept)]
    monos = [x.t_mono for x in kept]
    assert all(b > a for a, b in zip(monos, monos[1:], strict=False))
    assert all(b >= a for a, b in zip([x.t for x in kept], [x.t for x in kept[1:]], strict=False))
    # Roughly 50 Hz: the median gap is near 20 ms (loose: the machine is shared).
    gaps = sorted(b - a for a, b in zip(monos, monos[1:], strict=False))
    assert 0.005 < gaps[len(gaps) // 2] < 0.2
    assert s.latest() is kept[-1]
    n = len(s.samples())
    assert len(s.samples()) == n  # nothing arrives after stop
    s.close()


def test_ring_is_bounded_and_keeps_the_newest() -> None:
    s = TelemetrySampler(maxlen=5, nvml_module=FakeNvml())
    assert s.latest() is None and s.samples() == []
    taken = [s.sample_once() for _ in range(23)]
    kept = s.samples()
    assert len(kept) == 5 and kept == taken[-5:] and s.latest() is taken[-1]
    assert len(s.to_json()) == 5
    s.clear()
    assert s.samples() == []
    s.close()


def test_samples_pickle_and_json_round_trip_with_nan() -> None:
    nv = FakeNvml([FakeGpu(failing={"nvmlDeviceGetTemperature": fake.NVMLError_NotSupported()})])
    s = TelemetrySampler(pids={"gui": os.getpid(), "worker": 2**22 + 7}, nvml_module=nv)
    sample = s.sample_once()
    s.close()
    assert math.isnan(sample.gpus[0].temp_c)
    back = pickle.loads(pickle.dumps(sample))
    assert type(back) is TelemetrySample and back.to_json() == sample.to_json()
    assert back.gpus[0] == dataclasses.replace(sample.gpus[0], temp_c=back.gpus[0].temp_c)
    text = json.dumps(s.to_json(), allow_nan=False)  # NaN → null, strict JSON
    d = json.loads(text)[0]
    assert d["gpu_state"] == GPU_OK and d["gpus"][0]["temp_c"] is None and d["gpus"][0]["power_w"] == pytest.approx(123.456)
    assert TelemetrySample.from_json(d).to_json() == sample.to_json()


def test_samples_are_frozen() -> None:
    s = TelemetrySampler(nvml_module=FakeNvml())
    sample = s.sample_once()
    s.close()
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.t = 0.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.gpus[0].util_pct = 1.0  # type: ignore[misc]
    assert not hasattr(sample, "__dict__")  # slotted


def test_a_failing_callback_is_logged_once_and_sampling_continues(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    def bad(_: TelemetrySample) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("plot is gone")

    caplog.set_level(logging.ERROR, logger="app.telemetry")
    s = TelemetrySampler(on_sample=bad, nvml_module=FakeNvml())
    for _ in range(4):
        s.sample_once()
    s.close()
    assert calls == 4 and len(s.samples()) == 4
    assert len(caplog.records) == 1


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="rate_hz"):
        TelemetrySampler(rate_hz=0)
    with pytest.raises(ValueError, match="maxlen"):
        TelemetrySampler(maxlen=0)


def test_context_manager_starts_and_closes() -> None:
    nv = FakeNvml()
    got = threading.Event()
    with TelemetrySampler(rate_hz=50, on_sample=lambda _: got.set(), nvml_module=nv) as s:
        assert got.wait(5.0)
    assert not s.running and nv.calls["nvmlShutdown"] == 1


def test_sample_soon_takes_the_next_sample_at_once() -> None:
    """A run clears the ring and asks for a sample now: at 0.05 Hz the next tick is 20 s away, yet a sample arrives at
    once, on the sampling thread (the caller does not wait for it); the period then runs from that sample."""
    s = TelemetrySampler(rate_hz=0.05, nvml_module=FakeNvml())
    s.start()
    try:
        deadline = time.monotonic() + 15.0
        while not s.samples() and time.monotonic() < deadline:  # the first sample, taken as the thread starts
            time.sleep(0.01)
        s.clear()
        t0 = time.monotonic()
        s.sample_soon()
        while not s.samples() and time.monotonic() < deadline:
            time.sleep(0.01)
        got = s.samples()
        assert len(got) == 1 and got[0].t_mono >= t0
        assert got[0].t_mono - t0 < 15.0  # not the 20 s tick
    finally:
        s.close()
    assert not s.running
