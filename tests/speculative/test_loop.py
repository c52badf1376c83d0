"""The loop on real (tiny random and SmolLM2) models: lossless greedy output, event invariants, EOS, cancel."""

from __future__ import annotations

import pytest
import torch

from app.core.events import LaneDone, StepEvent
from app.core.metrics import first_divergence
from app.core.setups import Sampling
from app.engines.hf import HFEngine
from app.engines.registry import resolve
from app.speculative.drafters import DraftContext, DraftModelDrafter, NGramDrafter, Proposal
from tests.helpers import run_lane

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Rename x to count:\nx = 0\nfor i in range(10):\n    x += i\nprint(x)\n",
]


@pytest.fixture(scope="module")
def tiny(tiny_pair):
    t, d = tiny_pair
    return HFEngine(resolve(str(t))), HFEngine(resolve(str(d)))


@pytest.fixture(scope="module")
def tiny_low_precision_drafts(tiny_pair):
    """The tiny draft in int8 (CPU dynamic quantization) and bfloat16: a draft's precision must not matter."""
    d = tiny_pair[1]
    return HFEngine(resolve(str(d)), dtype="int8"), HFEngine(resolve(str(d)), dtype="bfloat16")


def run(target, drafter, ids, sampling):
    evs = list(run_lane(target, drafter, ids, sampling))
    assert isinstance(evs[-1], LaneDone)
    return [e for e in evs if isinstance(e, StepEvent)], evs[-1].stats


def check_invariants(steps, stats, max_new):
    assert steps[0].step == 0 and len(steps[0].emitted_ids) >= 1  # step 0: the prefill forward, verifying drafts too
    total = 0
    for e in steps:
        assert 0 <= e.accepted_count <= len(e.drafted_ids)
        if e.target_id is not None:
            assert e.emitted_ids == (*e.drafted_ids[: e.accepted_count], e.target_id)
            assert e.target_kind == ("baseline" if not e.drafted_ids else "bonus" if e.accepted_count == len(e.drafted_ids) else "correction")
        total += len(e.emitted_ids)
        assert len(e.pieces) == len(e.emitted_ids)
        assert len(e.rejected_pieces) == len(e.drafted_ids) - e.accepted_count or e.target_id is None
    # every step but the last emits a_t + 1 tokens
    for e in steps[:-1]:
        assert len(e.emitted_ids) == e.accepted_count + 1
    assert total == stats.new_tokens == len(stats.output_ids) <= max_new
    assert stats.accepted <= stats.drafted
    assert stats.steps == len(steps)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_every_setup_matches_the_baseline_greedy_tiny(tiny, tiny_low_precision_drafts, prompt):
    target, draft = tiny
    d_int8, d_bf16 = tiny_low_precision_drafts
    ids = target.encode_prompt(prompt, chat=False)
    s = Sampling(max_new_tokens=40)
    base_steps, base = run(target, None, ids, s)
    check_invariants(base_steps, base, 40)
    assert base.steps == base.new_tokens  # one token per step
    drafters = {
        "draft k=1": DraftModelDrafter(draft, 1),
        "draft k=4": DraftModelDrafter(draft, 4),
        "draft heuristic": DraftModelDrafter(draft, 2, "heuristic"),
        "draft confidence stop": DraftModelDrafter(draft, 6, "constant", stop=0.5),
        "self-draft": DraftModelDrafter(target, 3),
        "int8 draft": DraftModelDrafter(d_int8, 5, stop=0.2),
        "bf16 draft": DraftModelDrafter(d_bf16, 4),
        "ngram": NGramDrafter(3, 8),
        "ngram n=1 k=2": NGramDrafter(1, 2),
    }
    accepted_any = rejected_any = False
    for name, d in drafters.items():
        steps, st = run(target, d, ids, s)
        check_invariants(steps, st, 40)
        assert first_divergence(st.output_ids, base.output_ids) is None, name
        assert st.output_text == base.output_text
        accepted_any |= st.accepted > 0
        rejected_any |= st.accepted < st.drafted
    assert accepted_any and rejected_any  # the tiny pair exercises both branches
    steps, st = run(target, DraftModelDrafter(target, 3), ids, s)
    assert st.drafted == st.accepted  # a model drafting for itself is always accepted (fp32)


