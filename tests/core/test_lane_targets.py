"""Lanes on their own target (`…@<engine>`): the grammar, the pairing of each lane with the baseline of its own
target, the reference lane's first divergence, and the run plan's loading of the other targets."""

from __future__ import annotations

import pytest

from app.core.errors import SetupError
from app.core.metrics import LaneStats, baseline_of, is_baseline, setup_target, summarize
from app.core.prompts import Prompt
from app.core.report import attach_baseline, build_report
from app.core.setups import Sampling, parse_setup
from app.worker.plan import RunPlan

LC = "llamacpp-qwen2.5-coder-1.5b-instruct"


def _st(setup: str, ids, wall: float, prompt: str = "p") -> LaneStats:
    ids = tuple(ids)
    return LaneStats(setup, prompt, 0, len(ids), wall, wall / 10, wall / 10, len(ids), 0, 0, 0, 0.0, wall, ids, "")


@pytest.mark.parametrize("text, label, target", [
    ("baseline", "baseline", None),
    (f"baseline@{LC}", f"baseline@{LC}", LC),
    (f"draft:llamacpp-qwen2.5-coder-0.5b-instruct,k=4@{LC}", f"draft:llamacpp-qwen2.5-coder-0.5b-instruct,k=4@{LC}", LC),
    (f"ngram:k=4 @ {LC}", f"ngram:n=3,k=4@{LC}", LC),
    (f"llamacpp-lookup@{LC}", f"llamacpp-lookup:k=10@{LC}", LC),
])
def test_target_suffix_round_trips(text, label, target):
    s = parse_setup(text)
    assert s.label == label and s.target == target and parse_setup(s.label) == s
    assert setup_target(label) == target and baseline_of(label) == (f"baseline@{target}" if target else "baseline")


@pytest.mark.parametrize("text, why", [
    ("trtllm:engine@x", "runs its own engine"),
    ("baseline@", "followed by a target engine name"),
    ("@x", "empty"),
    ("draft:a@b,k=4", "followed by a target engine name"),
])
def test_bad_targets_are_refused(text, why):
    with pytest.raises(SetupError, match=why):
        parse_setup(text)


def test_each_lane_is_measured_against_its_own_targets_baseline_and_the_reference():
    """Speedup and identity come from the baseline of the lane's own target; reference_divergence from the
    chosen reference lane (here the PyTorch baseline) for every lane, across targets."""
    runs = [
        _st("baseline", [1, 2, 3, 4], 4.0),
        _st("ngram", [1, 2, 3, 4], 2.0),
        _st(f"baseline@{LC}", [1, 2, 9, 9], 1.0),
        _st(f"ngram@{LC}", [1, 2, 9, 8], 0.5),
    ]
    out = {r.setup: r for r in attach_baseline(runs, "baseline")}
    assert out["ngram"].speedup == 2.0 and out["ngram"].identical_to_baseline
    assert out[f"ngram@{LC}"].speedup == 2.0 and out[f"ngram@{LC}"].first_divergence == 3  # vs the llama.cpp baseline
    assert out[f"baseline@{LC}"].speedup == 1.0 and out[f"baseline@{LC}"].reference_divergence == 2  # vs PyTorch's
    assert out[f"ngram@{LC}"].reference_divergence == 2 and out["ngram"].reference_divergence is None
    assert out["baseline"].reference_divergence is None
    summ = {s.setup: s for s in summarize(list(out.values()))}
    assert summ[f"ngram@{LC}"].speedup == 2.0 and summ[f"baseline@{LC}"].theoretical_speedup == 1.0
    assert is_baseline(f"baseline@{LC}") and not is_baseline(f"ngram@{LC}")
    doc = build_report("qwen2.5-coder-1.5b-instruct", "cpu", "float32", runs, reference="baseline")
    assert doc["reference"] == "baseline" and doc["targets"] == ["qwen2.5-coder-1.5b-instruct", LC]


