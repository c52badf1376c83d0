"""Setup strings and the setup-type registry: what a lane does, parsed from the CLI, saved sessions and the GUI.

A *setup type* (a kind of lane: ``draft``, ``ngram``, ``trtllm``, …) is one module under ``app/lanes`` that
declares a frozen dataclass (subclass of :class:`SetupBase`) whose fields are its parameters, declared with
:func:`param` (type, default, range or choices, help) and :func:`engine_arg` (the engine named right after the
colon), plus a ``build(setup, env)`` function that returns its lane runner. It registers itself with one line,
``KIND = register(SetupKind(...))``; the built-in kinds are listed in :data:`BUILTIN_KINDS` (loaded on first use),
and ``SPECDECK_SETUP_KINDS=pkg.module[,…]`` adds third-party ones in every process (CLI, GUI, worker): such a
module registers itself or exposes ``KIND`` (or ``KINDS``).

The parser, the grammar in error messages, the scheduler, the GUI setup editor and the README all read this
registry. String form::

    <prefix>[:<engine>][,key=value…][@<target>]      (or <prefix>:key=value… for kinds without an engine)

``@<target>`` runs the lane on another target engine than the run's (any kind whose lane runs on the target:
e.g. ``baseline@llamacpp-qwen2.5-coder-1.5b-instruct``); its speedup is then measured against the baseline of
that target. Every setup's ``.label`` parses back to an equal setup.

This module is stdlib only: kind modules are imported by name, never at import time of core.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from app.core.errors import SetupError

__all__ = [
    "BUILTIN_KINDS",
    "DRAFT_DTYPES",
    "Param",
    "EngineArg",
    "SetupBase",
    "SetupKind",
    "param",
    "engine_arg",
    "register",
    "unregister",
    "kinds",
    "get_kind",
    "kind_of",
    "grammar",
    "parse_setup",
    "Sampling",
]

DRAFT_DTYPES = ("float32", "bfloat16", "float16", "int8")

# prefix -> module that registers it (one line per kind; order = order in the GUI and the grammar)
BUILTIN_KINDS: dict[str, str] = {
    "baseline": "app.lanes.baseline",
    "draft": "app.lanes.draft",
    "ngram": "app.lanes.ngram",
    "hf-assisted": "app.lanes.hf_library",
    "hf-lookup": "app.lanes.hf_library",
    "trtllm": "app.lanes.trtllm",
    "llamacpp-lookup": "app.lanes.llamacpp_lookup",
    "remote": "app.lanes.remote",
    "tree": "app.lanes.tree",
    "redrafter": "app.lanes.redrafter",
}


@dataclass(frozen=True)
class Param:
    """One `key=value` parameter of a setup type, as declared with :func:`param`.

    Attributes:
        name: the key (also the dataclass field).
        type: int, float or str.
        default: the value when the key is absent (None: optional, "unset" has a meaning of its own).
        help: one line for tooltips and the grammar.
        min, max: inclusive bounds for numbers; `max_exclusive` makes `max` exclusive.
        choices: the allowed values (str parameters).
        always: always written in the label (e.g. `k` of `draft:`), else only when not the default.
        unset: what None means, for optional parameters (GUI special value, grammar), e.g. "library default".
        gui: the field's short label in the GUI editor (default: the name).
        auto: non-empty for numbers that also take the word `auto` (the value is then the string "auto"); says
            what auto does (e.g. k=auto: a cost-aware number of drafts per step).
        metavar: how the grammar shows the value (e.g. `3x2x1` for a tree shape); default from the type.
    """

    name: str
    type: type
    default: Any
    help: str = ""
    min: float | None = None
    max: float | None = None
    max_exclusive: bool = False
    choices: tuple[str, ...] | None = None
    always: bool = False
    unset: str = ""
    gui: str = ""
    auto: str = ""
    metavar: str = ""

    @property
    def optional(self) -> bool:
        return self.default is None

    def format(self, value: Any) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)

    def syntax(self) -> str:
        """`k=4`, `schedule=constant|heuristic`, `stop=P`: how the grammar shows it."""
        if self.metavar:
            return f"{self.name}={self.metavar}"
        if self.choices:
            return f"{self.name}={'|'.join(self.choices)}" if len(self.choices) <= 3 else f"{self.name}=D"
        if self.auto:
            return f"{self.name}={self.format(self.default)}|auto"
        if self.type is float:
            return f"{self.name}=P" if self.max is not None and self.max <= 1 else f"{self.name}=X"
        if self.default is None:
            return f"{self.name}=N"
        return f"{self.name}={self.format(self.default)}"

    def parse(self, raw: str, bad: Callable[[str], SetupError]) -> Any:
        """The typed value of `raw`, checked against the bounds or choices."""
        v: Any
        if self.auto and raw.strip().lower() == "auto":
            return "auto"
        if self.type is int:
            try:
                v = int(raw)
            except ValueError:
                raise bad(f"{self.name} must be an integer{' or auto' if self.auto else ''}, got {raw!r}") from None
        elif self.type is float:
            try:
                v = float(raw)
            except ValueError:
                raise bad(f"{self.name} must be a number, got {raw!r}") from None
            if v != v:  # NaN
                raise bad(f"{self.name} must be a number, got {raw!r}")
        else:
            v = raw
        if self.choices is not None and v not in self.choices:
            raise bad(f"{self.name} must be one of {', '.join(self.choices)}, got {raw!r}")
        if self.type in (int, float):
            lo, hi = self.min, self.max
            if lo is not None and hi is not None and (v < lo or (v >= hi if self.max_exclusive else v > hi)):
                close = ")" if self.max_exclusive else "]"
                raise bad(f"{self.name} must be in [{self.format(lo)}, {self.format(hi)}{close}, got {self.format(v)}")
            if lo is not None and v < lo:
                raise bad(f"{self.name} must be >= {self.format(lo)}, got {self.format(v)}")
            if hi is not None and v > hi:
                raise bad(f"{self.name} must be <= {self.format(hi)}, got {self.format(v)}")
        return v


@dataclass(frozen=True)
class EngineArg:
    """The engine named right after the colon (`draft:<engine>`).

    role: "draft" (a model that must share the target's tokenizer; the GUI offers compatible engines),
    "lane" (the lane runs this engine instead of the target, e.g. `trtllm:<engine>`) or "head" (not an engine:
    a trained draft head the lane loads itself, e.g. `redrafter:<head>`).
    backends: the manifest backends it accepts (None: any).
    """

    role: str = "draft"
    backends: tuple[str, ...] | None = None
    help: str = ""
    example: str = "qwen2.5-coder-0.5b-instruct"

    @property
    def metavar(self) -> str:
        """How the grammar and `setups` name it: `<head>` for a trained head, else `<engine>`."""
        return "<head>" if self.role == "head" else "<engine>"


def param(default: Any, *, help: str = "", min: float | None = None, max: float | None = None, max_exclusive: bool = False,
          choices: Sequence[str] | None = None, always: bool = False, unset: str = "", gui: str = "", auto: str = "",
          metavar: str = "") -> Any:
    """Declare a dataclass field of a setup type as a `key=value` parameter (see :class:`Param`)."""
    meta = dict(help=help, min=min, max=max, max_exclusive=max_exclusive, choices=tuple(choices) if choices else None,
                always=always, unset=unset, gui=gui, auto=auto, metavar=metavar)
    return dataclasses.field(default=default, metadata={"specdeck_param": meta})


def engine_arg(role: str = "draft", *, backends: Sequence[str] | None = None, help: str = "", example: str = "qwen2.5-coder-0.5b-instruct") -> Any:
    """Declare the dataclass field `engine` of a setup type: the engine named right after the colon."""
    return dataclasses.field(metadata={"specdeck_engine": EngineArg(role, tuple(backends) if backends else None, help, example)})


@dataclass(frozen=True)
class SetupBase:
    """Base of every setup type's frozen dataclass: the label and the engines a lane needs come from its kind.

    Attributes:
        target: the engine this lane runs on instead of the run's target (`…@<engine>`); None: the run's.
    """

    prefix: ClassVar[str] = ""
    target: str | None = dataclasses.field(default=None, kw_only=True, metadata={"specdeck_target": True})

    @property
    def label(self) -> str:
        """The canonical string (what reports show); parses back to an equal setup."""
        return get_kind(self.prefix).label(self)

    @property
    def draft_engines(self) -> tuple[tuple[str, str | None], ...]:
        """(engine, precision or None) of each draft model the lane loads beside the target."""
        return get_kind(self.prefix).draft_engines(self)

    @property
    def lane_engine(self) -> str | None:
        """The engine the lane runs instead of the target (role "lane"), else None."""
        return get_kind(self.prefix).lane_engine(self)

    def problem(self) -> str:
        """What is wrong with this combination of parameters ("" when nothing): a kind's own checks beyond each
        parameter's type and range (a syntax of its own, parameters that exclude each other). Parsing refuses a
        setup with a problem, naming it."""
        return ""


class SetupKind:
    """A registered setup type.

    Args:
        setup_cls: the frozen dataclass (subclass of SetupBase, with `prefix` set); its fields are the engine
            argument (:func:`engine_arg`) and the parameters (:func:`param`).
        title: the GUI's name of the method ("draft model").
        summary: one line for the grammar and the README.
        build: `build(setup, env) -> LaneRunner`, called in the worker (imports torch/engines lazily).
        library: a library lane: a library's own implementation in its own loop, which SpecDeck times but does not
            drive; its steps are read where the runner can (transformers' lanes from the models' forwards, with the
            theory column of SpecDeck's own lanes: their steps priced on the target's cost profile), llama-cpp-python's
            lookup reports tokens only (no theory).
        priced: the lane's steps are priced on its target's cost profile (the theory column; k=auto decides with it),
            so a run of it loads that profile with its engines (app.worker.plan.RunPlan.drafting); default: every
            kind but a library's.
    """

    def __init__(self, setup_cls: type, title: str, summary: str, build: Callable[[Any, Any], Any], library: bool = False,
                 priced: bool | None = None) -> None:
        if not dataclasses.is_dataclass(setup_cls) or not issubclass(setup_cls, SetupBase) or not setup_cls.prefix:
            raise TypeError(f"{setup_cls!r} must be a frozen dataclass subclassing SetupBase with a prefix")
        self.setup_cls = setup_cls
        self.prefix: str = setup_cls.prefix
        self.title = title
        self.summary = summary
        self.build = build
        self.library = library
        self.priced = not library if priced is None else priced
        hints = typing.get_type_hints(setup_cls)
        self.engine: EngineArg | None = None
        params: list[Param] = []
        for f in dataclasses.fields(setup_cls):
            if "specdeck_target" in f.metadata:
                continue
            if "specdeck_engine" in f.metadata:
                if f.name != "engine":
                    raise TypeError(f"{setup_cls.__name__}: the engine argument must be the field 'engine'")
                self.engine = f.metadata["specdeck_engine"]
            elif "specdeck_param" in f.metadata:
                typ = hints[f.name]
                base = next((t for t in typing.get_args(typ) if t is not type(None)), typ) if typing.get_args(typ) else typ
                if base not in (int, float, str):
                    raise TypeError(f"{setup_cls.__name__}.{f.name}: parameters are int, float or str, got {typ!r}")
                params.append(Param(f.name, base, f.default, **f.metadata["specdeck_param"]))
            else:
                raise TypeError(f"{setup_cls.__name__}.{f.name}: declare it with param() or engine_arg()")
        self.params: tuple[Param, ...] = tuple(params)

    def __repr__(self) -> str:
        return f"SetupKind({self.prefix!r})"

    # --- strings ------------------------------------------------------------------------------------
    @property
    def takes_target(self) -> bool:
        """The lane runs on a target engine (so `@<target>` can move it); False for kinds running their own engine."""
        return self.engine is None or self.engine.role != "lane"

    def syntax(self) -> str:
        """`draft:<engine>[,k=4][,…][@<target>]` or `ngram[:n=3,k=8][@<target>]` as the grammar shows it."""
        at = "[@<target>]" if self.takes_target else ""
        if self.engine is not None:
            return f"{self.prefix}:{self.engine.metavar}" + "".join(f"[,{p.syntax()}]" for p in self.params) + at
        if self.params:
            return f"{self.prefix}[:{','.join(p.syntax() for p in self.params)}]" + at
        return self.prefix + at

    def label(self, setup: Any) -> str:
        parts = []
        for p in self.params:
            v = getattr(setup, p.name)
            if v is None or (not p.always and v == p.default):
                continue
            parts.append(f"{p.name}={p.format(v)}")
        at = f"@{setup.target}" if setup.target else ""
        if self.engine is not None:
            return f"{self.prefix}:{','.join([setup.engine, *parts])}{at}"
        return (f"{self.prefix}:{','.join(parts)}" if parts else self.prefix) + at

    def parse(self, text: str, rest: str, target: str | None = None) -> Any:
        def bad(why: str) -> SetupError:
            return _bad(text, why)

        if target is not None and not self.takes_target:
            raise bad(f"{self.prefix} runs its own engine: it takes no @<target>")
        parts = rest.split(",") if rest.strip() else []
        kw: dict[str, Any] = {}
        if self.engine is not None:
            eng = parts[0].strip() if parts else ""
            if not eng or "=" in eng:
                raise bad(f"{self.prefix} needs an engine name first, e.g. {self.prefix}:{self.engine.example}")
            kw["engine"] = eng
            parts = parts[1:]
        elif not self.params and rest.strip():
            raise bad(f"{self.prefix} takes no parameters")
        by_name = {p.name: p for p in self.params}
        seen: set[str] = set()
        for raw in parts:
            raw = raw.strip()
            if not raw:
                raise bad("empty parameter")
            if "=" not in raw:
                raise bad(f"parameter {raw!r} is not key=value")
            key, value = (s.strip() for s in raw.split("=", 1))
            if key not in by_name:
                raise bad(f"unknown parameter {key!r} (allowed: {', '.join(by_name) or 'none'})")
            if key in seen:
                raise bad(f"parameter {key!r} given twice")
            seen.add(key)
            kw[key] = by_name[key].parse(value, bad)
        setup = self.setup_cls(**kw, target=target)
        why = setup.problem()
        if why:
            raise bad(why)
        return setup

    # --- engines ------------------------------------------------------------------------------------
    def draft_engines(self, setup: Any) -> tuple[tuple[str, str | None], ...]:
        if self.engine is None or self.engine.role != "draft":
            return ()
        return ((setup.engine, getattr(setup, "dtype", None)),)

    def lane_engine(self, setup: Any) -> str | None:
        return setup.engine if self.engine is not None and self.engine.role == "lane" else None


_kinds: dict[str, SetupKind] = {}
_loaded = False
_load_error: SetupError | None = None


def register(kind: SetupKind, *, replace: bool = False) -> SetupKind:
    """Add a setup type (a kind module's one line). Raises ValueError when the prefix is taken."""
    if kind.prefix in _kinds and not replace and _kinds[kind.prefix].setup_cls is not kind.setup_cls:
        raise ValueError(f"setup type {kind.prefix!r} is already registered")
    _kinds[kind.prefix] = kind
    return kind


def unregister(prefix: str) -> None:
    """Remove a setup type (tests)."""
    _kinds.pop(prefix, None)


def _load() -> None:
    """Import the built-in kinds' modules and the plug-ins of $SPECDECK_SETUP_KINDS (once).

    Raises:
        SetupError: a plug-in module that cannot be imported (its error in one line, where it happened) or that
            registers no setup kind; raised again on every later call, never half-loaded silently.
    """
    global _loaded, _load_error
    if _load_error is not None:
        raise _load_error
    if _loaded:
        return
    for mod in dict.fromkeys(BUILTIN_KINDS.values()):
        importlib.import_module(mod)
    for mod in [m.strip() for m in os.environ.get("SPECDECK_SETUP_KINDS", "").split(",") if m.strip()]:
        try:
            _load_plugin(mod)
        except SetupError as e:
            _load_error = e
            raise
    _loaded = True


def _load_plugin(mod: str) -> None:
    before = set(_kinds)
    try:
        m = importlib.import_module(mod)
    except Exception as e:  # a plug-in's own bug: one line naming it, not a traceback through SpecDeck
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        raise SetupError(f"cannot import setup kind module {mod!r} (SPECDECK_SETUP_KINDS): {type(e).__name__}: {e} "
                         f"({where.filename}:{where.lineno})",
                         fix="fix that module, or remove it from SPECDECK_SETUP_KINDS") from None
    for k in (getattr(m, "KIND", None), *getattr(m, "KINDS", ())):  # a plug-in may register itself or just expose KIND(S)
        if isinstance(k, SetupKind) and k.prefix not in _kinds:
            register(k)
    if set(_kinds) == before:
        raise SetupError(f"setup kind module {mod!r} (SPECDECK_SETUP_KINDS) registers no setup kind",
                         fix="a plug-in defines KIND = SetupKind(...) (or KINDS, or calls register()); check the module name")


def kinds() -> list[SetupKind]:
    """Registered setup types, built-ins first in their declared order."""
    _load()
    order = list(BUILTIN_KINDS)
    return sorted(_kinds.values(), key=lambda k: order.index(k.prefix) if k.prefix in order else len(order))


def get_kind(prefix: str) -> SetupKind:
    _load()
    try:
        return _kinds[prefix]
    except KeyError:
        raise SetupError(f"unknown setup type {prefix!r}", fix=grammar()) from None


def kind_of(setup: Any) -> SetupKind:
    return get_kind(setup.prefix)


def grammar() -> str:
    """The setup grammar, read from the registry (error messages, tooltips, README)."""
    lines = ["setup grammar (python -m app setups explains each; @<target>: run the lane on another target engine):"]
    for k in kinds():
        lines.append(f"  {k.syntax()}")
    notes = []
    for k in kinds():
        for p in k.params:
            if p.choices and len(p.choices) > 3:
                note = f"  ({p.name[0].upper()}: {' | '.join(p.choices)})"
                if note not in notes:
                    notes.append(note)
    return "\n".join(lines + notes)


def _bad(text: str, why: str) -> SetupError:
    return SetupError(f"bad setup {text!r}: {why}", fix=grammar())


def parse_setup(text: str) -> Any:
    """Parse a setup string into its setup type's dataclass.

    Raises:
        SetupError: malformed string or out-of-range value; the message carries the grammar.
    """
    s = text.strip()
    if not s:
        raise _bad(text, "empty")
    target: str | None = None
    if "@" in s:
        s, _, target = s.rpartition("@")
        s, target = s.strip(), target.strip()
        if not target or "," in target or any(c.isspace() for c in target):
            raise _bad(text, "@ must be followed by a target engine name, e.g. baseline@llamacpp-qwen2.5-coder-1.5b-instruct")
        if not s:
            raise _bad(text, "empty")
    prefix, _, rest = s.partition(":")
    prefix = prefix.strip().lower()
    _load()
    kind = _kinds.get(prefix)
    if kind is None:
        raise _bad(text, f"unknown method {prefix!r}")
    return kind.parse(text, rest, target)


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters shared by every lane of a run. temperature 0 = greedy.

    Raises (from `validated`):
        SetupError: temperature < 0, top_p outside (0, 1], top_k < 0, max_new_tokens < 1.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_new_tokens: int = 96

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validated(self) -> Sampling:
        if not (self.temperature >= 0.0):
            raise SetupError(f"temperature must be >= 0, got {self.temperature}", fix="use 0 for greedy or e.g. 0.7")
        if not (0.0 < self.top_p <= 1.0):
            raise SetupError(f"top-p must be in (0, 1], got {self.top_p}", fix="use e.g. 0.9, or 1 to disable")
        if self.top_k < 0:
            raise SetupError(f"top-k must be >= 0, got {self.top_k}", fix="use 0 to disable")
        if self.max_new_tokens < 1:
            raise SetupError(f"max new tokens must be >= 1, got {self.max_new_tokens}", fix="use e.g. 96")
        if self.max_new_tokens > 1_000_000:
            raise SetupError(f"max new tokens must be <= 1000000, got {self.max_new_tokens}", fix="use e.g. 96")
        return self
