"""The setup finder and k=auto against an exhaustive grid of fixed setups, per backend, in one report.

For each backend (PyTorch: the fp32 Qwen2.5-Coder 1.5B target with the 0.5B draft at int8; llama.cpp: both Q4_K_M):

1. `python -m app tune` with a time budget picks a setup (it may choose any drafter, precision, k, stop, cstop);
2. one paced `python -m app bench` runs the baseline, the grid k ∈ {2, 4, 8, 16, 24} × cstop ∈ {0, 0.3, 0.5}
   (15 fixed setups, the same draft), `k=auto`, transformers' assisted generation with the same draft and precision
   (PyTorch), and the finder's pick — every lane of a prompt advancing together, the one with the fewest tokens next,
   so that all of them span the same stretch of time (runs before 2026-12-05 were interleaved: one step each in turn,
   the baseline's last 40 steps alone);
3. the checks: the pick ≥ 0.95x the grid's best measured speedup; each confirmed candidate's predicted speedup within
   10 % of its measured one (from the finder's own confirmation run); `k=auto` ≥ 0.95x the best fixed setting in
   every category and ≥ 0.97x the baseline; `k=auto` ≥ hf-assisted on every prompt. Beside it, k=auto against hand
   tuning as a user does it (`hand_tuned_by_category`: each prompt run with the fixed setup fastest on the other
   prompts of its category), and every lane's wall per prompt (`walls_by_prompt`). Beside the measured per-category
   ratio, the same ratio as the finder priced it (`priced_by_category`): k=auto replayed and every fixed setup priced
   on one set of calibration records, so that a category of one prompt is not judged on one bench run's noise and on
   the best of 15 noisy measurements picked after the fact alone.

    python resources/bench/tune_grid.py --suite specbench --per-category 1 --tokens 48 --finder-minutes 10 \\
        --json resources/bench/qwen-tune-grid.json
    python resources/bench/tune_grid.py --prompts resources/bench/palindrome-rename.jsonl --backend llamacpp

Prints the CPU it ran on; the figures of a run live in resources/bench/README.md with the command.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # kauto_verdict.hand_tuned

from app.core.costs import machine_summary  # noqa: E402
from app.core.prompts import load_jsonl, load_suite  # noqa: E402

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
BACKENDS = {
    "torch": dict(target=TARGET, draft=DRAFT, dtype=",dtype=int8", assisted=f"hf-assisted:{DRAFT},dtype=int8", tune=["--dtypes", "int8,float32"]),
    "llamacpp": dict(target=f"llamacpp-{TARGET}", draft=f"llamacpp-{DRAFT}", dtype="", assisted=None, tune=[]),
}
KS = (2, 4, 8, 16, 24)
CSTOPS = (0.0, 0.3, 0.5)


def grid(draft: str, dtype: str) -> list[str]:
    return [f"draft:{draft},k={k}" + (f",cstop={c:g}" if c else "") + dtype for k in KS for c in CSTOPS]


def subset(prompts, per_category: int | None):
    if not per_category:
        return prompts
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        if seen.get(p.category, 0) < per_category:
            seen[p.category] = seen.get(p.category, 0) + 1
            out.append(p)
    return out


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--suite")
    src.add_argument("--prompts")
    ap.add_argument("--per-category", type=int, default=None, help="only the first N prompts of each category")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    ap.add_argument("--finder-minutes", type=float, default=15.0)
    ap.add_argument("--json", default="/tmp/tune-grid.json")
    args = ap.parse_args()
    prompts = subset(load_suite(args.suite) if args.suite else load_jsonl(args.prompts), args.per_category)
    work = Path(tempfile.mkdtemp(prefix="tune-grid-"))
    pfile = work / "prompts.jsonl"
    pfile.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt, "category": p.category}) + "\n" for p in prompts))
    print(f"machine: {machine_summary()}; {len(prompts)} prompts, {args.tokens} tokens", flush=True)
    out: dict = {"machine": machine_summary(), "prompts": [p.id for p in prompts], "tokens": args.tokens, "backends": {}}
    for name in (BACKENDS if args.backend == "both" else [args.backend]):
        b = BACKENDS[name]
        tj, bj = work / f"tune-{name}.json", work / f"bench-{name}.json"
        run([sys.executable, "-m", "app", "tune", "--target", b["target"], "--draft", b["draft"], *b["tune"], "--prompts", str(pfile),
             "--max-new-tokens", str(args.tokens), "--minutes", str(args.finder_minutes), "--json", str(tj)])
        tune = json.loads(tj.read_text())
        pick = tune["winner"]["setup"] if tune.get("winner") else None
        fixed = grid(b["draft"], b["dtype"])
        auto = f"draft:{b['draft']},k=auto{b['dtype']}"
        setups = [*fixed, auto, *([b["assisted"]] if b["assisted"] else []), *([pick] if pick and pick not in (*fixed, auto) else [])]  # a pick in the grid (or k=auto) runs once
        cmd = [sys.executable, "-m", "app", "bench", "--target", b["target"], "--prompts", str(pfile), "--max-new-tokens", str(args.tokens),
               "--mode", "paced", "--json", str(bj)]
        for s in setups:
            cmd += ["--setup", s]
        run(cmd)
        bench = json.loads(bj.read_text())
        out["backends"][name] = check(bench, tune, fixed, auto, b["assisted"], pick)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"\nwritten: {args.json}")
    return 0


def _by_category(bench: dict, setup: str) -> dict[str, float]:
    from app.core.report import category_speedups

    return category_speedups(bench).get(setup, {})


def _pred(c: dict) -> float:
    """A confirmed candidate's prediction on the prompts its confirmation measured (all calibrated ones in older
    reports)."""
    return c.get("predicted_confirmed_speedup") or c["predicted_speedup"]


def priced_by_category(tune: dict, fixed: list[str], auto: str) -> dict[str, dict]:
    """k=auto against the best fixed setup of the grid per category as the finder *priced* them — both on the same
    calibration records (k=auto replayed, app.speculative.replay; each fixed setup by app.core.tuning.price_candidate),
    so without the timing noise of one bench run, and without picking the best of 15 noisy measurements after the
    fact: {category: {auto, best, best_setup, ratio}} (labels as the bench prints them; categories where the finder
    priced neither are left out)."""
    from app.core.setups import parse_setup

    label = {parse_setup(s).label: s for s in fixed}
    priced = {parse_setup(c["setup"]).label: c.get("predicted_by_category") or {} for c in tune.get("candidates", [])}
    mine = priced.get(parse_setup(auto).label, {})
    out: dict[str, dict] = {}
    for cat, a in mine.items():
        rows = [(priced[lab][cat], lab) for lab in label if cat in priced.get(lab, {})]
        if rows:
            best, lab = max(rows)
            out[cat] = {"auto": a, "best": best, "best_setup": lab, "ratio": a / best if best else None}
    return out


def walls_by_prompt(bench: dict) -> dict[str, dict[str, float]]:
    """setup → prompt → the lane's wall in seconds (summed over repeats), as the bench labels setups."""
    walls: dict[str, dict[str, float]] = {}
    for r in bench["runs"]:
        w = walls.setdefault(r["setup"], {})
        w[r["prompt_id"]] = w.get(r["prompt_id"], 0.0) + float(r["wall_s"])
    return walls


