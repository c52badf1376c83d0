"""Backends: each engine family (`backend = "…"` in a manifest) declared once — how it reads its part of a manifest,
whether it can run on this machine, how it opens an engine and reads a tokenizer without weights, and what our
code may do with it. Callers ask :func:`backend` instead of testing backend names.

A backend is one engine module plus one :data:`BACKENDS` entry. The declaration stays light: reading manifests and
asking whether a backend is usable import no torch, llama.cpp or TensorRT-LLM (`python -m app engines` stays fast);
`engine` and `tokenizer` name "module:attribute" and are imported when a lane first needs them.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.errors import EngineError
from app.engines.manifest import WEIGHT_SOURCES, EngineManifest, Key, read_table

__all__ = ["Backend", "BACKENDS", "backend", "weights_source", "llamacpp_keys", "LLAMACPP_INSTALL_HINT", "LLAMACPP_MAX_CTX"]

#: (task, done, total, unit): how engines report conversion and loading
ProgressFn = Callable[[str, float, float, str], None]


@dataclass(frozen=True)
class Backend:
    """One engine family.

    Attributes:
        name: the manifest's `backend` value.
        read: `(manifest table, file) -> EngineManifest fields` (source_kind, source, size, sha256, extra, and any
            dtype/device defaults): the backend's part of a manifest, validated. Light.
        status: "module:callable" — `() -> (usable, why not)` on this machine, without importing the backend's
            library (a light function: it may also be called in the interpreter of another environment).
        engine: "module:callable" — `(manifest, device, dtype, progress, tokenizer) -> engine`.
        tokenizer: "module:callable" — `(manifest, progress, lookup) -> tokenizer` without loading weights
            (`lookup(name)` gives another engine's, for servers that borrow a local one); "" when it has none.
        tables: the top-level manifest tables this backend owns (`[llamacpp]`, `[openai]`, …).
        borrows_tokenizer: its engines use a local engine's tokenizer, read before opening (servers).
        steps: our loop drives its forwards one step at a time: it can draft, verify trees, be profiled.
        hidden: its engines give the hidden state behind each token (ReDrafter heads are trained on them).
        converts: its weights are converted once into the safetensors cache (`python -m app convert`).
        python_env: the environment variable naming the interpreter its workers run in by default ("" = ours).
        python_venv: else this virtual environment of the checkout, when it exists (made by `make <name>-env`).
    """

    name: str
    read: Callable[[Mapping[str, Any], str], dict]
    status: str
    engine: str
    tokenizer: str = ""
    tables: tuple[str, ...] = ()
    borrows_tokenizer: bool = False
    steps: bool = False
    hidden: bool = False
    converts: bool = False
    python_env: str = ""
    python_venv: str = ""

    def usable(self) -> tuple[bool, str]:
        """(usable here, why not) — asked in this interpreter."""
        return _attr(self.status)()

    def open(self, manifest: EngineManifest, device: str | None, dtype: str | None, progress: ProgressFn, tokenizer: Any = None) -> Any:
        """Load `manifest`'s engine (imports the backend's library here, not before)."""
        return _attr(self.engine)(manifest, device=device, dtype=dtype, progress=progress, tokenizer=tokenizer)

    def load_tokenizer(self, manifest: EngineManifest, progress: ProgressFn, lookup: Callable[[str], Any]) -> Any:
        """The engine's tokenizer without its weights, or None when the backend has no local tokenizer."""
        return _attr(self.tokenizer)(manifest, progress, lookup) if self.tokenizer else None


