"""Sessions (what a run is made of: target, setups, prompt, sampling, mode) and the built-in presets.

Plain data, no Qt: saved as JSON ("Save session…") and remembered between launches through QSettings.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from app.core.errors import SpecDeckError
from app.core.setups import Sampling, parse_setup
from app.worker.messages import MODES  # app.worker.messages.Mode: app.worker.scheduler.schedule

__all__ = [
    "Session",
    "UnusableSession",
    "PRESETS",
    "QWEN_PRESET",
    "QWEN_TORCH_PRESET",
    "SMOL_PRESET",
    "default_preset_name",
    "preset",
    "SESSION_VERSION",
    "SAMPLING_RANGES",
    "MAX_SETUPS",
    "MODES",
]

SESSION_VERSION = 1
MAX_SETUPS = 4

#: (lowest, highest) of each sampling field: the window's spin boxes take these ranges, and a session outside
#: them is refused on load (an int field takes whole numbers only)
SAMPLING_RANGES: dict[str, tuple[float, float] | tuple[int, int]] = {
    "temperature": (0.0, 5.0),
    "top_p": (0.01, 1.0),
    "top_k": (0, 100_000),
    "seed": (0, 2**31 - 1),
    "max_new_tokens": (1, 100_000),
}


def _show(v) -> str:
    """A value as the message shows it (long text cut)."""
    r = repr(v) if not isinstance(v, float) else format(v, "g")
    return r if len(r) <= 60 else r[:57] + "…"


def _check_number(name: str, v, lo, hi):
    """`v` as the field's type when it is a number in [lo, hi] (an int field takes a whole float such as 64.0).

    Raises:
        ValueError: naming the field, its range and the value.
    """
    integer = isinstance(lo, int)
    what = f"{name} must be {'a whole number' if integer else 'a number'} from {lo:g} to {hi:g}, got {_show(v)}"
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(what)
    if isinstance(v, float) and (not math.isfinite(v) or (integer and not v.is_integer())):
        raise ValueError(what)
    if not lo <= v <= hi:
        raise ValueError(what)
    return int(v) if integer else float(v)

_CODE_PROMPT = (
    "Complete this Python function that checks whether a string is a palindrome, ignoring case and "
    "non-alphanumeric characters:\n\ndef is_palindrome(s: str) -> bool:\n"
)


class UnusableSession(SpecDeckError):
    """A session the window cannot take (:meth:`Session.validated`); `reason` is what is wrong, without the heading."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"not a usable SpecDeck session: {reason}", fix="open a file saved with “Save session…”")


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

    def validated(self) -> Session:
        """This session when the GUI can show it exactly: types, 1–4 setups that parse, a known mode, and sampling
        inside the ranges of the window's fields (:data:`SAMPLING_RANGES`).

        Raises:
            SpecDeckError: naming the first bad field and its value.
        """
        try:
            for name in ("target", "prompt", "prompt_id"):
                if not isinstance(getattr(self, name), str):
                    raise ValueError(f"{name} must be text, got {_show(getattr(self, name))}")
            if not isinstance(self.chat, bool):
                raise ValueError(f"chat must be true or false, got {_show(self.chat)}")
            if self.mode not in MODES:
                raise ValueError(f"mode must be {' or '.join(MODES)}, got {_show(self.mode)}")
            if not isinstance(self.setups, tuple) or not 1 <= len(self.setups) <= MAX_SETUPS:
                raise ValueError(f"a session has 1 to {MAX_SETUPS} setups, got {len(self.setups) if isinstance(self.setups, tuple) else _show(self.setups)}")
            for i, x in enumerate(self.setups):
                if not isinstance(x, str):
                    raise ValueError(f"setup {i + 1} must be a setup string, got {_show(x)}")
                try:
                    parse_setup(x)
                except SpecDeckError as e:
                    raise ValueError(f"setup {i + 1} ({x!r}): {e.message}") from None
            if not isinstance(self.sampling, Sampling):
                raise ValueError(f"sampling must be a table of settings, got {_show(self.sampling)}")
            for name, (lo, hi) in SAMPLING_RANGES.items():
                _check_number(f"sampling.{name}", getattr(self.sampling, name), lo, hi)
            try:
                self.sampling.validated()
            except SpecDeckError as e:
                raise ValueError(f"sampling: {e.message}") from None
        except ValueError as e:
            raise UnusableSession(str(e)) from None
        return self

    @classmethod
    def from_json(cls, d: dict) -> Session:
        """The session a saved document describes, validated (:meth:`validated`); unknown keys are ignored.

        Raises:
            SpecDeckError: a document that is not a session, or whose values the GUI cannot show (a type, a range,
                a setup string that does not parse), naming the field.
        """
        fix = "open a file saved with “Save session…”"
        if not isinstance(d, dict):
            raise SpecDeckError(f"not a SpecDeck session (a JSON object was expected, got {_show(d)})", fix=fix)
        try:
            version = d.get("version", SESSION_VERSION)
            if version != SESSION_VERSION:
                raise ValueError(f"version {_show(version)} is not {SESSION_VERSION} (saved by another SpecDeck?)")
            s = d.get("sampling", {})
            if not isinstance(s, dict):
                raise ValueError(f"sampling must be a table of settings, got {_show(s)}")
            defaults = Sampling()
            values = {}
            for name, (lo, hi) in SAMPLING_RANGES.items():
                v = s.get(name, getattr(defaults, name))
                values[name] = _check_number(f"sampling.{name}", v, lo, hi)
            for key in ("target", "setups", "prompt"):
                if key not in d:
                    raise ValueError(f"{key!r} is missing")
            setups = d["setups"]
            if not isinstance(setups, list):
                raise ValueError(f"setups must be a list of setup strings, got {_show(setups)}")
            session = cls(
                target=d["target"],
                setups=tuple(setups),
                prompt=d["prompt"],
                prompt_id=d.get("prompt_id", "custom"),
                chat=d.get("chat", True),
                mode=d.get("mode", "interleaved"),
                sampling=Sampling(**values),
            )
        except ValueError as e:
            raise SpecDeckError(f"not a SpecDeck session: {e}", fix=fix) from None
        return session.validated()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Session:
        """Read and validate a saved session.

        Raises:
            SpecDeckError: unreadable file, not JSON, or not a usable session (naming the file and the field).
        """
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise SpecDeckError(f"cannot read session {path}: {e}", fix="pick a .json file saved by SpecDeck") from None
        if not isinstance(d, dict):
            raise SpecDeckError(f"{path} is not a SpecDeck session", fix="pick a .json file saved by SpecDeck")
        try:
            return cls.from_json(d)
        except SpecDeckError as e:
            raise SpecDeckError(f"{path}: {e.message}", fix=e.fix) from None

    def with_(self, **kw) -> Session:
        return replace(self, **kw)


