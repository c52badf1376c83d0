"""Prompts: inline, from JSONL (id, prompt[, category]) or a built-in suite in resources/suites/."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import SetupError, SpecDeckError

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

    Ids must be unique (results are paired with the baseline by prompt id); a line without one gets `p<line>`.

    Raises:
        SetupError: missing file, not UTF-8 (naming the byte offset), a malformed line or a repeated id (naming
            the line numbers).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SetupError(f"cannot read prompts file {path}: {e.strerror}", fix="check the path") from None
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0  # a UTF-8 byte-order mark (some Windows editors write one) is fine
    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = bom + e.start  # byte offset in the file
        line_no = data.count(b"\n", 0, at) + 1
        utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff")
        raise SetupError(
            f"prompts file {path} is not UTF-8: byte 0x{data[at]:02x} at offset {at} (line {line_no}) is not valid UTF-8"
            + (" — the file looks like UTF-16" if utf16 else ""),
            fix="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`, or your editor's \"Save with encoding: UTF-8\")",
        ) from None
    out: list[Prompt] = []
    first_line: dict[str, int] = {}
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines(): JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            prompt = obj["prompt"]
            if not isinstance(prompt, str) or not prompt:
                raise ValueError("prompt must be a non-empty string")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise SetupError(f"{path}:{n}: not a prompt line ({e})", fix='each line must be {"id": "...", "prompt": "...", "category": "..."}') from None
        pid = str(obj.get("id", f"p{n}"))
        if pid in first_line:
            raise SetupError(
                f"{path}: prompt id {pid!r} appears on line {first_line[pid]} and line {n}; ids must be unique (results are paired by id)",
                fix=f"give the prompt on line {n} another id",
            )
        first_line[pid] = n
        out.append(Prompt(pid, prompt, str(obj.get("category", ""))))
    if not out:
        raise SetupError(f"{path} holds no prompts", fix="add JSONL lines with a \"prompt\" key")
    return out


def load_suite(name: str) -> list[Prompt]:
    p = SUITES_DIR / f"{name}.jsonl"
    if not p.is_file():
        raise SpecDeckError(f"unknown suite {name!r}", fix=f"available suites: {', '.join(list_suites())}")
    return load_jsonl(p)
