"""The setup finder's pricing (app.core.tuning) on literal calibration records and cost curves."""

from __future__ import annotations

import math

import pytest

from app.core.setups import parse_setup
from app.core.tuning import (
    DYN_NODES,
    CalStep,
    Candidate,
    LaneCal,
    PromptCal,
    StepPrice,
    beam_grid,
    break_even_alpha,
    chain_speedup,
    dynamic_grid,
    fitted_curve,
    grid,
    positions,
    price_candidate,
    rank,
    replay_beams,
    replay_masked,
    replay_positions,
    replay_step,
    replay_tree,
    search_bit,
    tree_bit,
    tree_grid,
    tree_nodes,
    verify_for_gain,
    verify_gain_text,
    verify_scale,
    why,
    winners,
)

FLAT = tuple(1.0 + 0.02 * (n - 1) for n in range(1, 34))  # verifying is nearly free (a GPU)
STEEP = tuple(0.3 + 0.7 * n for n in range(1, 34))  # llama.cpp Q4_K_M on 2 cores: every token nearly a step


def test_a_rule_replays_on_a_recorded_proposal():
    s = CalStep(offered=6, accepted=3, q=(0.9, 0.8, 0.6, 0.3, 0.5, 0.5))
    assert replay_step(s, k=2) == (2, 2, False)  # two drafted, both kept
    assert replay_step(s, k=8) == (6, 3, True)  # wants more than was recorded: beyond
    assert replay_step(s, k=8, stop=0.5) == (4, 3, False)  # ends after the 0.3 draft (it is still verified)
    assert replay_step(s, k=8, cstop=0.5) == (3, 3, False)  # 0.9·0.8·0.6 = 0.43 < 0.5
    lookup = CalStep(offered=5, accepted=5)  # an n-gram proposal: no confidences
    assert replay_step(lookup, k=3) == (3, 3, False) and replay_step(lookup, k=8) == (5, 5, False)
    eos = CalStep(offered=2, accepted=2, q=(0.9, 0.9), open_end=False)  # ended on an end-of-sequence token
    assert replay_step(eos, k=8) == (2, 2, False)


def prompt(steps, prefill=1.0, tokens=21, t1=0.1, c_s=0.02, o_s=0.0, step0=None, cat="code", pid="p"):
    lane = LaneCal(tuple(steps), step0, prefill, c_s, o_s)
    return PromptCal(pid, cat, tokens, base_wall_s=prefill + (tokens - 1) * t1, base_prefill_s=prefill, base_step_s=t1,
                     base_overhead_s=0.0, lanes={"draft:d": lane})


def test_a_candidate_is_priced_position_by_position_from_the_record():
    """Step 0 drafted nothing (the target's token, position 0); then a proposal of 4 kept whole (positions 1–4,
    position 5 the target's bonus token) and one of 4 with its second draft rejected (6 kept, 7 rejected). A k=2
    rule from position 1: 2 kept (1, 2); then 3 kept and the bonus position ends the step (3, 4 → 1 draft, 2
    tokens); then 6 kept, 7 rejected (2 drafts, 2 tokens). 7 tokens for 2 × (V(3) + 2c) + V(2) + c; 20 tokens after
    step 0 at that rate, plus the prefill."""
    p = prompt([CalStep(4, 4, (0.9,) * 4), CalStep(4, 1, (0.9, 0.5, 0.5, 0.5))])
    cand = Candidate("draft:d", "draft:d,k=2", 2)
    out = price_candidate(cand, [p], FLAT)
    c = 0.02 / 0.1
    units = 2 * (FLAT[2] + 2 * c) + FLAT[1] + c
    expect = 1.0 + 20 * (units / 7) * 0.1
    assert out.pred_wall_s["p"] == pytest.approx(expect)
    assert out.speedup() == pytest.approx(p.base_wall_s / expect)
    assert out.alpha == pytest.approx(4 / 5) and out.tau == pytest.approx(7 / 3) and out.mean_k == pytest.approx(5 / 3)


