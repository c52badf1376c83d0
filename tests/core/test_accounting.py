"""The shared step accounting (LaneRecorder): literal tables of what a runner reports → events and stats."""

from __future__ import annotations

import pytest

from app.core.accounting import LaneRecorder, StepFacts, target_kind

EOS = 2


class Detok:
    """Stands for an engine's incremental detokenizer: token i reads as "<i>"."""

    def push(self, t: int) -> str:
        return f"<{t}>"

    def peek(self, ids: list[int]) -> list[str]:
        return [f"<{t}>" for t in ids]


def rec(max_new: int = 10) -> LaneRecorder:
    return LaneRecorder("L1", "draft:x,k=3", "p", 0, max_new, {EOS}, Detok())


@pytest.mark.parametrize("k, a, kind", [(0, 0, "baseline"), (3, 3, "bonus"), (3, 1, "correction"), (3, 0, "correction")])
def test_target_kind(k, a, kind):
    assert target_kind(k, a) == kind


def test_steps_fold_into_events_and_stats():
    r = rec()
    e0 = r.step(StepFacts([5], accepted=0, t_verify_s=0.5, t_wall_s=0.6))  # step 0: the prefill
    e1 = r.step(StepFacts([7, 8, 9], accepted=2, drafted_ids=[7, 8, 4], t_draft_s=0.1, t_verify_s=0.2, t_wall_s=0.35, draft_forwards=3))
    e2 = r.step(StepFacts([3, 3, 3, 6], accepted=3, drafted_ids=[3, 3, 3], t_draft_s=0.1, t_verify_s=0.2, t_wall_s=0.3, draft_forwards=3))
    assert not (e0.final or e1.final or e2.final)  # 8 of 10 tokens, no EOS: not the last step
    assert (e0.target_kind, e1.target_kind, e2.target_kind) == ("baseline", "correction", "bonus")
    assert e1.accepted_ids == (7, 8) and e1.rejected_ids == (4,) and e1.target_id == 9 and e1.rejected_pieces == ("<4>",)
    assert e1.pieces == ("<7>", "<8>", "<9>") and e2.emitted_ids == (3, 3, 3, 6)
    assert e2.t_s == pytest.approx(1.25)
    st = r.finish().stats
    assert st.new_tokens == 8 and st.steps == 3 and st.drafted == 6 and st.accepted == 5
    assert st.prefill_s == 0.6 and st.ttft_s == 0.6 and st.wall_s == pytest.approx(1.25)
    assert st.t_draft_s == pytest.approx(0.2) and st.t_verify_s == pytest.approx(0.4) and st.draft_forwards == 6  # decode steps only
    assert st.per_position_drafted == (2, 2, 2) and st.per_position_accepted == (2, 2, 1)
    assert st.output_text == "<5><7><8><9><3><3><3><6>" and st.stop_reason == "length"


def test_a_draft_reading_the_prompt_in_a_later_step_counts_as_prefill():
    """k=auto's draft reads the prompt in the first step that drafts (StepFacts.t_read_s): the lane's prefill_s gets that
    reading, its t_draft_s only the draft forwards, so c (t_draft_s per draft forward) means the same in every lane;
    the step's event keeps the time the step took."""
    r = rec()
    r.step(StepFacts([5], accepted=0, t_verify_s=0.5, t_wall_s=0.6))  # step 0: nothing drafted, the draft read nothing
    e1 = r.step(StepFacts([7, 8], accepted=1, drafted_ids=[7, 4], t_draft_s=0.3, t_read_s=0.2, t_verify_s=0.2, t_wall_s=0.55,
                          draft_forwards=2))
    r.step(StepFacts([3, 6], accepted=1, drafted_ids=[3], t_draft_s=0.05, t_verify_s=0.2, t_wall_s=0.3, draft_forwards=1))
    st = r.finish().stats
    assert e1.t_draft_s == pytest.approx(0.3)
    assert st.prefill_s == pytest.approx(0.8) and st.t_draft_s == pytest.approx(0.15) and st.draft_forwards == 3
    assert st.t_verify_s == pytest.approx(0.4)