def test_heuristic_schedule_adapts_k(tiny):
    target, draft = tiny
    d = DraftModelDrafter(draft, 2, "heuristic")
    d.feedback(2, 2)
    assert d.k == 4
    d.feedback(4, 1)
    assert d.k == 3
    for _ in range(5):
        d.feedback(3, 0)
    assert d.k == 1


def test_confidence_stop_ends_drafts_at_an_unsure_token(tiny):
    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[2], chat=False)
    steps, st = run(target, DraftModelDrafter(draft, 8, stop=0.999), ids, Sampling(max_new_tokens=30))
    full = [e for e in steps if e.drafted_ids]
    assert full and st.mean_k < 8
    for e in full:
        q = e.draft_probs
        assert all(p >= 0.999 for p in q[:-1])  # every token but the last was confident
    for e in full[:-2]:  # (near the token limit the budget can cut a draft too)
        assert len(e.drafted_ids) == 8 or e.draft_probs[-1] < 0.999  # full length, or stopped at an unsure token
    assert any(len(e.drafted_ids) < 8 for e in full)


def test_cumulative_stop_ends_drafts_when_the_whole_proposal_is_unlikely(tiny):
    """cstop=θ (the tiny draft's probabilities are ~1e-3, hence θ = 1e-9): every prefix but the full proposal has Π q ≥ θ; a short proposal ends where Π q fell below θ."""
    import math

    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[2], chat=False)
    s = Sampling(max_new_tokens=40)
    _, base = run(target, None, ids, s)
    steps, st = run(target, DraftModelDrafter(draft, 12, cstop=1e-9), ids, s)
    assert st.output_ids == base.output_ids  # still lossless
    full = [e for e in steps if e.drafted_ids]
    assert full
    for e in full:
        q = e.draft_probs
        assert math.prod(q[:-1]) >= 1e-9  # it did not stop earlier than it should
    for e in full[:-2]:
        assert len(e.drafted_ids) == 12 or math.prod(e.draft_probs) < 1e-9
    assert any(len(e.drafted_ids) < 12 for e in full) and any(len(e.drafted_ids) > 1 for e in full)


def test_a_corrected_step_says_where_the_targets_token_ranked_for_the_draft(tiny):
    """StepEvent.correction_rank (what the setup finder prices token trees with): the rank of the target's correction
    among the draft's 4 best tokens at the rejected position, 0 below them — checked against the draft model run
    from scratch on the same prefix. Steps the target did not correct carry None."""
    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[1], chat=False)
    steps, _ = run(target, DraftModelDrafter(draft, 4), ids, Sampling(max_new_tokens=40))
    seq = list(ids)
    ranks = []
    for e in steps:
        if e.target_kind == "correction":
            prefix = seq + list(e.drafted_ids[: e.accepted_count])
            with torch.inference_mode():
                logits = draft.model(torch.tensor([prefix])).logits[0, -1]
            best = logits.topk(4).indices.tolist()
            want = best.index(e.target_id) + 1 if e.target_id in best else 0
            assert e.correction_rank == want and want != 1
            ranks.append(want)
        else:
            assert e.correction_rank is None
        seq.extend(e.emitted_ids)
    assert len(ranks) >= 5 and 0 in ranks and {2, 3, 4} & set(ranks)


def test_token_limit_and_budgeted_drafts(tiny):
    target, _ = tiny
    ids = target.encode_prompt(PROMPTS[1], chat=False)
    for n in (1, 2, 5):
        steps, st = run(target, DraftModelDrafter(target, 8), ids, Sampling(max_new_tokens=n))
        assert st.new_tokens <= n
        assert all(len(e.drafted_ids) <= n - 1 for e in steps)


def test_eos_ends_the_lane(tiny):
    target, _ = tiny
    ids = target.encode_prompt(PROMPTS[0], chat=False)
    _, base = run(target, None, ids, Sampling(max_new_tokens=30))
    eos = base.output_ids[5]
    target.eos_ids, saved = frozenset({eos}), target.eos_ids
    try:
        for d in (None, DraftModelDrafter(target, 4), NGramDrafter()):
            steps, st = run(target, d, ids, Sampling(max_new_tokens=30))
            assert st.stop_reason == "eos"
            assert st.output_ids == base.output_ids[: base.output_ids.index(eos) + 1]
    finally:
        target.eos_ids = saved