def hand_tuned_by_category(bench: dict, fixed: list[str], auto: str) -> dict[str, dict]:
    """k=auto against hand tuning, measured: on each prompt the fixed setup of the grid that was fastest on the other
    prompts of its category (on every other prompt where it has none: kauto_verdict.hand_tuned), as a user tunes on
    the prompts they have and runs the next one — {category or "all": {auto, hand_tuned (speedups), ratio, picks}};
    the best fixed setup picked on the category's own prompts is the other column. Labels as the bench prints them."""
    from kauto_verdict import hand_tuned

    walls = walls_by_prompt(bench)
    cats = bench.get("categories") or {}
    have = [s for s in fixed if s in walls]
    ids = [p for p in walls.get("baseline", {}) if p in walls.get(auto, {}) and all(p in walls[s] for s in have)]
    tuned = hand_tuned(ids, cats, have, lambda s, ps: sum(walls[s][p] for p in ps)) if have else {}
    out: dict[str, dict] = {}
    for name, group in [("all", ids), *((c, [p for p in ids if cats.get(p) == c]) for c in dict.fromkeys(cats.get(p) for p in ids))]:
        if not tuned or not group:
            continue
        base = sum(walls["baseline"][p] for p in group)
        a, h = base / sum(walls[auto][p] for p in group), base / sum(walls[tuned[p]][p] for p in group)
        out[name or "?"] = {"auto": a, "hand_tuned": h, "ratio": a / h, "picks": sorted({tuned[p] for p in group})}
    return out


