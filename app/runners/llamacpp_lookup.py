"""`llamacpp-lookup[:k=N,n=M]`: llama-cpp-python's own prompt-lookup decoding (`LlamaPromptLookupDecoding` as the
`draft_model` of `Llama.generate`), the peer implementation of our `ngram` lane on the same llama.cpp target.

llama-cpp-python exposes no per-step accept/reject, so the lane yields tokens only (kind "library"): the
tokens `generate` yields between two evaluations of the model (its `n_tokens` grows at each `eval`) form one
step. `generate` needs `logits_all` for a draft model, so the lane runs its own `Llama` on the engine's GGUF
(memory-mapped: the weights' pages are shared with the engine's). A Llama holds one sequence, so interleaved
lanes each take one from the engine's pool (made on first need, reused by later lanes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from app.core.accounting import LaneRecorder, StepFacts
from app.core.errors import SetupError
from app.core.events import StepEvent
from app.core.setups import Sampling

__all__ = ["LlamaLookupRunner"]


class LlamaLookupRunner:
    """Tokens-only lane: `Llama.generate` with `LlamaPromptLookupDecoding(max_ngram_size=n, num_pred_tokens=k)`.

    Args:
        target: a LlamaCppEngine (the run's target).
        k: tokens proposed per lookup (num_pred_tokens).
        n: longest n-gram matched (max_ngram_size).

    Raises:
        SetupError: the target is not a llama.cpp engine.
    """

    def __init__(self, target, k: int = 10, n: int = 2) -> None:
        from app.engines.llamacpp import LlamaCppEngine

        if not isinstance(target, LlamaCppEngine):
            raise SetupError(f"llamacpp-lookup runs llama-cpp-python's prompt lookup on a llama.cpp target; {target.name} is "
                             f"{target.backend}", fix="use a backend = \"llamacpp\" engine as --target (python -m app engines)")
        self.engine = target
        self.k, self.n = k, n

    def _take(self):
        """A free Llama of the engine's pool (logits_all, as generate's draft path needs), made when none is free."""
        e = self.engine
        if e.lookup_pool:
            return e.lookup_pool.pop()
        from llama_cpp import Llama

        return Llama(model_path=str(e.gguf), n_ctx=e.n_ctx, n_batch=e.n_batch, n_threads=e.n_threads, n_threads_batch=e.n_threads,
                     logits_all=True, verbose=False)

    def _give_back(self, llm) -> None:
        self.engine.lookup_pool.append(llm)

    def run(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool]) -> Iterator[StepEvent]:
        sampling = sampling.validated()
        llm = self._take()
        try:
            yield from self._run(llm, rec, prompt_ids, sampling, cancelled)
        finally:
            self._give_back(llm)

    def _run(self, llm, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool]) -> Iterator[StepEvent]:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        llm.draft_model = LlamaPromptLookupDecoding(max_ngram_size=self.n, num_pred_tokens=self.k)
        llm.reset()
        kw: dict = dict(temp=0.0, top_k=1) if sampling.greedy else dict(temp=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        if not sampling.greedy:
            llm.set_seed(sampling.seed)
        clock = rec.clock
        t0 = prev = clock()
        c0 = time.process_time()
        group: list[int] = []
        group_t = t0
        evals = llm.n_tokens
        gen = llm.generate(list(prompt_ids), reset=True, **kw)
        ttft: float | None = None
        try:
            for tok in gen:
                now = clock()
                if llm.n_tokens != evals and group:  # a new evaluation produced this token: the previous step ended
                    yield rec.step(StepFacts(group, accepted=0, kind="library", t_wall_s=group_t - prev))
                    prev, group = group_t, []
                    if rec.done:
                        break
                evals = llm.n_tokens
                group.append(int(tok))
                group_t = now
                ttft = now - t0 if ttft is None else ttft
                if len(group) + len(rec.output_ids) >= sampling.max_new_tokens or int(tok) in self.engine.eos_ids or cancelled():
                    break
            if group and not rec.done:
                yield rec.step(StepFacts(group, accepted=0, kind="library", t_wall_s=group_t - prev))
        finally:
            gen.close()
        if cancelled() and not rec.done:
            rec.stop("cancelled")
        end = clock()
        rec.note_stall(end - t0, time.process_time() - c0)
        rec.override(ttft_s=ttft if ttft is not None else end - t0, prefill_s=ttft if ttft is not None else end - t0, library=True)
