"""k=auto replayed over literal calibration records (app.speculative.replay): the real policy, no model."""

from __future__ import annotations

import pytest

from app.core.costs import PROFILE_NS, CostProfile
from app.core.tuning import CalStep, Candidate, LaneCal, PromptCal, positions, price_candidate
from app.speculative import policy
from app.speculative.replay import replay_auto

D = "draft:d,dtype=int8"
AUTO = "draft:d,k=auto,dtype=int8"


def profile(v, t1: float, engine: str) -> CostProfile:
    return CostProfile(engine=engine, backend="hf", precision="float32", device="cpu", weights="w", machine="m", ns=PROFILE_NS,
                       times_s=tuple(t1 * v(n) for n in PROFILE_NS))


TARGET = profile(lambda n: 1.0 + 0.04 * (n - 1), 0.4, "t")  # the fp32 1.5B target on 2 cores: V(5) ≈ 1.16
DRAFT = profile(lambda n: 1.0 + 0.02 * (n - 1), 0.048, "d")  # c = 0.12: the int8 0.5B draft
CURVE = TARGET.curve(40)


def prompt(pid: str, steps: list[CalStep], step0: CalStep | None = None, new_tokens: int = 48) -> PromptCal:
    lane = LaneCal(tuple(steps), step0, prefill_s=1.0, draft_s_per_forward=0.048, overhead_s=0.004)
    return PromptCal(pid, "coding", new_tokens, base_wall_s=1.0 + new_tokens * 0.4, base_prefill_s=1.0, base_step_s=0.4,
                     base_overhead_s=0.004, lanes={D: lane})


def easy(pid: str = "easy") -> PromptCal:
    """Every draft confident and kept: proposals of 24 end on k, the next starts after the target's bonus token."""
    return prompt(pid, [CalStep(24, 24, (0.99,) * 24), CalStep(24, 23, (0.99,) * 24)])


def hard(pid: str = "hard") -> PromptCal:
    """Every first draft unsure and rejected."""
    return prompt(pid, [CalStep(24, 0, (0.3,) + (0.5,) * 23) for _ in range(48)])


def test_the_replayed_policy_drafts_long_where_drafts_are_kept_and_stops_where_they_are_not():
    assert len(positions(easy().lanes[D])) >= 48 and len(positions(hard().lanes[D])) >= 48
    good = replay_auto([easy()], D, AUTO, TARGET, DRAFT, CURVE)
    assert good is not None and good.candidate.auto and good.candidate.setup == AUTO
    assert good.alpha > 0.9 and good.mean_k > 8 and good.tau > 8 and good.speedup() > 3.0
    bad = replay_auto([hard()], D, AUTO, TARGET, DRAFT, CURVE)
    # it drafts one token to look at its confidence until its first drafts' confidences outweigh the prior that some
    # are confident (policy.FIRST_Q_PRIOR), then drafts nothing: it pays for those looks, never more
    assert bad.mean_k < 0.8 and bad.alpha == 0.0 and 0.9 < bad.speedup() <= 1.0
    # priced on the same model as a fixed setup: the plain k=24 chain loses on the hard prompt, k=auto does not
    k24 = price_candidate(Candidate(D, "draft:d,k=24,dtype=int8", 24), [hard()], CURVE)
    assert k24.speedup() < 0.6 < bad.speedup()


def test_the_replayed_policy_does_not_bet_a_confident_tail_on_an_unsure_draft():
    """math-1's pattern: each step two confident drafts are kept and an unsure one (0.55) is rejected, with confident
    drafts after it. Valued over two steps (AutoK.stop_value) the lane stops near the unsure draft; valued by one step
    it drafted the whole tail every time (223 drafts, 0.92x the baseline, where this drafts 119 for 1.34x)."""
    bet = prompt("bet", [CalStep(24, 2, (0.99, 0.99, 0.55) + (0.99,) * 21) for _ in range(16)])
    counts: dict = {}
    auto = replay_auto([bet], D, AUTO, TARGET, DRAFT, CURVE, counts=counts)
    steps, drafted, kept = counts["bet"]
    assert kept == 31 and drafted < 160 and auto.speedup() > 1.2
    # the fixed rules on the same records: a cumulative stop of 0.5 bets the tail as well, k=3 does not
    cstop = price_candidate(Candidate(D, "draft:d,k=24,cstop=0.5,dtype=int8", 24, 0.0, 0.5), [bet], CURVE)
    assert cstop.speedup() < auto.speedup()


def test_a_replay_is_repeatable_and_leaves_real_lanes_memory_alone():
    """The same records give the same price; what the replayed policy learnt is not what the next real lane of the
    pair starts from (policy.recall)."""
    before = dict(policy._LEARNT)
    a = replay_auto([hard("h1"), easy("e1")], D, AUTO, TARGET, DRAFT, CURVE)
    b = replay_auto([hard("h1"), easy("e1")], D, AUTO, TARGET, DRAFT, CURVE)
    assert a.pred_wall_s == b.pred_wall_s and policy._LEARNT == before
    # the prompts are met in order, in one worker: after the easy prompt the policy starts the hard one trusting
    # its drafts, and pays for it
    trusting = replay_auto([easy("e1"), hard("h1")], D, AUTO, TARGET, DRAFT, CURVE)
    alone = replay_auto([hard("h1")], D, AUTO, TARGET, DRAFT, CURVE)
    assert alone.pred_wall_s["h1"] < trusting.pred_wall_s["h1"]
    assert a.speedup(["e1"]) == pytest.approx(a.base_wall_s["e1"] / a.pred_wall_s["e1"])


