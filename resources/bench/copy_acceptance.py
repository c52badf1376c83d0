"""Do drafts that copy from the prompt get kept more often than their confidence says? Read from run files.

k=auto prices a draft by its confidence q alone (app.speculative.policy: a calibration of acceptance against q,
learnt from the target's verdicts). On answers that copy from their prompt (a summary, a RAG answer) transformers'
blind long drafts beat it (resources/bench/README.md, "An expensive draft"): there k=auto stops after drafts of
middling confidence that the target then keeps. This script asks whether "the draft continues an n-gram of the
prompt" says more than q does, before anything is built on it.

For every draft-model lane of the given run files (`bench --record`, greedy; `draft:…` and transformers'
`hf-assisted:…`, whose lanes read each draft's confidence from the assistant's forwards), every drafted token the
target tested (up to and including a step's first rejection; later drafts were not tested) is put in a confidence band and marked
"copy" when the last `--n` tokens before it (prompt, answer so far, this step's earlier drafts) followed by it occur
in the prompt's text as tokenized without the chat template. Printed: the share kept per band, copy or not, over all
lanes, and per category for the bands below 0.8. Every lane counts its own drafts, so a position several lanes
drafted counts once per lane.

    python resources/bench/copy_acceptance.py qwen-fp32-run-1.specdeck qwen-fp32-run-2.specdeck

The figures of a run live in resources/bench/README.md with the command and the machine.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.errors import SpecDeckError  # noqa: E402

#: confidence bands (lower edges) of a drafted token
BANDS = (0.0, 0.5, 0.8, 0.95)


def band(q: float) -> int:
    return max(i for i, lo in enumerate(BANDS) if q >= lo)


def band_name(i: int) -> str:
    hi = BANDS[i + 1] if i + 1 < len(BANDS) else 1.0
    return f"{BANDS[i]:.2f}–{hi:.2f}"


def tally(runs: list[str], n: int, tokenizer=None) -> tuple[dict, dict]:
    """(totals, per category): (band, copy) → [kept, tested]. `tokenizer`: the one to read prompts with (default: each
    lane's target's, app.engines.registry.load_tokenizer)."""
    from app.core.events import StepEvent
    from app.core.setups import parse_setup
    from app.engines.registry import load_tokenizer, resolve
    from app.worker.runfile import load

    totals: dict = defaultdict(lambda: [0, 0])
    per_cat: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    tokenizers: dict = {}
    for path in runs:
        rec = load(path)
        if rec.plan.sampling.temperature:
            raise SpecDeckError(f"{path} is a sampled run: its drafts are not the greedy ones this reads")
        prompts = {p.id: p for p in rec.plan.prompts}
        steps: dict = defaultdict(list)
        for _, ev in rec.events:
            if isinstance(ev, StepEvent):
                steps[ev.lane_id].append(ev)
        for spec in rec.plan.lanes:
            if spec.lane_id.startswith("warm") or not spec.setup.startswith(("draft:", "hf-assisted:")):
                continue
            target = parse_setup(spec.setup).target or rec.plan.target  # a lane's @target, else the run's
            if target not in tokenizers:
                tokenizers[target] = tokenizer if tokenizer is not None else load_tokenizer(resolve(target))
            prompt = prompts[spec.prompt_id]
            ids = list(tokenizers[target].encode(prompt.prompt, add_special_tokens=False))
            grams = {tuple(ids[i:i + n + 1]) for i in range(len(ids) - n)}
            answer: list[int] = []
            for ev in steps[spec.lane_id]:
                drafted, qs = list(ev.drafted_ids or ()), list(ev.draft_probs or ())
                before = ids + answer
                for i, (tok, q) in enumerate(zip(drafted, qs, strict=False)):
                    if i > ev.accepted_count:
                        break  # not tested
                    ctx = before + drafted[:i]
                    key = (band(q), len(ctx) >= n and (*ctx[-n:], tok) in grams)
                    kept = int(i < ev.accepted_count)
                    for t in (totals[key], per_cat[prompt.category or spec.prompt_id][key]):
                        t[0] += kept
                        t[1] += 1
                answer += list(ev.emitted_ids)
    return totals, per_cat


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run files (bench --record) of greedy runs with draft-model lanes")
    ap.add_argument("--n", type=int, default=2, help="tokens of context a copied token must continue (default 2)")
    args = ap.parse_args(argv)
    try:
        totals, per_cat = tally(args.runs, args.n)
    except (SpecDeckError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"drafted tokens the target tested, by confidence; copy: the {args.n} tokens before it and it occur in the prompt")
    print(f"{'confidence':11} {'not copy: kept/tested':>24} {'copy: kept/tested':>20}")
    for b in range(len(BANDS)):
        cells = []
        for copy in (False, True):
            k, t = totals[(b, copy)]
            cells.append(f"{k}/{t} = {k / t:.2f}" if t else "–")
        print(f"{band_name(b):11} {cells[0]:>24} {cells[1]:>20}")
    print("\nper category, confidence below 0.80 (not copy | copy)")
    for cat, st in per_cat.items():
        parts = [f"{band_name(b)}: {st[(b, False)][0]}/{st[(b, False)][1]} | {st[(b, True)][0]}/{st[(b, True)][1]}" for b in (0, 1)]
        print(f"{cat:14} " + "   ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