def test_steps_are_replayed_where_the_setup_would_start_them():
    """The calibration's steps start after its rejections; a setup drafting less starts its own steps elsewhere.
    Positions 0–5 kept with confidences 0.9, 0.3, 0.9, 0.9, 0.3, 0.9, position 6 rejected. stop=0.5 ends a step after
    each 0.3 draft, and the target's own token follows: steps cover 0–2, 3–5 and 6 — not the one proposal the
    calibration made."""
    seq = positions(LaneCal((), CalStep(8, 6, (0.9, 0.3, 0.9, 0.9, 0.3, 0.9, 0.2, 0.8)), 1.0, 0.02, 0.0))
    assert [p.kept for p in seq] == [True] * 6 + [False] and seq[6].after == (0.8,)
    assert replay_positions(seq, 8, 0.5, 0.0, 0.5) == [(2, 2.0), (2, 2.0), (1, 0.0)]
    # past the rejection the rule drafts on while it would have (its cost): k=8 with no stop drafts 8 where the
    # calibration's proposal went on past what it recorded
    assert replay_positions(seq, 8, 0.0, 0.0, 0.5) == [(8, 6.0)]
    # a cumulative stop counts from the step's own start: 0.9 · 0.3 < 0.5 ends the first step after two drafts
    assert replay_positions(seq, 8, 0.0, 0.5, 0.5)[0] == (2, 2.0)


def test_flat_verify_favours_long_drafts_and_steep_verify_none():
    confident = [CalStep(12, 10, (0.95,) * 12) for _ in range(20)]
    recs = [prompt(confident, c_s=0.005)]
    flat = rank(price_candidate(c, recs, FLAT) for c in grid("draft:d", True))
    assert flat[0].candidate.k >= 8 and flat[0].speedup() > 2  # of 3 s baseline, 1 s is the prefill both pay
    # on a steep curve only near-certain drafts pay for their verification: with two of twelve kept, short drafts win
    mediocre = [prompt([CalStep(12, 2, (0.9,) * 12) for _ in range(20)], c_s=0.005)]
    steep = rank(price_candidate(c, mediocre, STEEP) for c in grid("draft:d", True))
    assert steep[0].candidate.k <= 3 and steep[0].speedup() < 1.2
    assert rank(price_candidate(c, mediocre, FLAT) for c in grid("draft:d", True))[0].candidate.k >= 2
    # every grid setup string parses back to the candidate it prices
    for c in grid("draft:d,dtype=int8", True) + grid("ngram:n=3", False):
        s = parse_setup(c.setup)
        assert s.k == c.k and getattr(s, "cstop", 0.0) == c.cstop and getattr(s, "stop", 0.0) == c.stop


def test_cstop_wins_where_confidence_tells_good_runs_from_bad():
    """Half the steps are confident and fully kept, half start with a doubtful draft that is rejected: a cumulative
    stop drafts long on the first and stops at once on the second, so it beats every plain k."""
    steps = [CalStep(12, 12, (0.97,) * 12), CalStep(12, 0, (0.3,) + (0.5,) * 11)] * 10
    recs = [prompt(steps, c_s=0.01)]
    ranked = rank(price_candidate(c, recs, tuple(1.0 + 0.1 * (n - 1) for n in range(1, 34))) for c in grid("draft:d", True))
    best = ranked[0].candidate
    assert best.cstop > 0 or best.stop > 0
    plain = max(p.speedup() for p in ranked if not p.candidate.cstop and not p.candidate.stop)
    assert ranked[0].speedup() > plain * 1.1


def test_drafting_past_the_record_is_paid_in_full():
    """A cstop=0 candidate at k=24 on proposals the calibration stopped at 3 (its own cumulative stop): the 21 drafts
    past the record cost their forwards and verify width, and are accepted at the measured tail rate only."""
    steps = [CalStep(3, 1, (0.5, 0.1, 0.1))] * 10
    recs = [prompt(steps, c_s=0.01)]
    k3 = price_candidate(Candidate("draft:d", "draft:d,k=3", 3), recs, FLAT)
    k24 = price_candidate(Candidate("draft:d", "draft:d,k=24", 24), recs, FLAT)
    assert k24.mean_k == 24 and k24.units > k3.units + 21 * 0.1 and k24.speedup() < k3.speedup()


