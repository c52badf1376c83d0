"""k=auto: the cost-aware decision rule on literal cost curves, and the drafters that use it."""

from __future__ import annotations

import copy
import math
import random
import warnings

import pytest

from app.core.costs import CostProfile
from app.speculative.costs import isotonic, median_error, smooth
from app.speculative.drafters import DraftContext, NGramDrafter
from app.speculative.policy import AutoK, Calibration, StepTiming

NS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 28, 33)


def curve(v, t1=0.1) -> CostProfile:
    """A profile whose V(n) is the function v."""
    return CostProfile(engine="t", backend="x", precision="float32", device="cpu", weights="w", machine="m", ns=NS,
                       times_s=tuple(t1 * v(n) for n in NS))


FLAT = curve(lambda n: 1.0 + 0.02 * (n - 1))  # a GPU-like target: verifying 33 tokens costs 1.64 decode steps
STEEP = curve(lambda n: 0.3 + 0.7 * n)  # llama.cpp Q4_K_M on this CPU: V(5) 3.8, V(10) 7.3 (measured 3.6 / 7.4)


def test_drafting_never_pays_on_a_steep_curve_with_a_costly_draft():
    auto = AutoK(STEEP, draft_s=0.05)  # c = 0.5, like the 0.5B draft for the 1.5B target on llama.cpp
    assert not auto.can_ever_pay(32)
    assert not auto.worth_drafting_more([], 32)
    # drafts already made (their cost sunk) are verified only where a token is worth its 0.7 decode steps
    assert auto.best_k([0.6, 0.3]) == 0
    assert auto.best_k([0.99, 0.98, 0.5]) == 2


def test_long_drafts_on_a_flat_curve_stop_where_acceptance_falls():
    auto = AutoK(FLAT, draft_s=0.005)
    assert auto.can_ever_pay(32)
    cum = [0.9 ** j for j in range(1, 9)]
    assert auto.worth_drafting_more(cum, 32)
    assert auto.best_k(cum) == 8  # every one of these is worth verifying
    # a sharp drop: the tokens after it are worth less than their verification
    cum = [0.95, 0.9, 0.85, 0.01, 0.0001]
    assert auto.best_k(cum) == 3
    assert not auto.worth_drafting_more(cum, 32, p_next=0.05)
    assert not auto.worth_drafting_more(cum[:3], 3)  # the cap


def test_a_proposal_is_valued_over_two_steps_so_a_confident_tail_is_not_bet_on_an_unsure_draft():
    """Stopping before an unsure draft leaves the tokens after it to the next step, which drafts them at the rate of
    a step on easy text — not at the lane's average rate λ, as the one-step rule prices them (math-1: 17 drafts bet
    on a draft of confidence 0.5–0.8, rejected three steps running)."""
    line = curve(lambda n: 1.0 + 0.06 * (n - 1), t1=0.25)
    auto = AutoK(line, draft_s=0.25 * 0.13)  # c = 0.13, as the int8 0.5B draft for the fp32 1.5B target
    auto._tok, auto._units = 18.0, 10.0  # λ = 1.8 tokens a unit
    lam = auto.rate
    cum = [1.0, 1.0, 0.4]  # two sure drafts, then one kept with probability 0.4; the next expected at p̂ = 0.95
    one_step = max(auto._gains(cum, lam))
    # the one-step rule: some run of further drafts beats stopping now
    assert any(sum(cum) + sum(0.4 * 0.95 ** m for m in range(1, n + 1)) - lam * (auto.t(3 + n + 1) + n * auto.d) > one_step
               for n in range(1, 29))
    # over two steps it does not: stopping now is worth the next step's start on the confident tail as well
    assert not auto.worth_drafting_more(cum, 32, p_next=0.95)
    value, keep = auto.stop_value(cum, 0.95, 32)
    assert value > one_step and keep == 3
    # where the draft after the last is unlikely to be kept, nothing is owed to the next step: the one-step choice
    assert auto.best_k(cum, p_next=0.0) == auto.best_k(cum)
    # a draft kept with probability 0 ends what the next step could take over from it (no warning, no NaN)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert auto.stop_value([1.0, 0.0, 0.0], 0.95, 32)[1] == 1
    # a rate no step can beat: no next step is worth more than an average one, and both rules agree
    auto._tok = 1000.0
    assert auto.next_step_excess([0.95] * 32, auto.rate) == 0.0
    for c in ([0.9, 0.8, 0.3], [0.99] * 10, [0.5, 0.1]):
        assert auto.best_k(c, p_next=0.95) == auto.best_k(c)


def test_the_next_steps_excess_is_priced_as_a_decode_step():
    """S⁺ = max(0, 1 + max_m [Σ_{l≤m} Q_l − λ·(V(m + 1) + m·c + o)]), on literal numbers; step 0's price (drafts riding
    on the prompt's forward) does not apply to it."""
    bent = curve(lambda n: 1.0 + 0.5 * (n - 1) if n <= 3 else 2.0 + 0.1 * (n - 3))
    auto = AutoK(bent, draft_s=0.0)  # V(2) 1.5, V(3) 2, V(5) 2.2; c = 0, o = 0; λ = 1
    assert auto.rate == 1.0
    assert auto.next_step_excess([], 1.0) == 0.0  # drafting nothing is an average step at the baseline's rate
    assert auto.next_step_excess([1.0, 0.5], 1.0) == pytest.approx(0.5)  # 1 + max(−1, 1 − 1.5, 1.5 − 2)
    assert auto.next_step_excess([1.0] * 4, 1.0) == pytest.approx(1.0 + 4 - 2.2)  # m = 4: 4 − V(5)
    with auto.riding_on_the_prompt():
        assert auto.t(3) == pytest.approx(1.2)  # step 0 prices drafts at the curve's last slope …
        assert auto.next_step_excess([1.0, 0.5], 1.0) == pytest.approx(0.5)  # … the next step is a decode step


def test_costs_are_learnt_as_ratios_so_a_uniform_slowdown_changes_no_decision():
    """c and o are learnt relative to each step's own verify time, λ over the modelled units: a machine that becomes
    three times slower for a while (another process took the cores) leaves every estimate and decision as it was."""
    auto = AutoK(FLAT, draft_s=0.01)
    step = StepTiming(n_verified=5, t_verify_s=FLAT.t(5), t_draft_s=0.04 * FLAT.t1_s / 0.1, draft_forwards=4,
                      t_wall_s=FLAT.t(5) + 0.06, emitted=3)
    for _ in range(300):  # drafts cost 0.1 of a decode step each; 20 ms of the 60 ms outside the forwards is overhead
        auto.observe(step)
    c, o, rate = auto.d, auto.price.o, auto.rate
    assert c == pytest.approx(0.1, rel=0.01) and o == pytest.approx(0.2, rel=0.01)
    cum = [0.9, 0.8, 0.7, 0.3, 0.1]
    before = (auto.best_k(cum), auto.worth_drafting_more(cum[:2], 32, p_next=0.6))
    slow = StepTiming(5, 3 * step.t_verify_s, 3 * step.t_draft_s, 4, 3 * step.t_wall_s, 3)
    for _ in range(10):
        auto.observe(slow)
    assert (auto.d, auto.price.o, auto.rate) == pytest.approx((c, o, rate), rel=1e-6)
    assert (auto.best_k(cum), auto.worth_drafting_more(cum[:2], 32, p_next=0.6)) == before
    assert auto.sec_per_unit == pytest.approx(3 * FLAT.t1_s, rel=0.15)  # only the explanations' times follow it


