"""Where a draft lane's steps win and lose time, and how often its drafts are kept, read from bench run files.

Reads run files (`bench --record RUN.specdeck`) and, for every draft-model lane (`draft:…`, k=auto and fixed setups),
prints three tables:

* **Step economics**, per setup: its decode steps (step 0, the prompt's forward, left out) grouped by how many drafts
  the target verified — 0, 1, 2–3, 4–7, 8 or more — with the tokens a step emitted, the step's wall over the same
  prompt's mean baseline decode step in the same run file (`÷ base step`), and their ratio: tokens per baseline
  step's time (`tok/base`; above 1 the group's steps made tokens faster than plain decoding did, below 1 slower; the
  mean, not the median, so that the baseline's own steps make 1.00 however their times scatter).
  Two groups of k=auto's steps are apart: a step that drafted and then verified nothing (`look dropped`: k=auto
  drafted one token to see its confidence and did not keep it), and a step whose drafting took longer than its drafts
  by over READ_FORWARDS draft forwards (`read`: the draft read the prompt or caught up over tokens it had not read —
  an investment in later steps, which a step's own tokens do not repay; a fixed lane's draft reads the prompt before
  step 0). A draft forward's time is the lane's median per-draft time over its drafting steps.
* **k=auto's predictions**: what k=auto expected of each decode step that verified drafts (its `why`: "expect E
  tokens in T ms") against the tokens the step emitted and its wall, per group of drafts verified — whether the cost
  model and the calibrated acceptance it decides on hold step by step (steps that read the prompt left out).
* **Acceptance** of the drafts the target tested (those up to and including the first rejected one), by the draft's
  confidence q in tenths and by where the draft stood: a step's first draft after step 0 (`after opening`: the step
  right after the prompt's forward), after a step that kept every draft (`after all kept`), some (`after some`), none
  (`after none`) or that drafted nothing (`after skip`); and a later draft of a step, after one of confidence
  ≥ SURE (`after sure`) or below (`after unsure`). Lanes of one draft verify the same positions with the same draft
  tokens (greedy), so each (run file, prompt, answer position, token, where it stood) is counted once.

`--category PREFIX` keeps prompts whose id starts with it (e.g. `edit`, `qa`). These are what the k=auto tables of
resources/bench/README.md read from the run files beside them:

    python resources/bench/kauto_steps.py resources/bench/qwen-kauto-top4-specbench24-llamacpp-amx.specdeck \\
        resources/bench/qwen-kauto-top4-specbench24-llamacpp-2-amx.specdeck --json /tmp/kauto-steps.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kauto_verdict import run_file_lanes  # noqa: E402  (a run file's lanes' steps by prompt, setup and repeat)

from app.core.errors import SpecDeckError  # noqa: E402

#: a step whose drafting took more than this many draft forwards beyond its drafts read or caught up
READ_FORWARDS = 2.0
#: a draft of at least this confidence is "sure" (the acceptance table's `after sure`)
SURE = 0.95
GROUPS = ("look dropped", "read", "0", "1", "2-3", "4-7", "8+")
#: k=auto's prediction in a step's `why` (AutoK.explain): expected tokens and the step's predicted milliseconds
PREDICTED = re.compile(r"expect ([0-9.]+) tokens in ([0-9.]+) ms")
WHERE = ("after opening", "after all kept", "after some", "after none", "after skip", "after sure", "after unsure")


def _group(n: int) -> str:
    return "0" if n == 0 else "1" if n == 1 else "2-3" if n <= 3 else "4-7" if n <= 7 else "8+"


def _short(setup: str) -> str:
    """A draft setup's label without its draft model's name: `draft:NAME,k=8,cstop=0.5` → `k=8,cstop=0.5`."""
    return setup.split(",", 1)[1] if "," in setup else setup


def _per_draft_s(steps: list) -> float | None:
    """The lane's median drafting time per draft over its decode steps that drafted, or None."""
    per = [e.t_draft_s / len(e.drafted_ids) for e in steps if e.step > 0 and e.drafted_ids and e.t_draft_s > 0]
    return statistics.median(per) if per else None


