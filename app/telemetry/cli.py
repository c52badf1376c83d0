"""``python -m app telemetry``: print what the GUI would plot, one line (or one JSON object) per sample.

Usage::

    python -m app telemetry [--once] [--json] [--rate HZ] [--duration S] [--pid ROLE=PID ...]

Without ``--duration`` it samples until interrupted (Ctrl-C exits 0).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from app.telemetry.sampler import TelemetrySampler
from app.telemetry.samples import GPU_OK, TelemetrySample

__all__ = ["main", "build_parser", "format_sample"]

_ONCE_WAIT_MAX_S = 0.5  # --once measures CPU over min(1/rate, this) seconds


def _pid_arg(text: str) -> tuple[str, int]:
    role, sep, pid = text.partition("=")
    if not sep or not role or not pid.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected ROLE=PID (e.g. worker=1234), got {text!r}")
    return role, int(pid)


def _positive(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return x


def build_parser(prog: str = "python -m app telemetry") -> argparse.ArgumentParser:
    """The argument parser of the ``telemetry`` command."""
    p = argparse.ArgumentParser(prog=prog, description="Print GPU (NVML) and host (CPU/RAM) telemetry samples.")
    p.add_argument("--once", action="store_true", help="print one sample and exit")
    p.add_argument("--json", action="store_true", help="print one JSON object per line (NaN as null)")
    p.add_argument("--rate", type=_positive, default=2.0, metavar="HZ", help="samples per second (default 2)")
    p.add_argument("--duration", type=_positive, default=None, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument(
        "--pid",
        type=_pid_arg,
        action="append",
        default=[],
        metavar="ROLE=PID",
        help="watch this process under this role (repeatable; role 'worker' also selects GPU memory); default: this process",
    )
    return p


def _f(x: float, fmt: str) -> str:
    return "n/a" if math.isnan(x) else format(x, fmt)


def format_sample(s: TelemetrySample) -> str:
    """One readable line: time, system CPU, each process, then each GPU (or the no-GPU state)."""
    parts = [time.strftime("%H:%M:%S", time.localtime(s.t)) + f".{int((s.t % 1) * 1000):03d}", f"cpu {_f(s.host.cpu_pct, '5.1f')}%"]
    for p in s.host.procs:
        parts.append(f"{p.role}[{p.pid}] cpu {_f(p.cpu_pct, '.1f')}% rss {_f(p.rss_mib, '.1f')} MiB")
    if s.gpu_state != GPU_OK:
        parts.append(s.gpu_state)
    for g in s.gpus:
        parts.append(
            f"gpu{g.index} {_f(g.util_pct, '.0f')}% mem {_f(g.mem_used_mib, '.0f')}/{_f(g.mem_total_mib, '.0f')} MiB"
            f" {_f(g.power_w, '.0f')} W {_f(g.sm_clock_mhz, '.0f')} MHz {_f(g.temp_c, '.0f')} °C"
            f" worker {_f(g.worker_mem_mib, '.0f')} MiB"
        )
    return "  |  ".join(parts)


def _emit(s: TelemetrySample, as_json: bool, out: TextIO) -> None:
    out.write((json.dumps(s.to_json(), allow_nan=False) if as_json else format_sample(s)) + "\n")
    out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``telemetry`` command.

    Args:
        argv: arguments after ``telemetry`` (``None``: ``sys.argv[1:]``).

    Returns:
        Process exit status: 0 on success (also on Ctrl-C or a closed pipe), 2 on bad arguments.
    """
    try:
        args = build_parser().parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # argparse exits on --help and errors; return its status instead
        return int(exc.code or 0)
    pids = dict(args.pid) or None
    out = sys.stdout
    q: queue.SimpleQueue[TelemetrySample] = queue.SimpleQueue()
    sampler = TelemetrySampler(rate_hz=args.rate, pids=pids, on_sample=None if args.once else q.put, maxlen=1)
    try:
        if args.once:
            # CPU % needs an interval: the sampler started it in its constructor; measure over one period.
            threading.Event().wait(min(1.0 / args.rate, _ONCE_WAIT_MAX_S))
            _emit(sampler.sample_once(), args.json, out)
            return 0
        end = None if args.duration is None else time.monotonic() + args.duration
        sampler.start()
        while end is None or time.monotonic() < end:
            timeout = 0.5 if end is None else max(0.0, min(0.5, end - time.monotonic()))
            try:
                s = q.get(timeout=timeout)
            except queue.Empty:
                continue
            _emit(s, args.json, out)
        return 0
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - absorbs the flush at interpreter exit
        except OSError:
            pass
        return 0
    finally:
        sampler.close()
