"""What `python -m app engines` and the GUI's engine picker show: is an engine usable here, and why not."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import EngineError
from app.engines.backends import backend
from app.engines.manifest import WEIGHT_SOURCES, EngineManifest, ManifestProblem
from app.engines.registry import list_manifests, scan_manifests

__all__ = ["EngineStatus", "engine_status", "all_status", "scan_status", "backend_status", "manifest_backend_status", "compatible"]


@dataclass(frozen=True)
class EngineStatus:
    name: str
    backend: str
    description: str
    dtype: str
    device: str
    size_bytes: int | None
    present: bool  # weights (or engine files) are on disk
    cached: bool  # GGUF already converted to the safetensors cache
    usable: bool  # can be loaded here (backend works and weights present)
    reason: str  # why not usable ("" when usable)
    tokenizer: str  # tokenizer family tag from the manifest ("" = unknown)
    where: str  # the manifest file it came from
    steps: bool = False  # our loop drives it (it can draft, verify trees, be profiled: app.engines.backends)
    converts: bool = False  # its weights are converted into the safetensors cache


def backend_status(name: str) -> tuple[bool, str]:
    """(usable, reason) for a backend on this machine, without importing heavy libraries."""
    try:
        return backend(name).usable()
    except EngineError as e:
        return False, e.message


def manifest_backend_status(m: EngineManifest) -> tuple[bool, str]:
    """backend_status, asked in the environment the engine's worker runs in (app.engines.environments): an
    engine whose manifest (or its backend's default, e.g. .venv-trtllm) names another interpreter is checked by
    that interpreter, once per interpreter."""
    from app.engines.environments import foreign_call, worker_python

    try:
        python = worker_python(m)
    except EngineError as e:
        return False, str(e).splitlines()[0]
    if python is None:
        return backend_status(m.backend)
    try:
        answer: Any = foreign_call(python, *backend(m.backend).status.split(":"))
    except EngineError as e:
        return False, str(e).splitlines()[0]
    usable, reason = answer
    return bool(usable), (f"in {python}: {reason}" if reason else "")


def engine_status(m: EngineManifest) -> EngineStatus:
    from app.engines.cache import is_cached, source_paths, weights_present

    ok, why = manifest_backend_status(m)
    b = backend(m.backend)
    dtype = m.dtype
    if m.source_kind in WEIGHT_SOURCES:  # weights on this disk: present, or already converted/joined into the cache
        present, pwhy = weights_present(m)
        cached = is_cached(m) and m.source_kind != "hf_dir"
        usable = present or cached
        reason = "" if usable else pwhy
        if present and not b.converts and m.source_kind != "hf_dir":  # a GGUF run as it is: its own quantisation
            from app.engines.gguf_header import gguf_file_type

            dtype = gguf_file_type(source_paths(m)) or dtype
    else:
        cached, present, usable, reason = False, ok, ok, why
    return EngineStatus(
        name=m.name,
        backend=m.backend,
        description=m.description,
        dtype=dtype,
        device=m.device,
        size_bytes=m.size,
        present=present,
        cached=cached,
        usable=usable and ok,
        reason=reason or why,
        tokenizer=str(m.extra.get("tokenizer", "")),
        where=m.where,
        steps=b.steps,
        converts=b.converts,
    )


def all_status() -> list[EngineStatus]:
    """Every engine's status. Raises EngineError on the first broken manifest (the CLI's `engines` says which)."""
    return [engine_status(m) for m in list_manifests()]


def scan_status() -> tuple[list[EngineStatus], list[ManifestProblem]]:
    """Every loadable engine's status and, beside them, the manifests that could not be read or checked (the
    GUI lists the good ones and shows each problem instead of losing them all to one broken file)."""
    manifests, problems = scan_manifests()
    out: list[EngineStatus] = []
    for m in manifests:
        try:
            out.append(engine_status(m))
        except Exception as e:  # a check that fails for one engine must not hide the others
            err = e if isinstance(e, EngineError) else EngineError(f"engine manifest {m.where}: cannot tell whether it is usable: {e}")
            problems.append(ManifestProblem(m.name, m.path or Path(m.where), err))
    return out, problems


def compatible(target: EngineStatus, draft: EngineStatus) -> bool:
    """Whether `draft` may draft for `target` by the manifests' tokenizer tags (the worker checks the real
    tokenizers before loading the draft's weights). Drafts may come from another backend (hf ↔ llamacpp)."""
    return draft.name != target.name and bool(target.tokenizer) and target.tokenizer == draft.tokenizer and draft.steps