def test_the_plan_loads_other_targets_with_their_drafts():
    plan = RunPlan("qwen2.5-coder-1.5b-instruct",
                   ("baseline", "draft:qwen2.5-coder-0.5b-instruct,k=4", f"baseline@{LC}", f"draft:llamacpp-qwen2.5-coder-0.5b-instruct,k=4@{LC}"),
                   (Prompt("p", "hi"),), Sampling(max_new_tokens=8))
    assert plan.drafts == (("qwen2.5-coder-0.5b-instruct", None),)
    assert plan.other_targets == ((LC, (("llamacpp-qwen2.5-coder-0.5b-instruct", None),)),)
    cmd = plan.load_command()
    assert cmd.target == "qwen2.5-coder-1.5b-instruct" and cmd.others == plan.other_targets
    assert plan.report_reference == "baseline"  # several targets: the run's baseline is the reference
    assert cmd.profile  # the draft lanes' theory: the cost profiles are loaded with the engines
    # transformers' reference lanes are priced too (their steps are read); llama-cpp-python's lookup is not
    assert RunPlan("t", ("baseline", "hf-assisted:d"), (Prompt("p", "hi"),), Sampling()).load_command().profile
    assert not RunPlan("t", ("baseline", "llamacpp-lookup"), (Prompt("p", "hi"),), Sampling()).load_command().profile
    with pytest.raises(SetupError, match="is not one of the run's setups"):
        RunPlan("t", ("baseline",), (Prompt("p", "hi"),), Sampling(), reference="ngram")


def test_category_speedups_use_each_lanes_own_baseline():
    """The per-category table divides by the baseline of the lane's own target, like the main table (it once
    divided every lane by the run's baseline, showing llama.cpp lanes 3-4x "faster" than their own baseline)."""
    from app.core.report_text import render_categories

    runs = [_st("baseline", [1], 4.0, "a"), _st("baseline", [1], 4.0, "b"), _st(f"baseline@{LC}", [1], 1.0, "a"),
            _st(f"baseline@{LC}", [1], 1.0, "b"), _st(f"ngram@{LC}", [1], 2.0, "a"), _st(f"ngram@{LC}", [1], 0.5, "b")]
    doc = build_report("t", "cpu", "float32", runs, extra={"categories": {"a": "coding", "b": "qa"}})
    rows = {line.split()[0]: line.split()[1:] for line in render_categories(doc).splitlines()[2:]}
    assert rows[f"baseline@{LC}"] == ["1.00x", "1.00x"] and rows[f"ngram@{LC}"] == ["0.50x", "2.00x"]


def test_lanes_on_a_target_of_another_tokenizer_are_not_compared_by_token_id():
    """A run with SmolLM2 as target and the Qwen llama.cpp engine beside it: ids of two vocabularies are never
    compared (no `ref @0`); the table says so."""
    from app.core.report_text import render_summary

    plan = RunPlan("smollm2-135m-instruct", ("baseline", f"baseline@{LC}"), (Prompt("p", "hi"),), Sampling(max_new_tokens=4))
    assert plan.report_reference == "baseline"
    assert not plan.same_tokenizer(f"baseline@{LC}", "baseline") and plan.same_tokenizer("baseline", "baseline")
    runs = [_st("baseline", (1, 2, 3, 4), 1.0), _st(f"baseline@{LC}", (9, 9, 9, 9), 1.0)]
    out = {r.setup: r for r in attach_baseline(runs, "baseline", plan.same_tokenizer)}
    assert out[f"baseline@{LC}"].reference_divergence is None and out[f"baseline@{LC}"].reference_comparable is False
    doc = build_report("smollm2-135m-instruct", "cpu", "float32", runs, reference="baseline", comparable=plan.same_tokenizer)
    row = next(r for r in doc["runs"] if r["setup"] == f"baseline@{LC}")
    assert row["reference_comparable"] is False
    assert "ref: other tokenizer" in render_summary(doc) and "ref @0" not in render_summary(doc)


def test_a_target_that_runs_in_another_environment_is_refused_with_the_lanes_to_use(tmp_path):
    """The run's target loads in SpecDeck's own worker: a manifest naming another interpreter cannot be it (it used
    to be loaded here anyway, its `python` ignored)."""
    import sys

    from app.engines.registry import REPO_ENGINES

    other = getattr(sys, "_base_executable", sys.executable)
    if other == sys.executable:
        pytest.skip("no second interpreter (not running in a virtual environment)")
    text = (REPO_ENGINES / "smollm2-135m-instruct.toml").read_text()
    m = tmp_path / "elsewhere.toml"
    m.write_text(f'python = "{other}"\n' + text)
    with pytest.raises(SetupError, match="runs in another Python environment") as ei:
        RunPlan(str(m), ("baseline",), (Prompt("p", "hi"),), Sampling(max_new_tokens=4))
    assert f"baseline@{m}" in str(ei.value)
