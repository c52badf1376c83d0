"""`python -m app profile`: measure (or show the cached) verify-cost curves of an engine and its drafts, and the
table of cost profiles that `bench` prints under its results (app.core.costs)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from app.bench_text import format_table
from app.cli import _load_engines, _Stuck, _write_json
from app.commands.progress import ProgressBars
from app.core.errors import SpecDeckError

__all__ = ["PROFILE_COLUMNS", "render_profiles", "cmd_profile"]


PROFILE_COLUMNS = (2, 3, 5, 9, 17, 25, 33)


def render_profiles(profiles: Sequence[dict]) -> str:
    """The verify-cost curves of a report's engines: T(1) and V(n) = T(n)/T(1) at a few n (k = n − 1 drafts)."""
    from app.core.costs import CostProfile

    if not profiles:
        return ""
    ps = [CostProfile.from_json(p) for p in profiles]
    rows = [[f"{p.engine} ({p.backend} {p.precision})", f"{p.t1_s * 1e3:.1f}", *(f"{p.v(n):.2f}" for n in PROFILE_COLUMNS)] for p in ps]
    head = (f"verify cost on {ps[0].machine_text or 'this machine'}: T(1) = one-token forward, V(n) = forward over n tokens ÷ T(1) "
            "(a step verifying k drafts costs V(k+1) decode steps)")
    return head + "\n" + format_table(["engine", "T(1) ms", *(f"V({n})" for n in PROFILE_COLUMNS)], rows)


def cmd_profile(args) -> int:
    """Measure (or show the cached) cost profiles of an engine and its drafts on this machine."""
    from app.core.setups import DRAFT_DTYPES
    from app.worker.group import WorkerGroup
    from app.worker.messages import LoadEngines

    drafts = []
    for d in args.draft or []:
        name, _, dt = d.partition(":")
        if dt and dt not in DRAFT_DTYPES:
            raise SpecDeckError(f"--draft {d}: unknown precision {dt!r}", fix=f"use NAME or NAME:D with D one of {', '.join(DRAFT_DTYPES)}")
        drafts.append((name, dt or None))
    bar = ProgressBars(args.json == "-")
    quiet = args.json == "-"

    def say(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr)

    def progress(ev) -> None:
        from app.core.events import Progress

        if isinstance(ev, Progress):
            bar(ev.task, ev.done, ev.total, ev.unit)

    client = WorkerGroup()
    t0 = time.perf_counter()
    try:
        cmd = LoadEngines("profile", args.engine, tuple(drafts), args.device, args.dtype, profile=True, force_profile=args.force)
        _, profiles = _load_engines(client, cmd, progress, say, float(os.environ.get("SPECDECK_WORKER_SILENCE_S", "30")))
    except _Stuck as e:
        client.kill()
        raise SpecDeckError(str(e), fix="rerun on a quiet machine") from None
    finally:
        bar.close()
        client.stop()
    if not profiles:
        raise SpecDeckError(f"{args.engine} cannot be profiled: it has no step-by-step forward (TensorRT-LLM engines decode inside the library)",
                            fix="profile an hf or llamacpp engine")
    rows = [p.to_json() for p in profiles]
    doc = {"profiles": rows, "seconds": time.perf_counter() - t0}
    if args.json == "-":
        print(json.dumps(doc, indent=1))
        return 0
    print(render_profiles(rows))
    target = profiles[0]
    for p in profiles[1:]:
        print(f"draft {p.engine} ({p.precision}): c = T_draft(1) / T_target(1) = {p.t1_s / target.t1_s:.3f}")
    print(f"({doc['seconds']:.1f} s; cached under {_profiles_home()}; --force measures again)")
    if args.json:
        _write_json(doc, args.json)
    return 0


def _profiles_home() -> str:
    from app.core.costs import profiles_dir

    return str(profiles_dir())
