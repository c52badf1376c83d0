"""The `[trtllm]` manifest table and the TensorRT-LLM objects built from it (no ``tensorrt_llm`` import here: the
library module is passed in, the real one or the tests' fake).

API facts relied on (TensorRT-LLM 1.2.0, read in its 1.2.0 docs snapshot's source pages; nothing copied):
* `llmapi/llm_args.py`: `DraftTargetDecodingConfig / NGramDecodingConfig / EagleDecodingConfig /
  MTPDecodingConfig` (pydantic, extra fields forbidden). 1.2.0 has no `Eagle3DecodingConfig`: EAGLE-3 is
  `EagleDecodingConfig(eagle3_one_model=...)` (later releases add the Eagle3 name; we take whichever exists).
  The draft-model field is `speculative_model` (alias `speculative_model_dir`). Every decoding config inherits
  `allow_advanced_sampling = False`: the one-model paths (EAGLE-3 one-model, MTP) decode greedily whatever the
  SamplingParams unless it is True. `MTPDecodingConfig` overwrites `max_draft_len` with
  `num_nextn_predict_layers` (its __init__ and TorchLlmArgs' validator), so the k TensorRT-LLM uses is read
  back from `llm.args.speculative_config` after loading. NGram's `max_matching_ngram_size` defaults to 0, which
  the LLM's validator refuses: we always pass it.
* `llmapi/llm.py`: `LLM(...)` raises `ValueError("LLM got invalid argument: <key>")` on a keyword that is not
  an LLM arg: `llm_args` goes verbatim, and a wrong key fails at load with the library's message.
* `executor/result.py`: `.outputs[0].request_perf_metrics.speculative_decoding.{acceptance_rate,
  total_accepted_draft_tokens,total_draft_tokens}` with `SamplingParams(return_perf_metrics=True)`. On 1.2.x
  with the PyTorch backend's default TorchSampler these stay 0 (filled from PR #17082, July 2026): zeros mean
  "not reported", and the lane infers the counts from the streamed updates instead (LaneStats.counts_source).
* `runtime/model_runner_cpp.py`: `generate` turns top_p 0.0 into None, the C++ default top-p is 0.0, and the
  sampling kernels treat top_k 0 with top_p 0 as greedy (k = 1): "top-p off" must be sent as 1.0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import EngineError
from app.core.setups import Sampling
from app.engines.manifest import EngineManifest, Key, read_table
from app.engines.trtllm.capability import INSTALL_HINT

__all__ = [
    "LLM_DECODINGS",
    "RUNNER_MODES",
    "TRTLLMConfig",
    "parse_config",
    "read_trtllm_source",
    "build_speculative_config",
    "make_sampling_params",
    "runner_sampling_kwargs",
    "perf_counts",
]

LLM_DECODINGS = ("none", "draft_target", "ngram", "eagle3", "mtp")
RUNNER_MODES = ("draft_target", "redrafter", "medusa")

# ---------------------------------------------------------------------------------------------------
# manifest [trtllm] table
# ---------------------------------------------------------------------------------------------------

def _device_ids(v: list) -> str | None:
    return None if v and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v) else "must be a non-empty list of GPU indices"


def _medusa(v: list) -> str | None:
    ok = v and all(isinstance(c, list) and c and all(isinstance(i, int) for i in c) for c in v)
    return None if ok else "must be a list of non-empty integer lists, e.g. [[0], [0, 0], [1], [0, 1]]"


_COMMON = [Key("api", choices=("llm", "runner")), Key("tokenizer_dir"), Key("max_draft_len", int, min=0),
           Key("device_ids", list, default=[0], check=_device_ids),
           Key("kv_cache_free_gpu_memory_fraction", float, above=0, max=1)]
_LLM = [*_COMMON, Key("decoding", default="none", choices=LLM_DECODINGS), Key("speculative_model"),
        Key("max_matching_ngram_size", int, default=4, min=1), Key("eagle3_one_model", bool, default=True),
        Key("num_nextn_predict_layers", int, default=1, min=1), Key("allow_advanced_sampling", bool, default=False),
        Key("llm_args", dict, default={}, what="a table of LLM(...) keyword arguments")]
_RUNNER = [*_COMMON, Key("mode", required=True, choices=RUNNER_MODES), Key("draft_engine_dir"), Key("medusa_choices", list, check=_medusa)]


def read_trtllm_source(data: Mapping[str, Any], where: str) -> dict:
    """The `[source]` of a trtllm manifest (`model` for the LLM API, `engine_dir` for built engines) as
    EngineManifest fields; the `[trtllm]` table itself is checked when the engine loads (:func:`parse_config`)."""
    src = read_table(data.get("source"), [Key("model"), Key("engine_dir"), Key("size", int), Key("sha256")], where, "[source]")
    given = {k: src[k] for k in ("model", "engine_dir") if src[k] is not None}
    if not given:
        raise EngineError(f"engine manifest {where}: [source] needs model (HF id/folder for the LLM API) or engine_dir (built TensorRT engine)",
                          fix=f"edit {where}")
    extra = {k: data[k] for k in ("trtllm",) if k in data}
    return {"source_kind": "trtllm", "source": tuple(given.values()), "extra": {**extra, **given}}


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
        allow_advanced_sampling: let the one-model paths (EAGLE-3 one-model, MTP) sample (TensorRT-LLM's
            prototype switch; without it they decode greedily whatever the sampling settings).
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
    allow_advanced_sampling: bool = False
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

    @property
    def greedy_only(self) -> bool:
        """True when TensorRT-LLM decodes this engine greedily whatever the sampling settings: the one-model
        paths (EAGLE-3 with eagle3_one_model, MTP) without allow_advanced_sampling."""
        one_model = self.kind == "mtp" or (self.kind == "eagle3" and self.eagle3_one_model)
        return self.api == "llm" and one_model and not self.allow_advanced_sampling


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
    fix = f"edit the [trtllm] table of {where} (see README, TensorRT-LLM)"

    def bad(why: str) -> EngineError:
        return EngineError(f"engine manifest {where}: {why}", fix=fix)

    t = manifest.extra.get("trtllm", {}) or {}
    if not isinstance(t, dict):
        raise bad("[trtllm] must be a table")
    model, engine_dir = manifest.extra.get("model"), manifest.extra.get("engine_dir")
    api = t.get("api", "runner" if engine_dir and not model else "llm")
    if api not in ("llm", "runner"):
        raise bad(f"api must be 'llm' or 'runner', got {api!r}")
    v = read_table(t, _LLM if api == "llm" else _RUNNER, where, "[trtllm]", fix=fix)
    tok = v["tokenizer_dir"]
    common = dict(tokenizer_dir=_local_path(tok, manifest) if tok else None, device_ids=tuple(v["device_ids"]),
                  kv_cache_free_gpu_memory_fraction=v["kv_cache_free_gpu_memory_fraction"])
    return _llm_config(v, model, manifest, bad, common) if api == "llm" else _runner_config(v, engine_dir, manifest, bad, common)


def _llm_config(v: dict, model: str | None, manifest: EngineManifest, bad: Callable[[str], EngineError], common: dict) -> TRTLLMConfig:
    """The LLM API's config: the decoding method's own requirements on top of the table's keys."""
    if not model:
        raise bad("api = 'llm' needs [source] model = \"<HF id or folder>\"")
    kind = v["decoding"]
    k = v["max_draft_len"] if v["max_draft_len"] is not None else (0 if kind in ("none", "mtp") else None)
    if kind in ("draft_target", "ngram", "eagle3") and not k:
        raise bad(f"decoding = {kind!r} needs max_draft_len >= 1")
    spec_model = v["speculative_model"]
    if kind in ("draft_target", "eagle3") and not spec_model:
        raise bad(f"decoding = {kind!r} needs speculative_model (HF id or folder of the {'draft model' if kind == 'draft_target' else 'EAGLE-3 head'})")
    if kind == "mtp" and not k:
        k = v["num_nextn_predict_layers"]  # MTP drafts one token per module
    return TRTLLMConfig(api="llm", kind=kind, model=_local_path(model, manifest), max_draft_len=k or 0,
                        speculative_model=_local_path(spec_model, manifest) if spec_model else None,
                        max_matching_ngram_size=v["max_matching_ngram_size"], eagle3_one_model=v["eagle3_one_model"],
                        num_nextn_predict_layers=v["num_nextn_predict_layers"], allow_advanced_sampling=v["allow_advanced_sampling"],
                        llm_args=dict(v["llm_args"]), **common)


