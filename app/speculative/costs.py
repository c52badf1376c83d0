"""Measuring cost profiles: the time of one forward over n tokens, for an engine with step-by-step decode states.

A profile (app.core.costs.CostProfile) is measured once per engine, precision, device, weights and machine and
cached; `python -m app profile` and every bench with speculative lanes read it from the cache or measure it here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from app.core.costs import PROFILE_NS, CostProfile, load_profile, machine_key, machine_summary, save_profile
from app.core.cpuwait import CpuWait

__all__ = ["PROFILE_TEXT", "profile_key_parts", "profile_key", "profilable", "measure_profile", "smooth", "isotonic", "cached_or_measure"]

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


def measure_profile(
    engine,
    *,
    ns: Sequence[int] = PROFILE_NS,
    context_tokens: int = 128,
    reps: int | None = None,
    budget_s: float = 12.0,
    progress: ProgressFn | None = None,
) -> CostProfile:
    """Time one forward over n tokens (logits for every row, as verification needs) after `context_tokens` of
    context, for each n; the median of `reps` rounds after a warm-up round. Rounds alternate ascending and
    descending n so that a drift in machine speed does not bend the curve; the medians are then smoothed
    (:func:`smooth`), as V(n) divides by T(1) and one noisy point would tilt the whole curve.

    Args:
        engine: a loaded engine with `new_state()` (hf, llamacpp).
        ns: tokens per forward; must start at 1.
        context_tokens: context before the timed forwards (capped to fit the engine's context window).
        reps: timed rounds; None: as many as fit `budget_s` after the warm-up round (3 … 15).
        budget_s: seconds the timed rounds may take when `reps` is None.
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
    task = f"profile {engine.name} ({engine.dtype}): one forward over 1…{ns[-1]} tokens"
    n_rounds = 1 + (reps if reps is not None else 3)
    done = 0
    r = 0
    t_start = time.perf_counter()
    while r < n_rounds:
        if r == 1 and reps is None:  # the warm-up round tells what a round costs
            per_round = time.perf_counter() - t_start
            n_rounds = 1 + max(3, min(15, int(budget_s / max(per_round, 1e-6))))
        total = n_rounds * len(ns)
        order = ns if r % 2 == 0 else list(reversed(ns))
        for n in order:
            sync()
            t0 = time.perf_counter()
            state.forward(cont[:n], keep=n)
            sync()
            dt = time.perf_counter() - t0
            state.crop(base)
            if r > 0:  # round 0 warms up (oneDNN primitives, llama.cpp graphs)
                times[n].append(dt)
            done += 1
            progress(task, done, total, "forwards")
        r += 1
    p = profile_key_parts(engine)
    wall = time.perf_counter() - t_start
    waited = waits.read()
    return CostProfile(
        engine=p["engine"], backend=p["backend"], precision=p["precision"], device=p["device"], weights=p["weights"], machine=p["machine"],
        ns=tuple(ns),
        times_s=smooth([statistics.median(times[n]) for n in ns], ns),
        context_tokens=len(ctx),
        reps=n_rounds - 1,
        machine_text=machine_summary(),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        measure_s=round(wall, 2),
        cpu_wait_share=round(waited / wall, 4) if waited is not None and wall > 0 else None,
        spread=round(statistics.median(_spread(times[n]) for n in ns), 4),
    )


def _spread(xs: Sequence[float]) -> float:
    """Interquartile range over median of one n's rounds (0 for fewer than 4)."""
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    med = statistics.median(xs)
    return (q[2] - q[0]) / med if med > 0 else 0.0


def smooth(medians: Sequence[float], ns: Sequence[int], narrow: int = 8) -> tuple[float, ...]:
    """Medians of forward times → the profile's times: below `narrow` tokens a CPU forward costs a fixed part (the
    weights read) plus a per-token part, so those points are replaced by their robust line (T(1), the
    divisor of every V(n), then rests on several measurements instead of one); then the whole is made
    non-decreasing in n (:func:`isotonic`), as a wider forward never costs less."""
    xs = [float(n) for n in ns if n <= narrow]
    ys = list(medians[: len(xs)])
    out = list(medians)
    if len(xs) >= 3:  # Theil–Sen: the median of pairwise slopes, robust to an outlier among the points
        slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))]
        slope = max(0.0, statistics.median(slopes))
        icpt = statistics.median(y - slope * x for x, y in zip(xs, ys, strict=True))
        if icpt + slope > 0:
            out[: len(xs)] = [icpt + slope * x for x in xs]
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