def _attr(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def weights_source(data: Mapping[str, Any], where: str, kinds: tuple[str, ...] = WEIGHT_SOURCES, backend: str = "hf") -> dict:
    """The `[source]` of a manifest whose weights are on disk: exactly one of `kinds`, plus `size` and `sha256`."""
    keys = [Key("hf_dir"), Key("gguf"), Key("gguf_parts", list), Key("size", int, min=1, what="bytes of the whole GGUF"),
            Key("sha256", str, check=lambda v: None if len(v) == 64 and all(c in "0123456789abcdef" for c in v.lower()) else "must be 64 hex digits")]
    if "source" not in data:
        raise EngineError(f"engine manifest {where}: missing [source] table", fix=f"add a [source] table with one of {', '.join(kinds)}")
    src = read_table(data["source"], keys, where, "[source]")
    given = [k for k in WEIGHT_SOURCES if src[k] is not None]
    if len(given) != 1 or given[0] not in kinds:
        what = f"backend = \"{backend}\" runs a GGUF as it is: " if backend == "llamacpp" else ""
        raise EngineError(f"engine manifest {where}: {what}[source] needs exactly one of {', '.join(kinds)} (found: {', '.join(given) or 'none'})",
                          fix=f"edit {where}")
    kind = given[0]
    if kind == "gguf_parts":
        parts = src[kind]
        if not parts or not all(isinstance(x, str) and x for x in parts):
            raise EngineError(f"engine manifest {where}: gguf_parts must be a non-empty list of paths", fix=f"edit {where}")
        source = tuple(parts)
    else:
        source = (src[kind],)
    return {"source_kind": kind, "source": source, "size": src["size"], "sha256": src["sha256"].lower() if src["sha256"] else None}


def _hf_read(data: Mapping[str, Any], where: str) -> dict:
    return weights_source(data, where)


def always_usable() -> tuple[bool, str]:
    """Backends with nothing to install (transformers is a dependency; a server is asked when a lane loads it)."""
    return True, ""


#: how to get llama.cpp's Python bindings (`make` builds them on its own llama.cpp build)
LLAMACPP_INSTALL_HINT = "pip install llama-cpp-python==0.3.36 (compiles llama.cpp with cmake: a few minutes; `make` does it)"
#: the most positions a llama.cpp context may be asked for in a manifest (the engine also caps it by the model's own)
LLAMACPP_MAX_CTX = 1 << 20
LLAMACPP_MAX_BATCH = 8192


def llamacpp_keys() -> list[Key]:
    """The `[llamacpp]` table: positions, threads and batch, each bounded by what llama.cpp and this machine allow."""
    import os

    cpus = os.cpu_count() or 1
    return [Key("n_ctx", int, min=16, max=LLAMACPP_MAX_CTX, what="positions of a lane's context; at most the model's trained context"),
            Key("n_threads", int, min=1, max=cpus, what=f"CPU threads; this machine has {cpus}"),
            Key("n_batch", int, min=1, max=LLAMACPP_MAX_BATCH, what="tokens per llama_decode call")]


def _llamacpp_read(data: Mapping[str, Any], where: str) -> dict:
    out = weights_source(data, where, ("gguf", "gguf_parts"), backend="llamacpp")
    table = read_table(data.get("llamacpp"), llamacpp_keys(), where, "[llamacpp]")
    return {**out, "extra": {"llamacpp": {k: v for k, v in table.items() if v is not None}}}


def llamacpp_status() -> tuple[bool, str]:
    """llama.cpp's Python bindings are installed (found without importing them)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return False, f"llama-cpp-python not installed: {LLAMACPP_INSTALL_HINT}"
    return True, ""


def _openai_read(data: Mapping[str, Any], where: str) -> dict:
    from app.engines.openai_api import RemoteConfig

    if "source" in data:
        raise EngineError(f"engine manifest {where}: a backend = \"openai\" engine has no [source]: the server holds the weights",
                          fix="remove [source]; put base_url and model in [openai]")
    cfg = RemoteConfig.from_table(data.get("openai"), where)
    return {"source_kind": "openai", "source": (cfg.base_url,), "dtype": "auto", "device": "auto", "extra": {"openai": data.get("openai")}}


def _trtllm_read(data: Mapping[str, Any], where: str) -> dict:
    from app.engines.trtllm.config import read_trtllm_source

    return read_trtllm_source(data, where)


#: every backend, by the name manifests give; a new one is its engine module plus one entry here
BACKENDS: dict[str, Backend] = {
    "hf": Backend("hf", _hf_read, "app.engines.backends:always_usable", "app.engines.hf:HFEngine", "app.engines.hf:tokenizer_only", steps=True, hidden=True,
                  converts=True),
    "llamacpp": Backend("llamacpp", _llamacpp_read, "app.engines.backends:llamacpp_status", "app.engines.llamacpp:LlamaCppEngine", "app.engines.llamacpp:tokenizer_only",
                        tables=("llamacpp",), steps=True),
    "openai": Backend("openai", _openai_read, "app.engines.backends:always_usable", "app.engines.openai_api:RemoteEngine", "app.engines.openai_api:tokenizer_only",
                      tables=("openai",), borrows_tokenizer=True),
    "trtllm": Backend("trtllm", _trtllm_read, "app.engines.trtllm.capability:capability", "app.engines.trtllm:load_engine", tables=("trtllm",),
                      python_env="SPECDECK_TRTLLM_PYTHON", python_venv=".venv-trtllm"),
}


def backend(name: str, where: str = "") -> Backend:
    """The backend called `name`.

    Raises:
        EngineError: no such backend (naming the ones there are, and the manifest when given).
    """
    b = BACKENDS.get(name)
    if b is None:
        raise EngineError(f"engine manifest {where}: backend must be one of {', '.join(BACKENDS)}, got {name!r}" if where
                          else f"unknown backend {name!r} (one of {', '.join(BACKENDS)})", fix=f"edit {where}" if where else None)
    return b
