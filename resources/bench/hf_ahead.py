"""Where transformers' assisted generation is ahead of a fixed draft setting, prompt by prompt, over recorded runs.

Issue 32 asks k=auto for "at least hf-assisted's speedup on every prompt". This counts how often the fixed setting
k=auto is judged against (default `k=24,cstop=0.5`) meets that goal itself: in each bench report (`--json`) or run
file (`.specdeck`) that ran it beside `hf-assisted` with the same draft at the same precision (app.core.report.draft_of),
the prompts where hf-assisted's wall was the shorter (walls summed over repeats), and per prompt over all such
reports how often, with the geometric mean of hf-assisted's speedup over the setting. A report's prompt where either
lane waited for a CPU `--max-wait` of its wall or more is left out (as kauto_verdict.py does). No model runs.

    python resources/bench/hf_ahead.py resources/bench/*.json resources/bench/*.specdeck [--setting k=24,cstop=0.5] [--json PATH]

A run file and the report written beside it (`bench --json` and `--record` of one run) are one run: counted once.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.errors import SpecDeckError  # noqa: E402
from app.core.report import draft_of  # noqa: E402  (a draft-model setup's draft, precision and target)
from app.core.report_text import CPU_WAIT_WARN_LANE as MAX_WAIT  # noqa: E402  (a lane the bench names as having waited)
from app.core.setups import parse_setup  # noqa: E402


def report_of(path: str) -> dict | None:
    """A bench report's JSON: the file's, or a run file's saved report; None where the file is neither."""
    try:
        if path.endswith(".specdeck"):
            from app.worker.runfile import load

            return load(path).report
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (SpecDeckError, OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def rule_of(setup: str) -> tuple | None:
    """A draft-model lane's drafting rule, whatever its draft, precision and target: (k, schedule, stop, cstop) as
    app.core.setups.parse_setup reads them; None for other lanes and setups that do not parse."""
    try:
        st = parse_setup(setup)
    except SpecDeckError:
        return None
    if getattr(st, "prefix", None) != "draft":
        return None
    return (st.k, st.schedule, st.stop, st.cstop)


def pairs(report: dict, setting: tuple, max_wait: float) -> list[tuple[str, dict[str, float]]]:
    """Per hf-assisted lane with a lane of the drafting rule `setting` (rule_of) and the same draft and precision in
    the report: (the draft, per prompt hf-assisted's wall over the setting's), prompts where either waited for a CPU
    `max_wait` of its wall left out."""
    walls: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    waited: set[tuple[str, str]] = set()
    for r in report.get("runs") or []:
        if not isinstance(r, dict) or not r.get("wall_s") or "setup" not in r or "prompt_id" not in r:
            continue
        walls[r["setup"]][r["prompt_id"]] += r["wall_s"]
        if (r.get("cpu_wait_s") or 0.0) >= max_wait * r["wall_s"]:
            waited.add((r["setup"], r["prompt_id"]))
    out = []
    for hf in (s for s in walls if s.startswith("hf-assisted:")):
        for fixed in walls:
            if rule_of(fixed) != setting or draft_of(fixed) != draft_of(hf):
                continue
            common = [p for p in walls[hf] if p in walls[fixed] and (hf, p) not in waited and (fixed, p) not in waited]
            if common:
                out.append((draft_of(hf) or hf, {p: walls[hf][p] / walls[fixed][p] for p in common}))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="bench --json reports or run files (bench --record, .specdeck)")
    ap.add_argument("--setting", default="k=24,cstop=0.5", help="the fixed draft setting to hold against hf-assisted")
    ap.add_argument("--max-wait", type=float, default=MAX_WAIT,
                    help="leave out a report's prompt where either lane waited for a CPU this share of its wall or more")
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args(argv)
    try:
        parse_setup(f"draft:d,{args.setting}")
    except SpecDeckError as e:
        print(f"--setting {args.setting}: {e}", file=sys.stderr)
        return 2
    setting = rule_of(f"draft:d,{args.setting}")
    assert setting is not None  # a draft setup that parses has a rule
    seen: set[str] = set()  # a run's report and its run file: one run
    runs: list[dict[str, Any]] = []
    for path in args.reports:
        report = report_of(path)
        if report is None:
            continue
        for draft, ratios in pairs(report, setting, args.max_wait):
            key = json.dumps([report.get("created"), draft, sorted(ratios.items())])
            if key in seen:
                continue
            seen.add(key)
            below = sorted((p for p, x in ratios.items() if x < 1.0), key=lambda p: ratios[p])
            runs.append(dict(report=Path(path).name, draft=draft, prompts=len(ratios), below=below, ratios=ratios))
    if not runs:
        print(f"no report ran `{args.setting}` beside hf-assisted with the same draft and precision", file=sys.stderr)
        return 2
    print(f"{args.setting} against hf-assisted (same draft and precision): prompts where hf-assisted was faster\n")
    for r in runs:
        print(f"{r['report'][:64]:<64} {r['draft'].split(':', 1)[1][:40]:<40} {len(r['below']):>2} of {r['prompts']:>2}"
              + ("  " + " ".join(f"{p} {r['ratios'][p]:.2f}" for p in r["below"]) if r["below"] else ""))
    by_prompt: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        for p, x in r["ratios"].items():
            by_prompt[p].append(x)
    prompts = {p: dict(runs=len(xs), hf_ahead=sum(1 for x in xs if x < 1.0), fixed_over_hf=math.exp(sum(map(math.log, xs)) / len(xs)))
               for p, xs in sorted(by_prompt.items())}
    print(f"\nper prompt over the runs: hf-assisted ahead in how many, and {args.setting}'s speedup over hf-assisted (geometric mean)")
    for p, d in prompts.items():
        if d["runs"] > 1:
            print(f"  {p:<10} {d['hf_ahead']:>3} of {d['runs']:>3}  {d['fixed_over_hf']:.3f}")
    counts = [len(r["below"]) for r in runs]
    whole = [r for r in runs if r["prompts"] >= 24]
    print(f"\n{len(runs)} runs; hf-assisted ahead of {args.setting} on {min(counts)}–{max(counts)} prompts of a run"
          + (f"; in the {len(whole)} runs of 24 prompts or more on none in {sum(1 for r in whole if not r['below'])}, "
             f"median {sorted(len(r['below']) for r in whole)[len(whole) // 2]}" if whole else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(setting=args.setting, max_wait=args.max_wait, runs=runs, prompts=prompts), indent=1),
                                   encoding="utf-8")
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
