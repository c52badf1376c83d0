"""One step accounting for every producer of a lane (our loop, transformers' reference lanes, TensorRT-LLM's
streams, llama.cpp, remote servers).

A lane runner reports raw facts per step — the tokens it would emit (accepted drafts, then the target token),
what it drafted (ids, or only a count), how many drafts the target kept, and how long the phases took — to a
:class:`LaneRecorder`. The recorder alone applies the rules of the glossary (DESIGN.md):

* truncation at the first EOS and at the token limit (an EOS among the accepted drafts ends the step there,
  with no target token);
* the target kind: ``baseline`` when nothing was drafted, ``bonus`` when every draft was kept, else
  ``correction`` (``library`` for lanes that report tokens only);
* text pieces (multi-byte safe, through the engine's incremental detokenizer) and rejected-draft text;
* step 0 is the prefill: its time is ``prefill_s``; ``t_draft_s``, ``t_verify_s`` and ``draft_forwards`` of
  LaneStats count the decode steps (1…) only; a draft that reads the prompt in a later step (k=auto's draft reads
  it in the first step that drafts) has that reading counted in ``prefill_s`` too (``StepFacts.t_read_s``), so c is
  a draft forward's cost in every lane;
* α, τ and per-position counts (through :class:`~app.core.metrics.LaneAccumulator`).

It builds every StepEvent and the lane's LaneStats, so these are computed in one place.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from app.core.costs import LaneCosts
from app.core.events import LaneDone, StepEvent, TargetKind, TreeStep
from app.core.metrics import LaneAccumulator, LaneStats

if TYPE_CHECKING:
    from app.core.setups import Sampling

#: A step computed in-process that lasted over STALL_MIN_S seconds while the process got less than STALL_CPU_SHARE
#: of that in CPU time was stalled (kill -STOP, swapping, a starved VM): CPU inference keeps >= 1 core busy.
STALL_MIN_S = 1.0
STALL_CPU_SHARE = 0.25

__all__ = ["STALL_MIN_S", "STALL_CPU_SHARE", "Detokenizer", "LaneEngine", "LaneRunner", "LaneRecorder", "StepFacts", "target_kind", "drive"]


class Detokenizer(Protocol):
    """What the recorder needs of an engine's incremental detokenizer (app.engines.base.IncrementalDetokenizer)."""

    def push(self, token_id: int) -> str: ...

    def peek(self, ids: list[int]) -> list[str]: ...


class LaneEngine(Protocol):
    """What the scheduler needs of the engine a lane runs on: prompt encoding, EOS, detokenizing."""

    name: str
    eos_ids: frozenset[int]

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]: ...

    def detokenizer(self, prompt_ids: list[int]) -> Any: ...


class LaneRunner(Protocol):
    """Every way of producing a lane (our loop, a library's own `generate`, a TensorRT-LLM stream, a
    llama.cpp context, a remote server) implements this: it computes or streams tokens and reports each step's
    raw facts to the recorder, yielding the StepEvents the recorder returns. It checks `cancelled()` between
    steps (then `rec.stop("cancelled")` and return). It never builds events or stats itself.

    Attributes:
        engine: the engine whose tokenizer encodes the prompt and decodes the output (the target, or the
            lane's own engine for kinds like `trtllm:`).
    """

    @property
    def engine(self) -> LaneEngine: ...

    def run(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool]) -> Iterator[StepEvent]: ...


def drive(runner: LaneRunner, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling,
          cancelled: Callable[[], bool] = lambda: False) -> Iterator[StepEvent | LaneDone]:
    """Run a lane to its end: the runner's StepEvents, then the recorder's LaneDone (with LaneStats)."""
    yield from runner.run(rec, prompt_ids, sampling, cancelled)
    yield rec.finish()


def target_kind(drafted: int, accepted: int) -> TargetKind:
    """The glossary's kind of a step's target token: baseline (nothing drafted), bonus (all kept), correction."""
    if drafted == 0:
        return "baseline"
    return "bonus" if accepted >= drafted else "correction"


ProbsArg = Sequence[float] | Callable[[int, int | None], Sequence[float]] | None


