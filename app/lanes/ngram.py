"""`ngram`: prompt lookup — match the last n tokens earlier in prompt + output, propose what followed."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.setups import SetupBase, SetupKind, param, register

__all__ = ["NGram", "KIND"]


@dataclass(frozen=True)
class NGram(SetupBase):
    """Prompt lookup: match the last n tokens earlier in prompt + output, propose what followed (up to k; k=auto:
    as many as pay on this target, from the measured verify cost and how often matches were accepted)."""

    prefix = "ngram"

    n: int = param(3, min=1, max=16, always=True, help="n-gram length matched against prompt + output")
    k: int | str = param(8, min=1, max=256, always=True, help="the most tokens proposed per step",
                         auto="a cost-aware number per step (0 … 32), from the measured verify cost and the matches' record")


def build(setup: NGram, env):
    from app.speculative.drafters import NGramDrafter
    from app.speculative.loop import LoopRunner
    from app.speculative.policy import AutoK

    target = env.target()
    auto = AutoK(env.profile(target)) if setup.k == "auto" else None
    k = setup.k if isinstance(setup.k, int) else 8
    return LoopRunner(target, NGramDrafter(setup.n, k, auto=auto), costs=env.lane_costs(target))


KIND = register(SetupKind(NGram, "n-gram", "prompt lookup: propose what followed the last n tokens earlier on", build))
