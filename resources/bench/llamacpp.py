"""llama.cpp in SpecDeck: our baseline lane against llama-cpp-python's own generation, then the lanes side by side.

Part 1 (overhead): on the same GGUF, prompt and token count, alternating for `--rounds` rounds,
    llama-cpp-python  `Llama.generate(prompt_ids, temp=0)` for N tokens (its own loop, logits of the last position)
    SpecDeck          our loop's baseline lane on a LlamaCppEngine (app.speculative.loop.run_lane, no worker)
and prints tokens/s (median and every round) and the ratio SpecDeck / llama-cpp-python.

Part 2 (lanes): `python -m app bench` with PyTorch and llama.cpp lanes of the same model side by side (each
speedup against the baseline of its own target; the PyTorch baseline is the reference for first divergence).

    python resources/bench/llamacpp.py --pair qwen --tokens 96 --rounds 3
    python resources/bench/llamacpp.py --pair smollm2 --skip-lanes
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.core.costs import machine_summary  # noqa: E402 (after the path)

PROMPTS = {
    "palindrome": "Complete this Python function that checks whether a string is a palindrome, ignoring case and "
                  "non-alphanumeric characters:\n\ndef is_palindrome(s: str) -> bool:\n",
    "rename": "Rename the variable x to total everywhere in this code and return the whole code:\n\n"
              "def f(items):\n    x = 0\n    for i in items:\n        x += i\n    print(x)\n    return x\n",
}
PAIRS = {
    "qwen": ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"),
    "smollm2": ("smollm2-135m-instruct", "smollm2-135m-instruct"),
}


def overhead(target: str, tokens: int, rounds: int) -> None:
    from app.core.setups import Sampling
    from app.engines.llamacpp import LlamaCppEngine
    from app.engines.registry import resolve
    from app.speculative.loop import run_lane

    eng = LlamaCppEngine(resolve(f"llamacpp-{target}"))
    print(f"\n== overhead: llamacpp-{target} ({eng.dtype}, {eng.n_threads} threads), {tokens} tokens, greedy ==")
    for name, text in PROMPTS.items():
        ids = eng.encode_prompt(text)
        own, ours = [], []
        for r in range(rounds):
            for which in (("own", "ours") if r % 2 == 0 else ("ours", "own")):
                if which == "own":
                    llm = eng.llm
                    llm.reset()
                    t0, n = time.perf_counter(), 0
                    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
                        n += 1
                        if n == tokens or tok in eng.eos_ids:
                            break
                    own.append(n / (time.perf_counter() - t0))
                else:
                    t0 = time.perf_counter()
                    *_, done = run_lane(eng, None, ids, Sampling(max_new_tokens=tokens))
                    ours.append(done.stats.new_tokens / (time.perf_counter() - t0))
        a, b = statistics.median(own), statistics.median(ours)
        print(f"{name:11s} llama-cpp-python {a:7.2f} tok/s {[round(x, 1) for x in own]}   SpecDeck baseline {b:7.2f} tok/s "
              f"{[round(x, 1) for x in ours]}   ratio {b / a:.3f}")


def lanes(target: str, draft: str, tokens: int, k: int) -> None:
    lc_t, lc_d = f"llamacpp-{target}", f"llamacpp-{draft}"
    setups = [f"draft:{draft},k=24,cstop=0.5,dtype=int8", f"baseline@{lc_t}", f"draft:{lc_d},k={k}@{lc_t}",
              f"draft:{lc_d},k=8,cstop=0.5@{lc_t}", f"ngram@{lc_t}", f"llamacpp-lookup@{lc_t}"]
    cmd = [sys.executable, "-m", "app", "bench", "--target", target, *sum((["--setup", s] for s in setups), []),
           *sum((["--prompt", p] for p in PROMPTS.values()), []), "--max-new-tokens", str(tokens), "--mode", "interleaved", "--quiet"]
    print(f"\n== lanes: {' '.join(cmd[3:])}")
    subprocess.run(cmd, cwd=ROOT, check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=sorted(PAIRS), default="qwen")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4, help="draft length of the llama.cpp draft lane")
    ap.add_argument("--skip-lanes", action="store_true")
    args = ap.parse_args()
    print(f"CPU: {machine_summary()}")
    target, draft = PAIRS[args.pair]
    overhead(target, args.tokens, args.rounds)
    if not args.skip_lanes:
        lanes(target, draft, args.tokens, args.k)


if __name__ == "__main__":
    main()
