"""NVIDIA GPU readings through NVML (``pynvml``, package nvidia-ml-py), as :class:`GpuSample` snapshots.

A missing GPU is a state, not a crash: if ``pynvml`` cannot be imported or ``nvmlInit`` fails, the reader
stays usable, :attr:`NvmlReader.available` is ``False`` and :attr:`NvmlReader.state` holds the sentence to
show ("No NVIDIA GPU — showing CPU" or "NVIDIA driver error: … — showing CPU"); the failure is logged once.
A single failing query (e.g. power on a board that does not report it) gives NaN for that series and is
logged once per (GPU, query), not once per sample.

Units from NVML: memory in bytes (converted to MiB), power in milliwatts (converted to W), clocks in MHz,
temperature in °C, utilisation in percent.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Collection
from types import ModuleType
from typing import Any

from app.telemetry.samples import GPU_OK, GpuSample

__all__ = ["CLOSED_STATE", "NO_GPU_STATE", "NvmlReader", "driver_error_state"]

log = logging.getLogger(__name__)

#: State when there is no NVIDIA GPU (no NVML library, no pynvml, or zero devices).
NO_GPU_STATE = "No NVIDIA GPU — showing CPU"

#: State after :meth:`NvmlReader.close`.
CLOSED_STATE = "GPU telemetry stopped"

_MIB = float(1 << 20)  # bytes per MiB
_NAN = float("nan")


def driver_error_state(err: BaseException) -> str:
    """The state sentence for an NVML start-up failure other than "library not found"."""
    return f"NVIDIA driver error: {err} — showing CPU"


def _load_pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:  # nvidia-ml-py not installed: same as no GPU
        return None
    return pynvml


class NvmlReader:
    """Reads every NVIDIA GPU through NVML. Initialises NVML in the constructor; never raises after that.

    Not thread-safe by itself: one thread at a time should call :meth:`sample` (the sampler holds a lock).

    Args:
        nvml_module: an object with pynvml's API (tests pass a fake); ``None`` imports ``pynvml``.
    """

    def __init__(self, nvml_module: Any | None = None) -> None:
        self._nvml: Any | None = nvml_module if nvml_module is not None else _load_pynvml()
        self._handles: list[Any] = []
        self._names: list[str] = []
        self._initialised = False
        self._logged: set[tuple[int, str]] = set()  # (gpu index, query) already logged
        self._close_lock = threading.Lock()
        self.state: str = NO_GPU_STATE
        if self._nvml is None:
            log.info("pynvml is not installed: %s", NO_GPU_STATE)
            return
        nvml_error: type[BaseException] = getattr(self._nvml, "NVMLError", Exception)
        not_found: type[BaseException] | None = getattr(self._nvml, "NVMLError_LibraryNotFound", None)
        try:
            self._nvml.nvmlInit()
        except Exception as err:  # NVML start-up failure is a state, not a crash
            if not_found is not None and isinstance(err, not_found):
                self.state = NO_GPU_STATE
                log.info("NVML library not found: %s", NO_GPU_STATE)
            else:
                self.state = driver_error_state(err)
                level = logging.WARNING if isinstance(err, nvml_error) else logging.ERROR
                log.log(level, "NVML start-up failed (%s): %s", type(err).__name__, self.state)
            return
        self._initialised = True
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
            for i in range(count):
                handle = self._nvml.nvmlDeviceGetHandleByIndex(i)
                self._handles.append(handle)
                self._names.append(self._name(i, handle))
        except Exception as err:
            self._handles.clear()
            self._names.clear()
            self.state = driver_error_state(err)
            log.warning("NVML could not list devices (%s): %s", type(err).__name__, self.state)
            return
        if not self._handles:
            self.state = NO_GPU_STATE
            log.info("NVML reports no devices: %s", NO_GPU_STATE)
            return
        self.state = GPU_OK

    @property
    def available(self) -> bool:
        """``True`` when NVML started and found at least one GPU."""
        return self.state == GPU_OK

    @property
    def device_count(self) -> int:
        """Number of GPUs read (0 when not available)."""
        return len(self._handles) if self.available else 0

    def _name(self, index: int, handle: Any) -> str:
        try:
            name = self._nvml.nvmlDeviceGetName(handle)  # type: ignore[union-attr]
        except Exception as err:
            self._log_once(index, "name", err)
            return f"GPU {index}"
        # nvidia-ml-py >= 11.515 returns str; older releases return bytes.
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name)

    def _log_once(self, index: int, query: str, err: BaseException) -> None:
        key = (index, query)
        if key in self._logged:
            return
        self._logged.add(key)
        log.warning("GPU %d: NVML query %s failed (%s: %s); plotting it as not available", index, query, type(err).__name__, err)

    def _query(self, index: int, query: str, fn: Callable[[], float]) -> float:
        try:
            value = float(fn())
        except Exception as err:  # one failing query → NaN for that series, logged once
            self._log_once(index, query, err)
            return _NAN
        return value if math.isfinite(value) else _NAN

    def _worker_mem_bytes(self, handle: Any, worker_pids: Collection[int]) -> float:
        procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)  # type: ignore[union-attr]
        total = 0.0
        for p in procs:
            if int(p.pid) in worker_pids:
                used = p.usedGpuMemory  # bytes; None where the driver cannot tell (Windows WDDM)
                if used is None:
                    return _NAN
                total += float(used)
        return total

    def sample(self, worker_pids: Collection[int] = ()) -> tuple[GpuSample, ...]:
        """Read every GPU now.

        Args:
            worker_pids: pids whose device memory is summed into ``worker_mem_mib``; empty → NaN.

        Returns:
            One :class:`GpuSample` per GPU; empty when NVML is not available. Never raises.
        """
        if not self.available:
            return ()
        pids = frozenset(int(p) for p in worker_pids)
        return tuple(self._sample_gpu(i, h, pids) for i, h in enumerate(self._handles))

    def _sample_gpu(self, i: int, h: Any, pids: frozenset[int]) -> GpuSample:
        """One GPU's sample; each failing query is NaN (logged once)."""
        nv = self._nvml
        assert nv is not None
        clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)
        temp_gpu = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        mem_used = mem_total = _NAN
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(h)  # .used / .total in bytes
            mem_used, mem_total = float(mem.used) / _MIB, float(mem.total) / _MIB
        except Exception as err:
            self._log_once(i, "memory", err)
        worker = self._query(i, "worker_memory", lambda: self._worker_mem_bytes(h, pids)) / _MIB if pids else _NAN
        return GpuSample(
            index=i,
            name=self._names[i],
            util_pct=self._query(i, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
            mem_used_mib=mem_used,
            mem_total_mib=mem_total,
            power_w=self._query(i, "power", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),  # mW → W
            sm_clock_mhz=self._query(i, "sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, clock_sm)),
            temp_c=self._query(i, "temperature", lambda: nv.nvmlDeviceGetTemperature(h, temp_gpu)),
            worker_mem_mib=worker,
        )

    def close(self) -> None:
        """Shut NVML down (pairs the ``nvmlInit`` of the constructor). Safe to call twice."""
        with self._close_lock:
            if not self._initialised:
                return
            self._initialised = False
            if self.state == GPU_OK:
                self.state = CLOSED_STATE
            self._handles.clear()
            try:
                self._nvml.nvmlShutdown()  # type: ignore[union-attr]
            except Exception as err:
                log.debug("nvmlShutdown failed: %s", err)
