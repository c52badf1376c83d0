"""Lane scheduler: builds each lane's event generator and runs lanes sequentially, interleaved or paced.

Never two lanes at once on one device: interleaving (the race: round-robin by step) and pacing (the lane with the
fewest tokens steps next) step lanes one at a time in one thread, and each lane's clock counts only its own steps
(the loop times its phases itself), so timings agree with sequential runs. Each lane's LaneDone also says how long
the worker's threads waited for a CPU while the lane computed (``cpu_wait_s``, app.core.cpuwait): what other
processes on the machine took from its clock.
"""

from __future__ import annotations

import dataclasses
import traceback
import zlib
from collections.abc import Callable, Iterator

from app.core.accounting import LaneRecorder, drive
from app.core.cpuwait import CpuWait
from app.core.errors import SetupError, SpecDeckError
from app.core.events import LaneDone, LaneStarted, RunError, StepEvent
from app.core.metrics import LaneStats
from app.core.setups import Sampling, kind_of, parse_setup
from app.engines.base import Engine
from app.worker.messages import MODES, LaneSpec
from app.worker.plan import RunPlan

__all__ = ["PoolEnv", "check_context", "context_length", "lane_events", "schedule", "with_cpu_wait"]


class PoolEnv:
    """What a setup type's `build` may use (app.core.setups): the run's target, drafts checked against it, and
    other engines by name, all from the worker's pool (loaded once, converted when needed)."""

    def __init__(self, pool, target_name: str, device: str | None, dtype: str | None, learn: bool = True,
                 category: str = "") -> None:
        self.pool = pool
        self.target_name = target_name
        self.device = device
        self.dtype = dtype
        # whether what the lane learns (k=auto's estimates) may carry over to later lanes: not from a warm-up lane,
        # which runs the first tokens of a prompt that a measured lane then runs again
        self.learn = learn
        self.category = category  # the lane's prompt's category ("" where none): k=auto's saving and acceptance are learnt per category

    def target(self):
        return self.pool.get(self.target_name, self.device, self.dtype)

    def draft(self, name: str, dtype: str | None = None):
        """A draft model for the target, after checking (tokenizers first) that they share a vocabulary."""
        return self.pool.get_draft(self.target_name, self.target(), name, self.device, dtype or self.dtype)

    def engine(self, name: str):
        """Any engine by name (a lane that runs its own engine instead of the target)."""
        return self.pool.get(name, self.device, self.dtype)

    def profile(self, engine, measure: bool = True):
        """An engine's cost profile (app.core.costs.CostProfile), from the pool, the cache or measured now."""
        return self.pool.profile(engine, measure=measure)

    def lane_costs(self, target):
        """The LaneCosts a speculative lane's theory needs (the target's verify-cost curve), from its cost profile
        (measured now when not cached: once per engine and machine); None for engines that cannot be profiled
        (the theory is then not predicted)."""
        from app.core.costs import LaneCosts

        tp = self.pool.profile(target)
        return LaneCosts(tp.curve(), (tp.key,)) if tp is not None else None


def context_length(engine: Engine) -> int | None:
    """Positions the engine can attend to (prompt + generated), when it says (`context_length`); None: unknown."""
    n = engine.context_length
    return n if isinstance(n, int) and n > 0 else None


