"""How much a draft's next-token distribution depends on how its tokens were fed: one per forward, or several.

A speculative lane feeds its draft the tokens it has not seen: one after a rejected draft (the target's correction),
two after a fully kept proposal (the last draft and the target's bonus token), so the step boundaries a lane's rule
chooses decide the draft's forward widths. With greedy decoding the draft's token at a position should depend only
on the prefix; this measures how far that holds. The draft (an engine of `python -m app engines`, loaded as a lane
loads it) first answers the prompt greedily, one token per forward; then the same answer is fed again with
forwards of 1, of 2, and of 1, 2, 3 tokens in turn, and each position's next-token distribution is compared with the
one-at-a-time feeding: how many greedy tokens differ, the mean and largest total variation (TV), and the largest
change of the top token's probability q.

`--per-row` also runs the int8 draft with each dynamically quantized layer's activations scaled per row (every row
to max |x| = 1, one extra row holding −1 and +1 so fbgemm's per-tensor range is always [−1, 1], the output rows
scaled back): each layer's output row then depends on that row alone (checked, exact), so what is left is the rest
of the forward — fp32 kernels whose rounding differs with the forward's width, which int8 rounding then amplifies.

    python resources/bench/draft_feeding.py --engine qwen2.5-coder-0.5b-instruct --prompt-id rag-3 --per-row

Prints the CPU; figures: resources/bench/README.md, "Where two lanes of one draft part".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

FEEDINGS = {"pairs": (2,), "1,2,3": (1, 2, 3)}


def _per_row(model) -> int:
    """Wrap every dynamically quantized linear of `model` so its activations are quantized per row (see the module
    doc); returns how many were wrapped."""
    import torch
    import torch.ao.nn.quantized.dynamic as nnqd

    class RowScaled(torch.nn.Module):
        def __init__(self, q: nnqd.Linear) -> None:
            super().__init__()
            self.q, self.b = q, q.bias()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            rows = x.reshape(-1, x.shape[-1])
            s = rows.abs().amax(-1, keepdim=True).clamp_min(1e-12)
            edge = torch.zeros(1, x.shape[-1], dtype=x.dtype)
            edge[0, 0], edge[0, 1] = -1.0, 1.0
            y = self.q(torch.cat([rows / s, edge]))[:-1]
            y = (y - self.b) * s + self.b if self.b is not None else y * s
            return y.reshape(*x.shape[:-1], -1)

    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nnqd.Linear):
                setattr(parent, name, RowScaled(child))
                n += 1
    return n


def feed(e, ids: list[int], tokens: int, widths: tuple[int, ...], answer: list[int] | None = None) -> tuple[list[int], list]:
    """The prompt `ids` read as a lane reads it (all but its last token), then the answer fed `widths` tokens per
    forward in turn (greedy from the draft itself, one token per forward, when `answer` is None): the answer and
    each position's next-token distribution."""
    st = e.new_state()
    st.forward(ids[:-1], last_only=True)
    seq, dists, i, pos = [ids[-1]], [], 0, 0
    if answer is None:
        while len(seq) <= tokens:
            p = st.forward([seq[-1]], last_only=True)[-1].softmax(-1)
            dists.append(p)
            seq.append(int(p.argmax()))
        return seq[1:], dists
    seq += answer
    while pos < len(seq):
        chunk = seq[pos : pos + widths[i % len(widths)]]
        dists.extend(st.forward(chunk).softmax(-1))
        pos, i = pos + len(chunk), i + 1
    return answer, dists[: len(answer)]


def main() -> int:
    from app.core.costs import machine_summary
    from app.core.prompts import load_jsonl
    from app.engines.registry import open_engine, resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="qwen2.5-coder-0.5b-instruct", help="an hf engine (the draft)")
    ap.add_argument("--prompts", default=str(ROOT / "resources" / "suites" / "specbench.jsonl"))
    ap.add_argument("--prompt-id", default="rag-3")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--dtypes", default="int8,float32")
    ap.add_argument("--per-row", action="store_true", help="also the int8 draft with per-row activation scales")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    prompt = next((p for p in load_jsonl(args.prompts) if p.id == args.prompt_id), None)
    if prompt is None:
        ap.error(f"no prompt {args.prompt_id!r} in {args.prompts}")
    print(f"machine: {machine_summary()}; {args.engine} on {args.prompt_id}, {args.tokens} tokens", flush=True)
    out = []
    for dtype in args.dtypes.split(","):
        e = open_engine(resolve(args.engine), device="cpu", dtype=dtype)
        ids = e.encode_prompt(prompt.prompt, chat=True)

        variants = [(dtype, None)]
        if args.per_row and dtype == "int8":
            variants.append(("int8, per-row activations", _per_row))
        for name, change in variants:
            if change is not None:
                print(f"{name}: {change(e.model)} layers wrapped", flush=True)
            answer, ref = feed(e, ids, args.tokens, (1,))
            for label, widths in FEEDINGS.items():
                _, got = feed(e, ids, args.tokens, widths, answer)
                tv = [float(0.5 * (a - b).abs().sum()) for a, b in zip(ref, got, strict=True)]
                flips = sum(int(a.argmax()) != int(b.argmax()) for a, b in zip(ref, got, strict=True))
                dq = max(abs(float(a.max()) - float(b[int(a.argmax())])) for a, b in zip(ref, got, strict=True))
                row = dict(draft=name, feeding=label, positions=len(tv), greedy_differs=flips, mean_tv=sum(tv) / len(tv),
                           max_tv=max(tv), max_top_q_change=dq)
                out.append(row)
                print(f"{name:<26} one at a time vs {label:<6}: greedy token differs at {flips}/{len(tv)} positions; "
                      f"TV mean {row['mean_tv']:.2e}, max {row['max_tv']:.2e}; top token's q moves up to {dq:.3f}", flush=True)
        del e
    if args.json:
        Path(args.json).write_text(json.dumps(dict(machine=machine_summary(), engine=args.engine, prompt=args.prompt_id,
                                                   tokens=args.tokens, rows=out), indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
