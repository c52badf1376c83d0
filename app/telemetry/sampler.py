"""Background telemetry sampler: GPU (NVML) and host (psutil) snapshots at a fixed rate, in a bounded ring.

Only frozen :class:`TelemetrySample` objects leave this module. ``on_sample`` is called on the sampler's own
thread: a GUI must hand the sample to its event loop (e.g. emit a Qt signal) rather than touch widgets there.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from app.telemetry.dcgm import DcgmReader
from app.telemetry.host import HostReader
from app.telemetry.nvml import NvmlReader
from app.telemetry.samples import HostSample, TelemetrySample

__all__ = ["TelemetrySampler", "DEFAULT_ROLE"]

log = logging.getLogger(__name__)

#: Role of the current process when no pids are given.
DEFAULT_ROLE = "self"


class TelemetrySampler:
    """Samples GPUs and host at ``rate_hz`` on a daemon thread and keeps the last ``maxlen`` samples.

    NVML is started in the constructor, so :attr:`gpu_available` and :attr:`gpu_state` are known at once.
    Usable as a context manager (``with TelemetrySampler() as s:`` starts, then closes).

    Args:
        rate_hz: samples per second of the background thread (> 0).
        pids: role → pid of processes to watch, or a callable returning that mapping (called each sample);
            ``None`` watches the current process as role ``"self"``. Roles starting with ``"worker"`` also
            select whose GPU memory goes into ``GpuSample.worker_mem_mib``.
        on_sample: called with each new sample, on the sampling thread (also from :meth:`sample_once`).
            Exceptions it raises are logged once and otherwise ignored.
        nvml_module: pynvml-compatible module (tests pass a fake); ``None`` imports ``pynvml``.
        maxlen: ring capacity in samples (36000 = 1 h at 10 Hz).

    Raises:
        ValueError: rate_hz or maxlen not positive.
    """

    def __init__(
        self,
        rate_hz: float = 10.0,
        pids: dict[str, int] | Callable[[], dict[str, int]] | None = None,
        on_sample: Callable[[TelemetrySample], None] | None = None,
        nvml_module: Any = None,
        maxlen: int = 36000,
    ) -> None:
        if not rate_hz > 0:
            raise ValueError(f"rate_hz must be > 0, got {rate_hz!r}")
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen!r}")
        self.rate_hz = float(rate_hz)
        self._pids_arg = pids
        self._last_pids: dict[str, int] = {DEFAULT_ROLE: os.getpid()} if pids is None else {}
        self._on_sample = on_sample
        self._ring: deque[TelemetrySample] = deque(maxlen=maxlen)
        self._ring_lock = threading.Lock()  # guards _ring
        self._read_lock = threading.Lock()  # one reading at a time (psutil intervals, NVML handles)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop() and sample_soon(): the thread stops waiting for its next tick
        self._thread: threading.Thread | None = None
        self._callback_failed = False
        self._pids_failed = False
        self._nvml = NvmlReader(nvml_module)
        self._remote: tuple[DcgmReader, ...] = ()
        self._host = HostReader()
        self._host.prime(self._current_pids())

    # ------------------------------------------------------------------ state
    @property
    def gpu_available(self) -> bool:
        """``True`` when NVML works and found a GPU."""
        return self._nvml.available

    @property
    def gpu_state(self) -> str:
        """``"ok"`` or the sentence to show instead of GPU plots (e.g. ``"No NVIDIA GPU — showing CPU"``)."""
        return self._nvml.state

    @property
    def running(self) -> bool:
        """``True`` while the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def set_remote_gpus(self, sources: Mapping[str, str]) -> None:
        """Also read these servers' GPUs: engine name → its DCGM exporter's metrics URL (empty: none)."""
        keep = {r.source: r for r in self._remote}
        readers = tuple(keep[n] if n in keep and keep[n].url == u else DcgmReader(n, u) for n, u in sources.items())
        with self._read_lock:
            self._remote = readers

    @property
    def remote_states(self) -> dict[str, str]:
        """Per remote engine: "ok" or why its GPUs are not read."""
        return {r.source: r.state for r in self._remote}

    # ---------------------------------------------------------------- reading
    def _current_pids(self) -> dict[str, int]:
        arg = self._pids_arg
        if arg is None:
            return self._last_pids
        if callable(arg):
            try:
                self._last_pids = {str(k): int(v) for k, v in arg().items()}
            except Exception:
                if not self._pids_failed:
                    self._pids_failed = True
                    log.exception("pids callable failed; keeping the last known pids")
            return self._last_pids
        return {str(k): int(v) for k, v in arg.items()}

    def sample_once(self) -> TelemetrySample:
        """Take one sample now (any thread), append it to the ring, call ``on_sample``, and return it.

        Never raises for a missing GPU, a failing query or an exited process (those read as NaN).
        """
        with self._read_lock:
            pids = self._current_pids()
            worker_pids = [pid for role, pid in pids.items() if role.startswith("worker")]
            t, t_mono = time.time(), time.monotonic()
            gpus = self._nvml.sample(worker_pids) + tuple(g for r in self._remote for g in r.sample())
            host: HostSample = self._host.sample(pids)
            sample = TelemetrySample(t=t, t_mono=t_mono, gpus=gpus, host=host, gpu_state=self._nvml.state)
            with self._ring_lock:
                self._ring.append(sample)
        if self._on_sample is not None:
            try:
                self._on_sample(sample)
            except Exception:
                if not self._callback_failed:
                    self._callback_failed = True
                    log.exception("telemetry on_sample callback failed (logged once)")
        return sample

    def latest(self) -> TelemetrySample | None:
        """The newest sample, or ``None`` before the first."""
        with self._ring_lock:
            return self._ring[-1] if self._ring else None

    def samples(self) -> list[TelemetrySample]:
        """A copy of the ring, oldest first (at most ``maxlen``)."""
        with self._ring_lock:
            return list(self._ring)

    def clear(self) -> None:
        """Drop every kept sample (e.g. at the start of a new run)."""
        with self._ring_lock:
            self._ring.clear()

    def sample_soon(self) -> None:
        """Have the running thread take its next sample now instead of at its next tick; returns at once (the reading
        happens on the sampling thread: a slow NVML or DCGM query never blocks the caller). A run calls it after
        :meth:`clear`, so that even a run shorter than one period (0.5 s at 2 Hz) has a sample from its start."""
        self._wake.set()

    def to_json(self) -> list[dict[str, Any]]:
        """The ring as JSON-ready dicts (NaN → ``None``), for saving with a run export."""
        return [s.to_json() for s in self.samples()]

    # ------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start sampling at ``rate_hz`` on a daemon thread. No-op when already running."""
        if self.running:
            return
        self._stop.clear()
        self._wake.clear()
        thread = threading.Thread(target=self._run, name="specdeck-telemetry", daemon=True)
        thread.start()
        self._thread = thread  # only once started: stop() joins it (a stop signal may land in between)

    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        next_t = time.monotonic()
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.sample_once()
            except Exception:  # pragma: no cover - sample_once guards its readers; keep the thread alive anyway
                log.exception("telemetry sample failed")
            next_t += period
            now = time.monotonic()
            if next_t < now:  # fell behind (slow query, busy machine): skip missed ticks rather than burst
                next_t = now
            if self._wake.wait(next_t - now):  # stop(), or sample_soon(): sample now, then keep the period from here
                next_t = time.monotonic()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the background thread and wait for it (at most ``timeout_s`` seconds, usually one query)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("telemetry thread did not stop within %.1f s", timeout_s)
        self._thread = None

    def close(self) -> None:
        """Stop and release NVML. The sampler keeps its samples but reads no GPU afterwards."""
        self.stop()
        with self._read_lock:
            self._nvml.close()

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