def test_winners_by_category_and_ranking_dedupes_identical_setups():
    a = prompt([CalStep(6, 6, (0.95,) * 6)] * 10, pid="a", cat="code")
    b = prompt([CalStep(6, 0, (0.4,) * 6)] * 10, pid="b", cat="chat")
    priced = rank(price_candidate(c, [a, b], FLAT) for c in grid("draft:d", True))
    w = winners(priced)
    assert w["code"].by_category()["code"] > w["chat"].by_category()["chat"]
    assert w["code"].candidate.k > w["chat"].candidate.k or w["chat"].candidate.cstop or w["chat"].candidate.stop
    # a lookup that never matched: every k behaves alike, one is kept
    none = prompt([CalStep(0, 0)] * 10)
    none.lanes["ngram:n=3"] = none.lanes.pop("draft:d")
    assert len(rank(price_candidate(c, [none], FLAT) for c in grid("ngram:n=3", False))) == 1


def test_break_even_acceptance_and_verify_cost():
    price = StepPrice(STEEP, c=0.3)
    be = break_even_alpha(price, 1.0)
    assert be is not None
    alpha, k = be
    assert chain_speedup(alpha + 1e-6, k, price) >= 1.0 - 1e-9 and chain_speedup(alpha - 0.01, k, price) < 1.0
    # on a flat curve with a free drafter nearly any acceptance pays
    assert break_even_alpha(StepPrice(FLAT, c=0.0), 1.0)[0] < 0.05
    # a draft as dear as the target cannot pay on a steep curve
    assert break_even_alpha(StepPrice(STEEP, c=1.0), 1.0) is None
    # the V(5) at which a priced k=4 setup goes 10 % faster at its own τ: its units per step shrink by 1/1.1
    p = price_candidate(Candidate("draft:d", "draft:d,k=4", 4), [prompt([CalStep(4, 3, (0.9,) * 4)] * 10)], STEEP)
    n, now, need = verify_for_gain(p, STEEP)
    assert (n, now) == (5, STEEP[4]) and (p.units - now + need) * 1.1 == pytest.approx(p.units) and 1.0 < need < now
    assert verify_gain_text(p, STEEP, name="k=4").startswith(f"for k=4 to gain another 10 % at its τ {p.tau:.2f}, verifying its 5 tokens a step would have to cost V(5) ≤ {need:.2f}")
    # a k=4 setup that keeps every draft, c 0.05: for 10 % more its 5-token verify would have to cost 0.96 on FLAT,
    # below every forward there (the cheapest, one token, 1.00): not a verify's doing. On a curve whose cheapest
    # forward is over 6 tokens (0.75), from V(5) 0.85 it needs 0.75: below one forward, yet as cheap as one measured
    fast = [prompt([CalStep(4, 4, (0.9,) * 4)] * 10, c_s=0.005)]
    flat = verify_gain_text(price_candidate(Candidate("draft:d", "draft:d,k=4", 4), fast, FLAT), FLAT)
    assert "a cheaper verify alone would not do" in flat and "the cheapest, over 1 token, costs 1.00" in flat
    dip = (1.0, 1.17, 0.85, 0.79, 0.85, 0.75) + tuple(0.75 + 0.05 * n for n in range(1, 28))
    p_dip = price_candidate(Candidate("draft:d", "draft:d,k=4", 4), fast, dip)
    n, now, need = verify_for_gain(p_dip, dip)
    assert (n, now) == (5, 0.85) and 0.75 < need < 1.0
    assert verify_gain_text(p_dip, dip).endswith(f"would have to cost V(5) ≤ {need:.2f} (it costs 0.85 here)")


def test_why_names_the_parts_that_decide():
    p = price_candidate(Candidate("draft:d", "draft:d,k=4", 4), [prompt([CalStep(4, 0, (0.3,) * 4)] * 10, c_s=0.05)], STEEP)
    text = why(p, STEEP, best=1.0)
    assert text.startswith("loses") and "V(5)" in text and "c 0.50" in text and "α 0.00" in text
    assert math.isfinite(p.speedup())
    good = price_candidate(Candidate("draft:d", "draft:d,k=4", 4), [prompt([CalStep(4, 4, (0.9,) * 4)] * 10)], FLAT)
    assert why(good, FLAT, best=2.48, measured=2.47).startswith("0.995x the winner")  # 0.99597, not "1.00x": it is below it
    assert why(good, FLAT, best=2.48, measured=2.3).startswith("0.93x the winner")
    assert why(good, FLAT, best=2.48, measured=2.48).startswith("wins")
    assert why(good, FLAT, best=2.48, measured=2.4799).startswith("0.999x the winner")  # rounded down, never 1.000x


