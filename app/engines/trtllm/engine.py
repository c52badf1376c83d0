"""The TensorRT-LLM engine: loading (lazy ``tensorrt_llm`` import), the tokenizer, and raw generation primitives.

It computes or streams tokens only; the `trtllm:<engine>` lane runners (app.runners.trtllm_generate) turn them into
steps through the shared accounting (app.core.accounting). Nothing here builds events or stats.

API facts relied on (TensorRT-LLM 1.2; nothing here is copied from it):
* `tensorrt_llm/executor/result.py`: `LLM.generate_async(inputs, sampling_params, streaming=True)` returns a
  `GenerationResult` iterable synchronously (`__iter__/__next__`, one update per executor response), with
  `.finished`, `.abort()`, `.outputs[0].token_ids` (cumulative, prompt excluded), `.token_ids_diff`,
  `.finish_reason` in {'stop','length','timeout','cancelled'}. EOS is not part of `token_ids` (finish 'stop').
* `tensorrt_llm/runtime/model_runner_cpp.py`: `ModelRunnerCpp.from_dir(engine_dir, ..., kv_cache_enable_block_reuse,
  kv_cache_free_gpu_memory_fraction, medusa_choices, device_ids, is_orchestrator_mode)` and `generate(batch_input_ids
  (list of int32 tensors), max_new_tokens, end_id, pad_id, temperature, top_k, top_p, random_seed, streaming,
  output_sequence_lengths=True, return_dict=True, draft_tokens_list=...)` → dict `output_ids [BS, beams, max_len]`
  (prompt included), `sequence_lengths [BS, beams]`; with `streaming=True` a generator of such dicts. The
  runner's `max_input_len` / `max_seq_len` attributes are the engine's limits (from trtllm-build's
  `--max_input_len` / `--max_seq_len`); `generate` raises RuntimeError past them.
* `llmapi/llm_args.py` (PyTorch backend): `max_seq_len` None unless given (then inferred from the model's
  `max_position_embeddings`), `max_num_tokens` 8192 bounds a prompt unless `enable_chunked_prefill`;
  `llm.args` holds the validated args, `llm.args.speculative_config` the config TensorRT-LLM kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import EngineError
from app.core.setups import Sampling
from app.engines.base import EngineBase
from app.engines.manifest import EngineManifest
from app.engines.trtllm.capability import INSTALL_HINT, capability
from app.engines.trtllm.config import build_speculative_config, make_sampling_params, parse_config, perf_counts, runner_sampling_kwargs

__all__ = ["TRTLLMEngine", "LLMRequest", "StreamUpdate", "RunnerStream", "load_engine"]


def _sync() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except ImportError:  # pragma: no cover - torch ships with the app
        pass


def _tolist(x) -> list:
    return x.tolist() if hasattr(x, "tolist") else list(x)


def _row(out: dict, start: int) -> list[int]:
    """Generated ids of batch 0 / beam 0 after `start` from a ModelRunnerCpp return dict."""
    seq_len = int(_tolist(out["sequence_lengths"])[0][0])
    ids = _tolist(out["output_ids"])[0][0]
    return [int(i) for i in ids[start:seq_len]]


@dataclass(frozen=True)
class StreamUpdate:
    """One streamed update of an LLM-API request.

    Attributes:
        new_ids: tokens that are new in this update (may be empty).
        total: generated tokens so far (prompt excluded), i.e. the cumulative `token_ids` length.
        finish_reason: the library's finish reason once given ('stop' = end_id reached, 'length', …), else None.
    """

    new_ids: tuple[int, ...]
    total: int
    finish_reason: str | None


class LLMRequest:
    """A streaming LLM-API request (`LLM.generate_async(..., streaming=True)`), started by
    :meth:`TRTLLMEngine.start_request`. Iterate it for one :class:`StreamUpdate` per executor response.

    Attributes:
        result: the library's `GenerationResult` (the handle; `perf_counts()` and `abort()` read it).
        finish_reason: the last finish reason seen while iterating (None until the library gives one).
    """

    def __init__(self, result) -> None:
        self.result = result
        self.finish_reason: str | None = None
        self._seen = 0

    def __iter__(self) -> Iterator[StreamUpdate]:
        # GenerationResult iterates itself synchronously, one update per executor response (executor/result.py)
        for update in self.result:
            out = update.outputs[0]
            ids = list(out.token_ids)  # cumulative generated ids (prompt excluded)
            new, self._seen = ids[self._seen :], len(ids)
            self.finish_reason = getattr(out, "finish_reason", None) or self.finish_reason
            yield StreamUpdate(tuple(int(i) for i in new), self._seen, self.finish_reason)

    @property
    def finished(self) -> bool:
        return bool(getattr(self.result, "finished", False))

    def abort(self) -> None:
        """Stop the request in the executor (no-op once it finished)."""
        abort = getattr(self.result, "abort", None)
        if abort is not None and not self.finished:
            abort()

    def perf_counts(self) -> tuple[int, int] | None:
        """(drafted, accepted) from the request's speculative-decoding perf metrics, when the library gave them."""
        return perf_counts(self.result)


