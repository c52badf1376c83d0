"""Reference lanes: transformers' own implementations, `hf-assisted:<engine>` and `hf-lookup`, timed like ours."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.setups import DRAFT_DTYPES, SetupBase, SetupKind, engine_arg, param, register

__all__ = ["HFAssisted", "HFLookup", "ASSISTED", "LOOKUP"]


@dataclass(frozen=True)
class HFAssisted(SetupBase):
    """Reference lane: transformers' `generate(assistant_model=...)`; its steps read from the models' forwards."""

    prefix = "hf-assisted"

    engine: str = engine_arg("draft", help="the assistant model: an engine sharing the target's tokenizer")
    k: int | None = param(None, min=1, max=256, unset="transformers' default",
                          help="num_assistant_tokens (constant schedule); unset: transformers' own defaults")
    dtype: str | None = param(None, choices=DRAFT_DTYPES, unset="target's dtype", help="the assistant's precision")


@dataclass(frozen=True)
class HFLookup(SetupBase):
    """Reference lane: transformers' `generate(prompt_lookup_num_tokens=k)`; its steps read from the target's forwards."""

    prefix = "hf-lookup"

    k: int = param(10, min=1, max=256, always=True, help="prompt_lookup_num_tokens")


def _build_assisted(setup: HFAssisted, env):
    from app.runners.hf_library import LibraryRunner

    target = env.target()
    return LibraryRunner(target, assistant=env.draft(setup.engine, setup.dtype), k=setup.k, costs=env.lane_costs(target))


def _build_lookup(setup: HFLookup, env):
    from app.runners.hf_library import LibraryRunner

    target = env.target()
    return LibraryRunner(target, k=setup.k, lookup=True, costs=env.lane_costs(target))


ASSISTED = register(SetupKind(HFAssisted, "hf-assisted", "library lane: transformers' assisted generation (steps read from its forwards)", _build_assisted, library=True,
                              priced=True))
LOOKUP = register(SetupKind(HFLookup, "hf-lookup", "library lane: transformers' prompt lookup decoding (steps read from its forwards)", _build_lookup, library=True,
                            priced=True))
