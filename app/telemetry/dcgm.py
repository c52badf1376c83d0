"""GPU readings of a remote server from its DCGM exporter (NVIDIA's Prometheus exporter, `:9400/metrics` by
default), as :class:`GpuSample` snapshots beside the local NVML ones: the GUI plots a served lane's GPUs.

Fields read (DCGM field names; units as the exporter's documentation gives them): ``DCGM_FI_DEV_GPU_UTIL`` (%),
``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE`` (MiB; total = used + free + ``DCGM_FI_DEV_FB_RESERVED`` when
exported), ``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_SM_CLOCK`` (MHz), ``DCGM_FI_DEV_GPU_TEMP`` (°C). One
GpuSample per ``gpu`` label (per ``Hostname`` too, for an aggregating Prometheus endpoint), named
``"<modelName> @ <Hostname>"`` and tagged with the engine's name as its ``source``.

Stdlib HTTP (urllib), a short timeout, at most one fetch a second: the sampler thread never waits long, and a
server that stops answering reads as no GPUs plus a state sentence, never an exception.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from app.telemetry.prometheus import MetricsError, parse_metrics
from app.telemetry.samples import GpuSample

__all__ = ["DcgmReader", "DCGM_UTIL", "gpus_from_dcgm"]

DCGM_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_FIELDS = {
    "util_pct": DCGM_UTIL,
    "used": "DCGM_FI_DEV_FB_USED",
    "free": "DCGM_FI_DEV_FB_FREE",
    "reserved": "DCGM_FI_DEV_FB_RESERVED",
    "power_w": "DCGM_FI_DEV_POWER_USAGE",
    "sm_clock_mhz": "DCGM_FI_DEV_SM_CLOCK",
    "temp_c": "DCGM_FI_DEV_GPU_TEMP",
}
_NAN = float("nan")


def gpus_from_dcgm(text: str, source: str) -> tuple[GpuSample, ...]:
    """The GPUs in a DCGM exporter's page.

    Raises:
        MetricsError: not Prometheus text, or no ``DCGM_FI_DEV_GPU_UTIL`` in it (not a DCGM exporter).
    """
    samples = parse_metrics(text)
    by_gpu: dict[tuple[str, str], dict[str, float]] = {}
    names: dict[tuple[str, str], str] = {}
    wanted = {v: k for k, v in _FIELDS.items()}
    for name, labels, value in samples:
        field = wanted.get(name)
        if field is None:
            continue
        key = (labels.get("Hostname", ""), labels.get("gpu", labels.get("device", "0")))
        by_gpu.setdefault(key, {})[field] = value
        if key not in names:
            model, host = labels.get("modelName", "GPU"), labels.get("Hostname")
            names[key] = f"{model} @ {host}" if host else model
    if not any("util_pct" in f for f in by_gpu.values()):
        raise MetricsError(f"no {DCGM_UTIL} samples: not a DCGM exporter's page")
    out: list[GpuSample] = []
    for key in sorted(by_gpu, key=lambda k: (k[0], int(k[1]) if k[1].isdigit() else 0, k[1])):
        f = by_gpu[key]
        used, free = f.get("used", _NAN), f.get("free", _NAN)
        out.append(GpuSample(index=int(key[1]) if key[1].isdigit() else len(out), name=names[key], util_pct=f.get("util_pct", _NAN),
                             mem_used_mib=used, mem_total_mib=used + free + f.get("reserved", 0.0), power_w=f.get("power_w", _NAN),
                             sm_clock_mhz=f.get("sm_clock_mhz", _NAN), temp_c=f.get("temp_c", _NAN), worker_mem_mib=_NAN,
                             source=source))
    return tuple(out)


#: the most of one metrics page read (a dcgm-exporter page is tens of KiB)
MAX_PAGE_BYTES = 8 << 20


class DcgmReader:
    """Reads one DCGM exporter for the sampler thread.

    Args:
        source: whose GPUs these are (the engine's name), kept in each GpuSample.
        url: the exporter's metrics URL.
        timeout_s: per fetch; min_interval_s: a fetch at most this often (the last reading is reused between);
            after a failure the next try waits 5 s.

    Attributes:
        state: "ok", or why there is no reading (unreachable, not DCGM), for the plot's title and tooltips.
    """

    def __init__(self, source: str, url: str, timeout_s: float = 1.0, min_interval_s: float = 1.0) -> None:
        self.source = source
        self.url = url
        self.timeout_s = timeout_s
        self.min_interval_s = min_interval_s
        self.state = "not read yet"
        self._last: tuple[GpuSample, ...] = ()
        self._t_last = -1e9

    def fetch(self) -> tuple[GpuSample, ...]:
        """One reading now. Raises MetricsError / OSError (urllib errors) for the caller that wants the reason."""
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as r:
            body = r.read(MAX_PAGE_BYTES + 1)
        if len(body) > MAX_PAGE_BYTES:
            raise MetricsError(f"{self.url} sent more than {MAX_PAGE_BYTES >> 20} MiB: not a DCGM exporter's metrics page")
        return gpus_from_dcgm(body.decode("utf-8", "replace"), self.source)

    def sample(self) -> tuple[GpuSample, ...]:
        """The latest reading (fetched when older than min_interval_s); empty with `state` set when it fails."""
        now = time.monotonic()
        if now - self._t_last < (self.min_interval_s if self.state in ("ok", "not read yet") else 5.0):
            return self._last
        self._t_last = now
        try:
            self._last = self.fetch()
            self.state = "ok"
        except (OSError, urllib.error.URLError, MetricsError, ValueError) as e:
            self._last = ()
            self.state = f"{self.source}: GPU metrics at {self.url} unavailable ({e})"
        return self._last