def test_the_verify_curve_is_scaled_to_the_runs_own_verifies():
    """A profile measured on a busier machine says verifying is cheap; this run's verifies (0.1 s forward) cost
    twice as much above one forward: the fit says 2, the scaled curve keeps V(1) = 1, and the candidates priced
    with it are slower by exactly the extra verify cost."""
    def step(n: int) -> CalStep:
        return CalStep(n, n - 1, (0.9,) * n, verify_s=0.1 * (1 + 2 * (FLAT[n] - 1)))

    recs = [prompt([step(4), step(8), step(2)] * 5)]
    assert verify_scale(recs, FLAT) == pytest.approx(2.0)
    curve, s_all = fitted_curve(recs, FLAT)  # every width twice as dear: the fitted curve is the profile's scaled by 2
    assert s_all == pytest.approx(2.0) and curve[0] == 1.0 and curve[8] == pytest.approx(1 + 2 * (FLAT[8] - 1))
    assert verify_scale([prompt([CalStep(0, 0)] * 3)], FLAT) is None  # nothing verified: nothing to fit
    noise = [prompt([CalStep(4, 3, (0.9,) * 4, verify_s=0.08)] * 3)]  # 4 drafts verified faster than one forward
    assert verify_scale(noise, FLAT) is None
    cand = Candidate("draft:d", "draft:d,k=4", 4)
    cheap, dear = price_candidate(cand, recs, FLAT), price_candidate(cand, recs, curve)
    assert dear.units - cheap.units == pytest.approx(FLAT[4] - 1) and dear.speedup() < cheap.speedup()


def test_each_width_is_priced_by_the_verifies_of_about_that_width():
    """A run whose verifies of 5 tokens cost 3x the profile's cost above one forward and those of 25 tokens 1.2x: one
    scale for both would misprice each; the fitted curve is near 3x at 5, near 1.2x at 25, in between at 9, never
    falls with n, and is the profile's where nothing was verified."""
    def step(n: int, s: float) -> CalStep:
        return CalStep(n - 1, n - 2, (0.9,) * (n - 1), verify_s=0.1 * (1 + s * (STEEP[n - 1] - 1)))

    recs = [prompt([step(5, 3.0), step(25, 1.2)] * 6)]
    curve, s_all = fitted_curve(recs, STEEP)
    assert s_all == verify_scale(recs, STEEP)
    s5, s9, s25 = ((curve[n - 1] - 1) / (STEEP[n - 1] - 1) for n in (5, 9, 25))
    assert 2.7 < s5 < 3.0 and 1.2 < s25 < 1.35 and s25 < s9 < s5
    assert curve[0] == 1.0 and all(b >= a for a, b in zip(curve, curve[1:], strict=False))
    assert fitted_curve([prompt([CalStep(0, 0)] * 3)], STEEP) == (STEEP, None)


def test_a_curve_with_a_dear_two_token_forward_keeps_its_shape():
    """A profile where 2 tokens cost 1.2 forwards and 3–6 cost less than one (oneDNN's blocking on AVX-512): a run
    whose verifies cost just that leaves the curve as it is (a ratio to V(n) − 1 could not, with V(n) − 1 ≤ 0);
    a run whose narrow verifies cost 0.1 forward more per token than the profile says moves them by that, V(3) still
    below V(2), and the wide widths it did not verify follow the run's overall excess."""
    shape = (1.0, 1.2, 0.9, 0.88, 0.85, 0.86, 0.95, 1.03)
    curve = shape + tuple(1.03 + 0.05 * (n - 8) for n in range(9, 34))

    def step(n: int, extra: float) -> CalStep:
        return CalStep(n - 1, n - 2, (0.9,) * (n - 1), verify_s=0.1 * (curve[n - 1] + extra * (n - 1)))

    same = [prompt([step(n, 0.0) for n in (2, 3, 4, 5, 6)] * 4)]
    fit, _ = fitted_curve(same, curve)
    assert fit == pytest.approx(curve)
    dearer = [prompt([step(n, 0.1) for n in (2, 3, 4, 5, 6)] * 4)]
    fit, _ = fitted_curve(dearer, curve)
    for n in (2, 3, 4, 5, 6):
        assert fit[n - 1] == pytest.approx(curve[n - 1] + 0.1 * (n - 1), rel=1e-6)
    assert fit[2] < fit[1] and fit[20] == pytest.approx(curve[20] + 0.1 * 20)
    assert all(b >= a for a, b in zip(fit[7:], fit[8:], strict=False))  # past 8 tokens it never falls


