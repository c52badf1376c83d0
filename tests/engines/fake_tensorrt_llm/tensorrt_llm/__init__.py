"""A FAKE of ``tensorrt_llm`` (TensorRT-LLM 1.2) for tests on machines without it (it needs Linux, CUDA and
Python 3.10/3.12; the test machine has Python 3.11 and no CUDA). NOT the real library.

It mirrors only what the engine package app/engines/trtllm/ uses (its lane runners in app/speculative/trtllm.py
reach the library only through the engine), as documented for TensorRT-LLM 1.2:
* ``tensorrt_llm.LLM(model=..., speculative_config=..., **kwargs)`` and ``LLM.generate_async(inputs,
  sampling_params, streaming=True)`` returning a ``GenerationResult`` that iterates itself synchronously
  (``__iter__``/``__next__``), with ``.finished``, ``.abort()``, ``.outputs[0]`` a ``CompletionOutput``
  (``token_ids`` cumulative, ``token_ids_diff``, ``finish_reason``, ``request_perf_metrics.speculative_decoding
  .{acceptance_rate,total_accepted_draft_tokens,total_draft_tokens}``) — LLM API reference and
  ``tensorrt_llm/executor/result.py``. EOS is not part of ``token_ids`` (finish_reason 'stop').
* ``tensorrt_llm.SamplingParams`` — a dataclass (``tensorrt_llm/sampling_params.py``).
* ``tensorrt_llm.llmapi`` decoding configs (pydantic, strict: unknown fields rejected).
* ``tensorrt_llm.runtime.ModelRunnerCpp`` (``tensorrt_llm/runtime/model_runner_cpp.py``).

Behaviour comes from the toy models in ``_toy`` (deterministic, greedy; sampling parameters are recorded, not used).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from . import _toy, llmapi, runtime  # noqa: F401  (submodules, as in the real package)

__version__ = "1.2.0"
__all__ = ["LLM", "SamplingParams", "llmapi", "runtime"]


@dataclass
class SamplingParams:
    """Fields named as in tensorrt_llm/sampling_params.py (a subset)."""

    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    detokenize: bool = True
    return_perf_metrics: bool = False


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    request_perf_metrics: Any = None
    _last_token_ids_len: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]


class GenerationResult:
    def __init__(self, prompt: list[int], params: SamplingParams, k: int, streaming: bool) -> None:
        self.prompt_token_ids = list(prompt)
        self.sampling_params = params
        full = _toy.greedy(prompt, params.max_tokens)
        self._stop = bool(full) and full[-1] == _toy.EOS
        self._tokens = full[:-1] if self._stop else full
        self._sizes = _toy.chunk_sizes(len(self._tokens), k) if streaming else [len(self._tokens)]
        self._k = k
        self._i = 0
        self._done = False
        self.aborted_called = False
        self.decoding_iter = 0
        self.outputs = [CompletionOutput(0)]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self.aborted_called = True
        self._done = True
        self.outputs[0].finish_reason = "cancelled"

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        out = self.outputs[0]
        n = self._sizes[self._i] if self._i < len(self._sizes) else 0
        start = len(out.token_ids)
        out._last_token_ids_len = start
        out.token_ids = out.token_ids + self._tokens[start : start + n]
        self._i += 1
        self.decoding_iter += 1
        if self._i >= len(self._sizes):
            self._done = True
            out.finish_reason = "stop" if self._stop else "length"
            if self.sampling_params.return_perf_metrics and _toy.PERF_METRICS:
                iters = max(0, len(self._sizes) - 1)
                drafted = iters * self._k
                accepted = sum(s - 1 for s in self._sizes[1:])
                if _toy.PERF_TOTALS is not None:
                    drafted, accepted = _toy.PERF_TOTALS
                sd = SimpleNamespace(
                    acceptance_rate=accepted / drafted if drafted else 0.0,
                    total_accepted_draft_tokens=accepted,
                    total_draft_tokens=drafted,
                )
                out.request_perf_metrics = SimpleNamespace(speculative_decoding=sd)
        return self

    def result(self):
        for _ in self:
            pass
        return self


class LLM:
    """Records its constructor arguments in `LLM.instances` (tests inspect them)."""

    instances: list[LLM] = []

    def __init__(self, model: str, speculative_config=None, **kwargs) -> None:
        self.model = model
        self.speculative_config = speculative_config
        self.kwargs = kwargs
        self.results: list[GenerationResult] = []
        LLM.instances.append(self)

    def generate_async(self, inputs, sampling_params: SamplingParams | None = None, streaming: bool = False, **kwargs) -> GenerationResult:
        if not (isinstance(inputs, list) and all(isinstance(i, int) for i in inputs)):
            raise TypeError("the fake accepts token ids only")
        k = getattr(self.speculative_config, "max_draft_len", None) or 0
        if type(self.speculative_config).__name__ == "MTPDecodingConfig" and not k:
            k = self.speculative_config.num_nextn_predict_layers
        r = GenerationResult(inputs, sampling_params or SamplingParams(), k, streaming)
        self.results.append(r)
        return r
