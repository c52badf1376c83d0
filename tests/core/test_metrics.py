from __future__ import annotations

import math
import pickle

import pytest

from app.core.events import StepEvent, TreeStep
from app.core.metrics import (
    DraftAt,
    LaneAccumulator,
    LaneStats,
    draft_differences,
    drafts_on_answer,
    first_divergence,
    summarize,
    theoretical_speedup,
)


def ev(step, drafted, a, target, emitted, kind, q=None):
    return StepEvent("l", step, tuple(drafted), a, target, kind, 0.01, 0.02, 0.03, tuple(emitted),
                     draft_probs=None if q is None else tuple(q))


def test_alpha_tau_per_position_match_a_hand_count():
    # step 0: prefill token; step 1: 4 drafted, 2 accepted + correction; step 2: 4 drafted, all + bonus;
    # step 3: 2 drafted, 0 accepted + correction
    events = [
        ev(0, [], 0, 5, [5], "baseline"),
        ev(1, [1, 2, 3, 4], 2, 9, [1, 2, 9], "correction"),
        ev(2, [5, 6, 7, 8], 4, 10, [5, 6, 7, 8, 10], "bonus"),
        ev(3, [1, 1], 0, 3, [3], "correction"),
    ]
    acc = LaneAccumulator()
    for e in events:
        acc.add(e)
    assert acc.drafted == 10 and acc.accepted == 6
    assert acc.acceptance_rate == pytest.approx(0.6)  # α = Σa/Σk
    assert acc.new_tokens == 10 and acc.steps == 4
    assert acc.mean_accepted_len == pytest.approx(2.5)  # τ = tokens / steps
    assert acc.per_position_drafted == [3, 3, 2, 2]
    assert acc.per_position_accepted == [2, 2, 1, 1]
    assert events[1].rejected_ids == (3, 4) and events[1].accepted_ids == (1, 2)


def test_drafts_on_answer_keeps_the_drafts_made_on_the_true_prefix():
    """The answer 5 1 2 9 5 6 7 8 10 3: each step's kept drafts and its first rejected one, at their answer positions;
    drafts past a rejection followed a wrong prefix and are left out, and a bonus position was never drafted."""
    steps = [ev(0, [], 0, 5, [5], "baseline"),
             ev(1, [1, 2, 3, 4], 2, 9, [1, 2, 9], "correction", q=[0.9, 0.8, 0.3, 0.2]),
             ev(2, [5, 6, 7, 8], 4, 10, [5, 6, 7, 8, 10], "bonus", q=[0.99, 0.9, 0.9, 0.7]),
             ev(3, [1], 0, 3, [3], "correction")]
    on = drafts_on_answer(steps)
    assert on == {1: DraftAt(1, 0.9, True), 2: DraftAt(2, 0.8, True), 3: DraftAt(3, 0.3, False), 4: DraftAt(5, 0.99, True),
                  5: DraftAt(6, 0.9, True), 6: DraftAt(7, 0.9, True), 7: DraftAt(8, 0.7, True), 9: DraftAt(1, None, False)}
    # a token tree, a library lane or a counts-only backend cannot say which tokens were drafted
    tree = StepEvent("l", 1, (1,), 1, 9, "bonus", 0, 0, 0, (1, 9), tree=TreeStep((1, 4), (-1, -1), (0,)), drafted_count=2)
    assert drafts_on_answer([steps[0], tree]) is None
    assert drafts_on_answer([ev(0, [], 0, 5, [5, 6], "library")]) is None
    counts_only = StepEvent("l", 1, (), 2, 9, "correction", 0, 0, 0, (1, 2, 9), drafted_count=4)
    assert drafts_on_answer([steps[0], counts_only]) is None


def test_draft_differences_finds_where_one_draft_proposed_other_tokens_on_the_same_prefix():
    """Two lanes of one draft with the same answer (5 6 7 8 10 11): at position 3 lane a's draft proposed 9 (rejected)
    where lane b's proposed 8 (kept), at position 4 the reverse — the draft's numerics, not the lanes' rules;
    positions only one lane drafted, and b's drafts past its rejection, are not compared."""
    a = [ev(0, [5, 6], 2, 7, [5, 6, 7], "bonus", q=[0.9, 0.8]),
         ev(1, [9], 0, 8, [8], "correction", q=[0.29]),
         ev(2, [10, 11], 2, None, [10, 11], "bonus", q=[0.7, 0.9])]
    b = [ev(0, [5], 1, 6, [5, 6], "bonus", q=[0.9]),
         ev(1, [7, 8, 12, 13], 2, 10, [7, 8, 10], "correction", q=[0.85, 0.25, 0.4, 0.5]),
         ev(2, [11], 1, None, [11], "bonus", q=[0.9])]
    shared, where = draft_differences(a, b)
    assert shared == 4  # a drafted positions 0, 1, 3, 4, 5 on the answer; b 0, 2, 3, 4 (rejected), 5
    assert where == [(3, DraftAt(9, 0.29, False), DraftAt(8, 0.25, True)), (4, DraftAt(10, 0.7, True), DraftAt(12, 0.4, False))]
    assert draft_differences(a, a) == (5, [])
    assert draft_differences(a, [ev(0, [], 0, 5, [5, 6, 7], "library")]) is None


