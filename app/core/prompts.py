"""Prompts: inline, from JSONL (id, prompt[, category]) or a built-in suite in resources/suites/."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import SpecDeckError

__all__ = ["Prompt", "SUITES_DIR", "list_suites", "load_suite", "load_jsonl"]

SUITES_DIR = Path(__file__).resolve().parents[2] / "resources" / "suites"


@dataclass(frozen=True)
class Prompt:
    id: str
    prompt: str
    category: str = ""


def list_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.jsonl"))


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Read prompts; each line a JSON object with "prompt" and optionally "id" and "category".

    Raises:
        SpecDeckError: missing file or a malformed line (naming the line number).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SpecDeckError(f"cannot read prompts file {path}: {e.strerror}", fix="check the path") from None
    out: list[Prompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            text = obj["prompt"]
            if not isinstance(text, str) or not text:
                raise ValueError("prompt must be a non-empty string")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise SpecDeckError(f"{path}:{n}: not a prompt line ({e})", fix='each line must be {"id": "...", "prompt": "...", "category": "..."}') from None
        out.append(Prompt(str(obj.get("id", f"p{n}")), text, str(obj.get("category", ""))))
    if not out:
        raise SpecDeckError(f"{path} holds no prompts", fix="add JSONL lines with a \"prompt\" key")
    return out


def load_suite(name: str) -> list[Prompt]:
    p = SUITES_DIR / f"{name}.jsonl"
    if not p.is_file():
        raise SpecDeckError(f"unknown suite {name!r}", fix=f"available suites: {', '.join(list_suites())}")
    return load_jsonl(p)
