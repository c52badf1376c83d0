"""Frozen telemetry snapshots: the only telemetry objects that cross threads (and processes).

Every float is in the unit its name ends with (``_pct`` percent 0–100 per device or per core sum, ``_mib``
mebibytes = 2**20 bytes, ``_w`` watts, ``_mhz`` megahertz, ``_c`` degrees Celsius). A value that could not be
read is ``float("nan")`` so plots can break the line there (pyqtgraph ``connect="finite"``); JSON writes it as
``null``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["GpuSample", "HostSample", "ProcSample", "TelemetrySample", "GPU_OK", "nan_to_none", "none_to_nan"]

#: ``TelemetrySample.gpu_state`` when NVML works.
GPU_OK = "ok"

_NAN = float("nan")


def nan_to_none(x: float) -> float | None:
    """``None`` for NaN (JSON has no NaN), the value otherwise."""
    return None if isinstance(x, float) and math.isnan(x) else x


def none_to_nan(x: float | None) -> float:
    """Inverse of :func:`nan_to_none`: ``None`` becomes NaN."""
    return _NAN if x is None else float(x)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant. NaN where the query failed or is not supported.

    Attributes:
        index: NVML device index (0-based).
        name: product name, e.g. ``"NVIDIA H200"``.
        util_pct: percent of the last sample period in which a kernel ran (0–100).
        mem_used_mib: device memory in use by everyone, MiB.
        mem_total_mib: device memory installed, MiB.
        power_w: board power draw, watts.
        sm_clock_mhz: current SM clock, MHz.
        temp_c: GPU core temperature, °C.
        worker_mem_mib: device memory held by the worker process(es), MiB (0.0 when it holds none; NaN when
            no worker pid is known or the driver does not report per-process memory).
        source: "" for this machine's GPUs (NVML); else the remote engine whose server they serve (read from its
            DCGM exporter, app.telemetry.dcgm).
    """

    index: int
    name: str
    util_pct: float
    mem_used_mib: float
    mem_total_mib: float
    power_w: float
    sm_clock_mhz: float
    temp_c: float
    worker_mem_mib: float
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        """Plain dict, NaN → ``None``."""
        return {
            "index": self.index,
            "name": self.name,
            "util_pct": nan_to_none(self.util_pct),
            "mem_used_mib": nan_to_none(self.mem_used_mib),
            "mem_total_mib": nan_to_none(self.mem_total_mib),
            "power_w": nan_to_none(self.power_w),
            "sm_clock_mhz": nan_to_none(self.sm_clock_mhz),
            "temp_c": nan_to_none(self.temp_c),
            "worker_mem_mib": nan_to_none(self.worker_mem_mib),
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuSample:
        """Inverse of :meth:`to_json` (``None`` → NaN)."""
        return cls(
            index=int(d["index"]),
            name=str(d["name"]),
            util_pct=none_to_nan(d.get("util_pct")),
            mem_used_mib=none_to_nan(d.get("mem_used_mib")),
            mem_total_mib=none_to_nan(d.get("mem_total_mib")),
            power_w=none_to_nan(d.get("power_w")),
            sm_clock_mhz=none_to_nan(d.get("sm_clock_mhz")),
            temp_c=none_to_nan(d.get("temp_c")),
            worker_mem_mib=none_to_nan(d.get("worker_mem_mib")),
            source=str(d.get("source") or ""),
        )


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One watched process at one instant.

    Attributes:
        pid: process id.
        role: what the process is to us, e.g. ``"gui"``, ``"worker"``.
        cpu_pct: CPU use since the previous sample, percent of one core (a process busy on two cores reads
            200). NaN on its first sample (no interval yet), after it exited, or when access is denied.
        rss_mib: resident set size, MiB. NaN after the process exited or when access is denied.
    """

    pid: int
    role: str
    cpu_pct: float
    rss_mib: float

    def to_json(self) -> dict[str, Any]:
        """Plain dict, NaN → ``None``."""
        return {"pid": self.pid, "role": self.role, "cpu_pct": nan_to_none(self.cpu_pct), "rss_mib": nan_to_none(self.rss_mib)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProcSample:
        """Inverse of :meth:`to_json`."""
        return cls(pid=int(d["pid"]), role=str(d["role"]), cpu_pct=none_to_nan(d.get("cpu_pct")), rss_mib=none_to_nan(d.get("rss_mib")))


@dataclass(frozen=True, slots=True)
class HostSample:
    """The host at one instant.

    Attributes:
        cpu_pct: system-wide CPU use since the previous sample, percent of all cores (0–100). NaN on the very
            first reading.
        procs: one entry per watched (role, pid), in the order given.
    """

    cpu_pct: float
    procs: tuple[ProcSample, ...]

    def proc(self, role: str) -> ProcSample | None:
        """The first process with this role, or ``None``."""
        return next((p for p in self.procs if p.role == role), None)

    def to_json(self) -> dict[str, Any]:
        """Plain dict, NaN → ``None``."""
        return {"cpu_pct": nan_to_none(self.cpu_pct), "procs": [p.to_json() for p in self.procs]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HostSample:
        """Inverse of :meth:`to_json`."""
        return cls(cpu_pct=none_to_nan(d.get("cpu_pct")), procs=tuple(ProcSample.from_json(p) for p in d.get("procs", ())))


@dataclass(frozen=True, slots=True)
class TelemetrySample:
    """Everything sampled at one instant; safe to hand to another thread or process (frozen, picklable).

    Attributes:
        t: wall-clock time of the sample, seconds since the epoch (``time.time()``), for exports.
        t_mono: ``time.monotonic()`` seconds at the sample, for plot x axes and for lining samples up with
            step events timed on the monotonic clock.
        gpus: one entry per NVIDIA GPU, empty when there is none.
        host: system CPU and the watched processes.
        gpu_state: ``"ok"`` (:data:`GPU_OK`) or the human sentence shown instead of GPU plots, e.g.
            ``"No NVIDIA GPU — showing CPU"``.
    """

    t: float
    t_mono: float
    gpus: tuple[GpuSample, ...]
    host: HostSample
    gpu_state: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-ready dict, NaN → ``None``."""
        return {
            "t": self.t,
            "t_mono": self.t_mono,
            "gpu_state": self.gpu_state,
            "gpus": [g.to_json() for g in self.gpus],
            "host": self.host.to_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TelemetrySample:
        """Inverse of :meth:`to_json` (for reloading a saved run export)."""
        return cls(
            t=float(d["t"]),
            t_mono=float(d["t_mono"]),
            gpus=tuple(GpuSample.from_json(g) for g in d.get("gpus", ())),
            host=HostSample.from_json(d["host"]),
            gpu_state=str(d["gpu_state"]),
        )