def test_a_lane_learns_what_its_verifies_cost_over_the_profile():
    """A lane whose verifies of several tokens cost 1.2 times what the profile says, over its own one-token forwards
    (llama.cpp here: 1.09–1.31, as the verify follows the draft's forwards), prices them so: V(n ≥ 2) scaled, V(1)
    kept, and a single draft that paid on the profile's curve no longer pays. The ratio is of two times measured
    steps apart, so a machine three times slower for a while changes nothing; a lane without a recent plain decode
    step (one that drafts every step, or whose last plain step is more than VERIFY_FRESH steps back) learns nothing;
    a single stalled verify moves it by at most its clipped share."""
    from app.speculative.policy import VERIFY_CLIP, VERIFY_DECAY, VERIFY_FRESH, VERIFY_PRIOR

    t1 = LLAMA.t1_s
    plain = StepTiming(1, t1, 0.0, 0, t1, 1)

    def drafting(scale: float, slow: float = 1.0) -> StepTiming:
        t = slow * scale * LLAMA.t(3)
        return StepTiming(3, t, slow * 0.09, 2, t + slow * 0.09, 3)

    auto = AutoK(LLAMA, draft_s=0.3 * t1)  # c = 0.3
    assert auto.verify_factor == 1.0
    assert auto.worth_drafting_more([], 1, p_next=0.8)  # one draft at 0.8 pays on the profile: 0.8 > 0.37 + 0.3
    for _ in range(60):
        auto.observe(plain)
        auto.observe(drafting(1.2))
    f = auto.verify_factor  # the prior, worth VERIFY_PRIOR of the ~50 observations the decay keeps, holds it a little back
    assert f == pytest.approx(1.2, abs=0.025)
    assert auto.t(1) == 1.0 and auto.t(3) == pytest.approx(f * LLAMA.t(3) / t1) and auto.t(2) == pytest.approx(f * 1.37)
    assert not auto.worth_drafting_more([], 1, p_next=0.7)  # 0.7 < 1.2·1.37 − 1 + 0.3: the dear verify does not pay
    assert f"verifies cost {f:.2f}x the profile's in this lane" in auto.explain([0.9, 0.8], 2)
    learnt = auto.verify_factor
    for _ in range(20):  # three times slower, the plain steps too
        auto.observe(StepTiming(1, 3 * t1, 0.0, 0, 3 * t1, 1))
        auto.observe(drafting(1.2, slow=3.0))
    assert auto.verify_factor == learnt

    always = AutoK(LLAMA, draft_s=0.3 * t1)
    for _ in range(50):  # no plain step to compare with
        always.observe(drafting(1.5))
    assert always.verify_factor == 1.0
    stale = AutoK(LLAMA, draft_s=0.3 * t1)
    stale.observe(plain)
    for _ in range(VERIFY_FRESH):
        stale.observe(drafting(1.5))  # log 1.5 clipped to VERIFY_CLIP
    weight = sum(VERIFY_DECAY ** i for i in range(VERIFY_FRESH))
    assert stale.verify_factor == pytest.approx(math.exp(VERIFY_CLIP * weight / (weight + VERIFY_PRIOR)), abs=0.005)
    before = stale.verify_factor
    for _ in range(10):  # the plain step is too far back now
        stale.observe(drafting(1.5))
    assert stale.verify_factor == before
    stall = AutoK(LLAMA, draft_s=0.3 * t1)
    stall.observe(plain)
    stall.observe(drafting(10.0))
    assert stall.verify_factor == pytest.approx(math.exp(VERIFY_CLIP / (1 + VERIFY_PRIOR)), abs=0.005)


def test_a_skipping_lane_drifts_back_to_probing():
    auto = AutoK(curve(lambda n: 0.5 + 0.5 * n), draft_s=0.005)
    for _ in range(40):  # after skips, drafts were rejected at once
        auto.start = "skip"
        auto.ended(2, 0, [0.5, 0.5])
    auto.start = "skip"
    assert not auto.worth_drafting_more([], 32)
    for _ in range(100):
        auto.skipped()
    assert auto.worth_drafting_more([], 32)


def test_the_first_draft_is_judged_by_how_the_previous_step_ended():
    """A step after one that kept every draft starts drafting; after a run of misses on a dear draft, it does not —
    each estimated from the target's verdicts in that situation, not from an average over all drafts."""
    auto = AutoK(curve(lambda n: 1.0 + 0.1 * (n - 1)), draft_s=0.04)  # c = 0.4: an fp32 draft a third of the target
    for _ in range(60):
        auto.start = "bonus"
        auto.ended(4, 4, [0.9, 0.9, 0.9, 0.9])  # after a full acceptance the next step's drafts are kept too
        auto.ended(3, 0, [0.3, 0.2, 0.2])  # (start "bonus" → a miss): the first draft after a bonus was rejected once
        auto.start = "miss"
        auto.ended(2, 0, [0.3, 0.3])
    assert auto.acceptance.p_first("bonus") == pytest.approx(0.5, abs=0.05)
    assert auto.acceptance.p_first("miss") < 0.1  # 60 misses against the prior's 6 pseudo-observations
    auto.start = "miss"
    assert not auto.worth_drafting_more([], 8)
    auto.start = "bonus"
    assert auto.p_next(None) > 0.4


def test_the_next_draft_is_judged_by_the_confidence_of_the_last():
    """The next token's acceptance is conditioned on the last draft's confidence: after a confident draft the chain
    goes on, after an unsure one it stops — even where most drafts overall were unsure."""
    auto = AutoK(FLAT, draft_s=0.005)
    for _ in range(50):
        auto.ended(3, 3, [0.95, 0.95, 0.95])  # confident chains: all kept
        auto.ended(3, 1, [0.95, 0.15, 0.1])  # an unsure draft after a confident one is rejected
        auto.ended(4, 1, [0.15, 0.15, 0.1, 0.1])  # after an unsure (but accepted) first draft, the next is rejected
    assert auto.p_next(0.95) > 0.6 and auto.p_next(0.15) < 0.1
    assert auto.worth_drafting_more([0.95], 32, p_next=auto.p_next(0.95))
    assert not auto.worth_drafting_more([0.15], 32, p_next=auto.p_next(0.15))


def test_a_cheap_draft_looks_at_its_first_token_before_deciding():
    """Where drafting blind does not pay (a lane running fast, so λ is high, and the first draft's acceptance is
    unsure), drafting one token to see its confidence can: a cheap draft whose first drafts are often confident looks;
    a dear draft, or one whose first drafts are mostly unsure, does not."""
    cal = Calibration()
    auto = AutoK(curve(lambda n: 1.0 + 0.06 * (n - 1)), draft_s=0.014)  # c = 0.14: the int8 0.5B draft, fp32 1.5B target
    auto._tok, auto._units = 12.0, 4.0  # it achieved 3 tokens per unit lately
    auto.start = "bonus"
    for _ in range(30):  # first drafts after a bonus: half confident and kept, half unsure and rejected
        auto.acceptance.saw_first(0.97)
        auto.acceptance.saw_first(0.2)
    auto.acceptance.first["bonus"] = [0.55 * 6, 6.0]
    assert not auto.worth_drafting_more([], 32)  # blind: 0.55 is not worth 3 tokens per unit
    assert auto.worth_a_look(cal, 32)  # but half the time the first draft shows q ≈ 0.97, and a long chain pays
    assert not auto.worth_a_look(cal, 32, extra=2.0)  # not when the draft must first catch up over many tokens
    dear = AutoK(curve(lambda n: 1.0 + 0.06 * (n - 1)), draft_s=0.06)  # c = 0.6
    dear._tok, dear._units, dear.acceptance = 12.0, 4.0, auto.acceptance
    assert not dear.worth_a_look(cal, 32)
    unsure = AutoK(curve(lambda n: 1.0 + 0.06 * (n - 1)), draft_s=0.014)
    unsure._tok, unsure._units = 12.0, 4.0
    for _ in range(60):
        unsure.acceptance.saw_first(0.25)
    assert not unsure.worth_a_look(cal, 32)


