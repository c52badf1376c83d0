"""Prometheus text exposition as SpecDeck reads it (app.telemetry.prometheus): literal pages in, samples out."""

from __future__ import annotations

import math

import pytest

from app.telemetry.prometheus import SPEC_COUNTERS, MetricsError, metric_sum, parse_metrics

# The shapes a real /metrics page has (a vLLM server's, abridged): HELP/TYPE lines, a label value with an escaped
# quote and backslash, a histogram's _bucket/_sum/_count series with a +Inf bucket, NaN, a timestamp, counters with
# and without the _total suffix in their TYPE line.
VLLM_PAGE = r"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 1.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 12.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 3.0
# HELP vllm:spec_decode_num_draft_tokens Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens{engine="0",model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 48.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 30 1733011200000
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.01",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.75
vllm:time_to_first_token_seconds_count{model_name="m"} 5.0
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="m"} NaN
# HELP process_info A label with "quotes", a backslash and a newline escaped.
# TYPE process_info gauge
process_info{cmd="vllm serve \"Qwen\" C:\\models\nnext",version="0.11"} 1
"""


def test_a_real_world_page_parses():
    samples = parse_metrics(VLLM_PAGE)
    by_name = {}
    for name, labels, value in samples:
        by_name.setdefault(name, []).append((labels, value))
    assert by_name["vllm:num_requests_running"] == [({"engine": "0", "model_name": "Qwen/Qwen2.5-Coder-1.5B-Instruct"}, 1.0)]
    assert [(ls["le"], v) for ls, v in by_name["vllm:time_to_first_token_seconds_bucket"]] == [("0.01", 0.0), ("0.1", 4.0), ("+Inf", 5.0)]
    assert by_name["vllm:time_to_first_token_seconds_sum"] == [({"model_name": "m"}, 0.75)]
    assert by_name["vllm:time_to_first_token_seconds_count"] == [({"model_name": "m"}, 5.0)]
    assert math.isnan(by_name["vllm:gpu_prefix_cache_hit_rate"][0][1])
    assert by_name["process_info"] == [({"cmd": 'vllm serve "Qwen" C:\\models\nnext', "version": "0.11"}, 1.0)]
    assert all(type(v) is float for _, _, v in samples)  # integers in the text too
    # A counter's samples carry _total whether its TYPE line did or not; metric_sum finds them by either name.
    assert "vllm:spec_decode_num_draft_tokens_total" in by_name
    assert [metric_sum(samples, n) for n in SPEC_COUNTERS["vllm"]] == [15.0, 48.0, 30.0]
    assert metric_sum(samples, "vllm:spec_decode_num_draft_tokens") == 48.0
    assert metric_sum(samples, "vllm:spec_decode_num_drafts", engine="1") == 3.0
    assert metric_sum(samples, "vllm:gpu_prefix_cache_hit_rate") is None  # only NaN: no value
    assert metric_sum(samples, "vllm:num_requests_waiting") is None


def test_samples_without_help_or_type_lines_parse():
    assert parse_metrics("a 1\nb{x=\"y\"} 2.5\n\n# a comment\nc -Inf\n") == [("a", {}, 1.0), ("b", {"x": "y"}, 2.5), ("c", {}, -math.inf)]


@pytest.mark.parametrize("text", ["<html>nope</html>", '{"status": "ok"}', "OK", "x{a=1} 2", "# TYPE x nonsense\nx 1", "", "# HELP x only\n"])
def test_anything_else_is_a_metrics_error(text):
    with pytest.raises(MetricsError):
        parse_metrics(text)