def test_cancel_between_steps(tiny):
    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[0], chat=False)
    n = [0]

    def cancelled():
        n[0] += 1
        return n[0] > 3

    evs = list(run_lane(target, DraftModelDrafter(draft, 2), ids, Sampling(max_new_tokens=200), cancelled=cancelled))
    done = evs[-1]
    assert isinstance(done, LaneDone) and done.cancelled and done.stats.stop_reason == "cancelled"
    assert done.stats.steps == 4  # prefill step + 3 steps before the 4th poll said stop


def test_sampling_runs_are_reproducible_and_valid(tiny):
    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[2], chat=False)
    s = Sampling(temperature=0.8, top_p=0.95, top_k=50, seed=7, max_new_tokens=30)
    a_steps, a = run(target, DraftModelDrafter(draft, 3), ids, s)
    _, b = run(target, DraftModelDrafter(draft, 3), ids, s)
    assert a.output_ids == b.output_ids  # seeded
    check_invariants(a_steps, a, 30)
    _, c = run(target, DraftModelDrafter(draft, 3), ids, Sampling(temperature=0.8, top_p=0.95, top_k=50, seed=8, max_new_tokens=30))
    assert c.output_ids != a.output_ids


def test_bf16_divergence_is_reported_not_hidden(tiny_pair):
    """In bf16 verifying k tokens at once can change greedy outputs; identity is computed either way."""
    t = HFEngine(resolve(str(tiny_pair[0])), dtype="bfloat16")
    ids = t.encode_prompt(PROMPTS[1], chat=False)
    _, base = run(t, None, ids, Sampling(max_new_tokens=40))
    _, st = run(t, DraftModelDrafter(t, 4), ids, Sampling(max_new_tokens=40))
    st = st.with_baseline(base)
    assert st.identical_to_baseline == (st.output_ids == base.output_ids)
    assert st.first_divergence == first_divergence(st.output_ids, base.output_ids)


@pytest.mark.slow
def test_smollm2_setups_match_the_baseline():
    """Real weights: SmolLM2-135M fp32, greedy; n-gram and self-drafting must reproduce the baseline."""
    e = HFEngine(resolve("smollm2-135m-instruct"))
    ids = e.encode_prompt("Rename the variable x to total in: def f(x):\n    return x * 2 + x\n")
    s = Sampling(max_new_tokens=32)
    _, base = run(e, None, ids, s)
    assert base.new_tokens > 5 and base.output_text.strip()
    q = HFEngine(resolve("smollm2-135m-instruct"), dtype="int8")
    for d in (NGramDrafter(3, 6), DraftModelDrafter(e, 4, "heuristic"), DraftModelDrafter(q, 8, stop=0.3), DraftModelDrafter(q, 16, cstop=0.4)):
        steps, st = run(e, d, ids, s)
        check_invariants(steps, st, 32)
        assert st.output_ids == base.output_ids
    assert 0 < st.accepted < st.drafted  # the int8 self-draft is close but not exact: both branches ran
    torch.set_num_threads(torch.get_num_threads())