def check_context(engine: Engine, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a lane whose prompt plus token budget does not fit the engine's context window, or whose prompt
    alone exceeds the engine's prompt limit (`max_prompt_tokens`, e.g. a built TensorRT engine's max_input_len).

    Raises:
        SetupError: with the numbers and the fix.
    """
    name = engine.name
    most = engine.max_prompt_tokens
    if isinstance(most, int) and most > 0 and prompt_tokens > most:
        raise SetupError(
            f"the prompt is {prompt_tokens:,} tokens: more than the {most:,} {name} accepts as input",
            fix=f"shorten the prompt to at most {most:,} tokens (or rebuild/reload the engine with a larger input limit)",
        )
    limit = context_length(engine)
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise SetupError(
            f"the prompt is {prompt_tokens:,} tokens and up to {max_new_tokens:,} new tokens are asked: "
            f"{prompt_tokens + max_new_tokens:,} > the {limit:,} positions of {name}",
            fix=(f"lower --max-new-tokens to at most {limit - prompt_tokens:,}"
                 + (f", or shorten the prompt to at most {limit - max_new_tokens:,} tokens" if limit > max_new_tokens else "")
                 if prompt_tokens < limit else f"shorten the prompt to fewer than {limit:,} tokens"),
        )


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
    """All events of one lane: LaneStarted, StepEvents, LaneDone — or RunError (never raises for lane errors).

    The lane's setup type (from the registry) builds its runner; the shared LaneRecorder does the accounting.
    """
    try:
        setup = parse_setup(spec.setup)
        runner = kind_of(setup).build(setup, PoolEnv(pool, setup.target or target_name, device, dtype,
                                                     learn=not RunPlan.is_warmup(spec.lane_id), category=spec.category))
        engine = runner.engine
        prompt_ids = engine.encode_prompt(spec.prompt, chat=chat)
        check_context(engine, len(prompt_ids), sampling.max_new_tokens)
        about = f"{engine.name} · {engine.backend} · {engine.dtype}"
        yield LaneStarted(spec.lane_id, setup.label, spec.prompt_id, spec.repeat, tuple(prompt_ids), spec.prompt, about)
        sampling = sampling.validated()
        rec = LaneRecorder(spec.lane_id, setup.label, spec.prompt_id, spec.repeat, sampling.max_new_tokens, engine.eos_ids,
                           engine.detokenizer(prompt_ids))
        yield from drive(runner, rec, prompt_ids, sampling, cancelled)
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
    (reads Cancel commands). sequential: one lane after another. interleaved (the race): lanes of the same `group`
    advance round-robin one step each, so a lane that emits more tokens per step shows ahead. paced (for measuring):
    within a group the lane that has emitted the fewest tokens steps next, so every lane of the group spans the same
    stretch of time — a baseline of 48 one-token steps no longer runs its last 40 alone after a speculative lane of 6
    steps has ended, and a machine that slows for a while slows each lane alike (their speedups then hold; round-robin
    put that slowdown on whichever lane was still running). Lanes that compute their whole answer in their first
    step (transformers' own lanes) cannot be paced. In both, groups run one after another, each starting its rounds
    at another lane (the list turned by a hash of the group's name: the same for a rerun; paced: the order ties go
    in), so that no lane — the baseline, first in every plan — always steps first: where a lane steps in its round
    moves its timings (measured on llama.cpp: resources/bench/README.md, "llama.cpp rerun").
    """
    waits = CpuWait()
    if waits.available:
        built = make

        def make(spec: LaneSpec) -> Iterator[object]:
            return with_cpu_wait(built(spec), waits)

    if mode == "sequential":
        for spec in lanes:
            for ev in make(spec):
                emit(ev)
                poll()
        return
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    groups: dict[str, list[LaneSpec]] = {}
    for spec in lanes:
        groups.setdefault(spec.group, []).append(spec)
    for group in groups.values():
        turn = zlib.crc32(group[0].group.encode()) % len(group)
        active = [_Lane(make(spec)) for spec in group[turn:] + group[:turn]]
        while active:
            # paced: the first of the lanes with the fewest tokens (min keeps the first of equals: the turned order)
            todo = [min(active, key=lambda lane: lane.tokens)] if mode == "paced" else list(active)
            for lane in todo:
                if not _advance(lane, emit):
                    active.remove(lane)
                poll()


@dataclasses.dataclass(eq=False)  # a lane is itself (list.remove by identity)
class _Lane:
    events: Iterator[object]
    tokens: int = 0  # emitted so far


def _advance(lane: _Lane, emit: Callable[[object], None]) -> bool:
    """Advance one lane to its next step (LaneStarted comes with the first one), counting the tokens it emitted;
    False when the lane ended. A lane's final step (StepEvent.final) comes with its LaneDone."""
    it = lane.events
    while True:
        try:
            ev = next(it)
        except StopIteration:
            return False
        emit(ev)
        if isinstance(ev, (LaneDone, RunError)):
            return False
        if isinstance(ev, LaneStarted):
            continue
        if isinstance(ev, StepEvent):
            lane.tokens += len(ev.emitted_ids) or ev.accepted_count + (ev.target_id is not None)
            if ev.final:  # its LaneDone comes next, with no step to compute: pass it on now, not when the lane's turn
                continue  # comes again (paced: once every other lane has caught up with its tokens)
        return True


def with_cpu_wait(events: Iterator[object], waits: CpuWait) -> Iterator[object]:
    """A lane's events, its LaneDone carrying ``cpu_wait_s``: the run-queue delay of the worker's threads (`waits`)
    while this lane's iterator computed, from its LaneStarted on (engine loading before it is not counted)."""
    total = 0.0
    started = False
    while True:
        w0 = waits.read()
        try:
            ev = next(events)
        except StopIteration:
            return
        w1 = waits.read()
        if started and w0 is not None and w1 is not None:
            total += w1 - w0
        if isinstance(ev, LaneStarted):
            started = True
        elif isinstance(ev, LaneDone) and w1 is not None and isinstance(ev.stats, LaneStats):
            ev = dataclasses.replace(ev, stats=dataclasses.replace(ev.stats, cpu_wait_s=round(total, 4)))
        yield ev
