"""The run report: one JSON schema for `bench`, the GUI export and saved runs (see DESIGN.md)."""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Sequence
from dataclasses import replace

from app.core.metrics import LaneStats, baseline_of, first_divergence, is_baseline, setup_target, summarize

__all__ = ["attach_baseline", "build_report", "RUN_KEYS"]

RUN_KEYS = (
    "setup",
    "prompt_id",
    "repeat",
    "new_tokens",
    "wall_s",
    "ttft_s",
    "tokens_per_s",
    "steps",
    "drafted",
    "accepted",
    "acceptance_rate",
    "mean_accepted_len",
    "output_ids",
    "output_text",
    "identical_to_baseline",
    "speedup",
)


def attach_baseline(runs: Sequence[LaneStats], reference: str | None = None) -> list[LaneStats]:
    """Fill identical_to_baseline / first_divergence / speedup of every run from the baseline run of its own
    target (`baseline` or `baseline@<target>`) on the same prompt and repeat, and — with `reference`, a setup
    label — reference_divergence from that setup's run (computed, never assumed)."""
    base = {(r.setup, r.prompt_id, r.repeat): r for r in runs if is_baseline(r.setup)}
    ref = {(r.prompt_id, r.repeat): r for r in runs if reference is not None and r.setup == reference}
    out = []
    for r in runs:
        b = base.get((baseline_of(r.setup), r.prompt_id, r.repeat))
        r = r.with_baseline(b) if b is not None else r
        x = ref.get((r.prompt_id, r.repeat))
        if x is not None and x is not r:
            r = replace(r, reference_divergence=first_divergence(r.output_ids, x.output_ids))
        out.append(r)
    return out


def _clean(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def build_report(
    target: str,
    device: str,
    dtype: str,
    runs: Sequence[LaneStats],
    *,
    sampling: dict | None = None,
    extra: dict | None = None,
    reference: str | None = None,
) -> dict:
    """The JSON document: {"target", "device", "dtype", "runs": [...], "summary": [...]} plus metadata.

    Each run carries the DESIGN.md keys first, then the extra measurements (prefill, draft/verify times,
    per-position acceptance, first divergence).
    """
    runs = attach_baseline(runs, reference)
    run_rows = []
    for r in runs:
        d = r.to_json()
        row = {k: d[k] for k in RUN_KEYS}
        row.update({k: v for k, v in d.items() if k not in row})
        run_rows.append(row)
    doc = {
        "target": target,
        "device": device,
        "dtype": dtype,
        "runs": run_rows,
        "summary": [s.to_json() for s in summarize(runs)],
        "sampling": sampling or {},
        "reference": reference,
        "targets": list(dict.fromkeys(setup_target(r.setup) or target for r in runs)),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "processor": platform.processor()},
    }
    if extra:
        doc.update(extra)
    return _clean(doc)