def _runner_config(v: dict, engine_dir: str | None, manifest: EngineManifest, bad: Callable[[str], EngineError], common: dict) -> TRTLLMConfig:
    """Built engines driven by ModelRunnerCpp: what each mode needs on top of the table's keys."""
    if not engine_dir:
        raise bad("api = 'runner' needs [source] engine_dir = \"<folder built by trtllm-build>\"")
    kind = v["mode"]
    if not common["tokenizer_dir"]:
        raise bad("api = 'runner' needs tokenizer_dir (the HF folder of the target: engines hold no tokenizer)")
    choices: list[list[int]] = v["medusa_choices"] or []
    if kind == "medusa" and not choices:
        raise bad("mode = 'medusa' needs medusa_choices, a list of non-empty integer lists, e.g. [[0], [0, 0], [1], [0, 1]]")
    # Medusa drafts along its tree: at most the depth of the deepest choice per step
    k = v["max_draft_len"] if v["max_draft_len"] is not None else (max(len(c) for c in choices) if kind == "medusa" else None)
    if not k:
        what = {"draft_target": "tokens the draft engine proposes per step", "redrafter": "redrafter_draft_len_per_beam",
                "medusa": "the depth of the Medusa tree"}[kind]
        raise bad(f"mode = {kind!r} needs max_draft_len >= 1 ({what})")
    draft_dir = v["draft_engine_dir"]
    if kind == "draft_target" and not draft_dir:
        raise bad("mode = 'draft_target' needs draft_engine_dir (the draft model's engine folder)")
    if kind == "draft_target" and common["kv_cache_free_gpu_memory_fraction"] is None:
        common["kv_cache_free_gpu_memory_fraction"] = 0.4  # two engines on one GPU (examples/draft_target_model)
    return TRTLLMConfig(api="runner", kind=kind, engine_dir=_local_path(engine_dir, manifest), max_draft_len=k,
                        draft_engine_dir=_local_path(draft_dir, manifest) if draft_dir else None,
                        medusa_choices=tuple(tuple(c) for c in choices) if kind == "medusa" else None, **common)


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

    def advanced(c, kw: dict) -> dict:
        """allow_advanced_sampling, when set (a field of every decoding config since 1.2: DecodingBaseConfig)."""
        if cfg.allow_advanced_sampling:
            declared = _declared_fields(c)
            if declared is not None and "allow_advanced_sampling" not in declared:
                raise EngineError(
                    "this TensorRT-LLM has no allow_advanced_sampling on its decoding configs",
                    fix="remove allow_advanced_sampling from the manifest (the lane then decodes greedily), or upgrade TensorRT-LLM",
                )
            kw["allow_advanced_sampling"] = True
        return kw

    if cfg.kind == "draft_target":
        c = cls("DraftTargetDecodingConfig")
        return c(**advanced(c, {"max_draft_len": cfg.max_draft_len, _model_field(c): cfg.speculative_model}))
    if cfg.kind == "ngram":
        c = cls("NGramDecodingConfig")
        # is_keep_all / is_use_oldest / is_public_pool keep their documented defaults
        return c(**advanced(c, {"max_draft_len": cfg.max_draft_len, "max_matching_ngram_size": cfg.max_matching_ngram_size}))
    if cfg.kind == "eagle3":
        # 1.2.0 has EagleDecodingConfig only (EAGLE-3 through eagle3_one_model); later releases add Eagle3DecodingConfig
        c = cls("Eagle3DecodingConfig", "EagleDecodingConfig")
        kw = {"max_draft_len": cfg.max_draft_len, _model_field(c): cfg.speculative_model}
        declared = _declared_fields(c)
        if declared is None or "eagle3_one_model" in declared:
            kw["eagle3_one_model"] = cfg.eagle3_one_model
        return c(**advanced(c, kw))
    if cfg.kind == "mtp":
        c = cls("MTPDecodingConfig")
        # no max_draft_len: TensorRT-LLM sets it to num_nextn_predict_layers (the engine reads k back after loading)
        return c(**advanced(c, {"num_nextn_predict_layers": cfg.num_nextn_predict_layers}))
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