def test_a_looks_value_is_the_expected_best_chain_over_the_first_drafts_confidences():
    """The look's value, worked by hand: first drafts half at q ≈ 0.95 (kept 0.9, the next after it 0.9), half at
    q ≈ 0.15 (kept 0.1, the next 0.1); V(n) = 1 + 0.05·(n − 1), c = 0.1, λ = 2. A confident first draft is worth
    max_m [Σ_{l≤m} 0.9^l − 2·(V(m + 1) − V(1) + 0.1·(m − 1))] (m = 11, while 0.9^m > 0.3: 6.17570 − 3.1 = 3.07570),
    an unsure one nothing (0.1 − 2·0.05): so 0.5·3.07570 = 1.53785 — the look pays while λ·(c + extra) is below it,
    up to extra 0.668926; with one draft at most, 0.5·(0.9 − 0.1) = 0.4, up to extra 0.1."""
    auto = AutoK(curve(lambda n: 1.0 + 0.05 * (n - 1)), draft_s=0.01)  # c = 0.1
    auto._tok, auto._units = 20.0, 10.0  # λ = 2
    cal = Calibration()
    a = auto.acceptance
    a.first_q = [0.0] * Calibration.BINS
    a.first_q[9] = a.first_q[1] = 5.0
    cal.acc[9], cal.n[9], cal.acc[1], cal.n[1] = 9.0, 10.0, 1.0, 10.0
    a.after[9], a.after[1] = [9.0, 10.0], [1.0, 10.0]
    assert auto.worth_a_look(cal, 32, extra=0.6689)
    assert not auto.worth_a_look(cal, 32, extra=0.6690)
    assert auto.worth_a_look(cal, 1, extra=0.099)
    assert not auto.worth_a_look(cal, 1, extra=0.101)


def test_calibration_learns_what_the_target_accepts():
    cal = Calibration()
    assert cal(0.95) == pytest.approx(0.95 ** 0.7) and cal(0.55) == pytest.approx(0.55 ** 0.7)  # prior: q^0.7
    for _ in range(50):
        cal.update(0.95, False)
    assert cal(0.95) < 0.15 and cal(0.15) == pytest.approx(0.15 ** 0.7)  # 50 rejections against 6 pseudo-observations


def test_isotonic_fit():
    assert isotonic([1.0, 3.0, 2.0, 4.0]) == (1.0, 2.5, 2.5, 4.0)
    assert isotonic([1.0, 1.0]) == (1.0, 1.0)


def test_smoothing_rests_t1_on_the_narrow_forwards_line():
    """A T(1) measured 20 % high (one noisy point) would make every V(n) 20 % low: it is replaced by the line
    through the forwards of up to 8 tokens."""
    ns = (1, 2, 3, 4, 5, 6, 8, 10, 16)
    true = [0.30 + 0.03 * n for n in ns]
    noisy = list(true)
    noisy[0] *= 1.2
    out = smooth(noisy, ns)
    assert out[0] == pytest.approx(true[0], rel=0.05)
    assert out[-1] == noisy[-1] and list(out) == sorted(out)


def test_smoothing_keeps_a_narrow_forward_that_is_off_its_line_beyond_noise():
    """Measured on AVX-512 with oneDNN (narrow_forwards.py): a 2-token forward dearer than one, 5–6 tokens 20 %
    cheaper. With 11 rounds within ±1 % of each other (after a drift of ±30 % that moved every n of a round alike),
    those medians are kept and V(2) > 1 > V(5), while 3 and 4 tokens, within 3 % of the line (its level: the slopes'
    median is below 0), take the line. From rounds that disagree by up to ±40 % n by n, 12–15 % off the line is noise
    the line replaces, 38 % (V(2)) is not; past 8 tokens the curve never falls."""
    ns = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
    med = [0.283, 0.349, 0.253, 0.249, 0.221, 0.218, 0.290, 0.298, 0.285, 0.330]

    def rounds(spread: float, drift: float = 0.0) -> list[list[float]]:
        rng = random.Random(0)
        return [[m * (1 + drift * (j - 5) / 5) * (1 + spread * rng.uniform(-1, 1)) for j in range(11)] for m in med]

    out = smooth(med, ns, rounds=rounds(0.01, drift=0.3))
    assert [out[i] for i in (0, 1, 4, 5, 6)] == [med[i] for i in (0, 1, 4, 5, 6)]
    assert out[2] == out[3] == pytest.approx(0.253)
    v = [t / out[0] for t in out]
    assert v[1] > 1.2 and v[4] < 0.8
    assert out[7] == out[8] == pytest.approx((0.298 + 0.285) / 2) and list(out[6:]) == sorted(out[6:])
    noisy = smooth(med, ns, rounds=rounds(0.4))
    assert noisy[1] == med[1] and noisy[0] == noisy[4] == noisy[5] == pytest.approx(0.253)
    assert smooth(med, ns) == isotonic([0.253] * 7 + med[7:])  # no rounds: every narrow point takes the line
    assert median_error([1.0, 1.0, 1.0]) == math.inf  # three rounds say nothing of their spread


def ctx(ids, last=None, max_k=100):
    return DraftContext(list(ids), max_k, last=last)


def test_ngram_auto_keeps_what_pays_and_learns_from_every_lookup():
    text = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    d = NGramDrafter(3, 8, auto=AutoK(FLAT))
    d.start(text)
    p = d.propose(ctx(text))
    assert p.ids and p.ids == text[len(text) - 8 : len(text) - 8 + len(p.ids)] and "k=auto" in p.why
    # on a steep curve a lookup drafts nothing, but what followed still teaches it
    d2 = NGramDrafter(3, 8, auto=AutoK(STEEP))
    d2.start(text)
    assert d2.propose(ctx(text)).ids == []
    before = d2._p(3, 1)
    seq = text + [5]  # the target emitted what the lookup would have proposed first
    d2.propose(ctx(seq))
    assert d2._p(3, 1) > before


def test_ngram_auto_is_honest_about_no_match():
    d = NGramDrafter(3, 8, auto=AutoK(FLAT))
    d.start([1, 2, 3])
    p = d.propose(ctx([1, 2, 3]))
    assert p.ids == [] and "no earlier occurrence" in p.why


def test_what_k_auto_learnt_carries_over_to_the_next_lane_of_the_same_pair():
    """A k=auto draft lane starts from a copy of what the last lane of its (target, draft) pair learnt in this process
    (policy.recall / remember): the calibration of the draft's confidence and the acceptance estimates; the copy is its
    own (the earlier lane's state is not changed by the later one), another pair starts from the priors."""
    import uuid

    from app.speculative.drafters import DraftModelDrafter

    key = ("target-profile", "draft-profile", uuid.uuid4().hex)  # its own pair, whatever ran before in this process

    def auto():
        return AutoK(curve(lambda n: 1.0 + 0.02 * (n - 1)), draft_s=0.01)

    first = DraftModelDrafter(None, auto=auto(), memory=key)
    fresh = first.calibration(0.95)
    for _ in range(40):  # the target rejects the draft's confident tokens
        first._scores = [0.95, 0.95]
        first.feedback(2, 0)
    learnt = first.calibration(0.95)
    assert learnt < 0.3 < fresh
    second = DraftModelDrafter(None, auto=auto(), memory=key)
    assert second.calibration(0.95) == pytest.approx(learnt) and second.auto is not first.auto
    assert second.auto.acceptance.p_first("miss") == pytest.approx(first.auto.acceptance.p_first("miss"))
    assert second.auto.start == "skip"  # a new answer: nothing ended before it
    for _ in range(40):
        second._scores = [0.95]
        second.feedback(1, 1)
    assert first.calibration(0.95) == pytest.approx(learnt) and second.calibration(0.95) > learnt
    assert DraftModelDrafter(None, auto=auto(), memory=(*key, "other")).calibration(0.95) == pytest.approx(fresh)
    assert DraftModelDrafter(None, auto=auto()).calibration(0.95) == pytest.approx(fresh)
    # a warm-up lane starts from what was learnt but leaves it as it was (it rehearses a prompt a measured lane runs)
    before = DraftModelDrafter(None, auto=auto(), memory=key).calibration(0.95)
    warm = DraftModelDrafter(None, auto=auto(), memory=key, learn=False)
    assert warm.calibration(0.95) == pytest.approx(before)
    for _ in range(40):
        warm._scores = [0.95]
        warm.feedback(1, 0)
    assert warm.calibration(0.95) < before
    assert DraftModelDrafter(None, auto=auto(), memory=key).calibration(0.95) == pytest.approx(before)