def _step_group(e, setup: str, per: float | None) -> str:
    """The step's group (GROUPS): k=auto's readings and dropped looks apart (a fixed lane's draft reads the prompt
    before step 0, never in a decode step), else by the drafts verified. `per`: the lane's seconds a draft."""
    n = len(e.drafted_ids)
    if "k=auto" in setup and per is not None:
        if e.t_draft_s > (n + READ_FORWARDS) * per:
            return "read"
        if n == 0 and e.t_draft_s > 0.5 * per:
            return "look dropped"
    return _group(n)


def predictions(lanes: dict) -> dict[str, dict]:
    """k=auto's own prediction for each decode step that verified drafts (its `why`: "expect E tokens in T ms",
    app.speculative.policy.AutoK.explain) against what the step made, summed per group of drafts verified; steps that
    read the prompt or caught up left out (their prediction prices the step, not the reading)."""
    out: dict[str, dict] = {}
    for (_prompt, setup, _rep), steps in lanes.items():
        if not setup.startswith("draft:") or "k=auto" not in setup:
            continue
        per = _per_draft_s(steps)
        for e in steps:
            m = PREDICTED.search(e.why or "")
            if e.step == 0 or not e.drafted_ids or m is None or (g := _step_group(e, setup, per)) == "read":
                continue
            row = out.setdefault(g, dict(steps=0, predicted_tokens=0.0, tokens=0, predicted_s=0.0, wall_s=0.0))
            row["steps"] += 1
            row["predicted_tokens"] += float(m.group(1))
            row["tokens"] += len(e.emitted_ids)
            row["predicted_s"] += float(m.group(2)) / 1e3
            row["wall_s"] += e.t_wall_s
    return {g: out[g] for g in GROUPS if g in out}


def economics(lanes: dict, base_step: dict[str, float]) -> dict[str, dict[str, dict]]:
    """Per setup and step group: steps, tokens, and the walls summed in units of the prompt's mean baseline decode
    step (`base_step[prompt]`); `lanes` as run_file_lanes gives them, by (prompt, setup, repeat)."""
    out: dict[str, dict[str, dict]] = defaultdict(lambda: {g: dict(steps=0, tokens=0, base_steps=0.0) for g in GROUPS})
    for (prompt, setup, _rep), steps in lanes.items():
        if not setup.startswith("draft:") or prompt not in base_step:
            continue
        per = _per_draft_s(steps)
        for e in steps:
            if e.step == 0:
                continue
            row = out[setup][_step_group(e, setup, per)]
            row["steps"] += 1
            row["tokens"] += len(e.emitted_ids)
            row["base_steps"] += e.t_wall_s / base_step[prompt]
    return {s: {g: r for g, r in rows.items() if r["steps"]} for s, rows in out.items()}