QWEN_PRESET = "PyTorch and llama.cpp side by side"
QWEN_TORCH_PRESET = "Baseline vs draft model vs n-gram"
SMOL_PRESET = "SmolLM2 quick"
LC_TARGET = "llamacpp-qwen2.5-coder-1.5b-instruct"

PRESETS: dict[str, Session] = {
    # the same Qwen2.5-Coder pair on two engines: PyTorch fp32 (its baseline and our best draft lane) and the GGUF
    # as it is on llama.cpp (its baseline and a k=auto draft lane, which does not draft where drafting cannot pay:
    # llama.cpp on a CPU); each speedup against its own baseline
    QWEN_PRESET: Session(
        target="qwen2.5-coder-1.5b-instruct",
        setups=("baseline", "draft:qwen2.5-coder-0.5b-instruct,k=24,cstop=0.5,dtype=int8", f"baseline@{LC_TARGET}",
                f"draft:llamacpp-qwen2.5-coder-0.5b-instruct,k=auto@{LC_TARGET}"),
        prompt=_CODE_PROMPT,
        prompt_id="code-1",
        sampling=Sampling(max_new_tokens=48),
    ),
    QWEN_TORCH_PRESET: Session(
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
    aliases = {"qwen": QWEN_PRESET, "default": QWEN_PRESET, "qwen-torch": QWEN_TORCH_PRESET, "smollm2": SMOL_PRESET, "smol": SMOL_PRESET,
               "quick": SMOL_PRESET}
    if key in aliases:
        return PRESETS[aliases[key]]
    raise SpecDeckError(f"unknown preset {name!r}", fix="presets: " + "; ".join(PRESETS))


def default_preset_name(usable: set[str]) -> str:
    """PyTorch and llama.cpp side by side when the Qwen pair is usable on both, the PyTorch-only Qwen preset when
    only there, else the SmolLM2 preset."""
    torch_pair = {"qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"}
    if torch_pair <= usable:
        return QWEN_PRESET if {LC_TARGET, "llamacpp-qwen2.5-coder-0.5b-instruct"} <= usable else QWEN_TORCH_PRESET
    return SMOL_PRESET