def test_a_first_draft_dropped_unverified_still_counts():
    """A step whose drafts the policy all dropped gets no verdict; the first draft's calibrated acceptance counts
    instead (a soft verdict), so a lane that keeps drafting one token and dropping it learns to stop drafting."""
    auto = AutoK(curve(lambda n: 1.0 + 0.05 * (n - 1)), draft_s=0.02)
    before = auto.acceptance.p_first("skip")
    for _ in range(30):
        auto.ended(0, 0, [], dropped=0.1)
    assert auto.acceptance.p_first("skip") < 0.25 < before
    assert auto.acceptance.p_first("bonus") == pytest.approx(auto.acceptance.p_first("partial"))  # only where it was


class Scripted:
    """A draft engine whose every next token is 9 with probability `q` (the policy's input, not a model): new_state()
    gives a state with forward(ids, last_only) -> logits [1, 10] and crop(n)."""

    def __init__(self, q: float = 0.87) -> None:
        self.q = q

    def sync(self):
        pass

    def new_state(self):
        import torch

        probs = torch.full((10,), (1.0 - self.q) / 9)
        probs[9] = self.q

        class State:
            def forward(self, ids, last_only=True):
                return probs.log()[None]

            def crop(self, n):
                pass

        return State()


def test_the_answers_opening_teaches_nothing_about_later_tokens():
    """Step 0's first draft is the answer's first token, where a draft and its target differ far more than later
    (AutoK.ended): its acceptance is the opening's own estimate (at most); a confident opening draft rejected teaches
    that estimate and leaves the calibration, the first-draft estimate and the
    histogram of first-draft confidences as they were, and the next step starts as after a skip; the same rejection
    one step later is learnt."""
    from app.speculative.drafters import DraftModelDrafter

    auto = AutoK(FLAT, draft_s=0.005)
    d = DraftModelDrafter(Scripted(), auto=auto)
    prompt = [1, 2, 3]
    d.start(prompt)
    cal0, first0, seen0 = d.calibration(0.87), auto.acceptance.p_first("skip"), list(auto.acceptance.first_q)
    p = d.propose(ctx(prompt))  # step 0: the drafts ride on the prompt's forward
    assert p.ids and p.ids[0] == 9 and p.q_drafted[0] == pytest.approx(0.87)
    assert "P(all accepted) 0.60 " in p.why  # the opening's own estimate caps calibrated 0.87^0.7 = 0.91
    d.feedback(len(p.ids), 0)
    assert auto.acceptance.p_opening == pytest.approx(3.6 / 7)  # it learns the opening's own estimate instead
    assert d.calibration(0.87) == cal0 and auto.acceptance.p_first("skip") == first0
    assert auto.acceptance.first_q == seen0 and auto.start == "skip"
    p = d.propose(ctx([*prompt, 5]))  # step 1
    assert p.ids
    d.feedback(len(p.ids), 0)
    assert d.calibration(0.87) < cal0 and auto.acceptance.p_first("skip") < first0 and auto.start == "miss"
    assert sum(auto.acceptance.first_q) == pytest.approx(sum(seen0) + 1)


def test_an_unsure_opening_draft_is_valued_at_the_openings_own_estimate():
    """How sure the draft is of an answer's first token says little of whether the target keeps it (24 Spec-Bench
    openings: 3 of 6 kept at confidence ≥ 0.7, 4 of 8 below 0.5; a q = 0.27 opening began a run of 13 kept drafts), so
    the opening step values its first draft at the opening's own estimate — not at the calibrated 0.3^0.7 = 0.43 — and
    drafts on past it, riding on the prompt's forward; one step later the same confidence is calibrated."""
    from app.speculative.drafters import DraftModelDrafter

    auto = AutoK(FLAT, draft_s=0.005)
    d = DraftModelDrafter(Scripted(q=0.3), auto=auto)
    prompt = [1, 2, 3]
    d.start(prompt)
    p = d.propose(ctx(prompt))  # step 0
    assert "P(all accepted) 0.60 " in p.why and len(p.ids) >= 2
    d.feedback(len(p.ids), 1)
    p = d.propose(ctx([*prompt, 9, 5]))  # step 1: the first draft at its calibrated acceptance
    # (shifted to this answer: the opening's second draft, rejected, is this answer's first verdict: AutoK.local)
    assert auto.shift < 0
    assert p.why.split("P(all accepted) ")[1].startswith(f"{auto.local(d.calibration(0.3)):.2f}")


def test_an_answers_own_verdicts_shift_its_estimates_and_the_next_answer_starts_unshifted():
    """The estimates are learnt over many answers (from a saved memory, over hundreds of verdicts: one answer's few do
    not move them). An answer whose confident drafts the target rejects step after step (a Spec-Bench editing prompt:
    140 drafted, 39 kept) shifts them for itself, in log-odds (AutoK.local), and its proposals shorten; the next answer
    starts from the estimates as learnt."""
    from app.speculative.drafters import DraftModelDrafter

    auto = AutoK(FLAT, draft_s=0.005)
    d = DraftModelDrafter(Scripted(q=0.95), auto=auto)
    d.calibration = Calibration(weight=200.0)  # as firm as a saved memory's
    learnt = d.calibration(0.95)
    prompt = [1, 2, 3]
    d.start(prompt)
    d.feedback(len(d.propose(ctx(prompt)).ids), 0)  # the opening: its first draft teaches nothing (AutoK.ended)
    seq, lengths = [*prompt, 5], []
    for _ in range(4):  # every step: the first draft rejected
        p = d.propose(ctx(seq))
        lengths.append(len(p.ids))
        d.feedback(len(p.ids), 0)
        seq.append(5)
    now = d.calibration(0.95)
    # the learnt estimate barely moved (4 verdicts against 200); this answer's moved more than three times as far
    assert auto.shift < -0.5 and now - auto.local(now) > 3 * (learnt - now) > 0
    assert lengths[-1] < lengths[0]
    assert "this answer's drafts kept less often than learnt" in d.propose(ctx(seq)).why
    d.start(prompt)  # the next answer
    assert auto.shift == 0.0 and auto.local(0.9) == 0.9


def test_an_answers_shift_is_a_newton_step_on_a_gaussian_prior():
    """One verdict moves the shift by (kept − p) / (1 / ANSWER_SHIFT_VAR + Σ p(1 − p)): worked by hand at the prior's
    variance 0.25 (precision 4)."""
    from app.speculative.policy import ANSWER_SHIFT_VAR

    assert ANSWER_SHIFT_VAR == 0.25
    auto = AutoK(FLAT, draft_s=0.005)
    auto.answer_verdict(0.9, False)
    assert auto.shift == pytest.approx(-0.9 / 4.09)
    p = auto.local(0.9)
    assert p == pytest.approx(1 / (1 + math.exp(-(math.log(9) - 0.9 / 4.09))))
    auto.answer_verdict(p, True)
    assert auto.shift == pytest.approx(-0.9 / 4.09 + (1 - p) / (4.09 + p * (1 - p)))


