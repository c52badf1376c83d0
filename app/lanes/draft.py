"""`draft:<engine>`: a small draft model proposes up to k tokens per step; the target verifies them in one pass."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.setups import DRAFT_DTYPES, SetupBase, SetupKind, engine_arg, param, register

__all__ = ["DraftModel", "KIND"]


@dataclass(frozen=True)
class DraftModel(SetupBase):
    """A small draft model proposes up to k tokens per step.

    stop: confidence stop — drafting ends early after a token whose draft probability is below `stop`
    (0 = off; transformers' assisted generation uses 0.4 by default).
    cstop: cumulative confidence stop — drafting ends once the draft's probability of the whole proposal (the
    product of its token probabilities, its own estimate that every draft is accepted) falls below `cstop`, so
    confident runs draft long and uncertain ones short (0 = off).
    dtype: the draft's precision (None: the target's). It never changes what is emitted, only acceptance and cost.
    k=auto: each step drafts the number of tokens (possibly none) that maximises expected tokens per second on this
    machine, from the engines' cost profiles and the draft's calibrated confidence (app.speculative.policy);
    schedule/stop/cstop do not apply.
    """

    prefix = "draft"

    engine: str = engine_arg("draft", help="draft model: an engine sharing the target's tokenizer")
    k: int | str = param(4, min=1, max=256, always=True, help="draft tokens per step (the most, with stop/cstop)",
                         auto="a cost-aware number per step (0 … 32), from the measured verify cost and the draft's calibrated confidence")
    schedule: str = param("constant", choices=("constant", "heuristic"),
                          help="k schedule: constant, or heuristic (grow k after full acceptance, shrink after a rejection)")
    stop: float = param(0.0, min=0.0, max=1.0, max_exclusive=True, gui="stop",
                        help="confidence stop: end the draft after a token with draft probability < P (0 = off)")
    cstop: float = param(0.0, min=0.0, max=1.0, max_exclusive=True, gui="cstop",
                         help="cumulative stop: end the draft once the product of its probabilities < P (0 = off)")
    dtype: str | None = param(None, choices=DRAFT_DTYPES, unset="target's dtype",
                              help="the draft's precision: float32 | bfloat16 | float16 | int8 (CPU); default: the target's")


def build(setup: DraftModel, env):
    from app.speculative.drafters import DraftModelDrafter
    from app.speculative.loop import LoopRunner
    from app.speculative.policy import AutoK

    target = env.target()
    draft = env.draft(setup.engine, setup.dtype)
    auto = memory = None
    if setup.k == "auto":
        tp, dp = env.profile(target), env.profile(draft)
        auto = AutoK(tp, draft=dp)
        # what k=auto learns of this pair carries over to its next lane (the next prompt) in this worker, and to the
        # next run's (saved on disk: app.speculative.policy.save_learnt)
        memory = (tp.key, dp.key if dp is not None else draft.name)
    else:  # a fixed k needs no draft profile; a cached one still reaches the run (the Costs tab draws the draft's c)
        env.profile(draft, measure=False)
    k = setup.k if isinstance(setup.k, int) else 4
    return LoopRunner(target, DraftModelDrafter(draft, k, setup.schedule, setup.stop, setup.cstop, auto=auto, memory=memory,
                                                learn=getattr(env, "learn", True), saved=True, category=getattr(env, "category", "")),
                      costs=env.lane_costs(target))


KIND = register(SetupKind(DraftModel, "draft model", "a draft model proposes up to k tokens, the target verifies them", build))