def test_reference_lanes_match_the_baseline_and_leave_the_draft_config_alone(tiny):
    """transformers' assisted generation through our reference lane: same tokens as our baseline, and a k=N lane
    does not leak its k into the next lane that uses the same draft engine (it once did). Its steps are read from the
    models' forwards: each step's candidates, how many were kept, its draft forwards and their time, its verify —
    the same invariants as our own lanes' steps, at most k candidates a step for `k=3` (a constant schedule)."""
    from app.core.accounting import LaneRecorder, drive
    from app.core.setups import kind_of, parse_setup

    class Env:  # what the worker's PoolEnv gives a setup type's build: the target and drafts
        def target(self):
            return target

        def draft(self, name, dtype=None):
            return draft

        def lane_costs(self, target):  # no cost profile measured here: no theory
            return None

    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[0], chat=False)
    s = Sampling(max_new_tokens=24)
    _, base = run(target, None, ids, s)
    gc = draft.model.generation_config
    before = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule)
    for text in ("hf-assisted:d,k=3", "hf-assisted:d"):
        setup = parse_setup(text)
        runner = kind_of(setup).build(setup, Env())
        rec = LaneRecorder("lane", setup.label, "p", 0, s.max_new_tokens, target.eos_ids, target.detokenizer(ids))
        evs = list(drive(runner, rec, ids, s))
        st = evs[-1].stats
        assert st.library and st.output_ids == base.output_ids, text
        assert (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule) == before, text
        steps = [e for e in evs if isinstance(e, StepEvent)]
        check_invariants(steps, st, s.max_new_tokens)
        assert not st.notes, st.notes  # read from the forwards, not the tokens-only fallback
        assert st.drafted == sum(len(e.drafted_ids) for e in steps) > 0 and 0 < st.accepted < st.drafted  # the tiny draft: some kept
        assert st.draft_forwards > 0 and st.t_draft_s > 0 and st.t_verify_s > 0
        assert all(e.t_draft_s > 0 and e.t_verify_s > 0 for e in steps[1:] if e.drafted_ids)
        # greedy: each draft's confidence, read from the assistant's forward (its top token's probability)
        assert all(e.draft_probs is not None and len(e.draft_probs) == len(e.drafted_ids) and all(0 < q <= 1 for q in e.draft_probs)
                   for e in steps if e.drafted_ids)
        # … and each is the draft's own probability of that token after that prefix (a full forward here, no cache):
        # a confidence read at the wrong position, or of another token, is still in (0, 1] and fails this
        prefix = list(ids)
        with torch.no_grad():
            for e in steps:
                for j, (tok, q) in enumerate(zip(e.drafted_ids, e.draft_probs or (), strict=False)):
                    logits = draft.model(torch.tensor([prefix + list(e.drafted_ids[:j])])).logits[0, -1].float()
                    assert q == pytest.approx(float(logits.softmax(-1)[tok]), rel=1e-3, abs=1e-7), (text, e.step, j, q)
                    assert tok == int(logits.argmax())  # greedy: the draft's best token
                prefix += list(e.emitted_ids)
        if text.endswith("k=3"):
            assert max(len(e.drafted_ids) for e in steps) <= 3


def test_transformers_lane_without_readable_steps_falls_back_to_tokens_only(tiny, monkeypatch):
    """Where transformers' forwards and chunks do not line up (another transformers: steps_from_forwards says None,
    forced here on a real generate), the reference lane still emits the baseline's tokens, one step of kind
    "library" per streamed chunk, says so in its notes, and claims nothing it did not read: no drafts, no α, and no
    theory even with a cost profile at hand (predicted_theory None). With its steps read, the same lane and profile
    give a theory."""
    from app.core.accounting import LaneRecorder, drive
    from app.core.costs import LaneCosts
    from app.core.metrics import predicted_theory
    from app.core.setups import kind_of, parse_setup
    from app.runners import hf_library

    target, draft = tiny
    costs = LaneCosts((1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7), ("t",))

    class Env:
        def target(self):
            return target

        def draft(self, name, dtype=None):
            return draft

        def lane_costs(self, target):
            return costs

    ids = target.encode_prompt(PROMPTS[0], chat=False)
    s = Sampling(max_new_tokens=16)
    _, base = run(target, None, ids, s)

    def lane():
        setup = parse_setup("hf-assisted:d,k=3")
        runner = kind_of(setup).build(setup, Env())
        rec = LaneRecorder("lane", setup.label, "p", 0, s.max_new_tokens, target.eos_ids, target.detokenizer(ids))
        evs = list(drive(runner, rec, ids, s))
        return [e for e in evs if isinstance(e, StepEvent)], evs[-1].stats

    steps, read = lane()
    assert read.costs == costs and read.drafted > 0 and predicted_theory([(read, base)]) is not None
    monkeypatch.setattr(hf_library, "steps_from_forwards", lambda *a, **k: None)
    steps, st = lane()
    assert st.library and st.output_ids == base.output_ids
    assert any("tokens only" in n for n in st.notes), st.notes
    assert steps and all(e.target_kind == "library" and not e.drafted_ids for e in steps)
    assert sum(len(e.emitted_ids) for e in steps) == st.new_tokens == len(base.output_ids)
    assert st.drafted == 0 and st.costs is None and predicted_theory([(st, base)]) is None


