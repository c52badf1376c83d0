"""`python -m app profile ENGINE`: measure (or show the cached) verify-cost curve V(n) of an engine and its drafts'
cost on this machine (app.core.costs); `bench` carries the same profiles in its report."""

from __future__ import annotations

import json
import time

from app.commands.worker_run import Stuck, WorkerRun
from app.core.errors import SpecDeckError
from app.core.report import check_writable, write_json
from app.core.report_text import render_profiles

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    pr = sub.add_parser("profile", help="measure the verify-cost curve V(n) of an engine (and its drafts' cost) on this machine")
    pr.add_argument("engine", help="the target engine")
    pr.add_argument("--draft", action="append", metavar="ENGINE[:DTYPE]", help="a draft engine (repeatable), e.g. qwen2.5-coder-0.5b-instruct:int8")
    pr.add_argument("--device", default=None, help="cpu | cuda (default: the manifest's)")
    pr.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default: the manifest's")
    pr.add_argument("--force", action="store_true", help="measure again even if cached")
    pr.add_argument("--json", metavar="PATH", help="write the profiles as JSON to PATH, or - for stdout")
    pr.set_defaults(func=run)


def run(args) -> int:
    """Measure (or show the cached) cost profiles of an engine and its drafts on this machine."""
    from app.core.costs import profiles_dir
    from app.core.setups import DRAFT_DTYPES
    from app.worker.messages import LoadEngines

    drafts = []
    for d in args.draft or []:
        name, _, dt = d.partition(":")
        if dt and dt not in DRAFT_DTYPES:
            raise SpecDeckError(f"--draft {d}: unknown precision {dt!r}", fix=f"use NAME or NAME:D with D one of {', '.join(DRAFT_DTYPES)}")
        drafts.append((name, dt or None))
    if args.json and args.json != "-":
        check_writable(args.json)
    w = WorkerRun(quiet=args.json == "-")
    t0 = time.perf_counter()
    stuck = False
    try:
        cmd = LoadEngines("profile", args.engine, tuple(drafts), args.device, args.dtype, profile=True, force_profile=args.force)
        _, profiles = w.load(cmd)
    except Stuck:
        stuck = True
        raise
    finally:
        w.close(kill=stuck)
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
    print(f"({doc['seconds']:.1f} s; cached under {profiles_dir()}; --force measures again)")
    if args.json:
        where = write_json(doc, args.json)
        if where != args.json:
            print(f"error: could not write {args.json}; the profiles were saved to {where}")
            return 2
    return 0
