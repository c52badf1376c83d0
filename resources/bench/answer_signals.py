"""Could k=auto tell, from an answer's first tokens, whether drafting will pay on it? Two signals it could read for free.

k=auto reads a prompt into the draft only where what drafting saved a token lately repays the reading
(app.speculative.policy.AutoK.worth_reading). On llama.cpp on a 2-core Xeon drafting pays on a few prompts (two of
three coding prompts, one editing prompt) and loses on the rest, so one saving pooled over every answer keeps the
draft from reading anywhere. A signal known before the reading, on the answer itself, could pick the prompts out.
This script greedy-decodes each prompt with the target alone and prints, per prompt, over its first `--first` tokens
and over the whole answer:

* **conf**: the target's mean probability of the token it emitted (a confident target is a predictable one);
* **hits**: the share of emitted tokens that prompt lookup would have proposed (the last 2 tokens found earlier in the
  prompt and answer, the token after them: `ngram` with n=2) — answers that copy their prompt;

beside the best fixed draft setting's speedup on the prompt, from `kauto_verdict.py` reports of recorded runs (the
mean over the reports given), sorted by it.

    python resources/bench/answer_signals.py --target llamacpp-qwen2.5-coder-1.5b-instruct \\
        resources/bench/qwen-kauto-verify-factor-llamacpp-pooled-verdict-amx.json \\
        resources/bench/qwen-kauto-top4-specbench24-llamacpp-pooled-verdict-amx.json

The figures of a run live in resources/bench/README.md with the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def lookup(ctx: list[int], n: int = 2) -> int | None:
    """Prompt lookup's guess at the next token: the token after the latest earlier occurrence of the last n."""
    key = ctx[-n:]
    for i in range(len(ctx) - n - 1, -1, -1):
        if ctx[i:i + n] == key:
            return ctx[i + n]
    return None


def main() -> int:
    import numpy as np
    import torch

    from app.core.costs import machine_summary
    from app.core.prompts import load_suite
    from app.engines.registry import open_engine, resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verdicts", nargs="+", help="kauto_verdict.py --json reports of the same prompts (best fixed speedups)")
    ap.add_argument("--target", required=True)
    ap.add_argument("--suite", default="specbench")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--first", type=int, default=8, help="the answer's first tokens, read before a decision")
    ap.add_argument("--json", help="write the rows as JSON here")
    args = ap.parse_args()

    best: dict[str, list[float]] = defaultdict(list)
    for path in args.verdicts:
        for p in json.loads(Path(path).read_text())["prompts"]:
            best[p["prompt"]].append(p["speedup"] / p["vs_best_fixed"])
    print(f"machine: {machine_summary()}", flush=True)
    engine = open_engine(resolve(args.target))
    rows = []
    for p in load_suite(args.suite):
        if p.id not in best:
            continue
        prompt = engine.encode_prompt(p.prompt)
        state = engine.new_state()
        logits = state.forward(prompt, last_only=True)
        probs, toks = [], []
        for _ in range(args.tokens):
            row = logits[-1].float()
            tok = int(torch.argmax(row))
            probs.append(float(torch.softmax(row, -1)[tok]))
            toks.append(tok)
            if tok in engine.eos_ids:
                break
            logits = state.forward([tok], last_only=True)
        hits = [1.0 if lookup(prompt + toks[:i]) == t else 0.0 for i, t in enumerate(toks)]
        f = args.first
        rows.append(dict(prompt=p.id, category=p.category, best_fixed=float(np.mean(best[p.id])), conf_first=float(np.mean(probs[:f])),
                         conf=float(np.mean(probs)), hits_first=float(np.mean(hits[:f])), hits=float(np.mean(hits)), tokens=len(toks)))
    rows.sort(key=lambda r: -r["best_fixed"])
    print(f"\n{'prompt':<8} {'best fixed':>10} {'conf ' + str(args.first):>8} {'conf':>6} {'hits ' + str(args.first):>8} {'hits':>6}")
    for r in rows:
        print(f"{r['prompt']:<8} {r['best_fixed']:>9.2f}x {r['conf_first']:>8.2f} {r['conf']:>6.2f} {r['hits_first']:>8.2f} {r['hits']:>6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(machine=machine_summary(), target=args.target, verdicts=args.verdicts,
                                                   first=args.first, rows=rows), indent=1))
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
