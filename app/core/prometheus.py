"""Reading Prometheus text exposition (the `/metrics` of vLLM, SGLang, llama-server, a DCGM exporter).

Only what SpecDeck needs: samples `name{label="v",…} value [timestamp]`, comments skipped. Stdlib only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

__all__ = ["MetricsError", "parse_metrics", "metric_sum", "SPEC_COUNTERS"]

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

#: Speculative-decoding counters per server: (drafts, draft tokens, accepted tokens). Names from each server's
#: documentation (README, "Outgrowing one machine").
SPEC_COUNTERS: Mapping[str, tuple[str, str, str]] = {
    "vllm": ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"),
    "llama.cpp": ("llamacpp:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_draft_tokens_total",
                  "llamacpp:spec_decode_num_accepted_tokens_total"),
}


class MetricsError(ValueError):
    """The text is not Prometheus exposition format."""


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample.

    Raises:
        MetricsError: a line that is neither a comment nor a sample (an HTML page, JSON, …), or no sample at all.
    """
    out: list[tuple[str, dict[str, str], float]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise MetricsError(f"line {n} is not a Prometheus sample: {line[:80]!r}")
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(value)
        except ValueError:
            raise MetricsError(f"line {n}: value {value!r} is not a number") from None
        out.append((name, dict(_LABEL.findall(labels)), v))
    if not out:
        raise MetricsError("no samples")
    return out


def metric_sum(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float | None:
    """The sum of a metric over its label sets (optionally filtered by labels); None when absent. Counters exposed
    with a `_total` suffix are also found by their bare name and the reverse."""
    names = {name, name[: -len("_total")] if name.endswith("_total") else name + "_total"}
    vals = [v for n, ls, v in samples if n in names and all(ls.get(k) == x for k, x in labels.items()) and not math.isnan(v)]
    return sum(vals) if vals else None