def test_step_zeros_drafts_cost_their_forwards_and_their_place_in_the_prompts_forward():
    """The calibration's step 0 drafted 10 with the prompt; a k=2 setup would have drafted 2 — its step 0 is shorter
    by 8 draft forwards (0.02 s) and 8 tokens of the prompt's forward (the curve's last slope, 0.05 × T(1) 0.1 s).
    Three tokens in all: step 0 emits them, no decode step is left to price."""
    p = prompt([CalStep(4, 3, (0.9,) * 4)] * 5, step0=CalStep(10, 10, (0.95,) * 10), prefill=2.0, tokens=3, c_s=0.02)
    steep = tuple(1.0 + 0.05 * (n - 1) for n in range(1, 34))
    assert price_candidate(Candidate("draft:d", "draft:d,k=2", 2), [p], steep).pred_wall_s["p"] == pytest.approx(2.0 - 8 * (0.02 + 0.05 * 0.1))
    assert price_candidate(Candidate("draft:d", "draft:d,k=10", 10), [p], steep).pred_wall_s["p"] == pytest.approx(2.0)
    # a 2x1 tree instead: its 4 nodes join the prompt's forward, its 2 draft forwards (over 1 and 2 tokens) replace
    # the chain's 10
    tree = tree_grid("draft:d", [(2, 1)])[0]
    fw = steep[0] + steep[1]  # no draft curve given: the target's
    assert price_candidate(tree, [p], steep).pred_wall_s["p"] == pytest.approx(2.0 + fw * 0.02 + 4 * 0.05 * 0.1 - 10 * (0.02 + 0.05 * 0.1))


def test_a_static_tree_is_priced_from_the_ranks_the_chain_recorded():
    """A chain calibration that keeps one draft, then is corrected, every step: the target's token at the rejected
    position was the draft's second choice (rank 2) on even steps, its fourth (rank 4) on odd ones. A 2x2x1 tree
    holds the true path through a rank-2 position at depth 2 and keeps going below it (the next position, kept by
    the calibration's next step); a rank-4 position ends it as it ends the chain. Every replayed step verifies the
    tree's 10 nodes and pays its 3 draft forwards over 1, 2 and 4 tokens."""
    assert tree_nodes((2, 1, 1)) == (6, [1, 2, 2]) and tree_nodes((3, 2, 1)) == (15, [1, 3, 6])
    steps = [CalStep(4, 1, (0.9, 0.6, 0.6, 0.6), rank=2 if i % 2 == 0 else 4) for i in range(12)]
    lane = LaneCal(tuple(steps), None, 1.0, 0.02, 0.0)
    seq = positions(lane)
    assert [p.rank for p in seq[1:5]] == [1, 2, 1, 4]
    # from 1: kept, rank 2 at depth 2 (width 2), kept at depth 3: 3 kept; from 5 the same
    assert replay_tree(seq, (2, 2, 1), 0.5, start=1)[:2] == [(10, 3.0), (10, 3.0)]
    assert replay_tree(seq, (2, 1, 1), 0.5, start=1)[:2] == [(6, 1.0), (6, 1.0)]  # depth 2 one wide: as the chain
    assert replay_positions(seq, 3, 0.0, 0.0, 0.5, start=1)[:2] == [(3, 1.0), (3, 1.0)]
    # a rank-4 position at the root of a 4-wide tree is caught
    assert replay_tree(seq, (4, 1, 1), 0.5, start=4)[0] == (12, 2.0)
    rec = PromptCal("p", "code", 37, 1.0 + 36 * 0.1, 1.0, 0.1, 0.0, {"draft:d": lane})
    [tree] = tree_grid("draft:d", [(2, 2, 1)])
    assert tree.setup == "tree:d,shape=2x2x1" and tree.kind == "tree" and parse_setup(tree.setup).shape == "2x2x1"
    draft_curve = tuple(1.0 + 0.5 * (n - 1) for n in range(1, 34))  # the draft's forward over n tokens
    flat = price_candidate(tree, [rec], FLAT, draft_curve)
    c = 0.02 / 0.1
    replayed = replay_tree(seq, (2, 2, 1), 0.5, start=1)
    assert flat.units == pytest.approx(FLAT[10] + c * (1 + 1.5 + 2.5)) and flat.mean_k == 10
    assert flat.tau == pytest.approx(sum(a + 1 for _, a in replayed) / len(replayed))
    # with verifying nearly free (a GPU) the tree beats the chain of its depth; with every token a step it loses
    k3 = Candidate("draft:d", "draft:d,k=3", 3)
    assert flat.speedup() > price_candidate(k3, [rec], FLAT, draft_curve).speedup()
    assert price_candidate(tree, [rec], STEEP, draft_curve).speedup() < price_candidate(k3, [rec], STEEP, draft_curve).speedup()
    # an unrecorded rank (older records) catches nothing beyond the chain
    blind = LaneCal(tuple(CalStep(4, 1, (0.9, 0.6, 0.6, 0.6)) for _ in range(12)), None, 1.0, 0.02, 0.0)
    assert replay_tree(positions(blind), (4, 4, 1), 0.5, start=1)[:2] == [(36, 1.0), (36, 1.0)]
    # every tree shape the finder prices parses back to its setup
    for cand in tree_grid("draft:d,dtype=int8"):
        st = parse_setup(cand.setup)
        assert tuple(int(b) for b in st.shape.split("x")) == cand.shape and st.dtype == "int8" and tree_nodes(cand.shape)[0] <= 32


