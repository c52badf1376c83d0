"""A FAKE of ``tensorrt_llm`` (TensorRT-LLM 1.2.0) for tests on machines without it (it needs Linux, CUDA and
Python 3.10/3.12; the test machine has Python 3.11 and no CUDA). NOT the real library.

It follows TensorRT-LLM 1.2.0's source as published in its 1.2.0 docs snapshot (``llmapi/llm.py``,
``llmapi/llm_args.py``, ``executor/result.py``, ``sampling_params.py``, ``runtime/model_runner_cpp.py``) and is
as strict as the real thing where SpecDeck could go wrong:
* ``LLM(model=..., **kwargs)``: an argument that is not a field of the PyTorch backend's args raises
  ``ValueError("LLM got invalid argument: <key>")`` (BaseLLM.__init__); TorchLlmArgs' speculative validators
  (draft model required, max_draft_len > 0, NGram's max_matching_ngram_size > 0, MTP's max_draft_len overwritten
  with num_nextn_predict_layers); ``llm.args`` holds the validated args (``speculative_config``, ``max_seq_len``
  None unless given, ``max_input_len`` 1024, ``max_num_tokens`` 8192).
* ``LLM.generate_async(inputs, sampling_params, streaming=True)`` returns a ``GenerationResult`` that iterates
  itself synchronously, with ``.finished``, ``.abort()``, ``.outputs[0]`` a ``CompletionOutput`` (``token_ids``
  cumulative, ``token_ids_diff``, ``finish_reason``, ``request_perf_metrics.speculative_decoding``). EOS is not
  part of ``token_ids`` (finish_reason 'stop'). The speculative-decoding counters are **zeros** by default, as
  1.2.x's TorchSampler leaves them (``_toy.PERF_METRICS``).
* Sampling: temperature > 0 samples (``_toy.sampled_next``), except on the one-model paths (EAGLE-3 with
  eagle3_one_model, MTP) when the decoding config's ``allow_advanced_sampling`` is False: they fall back to
  greedy, as 1.2 does.
* ``tensorrt_llm.SamplingParams`` — a dataclass (unknown fields raise TypeError).
* ``tensorrt_llm.llmapi`` and ``tensorrt_llm.runtime.ModelRunnerCpp``: see those modules.

Behaviour comes from the toy models in ``_toy`` (deterministic rules over a 50-token vocabulary).
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
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    stop_token_ids: list | None = None
    return_generation_logits: bool = False
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
    def __init__(self, prompt: list[int], params: SamplingParams, k: int, streaming: bool, nxt, max_len: int | None) -> None:
        self.prompt_token_ids = list(prompt)
        self.sampling_params = params
        n = params.max_tokens if max_len is None else max(0, min(params.max_tokens, max_len - len(prompt)))
        full = _toy.greedy(prompt, n, nxt)
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
            if self.sampling_params.return_perf_metrics and _toy.PERF_METRICS is not None:
                drafted = max(0, len(self._sizes) - 1) * self._k
                accepted = sum(s - 1 for s in self._sizes[1:])
                if _toy.PERF_TOTALS is not None:
                    drafted, accepted = _toy.PERF_TOTALS
                if _toy.PERF_METRICS == "zeros":  # 1.2.x, PyTorch backend, TorchSampler: never updated
                    drafted = accepted = 0
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


# Fields of the PyTorch backend's LLM args (TorchLlmArgs, 1.2.0) that LLM(...) accepts; anything else is refused.
LLM_ARGS = frozenset(
    """model tokenizer tokenizer_mode skip_tokenizer_init trust_remote_code tensor_parallel_size dtype revision
    tokenizer_revision pipeline_parallel_size context_parallel_size gpus_per_node moe_cluster_parallel_size
    moe_tensor_parallel_size moe_expert_parallel_size enable_attention_dp cp_config load_format enable_lora
    lora_config kv_cache_config enable_chunked_prefill guided_decoding_backend batched_logits_processor
    iter_stats_max_iterations request_stats_max_iterations peft_cache_config scheduler_config
    cache_transceiver_config speculative_config max_batch_size max_input_len max_seq_len max_beam_width
    max_num_tokens gather_generation_logits num_postprocess_workers postprocess_tokenizer_dir reasoning_parser
    garbage_collection_gen0_threshold backend cuda_graph_config disable_overlap_scheduler moe_config attn_backend
    sampler_type enable_iter_perf_stats enable_iter_req_stats print_iter_log torch_compile_config
    enable_autotuner enable_layerwise_nvtx_marker enable_min_latency stream_interval force_dynamic_quantization
    allreduce_strategy checkpoint_loader checkpoint_format kv_connector_config mm_encoder_only
    enable_sleep""".split()
)


class LLM:
    """Records its constructor arguments in `LLM.instances` (tests inspect them); validates them as 1.2.0 does."""

    instances: list[LLM] = []

    def __init__(self, model: str, speculative_config=None, **kwargs) -> None:
        for key in kwargs:
            if key not in LLM_ARGS:
                raise ValueError(f"LLM got invalid argument: {key}")
        spec = speculative_config
        kind = type(spec).__name__ if spec is not None else None
        if kind == "DraftTargetDecodingConfig":
            assert spec.max_draft_len is not None and spec.max_draft_len > 0
            assert spec.speculative_model is not None, "Draft model must be specified."
        elif kind == "NGramDecodingConfig":
            assert spec.max_draft_len is not None and spec.max_draft_len > 0 and spec.max_matching_ngram_size > 0
        elif kind == "EagleDecodingConfig":
            assert spec.speculative_model is not None, "EAGLE3 draft model must be specified."
        elif kind == "MTPDecodingConfig":
            assert spec.num_nextn_predict_layers > 0
            spec.max_draft_len = spec.num_nextn_predict_layers
        self.model = model
        self.speculative_config = spec
        self.kwargs = kwargs
        self.args = SimpleNamespace(
            model=model,
            speculative_config=spec,
            max_seq_len=kwargs.get("max_seq_len"),
            max_input_len=kwargs.get("max_input_len") or 1024,
            max_num_tokens=kwargs.get("max_num_tokens", 8192),
            enable_chunked_prefill=kwargs.get("enable_chunked_prefill", False),
        )
        self.results: list[GenerationResult] = []
        LLM.instances.append(self)

    @property
    def greedy_only(self) -> bool:
        """1-model speculation (EAGLE-3 one-model, MTP) ignores sampling unless allow_advanced_sampling is set."""
        spec = self.speculative_config
        one_model = type(spec).__name__ == "MTPDecodingConfig" or (
            type(spec).__name__ == "EagleDecodingConfig" and getattr(spec, "eagle3_one_model", True)
        )
        return one_model and not getattr(spec, "allow_advanced_sampling", False)

    def generate_async(self, inputs, sampling_params: SamplingParams | None = None, streaming: bool = False, **kwargs) -> GenerationResult:
        if not (isinstance(inputs, list) and all(isinstance(i, int) for i in inputs)):
            raise TypeError("the fake accepts token ids only")
        params = sampling_params or SamplingParams()
        if not self.args.enable_chunked_prefill and len(inputs) > self.args.max_num_tokens:
            raise ValueError(f"The sum of prompt length ({len(inputs)}) and query length (0) should not exceed max_num_tokens ({self.args.max_num_tokens})")
        k = getattr(self.speculative_config, "max_draft_len", None) or 0
        sampling = params.temperature is not None and params.temperature > 0 and not self.greedy_only
        nxt = _toy.sampled_next(params.seed or 0) if sampling else _toy.target_next
        r = GenerationResult(inputs, params, k, streaming, nxt, self.args.max_seq_len)
        self.results.append(r)
        return r
