"""Where SpecDeck keeps its files: one cache folder ($XDG_CACHE_HOME/specdeck, default ~/.cache/specdeck) holding the
converted weights, cost profiles and trained heads, and the check that a folder there can be written before work
that needs it starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from app.core.errors import SpecDeckError

__all__ = ["cache_root", "writable_dir", "CACHE_FIX"]

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
