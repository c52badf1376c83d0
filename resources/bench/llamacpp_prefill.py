"""How much llama.cpp's prompt forward moves on its own: the same prompts read again and again by one context.

One process, one llama.cpp context of the target (LlamaCppDecodeState, as a lane has), nothing else running: for
`--rounds` rounds, each prompt (chat template applied) is read in one forward over all but its last token after the
cache is cleared, then `--decode` one-token forwards follow. Prints, per round, each prompt's forward in ms and the
mean one-token forward, then each prompt's spread (slowest ÷ fastest round).

It is what a bench's ratio between two lanes that read the same prompt (k=auto on llama.cpp, which drafts nothing,
against the baseline) is up against when each prompt runs once: resources/bench/README.md, "k=auto on llama.cpp,
three repeats".

    python resources/bench/llamacpp_prefill.py --prompts resources/bench/specbench-first-per-category.jsonl --rounds 4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from app.core.costs import machine_summary
    from app.core.prompts import load_jsonl
    from app.engines.registry import open_engine, resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="llamacpp-qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--prompts", default=str(ROOT / "resources/bench/specbench-first-per-category.jsonl"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--decode", type=int, default=8, help="one-token forwards after each prompt")
    ap.add_argument("--threads", type=int, help="threads per forward (default: the engine's)")
    args = ap.parse_args()

    print(f"machine: {machine_summary()}", flush=True)
    eng = open_engine(resolve(args.engine))
    if args.threads:
        eng.lane_params.n_threads = eng.lane_params.n_threads_batch = args.threads
    prompts = load_jsonl(args.prompts)
    ids = [eng.tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}]) for p in prompts]
    print(f"{args.engine} ({eng.dtype}), {eng.lane_params.n_threads_batch} thread(s); prompt tokens: "
          + " ".join(f"{p.id}:{len(i)}" for p, i in zip(prompts, ids, strict=True)), flush=True)
    state = eng.new_state()
    reads: list[list[float]] = []
    try:
        for r in range(args.rounds):
            row, steps = [], []
            for i in ids:
                state.crop(0)
                t0 = time.perf_counter()
                state.forward(i[:-1], last_only=True)
                row.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for _ in range(args.decode):
                    state.forward([i[-1]], last_only=True)
                steps.append((time.perf_counter() - t0) / max(1, args.decode))
            reads.append(row)
            print(f"round {r + 1}: prompt forwards (ms) " + " ".join(f"{t * 1e3:.0f}" for t in row)
                  + f"; one-token forward {sum(steps) / len(steps) * 1e3:.1f} ms", flush=True)
    finally:
        state.close()
    print("spread per prompt (slowest ÷ fastest round): "
          + " ".join(f"{p.id}:{max(col) / min(col):.2f}" for p, col in zip(prompts, zip(*reads, strict=True), strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
