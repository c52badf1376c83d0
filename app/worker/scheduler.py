"""Lane scheduler: builds each lane's event generator and runs lanes sequentially or interleaved.

Never two lanes at once on one device: interleaving is round-robin by step in one thread, and each lane's
clock counts only its own steps (the loop times its phases itself), so timings agree with sequential runs.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator

from app.core.errors import SpecDeckError
from app.core.events import LaneStarted, RunDone, RunError
from app.core.setups import TRTLLM, DraftModel, HFAssisted, HFLookup, NGram, Sampling, parse_setup
from app.worker.messages import LaneSpec

__all__ = ["lane_events", "schedule"]


def lane_events(
    pool,
    target_name: str,
    spec: LaneSpec,
    sampling: Sampling,
    chat: bool,
    cancelled: Callable[[], bool],
    device: str | None = None,
    dtype: str | None = None,
) -> Iterator[object]:
    """All events of one lane: LaneStarted, StepEvents, RunDone — or RunError (never raises for lane errors)."""
    try:
        setup = parse_setup(spec.setup)
        if isinstance(setup, TRTLLM):
            # A TensorRT-LLM lane is an engine of its own (target + speculative config from its manifest).
            engine = pool.get(setup.engine, device, dtype)
            prompt_ids = engine.encode_prompt(spec.prompt, chat=chat)
            yield LaneStarted(spec.lane_id, setup.label, spec.prompt_id, spec.repeat, tuple(prompt_ids), spec.prompt)
            yield from engine.run_lane(
                prompt_ids, sampling, lane_id=spec.lane_id, setup=setup.label, prompt_id=spec.prompt_id, repeat=spec.repeat, cancelled=cancelled
            )
            return
        target = pool.get(target_name, device, dtype)
        draft = None
        if setup.draft_engine:
            draft = pool.get_draft(target_name, target, setup.draft_engine, device, setup.draft_dtype or dtype)
        prompt_ids = target.encode_prompt(spec.prompt, chat=chat)
        yield LaneStarted(spec.lane_id, setup.label, spec.prompt_id, spec.repeat, tuple(prompt_ids), spec.prompt)
        if isinstance(setup, (HFAssisted, HFLookup)):
            from app.spec.reference import run_reference_lane

            if getattr(target, "backend", "hf") != "hf":
                raise SpecDeckError(f"{setup.label} needs a Hugging Face target, {target_name} is {target.backend}", fix="use an hf engine")
            gen = run_reference_lane(target, setup, prompt_ids, sampling, draft=draft, lane_id=spec.lane_id, prompt_id=spec.prompt_id, repeat=spec.repeat)
        else:
            from app.spec.drafters import DraftModelDrafter, NGramDrafter
            from app.spec.loop import run_lane

            if isinstance(setup, DraftModel):
                drafter = DraftModelDrafter(draft, setup.k, setup.schedule, setup.stop, setup.cstop)
            elif isinstance(setup, NGram):
                drafter = NGramDrafter(setup.n, setup.k)
            else:
                drafter = None
            gen = run_lane(
                target,
                drafter,
                prompt_ids,
                sampling,
                lane_id=spec.lane_id,
                setup=setup.label,
                prompt_id=spec.prompt_id,
                repeat=spec.repeat,
                cancelled=cancelled,
            )
        yield from gen
    except SpecDeckError as e:
        yield RunError(spec.lane_id, str(e), kind=type(e).__name__)
    except Exception as e:  # a bug or a backend failure: keep the other lanes going
        yield RunError(spec.lane_id, f"{type(e).__name__}: {e}", kind="internal", details=traceback.format_exc())


def schedule(
    lanes: list[LaneSpec],
    make: Callable[[LaneSpec], Iterator[object]],
    mode: str,
    emit: Callable[[object], None],
    poll: Callable[[], None] = lambda: None,
) -> None:
    """Run lanes; `make` builds a lane's event iterator, `emit` sends each event, `poll` runs between steps
    (reads Cancel commands). sequential: one lane after another. interleaved: lanes of the same `group`
    advance round-robin one step each; groups run one after another.
    """
    if mode == "sequential":
        for spec in lanes:
            for ev in make(spec):
                emit(ev)
                poll()
        return
    if mode != "interleaved":
        raise ValueError(f"unknown mode {mode!r}")
    groups: dict[str, list[LaneSpec]] = {}
    for spec in lanes:
        groups.setdefault(spec.group, []).append(spec)
    for group in groups.values():
        active = [(spec, make(spec)) for spec in group]
        while active:
            still = []
            for spec, it in active:
                # advance this lane to its next step (LaneStarted comes with the first one)
                while True:
                    try:
                        ev = next(it)
                    except StopIteration:
                        break
                    emit(ev)
                    if isinstance(ev, (RunDone, RunError)):
                        break
                    if isinstance(ev, LaneStarted):
                        continue
                    still.append((spec, it))
                    break
                poll()
            active = still
