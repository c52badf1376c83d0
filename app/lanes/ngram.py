"""`ngram`: prompt lookup — match the last n tokens earlier in prompt + output, propose what followed."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.setups import SetupBase, SetupKind, param, register

__all__ = ["NGram", "KIND"]


@dataclass(frozen=True)
class NGram(SetupBase):
    """Prompt lookup: match the last n tokens earlier in prompt + output, propose what followed (up to k)."""

    prefix = "ngram"

    n: int = param(3, min=1, max=16, always=True, help="n-gram length matched against prompt + output")
    k: int = param(8, min=1, max=256, always=True, help="the most tokens proposed per step")


def build(setup: NGram, env):
    from app.speculative.drafters import NGramDrafter
    from app.speculative.loop import LoopRunner

    return LoopRunner(env.target(), NGramDrafter(setup.n, setup.k))


KIND = register(SetupKind(NGram, "n-gram", "prompt lookup: propose what followed the last n tokens earlier on", build))