def runner_sampling_kwargs(sampling: Sampling, call: int) -> dict:
    """ModelRunnerCpp.generate sampling kwargs.

    Greedy: top_k 1. Sampling: top-p "off" is sent as 1.0, never 0.0 — generate() turns 0.0 into None, the C++
    default is 0.0, and top_k 0 with top_p 0 makes the sampling kernels greedy (k = 1).
    `call` offsets the seed so successive generate calls of one lane do not replay the same random stream.
    """
    if sampling.greedy:
        return {"temperature": 1.0, "top_k": 1, "top_p": 1.0, "random_seed": sampling.seed}
    return {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,  # 0 = no top-k limit
        "top_p": min(1.0, sampling.top_p),
        "random_seed": sampling.seed + call,
    }


def perf_counts(result) -> tuple[int, int] | None:
    """(total_draft_tokens, total_accepted_draft_tokens) of a finished request, when its perf metrics have them.

    None when absent or zero: TensorRT-LLM 1.2.x leaves them zeroed on the PyTorch backend's default sampler, so
    zero drafted tokens means "not reported", never "nothing was drafted"."""
    try:
        out = result.outputs[0]
        sd = out.request_perf_metrics.speculative_decoding
        drafted, accepted = int(sd.total_draft_tokens), int(sd.total_accepted_draft_tokens)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    if drafted <= 0:
        return None
    return drafted, accepted
