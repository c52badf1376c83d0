"""GPU (NVML) and host (psutil) telemetry as timestamped, frozen samples. No Qt.

Imports only the standard library, psutil, pynvml (lazily, tolerating its absence), prometheus_client (the
exposition-text parser, for servers' and DCGM exporters' ``/metrics``) and ``app.core``.
"""

from __future__ import annotations

from app.telemetry.nvml import NO_GPU_STATE, NvmlReader
from app.telemetry.sampler import TelemetrySampler
from app.telemetry.samples import GPU_OK, GpuSample, HostSample, ProcSample, TelemetrySample

__all__ = [
    "GPU_OK",
    "NO_GPU_STATE",
    "GpuSample",
    "HostSample",
    "NvmlReader",
    "ProcSample",
    "TelemetrySample",
    "TelemetrySampler",
]