def test_a_trees_verify_and_its_draft_levels_are_priced_with_their_masks():
    """A token tree's forward costs more than the causal forward of as many tokens (an attention mask, llama.cpp's
    sequence ids): the cost profile measures the ratio (CostProfile.tree_ratio) and the finder prices a tree's verify
    as V(nodes + 1)·ratio and a draft level of more than one token at the draft's own ratio; chains are untouched,
    and `why` says what the mask was priced at. A head's or a dynamic tree's calibration verified trees: the verify
    curve is fitted to them as the causal forwards they stand for (each divided by the ratio)."""
    steps = [CalStep(4, 1, (0.9, 0.6, 0.6, 0.6), rank=2) for _ in range(12)]
    lane = LaneCal(tuple(steps), None, 1.0, 0.02, 0.0)
    rec = PromptCal("p", "code", 37, 1.0 + 36 * 0.1, 1.0, 0.1, 0.0, {"draft:d": lane})
    [tree] = tree_grid("draft:d", [(2, 2, 1)])
    draft_curve = tuple(1.0 + 0.5 * (n - 1) for n in range(1, 34))
    c = 0.02 / 0.1
    plain = price_candidate(tree, [rec], FLAT, draft_curve)
    masked = price_candidate(tree, [rec], FLAT, draft_curve, tree_ratio=1.25, draft_tree_ratio=1.5)
    assert plain.units == pytest.approx(FLAT[10] + c * (1 + 1.5 + 2.5))
    assert masked.units == pytest.approx(FLAT[10] * 1.25 + c * (1 + 1.5 * 1.5 + 2.5 * 1.5))  # the 1-token root level: plain
    assert masked.speedup() < plain.speedup() and masked.tau == plain.tau
    k3 = Candidate("draft:d", "draft:d,k=3", 3)
    assert price_candidate(k3, [rec], FLAT, draft_curve, tree_ratio=1.25).units == price_candidate(k3, [rec], FLAT, draft_curve).units
    assert "the tree's mask ×1.25" in why(masked, FLAT, best=5.0, tree_ratio=1.25)
    assert "mask" not in why(plain, FLAT, best=5.0)
    # the fit: a tree calibration's 5-token verifies at 1.2 × the causal cost are the causal verifies of a chain
    causal = [CalStep(4, 1, (0.9,) * 4, verify_s=0.1 * 1.6) for _ in range(6)]
    tree_steps = [CalStep(4, 1, (0.9,) * 4, False, 0.1 * 1.6 * 1.2, None, (-1, 0, 0, 1)) for _ in range(6)]
    chain = PromptCal("p", "code", 37, 4.6, 1.0, 0.1, 0.0, {"draft:d": LaneCal(tuple(causal), None, 1.0, 0.02, 0.0)})
    trees = PromptCal("p", "code", 37, 4.6, 1.0, 0.1, 0.0, {"tree:d": LaneCal(tuple(tree_steps), None, 1.0, 0.02, 0.0)})
    assert fitted_curve([trees], STEEP, tree_ratio=1.2)[0] == pytest.approx(fitted_curve([chain], STEEP)[0])
    assert fitted_curve([trees], STEEP)[0][4] > fitted_curve([chain], STEEP)[0][4]


