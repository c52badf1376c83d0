"""Reading Prometheus text exposition (the `/metrics` of vLLM, SGLang, llama-server, a DCGM exporter).

The text format is read by ``prometheus_client.parser`` (the Prometheus project's own Python client); this module
flattens its metric families into the (name, labels, value) samples SpecDeck looks up, and finds counters by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["MetricsError", "parse_metrics", "metric_sum", "SPEC_COUNTERS"]

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
    """(name, labels, value) of every sample, in the order of the text.

    Label values are unescaped (``\\"``, ``\\\\``, ``\\n``); values are floats (``NaN``, ``+Inf`` included);
    timestamps, HELP and TYPE lines are read and dropped. A histogram's or summary's series come out as their own
    samples (``x_bucket{le="…"}``, ``x_sum``, ``x_count``). A sample of a family typed ``counter`` is named with
    its ``_total`` suffix even where the text left it out (the OpenMetrics name; :func:`metric_sum` finds both).

    Raises:
        MetricsError: a line that is neither a comment nor a sample (an HTML page, JSON, …), or no sample at all.
    """
    try:
        out = [(s.name, dict(s.labels), float(s.value)) for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, IndexError) as e:  # the parser's way of saying "not this format"
        raise MetricsError(f"not Prometheus text: {str(e)[:120] or type(e).__name__}") from None
    if not out:
        raise MetricsError("no samples")
    return out


def metric_sum(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float | None:
    """The sum of a metric over its label sets (optionally filtered by labels), NaN samples left out; None when
    absent. Counters exposed with a `_total` suffix are also found by their bare name and the reverse."""
    names = {name, name[: -len("_total")] if name.endswith("_total") else name + "_total"}
    vals = [v for n, ls, v in samples if n in names and all(ls.get(k) == x for k, x in labels.items()) and not math.isnan(v)]
    return sum(vals) if vals else None
