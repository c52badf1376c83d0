"""Lane runners for `trtllm:<engine>`: TensorRT-LLM's three ways of decoding, reported through the shared step
accounting (app.core.accounting.LaneRecorder builds every StepEvent and the LaneStats).

`runner_for(engine)` picks the runner by the engine's `[trtllm]` config:

* `api = "llm"` → :class:`LLMApiRunner`: the LLM API streams tokens (`generate_async(..., streaming=True)`); each
  streamed update is taken as one decoding iteration (one step). Which draft tokens were rejected is not exposed
  by this path, so steps carry counts only (see :class:`CountsOnlySteps`); the request's perf metrics give the
  lane's drafted/accepted totals when present.
* `api = "runner"`, mode `redrafter` / `medusa` → :class:`CppStreamRunner`: one ModelRunnerCpp streams; counts
  only, like the LLM API path.
* `api = "runner"`, mode `draft_target` → :class:`CppDraftTargetRunner`: the draft and the target engines step by
  step as TensorRT-LLM's `examples/draft_target_model` + `examples/ngram/run_dtm_ngram.py` do (draft generates k
  tokens, the target verifies them through `generate(..., draft_tokens_list=...)`), so drafted, accepted and
  rejected ids are all known.

The engine (app.engines.trtllm.TRTLLMEngine) only computes or streams tokens; these runners decide what a step
is and time it. Step 0 is the prefill (kind "baseline").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from app.core.accounting import LaneEngine, LaneRecorder, LaneRunner, StepFacts
from app.core.errors import EngineError, SetupError
from app.core.events import StepEvent
from app.core.setups import Sampling

if TYPE_CHECKING:
    from app.engines.trtllm import TRTLLMEngine

__all__ = ["CountsOnlySteps", "LLMApiRunner", "CppStreamRunner", "CppDraftTargetRunner", "runner_for"]


def runner_for(engine: TRTLLMEngine) -> LaneRunner:
    """The lane runner for a TensorRT-LLM engine, by its config: LLM API streaming, ModelRunnerCpp streaming
    (ReDrafter, Medusa) or ModelRunnerCpp draft/target.

    Raises:
        EngineError: `engine` is not a TensorRT-LLM engine.
    """
    from app.engines.trtllm.engine import TRTLLMEngine

    if not isinstance(engine, TRTLLMEngine):
        name = engine.name
        raise EngineError(f"trtllm:{name} needs a backend = \"trtllm\" engine, {name} is {engine.backend!r}",
                          fix="name an engine whose manifest has backend = \"trtllm\" (specdeck engines lists them)")
    c = engine.config
    if c.api == "llm":
        return LLMApiRunner(engine)
    if c.kind == "draft_target":
        return CppDraftTargetRunner(engine)
    return CppStreamRunner(engine)


def _check_prompt(prompt_ids: list[int]) -> None:
    if not prompt_ids:
        raise ValueError("empty prompt")


GREEDY_ONLY_NOTE = (
    "decoded greedily although sampling was asked: TensorRT-LLM's one-model {what} ignores temperature/top-p/top-k "
    "unless the manifest's [trtllm] sets allow_advanced_sampling = true"
)
STREAMED_NOTE = (
    "α and the draft counts are inferred from streamed chunk sizes (k drafts assumed per iteration): this "
    "TensorRT-LLM reported no speculative-decoding counters{why}"
)


class _TRTLLMRunner:
    """Base of the three runners.

    Attributes:
        engine: the engine (LaneRunner protocol: the scheduler encodes the prompt and detokenizes with it).
        trt: the same engine, typed as a TRTLLMEngine (its config and generation primitives).
    """

    def __init__(self, engine: TRTLLMEngine) -> None:
        self.engine: LaneEngine = engine
        self.trt = engine

    def _begin(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling) -> Sampling:
        """Checks and notes common to the three runners; returns the validated sampling."""
        _check_prompt(prompt_ids)
        sampling = sampling.validated()
        c = self.trt.config
        if c.api == "runner" and c.kind == "medusa" and not sampling.greedy and sampling.temperature != 1.0:
            raise SetupError(
                f"TensorRT-LLM's Medusa samples at temperature 1.0 only (its examples/run.py asserts it); {sampling.temperature} was asked",
                fix="use --temperature 1.0 (sampling) or 0 (greedy) for this lane",
            )
        if not sampling.greedy and c.greedy_only:
            rec.note(GREEDY_ONLY_NOTE.format(what="MTP" if c.kind == "mtp" else "EAGLE-3"))
        for n in getattr(self.trt, "notes", ()):
            rec.note(n)
        return sampling


class CountsOnlySteps:
    """Streamed chunks → steps when only counts are known (LLM API, ReDrafter, Medusa).

    Assumptions (stated, not verified by the library): each streamed update is one decoding iteration; the
    first update is the prefill (one token, kind "baseline"); in every later iteration the drafter proposed
    k = max_draft_len tokens (TensorRT-LLM's speculative-decoding page, docs/features/speculative-decoding: "a
    single sequence of draft tokens with length max_draft_len is created for every request"), so an update of n
    new tokens means accepted = n − 1 and a target token at the end ("bonus" when n − 1 == k, else "correction").
    k_t = max(k, n − 1) so α never exceeds 1 if the assumption is wrong. At EOS or the token limit the last token
    may really be an accepted draft; that cannot be told apart. Rejected ids are unavailable: steps carry
    `drafted_ids=()` and the count (`drafted_count`).

    Args:
        rec: the lane's recorder.
        k: max_draft_len; 0 = no speculation (one baseline step per token).
    """

    def __init__(self, rec: LaneRecorder, k: int) -> None:
        self.rec = rec
        self.k = k

    def push(self, new_ids: Sequence[int], dt: float) -> list[StepEvent]:
        """Steps for one streamed update of `new_ids` that took `dt` seconds (none for an empty update)."""
        rec, n = self.rec, len(new_ids)
        if n == 0 or rec.done:
            return []
        if rec.steps == 0:  # the prefill yields one token; more means updates were coalesced
            share = dt / 2 if n > 1 else dt
            evs = [rec.step(StepFacts(new_ids[:1], kind="baseline", t_verify_s=share, t_wall_s=share))]
            return evs + (self.push(new_ids[1:], dt - share) if n > 1 else [])
        if self.k == 0:  # no speculation: one token per decode iteration
            evs = []
            for t in new_ids:
                if rec.done:
                    break
                evs.append(rec.step(StepFacts([t], kind="baseline", t_verify_s=dt / n, t_wall_s=dt / n)))
            return evs
        a = n - 1
        return [rec.step(StepFacts(new_ids, accepted=a, drafted_count=max(self.k, a), t_verify_s=dt, t_wall_s=dt))]


class LLMApiRunner(_TRTLLMRunner):
    """A `trtllm:` lane on the LLM API (`[trtllm] api = "llm"`): one streaming request, counts-only steps.

    Each update's time runs from the previous update that produced tokens (from before `generate_async` for the
    first). Cancellation is polled between updates and aborts the request; a request left unfinished (the lane
    hit its limit first, or the consumer stopped) is aborted too. The library stops at end_id itself without
    returning it (finish reason 'stop' → stop_reason "eos"); its per-request perf counters, when present,
    replace the per-step drafted/accepted estimate in LaneStats.
    """

    def run(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool]) -> Iterator[StepEvent]:
        sampling = self._begin(rec, prompt_ids, sampling)
        k = self.trt.draft_len  # as TensorRT-LLM kept it (MTP: num_nextn_predict_layers)
        steps = CountsOnlySteps(rec, k)
        t0 = rec.clock()
        req = self.trt.start_request(prompt_ids, sampling)
        try:
            yield from _follow(rec, steps, (update.new_ids for update in req), cancelled, t0)
        finally:
            req.abort()  # no-op once the request finished
        if req.finish_reason == "stop":
            rec.stop("eos")  # TensorRT-LLM stopped at end_id (the EOS token itself is not returned)
        counts = req.perf_counts()
        if counts:
            rec.override(drafted=counts[0], accepted=counts[1], counts_source="engine")
        elif k > 0:
            rec.override(counts_source="streamed")
            rec.note(STREAMED_NOTE.format(why=" (1.2.x leaves them at 0 on the PyTorch backend's default sampler)"))


def _follow(rec: LaneRecorder, steps: CountsOnlySteps, chunks: Iterable[Sequence[int]], cancelled: Callable[[], bool],
            t_last: float) -> Iterator[StepEvent]:
    """Turn a stream of new-token chunks into counts-only steps, each timed from the previous chunk that made a
    step (the first from `t_last`, taken before the request started); stops at the lane's end or a cancel
    (polled between chunks)."""
    for new in chunks:
        now = rec.clock()
        evs = steps.push(new, now - t_last)
        if evs:
            t_last = now
        yield from evs
        if rec.done:
            return
        if cancelled():
            rec.stop("cancelled")
            return


class CppStreamRunner(_TRTLLMRunner):
    """A `trtllm:` lane on one streaming ModelRunnerCpp (`mode = "redrafter" | "medusa"`): counts-only steps.

    ReDrafter (`explicit_draft_tokens` engines) and Medusa expose no per-step drafts through the runner; each
    streamed response is one iteration (see :class:`CountsOnlySteps`), its time measured after synchronising the
    device. Cancellation is polled between responses.
    """

    def run(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool]) -> Iterator[StepEvent]:
        sampling = self._begin(rec, prompt_ids, sampling)
        steps = CountsOnlySteps(rec, self.trt.draft_len)
        rec.override(counts_source="streamed")
        rec.note(STREAMED_NOTE.format(why=" (ModelRunnerCpp's streaming exposes none for ReDrafter/Medusa)"))
        t0 = rec.clock()
        stream = self.trt.stream(prompt_ids, sampling)
        try:
            yield from _follow(rec, steps, stream, cancelled, t0)
        finally:
            stream.close()


class CppDraftTargetRunner(_TRTLLMRunner):
    """Draft/target over two ModelRunnerCpp engines (`mode = "draft_target"`), one verification per step, all ids
    known.

    Step 0: the target alone on the prompt (the prefill, one token). Then each step: the draft engine
    generates k ≤ remaining − 1 tokens from the current sequence; the target engine runs on the same sequence
    with `draft_tokens_list=[drafts]` and `max_new_tokens = k + 1` (as run_dtm_ngram.py does); accepted = the
    longest prefix of the drafts the target reproduced; the next target token is the correction/bonus. If the
    runner returned more tokens than a + 1 (it kept decoding after the verification), those are the target's
    own decode iterations: each becomes a "baseline" step, the call's time split evenly among them.
    Token-match acceptance (`use_logits` off): exact for greedy; under sampling it is TensorRT-LLM's
    token-comparison mode, not rejection sampling. A target call that returns nothing ends the lane with
    stop_reason "engine_limit".
    """

    def run(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool]) -> Iterator[StepEvent]:
        sampling = self._begin(rec, prompt_ids, sampling)
        engine, clock = self.trt, rec.clock
        k_max = engine.config.max_draft_len
        seq = list(prompt_ids)
        call = 0

        def generate(on: str, max_new: int, drafts: list[int] | None = None) -> list[int]:
            nonlocal call
            ids = engine.generate(seq, max_new, sampling, on=on, seed_offset=call, draft_tokens=drafts)
            call += 1
            return ids

        t0 = clock()
        first = generate("target", 1, [])
        t1 = clock()
        ev = rec.step(StepFacts(first[:1], kind="baseline", t_verify_s=t1 - t0, t_wall_s=t1 - t0))
        seq.extend(ev.emitted_ids)
        yield ev
        while not rec.done:
            if cancelled():
                rec.stop("cancelled")
                return
            k = min(k_max, rec.remaining - 1)
            t0 = clock()
            drafts = generate("draft", k) if k > 0 else []
            drafts = drafts[:k]
            t1 = clock()
            target = generate("target", len(drafts) + 1, drafts)
            t2 = clock()
            a = 0
            while a < min(len(drafts), len(target)) and drafts[a] == target[a]:
                a += 1
            extra = target[a + 1 :]
            share = (t2 - t1) / (1 + len(extra))
            ev = rec.step(StepFacts(
                target[: a + 1],
                accepted=a,
                drafted_ids=drafts,
                t_draft_s=t1 - t0,
                t_verify_s=share,
                t_wall_s=(t1 - t0) + share,
                draft_forwards=len(drafts),
            ))
            seq.extend(ev.emitted_ids)
            yield ev
            for tok in extra:
                if rec.done:
                    break
                ev = rec.step(StepFacts([tok], kind="baseline", t_verify_s=share, t_wall_s=share))
                seq.extend(ev.emitted_ids)
                yield ev
            if not target:  # the runner produced nothing (engine limit reached)
                rec.stop("engine_limit")
