"""One forward over n = 1 … 8 tokens, raw: the medians the cost profile smooths away.

`python -m app profile` replaces the narrow points (n ≤ 8) by their line unless their rounds put them off it beyond
noise (app.speculative.costs.smooth). This prints the medians before any of that, each over the one-token forward,
so that a machine where a wider forward costs less (a GEMM kernel slower for 2 rows than for 5) shows it, and the
profile's `medians_s` can be checked against it.

    python resources/bench/narrow_forwards.py --engine qwen2.5-coder-1.5b-instruct --reps 15

Prints the CPU it ran on; the figures of a run live in resources/bench/README.md with the command.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    from app.core.costs import machine_summary
    from app.engines.hf import HFEngine
    from app.engines.registry import resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="qwen2.5-coder-1.5b-instruct", help="an hf engine")
    ap.add_argument("--reps", type=int, default=15, help="timed rounds (n in turn, ascending then descending)")
    ap.add_argument("--context", type=int, default=128, help="tokens of context before each timed forward")
    ap.add_argument("--max-n", type=int, default=8)
    args = ap.parse_args()
    print(f"machine: {machine_summary()}", flush=True)
    e = HFEngine(resolve(args.engine))
    ids = e.encode_prompt("def is_palindrome(s):\n    return s == s[::-1]\n" * 64, chat=False)[: args.context + args.max_n]
    ns = list(range(1, args.max_n + 1))
    st = e.new_state()
    st.forward(ids[: args.context], last_only=True)
    base = st.length
    times: dict[int, list[float]] = {n: [] for n in ns}
    for r in range(args.reps + 1):
        for n in ns if r % 2 == 0 else reversed(ns):
            t0 = time.perf_counter()
            st.forward(ids[args.context : args.context + n], keep=n)
            dt = time.perf_counter() - t0
            st.crop(base)
            if r:  # round 0 warms up
                times[n].append(dt)
    med = {n: statistics.median(v) for n, v in times.items()}
    print(f"{args.engine}: one forward over n tokens after {args.context} of context, median of {args.reps} rounds")
    print(f"{'n':>3} {'ms':>8} {'÷ T(1)':>7}")
    for n in ns:
        print(f"{n:>3} {1000 * med[n]:>8.1f} {med[n] / med[1]:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
