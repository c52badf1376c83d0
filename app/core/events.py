"""Events that flow from the speculative loop (through the worker) to every display.

Only these immutable, picklable snapshots cross threads and processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from app.core.costs import CostProfile

__all__ = [
    "TargetKind",
    "TreeStep",
    "StepEvent",
    "Progress",
    "LaneStarted",
    "LaneDone",
    "RunError",
    "LogEvent",
    "ProfileReady",
    "Event",
]

TargetKind = Literal["correction", "bonus", "baseline", "library"]


@dataclass(frozen=True, slots=True)
class TreeStep:
    """The token tree a step verified (tree drafting): node tokens, each node's parent (−1: the root, the last token
    before the step), the accepted path (node indices from the root down) and each node's text.

    Attributes:
        q: the drafter's probability of each node's token given its ancestors (empty: not known).
        searches: for a tree merged from several trees (the setup finder's calibrations of ReDrafter heads and
            dynamic trees), each node's mask of the trees that hold it (app.core.tuning.search_bit, tree_bit); empty
            otherwise.
    """

    ids: tuple[int, ...]
    parents: tuple[int, ...]
    path: tuple[int, ...]
    pieces: tuple[str, ...] = ()  # each node's text (after its ancestors), filled in by the recorder
    q: tuple[float, ...] = ()
    searches: tuple[int, ...] = ()

    @property
    def depth(self) -> int:
        """The deepest node's depth (the root's children are at depth 1)."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return max(d, default=0)


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One step of one lane: a target forward pass verifying a draft.

    Attributes:
        lane_id: the lane this step belongs to.
        step: 0-based step index within the lane.
        drafted_ids: draft tokens proposed this step (k_t of them).
        accepted_count: a_t, the leading drafted tokens the target kept.
        target_id: the token the target itself emitted (correction or bonus); None when the step
            ended at an accepted EOS or at the token limit before the target token.
        target_kind: "correction" (a_t < k_t), "bonus" (all accepted), "baseline" (nothing drafted),
            "library" (a library lane: tokens only, drafting unknown).
        t_draft_s, t_verify_s, t_wall_s: drafting time, verification time, whole step time (seconds).
        pieces: decoded text of each emitted token (accepted drafts then target token), multi-byte safe:
            a token that completes no character has an empty piece.
        rejected_pieces: decoded text of each rejected draft token (display only).
        draft_probs: q(d_i) for each drafted token, when known.
        target_probs: the target's probability of each accepted draft, of the first rejected draft (if any),
            then of the target token, when known.
        t_s: seconds since the lane's decode started, at the end of this step (lane clock).
        emitted_ids: ids emitted this step (a_t accepted drafts + target token, possibly truncated).
        drafted_count: k_t when a backend reports how many tokens it drafted but not which (TensorRT-LLM's
            LLM API): then drafted_ids is () and displays say "rejected ids unavailable". None means
            k_t = len(drafted_ids).
        why: why the drafter drafted k_t tokens (k=auto: the predicted tokens and time per step with and
            without drafting), for tooltips; "" when the setup's k is fixed.
        tree: the token tree verified this step (tree drafting), else None. Then k_t (`drafted_count`) is its node
            count, accepted_count the accepted path's length, and drafted_ids the accepted path followed by the
            draft's first choices below it (the rejected line shown inline).
        correction_rank: a chain step the target corrected, drafted by a greedy draft model: the rank of the target's
            token among the draft's ALTS best tokens at the rejected position (2: the draft's second choice; 0: not
            among them); None otherwise. What a token tree that wide there would have caught: the setup finder
            prices static trees with it (app.core.tuning).
        final: this is the lane's last step — it reached an EOS or the token limit — so its LaneDone follows with no
            other step computed (the scheduler passes it on at once: app.worker.scheduler). False on every other step,
            and on the last step of a lane that ends otherwise (stopped, or a backend that reports its end later).
    """

    lane_id: str
    step: int
    drafted_ids: tuple[int, ...]
    accepted_count: int
    target_id: int | None
    target_kind: TargetKind
    t_draft_s: float
    t_verify_s: float
    t_wall_s: float
    emitted_ids: tuple[int, ...] = ()
    pieces: tuple[str, ...] = ()
    rejected_pieces: tuple[str, ...] = ()
    draft_probs: tuple[float, ...] | None = None
    target_probs: tuple[float, ...] | None = None
    t_s: float = 0.0
    drafted_count: int | None = None
    why: str = ""
    tree: TreeStep | None = None
    correction_rank: int | None = None
    final: bool = False

    @property
    def k(self) -> int:
        """k_t, the number of drafted tokens (known even when their ids are not)."""
        return self.drafted_count if self.drafted_count is not None else len(self.drafted_ids)

    @property
    def rejected_ids(self) -> tuple[int, ...]:
        return self.drafted_ids[self.accepted_count :]

    @property
    def accepted_ids(self) -> tuple[int, ...]:
        return self.drafted_ids[: self.accepted_count]


@dataclass(frozen=True, slots=True)
class Progress:
    """Long work (conversion, weight loading, benchmark) advancing: `done` of `total` (total 0 = unknown)."""

    task: str
    done: float
    total: float
    unit: str = ""


@dataclass(frozen=True, slots=True)
class LaneStarted:
    """A lane begins decoding; `prompt_ids` is what the target sees; `engine` says what runs it:
    "<engine name> · <backend> · <precision>" (e.g. "llamacpp-qwen2.5-coder-1.5b-instruct · llamacpp · Q4_K_M")."""

    lane_id: str
    setup: str
    prompt_id: str
    repeat: int
    prompt_ids: tuple[int, ...]
    prompt_text: str
    engine: str = ""


@dataclass(frozen=True, slots=True)
class LaneDone:
    """A lane finished; `stats` is the LaneStats of app.core.metrics."""

    lane_id: str
    stats: object
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class RunError:
    """A lane (or the whole run when lane_id is None) failed; `message` says what and how to fix it."""

    lane_id: str | None
    message: str
    kind: str = "error"
    details: str = ""


@dataclass(frozen=True, slots=True)
class LogEvent:
    level: str
    message: str
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileReady:
    """An engine's cost profile (app.core.costs.CostProfile), sent once per engine by the worker when it first has it
    (read from the cache or measured): reports and the GUI's cost plot collect them."""

    profile: CostProfile


Event = StepEvent | Progress | LaneStarted | LaneDone | RunError | LogEvent | ProfileReady
