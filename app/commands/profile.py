"""`python -m app profile ENGINE`: measure (or show the cached) verify-cost curve V(n) of an engine and its drafts'
cost on this machine (app.core.costs); `bench` carries the same profiles in its report. With `--draft`, it also shows
what k=auto has saved of each target–draft pair on this machine (app.speculative.policy.saved_summary), and
`--forget-kauto` deletes it, so that the pair's next k=auto lane starts from its priors."""

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
    pr.add_argument("--forget-kauto", action="store_true",
                    help="delete what k=auto saved of each target–draft pair here (its next lane starts from its priors)")
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
    if args.forget_kauto and not drafts:
        raise SpecDeckError("--forget-kauto forgets what k=auto learnt of target–draft pairs: name the drafts",
                            fix=f"add --draft ENGINE[:DTYPE], e.g. python -m app profile {args.engine} --draft qwen2.5-coder-0.5b-instruct:int8 --forget-kauto")
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
    target = profiles[0]
    memory = _kauto_memory(target, profiles[1:], args.forget_kauto)
    doc = {"profiles": rows, "seconds": time.perf_counter() - t0, "kauto_memory": memory}
    if args.json == "-":
        print(json.dumps(doc, indent=1))
        return 0
    print(render_profiles(rows))
    for p, m in zip(profiles[1:], memory, strict=True):
        print(f"draft {p.engine} ({p.precision}): c = T_draft(1) / T_target(1) = {p.t1_s / target.t1_s:.3f}")
        print("  " + _memory_line(m))
    print(f"({doc['seconds']:.1f} s; cached under {profiles_dir()}; --force measures again)")
    if args.json:
        where = write_json(doc, args.json)
        if where != args.json:
            print(f"error: could not write {args.json}; the profiles were saved to {where}")
            return 2
    return 0


def _kauto_memory(target, drafts, forget: bool) -> list[dict]:
    """Per draft: what k=auto saved of the (target, draft) pair (the key its lanes use: app.lanes.draft), deleted
    first when `forget`."""
    from app.speculative.policy import forget_saved, saved_dir, saved_summary

    out = []
    for p in drafts:
        key = (target.key, p.key)
        removed = forget_saved(key) if forget else None
        out.append(dict(draft=p.engine, precision=p.precision, off=saved_dir() is None,
                        forgot=str(removed) if removed else None, saved=saved_summary(key)))
    return out


def _memory_line(m: dict) -> str:
    """One line on what k=auto has saved of a pair (see :func:`_kauto_memory`)."""
    if m["off"]:
        return "k=auto memory: off (SPECDECK_KAUTO_MEMORY=off); its lanes start from their priors"
    if m["forgot"]:
        return f"k=auto memory: forgotten ({m['forgot']} deleted); the next lane starts from its priors"
    from app.speculative.policy import saving_words, sure_words

    s = m["saved"]
    if s is None:
        return "k=auto memory: nothing saved for this pair yet (a k=auto lane saves what it learnt when it ends)"
    kept = ", ".join(f"{b} {v:.0%}" for b, v in s["kept"].items())
    return (f"k=auto memory: learnt over {s['answers']} answer(s), saved {s['saved']} ({s['path']}); drafts kept by "
            f"confidence: {kept}; {sure_words(s)}; {saving_words(s)} (the draft reads a prompt only where that repays reading it, judged "
            f"on the prompt's category where it has one); its verifies of several tokens cost {s['verify']:.2f}x what the target's profile "
            f"says; --forget-kauto deletes it")
