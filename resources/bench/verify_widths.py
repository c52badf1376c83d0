"""Does the target's cost profile price the verifies that a recorded run's lanes paid? V(n) per width, three ways.

Reads a run file (`bench --record RUN.specdeck`) that holds a baseline lane and draft lanes on the same prompts, and
the target's cost profile the run carried (its report's `cost_profiles`). For each width n (tokens verified in one
target forward: the drafts + 1) it prints

* **lanes**: over the draft lanes' decode steps whose width is nearest n (in log; each step in one row), the median of
  the step's verify time over the baseline's decode step on the same prompt (the median of its steps, every repeat's)
  — what a verify of about n tokens cost in one-token decode steps, on the prompts and contexts of the run;
* **profile**: the median over the same steps of V(m) = T(m) / T(1) at each step's own width m, as the profile prices
  it (`times_s`: its medians smoothed, app.speculative.costs.smooth); **medians**: the same from the profile's
  rounds' medians as measured (`medians_s`), before smoothing;
* **profile/lanes**: the median over those steps of V(m) over what the step paid;

and the mean of profile/lanes (and medians/lanes) over the rows from 2 tokens on with at least `--min-steps` steps.
Draft lanes of this run's target only (no `@other` target); a prompt where a lane waited for a CPU `--max-wait` of its
wall or more is left out, every lane of it, and named (as kauto_verdict.py does).

    python resources/bench/verify_widths.py resources/bench/qwen-kauto-top4-specbench24-quiet-amx.specdeck

The figures of a run live in resources/bench/README.md with the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from app.core.report_text import CPU_WAIT_WARN_LANE as MAX_WAIT  # noqa: E402  (a lane the bench names as having waited)


def _nearest(ns: tuple[int, ...], m: int) -> int:
    """The profile width nearest m in log (m beyond the widest: the widest)."""
    return min(ns, key=lambda n: abs(math.log(n) - math.log(m)))


def main() -> int:
    from dataclasses import replace

    from kauto_verdict import run_file_lanes

    from app.core.costs import CostProfile
    from app.core.errors import SetupError, SpecDeckError
    from app.core.setups import parse_setup

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a run file (bench --record) with a baseline and draft lanes")
    ap.add_argument("--min-steps", type=int, default=20, help="rows with fewer lane steps are printed, not averaged")
    ap.add_argument("--max-wait", type=float, default=MAX_WAIT,
                    help="leave out a prompt where a lane waited for a CPU this share of its wall or more")
    ap.add_argument("--json", help="write the table and its means here")
    args = ap.parse_args()

    try:
        rec, recorded = run_file_lanes(args.run)
    except SpecDeckError as e:  # the run file's own message names the file and the fix
        print(f"error: {e}", file=sys.stderr)  # SpecDeckError's str: the message, then "  fix: …"
        return 2
    target = rec.plan.target
    profiles = [CostProfile.from_json(p) for p in rec.report.get("cost_profiles", []) if p.get("engine") == target]
    if not profiles:
        print(f"{args.run} carries no cost profile of its target {target}", file=sys.stderr)
        return 1
    prof = profiles[0]
    med = prof.medians_s if len(prof.medians_s) == len(prof.ns) else ()
    as_measured = replace(prof, times_s=tuple(med)) if med else None
    waited = sorted({r["prompt_id"] for r in rec.report.get("runs", [])
                     if r.get("wall_s") and r.get("cpu_wait_s", 0.0) / r["wall_s"] >= args.max_wait})

    def kind(setup: str) -> str | None:
        if setup == "baseline":
            return "baseline"
        try:
            parsed = parse_setup(setup)
        except SetupError:
            return None
        return "draft" if parsed.prefix == "draft" and parsed.target is None else None

    # (kind, prompt) → every repeat's decode steps (step 0 verifies with the prompt)
    steps: dict[tuple[str, str], list] = defaultdict(list)
    for (p, setup, _), st in recorded.items():
        if p not in waited and (k := kind(setup)) is not None:
            steps[(k, p)].extend(s for s in st if s.step > 0)
    base = {p: [s.t_verify_s for s in st] for (k, p), st in steps.items() if k == "baseline"}
    t1 = {p: statistics.median(ts) for p, ts in base.items() if ts and statistics.median(ts) > 0}
    if not t1:
        print(f"{args.run} has no baseline lane to measure a decode step by", file=sys.stderr)
        return 1
    rows_of: dict[int, list[tuple[float, float, float | None]]] = defaultdict(list)  # n: (lane V, profile V(m), medians V(m))
    for (k, p), st in steps.items():
        if k == "draft" and p in t1:
            for s in st:
                m = s.k + 1
                rows_of[_nearest(prof.ns, m)].append((s.t_verify_s / t1[p], prof.v(m), as_measured.v(m) if as_measured else None))
    print(f"{args.run}: {target} on {rec.machine.get('cpu') or prof.machine_text}"
          + (f"; left out, a lane waited for a CPU: {', '.join(waited)}" if waited else ""))
    print(f"profile ({prof.backend} {prof.precision}) measured {prof.measured_at}, T(1) {prof.t1_s * 1e3:.1f} ms"
          + (f" (median of its rounds {med[0] * 1e3:.1f} ms)" if med else ""))
    print(f"\n{'n':>3} {'steps':>6} {'lanes':>6} {'profile':>8} {'medians':>8} {'profile/lanes':>14}")
    rows = []
    for n in prof.ns:
        got = rows_of.get(n, [])
        row: dict = dict(n=n, steps=len(got), lanes=None, profile=prof.v(n), medians=as_measured.v(n) if as_measured else None,
                         profile_over_lanes=None, medians_over_lanes=None)
        if got:
            row.update(lanes=statistics.median(x for x, _, _ in got), profile=statistics.median(v for _, v, _ in got),
                       profile_over_lanes=statistics.median(v / x for x, v, _ in got))
            if as_measured:
                row.update(medians=statistics.median(w for _, _, w in got if w is not None),
                           medians_over_lanes=statistics.median(w / x for x, _, w in got if w is not None))
        rows.append(row)
        print(f"{n:>3} {len(got):>6} " + (f"{row['lanes']:>6.3f}" if got else f"{'–':>6}") + f" {row['profile']:>8.3f} "
              + (f"{row['medians']:>8.3f}" if row["medians"] is not None else f"{'–':>8}")
              + (f" {row['profile_over_lanes']:>14.3f}" if got else ""))
    sure = [r for r in rows if r["steps"] >= args.min_steps and r["n"] > 1]
    summary = dict(min_steps=args.min_steps, widths=[r["n"] for r in sure], left_out=waited, baseline_step_s=t1,
                   profile_over_lanes=sum(r["profile_over_lanes"] for r in sure) / len(sure) if sure else None,
                   medians_over_lanes=sum(r["medians_over_lanes"] for r in sure) / len(sure) if sure and as_measured else None)
    if sure:
        print(f"\nprofile/lanes over the {len(sure)} rows from 2 tokens on with ≥ {args.min_steps} steps "
              f"({', '.join(str(n) for n in summary['widths'])}): {summary['profile_over_lanes']:.3f}"
              + (f"; medians/lanes {summary['medians_over_lanes']:.3f}" if summary["medians_over_lanes"] is not None else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(run=args.run, target=target, machine=rec.machine, profile=prof.to_json(),
                                                   widths=rows, summary=summary), indent=1))
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
