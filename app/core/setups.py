"""Setup strings: what a lane does, parsed from the CLI, saved sessions and the GUI.

Grammar (see DESIGN.md)::

    baseline
    draft:<engine>[,k=4][,schedule=constant|heuristic][,stop=P][,cstop=P][,dtype=D]
    ngram[:n=3,k=8]
    hf-assisted:<engine>[,k=N][,dtype=D]
    hf-lookup[:k=10]
    trtllm:<engine>
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.core.errors import SetupError

__all__ = [
    "GRAMMAR",
    "DRAFT_DTYPES",
    "Setup",
    "Baseline",
    "DraftModel",
    "NGram",
    "HFAssisted",
    "HFLookup",
    "TRTLLM",
    "parse_setup",
    "Sampling",
]

GRAMMAR = (
    "setup grammar:\n"
    "  baseline\n"
    "  draft:<engine>[,k=4][,schedule=constant|heuristic][,stop=P][,cstop=P][,dtype=D]\n"
    "  ngram[:n=3,k=8]\n"
    "  hf-assisted:<engine>[,k=N][,dtype=D]\n"
    "  (D, the draft's precision: float32 | bfloat16 | float16 | int8 (CPU); default: the target's)\n"
    "  hf-lookup[:k=10]\n"
    "  trtllm:<engine>          (a TensorRT-LLM engine with the speculative config of its manifest)"
)


@dataclass(frozen=True)
class Baseline:
    """The target alone, one token per step."""

    @property
    def label(self) -> str:
        return "baseline"

    @property
    def draft_engine(self) -> str | None:
        return None

    @property
    def draft_dtype(self) -> str | None:
        return None


@dataclass(frozen=True)
class DraftModel:
    """A small draft model proposes up to k tokens per step.

    stop: confidence stop — drafting ends early after a token whose draft probability is below `stop`
    (0 = off; transformers' assisted generation uses 0.4 by default).
    cstop: cumulative confidence stop — drafting ends once the draft's probability of the whole proposal (the
    product of its token probabilities, its own estimate that every draft is accepted) falls below `cstop`, so
    confident runs draft long and uncertain ones short (0 = off).
    dtype: the draft's precision (None: the target's). It never changes what is emitted, only acceptance and cost.
    """

    engine: str
    k: int = 4
    schedule: Literal["constant", "heuristic"] = "constant"
    stop: float = 0.0
    dtype: str | None = None
    cstop: float = 0.0

    @property
    def label(self) -> str:
        s = f"draft:{self.engine},k={self.k}"
        s += ",schedule=heuristic" if self.schedule == "heuristic" else ""
        s += f",stop={self.stop:g}" if self.stop else ""
        s += f",cstop={self.cstop:g}" if self.cstop else ""
        return s + (f",dtype={self.dtype}" if self.dtype else "")

    @property
    def draft_engine(self) -> str | None:
        return self.engine

    @property
    def draft_dtype(self) -> str | None:
        return self.dtype


@dataclass(frozen=True)
class NGram:
    """Prompt lookup: match the last n tokens earlier in prompt + output, propose what followed (up to k)."""

    n: int = 3
    k: int = 8

    @property
    def label(self) -> str:
        return f"ngram:n={self.n},k={self.k}"

    @property
    def draft_engine(self) -> str | None:
        return None

    @property
    def draft_dtype(self) -> str | None:
        return None


@dataclass(frozen=True)
class HFAssisted:
    """Reference lane: transformers' `generate(assistant_model=...)`; tokens only."""

    engine: str
    k: int | None = None  # None: transformers' own defaults (num_assistant_tokens, confidence threshold)
    dtype: str | None = None  # the assistant's precision (None: the target's)

    @property
    def label(self) -> str:
        return f"hf-assisted:{self.engine}" + (f",k={self.k}" if self.k is not None else "") + (f",dtype={self.dtype}" if self.dtype else "")

    @property
    def draft_engine(self) -> str | None:
        return self.engine

    @property
    def draft_dtype(self) -> str | None:
        return self.dtype


@dataclass(frozen=True)
class HFLookup:
    """Reference lane: transformers' `generate(prompt_lookup_num_tokens=k)`; tokens only."""

    k: int = 10

    @property
    def label(self) -> str:
        return f"hf-lookup:k={self.k}"

    @property
    def draft_engine(self) -> str | None:
        return None

    @property
    def draft_dtype(self) -> str | None:
        return None


@dataclass(frozen=True)
class TRTLLM:
    """A TensorRT-LLM lane: the engine's manifest holds the target and its speculative config."""

    engine: str

    @property
    def label(self) -> str:
        return f"trtllm:{self.engine}"

    @property
    def draft_engine(self) -> str | None:
        return None

    @property
    def draft_dtype(self) -> str | None:
        return None


DRAFT_DTYPES = ("float32", "bfloat16", "float16", "int8")

