"""Sessions (what a run is made of: target, setups, prompt, sampling, mode) and the built-in presets.

Plain data, no Qt: saved as JSON ("Save session…") and remembered between launches through QSettings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from app.core.errors import SpecDeckError
from app.core.setups import Sampling

__all__ = ["Session", "PRESETS", "QWEN_PRESET", "SMOL_PRESET", "default_preset_name", "preset", "SESSION_VERSION"]

SESSION_VERSION = 1

_CODE_PROMPT = (
    "Complete this Python function that checks whether a string is a palindrome, ignoring case and "
    "non-alphanumeric characters:\n\ndef is_palindrome(s: str) -> bool:\n"
)


@dataclass(frozen=True)
class Session:
    """Everything needed to repeat a run from the GUI."""

    target: str
    setups: tuple[str, ...]
    prompt: str
    prompt_id: str = "custom"
    chat: bool = True
    mode: str = "interleaved"
    sampling: Sampling = field(default_factory=Sampling)

    def to_json(self) -> dict:
        return {
            "version": SESSION_VERSION,
            "target": self.target,
            "setups": list(self.setups),
            "prompt": self.prompt,
            "prompt_id": self.prompt_id,
            "chat": self.chat,
            "mode": self.mode,
            "sampling": asdict(self.sampling),
        }

    @classmethod
    def from_json(cls, d: dict) -> Session:
        """Raises SpecDeckError on a document that is not a session."""
        try:
            s = d.get("sampling") or {}
            sampling = Sampling(
                temperature=float(s.get("temperature", 0.0)),
                top_p=float(s.get("top_p", 1.0)),
                top_k=int(s.get("top_k", 0)),
                seed=int(s.get("seed", 0)),
                max_new_tokens=int(s.get("max_new_tokens", 96)),
            )
            setups = tuple(str(x) for x in d["setups"])
            if not 1 <= len(setups) <= 4:
                raise ValueError("a session has 1 to 4 setups")
            mode = str(d.get("mode", "interleaved"))
            if mode not in ("sequential", "interleaved"):
                raise ValueError(f"mode must be sequential or interleaved, got {mode!r}")
            return cls(
                target=str(d["target"]),
                setups=setups,
                prompt=str(d["prompt"]),
                prompt_id=str(d.get("prompt_id", "custom")),
                chat=bool(d.get("chat", True)),
                mode=mode,
                sampling=sampling,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SpecDeckError(f"not a SpecDeck session ({e})", fix="open a file saved with “Save session…”") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Session:
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise SpecDeckError(f"cannot read session {path}: {e}", fix="pick a .json file saved by SpecDeck") from None
        if not isinstance(d, dict):
            raise SpecDeckError(f"{path} is not a SpecDeck session", fix="pick a .json file saved by SpecDeck")
        return cls.from_json(d)

    def with_(self, **kw) -> Session:
        return replace(self, **kw)


QWEN_PRESET = "Baseline vs draft model vs n-gram"
SMOL_PRESET = "SmolLM2 quick"

PRESETS: dict[str, Session] = {
    QWEN_PRESET: Session(
        target="qwen2.5-coder-1.5b-instruct",
        setups=("baseline", "draft:qwen2.5-coder-0.5b-instruct,k=24,cstop=0.5,dtype=int8", "ngram"),
        prompt=_CODE_PROMPT,
        prompt_id="code-1",
        sampling=Sampling(max_new_tokens=48),
    ),
    SMOL_PRESET: Session(
        target="smollm2-135m-instruct",
        setups=("baseline", "ngram", "draft:smollm2-135m-instruct,k=4"),
        prompt=_CODE_PROMPT,
        prompt_id="code-1",
        sampling=Sampling(max_new_tokens=64),
    ),
}


def preset(name: str) -> Session:
    """A preset by name (case-insensitive; "qwen" and "smollm2"/"quick" work too).

    Raises:
        SpecDeckError: unknown name, listing the presets.
    """
    key = name.strip().lower()
    for n, s in PRESETS.items():
        if n.lower() == key:
            return s
    aliases = {"qwen": QWEN_PRESET, "default": QWEN_PRESET, "smollm2": SMOL_PRESET, "smol": SMOL_PRESET, "quick": SMOL_PRESET}
    if key in aliases:
        return PRESETS[aliases[key]]
    raise SpecDeckError(f"unknown preset {name!r}", fix="presets: " + "; ".join(PRESETS))


def default_preset_name(usable: set[str]) -> str:
    """The Qwen pair when both of its engines are usable here, else the SmolLM2 preset."""
    if {"qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"} <= usable:
        return QWEN_PRESET
    return SMOL_PRESET