@dataclasses.dataclass(frozen=True)
class StepFacts:
    """What a lane runner knows of one step (one target forward), as it produced it; :meth:`LaneRecorder.step`
    applies the rules.

    Attributes:
        emitted: the step's tokens: `accepted` kept drafts, then the target token (when `has_target`). Truncated by
            the recorder at the first EOS and at the token limit.
        accepted: a_t, how many leading drafts the target kept.
        drafted_ids: the drafts, when known; `drafted_count` when only their number is (then ids are ()).
        kind: force the target kind ("library" for token-only lanes); default by :func:`target_kind`.
        t_draft_s, t_verify_s: phase times of this step (seconds).
        t_read_s: of t_draft_s, the draft reading the prompt (not a draft forward): a decode step's is counted in the
            lane's prefill_s, not in its t_draft_s (the step's event keeps the whole t_draft_s it took).
        t_wall_s: the whole step's time; or give `t_start` (the runner's clock at the step's start) and the wall
            time is measured when the event is built, bookkeeping included.
        draft_forwards: draft model forwards this step (counted for decode steps only, as c is per forward).
        draft_probs: q(d_i) per drafted token, when known.
        target_probs: the target's probabilities (kept drafts, first rejected, target token), or a function of the
            final (accepted, target_id) computed after truncation.
        why: the drafting policy's reason for this step's k (k=auto: predicted gain), for tooltips.
        tree: the token tree verified (tree drafting): then `drafted_count` is its node count and `drafted_ids` the
            accepted path and the rejected line below it (see StepEvent.tree).
        correction_rank: where the target rejected a draft, its token's rank among the draft's best tokens there
            (see StepEvent.correction_rank).
    """

    emitted: Sequence[int]
    accepted: int = 0
    drafted_ids: Sequence[int] = ()
    drafted_count: int | None = None
    has_target: bool = True
    kind: TargetKind | None = None
    t_draft_s: float = 0.0
    t_verify_s: float = 0.0
    t_read_s: float = 0.0
    t_wall_s: float | None = None
    t_start: float | None = None
    draft_forwards: int = 0
    draft_probs: Sequence[float] | None = None
    target_probs: ProbsArg = None
    why: str = ""
    tree: TreeStep | None = None
    correction_rank: int | None = None