def test_an_answer_starts_from_the_rate_over_earlier_answers():
    """λ, the rate a step must beat, is what the lane achieved over its recent steps; when a new answer starts it is
    the rate over the earlier answers (worth START_UNITS), not the last answer's last steps — an easy answer's rate
    kept a summary's opening, and a translation's unsure tokens, from being drafted."""
    from app.speculative.drafters import DraftModelDrafter
    from app.speculative.policy import START_UNITS

    auto = AutoK(FLAT, draft_s=0.005)
    t1 = FLAT.t1_s
    for emitted in [1] * 20:  # a hard answer: a token a step
        auto.observe(StepTiming(1, t1, 0.0, 0, t1, emitted))
    for emitted in (9, 9, 9, 9, 9, 9):  # then an easy one: 9 tokens a step, the last steps' rate
        auto.observe(StepTiming(9, auto.t(9) * t1, 0.0, 0, auto.t(9) * t1, emitted))
    late = auto.rate
    units = 20 * 1.0 + 6 * auto.t(9)  # each step's modelled units (o = 0 here)
    over_all = (20 + 54) / units
    assert late > over_all * 1.5
    d = DraftModelDrafter(Scripted(), auto=auto)
    d.start([1, 2, 3])  # a new answer
    assert auto.rate == pytest.approx(over_all) and auto._units == START_UNITS
    auto.observe(StepTiming(1, t1, 0.0, 0, t1, 1))  # its own steps move it at once
    assert auto.rate < over_all


def test_what_k_auto_learnt_is_saved_for_the_next_run(tmp_path, monkeypatch):
    """A real lane (saved=True) writes what its pair learnt when it ends (DraftModelDrafter.finish); a drafter of the
    same pair in a new process — no in-process memory — starts from it, each estimate worth at most SAVED_CAP verdicts
    with its mean kept, and says so in its notes. Another pair, a damaged file, or SPECDECK_KAUTO_MEMORY=off start
    from the priors; a replay's drafter (saved=False) neither reads nor writes. `saved_summary` tells what is saved
    (`profile --draft` shows it) and `forget_saved` deletes it."""
    import json
    import uuid

    from app.speculative import policy
    from app.speculative.drafters import DraftModelDrafter

    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(tmp_path / "kauto"))
    key = ("target-profile", "draft-profile", uuid.uuid4().hex)

    def auto():
        return AutoK(curve(lambda n: 1.0 + 0.02 * (n - 1)), draft_s=0.01)

    first = DraftModelDrafter(None, auto=auto(), memory=key, saved=True)
    fresh = first.calibration(0.95)
    assert first.notes == []
    for _ in range(300):  # the target rejects the draft's confident tokens: 300 verdicts, more than SAVED_CAP
        first._scores = [0.95, 0.95]
        first.feedback(2, 0)
    first.auto._all_tok, first.auto._all_units = 30.0, 10.0  # the rate over its answers (AutoK.begin_answer)
    first.finish()
    learnt = first.calibration(0.95)
    assert learnt < 0.1 < fresh
    files = list((tmp_path / "kauto").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["answers"] == 1

    policy.forget(key)  # a new process: nothing learnt in memory
    second = DraftModelDrafter(None, auto=auto(), memory=key, saved=True)
    b = Calibration.bin(0.95)
    assert second.calibration(0.95) == pytest.approx(learnt) and second.calibration.n[b] == pytest.approx(policy.SAVED_CAP)
    assert second.auto.acceptance.p_first("miss") == pytest.approx(first.auto.acceptance.p_first("miss"))
    assert second.auto.answers == 1 and second.auto.start == "skip"
    assert (second.auto._all_tok, second.auto._all_units) == (30.0, 10.0)
    assert len(second.notes) == 1 and "1 earlier answer" in second.notes[0] and "SPECDECK_KAUTO_MEMORY=off" in second.notes[0]
    for _ in range(100):  # capped, the saved state still moves with what this run sees
        second._scores = [0.95]
        second.feedback(1, 1)
    assert second.calibration(0.95) > 0.45

    assert DraftModelDrafter(None, auto=auto(), memory=(*key, "other"), saved=True).calibration(0.95) == pytest.approx(fresh)
    policy.forget(key)
    assert DraftModelDrafter(None, auto=auto(), memory=key).calibration(0.95) == pytest.approx(fresh)  # not a real lane
    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", "off")
    off = DraftModelDrafter(None, auto=auto(), memory=key, saved=True)
    assert off.calibration(0.95) == pytest.approx(fresh) and off.notes == []
    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(tmp_path / "kauto"))
    good = files[0].read_text()
    doc = json.loads(good)
    doc["costs"]["c"] = float("nan")
    for text in (good[:-20], json.dumps(doc)):  # cut short; a cost that is not a number
        files[0].write_text(text)
        damaged = DraftModelDrafter(None, auto=auto(), memory=key, saved=True)
        assert damaged.calibration(0.95) == pytest.approx(fresh) and damaged.notes == []
        if text == good[:-20]:
            assert policy.saved_summary(key) is None  # nothing readable: `profile` says nothing is saved
    policy.forget(key)

    # what `profile --draft` shows and `--forget-kauto` deletes
    files[0].write_text(good)
    summary = policy.saved_summary(key)
    assert summary is not None and summary["answers"] == 1 and summary["path"] == str(files[0])
    assert summary["kept"]["q>=0.9"] < 0.1  # the rejections it saved
    assert policy.saved_summary((*key, "other")) is None
    assert policy.forget_saved(key) == files[0] and not files[0].exists()
    assert policy.forget_saved(key) is None and policy.saved_summary(key) is None
    assert DraftModelDrafter(None, auto=auto(), memory=key, saved=True).calibration(0.95) == pytest.approx(fresh)
    policy.forget(key)


def test_k_auto_memory_is_never_an_error_where_it_cannot_be_written(tmp_path, monkeypatch):
    """A folder that cannot be made (a file in its place) leaves the lane as it was: nothing saved, no error."""
    import uuid

    from app.speculative import policy
    from app.speculative.drafters import DraftModelDrafter

    (tmp_path / "taken").write_text("a file where the folder should be")
    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(tmp_path / "taken" / "kauto"))
    key = ("t", "d", uuid.uuid4().hex)
    d = DraftModelDrafter(None, auto=AutoK(FLAT, draft_s=0.01), memory=key, saved=True)
    d._scores = [0.9]
    d.feedback(1, 1)
    d.finish()
    assert policy.save_learnt(key, d.auto, d.calibration) is None
    policy.forget(key)
    monkeypatch.delenv("SPECDECK_KAUTO_MEMORY")
    monkeypatch.setenv("SPECDECK_PROFILES", str(tmp_path / "profiles"))
    assert policy.saved_dir() == tmp_path / "profiles" / "kauto"


LLAMA = curve(lambda n: 1.0 + 0.37 * (n - 1))  # llama.cpp Q4_K_M, the 1.5B target on a 2-core Xeon: V(2) 1.37
LLAMA_DRAFT = curve(lambda n: 1.0 + 0.24 * (n - 1), t1=0.045)  # the 0.5B draft: c 0.45, V(33) 8.7 (measured 8.45)


