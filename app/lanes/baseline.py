"""`baseline`: the target alone, one token per step (our loop with no drafter, timed like every setup)."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.setups import SetupBase, SetupKind, register

__all__ = ["Baseline", "KIND"]


@dataclass(frozen=True)
class Baseline(SetupBase):
    """The target alone, one token per step."""

    prefix = "baseline"


def build(setup: Baseline, env):
    from app.speculative.loop import LoopRunner

    target = env.target()
    if getattr(target, "backend", None) == "openai":  # a served target: the server decodes (app.runners.openai_stream)
        from app.runners.openai_stream import RemoteRunner

        return RemoteRunner(target)
    return LoopRunner(target)


KIND = register(SetupKind(Baseline, "baseline", "the target alone, one token per step", build))
