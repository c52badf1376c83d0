"""What several test modules share: a lane run in this process through our loop and the shared accounting, without
a worker (the scheduler does the same in the worker)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from app.core.accounting import LaneRecorder, drive
from app.core.events import LaneDone, StepEvent
from app.core.setups import Sampling
from app.speculative.drafters import Drafter
from app.speculative.loop import LoopRunner


def run_lane(
    target,
    drafter: Drafter | None,
    prompt_ids: list[int],
    sampling: Sampling,
    *,
    lane_id: str = "lane",
    setup: str = "baseline",
    prompt_id: str = "prompt",
    repeat: int = 0,
    cancelled: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[StepEvent | LaneDone]:
    """Decode one prompt with one setup (our loop, recorded by the shared accounting).

    Args:
        target: an Engine (the model whose distribution is preserved).
        drafter: the setup's drafter; None for the baseline.
        prompt_ids: the prompt, already tokenized (chat template applied).
        sampling: temperature/top-k/top-p/seed/max_new_tokens (temperature 0 = greedy).
        cancelled: polled between steps; True ends the lane with LaneDone(cancelled=True).

    Yields:
        StepEvent per step, then one LaneDone whose `stats` is a LaneStats.
    """
    if not prompt_ids:
        raise ValueError("empty prompt")
    sampling = sampling.validated()
    rec = LaneRecorder(lane_id, setup, prompt_id, repeat, sampling.max_new_tokens, target.eos_ids, target.detokenizer(prompt_ids), clock)
    yield from drive(LoopRunner(target, drafter), rec, prompt_ids, sampling, cancelled)
