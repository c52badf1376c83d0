"""k=auto against the grid of fixed setups, judged offline: the policy replayed over finder calibrations.

1. The finder's calibration (`python -m app tune`'s first phase: the baseline and a k=24, cstop=0.02 calibration
   lane of the draft, prompt by prompt) on the prompts — or the records of an earlier one (`--records PATH`: read
   when the file exists, else written after calibrating; repeated, several calibrations pooled, each replayed on its
   own as a fresh worker would run it);
2. `k=auto` priced by replaying the policy over the records (app.speculative.replay: the real DraftModelDrafter and
   AutoK, the draft and the target answering from the records, what the policy learnt carried from prompt to prompt
   in the order the finder met them, each calibration's first prompt from the priors — or, with `--saved`, from
   what this machine saved of the pair, as a real lane's first answer starts: app.speculative.policy.load_learnt,
   read only), and each fixed setup of the grid k ∈ {2, 4, 8, 16, 24} × cstop ∈ {0, 0.3,
   0.5} priced from the same records (app.core.tuning.price_candidate);
3. per prompt, per category and overall: k=auto's predicted speedup against the best fixed setup's there, and how
   many tokens k=auto drafted and kept in how many steps; against the fixed setup hand-tuned on the *other* prompts
   of the category (on every other prompt where it has none) and run on this one, as a user tunes on the prompts they
   have and deploys on the next — where the best fixed setup picked on the prompt itself, with hindsight, is a
   bar no rule that decides before the target's verdicts can clear on every prompt; and against transformers' assisted generation's rule as
   `hf-assisted` runs it here (transformers 5.23's defaults without scikit-learn: 20 drafts a step, ending after a
   draft of confidence < 0.4, i.e. `k=20,stop=0.4`) priced on the same records — the issue's "at least hf-assisted's
   speedup on every prompt", judged offline (the rule in SpecDeck's loop, not transformers' own loop and its
   overheads).

No model runs after the calibration, so a change to the policy is judged on the same records in seconds, where a
bench of the same prompts moves by a few percent from run to run (the replay against real lanes:
`finder_accuracy.py`, within 5 % on the 8 first-per-category prompts). A prediction, not a measurement: a change
that wins here is confirmed by a bench.

    python resources/bench/kauto_replay.py --prompts resources/bench/specbench-first-per-category.jsonl \\
        --records /tmp/first8.records --json /tmp/kauto-replay-8.json

`--backend llamacpp` calibrates the llama.cpp pair (both Q4_K_M) instead; records say which pair made them.

Prints the CPU the calibration ran on; the figures of a run live in resources/bench/README.md with the command.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pickle
import random
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

def _label(k: int, cs: float) -> str:
    return f"k={k}" + (f",cstop={cs:g}" if cs else "")


#: transformers' assisted generation as `hf-assisted` runs it (GenerationConfig defaults of transformers 5.23:
#: num_assistant_tokens 20, schedule "constant", assistant_confidence_threshold 0.4, which stays fixed without
#: scikit-learn): the same rule as `draft:…,k=20,stop=0.4`; priced apart from the grid, as a reference
HF_RULE = ("hf-rule k=20,stop=0.4", 20, 0.4)


def main() -> int:
    from finder_accuracy import DRAFT, TARGET, calibrate
    from kauto_verdict import hand_tuned
    from tune_grid import CSTOPS, KS  # the grid tune_grid.py benches

    from app.core.costs import machine_summary
    from app.core.prompts import load_jsonl
    from app.core.tuning import Candidate, price_candidate
    from app.speculative.policy import forget
    from app.speculative.replay import replay_auto

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", help="JSONL file with id, prompt, category (to calibrate on; not needed when --records exist)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--backend", choices=("torch", "llamacpp"), default="torch",
                    help="PyTorch (the draft at --dtype) or llama.cpp (both Q4_K_M GGUF); records keep the backend they were made on")
    ap.add_argument("--dtype", default="int8", help="the PyTorch draft's precision")
    ap.add_argument("--records", action="append", default=[],
                    help="a calibration's records: read if the file exists, else written after calibrating --prompts; repeat it "
                         "to pool several calibrations (each replayed on its own, from the priors, with its own verify curve)")
    ap.add_argument("--orders", type=int, default=1,
                    help="replay k=auto over this many orders of each calibration's prompts (the first: the finder's; the "
                         "others seeded shuffles): what the policy carries from prompt to prompt makes a prompt's result "
                         "depend on the prompts before it; per prompt and category the mean over the orders is reported, "
                         "and the worst category's worst order")
    ap.add_argument("--order", help="a JSONL prompts file (a bench's --prompts): replay every calibration's prompts in its "
                                     "order, in one worker, as that bench met them")
    ap.add_argument("--saved", action="store_true",
                    help="start k=auto from what this machine saved of the pair (SPECDECK_KAUTO_MEMORY, else the kauto folder "
                         "beside the cost profiles; read, never written), as a real lane does, not from its priors")
    ap.add_argument("--passes", type=int, default=1,
                    help="meet each order's prompts this many times in a row in one worker, what the policy learnt carried "
                         "on, and judge the last pass: k=auto as it runs after that many runs of these prompts (what it "
                         "learns per category settles over more than one)")
    ap.add_argument("--json", default="/tmp/kauto-replay.json")
    args = ap.parse_args()

    docs = []
    for r in args.records or [None]:
        path = Path(r) if r else None
        if path is not None and path.exists():
            doc = pickle.loads(path.read_bytes())
            print(f"records: {path} (calibrated on {doc.get('machine', 'an unrecorded machine')})", flush=True)
        else:
            if not args.prompts:
                ap.error(f"{path} does not exist: give --prompts to calibrate on")
            print(f"machine: {machine_summary()}", flush=True)
            pre, dtype = ("llamacpp-", None) if args.backend == "llamacpp" else ("", args.dtype)
            records, curve, scale, draft_curve, profiles, _heads = calibrate(pre + TARGET, pre + DRAFT, args.prompts, args.tokens, dtype)
            doc = dict(records=records, curve=curve, scale=scale, draft_curve=draft_curve, profiles=profiles, machine=machine_summary(),
                       backend=args.backend, dtype=dtype)
            if path is not None:
                path.write_bytes(pickle.dumps(doc))
        if doc["profiles"][0] is None:
            print("the target has no cost profile: k=auto cannot be replayed (`python -m app profile` measures it)", file=sys.stderr)
            return 1
        docs.append(doc)
    # the finder names a float32 draft's lanes without a dtype (its default precision)
    backend, dtype = docs[0].get("backend", "torch"), docs[0].get("dtype", args.dtype)  # records from before: PyTorch at --dtype
    if any(d.get("backend", "torch") != backend for d in docs):
        ap.error("--records of one backend at a time")
    pre = "llamacpp-" if backend == "llamacpp" else ""  # the llama.cpp pair's engine names
    target, draft = pre + TARGET, pre + DRAFT
    tail = f",dtype={dtype}" if dtype and dtype != "float32" else ""
    memory = None  # what --saved starts from: {path, answers, saved} of the pair's saved memory, as `profile` shows it
    if args.saved:
        from app.speculative.policy import saved_summary

        t_prof, d_prof = docs[0]["profiles"]
        memory = saved_summary((t_prof.key, d_prof.key)) if d_prof is not None else None
        print(f"k=auto starts from the saved memory: {memory}" if memory else "--saved: nothing saved of this pair here; k=auto starts from its priors",
              flush=True)
    drafter = f"draft:{draft}{tail}"

    # predicted and baseline walls per prompt, pooled over the calibrations: "auto" and each fixed setup's label
    pred: dict[str, dict[str, float]] = defaultdict(dict)
    base: dict[str, float] = {}
    cat: dict[str, str] = {}
    done: dict[str, tuple[int, int, int]] = {}  # what k=auto did on each prompt (the finder's order): steps, drafted, kept
    ids: list[str] = []
    rng = random.Random(0)
    orders = max(1, args.orders)
    if args.order:  # one worker meets every calibration's prompts in this order
        where = {pc.prompt_id: (d, pc) for d, doc in enumerate(docs) for pc in doc["records"]}
        want = [p.id for p in load_jsonl(args.order)]
        if missing := [i for i in want if i not in where]:
            ap.error(f"--order names prompts no calibration recorded: {', '.join(missing)}")
        first = [[where[i] for i in want]]
    else:  # each calibration as the finder met it, in a worker of its own
        first = [[(d, pc) for pc in doc["records"]] for d, doc in enumerate(docs)]
    for o in range(orders):
        if o == 0:
            sequences = first
        elif args.order:
            sequences = [rng.sample(first[0], len(first[0]))]
        else:
            sequences = [rng.sample(seq, len(seq)) for seq in first]
        for seq in sequences:
            key = ("kauto_replay", o)  # one worker: what the policy learns carries along the sequence
            passes = max(1, args.passes)
            try:
                for n_pass, (d, pc) in itertools.product(range(passes), seq):
                    doc = docs[d]
                    t_prof, d_prof = doc["profiles"]
                    saved = (t_prof.key, d_prof.key) if args.saved and d_prof is not None else None
                    judged = n_pass == passes - 1  # earlier passes only teach the policy
                    auto = replay_auto([pc], drafter, f"draft:{draft},k=auto{tail}", t_prof, d_prof, doc["curve"], saved=saved,
                                       counts=done if o == 0 and judged else None, memory=key)
                    if auto is None or not judged:
                        continue
                    if o == 0:
                        ids.append(pc.prompt_id)
                        base.update(auto.base_wall_s)
                        cat.update(auto.categories)
                    pred[f"auto#{o}"].update(auto.pred_wall_s)
            finally:
                forget(key)
    if not ids:
        print("no calibration lane with the draft's confidences to replay", file=sys.stderr)
        return 1
    for i in ids:  # k=auto's wall on a prompt: the mean over the orders
        pred["auto"][i] = sum(pred[f"auto#{o}"][i] for o in range(orders)) / orders
    for doc in docs:
        records, curve, draft_curve = doc["records"], doc["curve"], doc["draft_curve"]
        for k, cs in itertools.product(KS, CSTOPS):
            priced = price_candidate(Candidate(drafter, _label(k, cs), k, 0.0, cs), records, curve, draft_curve)
            if priced is not None:
                pred[_label(k, cs)].update(priced.pred_wall_s)
        hf_name, hf_k, hf_stop = HF_RULE
        if (priced := price_candidate(Candidate(drafter, hf_name, hf_k, hf_stop, 0.0), records, curve, draft_curve)) is not None:
            pred[hf_name].update(priced.pred_wall_s)
    fixed = [n for n in pred if not n.startswith("auto") and n != HF_RULE[0]]
    has_hf = all(i in pred[HF_RULE[0]] for i in ids)

    def speedup(name: str, group: list[str]) -> float:
        return sum(base[i] for i in group) / sum(pred[name][i] for i in group)

    def best(group: list[str]) -> tuple[str, float]:
        name = max(fixed, key=lambda n: speedup(n, group))
        return name, speedup(name, group)

    prompts = []
    print(f"\n{'prompt':<10} {'k=auto':>7} {'best fixed':>22} {'ratio':>6}   steps drafted kept  {'÷ hf rule':>9}")
    for i in ids:
        name, b = best([i])
        a = speedup("auto", [i])
        n_steps, drafted, kept = done[i]
        row = dict(prompt=i, category=cat.get(i), auto=a, best=name, best_speedup=b, ratio=a / b, steps=n_steps, drafted=drafted, kept=kept)
        if has_hf:
            row["hf_rule_speedup"] = speedup(HF_RULE[0], [i])
            row["ratio_to_hf_rule"] = a / row["hf_rule_speedup"]
        prompts.append(row)
        print(f"{i:<10} {a:>6.2f}x {name:>14} {b:>6.2f}x {a / b:>6.3f}   {row['steps']:>5} {row['drafted']:>7} {row['kept']:>4}"
              + (f"  {row['ratio_to_hf_rule']:>9.3f}" if has_hf else ""))
    cats: dict[str, list[str]] = defaultdict(list)
    for i in ids:
        cats[cat.get(i, "?")].append(i)
    by_cat = []
    print(f"\n{'category':<14} {'n':>2} {'k=auto':>7} {'best fixed':>22} {'ratio':>6}")
    for c, group in [("all", ids), *cats.items()]:
        name, b = best(group)
        a = speedup("auto", group)
        by_cat.append(dict(category=c, prompts=len(group), auto=a, best=name, best_speedup=b, ratio=a / b))
        print(f"{c:<14} {len(group):>2} {a:>6.2f}x {name:>14} {b:>6.2f}x {a / b:>6.3f}")
    worst = min((r for r in by_cat if r["category"] != "all"), key=lambda r: r["ratio"])
    print(f"\nk=auto (replayed) {by_cat[0]['ratio']:.3f} of the best fixed setup overall; worst category {worst['category']} {worst['ratio']:.3f}")
    tuned = hand_tuned(ids, cat, fixed, lambda s, group: sum(pred[s][i] for i in group))  # as a user tunes: on the other prompts
    if tuned:
        print(f"\n{'category':<14} {'n':>2} {'k=auto':>7} {'hand-tuned on the others':>26} {'ratio':>6}")
        for r in by_cat:
            group = ids if r["category"] == "all" else cats[r["category"]]
            h = sum(base[i] for i in group) / sum(pred[tuned[i]][i] for i in group)
            r["hand_tuned_speedup"], r["ratio_to_hand_tuned"] = h, r["auto"] / h
            picks = sorted({tuned[i] for i in group})
            print(f"{r['category']:<14} {len(group):>2} {r['auto']:>6.2f}x {h:>25.2f}x {r['auto'] / h:>6.3f}"
                  + (f"   ({', '.join(picks)})" if r["category"] != "all" else ""))
        for row in prompts:
            row["hand_tuned"] = tuned[row["prompt"]]
        low = min((r for r in by_cat if r["category"] != "all"), key=lambda r: r["ratio_to_hand_tuned"])
        print(f"k=auto (replayed) {by_cat[0]['ratio_to_hand_tuned']:.3f} of the setup hand-tuned on the other prompts; "
              f"worst category {low['category']} {low['ratio_to_hand_tuned']:.3f}")
    hf_rule = None
    if has_hf:
        below = [r for r in prompts if r["ratio_to_hf_rule"] < 1.0]
        hf_rule = dict(setup=HF_RULE[0], speedup=speedup(HF_RULE[0], ids), below_on=[r["prompt"] for r in below])
        print(f"hf-assisted's rule ({HF_RULE[0].split(' ', 1)[1]}) replayed: {hf_rule['speedup']:.2f}x overall; k=auto below it on "
              f"{len(below)} of {len(prompts)} prompts" + (": " + ", ".join(f"{r['prompt']} {r['ratio_to_hf_rule']:.3f}" for r in below) if below else ""))
    if orders > 1:
        low = {c: min(speedup(f"auto#{o}", group) / best(group)[1] for o in range(orders)) for c, group in cats.items()}
        print(f"over {orders} orders (means above): worst order's ratio per category "
              + ", ".join(f"{c} {v:.3f}" for c, v in low.items()))
        for r in by_cat:
            if r["category"] in low:
                r["worst_order_ratio"] = low[r["category"]]
    Path(args.json).write_text(json.dumps(dict(machines=[d.get("machine") for d in docs], target=target, draft=drafter, records=args.records,
                                               tokens=args.tokens, orders=orders, passes=max(1, args.passes), verify_scales=[d.get("scale") for d in docs], by_prompt=prompts,
                                               by_category=by_cat, fixed={n: speedup(n, ids) for n in fixed}, hf_rule=hf_rule,
                                               base_wall_s=base, pred_wall_s={n: dict(v) for n, v in pred.items()},
                                               saved=memory), indent=1))
    print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
