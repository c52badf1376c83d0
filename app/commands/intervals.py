"""How sure a measured speedup is: bootstrap intervals over prompts (the bench and tune commands' reports; the window's
reports carry none — scipy takes a second to import).

A run's speedup is a ratio of sums — Σ baseline wall / Σ setup wall over the prompts both ran. Its interval is a
percentile bootstrap (`scipy.stats.bootstrap`) that resamples prompts — the units, each prompt's repeats summed into
one pair — and recomputes the ratio of sums: how far the speedup could move over other prompts like these. Two
setups compared on the same prompts are paired (each prompt's two walls are resampled together), so what they share
(a prompt that is hard for both) cancels; where the paired interval holds 1, these prompts cannot tell them apart.

The interval describes these prompts as a sample of their kind, not a machine that was busier in one run than in
another (the bench warns of that from the lanes' CPU wait). Below MIN_UNITS prompts there is none (None): a bootstrap
of a handful of prompts only reshuffles them and reads far narrower than the truth (resources/bench/README.md,
"How sure").
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Interval", "ratio_interval", "walls_by_prompt", "speedup_intervals", "against_fastest", "MIN_UNITS", "LEVEL", "RESAMPLES"]

#: fewest prompts (units) an interval is given for
MIN_UNITS = 6
#: the intervals' confidence level
LEVEL = 0.9
#: bootstrap resamples (seeded: a report's intervals are the same every time it is rendered)
RESAMPLES = 4000


@dataclass(frozen=True)
class Interval:
    """A ratio of sums and its bootstrap interval over `units` prompts, at confidence `level`."""

    value: float
    lo: float
    hi: float
    units: int
    level: float = LEVEL

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    def to_json(self) -> dict:
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "units": self.units, "level": self.level}


def ratio_interval(num: Mapping[str, float], den: Mapping[str, float], level: float = LEVEL, resamples: int = RESAMPLES,
                   seed: int = 0) -> Interval | None:
    """Σ num / Σ den over the keys both have (prompt ids; each value a prompt's summed walls), with a percentile
    bootstrap interval that resamples those keys, num and den together.

    Speedup of a setup: num = the baseline's walls, den = the setup's. Setup A against setup B on the same prompts:
    num = B's walls, den = A's (> 1: A is faster).

    Returns:
        None when fewer than MIN_UNITS keys have a positive value on both sides.
    """
    keys = [k for k in num if k in den and num[k] > 0 and den[k] > 0]
    if len(keys) < MIN_UNITS:
        return None
    import numpy as np
    from scipy.stats import bootstrap

    n = np.array([num[k] for k in keys], dtype=float)
    d = np.array([den[k] for k in keys], dtype=float)
    value = float(n.sum() / d.sum())
    per = n / d
    if np.allclose(per, per[0], rtol=1e-12, atol=0.0):  # every prompt the same ratio: nothing to resample
        return Interval(value, value, value, len(keys), level)

    def stat(a, b, axis=-1):
        return a.sum(axis=axis) / b.sum(axis=axis)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's notes on few distinct resamples: the interval says as much
        res = bootstrap((n, d), stat, paired=True, vectorized=True, confidence_level=level, n_resamples=resamples,
                        method="percentile", rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Interval(value, min(lo, value), max(hi, value), len(keys), level)


def walls_by_prompt(doc: dict, setup: str) -> dict[str, float]:
    """A report's walls of one setup per prompt, repeats summed."""
    out: dict[str, float] = {}
    for r in doc.get("runs", ()):
        if r["setup"] == setup:
            out[r["prompt_id"]] = out.get(r["prompt_id"], 0.0) + float(r["wall_s"])
    return out


def speedup_intervals(doc: dict) -> dict[str, dict]:
    """setup → its speedup's interval (Interval.to_json) over the report's prompts, against the baseline of its own
    target; setups with fewer than MIN_UNITS prompts paired with that baseline are left out."""
    from app.core.metrics import baseline_of, is_baseline

    out: dict[str, dict] = {}
    for s in doc.get("summary", ()):
        name = s["setup"]
        if is_baseline(name):
            continue
        iv = ratio_interval(walls_by_prompt(doc, baseline_of(name)), walls_by_prompt(doc, name))
        if iv is not None:
            out[name] = iv.to_json()
    return out


def against_fastest(doc: dict) -> list[dict]:
    """Every setup of a report against the fastest on its target (the highest speedup of those with an interval),
    paired prompt by prompt: per target with two such setups or more, {"fastest": its name, "rows": one per other
    setup — `setup`, `ratio` (its speedup over the fastest's, < 1: slower; Interval.to_json), `faster` (prompts on
    which it was faster), `prompts`}. Where a ratio's interval contains 1, these prompts do not tell the two apart."""
    from app.core.metrics import baseline_of

    ivs = doc.get("speedup_intervals") or speedup_intervals(doc)
    groups: dict[str, list[str]] = {}
    for name in ivs:
        groups.setdefault(baseline_of(name), []).append(name)
    out = []
    for names in groups.values():
        fastest = max(names, key=lambda s: ivs[s]["value"])
        ref = walls_by_prompt(doc, fastest)
        rows = []
        for name in names:
            if name == fastest:
                continue
            mine = walls_by_prompt(doc, name)
            iv = ratio_interval(ref, mine)
            if iv is None:
                continue
            common = [p for p in mine if p in ref]
            rows.append(dict(setup=name, ratio=iv.to_json(), faster=sum(1 for p in common if mine[p] < ref[p]), prompts=len(common)))
        if rows:
            out.append(dict(fastest=fastest, rows=rows))
    return out