def check(bench: dict, tune: dict, fixed: list[str], auto: str, assisted: str | None, pick: str | None) -> dict:
    from app.core.setups import parse_setup

    summ = {s["setup"]: s for s in bench["summary"]}
    lab = {s: parse_setup(s).label for s in [*fixed, auto, *([assisted] if assisted else []), *([pick] if pick else [])]}
    rows = [(lab[s], summ[lab[s]]["speedup"]) for s in fixed if lab[s] in summ]
    best_setup, best = max(rows, key=lambda x: x[1])
    cats = sorted({c for c in bench.get("categories", {}).values()})
    by_cat = {s: _by_category(bench, s) for s, _ in rows}
    auto_cat = _by_category(bench, lab[auto])
    print(f"\n{'setup':<60} {'speedup':>8}  " + "  ".join(f"{c[:10]:>10}" for c in cats))
    for s, sp in sorted(rows, key=lambda x: -x[1]) + [(lab[auto], summ[lab[auto]]["speedup"])] + (
            [(lab[assisted], summ[lab[assisted]]["speedup"])] if assisted else []) + ([(lab[pick], summ[lab[pick]]["speedup"])] if pick else []):
        bc = _by_category(bench, s)
        print(f"{s:<60} {sp:>7.2f}x  " + "  ".join(f"{bc.get(c, float('nan')):>9.2f}x" for c in cats))
    best_cat = {c: max(v.get(c, 0.0) for v in by_cat.values()) for c in cats}
    res = {
        "grid_best": {"setup": best_setup, "speedup": best},
        "pick": {"setup": lab[pick] if pick else None, "speedup": summ[lab[pick]]["speedup"] if pick else None,
                 "ratio_to_grid_best": summ[lab[pick]]["speedup"] / best if pick else None, "finder_wall_s": tune["wall_s"]},
        "auto": {"speedup": summ[lab[auto]]["speedup"], "by_category": auto_cat,
                 "ratio_to_best_fixed_by_category": {c: auto_cat.get(c, 0.0) / best_cat[c] for c in cats if best_cat[c]},
                 "priced_by_category": priced_by_category(tune, fixed, auto),
                 "hand_tuned_by_category": hand_tuned_by_category(bench, [lab[s] for s in fixed], lab[auto])},
        "walls_by_prompt": walls_by_prompt(bench),
        "predicted_vs_measured": [
            {"setup": c["setup"], "predicted": _pred(c), "measured": c["measured"]["speedup"], "error": _pred(c) / c["measured"]["speedup"] - 1.0}
            for c in tune["candidates"] if c.get("measured") and c["measured"].get("speedup")],
        "summary": bench["summary"],
        "tune": {k: tune[k] for k in ("winner", "winners_by_category", "break_even_text", "not_tried", "wall_s", "prompts")},
    }
    if assisted:
        a_runs = {r["prompt_id"]: r["speedup"] for r in bench["runs"] if r["setup"] == lab[assisted]}
        k_runs = {r["prompt_id"]: r["speedup"] for r in bench["runs"] if r["setup"] == lab[auto]}
        res["auto_vs_assisted_by_prompt"] = {p: (k_runs.get(p), a_runs.get(p)) for p in a_runs}
    print(f"\ngrid best: {best_setup} {best:.2f}x; finder's pick: {res['pick']['setup']} {res['pick']['speedup'] or float('nan'):.2f}x "
          f"({(res['pick']['ratio_to_grid_best'] or float('nan')):.2f} of the grid's best; finder took {tune['wall_s']:.0f} s)")
    print(f"k=auto: {res['auto']['speedup']:.2f}x; per category vs the best fixed: "
          + ", ".join(f"{c} {r:.2f}" for c, r in res["auto"]["ratio_to_best_fixed_by_category"].items()))
    if ht := res["auto"]["hand_tuned_by_category"]:
        print("k=auto against hand tuning (each prompt run with the fixed setup fastest on the category's other prompts): "
              + ", ".join(f"{c} {v['ratio']:.2f}" for c, v in ht.items()))
    if pr := res["auto"]["priced_by_category"]:
        print("k=auto priced on the finder's calibration (no timing noise), per category vs the best fixed priced there: "
              + ", ".join(f"{c} {v['ratio']:.2f}" for c, v in pr.items() if v["ratio"] is not None))
    for x in res["predicted_vs_measured"]:
        print(f"  predicted {x['predicted']:.2f}x, measured {x['measured']:.2f}x ({x['error']:+.0%}): {x['setup']}")
    return res


if __name__ == "__main__":
    raise SystemExit(main())