def test_transformers_steps_are_read_from_its_forwards_or_not_at_all():
    """app.runners.hf_library.steps_from_forwards on literal hook records (as traced from transformers 5.23's
    assisted generation on the Qwen pair): a verify's input is the prompt or the last emitted token, then the
    candidates; the chunk after it keeps a prefix of them and adds the target's token. Where the records do not line
    up so, None (the lane then reports tokens only)."""
    from app.runners.hf_library import steps_from_forwards

    prompt = [1, 2, 3]
    calls = [["draft", 0.0, 0.1, None], ["draft", 0.1, 0.15, None], ["verify", 0.15, 0.5, [1, 2, 3, 7, 8]],
             ["draft", 0.6, 0.65, None], ["draft", 0.65, 0.7, None], ["draft", 0.7, 0.75, None], ["verify", 0.75, 0.9, [9, 4, 5, 6]]]
    chunks = [(0.55, [7, 8, 9]), (1.0, [4, 6])]  # all of step 0's kept, then one of three and a correction
    f0, f1 = steps_from_forwards(calls, chunks, prompt, 0.0)
    assert (list(f0.drafted_ids), f0.accepted, f0.has_target, f0.draft_forwards) == ([7, 8], 2, True, 2)
    assert f0.t_draft_s == pytest.approx(0.15) and f0.t_verify_s == pytest.approx(0.35) and f0.t_wall_s == pytest.approx(0.55)
    assert (list(f1.drafted_ids), f1.accepted, f1.draft_forwards) == ([4, 5, 6], 1, 3)
    assert f1.t_draft_s == pytest.approx(0.15) and f1.t_verify_s == pytest.approx(0.15) and f1.t_wall_s == pytest.approx(0.45)
    # a last chunk cut at the token limit inside the kept drafts: no target token
    (g,) = steps_from_forwards(calls[:3], [(0.55, [7])], prompt, 0.0)
    assert g.accepted == 1 and not g.has_target
    assert f0.draft_probs is None  # no confidences in the records: none claimed
    # with the draft forwards' confidences (the hooks' fifth item): one per candidate, else None for that step
    qcalls = [[*c, q] for c, q in zip(calls, (0.9, 0.8, None, 0.7, None, 0.6, None), strict=True)]
    h0, h1 = steps_from_forwards(qcalls, chunks, prompt, 0.0)
    assert list(h0.draft_probs) == [0.9, 0.8] and h1.draft_probs is None  # step 1: one draft's confidence not read
    assert steps_from_forwards(calls, chunks[:1], prompt, 0.0) is None  # a verify without its chunk
    assert steps_from_forwards(calls, [chunks[0], (1.0, [9, 4])], [1, 2, 5], 0.0) is None  # the first verify is not the prompt
    bad = [*calls[:6], ["verify", 0.75, 0.9, [4, 4, 5, 6]]]  # the second verify does not start at the last token
    assert steps_from_forwards(bad, chunks, prompt, 0.0) is None
    assert steps_from_forwards([*calls[:6], ["verify", 0.75, None, [9, 4, 5, 6]]], chunks, prompt, 0.0) is None  # a forward that never ended


def _curve(v, t1=0.01):
    from app.core.costs import PROFILE_NS, CostProfile

    return CostProfile(engine="t", backend="hf", precision="float32", device="cpu", weights="w", machine="m", ns=PROFILE_NS,
                       times_s=tuple(t1 * v(n) for n in PROFILE_NS))


def test_k_auto_is_lossless_and_drafts_only_where_it_pays(tiny):
    """k=auto on the tiny pair: with a verify curve as flat as a GPU's and a cheap draft it drafts long (from step 0,
    the prompt's forward) and emits exactly the baseline's tokens; on a curve as steep as llama.cpp's on this CPU it never runs the draft
    at all (not even its prefill), so it cannot lose to the baseline."""
    from app.speculative.policy import AutoK

    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[0], chat=False)
    s = Sampling(max_new_tokens=40)
    _, base = run(target, None, ids, s)
    flat = AutoK(_curve(lambda n: 1.0 + 0.01 * n), draft=_curve(lambda n: 0.1 + 0.01 * n, t1=0.001))
    steps, st = run(target, DraftModelDrafter(draft, auto=flat), ids, s)
    check_invariants(steps, st, 40)
    assert st.output_ids == base.output_ids
    # the tiny draft agrees with its target about a quarter of the time: short drafts, their length varying by step
    assert st.drafted > 0 and st.accepted > 0 and sum(1 for n in st.decode_k_hist if n) >= 2
    assert steps[0].k > 0  # drafts ride on the prompt's forward in step 0, at the cost of the draft's own prefill
    assert all("k=auto" in e.why for e in steps[:-1])
    assert st.decode_k_hist and sum(st.decode_k_hist) == st.steps - 1
    steep = AutoK(_curve(lambda n: 0.3 + 0.7 * n), draft=_curve(lambda n: 0.5 * n))
    d = DraftModelDrafter(draft, auto=steep)
    steps, st = run(target, d, ids, s)
    assert st.output_ids == base.output_ids and st.drafted == 0 and st.draft_forwards == 0 and d.state is None
    assert "cannot pay" in steps[1].why
    # n-gram lookup with k=auto: the same guarantees
    for auto, drafts in ((AutoK(_curve(lambda n: 1.0 + 0.01 * n)), True), (AutoK(_curve(lambda n: 0.3 + 0.7 * n)), False)):
        steps, st = run(target, NGramDrafter(3, auto=auto), ids, s)
        assert st.output_ids == base.output_ids and (st.drafted > 0) == drafts


