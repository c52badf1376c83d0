"""k=auto's first answer in a new worker: from its priors, and from what earlier runs saved of the pair.

A run of one prompt — `make run`, a demo, the window's first run — is k=auto's first answer in its worker. Each
prompt runs in its own `bench` process twice, one after the other: with `SPECDECK_KAUTO_MEMORY=off` (the priors),
then from a copy of a memory saved by one earlier run over other prompts (`--seed-prompts`, the same setups). Each
run holds a fixed setup beside k=auto, so each process compares k=auto with it on the same machine state.

    python resources/bench/kauto_memory.py --json resources/bench/qwen-kauto-memory.json

Prints, per prompt and pass, k=auto ÷ the fixed setup (walls: > 1, k=auto faster) from its priors and from the saved
memory, the steps and drafts of each, and the mean; with the CPU's flags. A run where a lane waited for a CPU
≥ CPU_WAIT_WARN_LANE of its wall is marked and left out of the means. The figures of a run live in
resources/bench/README.md with the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.core.report_text import CPU_WAIT_WARN_LANE  # noqa: E402  (a lane the bench names as having waited)

D = "qwen2.5-coder-0.5b-instruct"
T = "qwen2.5-coder-1.5b-instruct"


def lane_pair(doc: dict) -> dict:
    """From one single-prompt bench report: k=auto's and the fixed setup's walls, steps and drafts, whether k=auto
    started from a saved memory (its lane notes), and the highest share of a lane's wall spent waiting for a CPU."""
    runs = doc["runs"]
    auto = next(r for r in runs if ",k=auto" in r["setup"])
    fixed = next(r for r in runs if r["setup"].startswith("draft:") and ",k=auto" not in r["setup"])
    base = next(r for r in runs if r["setup"] == "baseline")
    return dict(prompt=auto["prompt_id"], ratio=fixed["wall_s"] / auto["wall_s"], auto_speedup=base["wall_s"] / auto["wall_s"],
                fixed_speedup=base["wall_s"] / fixed["wall_s"], auto_steps=auto["steps"], auto_drafted=auto["drafted"],
                fixed_steps=fixed["steps"], fixed_drafted=fixed["drafted"], identical=auto["output_ids"] == base["output_ids"],
                from_memory=any("k=auto started from" in n for n in auto.get("notes") or ()),
                wait=max((r.get("cpu_wait_s") or 0.0) / r["wall_s"] for r in runs if r["wall_s"] > 0))


def summary(rows: list[dict]) -> dict:
    """Mean k=auto ÷ fixed per mode over the quiet runs, and on how many prompts the saved memory did better."""
    out = {}
    for mode in ("priors", "saved"):
        quiet = [r[mode]["ratio"] for r in rows if r.get(mode) and r[mode]["wait"] < CPU_WAIT_WARN_LANE]
        out[mode] = dict(mean=sum(quiet) / len(quiet) if quiet else None, runs=len(quiet))
    both = [r for r in rows if r.get("priors") and r.get("saved") and max(r["priors"]["wait"], r["saved"]["wait"]) < CPU_WAIT_WARN_LANE]
    out["saved_better"] = [sum(1 for r in both if r["saved"]["ratio"] > r["priors"]["ratio"]), len(both)]
    return out