def test_why_names_a_trees_own_costs():
    steps = [CalStep(4, 1, (0.9, 0.6, 0.6, 0.6), rank=2) for _ in range(12)]
    rec = PromptCal("p", "code", 37, 1.0 + 36 * 0.1, 1.0, 0.1, 0.0, {"draft:d": LaneCal(tuple(steps), None, 1.0, 0.02, 0.0)})
    p = price_candidate(tree_grid("draft:d", [(3, 2, 1)])[0], [rec], STEEP)
    text = why(p, STEEP, best=5.0)
    assert "verify of 15 tree nodes V(16)" in text and "3 draft forwards over 1/3/6 tokens at c 0.20" in text


def _beam_step(accepted_path: tuple[int, ...]) -> CalStep:
    """A ReDrafter calibration step, literal: the union of the trees 1 and 2 beams wide, 1 and 2 deep.

        node 0 (q 0.6)  ── node 2 (q 0.5)        the best beam: in every tree (node 2 from depth 2 on)
        node 1 (q 0.3)  ── node 3 (q 0.9)        the second beam: 2 wide only

    """
    b11, b12, b21, b22 = search_bit(1, 1), search_bit(1, 2), search_bit(2, 1), search_bit(2, 2)
    return CalStep(4, len(accepted_path), (0.6, 0.3, 0.5, 0.9), False, 0.0, None, (-1, -1, 0, 1),
                   (b11 | b12 | b21 | b22, b21 | b22, b12 | b22, b22), accepted_path)


def test_a_head_tree_keeps_the_prefix_of_the_accepted_path_it_holds():
    """replay_beams: a tree (beams, depth, cstop) verifies the nodes tagged for it that its path-probability cut keeps,
    and keeps the calibration's accepted path as far as it holds it."""
    on_best, on_second = _beam_step((0, 2)), _beam_step((1, 3))
    assert replay_beams(on_best, 1, 1) == (1, 1) and replay_beams(on_best, 1, 2) == (2, 2) and replay_beams(on_best, 2, 2) == (4, 2)
    assert replay_beams(on_second, 1, 2) == (2, 0) and replay_beams(on_second, 2, 1) == (2, 1) and replay_beams(on_second, 2, 2) == (4, 2)
    # the cut: node 1's path 0.3 and node 3's 0.27 go at 0.28, node 2's 0.30 stays; at 0.31 only node 0
    assert replay_beams(on_second, 2, 2, cstop=0.28) == (3, 1) and replay_beams(on_best, 2, 2, cstop=0.31) == (1, 1)
    assert replay_beams(CalStep(3, 1), 2, 2) == (2, 1)  # recorded without masks (a chain): its first drafts