def test_k_auto_reads_the_prompt_as_a_fixed_lane_does(tiny, monkeypatch):
    """An int8 draft's proposals depend on how its cache was filled (it quantizes activations over each forward): on
    a Spec-Bench prompt the Qwen 0.5B draft's second token differed. k=auto's draft, which starts lazily, reads the
    prompt as every draft lane does — all but its last token, then that token with the first draft — so the
    finder's calibration records what k=auto will see."""
    from app.speculative.policy import AutoK

    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[0], chat=False)
    fed: list[list[int]] = []
    new_state = draft.new_state

    def spying_state():
        st = new_state()
        forward = st.forward
        st.forward = lambda x, *a, **kw: (fed[-1].append(len(x)), forward(x, *a, **kw))[1]
        fed.append([])
        return st

    monkeypatch.setattr(draft, "new_state", spying_state)
    s = Sampling(max_new_tokens=8)
    run(target, DraftModelDrafter(draft, k=3), ids, s)
    flat = AutoK(_curve(lambda n: 1.0 + 0.01 * n), draft=_curve(lambda n: 0.1 + 0.01 * n, t1=0.001))
    steps, _ = run(target, DraftModelDrafter(draft, auto=flat), ids, s)
    assert steps[0].k > 0  # k=auto drafted from step 0
    fixed, auto = fed
    assert fixed[:2] == auto[:2] == [len(ids) - 1, 1]


def test_a_k_auto_draft_reading_the_prompt_late_is_not_taken_for_drafting(tiny):
    """k=auto's draft reads the prompt in the first step that drafts (here step 0 is skipped, as an opening that does
    not pay is): that proposal says how long the reading took (Proposal.read_s), the step times the policy learns c
    and o from leave it out — a draft forward would otherwise look several times dearer for a few steps — and the
    lane counts it in prefill_s, as a fixed lane's draft reading the prompt in step 0 is. No other proposal reads."""
    from app.speculative.policy import AutoK

    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[0], chat=False)
    proposals, timings = [], []

    class SkipsTheOpening(DraftModelDrafter):
        def propose(self, ctx):
            timings.append(ctx.last)
            prop = Proposal([]) if len(ctx.ids) <= len(ids) else super().propose(ctx)
            proposals.append(prop)
            return prop

    flat = AutoK(_curve(lambda n: 1.0 + 0.01 * n), draft=_curve(lambda n: 0.1 + 0.01 * n, t1=0.001))
    steps, st = run(target, SkipsTheOpening(draft, auto=flat), ids, Sampling(max_new_tokens=24))
    read = [i for i, p in enumerate(proposals) if p.read_s > 0]
    assert len(read) == 1 and read[0] >= 1 and proposals[read[0]].ids  # one reading, in the first step that drafted
    i, r = read[0], proposals[read[0]].read_s
    assert steps[i].t_draft_s >= r  # the event keeps the whole step
    seen = timings[i + 1]  # what the drafter was told of that step, at the next one
    assert seen.t_draft_s == pytest.approx(steps[i].t_draft_s - r) and seen.t_wall_s == pytest.approx(steps[i].t_wall_s - r)
    assert st.prefill_s == pytest.approx(steps[0].t_wall_s + r)
    assert st.t_draft_s == pytest.approx(sum(e.t_draft_s for e in steps[1:]) - r)
    # a fixed lane's draft reads the prompt in start(): none of its proposals reads
    fixed = DraftModelDrafter(draft, k=3)
    fixed.start(list(ids))
    assert fixed.propose(DraftContext(list(ids), 10)).read_s == 0.0