def render(rows: list[dict], s: dict, fixed: str) -> str:
    lines = [f"k=auto ÷ {fixed} (walls; > 1: k=auto faster), one prompt per process",
             f"{'prompt':<8} {'pass':>4}  {'priors':>7} {'steps/drafts':>12}  {'saved':>7} {'steps/drafts':>12}  {fixed.split(',', 1)[-1][:20]:>20}"]
    for r in rows:
        cells = []
        for mode in ("priors", "saved"):
            x = r.get(mode)
            if not x:
                cells.append(f"{'–':>7} {'':>12}")
                continue
            mark = "*" if x["wait"] >= CPU_WAIT_WARN_LANE else " "
            cells.append(f"{x['ratio']:>6.3f}{mark} {x['auto_steps']:>5}/{x['auto_drafted']:<6}")
        f = r.get("saved") or r.get("priors")
        lines.append(f"{r['prompt']:<8} {r['pass']:>4}  " + "  ".join(cells) + f"  {f['fixed_steps']:>9}/{f['fixed_drafted']:<10}")
    p, v = s["priors"], s["saved"]
    fmt = lambda m: "–" if m["mean"] is None else f"{m['mean']:.3f} ({m['runs']} runs)"  # noqa: E731
    lines.append(f"mean: from the priors {fmt(p)}, from the saved memory {fmt(v)}; the memory did better on "
                 f"{s['saved_better'][0]} of {s['saved_better'][1]}")
    lines.append(f"* a lane waited for a CPU ≥ {CPU_WAIT_WARN_LANE:.0%} of its wall: left out of the means")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=T)
    ap.add_argument("--draft", default=D)
    ap.add_argument("--dtype", default="int8", help="the draft's precision")
    ap.add_argument("--fixed", default="k=16,cstop=0.5", help="the fixed setting beside k=auto in each run")
    ap.add_argument("--prompts", default=str(ROOT / "resources/bench/specbench-first-per-category.jsonl"))
    ap.add_argument("--seed-prompts", default=str(ROOT / "resources/bench/specbench-held-out-16.jsonl"),
                    help="the earlier run that saves the memory: these prompts (ids in --seed-ids)")
    ap.add_argument("--seed-ids", default="code-2,sum-2,qa-2,math-2")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--reports", help="render the bench reports already in this folder ({priors,saved}-<prompt>-<pass>.json, "
                                      "seed.json) instead of running")
    args = ap.parse_args()
    if args.reports:
        return show(args, Path(args.reports))

    work = Path(tempfile.mkdtemp(prefix="kauto-memory-"))
    d = f"draft:{args.draft},{args.fixed},dtype={args.dtype}"
    a = f"draft:{args.draft},k=auto,dtype={args.dtype}"

    def bench(prompts: Path, memory: str, out: Path) -> dict:
        env = {**os.environ, "SPECDECK_KAUTO_MEMORY": memory}
        cmd = [sys.executable, "-m", "app", "bench", "--target", args.target, "--prompts", str(prompts), "--max-new-tokens",
               str(args.max_new_tokens), "--mode", "interleaved", "--setup", d, "--setup", a, "--json", str(out)]
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"bench failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
        return json.loads(out.read_text(encoding="utf-8"))

    ids = set(args.seed_ids.split(","))
    seed = work / "seed.jsonl"
    seed.write_text("".join(line for line in Path(args.seed_prompts).read_text(encoding="utf-8").splitlines(keepends=True)
                            if line.strip() and json.loads(line)["id"] in ids), encoding="utf-8")
    print(f"saving a memory over {len(ids)} prompts of {args.seed_prompts} …", file=sys.stderr)
    seed_doc = bench(seed, str(work / "seed-mem"), work / "seed.json")
    prompts = [line for line in Path(args.prompts).read_text(encoding="utf-8").splitlines(keepends=True) if line.strip()]
    rows = []
    for n in range(1, args.passes + 1):
        for line in prompts:
            pid = json.loads(line)["id"]
            one = work / f"{pid}.jsonl"
            one.write_text(line, encoding="utf-8")
            print(f"pass {n}: {pid}", file=sys.stderr)
            row = dict(prompt=pid, **{"pass": n})
            row["priors"] = lane_pair(bench(one, "off", work / f"priors-{pid}-{n}.json"))
            mem = work / f"mem-{pid}-{n}"
            shutil.copytree(work / "seed-mem", mem)
            row["saved"] = lane_pair(bench(one, str(mem), work / f"saved-{pid}-{n}.json"))
            rows.append(row)
    report(args, rows, seed_doc, d, a)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def report(args, rows: list[dict], seed_doc: dict, fixed: str, auto: str) -> None:
    s = summary(rows)
    cpu = next((c.get("machine_text") for c in seed_doc.get("cost_profiles") or [] if c.get("machine_text")), "?")
    print(f"{cpu}; target {args.target}, draft {args.draft} ({args.dtype}), {args.max_new_tokens} tokens, greedy")
    print(render(rows, s, fixed))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(machine=cpu, created=seed_doc.get("created"), target=args.target, draft=args.draft,
                                                   fixed=fixed, auto=auto, seed_ids=sorted(args.seed_ids.split(",")), rows=rows,
                                                   summary=s), indent=1), encoding="utf-8")
        print(f"written: {args.json}")


def show(args, folder: Path) -> int:
    """Render reports a run left in `folder` (the same names `main` writes)."""
    rows = []
    for n in range(1, args.passes + 1):
        for line in Path(args.prompts).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            pid = json.loads(line)["id"]
            row = dict(prompt=pid, **{"pass": n})
            for mode in ("priors", "saved"):
                f = folder / f"{mode}-{pid}-{n}.json"
                if f.is_file():
                    row[mode] = lane_pair(json.loads(f.read_text(encoding="utf-8")))
            if len(row) > 2:
                rows.append(row)
    seed_doc = json.loads((folder / "seed.json").read_text(encoding="utf-8"))
    d = f"draft:{args.draft},{args.fixed},dtype={args.dtype}"
    report(args, rows, seed_doc, d, f"draft:{args.draft},k=auto,dtype={args.dtype}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
