"""Measuring cost profiles: the time of one forward over n tokens, for an engine with step-by-step decode states.

A profile (app.core.costs.CostProfile) is measured once per engine, precision, device, weights and machine and
cached; `python -m app profile` and every bench with speculative lanes read it from the cache or measure it here.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

from app.core.costs import NARROW, PROFILE_NS, TREE_PROBE, CostProfile, load_profile, machine_key, machine_summary, save_profile
from app.core.cpuwait import CpuWait

__all__ = ["PROFILE_TEXT", "profile_key_parts", "profile_key", "profilable", "measure_profile", "smooth", "isotonic", "median_error", "round_plan", "NARROW", "NARROW_ROUNDS", "cached_or_measure"]

#: The context a profile's forwards follow (any text: only its length matters for the cost).
PROFILE_TEXT = (
    "Speculative decoding lets a small draft model propose several tokens which the large target model then "
    "verifies in a single forward pass. Whether this pays depends on what that wider forward costs: on a GPU "
    "verifying ten tokens costs about as much as decoding one, on a CPU it may cost several times more. "
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
)

ProgressFn = Callable[[str, float, float, str], None]


def profilable(engine) -> bool:
    """True for engines with step-by-step decode states (our loop runs on them): hf, llamacpp."""
    from app.engines.base import StepEngine

    return isinstance(engine, StepEngine)


def profile_key_parts(engine) -> dict[str, str]:
    """engine, backend, precision, device, weights and machine of a loaded engine (what a profile is cached by)."""
    weights = "?"
    m = getattr(engine, "manifest", None)
    if m is not None:
        try:
            from app.engines.cache import weights_key

            weights = weights_key(m)
        except Exception:  # a source that cannot be stat'ed: key on the name only
            weights = "?"
    return dict(engine=str(engine.name), backend=str(engine.backend), precision=str(engine.dtype), device=str(engine.device), weights=weights,
                machine=machine_key())


def profile_key(engine) -> str:
    p = profile_key_parts(engine)
    return f"{p['engine']}-{p['backend']}-{p['precision']}-{p['device']}-{p['weights']}-{p['machine']}"


#: rounds a narrow forward is timed at least (more than the wide ones when the budget allows: they are cheap, and
#: whether one is off its line is decided from its rounds' spread)
NARROW_ROUNDS = 11
#: a narrow forward keeps its own median where it is off the line by more than KEEP_Z standard errors of that median
#: and more than KEEP_REL of the line
KEEP_Z = 3.0
KEEP_REL = 0.03


def measure_profile(
    engine,
    *,
    ns: Sequence[int] = PROFILE_NS,
    context_tokens: int = 128,
    reps: int | None = None,
    budget_s: float = 12.0,
    narrow_reps: int | None = None,
    progress: ProgressFn | None = None,
) -> CostProfile:
    """Time one forward over n tokens (logits for every row, as verification needs) after `context_tokens` of
    context, for each n; the median of `reps` rounds after a warm-up round. Rounds alternate ascending and
    descending n so that a drift in machine speed does not bend the curve; the one-token forward is timed right after
    another (untimed) one, as a decode step follows a decode step. The forwards of at most NARROW tokens may get
    extra rounds of their own, spread evenly between the full ones (so that they sample the same stretch of the
    machine's drift as the wide forwards). The medians are then smoothed (:func:`smooth`), as V(n) divides by T(1)
    and one noisy point would tilt the whole curve; the profile keeps them too (`medians_s`).

    An engine with token trees (a state with `forward_tree`) also has the tree TREE_PROBE timed right after the causal
    forward of as many tokens, in every round that times it: the median of those ratios is the profile's `tree_ratio`
    (what a tree's attention mask, or llama.cpp's sequence ids, cost beyond the causal forward: 1.00 for the fp32 Qwen
    1.5B and both llama.cpp Q4_K_M Qwen, 1.01 for the 0.5B drafts, on a 2-core CPU after 128 tokens of context).

    Args:
        engine: a loaded engine with `new_state()` (hf, llamacpp).
        ns: tokens per forward; must start at 1.
        context_tokens: context before the timed forwards (capped to fit the engine's context window).
        reps: timed rounds; None: as many as fit `budget_s` after the warm-up round (3 … 15).
        budget_s: seconds the timed rounds may take when `reps` is None (and the narrow forwards' extra rounds).
        narrow_reps: timed rounds of the narrow forwards in all (None: NARROW_ROUNDS as `budget_s` allows when `reps`
            is None, else `reps`); never fewer than the full rounds.
        progress: `progress(task, done, total, unit)`.

    Returns:
        The CostProfile (not yet cached: see :func:`cached_or_measure`).
    """
    if not profilable(engine):
        raise TypeError(f"engine {engine.name} has no step-by-step decode states to profile")
    progress = progress or (lambda *a: None)
    ns = sorted(set(int(n) for n in ns))
    limit = engine.context_length
    if isinstance(limit, int) and limit > 0:
        context_tokens = max(1, min(context_tokens, limit - ns[-1] - 1))
    text_ids = engine.encode_prompt(PROFILE_TEXT, chat=False)
    ids = (text_ids * (1 + (context_tokens + ns[-1]) // max(1, len(text_ids))))[: context_tokens + ns[-1]]
    ctx, cont = ids[:context_tokens], ids[context_tokens:]
    sync = engine.sync
    waits = CpuWait()
    state = engine.new_state()
    state.forward(ctx, last_only=True)
    base = state.length
    times: dict[int, list[float]] = {n: [] for n in ns}
    probe = len(TREE_PROBE) if hasattr(state, "forward_tree") and len(TREE_PROBE) in ns else 0
    tree_parents = [base - 1 if p < 0 else base + p for p in TREE_PROBE]
    tree_ratios: list[float] = []  # per round: the tree forward's time over the causal one's just before it
    narrow = [n for n in ns if n <= NARROW]
    task = f"profile {engine.name} ({engine.dtype}): one forward over 1…{ns[-1]} tokens"
    n_rounds = 1 + (reps if reps is not None else 3)  # the warm-up round and the full rounds
    extra = max(0, narrow_reps - (n_rounds - 1)) if narrow_reps is not None else 0  # rounds of the narrow forwards only
    plan = round_plan(n_rounds - 1, extra)  # after the warm-up round: True for a full round
    done = 0
    r = 0
    t_start = time.perf_counter()
    narrow_s = 0.0  # the warm-up round's time in narrow forwards
    while r < n_rounds + extra:
        if r == 1 and reps is None:  # the warm-up round tells what a round costs
            per_round = time.perf_counter() - t_start
            n_rounds = 1 + max(3, min(15, int(budget_s / max(per_round, 1e-6))))
            want = NARROW_ROUNDS if narrow_reps is None else narrow_reps
            extra = max(0, min(want - (n_rounds - 1), int(budget_s / max(narrow_s, 1e-6))))
            plan = round_plan(n_rounds - 1, extra)
        total = n_rounds * len(ns) + extra * len(narrow)
        order = ns if r == 0 or plan[r - 1] else narrow
        for n in order if r % 2 == 0 else list(reversed(order)):
            if n == 1:  # as in decoding, a one-token forward after another (after a wider one: fp32 torch 5 % faster, llama.cpp 8 % slower here)
                state.forward(cont[:1], keep=1)
                state.crop(base)
            sync()
            t0 = time.perf_counter()
            state.forward(cont[:n], keep=n)
            sync()
            dt = time.perf_counter() - t0
            state.crop(base)
            if n == probe:  # the same tokens as a tree (round 0 warms its path up too)
                sync()
                t0 = time.perf_counter()
                state.forward_tree(cont[:n], tree_parents)
                sync()
                if r > 0:
                    tree_ratios.append((time.perf_counter() - t0) / dt)
                state.crop(base)
            if r > 0:  # round 0 warms up (oneDNN primitives, llama.cpp graphs)
                times[n].append(dt)
            elif n <= NARROW:
                narrow_s += dt
            done += 1
            progress(task, done, total, "forwards")
        r += 1
    p = profile_key_parts(engine)
    wall = time.perf_counter() - t_start
    waited = waits.read()
    medians = [statistics.median(times[n]) for n in ns]
    return CostProfile(
        engine=p["engine"], backend=p["backend"], precision=p["precision"], device=p["device"], weights=p["weights"], machine=p["machine"],
        ns=tuple(ns),
        times_s=smooth(medians, ns, rounds=[times[n] for n in ns]),
        medians_s=tuple(medians),
        context_tokens=len(ctx),
        reps=n_rounds - 1,
        machine_text=machine_summary(),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        measure_s=round(wall, 2),
        cpu_wait_share=round(waited / wall, 4) if waited is not None and wall > 0 else None,
        spread=round(statistics.median(_spread(times[n]) for n in ns), 4),
        tree_ratio=round(statistics.median(tree_ratios), 4) if tree_ratios else None,
    )


def round_plan(full: int, extra: int) -> list[bool]:
    """The timed rounds of a profile in order, True for a full round: `full` of them and `extra` rounds of the
    narrow forwards only, spread evenly between the full ones (Bresenham)."""
    total = full + extra
    return [(i + 1) * full // total > i * full // total for i in range(total)]


def _iqr(xs: Sequence[float]) -> float | None:
    """The interquartile range of these values; None for fewer than 4, whose spread says nothing."""
    if len(xs) < 4:
        return None
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def _spread(xs: Sequence[float]) -> float:
    """Interquartile range over median of one n's rounds (0 for fewer than 4)."""
    iqr, med = _iqr(xs), statistics.median(xs) if xs else 0.0
    return iqr / med if iqr is not None and med > 0 else 0.0


def median_error(xs: Sequence[float]) -> float:
    """The standard error of the median of these values (1.2533 σ / √r, σ from the interquartile range as for a
    normal spread); infinite for fewer than 4, whose spread says nothing."""
    iqr = _iqr(xs)
    return math.inf if iqr is None else 1.2533 * iqr / 1.349 / math.sqrt(len(xs))


def _off_the_line(rounds: Sequence[Sequence[float]], line: Sequence[float]) -> list[bool]:
    """Which narrow forwards are off their line beyond noise. Each round is first put on the rounds' common level
    (its narrow forwards' median over theirs across rounds), so that the machine's drift between rounds — which
    moves every n of a round together — is not read as noise; then n is off where the median of its rounds'
    relative deviations from the line exceeds KEEP_Z standard errors of that median and KEEP_REL."""
    r = min(len(x) for x in rounds)
    if r < 4:
        return [False] * len(line)
    level = [statistics.median(x[j] for x in rounds) for j in range(r)]
    common = statistics.median(level)
    out = []
    for x, ln in zip(rounds, line, strict=True):
        dev = [x[j] * common / level[j] / ln - 1.0 for j in range(r)]
        d = statistics.median(dev)
        out.append(abs(d) > KEEP_Z * median_error(dev) and abs(d) > KEEP_REL)
    return out


def smooth(medians: Sequence[float], ns: Sequence[int], narrow: int = NARROW,
           rounds: Sequence[Sequence[float]] | None = None) -> tuple[float, ...]:
    """Medians of forward times → the profile's times. Below `narrow` tokens a CPU forward costs a fixed part (the
    weights read) plus a per-token part, so those points are replaced by their robust line (T(1), the divisor of
    every V(n), then rests on several measurements instead of one) — except a point whose own rounds put it off
    the line beyond their noise (:func:`_off_the_line`), which keeps its median: a GEMM kernel can be slower for 2
    rows than for 5 (oneDNN on AVX-512: V(2) = 1.23, V(5) = 0.78, resources/bench/narrow_forwards.py), and a curve
    that hid it would misprice every short verify. From the last narrow point on, the curve is made non-decreasing
    (:func:`isotonic`): a wide forward's cost grows with its tokens, and its noise is smoothed.

    Args:
        medians: one median per n; ns: ascending, from 1; narrow: the widest forward smoothed by the line;
        rounds: each n's timed rounds, the narrow ones round by round alike (None: every narrow point takes the line)."""
    xs = [float(n) for n in ns if n <= narrow]
    ys = list(medians[: len(xs)])
    out = list(medians)
    if len(xs) >= 3:  # Theil–Sen: the median of pairwise slopes, robust to an outlier among the points
        slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))]
        slope = max(0.0, statistics.median(slopes))
        icpt = statistics.median(y - slope * x for x, y in zip(xs, ys, strict=True))
        if icpt + slope > 0:
            line = [icpt + slope * x for x in xs]
            keep = _off_the_line(rounds[: len(xs)], line) if rounds is not None else [False] * len(xs)
            out[: len(xs)] = [y if k else ln for y, ln, k in zip(ys, line, keep, strict=True)]
            if any(keep):
                start = len(xs) - 1
                return tuple(out[:start]) + isotonic(out[start:])
    return isotonic(out)


def isotonic(xs: Sequence[float]) -> tuple[float, ...]:
    """The closest non-decreasing sequence (least squares; pool-adjacent-violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for x in xs:
        blocks.append([x, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return tuple(m for m, c in blocks for _ in range(int(c)))


def cached_or_measure(engine, *, force: bool = False, progress: ProgressFn | None = None, **kw) -> tuple[CostProfile, bool]:
    """The engine's profile from the cache, or measured now (and cached). Returns (profile, measured_now).

    A measurement made under contention (CostProfile.contended: other processes took the CPU, or the rounds
    disagree) is used for this run, flagged, and not cached: the next run measures again, so a busy moment never
    becomes this machine's cost curve."""
    if not force:
        p = load_profile(profile_key(engine))
        if p is not None and not p.contended:
            return p, False
    p = measure_profile(engine, progress=progress, **kw)
    if not p.contended:
        save_profile(p)
    return p, True