def test_the_draft_reads_the_context_only_where_drafting_saves_enough_to_repay_it():
    """Reading the prompt into the draft is paid once an answer, before its first draft; k=auto reads only where what
    drafting saved a token lately, over the tokens left, repays it (AutoK.worth_reading). On llama.cpp on a 2-core Xeon
    the 0.5B draft took 4–14 decode steps to read a Spec-Bench prompt and drafting saved −0.3 … 3 steps an answer,
    which put k=auto 9 % below the baseline. What a step saved is measured as a ratio to its own verify time: three
    times slower, the same steps teach the same."""
    from app.speculative.drafters import DraftModelDrafter
    from app.speculative.policy import SAVING_PRIOR, SAVING_WEIGHT

    auto = AutoK(LLAMA, draft=LLAMA_DRAFT)
    assert auto.saving == pytest.approx(SAVING_PRIOR)
    read = auto.catch_up_units(61)  # code-1's prompt: c · (T_d(61) − T_d(1)) / T_d(1) = 0.45 · 0.24 · 60
    assert read == pytest.approx(0.45 * 0.24 * 60)
    assert auto.worth_reading(61, 48)  # the prior: 0.3 · 48 = 14.4 units over the answer, more than 6.5

    def drafting_steps(a: AutoK, slow: float) -> None:
        t1 = LLAMA.t1_s * slow
        for _ in range(10):  # one draft a step, kept: 2 tokens in V(2) + c = 1.82 units, 0.09 saved a token
            a.count_saving(StepTiming(2, a.t(2) * t1, 0.45 * t1, 1, (a.t(2) + 0.45) * t1, 2))
        for _ in range(30):  # nothing drafted: 1 token in 1 unit, nothing saved
            a.count_saving(StepTiming(1, t1, 0.0, 0, t1, 1))
        for _ in range(4):  # one draft, rejected: 1 token in 1.82 units
            a.count_saving(StepTiming(2, a.t(2) * t1, 0.45 * t1, 1, (a.t(2) + 0.45) * t1, 1))

    drafting_steps(auto, 1.0)
    slower = AutoK(LLAMA, draft=LLAMA_DRAFT)
    drafting_steps(slower, 3.0)
    assert slower.saving == pytest.approx(auto.saving)
    saved = 10 * (2 - 1.82) + 4 * (1 - 1.82)
    assert auto.saving == pytest.approx((SAVING_PRIOR * SAVING_WEIGHT + saved) / (SAVING_WEIGHT + 10 * 2 + 30 + 4))  # 0.047
    assert not auto.worth_reading(61, 48)  # 0.047 · 48 = 2.3 units over the answer: less than the reading's 6.5
    assert auto.worth_reading(10, 48)  # a short prompt is still worth reading (1.0 unit)
    assert auto.worth_reading(61, 400)  # and a long answer repays a long prompt

    # the drafter, on a target where drafting these sure tokens pays: with what `auto` learnt it reads nothing, makes no
    # draft state, and the step says why; from the prior it reads and drafts
    made = []

    class Counting(Scripted):
        def new_state(self):
            made.append(1)
            return super().new_state()

    prompt = list(range(100))  # reading it: 10.7 units
    learnt = AutoK(FLAT, draft=LLAMA_DRAFT)
    learnt._saved, learnt._saved_tok = auto._saved, auto._saved_tok
    for a, reads in ((learnt, False), (AutoK(FLAT, draft=LLAMA_DRAFT), True)):
        d = DraftModelDrafter(Counting(q=0.99), auto=a)
        d.start(prompt)
        d.feedback(len(d.propose(ctx(prompt, max_k=47)).ids), 0)  # the opening
        p = d.propose(ctx([*prompt, 5], max_k=46))
        if reads:
            assert p.ids and made == [1]
        else:
            assert p.ids == [] and made == [] and "reading the 101 tokens so far into the draft would cost 10.8" in p.why

    # what was measured fades per answer (a pair that stopped reading probes again, where a prompt is cheap to read)
    low = auto.saving
    for _ in range(10):
        auto.begin_answer()
    assert low < auto.saving < SAVING_PRIOR


def test_what_drafting_saves_is_learnt_per_category_of_prompt():
    """What drafting saves a token is learnt per category of prompt where the prompt has one (AutoK.saving_of): a
    category where drafting lost does not keep the draft from reading another's prompts, which start from the prior
    — on llama.cpp the best fixed setting made 1.09–1.23x the baseline on two coding prompts and 0.79–0.86x on the
    translation ones, and one pooled saving, after a probe on a QA prompt, kept every coding prompt unread. Every
    category's steps count in the pooled saving too, which prompts without a category use; a category's own saving
    fades per answer of that category only."""
    from app.speculative.drafters import DraftModelDrafter
    from app.speculative.policy import SAVING_DECAY, SAVING_PRIOR, SAVING_WEIGHT

    auto = AutoK(LLAMA, draft=LLAMA_DRAFT)
    t1 = LLAMA.t1_s
    auto.begin_answer("qa")
    for _ in range(20):  # one draft a step, rejected: 1 token in V(2) + c = 1.82 units, 0.82 lost
        auto.count_saving(StepTiming(2, auto.t(2) * t1, 0.45 * t1, 1, (auto.t(2) + 0.45) * t1, 1))
    lost = (SAVING_PRIOR * SAVING_WEIGHT - 20 * 0.82) / (SAVING_WEIGHT + 20)
    assert lost < 0 and auto.saving == pytest.approx(lost) and auto.saving_of("qa") == pytest.approx(lost)
    assert auto.saving_of("") == pytest.approx(lost)  # the pooled saving counted the same steps
    assert not auto.worth_reading(43, 48)  # qa-1's prompt: not read again soon
    auto.begin_answer("coding")
    assert auto.saving == pytest.approx(SAVING_PRIOR) and auto.worth_reading(61, 48)  # a category not met: the prior
    for _ in range(10):  # two drafts a step, both kept: 3 tokens in V(3) + 2c = 2.64 units, 0.36 saved
        auto.count_saving(StepTiming(3, auto.t(3) * t1, 0.9 * t1, 2, (auto.t(3) + 0.9) * t1, 3))
    coding = (SAVING_PRIOR * SAVING_WEIGHT + 10 * 0.36) / (SAVING_WEIGHT + 30)
    assert auto.saving_of("coding") == pytest.approx(coding) and auto.worth_reading(61, 48)
    assert auto.saving_of("qa") == pytest.approx(lost)  # untouched by the coding answer
    pooled = (SAVING_PRIOR * SAVING_WEIGHT + SAVING_DECAY * -20 * 0.82 + 10 * 0.36) / (SAVING_WEIGHT + SAVING_DECAY * 20 + 30)
    assert auto.saving_of("") == pytest.approx(pooled)
    auto.begin_answer("qa")  # a QA answer fades QA's own saving (and the pooled), not coding's
    assert auto.saving_of("qa") == pytest.approx((SAVING_PRIOR * SAVING_WEIGHT - SAVING_DECAY * 20 * 0.82) / (SAVING_WEIGHT + SAVING_DECAY * 20))
    assert auto.saving_of("coding") == pytest.approx(coding)
    auto.begin_answer()  # a prompt without a category: the pooled saving decides
    assert auto.category == "" and auto.saving == pytest.approx(auto.saving_of(""))

    # the drafter passes its prompt's category on: with what `auto` learnt, on a target where drafting these sure
    # tokens pays, a QA prompt is not read and its step says whose saving held it back; a coding prompt is read
    learnt = AutoK(FLAT, draft=LLAMA_DRAFT)
    learnt._saved, learnt._saved_tok = auto._saved, auto._saved_tok
    learnt._saved_by = {c: list(v) for c, v in auto._saved_by.items()}
    prompt = list(range(43))
    for category, reads in (("qa", False), ("coding", True)):
        d = DraftModelDrafter(Scripted(q=0.99), auto=learnt, category=category)
        d.start(prompt)
        d.feedback(len(d.propose(ctx(prompt, max_k=47)).ids), 0)  # the opening
        p = d.propose(ctx([*prompt, 5], max_k=46))
        assert bool(p.ids) == reads, (category, p.why)
        if not reads:
            assert "drafting saved here lately on qa prompts" in p.why


