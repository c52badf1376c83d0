"""TensorRT-LLM backend (optional; ``tensorrt_llm`` is imported lazily): a `trtllm:<engine>` lane runs one engine
manifest's target together with its speculative config.

Two paths, chosen by the manifest's `[trtllm] api`:

* `api = "llm"` — the LLM API (`tensorrt_llm.LLM`, PyTorch backend) with `decoding = "none" | "draft_target" |
  "ngram" | "eagle3" | "mtp"`. Tokens are streamed with `LLM.generate_async(..., streaming=True)`.
* `api = "runner"` — prebuilt TensorRT engines driven by `tensorrt_llm.runtime.ModelRunnerCpp`, with
  `mode = "draft_target" | "redrafter" | "medusa"`.

Modules:

* :mod:`.capability` — is TensorRT-LLM usable here (never imports it).
* :mod:`.config` — the `[trtllm]` manifest table (TRTLLMConfig, parse_config) and the library objects built from it
  (speculative configs, SamplingParams, ModelRunnerCpp sampling kwargs, per-request perf counts).
* :mod:`.engine` — TRTLLMEngine: loading, tokenizer, and raw generation primitives (`start_request`, `stream`,
  `generate`). It builds no events or stats: the lane runners in app.runners.trtllm_generate do the steps through the
  shared accounting (app.core.accounting).

Note: the package attribute `capability` is the function (as before the split); the module is
``app.engines.trtllm.capability`` in ``sys.modules`` (``from app.engines.trtllm.capability import …`` works).
"""

from __future__ import annotations

from app.engines.trtllm.capability import INSTALL_HINT, capability
from app.engines.trtllm.config import (
    LLM_DECODINGS,
    RUNNER_MODES,
    TRTLLMConfig,
    build_speculative_config,
    make_sampling_params,
    parse_config,
    perf_counts,
    runner_sampling_kwargs,
)
from app.engines.trtllm.engine import LLMRequest, RunnerStream, StreamUpdate, TRTLLMEngine, load_engine

__all__ = [
    "INSTALL_HINT",
    "capability",
    "load_engine",
    "LLM_DECODINGS",
    "RUNNER_MODES",
    "TRTLLMConfig",
    "parse_config",
    "build_speculative_config",
    "make_sampling_params",
    "runner_sampling_kwargs",
    "perf_counts",
    "TRTLLMEngine",
    "LLMRequest",
    "StreamUpdate",
    "RunnerStream",
]