def test_prompts_replayed_one_call_at_a_time_under_one_memory_are_one_worker():
    """With `memory`, what the policy learnt carries to the next call (prompts of several calibrations, each with its
    own verify curve, replayed in one order); policy.forget ends it."""
    together = replay_auto([easy("e1"), hard("h1")], D, AUTO, TARGET, DRAFT, CURVE)
    key = ("test", "one worker")
    try:
        replay_auto([easy("e1")], D, AUTO, TARGET, DRAFT, CURVE, memory=key)
        assert policy.recall(key) is not None
        second = replay_auto([hard("h1")], D, AUTO, TARGET, DRAFT, CURVE, memory=key)
    finally:
        policy.forget(key)
    assert second.pred_wall_s["h1"] == pytest.approx(together.pred_wall_s["h1"])
    assert policy.recall(key) is None


def test_step_0_is_the_calibration_lanes_as_for_a_fixed_setup_whatever_the_baselines_prompt_forward_took():
    """k=auto's step 0 is priced from the calibration lane's, as fixed setups are (price_candidate): a baseline whose
    own prompt forward ran slow (qa-2: 3.5 s against the lane's 1.4 s) moved k=auto alone by the difference."""
    from dataclasses import replace

    walls = {}
    for base_prefill in (0.5, 1.0, 3.0):
        pc = replace(easy(), base_prefill_s=base_prefill)
        auto = replay_auto([pc], D, AUTO, TARGET, DRAFT, CURVE)
        k24 = price_candidate(Candidate(D, "draft:d,k=24,dtype=int8", 24), [pc], CURVE)
        walls[base_prefill] = (auto.pred_wall_s["easy"], k24.pred_wall_s["easy"])
    assert walls[3.0][0] == pytest.approx(walls[1.0][0]) and walls[3.0][1] == pytest.approx(walls[1.0][1])
    # a baseline faster than the lane: the difference is the draft reading the prompt, paid where k=auto first drafts
    assert walls[0.5][0] == pytest.approx(walls[1.0][0])


def test_no_record_to_replay():
    lookup = PromptCal("p", "qa", 48, 20.0, 1.0, 0.4, 0.0, {"ngram": LaneCal((CalStep(3, 1),), None, 1.0, 0.0, 0.0)})
    assert replay_auto([lookup], "ngram", "ngram:k=auto", TARGET, None, CURVE) is None
    assert replay_auto([easy()], "draft:other", AUTO, TARGET, DRAFT, CURVE) is None


def test_the_replay_counts_each_prompts_steps_as_a_bench_does():
    """`counts` gets each replayed prompt's (steps, drafted, kept), step 0 included: every step emits its kept drafts
    and one token of the target's, so steps + kept is the answer's length."""
    counts: dict[str, tuple[int, int, int]] = {}
    got = replay_auto([easy("e1"), hard("h1")], D, AUTO, TARGET, DRAFT, CURVE, counts=counts)
    assert got is not None and set(counts) == {"e1", "h1"}
    steps, drafted, kept = counts["e1"]
    assert steps + kept == 48 and drafted >= kept > 40 and steps < 8
    steps, drafted, kept = counts["h1"]
    # after the easy prompt it looks, loses every look, and this answer's verdicts (AutoK.local) teach it to look less
    # than once a step
    assert steps + kept == 48 and kept == 0 and 0 < drafted < steps


def test_a_position_the_calibration_did_not_draft_ends_the_step_as_it_does_for_a_fixed_setup():
    """After a fully kept proposal the calibration has no draft at the target's bonus position: a fixed setup's priced
    step ends there (tuning.replay_positions), so k=auto's replayed draft may not run through it either — it proposes
    a token it is unsure of there, which the target rejects. (When it drafted the true token there at confidence 0.9,
    k=auto went through five such positions in 2 steps and was priced 4.6x where k=24 was 3.7x.)"""
    tens = prompt("tens", [CalStep(10, 10, (0.99,) * 10) for _ in range(5)])  # 10 kept, then the target's token, …
    counts: dict[str, tuple[int, int, int]] = {}
    auto = replay_auto([tens], D, AUTO, TARGET, DRAFT, CURVE, counts=counts)
    steps, drafted, kept = counts["tens"]
    assert steps >= 5 and kept <= 42 and steps + kept == 48
    k24 = price_candidate(Candidate(D, "draft:d,k=24,dtype=int8", 24), [tens], CURVE)
    assert auto.speedup() <= k24.speedup()