def test_runs_of_confident_drafts_are_learnt_per_category_of_prompt():
    """How often a draft after a confident one is kept, and a step's first draft, are learnt per category of prompt
    where the prompt has one (Acceptance.by_category): a category's own verdicts around the pooled estimate worth
    CATEGORY_WEIGHT verdicts, every verdict counted in the pooled estimate too, which prompts without a category use.
    On a target where the fifth verified token costs a draft forward and half a decode step more, a draft after three
    sure ones is drafted on a coding prompt, whose runs of sure drafts were kept, and not on a QA one, whose were cut
    short — on llama.cpp the pooled 0.92 had stopped every coding proposal at 3 drafts."""
    from app.speculative.drafters import DraftModelDrafter
    from app.speculative.policy import CATEGORY_WEIGHT

    wide = curve(lambda n: 1.0 + 0.5 * (n - 1))  # V(n + 1) − V(n) = 0.5; with c = 0.45 a draft must be kept 0.95 to pay
    auto = AutoK(wide, draft=LLAMA_DRAFT)
    auto.begin_answer("coding")
    for _ in range(10):  # proposals of 4 sure drafts, all kept: 3 "after" verdicts each, kept
        auto.ended(4, 4, [0.99] * 4)
    auto.begin_answer("qa")
    for _ in range(10):  # the same proposals, the third draft rejected: 2 verdicts each, 1 kept
        auto.ended(4, 2, [0.99] * 4)
    a = auto.acceptance
    prior = 6.0 * 0.95 ** 0.7  # the pooled prior of the top bin: PRIOR_WEIGHT verdicts of its centre's q^0.7
    pooled = (prior + 30 + 10) / (6.0 + 30 + 20)
    assert a.by_category["coding"]["after"][9] == [30.0, 30.0] and a.by_category["qa"]["after"][9] == [10.0, 20.0]
    assert a.after[9] == [pytest.approx(prior + 40), 56.0]
    assert auto.p_next(0.99) == pytest.approx((10 + CATEGORY_WEIGHT * pooled) / (20 + CATEGORY_WEIGHT))  # qa
    qa = auto.p_next(0.99)
    auto.begin_answer("coding")
    coding = auto.p_next(0.99)
    assert coding == pytest.approx((30 + CATEGORY_WEIGHT * pooled) / (30 + CATEGORY_WEIGHT))
    assert qa < 0.95 < coding and qa < pooled < coding
    auto.begin_answer()  # a prompt without a category: the pooled estimates
    assert auto.p_next(0.99) == pytest.approx(pooled)
    # a step's first draft, by how the previous step ended: coding's after fully kept steps, qa's after partial ones
    assert a.by_category["coding"]["first"]["bonus"] == [9.0, 9.0] and a.by_category["qa"]["first"]["partial"] == [9.0, 9.0]
    assert a.by_category["coding"]["first"]["partial"] == [0.0, 0.0]
    auto.begin_answer("coding")
    assert auto.acceptance.p_first("partial") == pytest.approx(a.first["partial"][0] / a.first["partial"][1])  # none of its own
    assert auto.acceptance.p_first("bonus") > a.first["bonus"][0] / a.first["bonus"][1]
    auto.begin_answer("translation")  # a category not met: the pooled estimates, until its own verdicts come
    assert auto.p_next(0.99) == pytest.approx(pooled)

    # the decision: three sure drafts made (each kept 0.999 of the time), one more?
    for category, more in (("coding", True), ("qa", False), ("", False)):
        auto.begin_answer(category)
        assert auto.worth_drafting_more([0.999, 0.998, 0.997], 32, p_next=auto.p_next(0.99)) == more, category

    # a drafter on a coding prompt proposes more of the same sure drafts than on a QA prompt (its calibration: sure
    # drafts are kept)
    prompt = list(range(8))
    lengths = {}
    for category in ("coding", "qa"):
        learnt = copy.deepcopy(auto)
        d = DraftModelDrafter(Scripted(q=0.99), auto=learnt, category=category)
        for _ in range(300):
            d.calibration.update(0.99, True)
        d.start(prompt)
        d.feedback(len(d.propose(ctx(prompt, max_k=47)).ids), 0)  # the opening
        lengths[category] = len(d.propose(ctx([*prompt, 5], max_k=46)).ids)
    assert lengths["coding"] > lengths["qa"] >= 1, lengths


def test_what_drafting_saved_is_saved_with_the_rest_of_k_autos_memory(tmp_path, monkeypatch):
    """What drafting saved a token (AutoK.saving), over every prompt and per category (AutoK.saving_of), is written
    with what the pair learnt and read back by its next run, each worth at most SAVING_CAP tokens; `saved_summary`
    and `saving_words` show them as `profile` does; a file from before they were saved starts them from the prior,
    the rest of the file still read; a damaged one is ignored, by `profile` too."""
    import json
    import uuid

    from app.speculative import policy
    from app.speculative.drafters import DraftModelDrafter
    from app.speculative.policy import SAVING_CAP, SAVING_POLICY, SAVING_PRIOR, SAVING_WEIGHT

    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(tmp_path / "kauto"))
    key = ("t", "d", uuid.uuid4().hex)
    first = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    first.auto._saved, first.auto._saved_tok = -4.0, 200.0  # what its steps measured (AutoK.count_saving)
    first.auto._saved_by = {"qa": [-6.0, 100.0], "coding": [2.0, 100.0]}  # and per category
    first.finish()
    policy.forget(key)
    second = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    assert second.notes and (second.auto._saved, second.auto._saved_tok) == (-4.0, 200.0)
    assert second.auto.saving == pytest.approx((SAVING_PRIOR * SAVING_WEIGHT - 4.0) / (SAVING_WEIGHT + 200.0))
    assert second.auto.saving_of("qa") == pytest.approx((SAVING_PRIOR * SAVING_WEIGHT - 6.0) / (SAVING_WEIGHT + 100.0))
    assert second.auto.saving_of("coding") == pytest.approx((SAVING_PRIOR * SAVING_WEIGHT + 2.0) / (SAVING_WEIGHT + 100.0))
    summary = policy.saved_summary(key)
    assert summary["saving_by_category"] == {"coding": (pytest.approx(second.auto.saving_of("coding")), 100.0),
                                             "qa": (pytest.approx(second.auto.saving_of("qa")), 100.0)}
    assert policy.saving_words(summary) == (f"drafting saved {second.auto.saving:.2f} of a decode step a token (by category: "
                                            f"coding {second.auto.saving_of('coding'):.2f}, qa {second.auto.saving_of('qa'):.2f})")
    policy.forget(key)
    path = next((tmp_path / "kauto").glob("*.json"))
    doc = json.loads(path.read_text())
    del doc["saving"]
    path.write_text(json.dumps(doc))
    older = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    assert older.notes and older.auto.saving == pytest.approx(SAVING_PRIOR) and older.auto.saving_of("qa") == pytest.approx(SAVING_PRIOR)
    assert policy.saved_summary(key)["saving"] == pytest.approx(SAVING_PRIOR)
    assert policy.saving_words(policy.saved_summary(key)) == f"drafting saved {SAVING_PRIOR:.2f} of a decode step a token"
    policy.forget(key)
    for bad in ([1, 2], {"units": float("nan"), "tokens": 3.0}, {"units": 1.0, "tokens": -3.0},  # damaged: ignored
                {"units": 1.0, "tokens": 3.0, "by_category": [1, 2]}, {"units": 1.0, "tokens": 3.0, "by_category": {"qa": [1.0, -3.0]}},
                {"units": 1.0, "tokens": 3.0, "by_category": {"qa": [1.0]}}):
        doc["saving"] = bad
        path.write_text(json.dumps(doc))
        damaged = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
        assert damaged.notes == [] and damaged.auto.saving == pytest.approx(SAVING_PRIOR)
        assert policy.saved_summary(key) is None  # `profile` and the Costs tab ignore it as load_learnt does
        policy.forget(key)
    # what many runs measured is worth at most SAVING_CAP tokens when a run starts from it, its mean kept
    doc["saving"] = {"units": 20.0, "tokens": 2000.0, "by_category": {"coding": [30.0, 1000.0]}, "policy": SAVING_POLICY}
    path.write_text(json.dumps(doc))
    many = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    assert (many.auto._saved, many.auto._saved_tok) == (pytest.approx(20.0 * SAVING_CAP / 2000.0), SAVING_CAP)
    assert many.auto._saved_by == {"coding": [pytest.approx(30.0 * SAVING_CAP / 1000.0), SAVING_CAP]}
    policy.forget(key)