def test_k_auto_spreads_reading_a_long_prompt_over_the_tokens_left(tiny):
    """The draft reads the prompt once per lane, whenever it first drafts: k=auto spreads that cost over the tokens
    left instead of charging it to one step — charged whole, a long prompt (RAG) kept it from ever starting — so with
    many tokens to go it drafts from step 0, and with one token left it does not pay to read the prompt."""
    from app.speculative.policy import AutoK

    target, draft = tiny
    ids = (target.encode_prompt(PROMPTS[0], chat=False) * 40)[:200]
    def lane():
        # a flat verify curve, a draft whose forward grows with its width (reading 200 tokens: ~20 steps' worth)
        return DraftModelDrafter(draft, auto=AutoK(_curve(lambda n: 1.0 + 0.01 * n), draft=_curve(lambda n: n, t1=0.001)))

    d = lane()
    d.start(ids)
    assert d.auto.catch_up_units(len(ids)) > 10
    prop = d.propose(DraftContext(list(ids), 99))
    assert prop.ids and "k=auto chose" in prop.why
    d = lane()
    d.start(ids)
    assert not d.propose(DraftContext(list(ids), 1)).ids and d.state is None  # the draft never read the prompt


def test_k_auto_leaves_the_draft_unread_where_drafting_saved_too_little_to_repay_reading(tiny):
    """A pair whose drafting saved next to nothing lately (AutoK.saving) reads no prompt into the draft: the lane runs
    no draft forward, emits the baseline's tokens, its steps say why, and its notes say so once; the same pair from
    the prior reads the prompt and drafts."""
    from app.speculative.drafters import UNREAD_NOTE
    from app.speculative.policy import AutoK

    target, draft = tiny
    ids = (target.encode_prompt(PROMPTS[0], chat=False) * 40)[:200]
    s = Sampling(max_new_tokens=24)
    _, base = run(target, None, ids, s)

    def auto():  # a flat verify curve, a draft whose reading of 200 tokens costs ~6 target steps
        return AutoK(_curve(lambda n: 1.0 + 0.01 * n), draft=_curve(lambda n: 0.3 * n, t1=0.001))

    learnt = auto()
    learnt._saved, learnt._saved_tok = 0.0, 500.0  # drafting saved nothing over 500 tokens: 0.009 a token with the prior
    assert learnt.catch_up_units(len(ids)) > learnt.saving * 24
    d = DraftModelDrafter(draft, auto=learnt)
    steps, st = run(target, d, ids, s)
    assert st.output_ids == base.output_ids and st.drafted == 0 and st.draft_forwards == 0 and d.state is None
    assert "reading the 200 tokens so far into the draft" in steps[0].why and UNREAD_NOTE in st.notes
    d = DraftModelDrafter(draft, auto=auto())
    steps, st = run(target, d, ids, s)
    assert st.output_ids == base.output_ids and st.drafted > 0 and UNREAD_NOTE not in st.notes


def test_k_auto_catches_up_a_draft_that_fell_behind_where_drafting_repays_it(tiny):
    """A draft that fell behind while steps drafted nothing (here by 60 tokens) catches up where drafting pays: the
    catch-up is an investment in every later step that drafts, priced over the tokens left as the prompt's reading is.
    Charged whole to one step, it kept a llama.cpp lane from drafting again once it had stopped for a few steps — the
    draft fell further behind each step it waited. Where drafting has lately saved too little to repay it, the draft
    stays behind, and the step and the lane's notes say why."""
    from app.speculative.drafters import BEHIND_NOTE
    from app.speculative.policy import AutoK

    _, draft = tiny
    ids = draft.encode_prompt(PROMPTS[0], chat=False)
    behind = (ids * 20)[:60]

    def auto():  # a flat verify curve; a draft forward costs 0.3 target forwards per token it reads
        a = AutoK(_curve(lambda n: 1.0 + 0.01 * n), draft=_curve(lambda n: 1.0 * n, t1=0.003))
        a.start, a.acceptance.first["bonus"] = "bonus", [0.9 * 50, 50.0]  # drafts after a kept proposal are kept 0.9
        return a

    for saved, catches_up in ((300.0, True), (0.0, False)):
        a = auto()
        d = DraftModelDrafter(draft, auto=a)
        d.start(ids[:-3])  # the prompt, and 3 tokens emitted without drafting
        first = d.propose(DraftContext(list(ids), 40))
        assert first.ids and d.state is not None  # it read the prompt and drafted
        d.feedback(len(first.ids), len(first.ids))
        a.start = "bonus"
        a._saved, a._saved_tok = saved, 500.0  # what drafting saved a token lately: 0.59 of a step, or 0.01
        now = [*ids, *first.ids, *behind]
        lag = len(now) - d.common_prefix(now)  # what the draft has not read
        assert lag > 60 and a.catch_up_units(lag) > 15  # more than any one step can gain on this curve
        prop = d.propose(DraftContext(now, 40))
        d.finish()
        if catches_up:
            assert prop.ids and prop.forwards >= 1 and d.seen == now[: len(d.seen)] and len(d.seen) >= len(now) - 1
            assert prop.catch_up_s > 0 and not d.notes
        else:
            assert not prop.ids and prop.forwards == 0 and prop.catch_up_s == 0
            assert f"catching the draft up over the {lag} tokens it has not read" in prop.why and d.notes == [BEHIND_NOTE]


