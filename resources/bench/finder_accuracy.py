"""How well the setup finder prices fixed setups: its predictions against one paced bench of the same setups.

1. The finder's calibration (`python -m app tune`'s first phase: the baseline and a k=24, cstop=0.02 calibration
   lane of the draft, prompt by prompt) on the prompts;
2. its pricing of each fixed setup below from those records (app.core.tuning, the curve scaled to the run's
   verifies as the finder does);
3. one paced `python -m app bench` of the baseline and those setups on the same prompts (interleaved before
   2026-12-05);
4. predicted against measured speedup, overall and per category, and the mean and worst error.

The setups mix the rules the finder prices: plain k, cumulative stops (cstop), per-token stops (stop), and static
token trees (`tree:…,shape=…`, priced from the ranks the chain calibration recorded where the target corrected it),
and `k=auto`, priced by replaying the policy itself over the records (app.speculative.replay). With `--beams`, a
ReDrafter head trained for the target (the one `tune --kinds redrafter` would try first) is calibrated too (its lane
verifies every beam tree up to 4 × 4 at once) and its trees `beams × depth[@cstop]` are priced and benched beside;
with `--dynamic`, the draft's dynamic trees `nodes × depth × branch` likewise (their calibration lane verifies every
dynamic tree up to 32 nodes, depth 6, branch 4 at once).

    python resources/bench/finder_accuracy.py --prompts resources/bench/palindrome-rename.jsonl \\
        --json resources/bench/qwen-finder-accuracy.json

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

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
RULES = ("k=24,cstop=0.5", "k=16,cstop=0.3", "k=8", "k=4", "k=12,stop=0.4", "k=8,stop=0.75", "k=24,stop=0.4", "k=4,cstop=0.5", "k=24")
TREES = ("2x1x1x1", "2x2x1", "3x1x1", "3x2x1", "4x1x1x1x1x1", "2x2x1x1x1x1")


def calibrate(target: str, draft: str, prompts: str, tokens: int, dtype: str | None, heads: bool = False,
              dynamic: bool = False) -> tuple[list, tuple[float, ...], float | None, tuple[float, ...] | None, tuple, list[str]]:
    """The finder's calibration phase on its own: (records, the priced verify curve, the verify scale, the draft's own
    cost curve, (the target's and the draft's cost profiles), the ReDrafter heads calibrated)."""
    from app.commands.tune import Finder

    kinds = "draft" + (",tree" if dynamic else "") + (",redrafter" if heads else "")
    args = argparse.Namespace(target=target, draft=[draft], kinds=kinds, dtypes=dtype, suite=None, prompts=prompts, prompt=None,
                              minutes=120.0, confirm=0, calibrate_all=True, max_new_tokens=tokens, temperature=0.0, seed=0, no_chat=False, json=None,
                              quiet=False)
    f = Finder(args, False)
    try:
        f.load()
        f.calibrate()
        records = f.records()
    finally:
        f.w.close()
    curve, scale = f.priced_curve(records)
    drafter = f"draft:{draft}" + (f",dtype={dtype}" if dtype else "")
    return records, curve, scale, f.draft_curve(drafter), (f.target_profile(), f.draft_profile(drafter)), list(f.heads)


def main() -> int:
    from app.core.costs import machine_summary
    from app.core.report import category_speedups
    from app.core.setups import parse_setup
    from app.core.tuning import Candidate, price_candidate
    from app.speculative.replay import replay_auto

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True, help="JSONL file with id, prompt, category")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--backend", choices=("torch", "llamacpp"), default="torch", help="PyTorch (the draft at --dtype) or "
                    "llama.cpp (both Q4_K_M GGUF)")
    ap.add_argument("--dtype", default="int8", help="the PyTorch draft's precision")
    ap.add_argument("--rules", default=";".join(RULES), help="chain rules, ;-separated (default: the nine above)")
    ap.add_argument("--trees", default=",".join(TREES), help="static tree shapes, comma-separated ('' for none)")
    ap.add_argument("--beams", default="", help="ReDrafter trees of the head trained for the target, comma-separated "
                    "beams×depth[@cstop], e.g. 2x2,1x2,4x4@0.1 ('' for none)")
    ap.add_argument("--dynamic", default="", help="dynamic trees of the draft, comma-separated nodes×depth×branch, e.g. "
                    "16x5x4,8x3x2 ('' for none)")
    ap.add_argument("--no-auto", action="store_true", help="leave out k=auto (priced by replaying the policy over the records)")
    ap.add_argument("--records", help="also pickle the calibration records here (for offline study of the pricing)")
    ap.add_argument("--json", default="/tmp/finder-accuracy.json")
    args = ap.parse_args()
    print(f"machine: {machine_summary()}", flush=True)
    pre = "llamacpp-" if args.backend == "llamacpp" else ""
    target, draft = pre + TARGET, pre + DRAFT
    dtype = None if pre else args.dtype
    tail = f",dtype={dtype}" if dtype else ""
    beams = [b for b in args.beams.split(",") if b]
    dyn = [x for x in args.dynamic.split(",") if x]
    records, curve, scale, draft_curve, (t_prof, d_prof), heads = calibrate(target, draft, args.prompts, args.tokens, dtype, bool(beams),
                                                                            bool(dyn))
    if beams and not heads:
        raise SystemExit(f"--beams: no ReDrafter head trained for {target} (python -m app train-drafter --target {target})")
    if args.records:
        import pickle

        Path(args.records).write_bytes(pickle.dumps(dict(records=records, curve=curve, scale=scale, draft_curve=draft_curve,
                                                         profiles=(t_prof, d_prof))))
    drafter = f"draft:{draft}{tail}"
    auto = f"draft:{draft},k=auto{tail}"
    setups = ([] if args.no_auto else [auto]) + [f"draft:{draft},{r}{tail}" for r in args.rules.split(";") if r]
    setups += [f"tree:{draft},shape={t}{tail}" for t in args.trees.split(",") if t]
    head_cands = {}
    for b in beams:
        shape, _, cut = b.partition("@")
        w, d = (int(x) for x in shape.split("x"))
        s = f"{heads[0]},beams={w},depth={d}" + (f",cstop={cut}" if cut else "")
        head_cands[s] = Candidate(heads[0], s, d, cstop=float(cut or 0.0), beams=w)
        setups.append(s)
    for x in dyn:
        n, d, b = (int(v) for v in x.split("x"))
        s = f"tree:{draft},nodes={n},depth={d},branch={b}{tail}"
        head_cands[s] = Candidate(f"tree:{draft}{tail}", s, d, dynamic=(n, b))
        setups.append(s)
    bench = Path(tempfile.mkdtemp(prefix="finder-accuracy-")) / "bench.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", target, "--prompts", args.prompts, "--max-new-tokens", str(args.tokens),
           "--mode", "paced", "--json", str(bench)]
    for s in setups:
        cmd += ["--setup", s]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    doc = json.loads(bench.read_text())
    measured = {s["setup"]: s["speedup"] for s in doc["summary"]}
    tau = {s["setup"]: s["mean_accepted_len"] for s in doc["summary"]}
    by_cat = category_speedups(doc)
    rows = []
    for s in setups:
        p = parse_setup(s)
        label = p.label
        if s == auto:
            priced = replay_auto(records, drafter, s, t_prof, d_prof, curve) if t_prof is not None else None
        elif s in head_cands:
            priced = price_candidate(head_cands[s], records, curve)
        else:
            shape = tuple(int(b) for b in p.shape.split("x")) if getattr(p, "shape", None) else ()
            cand = Candidate(drafter, s, len(shape) if shape else p.k, getattr(p, "stop", 0.0), getattr(p, "cstop", 0.0), shape)
            priced = price_candidate(cand, records, curve, draft_curve)
        if priced is None or label not in measured:
            continue
        cats = {c: dict(predicted=priced.speedup([i for i, x in priced.categories.items() if x == c]), measured=m)
                for c, m in by_cat.get(label, {}).items()}
        rows.append(dict(setup=label, predicted=priced.speedup(), measured=measured[label], error=priced.speedup() / measured[label] - 1.0,
                         predicted_tau=priced.tau, measured_tau=tau.get(label), by_category=cats))
    print(f"\nverify scale (this run's verifies over the profile's, above one forward): {scale if scale is None else round(scale, 2)}")
    print(f"{'setup':<58} {'predicted':>9} {'measured':>9} {'error':>7}  {'τ pred':>6} {'τ meas':>6}")
    for r in rows:
        mt = r["measured_tau"]
        print(f"{r['setup']:<58} {r['predicted']:>8.2f}x {r['measured']:>8.2f}x {r['error']:>+7.1%}  {r['predicted_tau']:>6.2f} "
              f"{mt if mt is None else format(mt, '.2f'):>6}")
        for c, x in r["by_category"].items():
            print(f"    {c:<54} {x['predicted']:>8.2f}x {x['measured']:>8.2f}x")
    errs = [abs(r["error"]) for r in rows]
    print(f"\nmean |error| {sum(errs) / len(errs):.1%}, worst {max(errs):.1%} over {len(rows)} setups")
    Path(args.json).write_text(json.dumps(dict(machine=machine_summary(), backend=args.backend, target=target, prompts=args.prompts, tokens=args.tokens, verify_scale=scale,
                                               rows=rows, mean_abs_error=sum(errs) / len(errs), max_abs_error=max(errs)), indent=1))
    print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