def test_acceptance_by_category_is_saved_and_savings_of_an_earlier_rule_are_not(tmp_path, monkeypatch):
    """The acceptance estimates per category (Acceptance.by_category) are written with what the pair learnt and read
    back by its next run, each count worth at most SAVED_CAP verdicts; `saved_summary` and `sure_words` show how often
    a draft after a sure one was kept, pooled and per category, as `profile` and the Costs tab do. A file from before
    they were saved starts every category from the pooled estimates, the rest still read; a damaged one is ignored.
    What drafting saved measured the steps of the rule that saved it: a file of an earlier rule (SAVING_POLICY) starts
    the savings from the prior and keeps what the pair's verdicts taught."""
    import json
    import uuid

    from app.speculative import policy
    from app.speculative.drafters import DraftModelDrafter
    from app.speculative.policy import CATEGORY_WEIGHT, SAVED_CAP, SAVING_PRIOR, SAVING_WEIGHT

    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(tmp_path / "kauto"))
    key = ("t", "d", uuid.uuid4().hex)
    first = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    a = first.auto.acceptance
    a.begin("coding")
    a.by_category["coding"]["after"][9] = [290.0, 300.0]  # many verdicts: worth SAVED_CAP when read back
    a.begin("qa")
    a.by_category["qa"]["after"][9] = [8.0, 10.0]
    a.by_category["qa"]["first"]["bonus"] = [3.0, 4.0]
    first.auto._saved_by = {"coding": [2.0, 100.0]}
    first.finish()
    policy.forget(key)
    second = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    b = second.auto.acceptance
    assert second.notes and b.by_category["coding"]["after"][9] == [pytest.approx(290.0 * SAVED_CAP / 300.0), SAVED_CAP]
    assert b.by_category["qa"]["after"][9] == [8.0, 10.0] and b.by_category["qa"]["first"]["bonus"] == [3.0, 4.0]
    assert b.by_category["qa"]["pooled"] == [0.0, 0.0]
    pooled = b.after[9][0] / b.after[9][1]
    assert second.auto.saving_of("coding") == pytest.approx((SAVING_PRIOR * SAVING_WEIGHT + 2.0) / (SAVING_WEIGHT + 100.0))
    second.auto.begin_answer("coding")
    coding = (290.0 * SAVED_CAP / 300.0 + CATEGORY_WEIGHT * pooled) / (SAVED_CAP + CATEGORY_WEIGHT)
    assert second.auto.p_next(0.99) == pytest.approx(coding)
    summary = policy.saved_summary(key)
    qa = (8.0 + CATEGORY_WEIGHT * pooled) / (10.0 + CATEGORY_WEIGHT)
    assert summary["sure_next"] == pytest.approx(pooled)
    assert summary["sure_next_by_category"] == {"coding": (pytest.approx(coding), SAVED_CAP), "qa": (pytest.approx(qa), 10.0)}
    assert policy.sure_words(summary) == (f"after a draft of confidence ≥ 0.9 the next was kept {pooled:.2f} of the time "
                                          f"(by category: coding {coding:.2f}, qa {qa:.2f})")
    policy.forget(key)
    path = next((tmp_path / "kauto").glob("*.json"))
    doc = json.loads(path.read_text())
    saved = json.loads(json.dumps(doc))

    # savings measured by an earlier rule (files without the field are of revision 1): from the prior, the rest read
    for revision in (None, 1):
        doc = json.loads(json.dumps(saved))
        if revision is None:
            del doc["saving"]["policy"]
        else:
            doc["saving"]["policy"] = revision
        path.write_text(json.dumps(doc))
        earlier = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
        assert earlier.notes and earlier.auto.saving_of("coding") == pytest.approx(SAVING_PRIOR) and earlier.auto._saved_by == {}
        assert earlier.auto.acceptance.by_category["coding"]["after"][9][1] == SAVED_CAP
        assert policy.saved_summary(key)["saving_by_category"] == {}
        policy.forget(key)
    # a file from before the acceptance by category was saved: every category from the pooled estimates
    doc = json.loads(json.dumps(saved))
    del doc["acceptance"]["by_category"]
    path.write_text(json.dumps(doc))
    older = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    older.auto.begin_answer("coding")
    assert older.notes and older.auto.acceptance.by_category == {"coding": older.auto.acceptance.empty_counts()}
    assert older.auto.p_next(0.99) == pytest.approx(pooled)
    assert policy.saved_summary(key)["sure_next_by_category"] == {}
    policy.forget(key)
    # damaged: ignored, by `profile` too
    for bad in ([1, 2], {"qa": [1, 2]}, {"qa": {"first": {}, "pooled": [0, 0], "after": [[0, 0]] * 10}},
                {"qa": {**saved["acceptance"]["by_category"]["qa"], "after": [[0, 0]] * 9}},
                {"qa": {**saved["acceptance"]["by_category"]["qa"], "pooled": [3.0, 2.0]}}):
        doc = json.loads(json.dumps(saved))
        doc["acceptance"]["by_category"] = bad
        path.write_text(json.dumps(doc))
        damaged = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
        assert damaged.notes == [] and damaged.auto.acceptance.by_category == {}, bad
        assert policy.saved_summary(key) is None
        policy.forget(key)


def test_what_a_pairs_verifies_cost_is_saved_with_the_rest_of_k_autos_memory(tmp_path, monkeypatch):
    """The verify factor (AutoK.verify_factor) is written with what the pair learnt and read back by its next run, the
    price's V(n) scaled from its first step, worth at most VERIFY_SAVED_CAP observations; `profile` shows it; a file
    from before it was saved starts from the profile as it is, the rest still read; a damaged one is ignored."""
    import json
    import uuid

    from app.speculative import policy
    from app.speculative.drafters import DraftModelDrafter
    from app.speculative.policy import VERIFY_PRIOR, VERIFY_SAVED_CAP

    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(tmp_path / "kauto"))
    key = ("t", "d", uuid.uuid4().hex)
    first = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    first.auto._vf = [0.15 * 30, 30.0]  # 30 verifies at 1.16 times the profile
    first.finish()
    policy.forget(key)
    second = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    f = second.auto.verify_factor
    assert second.notes and f == pytest.approx(math.exp(0.15 * 30 / (30 + VERIFY_PRIOR)), abs=0.005) and f > 1.1
    assert second.auto.t(2) == pytest.approx(f * 1.37) and second.auto.t(1) == 1.0
    assert policy.saved_summary(key)["verify"] == f
    policy.forget(key)
    path = next((tmp_path / "kauto").glob("*.json"))
    doc = json.loads(path.read_text())
    doc["verify"] = {"log_sum": 0.15 * 500, "n": 500.0}  # many runs: worth VERIFY_SAVED_CAP, the mean kept
    path.write_text(json.dumps(doc))
    many = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    assert many.auto._vf == [pytest.approx(0.15 * VERIFY_SAVED_CAP), VERIFY_SAVED_CAP]
    policy.forget(key)
    del doc["verify"]
    path.write_text(json.dumps(doc))
    older = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
    assert older.notes and older.auto.verify_factor == 1.0 and older.auto.t(2) == pytest.approx(1.37)
    assert policy.saved_summary(key)["verify"] == 1.0
    policy.forget(key)
    for bad in ([1, 2], {"log_sum": float("nan"), "n": 3.0}, {"log_sum": 9.0, "n": 3.0}, {"log_sum": 0.0, "n": -1.0}):
        doc["verify"] = bad
        path.write_text(json.dumps(doc))
        damaged = DraftModelDrafter(None, auto=AutoK(LLAMA, draft=LLAMA_DRAFT), memory=key, saved=True)
        assert damaged.notes == [] and damaged.auto.verify_factor == 1.0
        assert policy.saved_summary(key) is None
        policy.forget(key)