def test_the_replay_starts_where_the_pairs_next_real_lane_will(tmp_path, monkeypatch):
    """With the real pair's key (`saved`), the first replayed prompt starts from what earlier runs saved of the pair
    (policy.load_learnt), as that pair's next real lane does: a saved state that learnt confident drafts are rejected
    drafts less on the same records than the priors; nothing is written."""
    import uuid

    from app.speculative.drafters import DraftModelDrafter

    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(tmp_path / "kauto"))
    pair = ("t-key", "d-key", uuid.uuid4().hex)
    taught = DraftModelDrafter(None, auto=policy.AutoK(TARGET, draft=DRAFT), memory=pair, saved=True)
    for _ in range(60):
        taught._scores = [0.99, 0.99]
        taught.feedback(2, 0)
    taught.finish()
    policy.forget(pair)
    saved = list((tmp_path / "kauto").glob("*.json"))
    assert len(saved) == 1
    stamp = saved[0].stat().st_mtime_ns
    cold, warm = {}, {}
    a = replay_auto([easy()], D, AUTO, TARGET, DRAFT, CURVE, counts=cold)
    b = replay_auto([easy()], D, AUTO, TARGET, DRAFT, CURVE, counts=warm, saved=pair)
    assert warm["easy"][1] < cold["easy"][1] and b.speedup() < a.speedup()  # fewer drafts, slower, from its memory
    assert replay_auto([easy()], D, AUTO, TARGET, DRAFT, CURVE, saved=(*pair, "other")).speedup() == pytest.approx(a.speedup())
    assert saved[0].stat().st_mtime_ns == stamp and len(list((tmp_path / "kauto").glob("*.json"))) == 1


LLAMA_D = profile(lambda n: 1.0 + 0.24 * (n - 1), 0.045, "d")  # llama.cpp's 0.5B draft on a 2-core Xeon: c 0.45 for
# a target of T(1) 0.1 s, reading 100 tokens ≈ 1.07 s


def test_the_replayed_prompt_is_as_long_as_the_recorded_reading_says():
    from app.speculative.replay import PROMPT_LEN, read_len

    assert read_len(None, 1.0) == PROMPT_LEN and read_len(LLAMA_D, 0.0) == 1  # a reading that took no time: one token
    n = read_len(LLAMA_D, 1.2)
    assert LLAMA_D.t(n - 1) - LLAMA_D.t1_s < 1.2 <= LLAMA_D.t(n) - LLAMA_D.t1_s and 100 < n < 120


def test_the_replayed_policy_stops_reading_the_prompt_where_drafting_does_not_repay_it():
    """A costly draft (c 0.45), a confident first draft kept and an unsure second rejected every step — drafting saves
    about 9 units an answer — and a draft that takes 12 decode steps to read each prompt (llama.cpp's 0.5B draft on a
    2-core Xeon took 4–14). k=auto reads and drafts on the first prompt (its prior on what drafting saves), learns that
    drafting saved too little to repay the reading, and reads nothing on the prompts of its category after it: about
    the baseline's speed, where reading every prompt would be slower; where reading costs nothing, the same records
    keep it drafting. The replayed drafter gets each prompt's category, as a real lane does (AutoK.saving_of)."""
    def lane(read_s: float) -> LaneCal:
        return LaneCal(tuple(CalStep(2, 1, (0.97, 0.6)) for _ in range(24)), None, prefill_s=1.0 + read_s,
                       draft_s_per_forward=0.045, overhead_s=0.0)

    def prompts(read_s: float, category: str = "coding", n: int = 4) -> list[PromptCal]:
        return [PromptCal(f"{category[0]}{i}", category, 48, base_wall_s=1.0 + 48 * 0.1, base_prefill_s=1.0, base_step_s=0.1,
                          base_overhead_s=0.0, lanes={D: lane(read_s)}) for i in range(n)]

    target = profile(lambda n: 1.0 + 0.1 * (n - 1), 0.1, "t")
    curve = target.curve(40)
    costly: dict = {}
    priced = replay_auto(prompts(1.2), D, AUTO, target, LLAMA_D, curve, counts=costly)
    free: dict = {}
    drafting = replay_auto(prompts(0.0), D, AUTO, target, LLAMA_D, curve, counts=free)
    assert costly["c0"][1] > 0 and all(costly[p][1] == 0 for p in ("c1", "c2", "c3"))
    assert all(free[p][1] > 0 for p in ("c1", "c2", "c3"))
    # the first prompt, read and drafted, is slower than its baseline; the others run at its speed
    assert priced.pred_wall_s["c0"] > priced.base_wall_s["c0"] and 0.97 < priced.speedup() < 1.03 < drafting.speedup()
    # what it learnt is the coding prompts': the first prompt of another category is read again (its own prior), the
    # next one of it not
    mixed: dict = {}
    replay_auto(prompts(1.2) + prompts(1.2, "qa", 2), D, AUTO, target, LLAMA_D, curve, counts=mixed)
    assert mixed["c1"][1] == 0 and mixed["q0"][1] > 0 and mixed["q1"][1] == 0
