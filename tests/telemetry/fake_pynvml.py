"""A FAKE of the ``pynvml`` module (package nvidia-ml-py), for tests on machines without an NVIDIA GPU.

It follows pynvml's documented API as far as :mod:`app.telemetry.nvml` uses it: the function names and
argument order, NVML units (memory in bytes, power in milliwatts, clocks in MHz, temperature in °C), return
objects with ``.gpu`` / ``.used`` / ``.total`` / ``.pid`` / ``.usedGpuMemory`` (``None`` where the driver
cannot tell), and the ``NVMLError`` hierarchy with its per-code subclasses such as
``NVMLError_LibraryNotFound``. It is NOT the real library; the real path is exercised on a GPU machine when
one is available (``-m gpu`` tests).

Each :class:`FakeNvml` instance is an independent "module": pass it as ``nvml_module``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Base NVML error; ``value`` is the NVML return code, ``str()`` its description (as in pynvml)."""

    value = NVML_ERROR_UNKNOWN

    def __init__(self, value: int | None = None) -> None:
        if value is not None:
            self.value = value
        super().__init__(self.value)

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_Uninitialized(NVMLError):  # noqa: N801 - pynvml's names
    value = NVML_ERROR_UNINITIALIZED


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    value = NVML_ERROR_NOT_SUPPORTED


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    value = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    value = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    value = NVML_ERROR_GPU_IS_LOST


@dataclass
class FakeGpu:
    """One simulated device, in NVML's raw units."""

    name: str | bytes = "NVIDIA Fake H200"
    util_gpu_pct: int = 37
    mem_used_b: int = 3 * 1024**3  # bytes
    mem_total_b: int = 141 * 1024**3  # bytes
    power_mw: int = 123_456  # milliwatts
    sm_clock_mhz: int = 1980
    temp_c: int = 41
    procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory bytes or None)
    failing: dict[str, NVMLError] = field(default_factory=dict)  # pynvml function name → error it raises


class FakeNvml:
    """A fresh fake ``pynvml`` module.

    Args:
        gpus: simulated devices (default: one).
        init_error: raised by ``nvmlInit`` (e.g. ``NVMLError_LibraryNotFound()``).
    """

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVML_CLOCK_GRAPHICS = NVML_CLOCK_GRAPHICS
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: BaseException | None = None) -> None:
        self.gpus = [FakeGpu()] if gpus is None else gpus
        self.init_error = init_error
        self.refcount = 0
        self.calls: Counter[str] = Counter()

    # -- library
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise self.init_error
        self.refcount += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls["nvmlShutdown"] += 1
        self._need_init()
        self.refcount -= 1

    def _need_init(self) -> None:
        if self.refcount <= 0:
            raise NVMLError_Uninitialized()

    def _gpu(self, fn: str, handle: Any) -> FakeGpu:
        self.calls[fn] += 1
        self._need_init()
        gpu = self.gpus[handle.index]
        if fn in gpu.failing:
            raise gpu.failing[fn]
        return gpu

    # -- devices
    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._need_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        self._need_init()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return SimpleNamespace(index=index)  # opaque c_nvmlDevice_t in the real module

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:  # noqa: N802
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:  # noqa: N802
        g = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=g.util_gpu_pct, memory=0)  # percent

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:  # noqa: N802
        g = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=g.mem_total_b, free=g.mem_total_b - g.mem_used_b, used=g.mem_used_b)  # bytes

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:  # noqa: N802, A002 - pynvml's signature
        g = self._gpu("nvmlDeviceGetClockInfo", handle)
        if type != NVML_CLOCK_SM:
            raise NVMLError_NotSupported()
        return g.sm_clock_mhz  # MHz

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:  # noqa: N802
        g = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError_NotSupported()
        return g.temp_c  # °C

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:  # noqa: N802
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF) for pid, used in g.procs
        ]