class LaneRecorder:
    """Turns what a lane runner reports into StepEvents and, at the end, one LaneDone with LaneStats.

    Args:
        lane_id, setup, prompt_id, repeat: identify the lane (copied into events and stats).
        max_new_tokens: the token limit; emitted tokens past it are dropped.
        eos_ids: end-of-sequence ids of the lane's engine; the first one emitted ends the lane.
        detokenizer: the engine's incremental detokenizer for this prompt (None: no text, tests).
        clock: seconds, monotonic; used when a step gives `t_start` instead of its wall time.
    """

    def __init__(
        self,
        lane_id: str,
        setup: str,
        prompt_id: str,
        repeat: int,
        max_new_tokens: int,
        eos_ids: Collection[int],
        detokenizer: Detokenizer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.lane_id = lane_id
        self.setup = setup
        self.prompt_id = prompt_id
        self.repeat = repeat
        self.max_new_tokens = max_new_tokens
        self.eos_ids = frozenset(eos_ids)
        self.detok = detokenizer
        self.clock = clock
        self.acc = LaneAccumulator()
        self.output_ids: list[int] = []
        self.text: list[str] = []
        self.stop_reason = "length"
        self.lane_t = 0.0
        self.prefill_s = 0.0
        self.ttft_s: float | None = None
        self.draft_forwards = 0
        self.t_draft_s = 0.0  # decode steps only
        self.t_verify_s = 0.0
        self.stall_s = 0.0  # wall time of steps during which the process barely ran (stopped, swapped, starved)
        self._cpu0: float | None = None
        self._overrides: dict = {}
        self.notes: list[str] = []  # said once each in LaneStats.notes (see note())
        self.k_hist: list[int] = []  # decode steps by drafted count
        self.costs: LaneCosts | None = None  # set by runners that know their engines' cost profiles (theory)
        self.tree_steps = 0  # steps that verified a token tree

    # --- state --------------------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        return self.acc.steps

    @property
    def remaining(self) -> int:
        """Tokens the lane may still emit."""
        return max(0, self.max_new_tokens - len(self.output_ids))

    @property
    def done(self) -> bool:
        """True once the lane hit EOS, its token limit, or was stopped."""
        return self.stop_reason != "length" or self.remaining == 0

    def begin_step(self) -> float:
        """Mark the start of a step computed in this process; returns the clock. The step's wall time is then
        checked against the process CPU time it got: a step of over STALL_MIN_S seconds that ran on the CPU for
        less than STALL_CPU_SHARE of it was stalled (the process was stopped or starved), and its time is counted
        in `stall_s`, so a speedup built on it is flagged rather than reported."""
        self._cpu0 = time.process_time()
        return self.clock()

    def note_stall(self, wall_s: float, cpu_s: float) -> None:
        """Check one stretch of in-process work (wall vs process CPU seconds) for a stall."""
        if wall_s > STALL_MIN_S and cpu_s < STALL_CPU_SHARE * wall_s:
            self.stall_s += wall_s

    def stop(self, reason: str) -> None:
        """End the lane early: "cancelled", "engine_limit", or "eos" (a backend that stopped at EOS itself)."""
        if self.stop_reason == "length":
            self.stop_reason = reason

    # --- steps --------------------------------------------------------------------------------------
    def step(self, f: StepFacts) -> StepEvent:
        """Record one step (one target forward) from its raw facts and return its StepEvent."""
        k, a, em, target_id, kind, lead = self._truncate(f)
        tree = f.tree
        pieces: list[str] = []
        rejected_pieces: list[str] = []
        if self.detok is not None and tree is not None and not tree.pieces:
            tree = dataclasses.replace(tree, pieces=self._tree_pieces(tree))
        if self.detok is not None:
            pieces = [self.detok.push(t) for t in em[:lead]]
            if len(f.drafted_ids) > a:
                rejected_pieces = list(self.detok.peek(list(f.drafted_ids[a:])))
            if target_id is not None:
                pieces.append(self.detok.push(target_id))
        t_probs = f.target_probs(a, target_id) if callable(f.target_probs) else f.target_probs
        t_wall_s = self._clock_step(f, k)
        if em and self.ttft_s is None:
            self.ttft_s = self.lane_t
        self.output_ids.extend(em)
        self.text.extend(pieces)
        ev = StepEvent(
            lane_id=self.lane_id,
            step=self.acc.steps,
            drafted_ids=tuple(f.drafted_ids),
            accepted_count=a,
            target_id=target_id,
            target_kind=kind,
            t_draft_s=f.t_draft_s,
            t_verify_s=f.t_verify_s,
            t_wall_s=t_wall_s,
            emitted_ids=tuple(em),
            pieces=tuple(pieces),
            rejected_pieces=tuple(rejected_pieces),
            draft_probs=tuple(f.draft_probs[:k]) if f.draft_probs else None,
            target_probs=tuple(t_probs) if t_probs is not None else None,
            t_s=self.lane_t,
            drafted_count=k if (k and (not f.drafted_ids or tree is not None)) else None,
            why=f.why,
            tree=tree,
            # only where the step still ends on the target's correction (not cut at an EOS or the token limit)
            correction_rank=f.correction_rank if target_id is not None and a == f.accepted < k else None,
            final=self.done,
        )
        self.acc.add(ev)
        if tree is not None:
            self.tree_steps += 1
        return ev

    def _truncate(self, f: StepFacts) -> tuple[int, int, list[int], int | None, TargetKind, int]:
        """The glossary's rules on one step: cut at the token limit and at the first EOS (an EOS among the accepted
        drafts ends the step with no target token), and its kind. Returns (drafted k, accepted a, emitted tokens,
        target token, target kind, tokens before the target token)."""
        k = f.drafted_count if f.drafted_count is not None else len(f.drafted_ids)
        a = min(f.accepted, k)
        em = list(f.emitted[: self.remaining])
        target_id: int | None = em[a] if f.has_target and len(em) > a else None
        if len(em) <= a:
            a, target_id = len(em), None
        for j, tok in enumerate(em):
            if tok in self.eos_ids:
                if j < a:
                    a, target_id = j + 1, None
                em = em[: j + 1]
                self.stop_reason = "eos"
                break
        lead = a
        kind = f.kind
        if kind == "library":  # tokens only: the chunk's last token stands for the target token
            a, k = 0, 0
            target_id = em[-1] if em else None
            lead = max(0, len(em) - 1)
        elif kind is None:
            kind = target_kind(k, a)
        return k, a, em, target_id, kind, lead

    def _clock_step(self, f: StepFacts, k: int) -> float:
        """Add the step's times to the lane's clock (step 0 is the prefill; the others are decode steps) and check
        it for a stall; returns its wall time."""
        t_wall_s = f.t_wall_s
        if t_wall_s is None:
            t_wall_s = (self.clock() - f.t_start) if f.t_start is not None else f.t_draft_s + f.t_verify_s
        if self._cpu0 is not None:
            self.note_stall(t_wall_s, time.process_time() - self._cpu0)
            self._cpu0 = None
        self.lane_t += t_wall_s
        if self.acc.steps == 0:
            self.prefill_s = t_wall_s
        else:
            read = min(max(0.0, f.t_read_s), f.t_draft_s)
            self.prefill_s += read  # the draft reading the prompt, whenever it does (StepFacts.t_read_s)
            self.t_draft_s += f.t_draft_s - read
            self.t_verify_s += f.t_verify_s
            self.draft_forwards += f.draft_forwards
            if k >= len(self.k_hist):  # verify width k + 1, whatever was kept of it
                self.k_hist.extend([0] * (k + 1 - len(self.k_hist)))
            self.k_hist[k] += 1
        return t_wall_s

    def _tree_pieces(self, tree: TreeStep) -> tuple[str, ...]:
        """Each node's text after the sequence so far and its ancestors (display only)."""
        d: Any = self.detok
        if not all(hasattr(d, a) for a in ("ids", "prefix", "read")):  # another detokenizer: each node's line anew
            out: list[str] = []
            for i in range(len(tree.ids)):
                line, j = [], i
                while j >= 0:
                    line.append(tree.ids[j])
                    j = tree.parents[j]
                out.append(d.peek(line[::-1])[-1])
            return tuple(out)
        # IncrementalDetokenizer: one push per node, from its parent's saved state (parents come first)
        saved = (list(d.ids), d.prefix, d.read)
        states = {-1: saved}
        pieces: list[str] = []
        try:
            for i, (tok, par) in enumerate(zip(tree.ids, tree.parents, strict=True)):
                ids, d.prefix, d.read = states[par]
                d.ids = list(ids)
                pieces.append(d.push(tok))
                states[i] = (d.ids, d.prefix, d.read)
        finally:
            d.ids, d.prefix, d.read = saved
        return tuple(pieces)

    # --- the end ------------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """Something the reader of this lane's results must know (kept once, in LaneStats.notes)."""
        if text not in self.notes:
            self.notes.append(text)

    def override(self, **fields) -> None:
        """Replace measured totals in the final stats, for runners that know better: `wall_s` and `ttft_s` of a
        reference lane timed around the library call, or (`drafted`, `accepted`) from a backend's per-request
        counters (with `counts_source="engine"`, or "streamed" when inferred from streamed chunks); `library=True`
        for token-only lanes."""
        allowed = {"wall_s", "ttft_s", "prefill_s", "drafted", "accepted", "library", "t_draft_s", "t_verify_s", "counts_source"}
        bad = set(fields) - allowed
        if bad:
            raise TypeError(f"cannot override {sorted(bad)}")
        self._overrides.update(fields)

    def stats(self) -> LaneStats:
        """The lane's LaneStats from everything recorded so far."""
        acc = self.acc
        d: dict[str, Any] = dict(
            setup=self.setup,
            prompt_id=self.prompt_id,
            repeat=self.repeat,
            new_tokens=len(self.output_ids),
            wall_s=self.lane_t,
            ttft_s=self.ttft_s if self.ttft_s is not None else self.lane_t,
            prefill_s=self.prefill_s,
            steps=acc.steps,
            drafted=acc.drafted,
            accepted=acc.accepted,
            draft_forwards=self.draft_forwards,
            t_draft_s=self.t_draft_s,
            t_verify_s=self.t_verify_s,
            output_ids=tuple(self.output_ids),
            output_text="".join(self.text),
            per_position_drafted=tuple(acc.per_position_drafted),
            per_position_accepted=tuple(acc.per_position_accepted),
            stop_reason=self.stop_reason,
        )
        first = acc.first
        d["step0_drafted"] = first.k if first is not None else 0
        d["stall_s"] = self.stall_s
        d["notes"] = tuple(self.notes)
        d["decode_k_hist"] = tuple(self.k_hist)
        d["costs"] = self.costs
        d["tree_steps"] = self.tree_steps
        d.update(self._overrides)
        return LaneStats(**d)

    def finish(self) -> LaneDone:
        """The lane's last event."""
        return LaneDone(self.lane_id, self.stats(), cancelled=self.stop_reason == "cancelled")
