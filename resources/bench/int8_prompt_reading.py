"""How often an int8 draft's next token is the target's, with its prompt read per tensor or per token, beside fp32.

A draft reads its prompt in one forward (all but the last token), then drafts one token per forward. fbgemm's
dynamically quantized layers quantize a forward's activations with one scale for the whole forward, so in the
prompt's reading the first tokens, whose activations are tens of times the others' (the attention sink), set the
resolution of every token of the prompt, and the draft's cache of the prompt is coarse. `cpu_kernels.Int8Linear`
quantizes each token of a forward over more than 8 tokens on its own scale. This measures what that is worth
where it counts, in agreement with the target: the target answers each prompt greedily; each draft then reads the
prompt as a lane does and is fed the target's answer one token per forward, and a position agrees where the draft's
greedy token is the target's next one (what a greedy lane's draft would propose there, given the same prefix).
Three drafts in one process: int8 with the prompt read per token (the default), int8 per tensor
(SPECDECK_INT8_ACTIVATIONS=tensor when its layers are made, as before) and fp32. It also times each draft's reading
of every prompt, the three in turn (the median of `--reads`), which is all the change costs: a forward over 8 tokens
or fewer is fbgemm's call as it is. Prints the CPU.

    python resources/bench/int8_prompt_reading.py --suite specbench --json int8-prompt-reading.json

Figures: resources/bench/README.md, "The int8 draft's prompt reading".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_feeding import feed  # noqa: E402  (the prompt read as a lane reads it, then the answer fed `widths` a forward)

DRAFTS = (("int8, per token", "int8", "token"), ("int8, per tensor", "int8", "tensor"), ("fp32", "float32", "token"))


def agreement(draft, ids: list[int], answer: list[int]) -> int:
    """Positions of `answer` where the draft's greedy token, the prompt `ids` read as a lane reads it and the answer fed
    one token per forward (draft_feeding.feed), is the answer's."""
    _, dists = feed(draft, ids, len(answer), (1,), answer)
    return sum(int(d.argmax()) == t for d, t in zip(dists, answer, strict=True))


def read_s(draft, ids: list[int]) -> float:
    st = draft.new_state()
    t = time.perf_counter()
    st.forward(ids[:-1], last_only=True)
    return time.perf_counter() - t


def main() -> int:
    from app.core.costs import machine_summary
    from app.core.prompts import load_jsonl, load_suite
    from app.engines.registry import open_engine, resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct", help="an hf engine")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--suite", default="specbench")
    src.add_argument("--prompts", help="a prompts file (.jsonl)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--reads", type=int, default=3, help="timed readings of each prompt per draft")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    prompts = load_jsonl(args.prompts) if args.prompts else load_suite(args.suite)
    print(f"machine: {machine_summary()}; target {args.target}, draft {args.draft}; {len(prompts)} prompts, "
          f"{args.max_new_tokens} tokens", flush=True)
    target = open_engine(resolve(args.target), device="cpu", dtype="float32")
    answers = {}
    for p in prompts:
        ids = target.encode_prompt(p.prompt)
        st, out = target.new_state(), []
        logits = st.forward(ids, last_only=True)[-1]
        while len(out) < args.max_new_tokens:
            out.append(int(logits.argmax()))
            if out[-1] in target.eos_ids:
                break
            logits = st.forward([out[-1]], last_only=True)[-1]
        answers[p.id] = (ids, out)
        print(f"  target answered {p.id}: {len(out)} tokens", flush=True)
    del target

    drafts, loads = {}, {}
    before = os.environ.get("SPECDECK_INT8_ACTIVATIONS")
    try:
        for name, dtype, acts in DRAFTS:
            os.environ["SPECDECK_INT8_ACTIVATIONS"] = acts  # read as the int8 layers are made
            drafts[name] = open_engine(resolve(args.draft), device="cpu", dtype=dtype)
            e = drafts[name]
            loads[name] = dict(int8_layers=getattr(e, "int8_linears", 0), check_tv=getattr(e, "int8_tv", None))
    finally:
        if before is None:
            os.environ.pop("SPECDECK_INT8_ACTIVATIONS", None)
        else:
            os.environ["SPECDECK_INT8_ACTIVATIONS"] = before
    for name, info in loads.items():
        if info["int8_layers"]:
            print(f"{name}: {info['int8_layers']} int8 layers; the load-time check's TV from fp32 on its probe "
                  f"{info['check_tv']:.3f}", flush=True)
    if loads[DRAFTS[0][0]]["int8_layers"] != loads[DRAFTS[1][0]]["int8_layers"]:
        print("note: the two int8 drafts kept different layers in fp32 (each passed its own load-time check), so what "
              "follows compares their layers too, not only how their activations are quantized", flush=True)

    rows = []
    for p in prompts:
        ids, answer = answers[p.id]
        row = dict(id=p.id, category=p.category, prompt_tokens=len(ids), positions=len(answer))
        for name in drafts:
            row[name] = agreement(drafts[name], ids, answer)
        times = {name: [] for name in drafts}
        for _ in range(args.reads):
            for name, d in drafts.items():  # in turn, so that a drifting machine meets each alike
                times[name].append(read_s(d, ids))
        for name in drafts:
            row[f"{name} read_s"] = statistics.median(times[name])
        rows.append(row)
        print(f"  {p.id:<8} {len(ids):>4} prompt tokens: " + ", ".join(
            f"{name} {row[name]}/{len(answer)} (read {1e3 * row[f'{name} read_s']:.0f} ms)" for name in drafts), flush=True)

    def line(label: str, sel: list[dict]) -> dict:
        n = max(1, sum(r["positions"] for r in sel))  # an answer can be empty (the target's first token ended it)
        out = dict(rows=label, prompts=len(sel), positions=n)
        for name in drafts:
            out[name] = sum(r[name] for r in sel) / n
            out[f"{name} read_s"] = sum(r[f"{name} read_s"] for r in sel)
        return out

    cats = sorted({r["category"] for r in rows if r["category"]})
    table = [line(c, [r for r in rows if r["category"] == c]) for c in cats] + [line("all", rows)]
    names = list(drafts)
    print("\nthe draft's greedy token is the target's (share of positions); reading every prompt, in all (s)")
    print(f"{'prompts':<16}" + "".join(f"{n:>20}" for n in names) + f"{'per token − per tensor':>24}" + "".join(f"{'read ' + n:>24}" for n in names))
    for t in table:
        print(f"{t['rows']:<16}" + "".join(f"{t[n]:>20.3f}" for n in names) + f"{t[names[0]] - t[names[1]]:>+24.3f}"
              + "".join(f"{t[f'{n} read_s']:>24.2f}" for n in names))
    better = sum(r[names[0]] > r[names[1]] for r in rows)
    worse = sum(r[names[0]] < r[names[1]] for r in rows)
    print(f"per token against per tensor, prompt by prompt: more agreement on {better}, less on {worse}, "
          f"the same on {len(rows) - better - worse}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(machine=machine_summary(), target=args.target, draft=args.draft,
                                                   max_new_tokens=args.max_new_tokens, loads=loads, prompts=rows,
                                                   table=table), indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