def acceptance(lanes: dict, run: int, seen: set, counts: dict) -> None:
    """Fold the tested drafts of a run file's draft lanes into counts[(where, tenth)] = [kept, tested], each
    (run, prompt, position, token, where) once."""
    for (prompt, setup, _rep), steps in lanes.items():
        if not setup.startswith("draft:"):
            continue
        pos, prev = 0, None  # answer position of the step's first draft; how the previous step ended
        for e in sorted(steps, key=lambda x: x.step):
            qs, n, a = e.draft_probs or (), len(e.drafted_ids), e.accepted_count
            if e.step > 0 and n and len(qs) >= min(n, a + 1):
                for i in range(min(n, a + 1)):
                    where = (prev if i == 0 else "after sure" if qs[i - 1] >= SURE else "after unsure")
                    key = (run, prompt, pos + i, e.drafted_ids[i], where)
                    if key in seen:
                        continue
                    seen.add(key)
                    c = counts[(where, min(9, int(qs[i] * 10)))]
                    c[0] += i < a
                    c[1] += 1
            prev = ("after opening" if e.step == 0 else "after skip" if n == 0 else "after all kept" if a >= n
                    else "after some" if a else "after none")
            pos += len(e.emitted_ids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run files (bench --record)")
    ap.add_argument("--category", default="", help="only prompts whose id starts with this (e.g. edit)")
    ap.add_argument("--json", help="also write the tables here")
    args = ap.parse_args()
    econ: dict[str, dict[str, dict]] = {}
    pred: dict[str, dict] = {}
    counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    seen: set = set()
    cpus = set()
    for j, path in enumerate(args.runs):
        try:
            rec, lanes = run_file_lanes(path)
        except SpecDeckError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        cpus.add(str(rec.machine.get("cpu", "?")))
        lanes = {k: v for k, v in lanes.items() if k[0].startswith(args.category)}
        base_step = {p: statistics.fmean(e.t_wall_s for e in st if e.step > 0) for (p, s, _), st in lanes.items()
                     if s == "baseline" and any(e.step > 0 for e in st)}
        for s, rows in economics(lanes, base_step).items():
            for g, r in rows.items():
                acc = econ.setdefault(s, {}).setdefault(g, dict(steps=0, tokens=0, base_steps=0.0))
                for f in acc:
                    acc[f] += r[f]
        acceptance(lanes, j, seen, counts)
        for g, r in predictions(lanes).items():
            acc = pred.setdefault(g, dict.fromkeys(r, 0))
            for f in r:
                acc[f] += r[f]
    if not econ:
        print("error: no draft lane with a baseline of the same prompt in these run files" +
              (f" (prompts starting with {args.category!r})" if args.category else ""), file=sys.stderr)
        return 2
    print("machine: " + "; ".join(sorted(cpus)))
    print("drafts: " + ", ".join(sorted({s.split(",", 1)[0].removeprefix("draft:") for s in econ})))
    print("\nstep economics (decode steps after step 0; walls in the prompt's mean baseline decode step)")
    print(f"{'setup':36s} {'verified':>12s} {'steps':>6s} {'tok/step':>8s} {'÷ base step':>11s} {'tok/base':>8s}")
    for s in sorted(econ):
        for g in GROUPS:
            if g in econ[s]:
                r = econ[s][g]
                r["tokens_per_step"] = r["tokens"] / r["steps"]
                r["base_steps_per_step"] = r["base_steps"] / r["steps"]
                r["tokens_per_base_step"] = r["tokens"] / r["base_steps"] if r["base_steps"] > 0 else None
                tpb = f"{r['tokens_per_base_step']:.2f}" if r["tokens_per_base_step"] is not None else "-"
                print(f"{_short(s):36s} {g:>12s} {r['steps']:6d} {r['tokens_per_step']:8.2f} {r['base_steps_per_step']:11.2f} {tpb:>8s}")
    if pred:
        print("\nk=auto's prediction per drafting step (its why) against what the step made")
        print(f"{'verified':>12s} {'steps':>6s} {'tokens: predicted':>18s} {'made':>6s} {'÷':>6s} {'ms: predicted':>14s} {'took':>6s} {'÷':>6s}")
        for g, r in pred.items():
            n = r["steps"]
            r["tokens_ratio"] = r["tokens"] / r["predicted_tokens"] if r["predicted_tokens"] > 0 else None
            r["time_ratio"] = r["wall_s"] / r["predicted_s"] if r["predicted_s"] > 0 else None
            tr = f"{r['tokens_ratio']:.3f}" if r["tokens_ratio"] is not None else "-"
            sr = f"{r['time_ratio']:.3f}" if r["time_ratio"] is not None else "-"
            print(f"{g:>12s} {n:6d} {r['predicted_tokens'] / n:18.2f} {r['tokens'] / n:6.2f} {tr:>6s} "
                  f"{r['predicted_s'] / n * 1e3:14.0f} {r['wall_s'] / n * 1e3:6.0f} {sr:>6s}")
    print("\nacceptance of tested drafts by confidence q and where the draft stood (kept/tested)")
    print("q     " + "".join(f"{w:>16s}" for w in WHERE))
    table = []
    for b in range(10):
        cells = []
        for w in WHERE:
            kept, n = counts.get((w, b), (0, 0))
            cells.append(f"{kept}/{n}={kept / n:.2f}" if n else "-")
            if n:
                table.append(dict(where=w, q=b / 10, kept=kept, tested=n))
        if any(c != "-" for c in cells):
            print(f"{b / 10:.1f}  " + "".join(f"{c:>16s}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(runs=args.runs, category=args.category, machine=sorted(cpus),
                                                   economics=econ, predictions=pred, acceptance=table), indent=1))
        print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
