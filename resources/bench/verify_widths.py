"""Does the target's cost profile price the verifies that a recorded run's lanes paid? V(n) per width, three ways.

Reads a run file (`bench --record RUN.specdeck`) that holds a baseline lane and draft lanes on the same prompts, and
the target's cost profile the run carried (its report's `cost_profiles`). For each width n (tokens verified in one
target forward: the drafts + 1) it prints

* **lanes**: the median over the draft lanes' decode steps of n tokens (and of widths within ±12 % of n, in log) of
  the step's verify time over the baseline's decode step on the same prompt (the median of its steps) — what a
  verify of n tokens cost in one-token decode steps, on the prompts and contexts of the run;
* **profile**: V(n) = T(n) / T(1) as the profile prices it (`times_s`: its medians smoothed,
  app.speculative.costs.smooth);
* **medians**: the same from the profile's rounds' medians as measured (`medians_s`), before smoothing;

and the mean of profile ÷ lanes over the widths with at least `--min-steps` steps. A profile whose T(1) sits off the
line of the wider forwards prices every V(n) off by as much (resources/bench/README.md, "T(1) off the line").

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

#: widths pooled with n: those within this distance of n in log (about ±12 %), so that a wide n has a sample
NEAR = 0.12


def main() -> int:
    from app.core.costs import CostProfile
    from app.core.events import StepEvent
    from app.worker.runfile import load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a run file (bench --record) with a baseline and draft lanes")
    ap.add_argument("--min-steps", type=int, default=20, help="widths with fewer lane steps are printed, not averaged")
    ap.add_argument("--json", help="write the table here")
    args = ap.parse_args()

    rec = load(args.run)
    target = rec.report.get("target")
    profiles = [CostProfile.from_json(p) for p in rec.report.get("cost_profiles", []) if p.get("engine") == target]
    if not profiles:
        print(f"{args.run} carries no cost profile of its target {target}", file=sys.stderr)
        return 1
    prof = profiles[0]
    lanes = {lane.lane_id: (lane.setup, lane.prompt_id) for lane in rec.plan.lanes}  # the measured lanes (no warm-ups)
    steps: dict[str, list[StepEvent]] = defaultdict(list)
    for _, ev in rec.events:
        if isinstance(ev, StepEvent) and ev.lane_id in lanes and ev.step > 0:  # step 0 verifies with the prompt
            steps[ev.lane_id].append(ev)
    t1 = {p: statistics.median(s.t_verify_s for s in steps[lid]) for lid, (setup, p) in lanes.items() if setup == "baseline" and steps[lid]}
    if not t1:
        print(f"{args.run} has no baseline lane to measure a decode step by", file=sys.stderr)
        return 1
    by_n: dict[int, list[float]] = defaultdict(list)
    for lid, (setup, p) in lanes.items():
        if setup.startswith("draft:") and p in t1:
            for s in steps[lid]:
                by_n[len(s.drafted_ids or ()) + 1].append(s.t_verify_s / t1[p])
    med = prof.medians_s
    rows = []
    print(f"{args.run}: {target} on {rec.machine.get('cpu') or prof.machine_text}")
    print(f"profile measured {prof.measured_at}, T(1) {prof.t1_s * 1e3:.1f} ms" + (f" (median of its rounds {med[0] * 1e3:.1f} ms)" if med else ""))
    print(f"\n{'n':>3} {'steps':>6} {'lanes':>6} {'profile':>8} {'medians':>8} {'profile/lanes':>14}")
    for i, n in enumerate(prof.ns):
        near = [x for m, xs in by_n.items() if abs(math.log(m) - math.log(n)) < NEAR for x in xs]
        lane_v = statistics.median(near) if near else None
        row = dict(n=n, steps=len(near), lanes=lane_v, profile=prof.times_s[i] / prof.t1_s, medians=med[i] / med[0] if med else None)
        rows.append(row)
        print(f"{n:>3} {len(near):>6} " + (f"{lane_v:>6.3f}" if lane_v else f"{'–':>6}") + f" {row['profile']:>8.3f} "
              + (f"{row['medians']:>8.3f}" if med else f"{'–':>8}") + (f" {row['profile'] / lane_v:>14.3f}" if lane_v else ""))
    sure = [r for r in rows if r["lanes"] and r["steps"] >= args.min_steps and r["n"] > 1]
    if sure:
        mean = sum(r["profile"] / r["lanes"] for r in sure) / len(sure)
        print(f"\nprofile ÷ lanes over the {len(sure)} widths of 2 tokens or more with ≥ {args.min_steps} steps: {mean:.3f}"
              + (f"; medians ÷ lanes {sum(r['medians'] / r['lanes'] for r in sure) / len(sure):.3f}" if med else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(run=args.run, target=target, profile=prof.to_json(), widths=rows), indent=1))
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
