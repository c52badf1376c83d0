"""Where SpecDeck keeps its files: one cache folder ($XDG_CACHE_HOME/specdeck, default ~/.cache/specdeck) holding the
converted weights, cost profiles and trained heads, and the check that a folder there can be written before work
that needs it starts."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from app.core.errors import SpecDeckError

__all__ = ["cache_root", "writable_dir", "write_json_atomically", "CACHE_FIX"]

CACHE_FIX = "set XDG_CACHE_HOME to a folder you can write to (SpecDeck keeps converted weights, cost profiles and heads in its specdeck/ folder)"


def cache_root() -> Path:
    """$XDG_CACHE_HOME/specdeck (default ~/.cache/specdeck)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specdeck"


def writable_dir(path: Path, what: str, fix: str = CACHE_FIX) -> Path:
    """Make `path` (and its parents) and check a file can be created in it; returns it.

    Raises:
        SpecDeckError: "cannot write <what> in <path>: <reason>" with `fix`.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as e:
        raise SpecDeckError(f"cannot write {what} in {path}: {e.strerror or e}", fix=fix) from None
    return path


def write_json_atomically(path: Path, doc, indent: int | None = None) -> Path | None:
    """Write `doc` as JSON to `path` through a temporary file renamed over it (its folder made); returns the path, or
    None when it cannot be written — for caches, where that is never an error (what was not kept is made again)."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=indent), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        return None
    return path