def test_k_auto_sampling_keeps_proposal_and_distributions_aligned(tiny):
    """With sampling, a k=auto proposal that keeps fewer drafts than it made must pass the verifier the draft
    distributions of exactly the kept drafts (q[i] is the distribution d_i was sampled from)."""
    from app.speculative.policy import AutoK

    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[1], chat=False)
    auto = AutoK(_curve(lambda n: 1.0 + 0.05 * n), draft=_curve(lambda n: 0.2 + 0.01 * n, t1=0.002))
    d = DraftModelDrafter(draft, auto=auto)
    d.start(ids[:-3])
    g = torch.Generator().manual_seed(0)
    kept_fewer = False
    for _ in range(20):
        prop = d.propose(DraftContext(list(ids), 32, temperature=1.0, top_k=50, generator=g, last=None))
        if prop.ids:
            assert prop.q is not None and prop.q.shape[0] == len(prop.ids) == len(prop.q_drafted)
            for i, tok in enumerate(prop.ids):
                assert float(prop.q[i, tok]) == pytest.approx(prop.q_drafted[i])
        else:
            assert prop.q is None and not prop.q_drafted  # it drafted and kept none: nothing for the verifier
        kept_fewer |= prop.forwards > len(prop.ids)
        d.feedback(len(prop.ids), 0)
    assert kept_fewer


def test_a_k_auto_lane_saves_what_it_learnt_and_the_next_run_starts_from_it(tiny, tmp_path, monkeypatch):
    """A real k=auto lane (saved=True) writes its pair's state when the loop ends it; a lane in a new process (here:
    the in-process memory forgotten) starts from that state — its lane notes say so — and emits the baseline's tokens
    all the same. Stopped after its first step, a lane still saves."""
    import uuid

    from app.speculative import policy
    from app.speculative.policy import AutoK

    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(tmp_path / "kauto"))
    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[0], chat=False)
    s = Sampling(max_new_tokens=24)
    key = ("tiny-target", "tiny-draft", uuid.uuid4().hex)

    def lane():
        return DraftModelDrafter(draft, auto=AutoK(_curve(lambda n: 1.0 + 0.01 * n), draft=_curve(lambda n: 0.1 + 0.01 * n, t1=0.001)),
                                 memory=key, saved=True)

    _, base = run(target, None, ids, s)
    first = lane()
    _, st1 = run(target, first, ids, s)
    assert not any("k=auto started from" in n for n in st1.notes)
    assert len(list((tmp_path / "kauto").glob("*.json"))) == 1 and first.auto.answers == 1
    policy.forget(key)
    second = lane()
    assert second.calibration.n == pytest.approx(first.calibration.n) and second.auto.answers == 1
    steps, st2 = run(target, second, ids, s)
    assert any("k=auto started from" in n and "1 earlier answer" in n for n in st2.notes)
    assert st2.output_ids == base.output_ids
    policy.forget(key)
    third = lane()
    assert third.auto.answers == 2  # the second lane saved too
    evs = run_lane(target, third, ids, s)
    next(e for e in evs if isinstance(e, StepEvent))
    evs.close()  # the consumer stops after one step
    policy.forget(key)
    assert lane().auto.answers == 3
    policy.forget(key)