class RunnerStream:
    """A streaming `ModelRunnerCpp.generate` call, started by :meth:`TRTLLMEngine.stream`: iterate it for the new
    ids of each streamed response (the device synchronised first); `close()` ends the library's generator."""

    def __init__(self, gen, start: int) -> None:
        self._gen = gen
        self._start = start  # prompt length: the runner returns the whole sequence

    def __iter__(self) -> Iterator[list[int]]:
        seen = 0
        for out in self._gen:  # one dict per streamed executor response: the whole sequence so far
            _sync()
            ids = _row(out, self._start)
            new, seen = ids[seen:], len(ids)
            yield new

    def close(self) -> None:
        close = getattr(self._gen, "close", None)
        if close is not None:
            close()


class TRTLLMEngine(EngineBase):
    """A TensorRT-LLM target plus its speculative config, from a `backend = "trtllm"` manifest.

    Runs only as a `trtllm:<engine>` lane (app.runners.trtllm_generate.runner_for picks its runner by `config`); it
    has no step-by-step DecodeState, so it cannot be the target of the HF loop's setups.

    Args:
        manifest: the engine manifest.
        device: None/"auto"/"cuda"/"cuda:N" (TensorRT-LLM is CUDA only; the runner uses `[trtllm] device_ids`).
        dtype: "bfloat16"/"float16" passed to `LLM(dtype=...)`; "auto"/"float32"/None use the checkpoint's dtype.
            Built engines carry their own dtype.
        progress: callback (task, done, total, unit).
        tokenizer: an already-loaded HF tokenizer (tests).

    Attributes:
        config: the validated `[trtllm]` table (TRTLLMConfig).
        llm: the `tensorrt_llm.LLM` (api "llm").
        runner, draft_runner: the target's / the draft's `ModelRunnerCpp` (api "runner"; draft_runner for
            mode draft_target only).
        end_id: the id given to the library as end_id (the lowest EOS id, else the pad id).
        draft_len: k as TensorRT-LLM uses it (read back after loading: MTP overwrites max_draft_len with
            num_nextn_predict_layers); 0 without speculation.
        context_length: prompt + new tokens the engine can hold (None: unknown), for the run's up-front check.
        max_prompt_tokens: the longest prompt it accepts (None: no separate limit).
        notes: what a lane on this engine should tell the user (e.g. a k that differs from the manifest's).

    Raises:
        EngineError: TensorRT-LLM unusable here (reason + fix), bad manifest, CPU device, load failure.
    """

    backend = "trtllm"

    def __init__(
        self, manifest: EngineManifest, device: str | None = None, dtype: str | None = None, progress=None, tokenizer=None
    ) -> None:
        progress = progress or (lambda *a: None)
        self.manifest = manifest
        self.name = manifest.name
        self.config = parse_config(manifest)
        dev = device or manifest.device
        if dev == "cpu":
            raise EngineError(
                f"engine {self.name}: TensorRT-LLM runs on CUDA GPUs only, device 'cpu' requested",
                fix="use --device cuda (or leave --device unset: trtllm manifests default to cuda)",
            )
        self.device = "cuda" if dev in (None, "auto") else dev
        want = dtype or manifest.dtype
        if self.config.api == "runner":
            self.dtype = "engine"  # fixed when the engine was built
        else:
            self.dtype = want if want in ("bfloat16", "float16") else "auto"
        ok, why = capability()
        if not ok:
            raise EngineError(f"engine {self.name}: TensorRT-LLM unusable here: {why}", fix=INSTALL_HINT)
        t0 = time.perf_counter()
        self.tokenizer = tokenizer if tokenizer is not None else self._load_tokenizer()
        progress(f"load {self.name}", 0, 1, "")
        try:
            if self.config.api == "llm":
                self._load_llm()
            else:
                self._load_runner()
        except EngineError:
            raise
        except Exception as e:
            raise EngineError(
                f"cannot load TensorRT-LLM engine {self.name} ({manifest.where}): {type(e).__name__}: {e}",
                fix="check the [source]/[trtllm] paths and ids in the manifest, the GPU memory "
                "(kv_cache_free_gpu_memory_fraction) and that engines were built by this TensorRT-LLM version",
            ) from None
        self.load_s = time.perf_counter() - t0
        progress(f"load {self.name}", 1, 1, "")
        tok = self.tokenizer
        self.vocab_size = len(tok)
        eos = getattr(tok, "eos_token_id", None)
        self.eos_ids = frozenset([int(eos)] if eos is not None else [])
        pad = getattr(tok, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else (int(eos) if eos is not None else 0)
        self.end_id = min(self.eos_ids) if self.eos_ids else self.pad_id
        self.notes: list[str] = []
        self.draft_len = self._kept_draft_len()
        self.context_length, self.max_prompt_tokens = self._limits()

    # --- what TensorRT-LLM kept ---------------------------------------------------------------------
    def _kept_draft_len(self) -> int:
        c = self.config
        if c.api != "llm":
            return c.max_draft_len
        if c.kind == "none":
            return 0
        kept = getattr(getattr(getattr(self, "llm", None), "args", None), "speculative_config", None) or self.speculative_config
        k = getattr(kept, "max_draft_len", None)
        if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
            return c.max_draft_len
        if k != c.max_draft_len:
            self.notes.append(f"TensorRT-LLM drafts k = {k} per step (its config overrides the manifest's {c.max_draft_len}"
                              + (": MTP uses num_nextn_predict_layers)" if c.kind == "mtp" else ")"))
        return k

    def _limits(self) -> tuple[int | None, int | None]:
        """(context_length, max_prompt_tokens) from what the library reports, else the engine/model files."""
        c = self.config

        def num(x) -> int | None:
            return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None

        if c.api == "llm":
            args = getattr(getattr(self, "llm", None), "args", None)
            seq = num(getattr(args, "max_seq_len", None)) or num(c.llm_args.get("max_seq_len")) or _model_positions(c.model)
            chunked = bool(getattr(args, "enable_chunked_prefill", c.llm_args.get("enable_chunked_prefill", False)))
            prompt = None if chunked else (num(getattr(args, "max_num_tokens", None)) or num(c.llm_args.get("max_num_tokens")) or 8192)
            return seq, prompt
        runners = [self.runner] + ([self.draft_runner] if c.kind == "draft_target" else [])
        dirs = [c.engine_dir] + ([c.draft_engine_dir] if c.kind == "draft_target" else [])
        inputs, seqs = [], []
        for r, d in zip(runners, dirs, strict=True):
            built = _build_config(d)
            inputs.append(num(getattr(r, "max_input_len", None)) or num(built.get("max_input_len")))
            seqs.append(num(getattr(r, "max_seq_len", None)) or num(built.get("max_seq_len")))
        if c.kind == "draft_target":
            # each step re-sends the whole sequence: it must stay within max_input_len up to the last step
            limits = [x + 1 for x in inputs if x] + [x for x in seqs if x]
            return (min(limits) if limits else None), None
        return seqs[0], inputs[0]

    # --- loading (lazy imports) -----------------------------------------------------------------
    def _tokenizer_dir(self) -> str:
        c = self.config
        d = c.tokenizer_dir or c.model
        if not d:
            raise EngineError(f"engine {self.name}: no tokenizer_dir", fix=f"add tokenizer_dir to [trtllm] in {self.manifest.where}")
        return d

    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        d = self._tokenizer_dir()
        try:
            return AutoTokenizer.from_pretrained(d)
        except Exception as e:
            raise EngineError(
                f"engine {self.name}: cannot load the tokenizer from {d}: {type(e).__name__}: {e}",
                fix=f"point tokenizer_dir (or [source] model) in {self.manifest.where} at an HF folder with tokenizer files",
            ) from None

    def _load_llm(self) -> None:
        from tensorrt_llm import LLM, SamplingParams, llmapi

        c = self.config
        self._SamplingParams = SamplingParams
        kw = dict(c.llm_args)
        spec = build_speculative_config(c, llmapi)
        if spec is not None:
            kw["speculative_config"] = spec
        if self.dtype != "auto":
            kw.setdefault("dtype", self.dtype)
        if c.kv_cache_free_gpu_memory_fraction is not None and "kv_cache_config" not in kw and hasattr(llmapi, "KvCacheConfig"):
            kw["kv_cache_config"] = llmapi.KvCacheConfig(free_gpu_memory_fraction=c.kv_cache_free_gpu_memory_fraction)
        self.llm = LLM(model=c.model, **kw)
        self.speculative_config = spec

    def _load_runner(self) -> None:
        from tensorrt_llm.runtime import ModelRunnerCpp

        c = self.config
        kw: dict[str, Any] = dict(device_ids=list(c.device_ids), is_orchestrator_mode=True)
        if c.kv_cache_free_gpu_memory_fraction is not None:
            kw["kv_cache_free_gpu_memory_fraction"] = c.kv_cache_free_gpu_memory_fraction
        if c.kind == "draft_target":
            # examples/draft_target_model/README: KV-cache block reuse is required (each step re-sends the prefix)
            kw["kv_cache_enable_block_reuse"] = True
            self.draft_runner = ModelRunnerCpp.from_dir(engine_dir=c.draft_engine_dir, **kw)
        if c.kind == "medusa":
            kw["medusa_choices"] = [list(x) for x in c.medusa_choices or ()]
        self.runner = ModelRunnerCpp.from_dir(engine_dir=c.engine_dir, **kw)

    def sync(self) -> None:
        _sync()

    # --- raw generation primitives (the lane runners in app.runners.trtllm_generate call these) ----------
    def start_request(self, prompt_ids: list[int], sampling: Sampling) -> LLMRequest:
        """Start one streaming LLM-API request (api "llm") for `prompt_ids`; iterate the returned LLMRequest.

        Raises:
            EngineError: the engine is not an LLM-API engine.
        """
        if self.config.api != "llm":
            raise EngineError(f"engine {self.name} has api = {self.config.api!r}, not the LLM API")
        params = make_sampling_params(self._SamplingParams, sampling)
        return LLMRequest(self.llm.generate_async(list(prompt_ids), params, streaming=True))

    def stream(self, prompt_ids: list[int], sampling: Sampling) -> RunnerStream:
        """Start a streaming `ModelRunnerCpp.generate` of the target engine (api "runner": ReDrafter, Medusa) for
        up to `sampling.max_new_tokens` tokens; iterate the returned RunnerStream, then close it."""
        import torch

        gen = self.runner.generate(
            batch_input_ids=[torch.tensor(prompt_ids, dtype=torch.int32)],
            max_new_tokens=sampling.max_new_tokens,
            end_id=self.end_id,
            pad_id=self.pad_id,
            streaming=True,
            output_sequence_lengths=True,
            return_dict=True,
            **runner_sampling_kwargs(sampling, 0),
        )
        return RunnerStream(gen, len(prompt_ids))

    def generate(
        self,
        seq: list[int],
        max_new_tokens: int,
        sampling: Sampling,
        *,
        on: str = "target",
        seed_offset: int = 0,
        draft_tokens: list[int] | None = None,
    ) -> list[int]:
        """One blocking `ModelRunnerCpp.generate` call on the target (or the draft) engine (api "runner").

        Args:
            seq: the whole sequence so far (prompt and generated tokens).
            max_new_tokens: at most this many new tokens.
            sampling: temperature/top-k/top-p/seed (through `runner_sampling_kwargs`).
            on: "target" or "draft" (mode draft_target's draft engine).
            seed_offset: added to the seed under sampling, so successive calls do not replay one random stream.
            draft_tokens: drafts for the target to verify (`draft_tokens_list`); an empty list goes as [end_id],
                as run_dtm_ngram.py does: a placeholder the target checks like any draft (accepting it means the
                target emitted EOS, which a lane treats as its own token).

        Returns:
            The new ids after `seq` (the device synchronised).
        """
        import torch

        runner = self.runner if on == "target" else self.draft_runner
        kw: dict[str, Any] = dict(
            end_id=self.end_id,
            pad_id=self.pad_id,
            streaming=False,
            output_sequence_lengths=True,
            return_dict=True,
            **runner_sampling_kwargs(sampling, seed_offset),
        )
        if draft_tokens is not None:
            kw["draft_tokens_list"] = [list(draft_tokens) or [self.end_id]]
        out = runner.generate(batch_input_ids=[torch.tensor(seq, dtype=torch.int32)], max_new_tokens=max_new_tokens, **kw)
        _sync()
        return _row(out, len(seq))


def _build_config(engine_dir: str | None) -> dict:
    """`build_config` of a built engine's config.json (trtllm-build), or {} when unreadable."""
    try:
        return dict(json.loads((Path(engine_dir or "") / "config.json").read_text(encoding="utf-8")).get("build_config") or {})
    except (OSError, ValueError, AttributeError):
        return {}


def _model_positions(model: str | None) -> int | None:
    """max_position_embeddings of a local HF model folder (what TensorRT-LLM infers max_seq_len from)."""
    try:
        n = json.loads((Path(model or "") / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return n if isinstance(n, int) and n > 0 else None


def load_engine(
    manifest: EngineManifest, device: str | None = None, dtype: str | None = None, progress=None, tokenizer=None
) -> TRTLLMEngine:
    """Load a `backend = "trtllm"` manifest.

    Raises:
        EngineError: TensorRT-LLM unusable here (the capability reason and the fix), or the engine fails to load.
    """
    ok, why = capability()
    if not ok:
        raise EngineError(f"engine {manifest.name}: TensorRT-LLM unusable here: {why}", fix=INSTALL_HINT)
    return TRTLLMEngine(manifest, device=device, dtype=dtype, progress=progress, tokenizer=tokenizer)