def test_eos_among_accepted_drafts_ends_the_step_without_a_target_token():
    r = rec()
    r.step(StepFacts([5], t_wall_s=0.1))
    ev = r.step(StepFacts([7, EOS, 8, 9], accepted=3, drafted_ids=[7, EOS, 8]))
    assert ev.emitted_ids == (7, EOS) and ev.accepted_count == 2 and ev.target_id is None and ev.target_kind == "correction"
    assert r.done and r.stop_reason == "eos" and r.finish().stats.accepted == 2
    assert ev.final  # the lane's last step says so (the scheduler passes its LaneDone on at once)


def test_the_token_limit_truncates():
    r = rec(max_new=3)
    r.step(StepFacts([5], t_wall_s=0.1))
    ev = r.step(StepFacts([7, 8, 9], accepted=2, drafted_ids=[7, 8]))
    assert ev.emitted_ids == (7, 8) and ev.target_id is None and r.done and r.stop_reason == "length" and ev.final
    assert r.finish().stats.new_tokens == 3


def test_counts_only_and_library_steps():
    r = rec()
    r.step(StepFacts([5], kind="baseline", t_wall_s=0.1))
    ev = r.step(StepFacts([6, 7, 8], accepted=2, drafted_count=4))  # a backend that reports counts, not ids
    assert ev.k == 4 and ev.drafted_ids == () and ev.drafted_count == 4 and ev.target_kind == "correction" and ev.target_id == 8
    ref = rec()
    ev = ref.step(StepFacts([4, 5, 6], kind="library", t_wall_s=0.2))
    assert ev.target_kind == "library" and ev.pieces == ("<4>", "<5>", "<6>") and ev.accepted_count == 0 and ev.k == 0
    ref.override(wall_s=1.0, ttft_s=0.3, library=True)
    st = ref.finish().stats
    assert st.wall_s == 1.0 and st.ttft_s == 0.3 and st.library and st.new_tokens == 3
    with pytest.raises(TypeError):
        ref.override(new_tokens=9)


def test_target_probs_follow_truncation_and_cancel_is_kept():
    r = rec()
    seen = []
    r.step(StepFacts([5], t_wall_s=0.1))
    r.step(StepFacts([7, EOS, 9], accepted=2, drafted_ids=[7, EOS], target_probs=lambda a, t: seen.append((a, t)) or [0.9] * a))
    assert seen == [(2, None)]
    r2 = rec()
    r2.step(StepFacts([5], t_wall_s=0.1))
    r2.stop("cancelled")
    done = r2.finish()
    assert done.cancelled and done.stats.stop_reason == "cancelled" and r2.done


def test_theory_is_not_applicable_when_every_draft_was_verified_by_the_prompt_forward():
    """k >= max_new_tokens: all drafting happens in step 0 (its cost hides in the prefill), so there is no c to
    measure; theory must say n/a instead of a made-up 11x."""
    from app.core.metrics import summarize

    base = LaneRecorder("L1", "baseline", "p", 0, 4, {EOS}, Detok())
    base.step(StepFacts([5], t_verify_s=0.2, t_wall_s=0.25))
    for t in (6, 7, 8):
        base.step(StepFacts([t], t_verify_s=0.1, t_wall_s=0.1))
    b = base.finish().stats
    r = LaneRecorder("L2", "draft:x,k=10", "p", 0, 4, {EOS}, Detok())
    r.step(StepFacts([5, 6, 7, 8], accepted=3, drafted_ids=[5, 6, 7], t_draft_s=0.3, t_verify_s=0.3, t_wall_s=0.6, draft_forwards=3))
    s = r.finish().stats
    assert s.step0_drafted == 3 and s.t_draft_s == 0.0 and s.draft_forwards == 0
    rows = {x.setup: x for x in summarize([b, s.with_baseline(b)])}
    assert rows["draft:x,k=10"].c is None and rows["draft:x,k=10"].theoretical_speedup is None
    assert rows["draft:x,k=10"].speedup == pytest.approx(0.55 / 0.6)


def test_a_report_that_cannot_be_written_goes_somewhere_named(tmp_path, monkeypatch):
    from app.core.report import write_json as _write_json

    monkeypatch.chdir(tmp_path)
    where = _write_json({"a": 1}, str(tmp_path / "gone" / "r.json"))
    assert where.startswith(str(tmp_path)) and "specdeck-report-" in where
    assert (tmp_path / where.rsplit("/", 1)[1]).read_text().strip() == '{\n "a": 1\n}'