def test_a_head_is_priced_by_its_trees_and_its_levels():
    """Each step verifies the tree's nodes (V(n + 1)) and runs `depth` head levels at c, also where its cut left
    nothing to verify (the head ran before the cut); the grid's setups parse back."""
    steps = [_beam_step((1, 3)) if i % 2 else _beam_step((0, 2)) for i in range(10)]
    rec = PromptCal("p", "code", 31, 1.0 + 30 * 0.1, 1.0, 0.1, 0.0, {"redrafter:h": LaneCal(tuple(steps), None, 1.0, 0.01, 0.0)})
    cands = {c.setup: c for c in beam_grid("redrafter:h")}
    wide = price_candidate(cands["redrafter:h,beams=2,depth=2"], [rec], FLAT)
    one = price_candidate(cands["redrafter:h,beams=1,depth=2"], [rec], FLAT)
    assert wide.tau == pytest.approx(3.0) and one.tau == pytest.approx(2.0) and wide.mean_k == 4 and one.mean_k == 2
    assert wide.units == pytest.approx(FLAT[4] + 2 * 0.1) and one.units == pytest.approx(FLAT[2] + 2 * 0.1)
    cut = price_candidate(Candidate("redrafter:h", "redrafter:h,beams=1,depth=2,cstop=0.35", 2, cstop=0.35, beams=1), [rec], FLAT)
    assert cut.mean_k == 1 and cut.tau == pytest.approx(1.5) and cut.units == pytest.approx(FLAT[1] + 2 * 0.1)  # node 2: 0.6·0.5 < 0.35
    none = price_candidate(Candidate("redrafter:h", "redrafter:h,beams=1,depth=3,cstop=0.9", 3, cstop=0.9, beams=1), [rec], FLAT)
    assert none.mean_k == 0 and none.units == pytest.approx(1.0 + 3 * 0.1) and none.speedup() < 1.0
    assert len(cands) == 4 * 4 * 6 and all(c.kind == "redrafter" and c.beams for c in cands.values())
    for c in beam_grid("redrafter:h,dtype=int8"):
        st = parse_setup(c.setup)
        assert (st.beams, st.depth, st.cstop, st.dtype) == (c.beams, c.k, c.cstop, "int8") and st.label == c.setup
    assert "2 head levels × c 0.10" in why(wide, FLAT, best=2.0) and "verify of 4.0 beam-tree nodes V(5)" in why(wide, FLAT, best=2.0)


def test_a_dynamic_tree_is_priced_by_its_nodes_and_forwards():
    """A dynamic-tree calibration step tags each node with the trees (branch, depth, nodes) that hold it: a tree
    verifies its own nodes and keeps the accepted path as far as it holds it, paying `depth` draft forwards (the
    root's and one per level below); step 0's union is swapped for the tree in the prefill (its extra nodes and
    forwards out)."""
    small, big = tree_bit(2, 1, 4), tree_bit(2, 2, 8)
    # root children 0, 1 (in both trees), node 2 under node 0 (the 2-deep tree only); the target kept 0 then 2
    step = CalStep(3, 2, (0.7, 0.2, 0.6), False, 0.0, None, (-1, -1, 0), (small | big, small | big, big), (0, 2))
    assert replay_masked(step, small, 1) == (2, 1) and replay_masked(step, big, 2) == (3, 2)
    step0 = CalStep(3, 2, (0.7, 0.2, 0.6), False, 0.0, None, (-1, -1, 0), (small | big, small | big, big), (0, 2), forwards=16)
    rec = PromptCal("p", "code", 31, 1.0 + 30 * 0.1, 1.0, 0.1, 0.0, {"tree:d": LaneCal((step,) * 8, step0, 2.0, 0.01, 0.0)})
    cands = {c.setup: c for c in dynamic_grid("tree:d")}
    one = price_candidate(cands["tree:d,nodes=4,depth=1,branch=2"], [rec], FLAT)
    two = price_candidate(cands["tree:d,nodes=8,depth=2,branch=2"], [rec], FLAT)
    assert one.tau == pytest.approx(2.0) and two.tau == pytest.approx(3.0) and one.mean_k == 2 and two.mean_k == 3
    assert one.units == pytest.approx(FLAT[2] + 1 * 0.1) and two.units == pytest.approx(FLAT[3] + 2 * 0.1)
    marginal = FLAT[-1] - FLAT[-2]
    # prefill: 2.0 s measured with the union (3 nodes, 16 forwards); the 1-deep tree verifies 2 nodes in 1 forward
    want = 2.0 - ((3 - 2) * marginal + (16 - 1) * 0.1) * 0.1 + (31 - 2) * one.units / 2.0 * 0.1
    assert one.pred_wall_s["p"] == pytest.approx(want)
    assert len(cands) == 3 * 6 * len(DYN_NODES) and all(c.kind == "tree" and c.dynamic for c in cands.values())
    for c in dynamic_grid("tree:d,dtype=int8"):
        st = parse_setup(c.setup)
        assert (st.shape, st.nodes, st.depth, st.branch, st.dtype) == (None, c.dynamic[0], c.k, c.dynamic[1], "int8")
    assert "2 draft forwards at c 0.10" in why(two, FLAT, best=2.0)