def test_a_step_that_ended_without_a_target_token_reaches_no_further_and_diverged_answers_part_no_more():
    """An EOS kept mid-step (target None): the draft after it is not an answer position. Two lanes whose answers
    diverge at position 3 share a prefix only up to it: drafts past it are not compared."""
    eos = [ev(0, [5, 2, 7], 2, None, [5, 2], "correction", q=[0.9, 0.8, 0.7])]  # 2 = EOS, kept; 7 drafted after it
    assert drafts_on_answer(eos) == {0: DraftAt(5, 0.9, True), 1: DraftAt(2, 0.8, True)}
    a = [ev(0, [5, 6, 7], 3, 8, [5, 6, 7, 8], "bonus", q=[0.9, 0.9, 0.9]), ev(1, [10, 11], 2, 12, [10, 11, 12], "bonus", q=[0.9, 0.9])]
    b = [ev(0, [5, 6], 2, 9, [5, 6, 9], "bonus", q=[0.9, 0.9]), ev(1, [4, 3], 1, 12, [4, 12], "correction", q=[0.9, 0.9])]
    # they diverge at position 2 (7 against 9): position 2 is on the same prefix (b did not draft it); 3 and 4 are not
    assert draft_differences(a, b) == (2, [])


def test_draft_parting_pools_the_lanes_of_one_draft_per_run():
    """Three setups of one int8 draft and one of another precision on two prompts: each prompt's pairs of the int8
    draft's lanes compared (3 pairs a prompt), the fp32 draft alone (nothing to compare), other kinds ignored."""
    from app.core.report import draft_parting

    a = [ev(0, [5, 6], 2, 7, [5, 6, 7], "bonus", q=[0.9, 0.8]), ev(1, [9], 0, 8, [8], "correction", q=[0.29])]
    b = [ev(0, [5, 6], 2, 7, [5, 6, 7], "bonus", q=[0.9, 0.8]), ev(1, [8], 1, 10, [8, 10], "bonus", q=[0.3])]
    lanes = [("draft:d,k=auto,dtype=int8", "p1", 0, a), ("draft:d,k=8,cstop=0.5,dtype=int8", "p1", 0, b),
             ("draft:d,k=4,dtype=int8", "p1", 0, b), ("draft:d,k=4", "p1", 0, a), ("ngram:k=4", "p1", 0, a),
             ("draft:d,k=auto,dtype=int8", "p2", 0, a), ("draft:d,k=8,cstop=0.5,dtype=int8", "p2", 0, a)]
    (dp,) = draft_parting(lanes)
    # p1: auto–k8 and auto–k4 share positions 0, 1, 3 and differ at 3; k8–k4 share 0, 1, 3 and agree; p2: 3 shared, 0 differ
    assert dp == dict(draft="draft:d,dtype=int8", setups=3, shared=12, differ=2, prompts=2, prompts_differ=1)
    # a repeat of p2 counts its positions, not another prompt
    (dp,) = draft_parting([*lanes, ("draft:d,k=auto,dtype=int8", "p2", 1, a), ("draft:d,k=8,cstop=0.5,dtype=int8", "p2", 1, b)])
    assert dp["prompts"] == 2 and dp["prompts_differ"] == 2 and dp["shared"] == 15 and dp["differ"] == 3
    assert draft_parting([("draft:d,k=4", "p1", 0, a)]) == []
    # transformers' assisted generation with the same assistant and precision is a lane of that draft
    (dp,) = draft_parting([("draft:d,k=auto,dtype=int8", "p1", 0, a), ("hf-assisted:d,dtype=int8", "p1", 0, b),
                           ("hf-assisted:d", "p1", 0, b)])
    assert dp == dict(draft="draft:d,dtype=int8", setups=2, shared=3, differ=1, prompts=1, prompts_differ=1)


def test_theoretical_speedup_formula():
    # Leviathan et al.: (1 - α^(k+1)) / ((1 - α)(k c + 1))
    assert theoretical_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    assert theoretical_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert theoretical_speedup(1.0, 4, 0.25) == pytest.approx(5 / 2)
    assert theoretical_speedup(0.0, 4, 0.25) == pytest.approx(1 / 2)
    assert theoretical_speedup(0.5, 0, 0.3) == 1.0
    assert math.isnan(theoretical_speedup(float("nan"), 4, 0.1))


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def stats(setup, prompt, wall, ids, steps=10, drafted=0, accepted=0, t_draft=0.0, fwd=0, t_verify=1.0):
    return LaneStats(setup, prompt, 0, len(ids), wall, 0.1, 0.1, steps, drafted, accepted, fwd, t_draft, t_verify, tuple(ids), "")


def test_summary_speedup_is_computed_from_paired_walls_and_identity_from_ids():
    base = [stats("baseline", "a", 2.0, [1, 2, 3], steps=3, t_verify=1.8), stats("baseline", "b", 4.0, [4, 5], steps=2, t_verify=1.0)]
    spec = [
        stats("draft:x", "a", 1.0, [1, 2, 3], steps=2, drafted=8, accepted=6, t_draft=0.2, fwd=8).with_baseline(base[0]),
        stats("draft:x", "b", 2.0, [4, 6], steps=2, drafted=8, accepted=2, t_draft=0.2, fwd=8).with_baseline(base[1]),
    ]
    assert spec[0].identical_to_baseline and spec[0].first_divergence is None
    assert spec[1].identical_to_baseline is False and spec[1].first_divergence == 1
    assert spec[0].speedup == pytest.approx(2.0)
    s = {x.setup: x for x in summarize(base + spec)}
    assert s["draft:x"].speedup == pytest.approx(6.0 / 3.0)
    assert s["draft:x"].acceptance_rate == pytest.approx(8 / 16)
    assert s["draft:x"].identical_runs == 1
    # c = mean draft forward / mean baseline decode step = (0.4/16) / (2.8/3)
    assert s["draft:x"].c == pytest.approx((0.4 / 16) / (2.8 / 3))
    assert s["baseline"].theoretical_speedup == 1.0
    assert pickle.loads(pickle.dumps(spec[0])) == spec[0]
