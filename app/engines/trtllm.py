"""TensorRT-LLM backend (optional, imported lazily): a `trtllm:<engine>` lane runs one engine manifest's target
together with its speculative config.

Two paths, chosen by the manifest's `[trtllm] api`:

* `api = "llm"` — the LLM API (`tensorrt_llm.LLM`, PyTorch backend) with `decoding = "none" | "draft_target" |
  "ngram" | "eagle3" | "mtp"`. Tokens are streamed with `LLM.generate_async(..., streaming=True)`; each streamed
  update is taken as one decoding iteration (one step). Which draft tokens were rejected is not exposed by this
  path, so steps carry counts only (see `_CountsOnlySteps`).
* `api = "runner"` — prebuilt TensorRT engines driven by `tensorrt_llm.runtime.ModelRunnerCpp`, with
  `mode = "draft_target" | "redrafter" | "medusa"`. `draft_target` runs the draft and the target engines step by
  step as TensorRT-LLM's `examples/draft_target_model` + `examples/ngram/run_dtm_ngram.py` do (draft generates k
  tokens, the target verifies them through `generate(..., draft_tokens_list=...)`), so drafted, accepted and
  rejected ids are all known. ReDrafter (`explicit_draft_tokens` engines) and Medusa stream through one runner and
  report counts only, like the LLM API path.

API facts relied on (TensorRT-LLM 1.2; nothing here is copied from it):
* LLM API reference, https://nvidia.github.io/TensorRT-LLM/llm-api/reference.html: `LLM(model=...,
  speculative_config=...)`, `DraftTargetDecodingConfig / NGramDecodingConfig / Eagle3DecodingConfig /
  MTPDecodingConfig` (pydantic models; fields `max_draft_len`, `speculative_model`, `max_matching_ngram_size`,
  `eagle3_one_model`, `num_nextn_predict_layers`). The draft-model field is `speculative_model` since PR #10099
  (Dec 2025, in 1.2); `speculative_model_dir` before, kept as an alias: we pick whichever the class declares.
* `examples/llm-api/llm_speculative_decoding.py` (1.0 → 1.3 docs): how each config is built.
* `tensorrt_llm/executor/result.py`: `generate_async` returns a `GenerationResult` iterable synchronously
  (`__iter__/__next__`), with `.finished`, `.abort()`, `.outputs[0].token_ids` (cumulative), `.token_ids_diff`,
  `.finish_reason` in {'stop','length','timeout','cancelled'}; `.outputs[0].request_perf_metrics
  .speculative_decoding.{acceptance_rate,total_accepted_draft_tokens,total_draft_tokens}` when
  `SamplingParams(return_perf_metrics=True)` (as `trtllm-serve`'s metrics code reads them).
* Speculative decoding feature page (docs/features/speculative-decoding): "a single sequence of draft tokens with
  length max_draft_len is created for every request" — the basis of our drafted = max_draft_len assumption.
* `tensorrt_llm/runtime/model_runner_cpp.py`: `ModelRunnerCpp.from_dir(engine_dir, ..., kv_cache_enable_block_reuse,
  kv_cache_free_gpu_memory_fraction, medusa_choices, device_ids, is_orchestrator_mode)` and `generate(batch_input_ids
  (list of int32 tensors), max_new_tokens, end_id, pad_id, temperature, top_k, top_p, random_seed, streaming,
  output_sequence_lengths=True, return_dict=True, draft_tokens_list=...)` → dict `output_ids [BS, beams, max_len]`
  (prompt included), `sequence_lengths [BS, beams]`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import difflib
import importlib.metadata as md
import importlib.util
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import EngineError
from app.core.events import RunDone, StepEvent
from app.core.metrics import LaneStats
from app.core.setups import Sampling
from app.engines.base import TokenizerMixin
from app.engines.registry import EngineManifest

__all__ = [
    "INSTALL_HINT",
    "capability",
    "open_engine",
    "TRTLLMConfig",
    "parse_config",
    "build_speculative_config",
    "make_sampling_params",
    "TRTLLMEngine",
]

INSTALL_HINT = "pip install '.[trtllm]' --extra-index-url https://pypi.nvidia.com   (Linux, CUDA driver, Python 3.10 or 3.12)"
_MIN_VERSION = (1, 2)
_PY_OK = ((3, 10), (3, 12))

LLM_DECODINGS = ("none", "draft_target", "ngram", "eagle3", "mtp")
RUNNER_MODES = ("draft_target", "redrafter", "medusa")

# ---------------------------------------------------------------------------------------------------
# capability: is TensorRT-LLM usable here? (fast; never imports tensorrt_llm)
# ---------------------------------------------------------------------------------------------------


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part else ""
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def _find_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _python_version() -> tuple[int, int]:
    return sys.version_info[0], sys.version_info[1]


def _system() -> str:
    return platform.system()


def _load_cuda_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def capability() -> tuple[bool, str]:
    """(usable, reason) for TensorRT-LLM on this machine, quickly and without importing it.

    Checks, in order: the package is installed (`importlib.util.find_spec`), its version (>= 1.2, from the
    distribution metadata), the Python version (wheels exist for 3.10 and 3.12), Linux, and that the CUDA
    driver library loads (`ctypes` on libcuda.so.1; `import tensorrt_llm` fails without it).

    Returns:
        (True, "") when usable, else (False, reason) where reason names the problem and the fix.
    """
    py = _python_version()
    py_s = f"{py[0]}.{py[1]}"
    if _find_spec("tensorrt_llm") is None:
        extra = "" if py in _PY_OK else f"; this is Python {py_s}"
        return False, f"not installed (pip install .[trtllm] on Linux with CUDA; wheels for Python 3.10/3.12{extra})"
    ver = _dist_version("tensorrt_llm")
    if ver is not None:
        vt = _version_tuple(ver)
        if vt and vt < _MIN_VERSION:
            return False, f"tensorrt_llm {ver} is too old (need >= 1.2: {INSTALL_HINT})"
    if py not in _PY_OK:
        return False, f"wrong Python {py_s} (TensorRT-LLM wheels exist for 3.10 and 3.12)"
    system = _system()
    if system != "Linux":
        return False, f"TensorRT-LLM needs Linux (this is {system})"
    if not _load_cuda_driver():
        return False, "no CUDA driver (libcuda.so.1 not found)"
    return True, ""


# ---------------------------------------------------------------------------------------------------
# manifest [trtllm] table
# ---------------------------------------------------------------------------------------------------

_COMMON_KEYS = {"api", "tokenizer_dir", "max_draft_len", "device_ids", "kv_cache_free_gpu_memory_fraction"}
_LLM_KEYS = _COMMON_KEYS | {
    "decoding",
    "speculative_model",
    "max_matching_ngram_size",
    "eagle3_one_model",
    "num_nextn_predict_layers",
    "llm_args",
}
_RUNNER_KEYS = _COMMON_KEYS | {"mode", "draft_engine_dir", "medusa_choices"}


@dataclass(frozen=True)
class TRTLLMConfig:
    """The validated `[trtllm]` table of a manifest.

    Attributes:
        api: "llm" (LLM API) or "runner" (ModelRunnerCpp on built engines).
        kind: for api "llm" the decoding (none|draft_target|ngram|eagle3|mtp); for "runner" the mode
            (draft_target|redrafter|medusa).
        model: HF id or folder for the LLM API (manifest `[source] model`), else None.
        engine_dir: built target engine folder (manifest `[source] engine_dir`), else None.
        max_draft_len: k, tokens drafted per step (ReDrafter: draft length per beam; Medusa: default the depth of
            the deepest medusa_choices path).
        speculative_model: draft model / EAGLE-3 head / MTP module (HF id or folder) for the LLM API.
        max_matching_ngram_size: n-gram match length (ngram).
        eagle3_one_model: run the EAGLE-3 head inside the target's graph (eagle3).
        num_nextn_predict_layers: MTP modules (mtp).
        draft_engine_dir: built draft engine folder (runner draft_target).
        tokenizer_dir: HF tokenizer folder (required for runner; default: the model folder for the LLM API).
        medusa_choices: Medusa tree (runner medusa).
        device_ids: GPUs for the runner engines (orchestrator mode), default [0].
        kv_cache_free_gpu_memory_fraction: per engine; two runner engines share one GPU, so default 0.4.
        llm_args: extra keyword arguments passed verbatim to `LLM(...)`.
    """

    api: str
    kind: str
    model: str | None = None
    engine_dir: str | None = None
    max_draft_len: int = 0
    speculative_model: str | None = None
    max_matching_ngram_size: int = 4
    eagle3_one_model: bool = True
    num_nextn_predict_layers: int = 1
    draft_engine_dir: str | None = None
    tokenizer_dir: str | None = None
    medusa_choices: tuple[tuple[int, ...], ...] | None = None
    device_ids: tuple[int, ...] = (0,)
    kv_cache_free_gpu_memory_fraction: float | None = None
    llm_args: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def counts_only(self) -> bool:
        """True when rejected draft ids are not exposed (everything but the runner's draft_target)."""
        return not (self.api == "runner" and self.kind == "draft_target")


def _local_path(value: str, manifest: EngineManifest) -> str:
    """A manifest path relative to the manifest's folder; HF ids (`org/name` not on disk) stay as they are."""
    p = Path(value).expanduser()
    if p.is_absolute():
        return str(p)
    base = manifest.path.parent if manifest.path is not None else Path.cwd()
    if value.startswith((".", "~")) or (base / p).exists():
        return str((base / p).resolve())
    return value


def parse_config(manifest: EngineManifest) -> TRTLLMConfig:
    """Validate a trtllm manifest's `[trtllm]` table (plus `[source] model|engine_dir`).

    Raises:
        EngineError: unknown key (with a close match), missing or bad value; names the manifest file.
    """
    where = manifest.where

    def bad(why: str, fix: str | None = None) -> EngineError:
        return EngineError(f"engine manifest {where}: {why}", fix=fix or f"edit the [trtllm] table of {where} (see README, TensorRT-LLM)")

    t = manifest.extra.get("trtllm", {}) or {}
    if not isinstance(t, dict):
        raise bad("[trtllm] must be a table")
    model, engine_dir = manifest.extra.get("model"), manifest.extra.get("engine_dir")
    api = t.get("api", "runner" if engine_dir and not model else "llm")
    if api not in ("llm", "runner"):
        raise bad(f"api must be 'llm' or 'runner', got {api!r}")
    allowed = _LLM_KEYS if api == "llm" else _RUNNER_KEYS
    for k in t:
        if k not in allowed:
            close = difflib.get_close_matches(k, sorted(allowed), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed with api = {api!r}: {', '.join(sorted(allowed))}"
            raise bad(f"unknown key {k!r} in [trtllm]", f"{hint} (edit {where})")

    def num(key: str, default, typ=int, minimum=0):
        v = t.get(key, default)
        if v is None:
            return None
        if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise bad(f"{key} must be an integer, got {v!r}")
        if typ is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise bad(f"{key} must be a number, got {v!r}")
        if v < minimum:
            raise bad(f"{key} must be >= {minimum}, got {v!r}")
        return typ(v)

    def text(key: str) -> str | None:
        v = t.get(key)
        if v is None:
            return None
        if not isinstance(v, str) or not v:
            raise bad(f"{key} must be a non-empty string")
        return v

    tok = text("tokenizer_dir")
    device_ids = t.get("device_ids", [0])
    if not isinstance(device_ids, list) or not device_ids or not all(isinstance(i, int) and i >= 0 for i in device_ids):
        raise bad(f"device_ids must be a non-empty list of GPU indices, got {device_ids!r}")
    frac = num("kv_cache_free_gpu_memory_fraction", None, float, 0)
    if frac is not None and not (0.0 < frac <= 1.0):
        raise bad(f"kv_cache_free_gpu_memory_fraction must be in (0, 1], got {frac}")
    common = dict(
        tokenizer_dir=_local_path(tok, manifest) if tok else None,
        device_ids=tuple(device_ids),
        kv_cache_free_gpu_memory_fraction=frac,
    )
    if api == "llm":
        if not model:
            raise bad("api = 'llm' needs [source] model = \"<HF id or folder>\"")
        kind = t.get("decoding", "none")
        if kind not in LLM_DECODINGS:
            raise bad(f"decoding must be one of {', '.join(LLM_DECODINGS)}, got {kind!r}")
        k = num("max_draft_len", 0 if kind in ("none", "mtp") else None)
        if kind in ("draft_target", "ngram", "eagle3") and not k:
            raise bad(f"decoding = {kind!r} needs max_draft_len >= 1")
        spec_model = text("speculative_model")
        if kind in ("draft_target", "eagle3") and not spec_model:
            raise bad(
                f"decoding = {kind!r} needs speculative_model (HF id or folder of the {'draft model' if kind == 'draft_target' else 'EAGLE-3 head'})"
            )
        one = t.get("eagle3_one_model", True)
        if not isinstance(one, bool):
            raise bad(f"eagle3_one_model must be true or false, got {one!r}")
        nextn = num("num_nextn_predict_layers", 1, int, 1)
        if kind == "mtp" and not k:
            k = nextn  # MTP drafts one token per module
        llm_args = t.get("llm_args", {})
        if not isinstance(llm_args, dict):
            raise bad("llm_args must be a table of LLM(...) keyword arguments")
        return TRTLLMConfig(
            api="llm",
            kind=kind,
            model=_local_path(model, manifest),
            max_draft_len=k or 0,
            speculative_model=_local_path(spec_model, manifest) if spec_model else None,
            max_matching_ngram_size=num("max_matching_ngram_size", 4, int, 1),
            eagle3_one_model=one,
            num_nextn_predict_layers=nextn,
            llm_args=dict(llm_args),
            **common,
        )
    # runner
    if not engine_dir:
        raise bad("api = 'runner' needs [source] engine_dir = \"<folder built by trtllm-build>\"")
    kind = t.get("mode")
    if kind not in RUNNER_MODES:
        raise bad(f"mode must be one of {', '.join(RUNNER_MODES)}, got {kind!r}")
    if not tok:
        raise bad("api = 'runner' needs tokenizer_dir (the HF folder of the target: engines hold no tokenizer)")
    choices = t.get("medusa_choices")
    if kind == "medusa":
        if (
            not isinstance(choices, list)
            or not choices
            or not all(isinstance(c, list) and c and all(isinstance(i, int) for i in c) for c in choices)
        ):
            raise bad("mode = 'medusa' needs medusa_choices, a list of non-empty integer lists, e.g. [[0], [0, 0], [1], [0, 1]]")
    # Medusa drafts along its tree: at most the depth of the deepest choice per step
    k = num("max_draft_len", max(len(c) for c in choices) if kind == "medusa" else None)
    if not k:
        what = {
            "draft_target": "tokens the draft engine proposes per step",
            "redrafter": "redrafter_draft_len_per_beam",
            "medusa": "the depth of the Medusa tree",
        }[kind]
        raise bad(f"mode = {kind!r} needs max_draft_len >= 1 ({what})")
    draft_dir = text("draft_engine_dir")
    if kind == "draft_target" and not draft_dir:
        raise bad("mode = 'draft_target' needs draft_engine_dir (the draft model's engine folder)")
    if kind == "draft_target" and common["kv_cache_free_gpu_memory_fraction"] is None:
        common["kv_cache_free_gpu_memory_fraction"] = 0.4  # two engines on one GPU (examples/draft_target_model)
    return TRTLLMConfig(
        api="runner",
        kind=kind,
        engine_dir=_local_path(engine_dir, manifest),
        max_draft_len=k,
        draft_engine_dir=_local_path(draft_dir, manifest) if draft_dir else None,
        medusa_choices=tuple(tuple(c) for c in choices) if kind == "medusa" else None,
        **common,
    )


# ---------------------------------------------------------------------------------------------------
# LLM API objects (built from the library module passed in: the real one, or the tests' fake)
# ---------------------------------------------------------------------------------------------------


def _declared_fields(cls) -> set[str] | None:
    """Field names a config/params class declares (pydantic `model_fields`, dataclass fields, or __init__)."""
    mf = getattr(cls, "model_fields", None)
    if isinstance(mf, dict):
        return set(mf)
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    try:
        import inspect

        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return set(params)


def _model_field(cls) -> str:
    """`speculative_model` (TensorRT-LLM >= 1.2) or `speculative_model_dir` (earlier)."""
    names = _declared_fields(cls)
    if names is not None and "speculative_model" not in names and "speculative_model_dir" in names:
        return "speculative_model_dir"
    return "speculative_model"


def build_speculative_config(cfg: TRTLLMConfig, llmapi) -> Any | None:
    """The `speculative_config` object for `LLM(...)`, or None for decoding = "none".

    Args:
        cfg: a TRTLLMConfig with api "llm".
        llmapi: the `tensorrt_llm.llmapi` module (the tests pass a fake mirroring its documented classes).

    Raises:
        EngineError: the installed TensorRT-LLM lacks the config class.
    """
    if cfg.api != "llm" or cfg.kind == "none":
        return None

    def cls(*names: str):
        for n in names:
            c = getattr(llmapi, n, None)
            if c is not None:
                return c
        raise EngineError(
            f"this TensorRT-LLM has no {names[0]} (decoding = {cfg.kind!r})",
            fix=f"upgrade: {INSTALL_HINT}",
        )

    if cfg.kind == "draft_target":
        c = cls("DraftTargetDecodingConfig")
        return c(max_draft_len=cfg.max_draft_len, **{_model_field(c): cfg.speculative_model})
    if cfg.kind == "ngram":
        c = cls("NGramDecodingConfig")
        # is_keep_all / is_use_oldest / is_public_pool keep their documented defaults
        return c(max_draft_len=cfg.max_draft_len, max_matching_ngram_size=cfg.max_matching_ngram_size)
    if cfg.kind == "eagle3":
        c = cls("Eagle3DecodingConfig", "EagleDecodingConfig")  # Eagle3DecodingConfig from 1.1; EagleDecodingConfig in 1.0
        kw = {"max_draft_len": cfg.max_draft_len, _model_field(c): cfg.speculative_model}
        declared = _declared_fields(c)
        if declared is None or "eagle3_one_model" in declared:
            kw["eagle3_one_model"] = cfg.eagle3_one_model
        return c(**kw)
    if cfg.kind == "mtp":
        c = cls("MTPDecodingConfig")
        kw = {"num_nextn_predict_layers": cfg.num_nextn_predict_layers}
        declared = _declared_fields(c)
        if cfg.max_draft_len and (declared is None or "max_draft_len" in declared) and cfg.max_draft_len != cfg.num_nextn_predict_layers:
            kw["max_draft_len"] = cfg.max_draft_len
        return c(**kw)
    raise EngineError(f"unknown decoding {cfg.kind!r}", fix=f"use one of {', '.join(LLM_DECODINGS)}")


def make_sampling_params(sampling_params_cls, sampling: Sampling, eos_id: int | None = None):
    """Map our Sampling to `tensorrt_llm.SamplingParams`.

    Greedy (temperature 0) leaves temperature/top_k/top_p unset, which the SamplingParams doc defines as greedy
    (speculative decoders accept only a subset of sampling options). Otherwise temperature is passed, top_p only
    when < 1 and top_k only when > 0 (our 0 = disabled). `seed` and `return_perf_metrics` are passed when the
    class declares them (the per-request speculative-decoding counts live in the perf metrics).
    """
    s = sampling.validated()
    declared = _declared_fields(sampling_params_cls)

    def ok(name: str) -> bool:
        return declared is None or name in declared

    kw: dict[str, Any] = {"max_tokens": s.max_new_tokens}
    if not s.greedy:
        kw["temperature"] = s.temperature
        if s.top_p < 1.0:
            kw["top_p"] = s.top_p
        if s.top_k > 0:
            kw["top_k"] = s.top_k
    if ok("seed"):
        kw["seed"] = s.seed
    if ok("return_perf_metrics"):
        kw["return_perf_metrics"] = True
    if eos_id is not None and ok("end_id"):
        kw["end_id"] = eos_id
    return sampling_params_cls(**kw)


def _runner_sampling_kwargs(sampling: Sampling, call: int) -> dict:
    """ModelRunnerCpp.generate sampling kwargs (examples/run.py defaults: top_k 1 = greedy, top_p 0 = off).

    `call` offsets the seed so successive generate calls of one lane do not replay the same random stream.
    """
    if sampling.greedy:
        return {"temperature": 1.0, "top_k": 1, "top_p": 0.0, "random_seed": sampling.seed}
    return {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,  # 0 = no top-k limit
        "top_p": sampling.top_p if sampling.top_p < 1.0 else 0.0,
        "random_seed": sampling.seed + call,
    }


def _perf_counts(result) -> tuple[int, int] | None:
    """(total_draft_tokens, total_accepted_draft_tokens) of a finished request, when its perf metrics have them."""
    try:
        out = result.outputs[0]
        sd = out.request_perf_metrics.speculative_decoding
        drafted, accepted = int(sd.total_draft_tokens), int(sd.total_accepted_draft_tokens)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    if drafted <= 0:
        return None
    return drafted, accepted


# ---------------------------------------------------------------------------------------------------
# Lane recording shared by both paths
# ---------------------------------------------------------------------------------------------------

def _event(**kw) -> StepEvent:
    """A StepEvent; `drafted_count` carries k_t when only the count is known (rejected ids unavailable)."""
    return StepEvent(**kw)


class _Lane:
    """Accumulates one lane's tokens, text, counts and times; builds the final LaneStats.

    Counts are kept here (not by LaneAccumulator) because counts-only steps have `drafted_ids=()` while
    k_t > 0: LaneAccumulator would count them as drafted 0.
    """

    def __init__(self, engine: TRTLLMEngine, prompt_ids: list[int], sampling: Sampling, lane_id: str) -> None:
        self.lane_id = lane_id
        self.eos = engine.eos_ids
        self.max_new = sampling.max_new_tokens
        self.detok = engine.detokenizer(prompt_ids)
        self.out: list[int] = []
        self.text: list[str] = []
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.t_draft = 0.0
        self.t_verify = 0.0
        self.prefill_s = 0.0
        self.lane_t = 0.0
        self.pos_drafted: list[int] = []
        self.pos_accepted: list[int] = []
        self.stop_reason = "length"

    @property
    def done(self) -> bool:
        return self.stop_reason != "length" or len(self.out) >= self.max_new

    def add(
        self,
        emitted: list[int],
        k: int,
        a: int,
        *,
        drafted_ids: tuple[int, ...] = (),
        kind: str | None = None,
        t_draft: float = 0.0,
        t_verify: float = 0.0,
        t_wall: float | None = None,
        has_target: bool = True,
    ) -> StepEvent:
        """Record one step: `emitted` = a accepted drafts then (if `has_target`) the target token.

        Truncates at the first EOS and at the token limit (as app/spec/loop.py does); `k` is k_t (drafted
        count), `a` the accepted count.
        """
        emitted = list(emitted[: max(0, self.max_new - len(self.out))])
        target_id: int | None = emitted[a] if has_target and len(emitted) > a else None
        if len(emitted) <= a:
            a, target_id = len(emitted), None
        for j, tok in enumerate(emitted):
            if tok in self.eos:
                if j < a:
                    a, target_id = j + 1, None
                emitted = emitted[: j + 1]
                self.stop_reason = "eos"
                break
        if kind is None:
            kind = "baseline" if k == 0 else ("bonus" if a >= k else "correction")
        pieces = [self.detok.push(t) for t in emitted[:a]]
        rejected_pieces = self.detok.peek(list(drafted_ids[a:])) if len(drafted_ids) > a else []
        if target_id is not None:
            pieces.append(self.detok.push(target_id))
        t_wall = t_draft + t_verify if t_wall is None else t_wall
        self.lane_t += t_wall
        if self.steps == 0:
            self.prefill_s = t_wall
        else:
            self.t_draft += t_draft
            self.t_verify += t_verify
        self.steps += 1
        self.drafted += k
        self.accepted += a
        while len(self.pos_drafted) < k:
            self.pos_drafted.append(0)
            self.pos_accepted.append(0)
        for i in range(k):
            self.pos_drafted[i] += 1
            if i < a:
                self.pos_accepted[i] += 1
        self.out.extend(emitted)
        self.text.extend(pieces)
        return _event(
            lane_id=self.lane_id,
            step=self.steps - 1,
            drafted_ids=tuple(drafted_ids),
            accepted_count=a,
            target_id=target_id,
            target_kind=kind,
            t_draft_s=t_draft,
            t_verify_s=t_verify,
            t_wall_s=t_wall,
            emitted_ids=tuple(emitted),
            pieces=tuple(pieces),
            rejected_pieces=tuple(rejected_pieces),
            t_s=self.lane_t,
            drafted_count=k if (k and not drafted_ids) else None,
        )

    def stats(
        self, setup: str, prompt_id: str, repeat: int, *, draft_forwards: int = 0, request_counts: tuple[int, int] | None = None
    ) -> LaneStats:
        """LaneStats as app/spec/loop.py fills them; `request_counts` (drafted, accepted) from TensorRT-LLM's
        per-request perf metrics replace the per-step estimate when present."""
        drafted, accepted = request_counts if request_counts else (self.drafted, self.accepted)
        return LaneStats(
            setup=setup,
            prompt_id=prompt_id,
            repeat=repeat,
            new_tokens=len(self.out),
            wall_s=self.lane_t,
            ttft_s=self.prefill_s,
            prefill_s=self.prefill_s,
            steps=self.steps,
            drafted=drafted,
            accepted=accepted,
            draft_forwards=draft_forwards,
            t_draft_s=self.t_draft,
            t_verify_s=self.t_verify,
            output_ids=tuple(self.out),
            output_text="".join(self.text),
            per_position_drafted=tuple(self.pos_drafted),
            per_position_accepted=tuple(self.pos_accepted),
            stop_reason=self.stop_reason,
            reference=False,
        )


class _CountsOnlySteps:
    """Streamed chunks → steps when only counts are known (LLM API, ReDrafter, Medusa).

    Assumptions (stated, not verified by the library): each streamed update is one decoding iteration; the
    first update is the prefill (one token, kind "baseline"); in every later iteration the drafter proposed
    k = max_draft_len tokens (TensorRT-LLM's speculative-decoding page: one sequence of max_draft_len drafts per
    request per iteration), so an update of n new tokens means accepted = n − 1 and a target token at the end
    ("bonus" when n − 1 == k, else "correction"). k_t = max(k, n − 1) so α never exceeds 1 if the assumption is
    wrong. At EOS or the token limit the last token may really be an accepted draft; that cannot be told apart.
    Rejected ids are unavailable: steps carry `drafted_ids=()` and the count (see `_event`).
    """

    def __init__(self, lane: _Lane, k: int) -> None:
        self.lane = lane
        self.k = k

    def push(self, new_ids: list[int], dt: float) -> list[StepEvent]:
        """Events for one streamed update of `new_ids` that took `dt` seconds (none for an empty update)."""
        lane, n = self.lane, len(new_ids)
        if n == 0 or lane.done:
            return []
        if lane.steps == 0:  # the prefill yields one token; more means updates were coalesced
            share = dt / 2 if n > 1 else dt
            evs = [lane.add(new_ids[:1], 0, 0, kind="baseline", t_verify=share, t_wall=share)]
            return evs + (self.push(new_ids[1:], dt - share) if n > 1 else [])
        if self.k == 0:  # no speculation: one token per decode iteration
            evs = []
            for t in new_ids:
                if lane.done:
                    break
                evs.append(lane.add([t], 0, 0, kind="baseline", t_verify=dt / n, t_wall=dt / n))
            return evs
        a = n - 1
        return [lane.add(new_ids, max(self.k, a), a, t_verify=dt, t_wall=dt)]


# ---------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------


def _sync() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except ImportError:  # pragma: no cover - torch ships with the app
        pass


def _row(out: dict, start: int) -> list[int]:
    """Generated ids of batch 0 / beam 0 after `start` from a ModelRunnerCpp return dict."""
    seq_len = int(_tolist(out["sequence_lengths"])[0][0])
    ids = _tolist(out["output_ids"])[0][0]
    return [int(i) for i in ids[start:seq_len]]


def _tolist(x) -> list:
    return x.tolist() if hasattr(x, "tolist") else list(x)


class TRTLLMEngine(TokenizerMixin):
    """A TensorRT-LLM target plus its speculative config, from a `backend = "trtllm"` manifest.

    Runs only as a `trtllm:<engine>` lane (`run_lane`); it has no step-by-step Session, so it cannot be the
    target of the HF loop's setups.

    Args:
        manifest: the engine manifest.
        device: None/"auto"/"cuda"/"cuda:N" (TensorRT-LLM is CUDA only; the runner uses `[trtllm] device_ids`).
        dtype: "bfloat16"/"float16" passed to `LLM(dtype=...)`; "auto"/"float32"/None use the checkpoint's dtype.
            Built engines carry their own dtype.
        progress: callback (task, done, total, unit).
        tokenizer: an already-loaded HF tokenizer (tests).

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

    def new_session(self):
        raise EngineError(
            f"engine {self.name} is a TensorRT-LLM engine: it runs only as a `trtllm:{self.name}` lane",
            fix=f"use --setup trtllm:{self.name} with an hf --target for the baseline",
        )

    # --- lanes -----------------------------------------------------------------------------------
    def run_lane(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        *,
        lane_id: str = "lane",
        setup: str = "trtllm",
        prompt_id: str = "prompt",
        repeat: int = 0,
        cancelled: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> Iterator[StepEvent | RunDone]:
        """Decode one prompt with this engine's speculative config.

        Yields:
            StepEvent per step (step 0 is the prefill), then RunDone(lane_id, LaneStats) as app/spec/loop.py does.
        """
        if not prompt_ids:
            raise ValueError("empty prompt")
        sampling = sampling.validated()
        c = self.config
        if c.api == "llm":
            yield from self._lane_llm(prompt_ids, sampling, lane_id, setup, prompt_id, repeat, cancelled, clock)
        elif c.kind == "draft_target":
            yield from self._lane_runner_draft_target(prompt_ids, sampling, lane_id, setup, prompt_id, repeat, cancelled, clock)
        else:
            yield from self._lane_runner_stream(prompt_ids, sampling, lane_id, setup, prompt_id, repeat, cancelled, clock)

    def _lane_llm(self, prompt_ids, sampling, lane_id, setup, prompt_id, repeat, cancelled, clock):
        lane = _Lane(self, prompt_ids, sampling, lane_id)
        steps = _CountsOnlySteps(lane, self.config.max_draft_len if self.config.kind != "none" else 0)
        params = make_sampling_params(self._SamplingParams, sampling)
        t_last = clock()
        result = self.llm.generate_async(list(prompt_ids), params, streaming=True)
        seen = 0
        finish = None
        # GenerationResult iterates itself synchronously, one update per executor response (executor/result.py)
        for update in result:
            now = clock()
            out = update.outputs[0]
            ids = list(out.token_ids)  # cumulative generated ids (prompt excluded)
            new, seen = ids[seen:], len(ids)
            finish = getattr(out, "finish_reason", None) or finish
            evs = steps.push(new, now - t_last)
            if evs:
                t_last = now
            yield from evs
            if lane.done:
                break
            if cancelled():
                lane.stop_reason = "cancelled"
                abort = getattr(result, "abort", None)
                if abort is not None and not getattr(result, "finished", False):
                    abort()
                break
        if lane.stop_reason == "length" and finish == "stop":
            lane.stop_reason = "eos"  # TensorRT-LLM stopped at end_id (the EOS token itself is not returned)
        counts = _perf_counts(result)
        yield RunDone(lane_id, lane.stats(setup, prompt_id, repeat, request_counts=counts), cancelled=lane.stop_reason == "cancelled")

    def _lane_runner_stream(self, prompt_ids, sampling, lane_id, setup, prompt_id, repeat, cancelled, clock):
        import torch

        lane = _Lane(self, prompt_ids, sampling, lane_id)
        steps = _CountsOnlySteps(lane, self.config.max_draft_len)
        eos = min(self.eos_ids) if self.eos_ids else self.pad_id
        t_last = clock()
        gen = self.runner.generate(
            batch_input_ids=[torch.tensor(prompt_ids, dtype=torch.int32)],
            max_new_tokens=sampling.max_new_tokens,
            end_id=eos,
            pad_id=self.pad_id,
            streaming=True,
            output_sequence_lengths=True,
            return_dict=True,
            **_runner_sampling_kwargs(sampling, 0),
        )
        seen = 0
        for out in gen:  # one dict per streamed executor response: the whole sequence so far
            _sync()
            now = clock()
            ids = _row(out, len(prompt_ids))
            new, seen = ids[seen:], len(ids)
            evs = steps.push(new, now - t_last)
            if evs:
                t_last = now
            yield from evs
            if lane.done:
                break
            if cancelled():
                lane.stop_reason = "cancelled"
                break
        if hasattr(gen, "close"):
            gen.close()
        yield RunDone(lane_id, lane.stats(setup, prompt_id, repeat), cancelled=lane.stop_reason == "cancelled")

    def _lane_runner_draft_target(self, prompt_ids, sampling, lane_id, setup, prompt_id, repeat, cancelled, clock):
        """Draft/target over two ModelRunnerCpp engines, one verification per step, all ids known.

        Step 0: the target alone on the prompt (the prefill, one token). Then each step: the draft engine
        generates k ≤ remaining − 1 tokens from the current sequence; the target engine runs on the same sequence
        with `draft_tokens_list=[drafts]` and `max_new_tokens = k + 1` (as run_dtm_ngram.py does); accepted = the
        longest prefix of the drafts the target reproduced; the next target token is the correction/bonus. If the
        runner returned more tokens than a + 1 (it kept decoding after the verification), those are the target's
        own decode iterations: each becomes a "baseline" step, the call's time split evenly among them.
        Token-match acceptance (`use_logits` off): exact for greedy; under sampling it is TensorRT-LLM's
        token-comparison mode, not rejection sampling.
        """
        import torch

        lane = _Lane(self, prompt_ids, sampling, lane_id)
        k_max = self.config.max_draft_len
        eos = min(self.eos_ids) if self.eos_ids else self.pad_id
        seq = list(prompt_ids)
        common = dict(end_id=eos, pad_id=self.pad_id, streaming=False, output_sequence_lengths=True, return_dict=True)
        draft_forwards = 0
        call = 0

        def run(runner, max_new: int, drafts: list[int] | None = None) -> list[int]:
            nonlocal call
            kw = dict(common, **_runner_sampling_kwargs(sampling, call))
            call += 1
            if drafts is not None:
                # an empty draft goes as [end_id], as run_dtm_ngram.py does: a placeholder the target checks like
                # any draft (accepting it means the target emitted EOS, which the lane treats as its own token)
                kw["draft_tokens_list"] = [list(drafts) or [eos]]
            out = runner.generate(batch_input_ids=[torch.tensor(seq, dtype=torch.int32)], max_new_tokens=max_new, **kw)
            _sync()
            return _row(out, len(seq))

        t0 = clock()
        first = run(self.runner, 1, [])
        t1 = clock()
        ev = lane.add(first[:1], 0, 0, kind="baseline", t_verify=t1 - t0, t_wall=t1 - t0)
        seq.extend(ev.emitted_ids)
        yield ev
        while not lane.done:
            if cancelled():
                lane.stop_reason = "cancelled"
                break
            remaining = lane.max_new - len(lane.out)
            k = min(k_max, remaining - 1)
            t0 = clock()
            drafts = run(self.draft_runner, k) if k > 0 else []
            drafts = drafts[:k]
            if drafts:
                draft_forwards += len(drafts)
            t1 = clock()
            target = run(self.runner, len(drafts) + 1, drafts)
            t2 = clock()
            a = 0
            while a < min(len(drafts), len(target)) and drafts[a] == target[a]:
                a += 1
            extra = target[a + 1 :]
            share = (t2 - t1) / (1 + len(extra))
            ev = lane.add(
                target[: a + 1], len(drafts), a, drafted_ids=tuple(drafts), t_draft=t1 - t0, t_verify=share, t_wall=(t1 - t0) + share
            )
            seq.extend(ev.emitted_ids)
            yield ev
            for tok in extra:
                if lane.done:
                    break
                ev = lane.add([tok], 0, 0, kind="baseline", t_verify=share, t_wall=share)
                seq.extend(ev.emitted_ids)
                yield ev
            if not target:  # the runner produced nothing (engine limit reached)
                lane.stop_reason = "engine_limit"
        yield RunDone(
            lane_id, lane.stats(setup, prompt_id, repeat, draft_forwards=draft_forwards), cancelled=lane.stop_reason == "cancelled"
        )


def open_engine(
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