Setup = Baseline | DraftModel | NGram | HFAssisted | HFLookup | TRTLLM


def _bad(text: str, why: str) -> SetupError:
    return SetupError(f"bad setup {text!r}: {why}", fix=GRAMMAR)


def _int_param(text: str, key: str, value: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise _bad(text, f"{key} must be an integer, got {value!r}") from None
    if v <= 0:
        raise _bad(text, f"{key} must be > 0, got {v}")
    return v


def _params(text: str, parts: list[str], allowed: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in parts:
        p = p.strip()
        if not p:
            raise _bad(text, "empty parameter")
        if "=" not in p:
            raise _bad(text, f"parameter {p!r} is not key=value")
        key, value = (s.strip() for s in p.split("=", 1))
        if key not in allowed:
            raise _bad(text, f"unknown parameter {key!r} (allowed: {', '.join(allowed) or 'none'})")
        if key in out:
            raise _bad(text, f"parameter {key!r} given twice")
        out[key] = value
    return out


def parse_setup(text: str) -> Setup:
    """Parse a setup string.

    Raises:
        SetupError: malformed string or out-of-range value; the message carries the grammar.
    """
    s = text.strip()
    if not s:
        raise _bad(text, "empty")
    method, _, rest = s.partition(":")
    method = method.strip().lower()
    if method == "baseline":
        if rest.strip():
            raise _bad(text, "baseline takes no parameters")
        return Baseline()
    if method in ("draft", "hf-assisted"):
        parts = rest.split(",")
        engine = parts[0].strip()
        if not engine or "=" in engine:
            raise _bad(text, f"{method} needs an engine name first, e.g. {method}:qwen2.5-coder-0.5b-instruct")
        allowed = {"k": "int", "schedule": "str", "stop": "float", "cstop": "float", "dtype": "str"} if method == "draft" else {"k": "int", "dtype": "str"}
        kv = _params(text, parts[1:], allowed)
        dtype = kv.get("dtype")
        if dtype is not None and dtype not in DRAFT_DTYPES:
            raise _bad(text, f"dtype must be one of {', '.join(DRAFT_DTYPES)}, got {dtype!r}")
        if method == "hf-assisted":
            return HFAssisted(engine=engine, k=_int_param(text, "k", kv["k"]) if "k" in kv else None, dtype=dtype)
        k = _int_param(text, "k", kv["k"]) if "k" in kv else 4
        schedule = kv.get("schedule", "constant")
        if schedule not in ("constant", "heuristic"):
            raise _bad(text, f"schedule must be constant or heuristic, got {schedule!r}")
        stops = {}
        for key in ("stop", "cstop"):
            if key in kv:
                try:
                    stops[key] = float(kv[key])
                except ValueError:
                    raise _bad(text, f"{key} must be a number, got {kv[key]!r}") from None
                if not 0.0 <= stops[key] < 1.0:
                    raise _bad(text, f"{key} must be in [0, 1), got {stops[key]}")
        return DraftModel(engine=engine, k=k, schedule=schedule, dtype=dtype, **stops)  # type: ignore[arg-type]
    if method == "ngram":
        kv = _params(text, rest.split(",") if rest.strip() else [], {"n": "int", "k": "int"})
        return NGram(
            n=_int_param(text, "n", kv["n"]) if "n" in kv else 3,
            k=_int_param(text, "k", kv["k"]) if "k" in kv else 8,
        )
    if method == "hf-lookup":
        kv = _params(text, rest.split(",") if rest.strip() else [], {"k": "int"})
        return HFLookup(k=_int_param(text, "k", kv["k"]) if "k" in kv else 10)
    if method == "trtllm":
        engine = rest.strip()
        if not engine or "," in engine or "=" in engine:
            raise _bad(text, "trtllm needs exactly one engine name, e.g. trtllm:llama-3.1-8b-eagle3")
        return TRTLLM(engine)
    raise _bad(text, f"unknown method {method!r}")


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters shared by every lane of a run. temperature 0 = greedy.

    Raises (from `validated`):
        SetupError: temperature < 0, top_p outside (0, 1], top_k < 0, max_new_tokens < 1.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_new_tokens: int = 96

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validated(self) -> Sampling:
        if not (self.temperature >= 0.0):
            raise SetupError(f"temperature must be >= 0, got {self.temperature}", fix="use 0 for greedy or e.g. 0.7")
        if not (0.0 < self.top_p <= 1.0):
            raise SetupError(f"top-p must be in (0, 1], got {self.top_p}", fix="use e.g. 0.9, or 1 to disable")
        if self.top_k < 0:
            raise SetupError(f"top-k must be >= 0, got {self.top_k}", fix="use 0 to disable")
        if self.max_new_tokens < 1:
            raise SetupError(f"max new tokens must be >= 1, got {self.max_new_tokens}", fix="use e.g. 96")
        return self
