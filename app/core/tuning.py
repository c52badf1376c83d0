"""Which setup is fastest here: one model of what a speculative step buys and costs, shared by `k=auto`
(app.speculative.policy) and the setup finder (`python -m app tune`, app.commands.tune).

**The step model.** In units of the target's one-token forward T(1), a step that drafts k tokens in `forwards`
draft forwards costs

    units(k, forwards) = V(k + 1) + forwards · c + o

and emits 1 + (drafts accepted) tokens: V is the target's verify-cost curve (its cost profile, app.core.costs), c a
draft forward over T(1), o the step's time outside the forwards (the loop's own work) over T(1). A baseline step costs
1 + o_base. Working in T(1) units makes every decision scale-free: a machine that is slower for a while (another
process took a core) changes no decision, where a model in seconds would read it as "verification got expensive".
:class:`StepPrice` holds V, c and o; `k=auto` maximises expected tokens per unit with it step by step, the finder
prices whole setups with it.

**Pricing a setup from a calibration run.** A calibration lane drafts long (k = CAL_K, a low cumulative stop
CAL_CSTOP) and records each step's draft confidences q_1…q_n and how many of them the target kept (a). A step that
starts at position s of the answer so tells positions s … s + a: the draft's confidence in its own token there given
the answer's true prefix, and whether the target kept it (:func:`positions`). With greedy decoding the draft's token
and confidence at a position depend only on that prefix, so any fixed rule (k, stop, cstop) can be run over the
answer position by position — its steps starting where *its* drafts end, not where the calibration's did
(:func:`replay_positions`). Lookup drafters, whose proposals continue an earlier match, are replayed proposal by
proposal (:func:`replay_step`). A ReDrafter head drafts from the target's hidden state, which the records do not
hold, so its calibration lane verifies the union of every beam tree up to CAL_BEAMS × CAL_DEPTH and tags each node
with the trees that hold it: each tree's nodes and kept drafts on that step follow exactly (:func:`replay_beams`),
and the head's steps are priced where the calibration's started. Dynamic token trees (EAGLE-2: which branches grow
depends on the draft's confidence in tokens off the answer's path, which a chain calibration never sees) are priced
the same way from a calibration lane verifying every one up to DYN_NODES × DYN_DEPTH × DYN_BRANCH
(:func:`tree_bit`). A prompt's predicted wall is its prefill plus its remaining tokens at the replayed tokens per
step and units per step (:func:`price_candidate`). Speedups pool like the bench's: Σ baseline wall / Σ predicted
wall.

**The verify curve is this run's.** The cost profile is measured once per machine, perhaps while it was busier; the
calibration lanes' own verify times (over the baseline's forward on the same prompt) move the profile's curve by
the extra cost per token that verifies of about each width showed, V'(n) = V(n) + (n − 1)·δ(n) (:func:`fitted_curve`;
on a straight profile the same as scaling V(n) − 1; :func:`verify_scale` is the overall ratio quoted for people),
and the finder prices with V'.

**Break-even.** :func:`break_even_alpha` is the acceptance a drafter of cost c needs (i.i.d., best k) to beat a
given speedup with this V; :func:`verify_for_gain` the V(n) a priced setup would need to go 10 % faster.

Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.core.costs import NARROW, verify_at

__all__ = [
    "CAL_K",
    "CAL_CSTOP",
    "GRID_K",
    "GRID_CSTOP",
    "GRID_STOP",
    "StepPrice",
    "CalStep",
    "LaneCal",
    "PromptCal",
    "Candidate",
    "Priced",
    "replay_step",
    "replay_beams",
    "search_bit",
    "SEARCH_DEPTHS",
    "beam_grid",
    "dynamic_grid",
    "replay_masked",
    "tree_bit",
    "DYN_NODES",
    "DYN_BRANCH",
    "DYN_DEPTH",
    "CAL_BEAMS",
    "CAL_DEPTH",
    "positions",
    "replay_positions",
    "verify_scale",
    "fitted_curve",
    "price_candidate",
    "grid",
    "tree_grid",
    "tree_nodes",
    "replay_tree",
    "TREE_SHAPES",
    "rank",
    "winners",
    "expected_tokens",
    "chain_speedup",
    "break_even_alpha",
    "verify_for_gain",
    "verify_gain_text",
    "why",
]

#: the calibration lanes' longest proposal, and their cumulative stop (the product of the draft's confidences):
#: long enough to price every grid setup up to k = 24, short enough that a calibration step is not mostly waste
CAL_K = 24
CAL_CSTOP = 0.02
#: a ReDrafter head's calibration lane verifies every beam tree up to this wide and deep at once (its grid's limits:
#: on a 2-core CPU 2 × 2 was the fastest measured and 4 × 4 already slower; a GPU affords wider trees than priced here)
CAL_BEAMS = 4
CAL_DEPTH = 4


@dataclass(frozen=True)
class StepPrice:
    """Costs of one step in units of the target's one-token forward T(1).

    Attributes:
        verify: V(1) … V(N) of the target (V(1) = 1); past N the last segment is extended.
        c: one draft forward (one token) over T(1); 0 for lookup drafters.
        o: this setup's per-step time outside the forwards, over T(1).
        o_base: the baseline's per-step time outside its forward, over T(1).
    """

    verify: tuple[float, ...]
    c: float = 0.0
    o: float = 0.0
    o_base: float = 0.0

    def v(self, n: int) -> float:
        return verify_at(self.verify, n)

    def units(self, drafted: int, forwards: int | None = None) -> float:
        """One step that verifies `drafted` drafts made in `forwards` draft forwards (default: one per draft)."""
        return self.v(drafted + 1) + (drafted if forwards is None else forwards) * self.c + self.o

    def marginal_verify(self) -> float:
        """One more token in a long forward (the prompt's, which step 0's drafts join): the curve's last slope."""
        n = len(self.verify)
        return max(0.0, self.v(n) - self.v(n - 1)) if n > 1 else 0.0

    @property
    def base_units(self) -> float:
        """A baseline step: one forward and its overhead."""
        return 1.0 + self.o_base

    def speedup(self, tokens_per_step: float, units_per_step: float) -> float:
        """Decode speedup of a setup emitting `tokens_per_step` in `units_per_step` over the baseline."""
        return (tokens_per_step / units_per_step) * self.base_units if units_per_step > 0 else float("nan")


def expected_tokens(cum: Sequence[float], j: int) -> float:
    """Expected tokens of a step that verifies the first j drafts, P_l = P(the first l drafts are all accepted):
    1 + Σ_{l≤j} P_l (the target's own token always comes)."""
    return 1.0 + sum(cum[:j])


# --- calibration records ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CalStep:
    """One decode step of a calibration lane: the draft's confidence in each drafted token (empty for lookup
    drafters, which propose without one), how many tokens the drafter offered, how many the target kept."""

    offered: int
    accepted: int
    q: tuple[float, ...] = ()
    #: the calibration's proposal ended on its own (k or its cumulative stop), not on an end-of-sequence token
    open_end: bool = True
    #: the target's measured verify of this step (offered + 1 tokens), seconds; 0 when unknown
    verify_s: float = 0.0
    #: where the target rejected a draft: its token's rank among the draft's best there (StepEvent.correction_rank;
    #: 0: below them); None: unknown, or nothing rejected
    rank: int | None = None
    #: a step of a calibration that verified every tree at once (ReDrafter heads: app.speculative.redrafter.beam_trees;
    #: dynamic trees: app.speculative.tree_drafter): the verified tree's parents, each node's mask of the trees holding
    #: it, the accepted path; q then holds each node's drafter probability
    parents: tuple[int, ...] = ()
    searches: tuple[int, ...] = ()
    path: tuple[int, ...] = ()
    #: draft forwards this step (0: not recorded)
    forwards: int = 0


@dataclass(frozen=True)
class LaneCal:
    """A calibration lane on one prompt: its decode steps, its step 0 (prompt forward, which verified the first
    proposal too), and its measured times (seconds).

    Attributes:
        steps: decode steps (after step 0).
        step0: step 0's proposal and verdict (None: it drafted nothing, as k=auto does).
        prefill_s: step 0's wall time (the target's and the draft's prompt forwards, the first proposal).
        draft_s_per_forward: measured seconds of one draft forward (decode steps; 0 for lookups).
        overhead_s: measured per-step seconds outside the forwards (decode steps).
    """

    steps: tuple[CalStep, ...]
    step0: CalStep | None
    prefill_s: float
    draft_s_per_forward: float
    overhead_s: float


@dataclass(frozen=True)
class PromptCal:
    """One prompt of a calibration run: the baseline lane's measurements and each drafter's calibration lane.

    Attributes:
        new_tokens: tokens the baseline emitted (greedy: every setup emits as many).
        base_wall_s, base_prefill_s: the baseline's wall and step 0; base_step_s: its mean decode forward (T(1) in
            this run); base_overhead_s: its mean per-step time outside the forward.
        lanes: drafter name → its calibration lane.
    """

    prompt_id: str
    category: str
    new_tokens: int
    base_wall_s: float
    base_prefill_s: float
    base_step_s: float
    base_overhead_s: float
    lanes: dict[str, LaneCal] = field(default_factory=dict)


# --- candidates ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """A fixed setup priced from a drafter's calibration: at most k drafts, ending early after a draft with
    confidence < stop or once the product of the confidences < cstop (model drafters only).

    Attributes:
        drafter: the calibration lane's drafter name (its setup without k/stop/cstop, e.g. `draft:qwen…,dtype=int8`
            or `ngram`); setup: the setup string this candidate runs as (a tree's: `tree:qwen…,shape=3x1x1,…`).
    """

    drafter: str
    setup: str
    k: int
    stop: float = 0.0
    cstop: float = 0.0
    #: a static token tree's branch counts per depth (k: its depth), priced from the same chain calibration
    #: (:func:`replay_tree`); () for a chain
    shape: tuple[int, ...] = ()
    #: k=auto: priced by replaying the policy itself over the calibration (app.speculative.replay); k is its cap
    auto: bool = False
    #: a ReDrafter head's beam search this wide (k: its depth, cstop: its path-probability cut), priced from the
    #: head's calibration (:func:`replay_beams`); 0 otherwise
    beams: int = 0
    #: a dynamic token tree's (nodes, branch) (k: its depth), priced from its own calibration (every dynamic tree at
    #: once, :func:`replay_masked`); () otherwise
    dynamic: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        return "tree" if self.shape or self.dynamic else self.drafter.split(":", 1)[0]

    @property
    def bit(self) -> int:
        """The mask bit of this tree in its calibration's steps (ReDrafter beams, dynamic trees; 0: neither)."""
        if self.beams:
            return search_bit(self.beams, self.k)
        return tree_bit(self.dynamic[1], self.k, self.dynamic[0]) if self.dynamic else 0


#: ReDrafter calibration: a node's mask has :func:`search_bit`(w, d) set where the beam search w wide, stopped after
#: d levels, holds it (d ≤ SEARCH_DEPTHS, the setup's limit)
SEARCH_DEPTHS = 16


def search_bit(beams: int, depth: int) -> int:
    """The mask bit of the ReDrafter beam search `beams` wide and `depth` deep (app.speculative.redrafter.beam_trees)."""
    return 1 << ((beams - 1) * SEARCH_DEPTHS + depth - 1)


#: the node budgets priced for dynamic trees (`tree:…,nodes=N,depth=D,branch=B`), branches 2 … DYN_BRANCH, depths
#: 1 … DYN_DEPTH; the calibration lane verifies every such tree at once (app.speculative.tree_drafter)
DYN_NODES = (4, 8, 12, 16, 24, 32)
DYN_BRANCH = 4
DYN_DEPTH = 6


def tree_bit(branch: int, depth: int, nodes: int) -> int:
    """The mask bit of the dynamic tree (`nodes` in DYN_NODES, `depth` ≤ SEARCH_DEPTHS) in a calibration step."""
    return 1 << (((branch - 1) * SEARCH_DEPTHS + depth - 1) * len(DYN_NODES) + DYN_NODES.index(nodes))


def replay_beams(s: CalStep, beams: int, depth: int, cstop: float = 0.0) -> tuple[int, int]:
    """What a ReDrafter head's tree `beams` wide and `depth` deep, without the nodes whose path probability is below
    `cstop`, verifies and keeps on a recorded calibration step: (nodes, accepted). The calibration verified the union
    of every such tree (app.speculative.redrafter.beam_trees) and tagged each node with the trees that hold it; with
    greedy decoding a tree keeps the longest prefix of the union's accepted path that it holds. A step recorded
    without masks (a chain: the union had one beam) counts for every tree as its first `depth` drafts."""
    return replay_masked(s, search_bit(beams, depth), depth, cstop)


def replay_masked(s: CalStep, bit: int, depth: int, cstop: float = 0.0) -> tuple[int, int]:
    """:func:`replay_beams` for any tree a calibration step tagged with `bit` (ReDrafter beams, dynamic trees:
    :func:`tree_bit`); `depth` is the tree's, for steps recorded without masks."""
    if not s.searches:
        return min(depth, s.offered), min(depth, s.accepted)
    keep: list[bool] = []
    pp: list[float] = []
    for i, par in enumerate(s.parents):
        p = (s.q[i] if i < len(s.q) else 1.0) * (pp[par] if par >= 0 else 1.0)
        pp.append(p)
        keep.append(bool(s.searches[i] & bit) and p >= cstop and (par < 0 or keep[par]))
    a = 0
    for j in s.path:
        if not keep[j]:
            break
        a += 1
    return sum(keep), a


def replay_step(s: CalStep, k: int, stop: float = 0.0, cstop: float = 0.0) -> tuple[int, int, bool]:
    """What a (k, stop, cstop) rule drafts on a recorded proposal: (drafted, accepted, beyond) — `beyond`: it would
    have drafted past the end of the recorded proposal (priced separately). Lookup drafters are priced this way."""
    n, p = 0, 1.0
    limit = min(k, s.offered)
    while n < limit:
        qi = s.q[n] if n < len(s.q) else 1.0
        n += 1
        p *= qi
        if s.q and (qi < stop or p < cstop):
            return n, min(s.accepted, n), False
    beyond = n < k and s.open_end and n == s.offered and bool(s.q)
    return n, min(s.accepted, n), beyond


@dataclass(frozen=True)
class Position:
    """What the calibration learnt about one position of the answer (a model drafter, greedy).

    Attributes:
        q: the draft's confidence in its own token here, given the answer's true prefix; None where the draft never
            proposed at this position (the target's bonus token after a fully kept proposal).
        kept: the target kept the draft's token here.
        after: where it was rejected: the confidences of the drafts the calibration made past it (their cost only).
        more: the calibration's proposal went on past `after` (it ended on its k or cumulative stop, not an EOS).
        rank: the true token's rank among the draft's best tokens here: 1 where kept; where rejected the target's
            token's (0: below the draft's best ALTS; None: not recorded) — what a token tree that wide would catch.
    """

    q: float | None
    kept: bool
    after: tuple[float, ...] = ()
    more: bool = False
    rank: int | None = None


def positions(lane: LaneCal) -> list[Position]:
    """The answer position by position, from a model drafter's calibration steps: a step that started at position s
    and kept a drafts tells positions s … s + a − 1 (kept) and s + a (rejected, or the target's bonus token)."""
    out: list[Position] = []
    if lane.step0 is None:
        out.append(Position(None, True))
    for s in ([lane.step0] if lane.step0 is not None else []) + list(lane.steps):
        a = min(s.accepted, len(s.q))
        out.extend(Position(q, True, rank=1) for q in s.q[:a])
        if a < s.offered and a < len(s.q):
            out.append(Position(s.q[a], False, tuple(s.q[a + 1:]), s.open_end, s.rank))
        else:
            out.append(Position(None, True))
    return out


def replay_positions(seq: Sequence[Position], k: int, stop: float, cstop: float, first_rate: float,
                     start: int = 0) -> list[tuple[int, float]]:
    """A (k, stop, cstop) rule run over the answer's positions: (drafted, accepted) per step, the first step starting
    at `start`. With greedy decoding this is what the setup would do — the draft's token and confidence at a
    position depend only on the true prefix — except where the calibration has no record: a step reaching a
    bonus position ends there (the target emits its own token), one starting at one drafts a token kept at
    `first_rate` (the calibration's first drafts), and drafts past a rejection that outrun the calibration's own
    cost only what a plain-k rule would draft (k)."""
    out: list[tuple[int, float]] = []
    p, n = start, len(seq)
    while p < n:
        d, cum, a = 0, 1.0, -1
        while d < k and p + d < n:
            pos = seq[p + d]
            if pos.q is None:
                break
            d += 1
            cum *= pos.q
            ended = pos.q < stop or cum < cstop
            if not pos.kept:
                a = d - 1
                if not ended:
                    for qn in pos.after:
                        if d >= k:
                            break
                        d += 1
                        cum *= qn
                        if qn < stop or cum < cstop:
                            break
                    else:
                        if pos.more and not stop and not cstop:
                            d = k
                break
            if ended:
                break
        if a >= 0:
            out.append((d, float(a)))
            p += a + 1
        elif d == 0:  # starts where the calibration never drafted
            out.append((1, first_rate))
            p += 1
        else:
            out.append((d, float(d)))
            p += d + 1
    return out


def _caught(pos: Position, width: int) -> bool:
    """Whether a tree level of `width` branches holds the true token at this position: kept there, or the target's
    token among the draft's best `width` (an unrecorded rank counts as missed)."""
    return pos.kept or (pos.rank is not None and 0 < pos.rank <= width)


def _first_rate(seq: Sequence[Position], width: int = 1) -> float:
    """How often a step's first draft was kept in the calibration (`width` > 1: how often the true token was among
    the draft's best `width` there), with a weak prior of 0.5."""
    kept, n = 0.5, 1.0
    prev_end = True
    for pos in seq:
        if prev_end and pos.q is not None:
            n += 1
            kept += _caught(pos, width)
        prev_end = pos.q is None or not pos.kept
    return kept / n


def tree_nodes(shape: Sequence[int]) -> tuple[int, list[int]]:
    """A static tree's node count and the tokens of each draft forward that builds it: the root's context (1), then
    each level but the last (every node of a level is fed to draft its children)."""
    levels, n = [], 1
    for b in shape:
        n *= b
        levels.append(n)
    return sum(levels), [1, *levels[:-1]]


def replay_tree(seq: Sequence[Position], shape: Sequence[int], first_rate: float, start: int = 0) -> list[tuple[int, float]]:
    """A static token tree (branch counts per depth, every node of a level expanded: app.speculative.tree_drafter)
    run over the answer's positions: (nodes, accepted) per step. With greedy decoding the tree holds the true path to
    depth d exactly when the true token at each of its first d positions is among the draft's best `shape[i]` there
    given the true prefix — kept by the calibration (rank 1) or the target's correction ranked that high by the draft
    (Position.rank). A step that reaches a bonus position ends there; one that starts at one is kept at
    `first_rate` (the calibration's first positions caught by the root's width: :func:`_first_rate`)."""
    nodes, _ = tree_nodes(shape)
    out: list[tuple[int, float]] = []
    p, n = start, len(seq)
    while p < n:
        a = 0
        while a < len(shape) and p + a < n and seq[p + a].q is not None and _caught(seq[p + a], shape[a]):
            a += 1
        if a == 0 and seq[p].q is None:
            out.append((nodes, first_rate))
            p += 1
        else:
            out.append((nodes, float(a)))
            p += a + 1
    return out


def _tail_alpha(steps: Iterable[CalStep]) -> float:
    """Acceptance of the calibration's last draft where it was tested (the least confident ones: where its own
    cumulative stop ended it), with a weak prior of 0.3."""
    acc, n = 0.3, 1.0
    for s in steps:
        if s.q and s.open_end and s.offered and s.accepted >= s.offered - 1:
            n += 1
            acc += 1.0 if s.accepted == s.offered else 0.0
    return acc / n


@dataclass(frozen=True)
class Priced:
    """A candidate priced on a calibration: predicted walls per prompt, and the totals the table shows.

    Attributes:
        pred_wall_s: prompt id → predicted seconds; base_wall_s: prompt id → the baseline's measured seconds.
        alpha, tau: predicted α (Σ accepted / Σ drafted) and τ (tokens per step) over the replayed steps.
        mean_k: drafts per step; units: mean units per decode step; c, o: the StepPrice's.
    """

    candidate: Candidate
    pred_wall_s: dict[str, float]
    base_wall_s: dict[str, float]
    alpha: float | None
    tau: float
    mean_k: float
    units: float
    c: float
    o: float
    categories: dict[str, str] = field(default_factory=dict)

    def speedup(self, prompt_ids: Iterable[str] | None = None) -> float:
        ids = list(self.pred_wall_s) if prompt_ids is None else [p for p in prompt_ids if p in self.pred_wall_s]
        pred = sum(self.pred_wall_s[p] for p in ids)
        return sum(self.base_wall_s[p] for p in ids) / pred if pred > 0 else float("nan")

    def by_category(self) -> dict[str, float]:
        cats: dict[str, list[str]] = {}
        for p in self.pred_wall_s:
            cats.setdefault(self.categories.get(p, ""), []).append(p)
        return {c: self.speedup(ids) for c, ids in cats.items()}


def _decode_steps(cand: Candidate, lane: LaneCal) -> tuple[tuple[int, float], list[tuple[int, float]]]:
    """The candidate's step 0 and decode steps as (drafted, accepted) on one calibration lane: a model drafter's
    replayed position by position (:func:`replay_positions`; a tree's: :func:`replay_tree`, drafted = its nodes),
    a ReDrafter head's step by step (:func:`replay_beams`, drafted = its nodes), a lookup's proposal by proposal (:func:`replay_step`, drafts past a proposal paid in full and accepted at the
    calibration's tail rate)."""
    if cand.bit:  # every tree verified at once: each step replayed where the calibration's started
        n0, a0 = replay_masked(lane.step0, cand.bit, cand.k, cand.cstop) if lane.step0 is not None else (0, 0)
        return (n0, float(a0)), [(n, float(a)) for n, a in (replay_masked(s, cand.bit, cand.k, cand.cstop) for s in lane.steps)]
    if cand.shape:
        seq = positions(lane)
        rate = _first_rate(seq, cand.shape[0])
        if lane.step0 is None:
            return (0, 0.0), replay_tree(seq, cand.shape, rate, start=1)
        steps = replay_tree(seq, cand.shape, rate)
        return steps[0], steps[1:]
    if any(s.q for s in lane.steps) or (lane.step0 is not None and lane.step0.q):
        seq = positions(lane)
        rate = _first_rate(seq)
        if lane.step0 is None:
            return (0, 0.0), replay_positions(seq, cand.k, cand.stop, cand.cstop, rate, start=1)
        steps = replay_positions(seq, cand.k, cand.stop, cand.cstop, rate)
        return steps[0], steps[1:]
    tail = _tail_alpha(lane.steps)
    out: list[tuple[int, float]] = []
    for s in lane.steps:
        d, a, beyond = replay_step(s, cand.k, cand.stop, cand.cstop)
        extra = 0.0
        if beyond:
            more = cand.k - d
            if a == d:
                extra = sum(tail ** j for j in range(1, more + 1))
            d += more
        out.append((d, a + extra))
    first = (0, 0.0)
    if lane.step0 is not None:
        d0, a0, _ = replay_step(lane.step0, cand.k, cand.stop, cand.cstop)
        first = (d0, float(a0))
    return first, out


def _verifies(prompts: Sequence[PromptCal], verify: Sequence[float], tree_ratio: float = 1.0) -> list[tuple[int, float, float]]:
    """The calibration lanes' decode verifies of more than one token and at most as many as the curve measured (a
    dynamic-tree calibration's union of trees verifies more): (n tokens, measured cost above one forward in the
    baseline's forwards on the same prompt, the curve's V(n) − 1) — a tree's verify (a head's or a dynamic tree's
    calibration) divided by `tree_ratio` first, as the causal forward of as many tokens it stands for."""
    return [(s.offered + 1, s.verify_s / pc.base_step_s / (tree_ratio if s.parents else 1.0) - 1.0, verify_at(verify, s.offered + 1) - 1.0)
            for pc in prompts if pc.base_step_s > 0 for lane in pc.lanes.values() for s in lane.steps
            if s.offered and s.verify_s > 0 and s.offered + 1 <= len(verify)]


def verify_scale(prompts: Sequence[PromptCal], verify: Sequence[float], tree_ratio: float = 1.0) -> float | None:
    """How much dearer this run's verifies were than the cost profile says: the s of V'(n) = 1 + s·(V(n) − 1) that
    fits the calibration lanes' measured verify times (over the baseline's one-token forward on the same prompt,
    summed over every decode step that verified more than one token): the one figure the finder's summary quotes
    for people (the curve it prices with is :func:`fitted_curve`'s, width by width). None: no such step, or no
    positive ratio to quote (the verifies, or the profile's V(n) − 1, not above one forward in sum)."""
    obs = _verifies(prompts, verify, tree_ratio)
    num, den = sum(r for _, r, _ in obs), sum(x for _, _, x in obs)
    return num / den if den > 0 and num > 0 else None


#: fitted_curve: how far in log n a verify still speaks for another width (its weight falls as exp(−d² / 2h²)), and
#: what the run's overall scale is worth there, in verifies
FIT_BANDWIDTH = 0.3
FIT_PRIOR = 1.0


def fitted_curve(prompts: Sequence[PromptCal], verify: Sequence[float], tree_ratio: float = 1.0) -> tuple[tuple[float, ...], float | None]:
    """The verify curve this run measured: at each n the profile's V(n) plus (n − 1) times the extra cost per token
    that the calibration lanes' verifies of about that width showed over the profile —
    δ(n) = Σ w·(t/T(1) − V(m)) / Σ w·(m − 1) over the verifies of m tokens, w = exp(−(ln m − ln n)² / 2·FIT_BANDWIDTH²),
    with the run's overall δ (over every verify) worth FIT_PRIOR verifies of n tokens — made non-decreasing past
    NARROW tokens (a narrower forward may cost less than a wider one: the profile's smoothing keeps such a shape,
    and so does this fit). Never below half the profile's V(n). Returns (curve, :func:`verify_scale` for people);
    the profile as it is where nothing was verified. A curve of causal forwards: a tree calibration's verifies count
    as `tree_ratio` (the target profile's) times the causal forward of as many tokens.

    One scale for every width was not enough: on 4 Spec-Bench prompts (2 CPU cores) the calibration's verifies cost
    1.48 and 1.81 one-token forwards at 5 and 9 tokens where the profile said 1.17 and 1.31, but 2.42 at 25 where it
    said 2.02 — a single scale (1.71) fit to them all, dominated by the 25-token verifies, priced the 5–12-token
    setups that win 10–13 % too fast. On a straight profile this fit equals scaling V(n) − 1 by the verifies'
    weighted ratio; it also holds where V(n) − 1 is 0 or negative (a profile with V(3) < 1), which a ratio cannot."""
    obs = _verifies(prompts, verify, tree_ratio)
    if not obs:
        return tuple(verify), None
    excess = [(math.log(m), r - xm, m - 1) for m, r, xm in obs]  # (ln m, cost above the profile's, tokens above one)
    d_all = sum(e for _, e, _ in excess) / sum(t for _, _, t in excess)
    out = [verify[0] if verify else 1.0]
    for n in range(2, len(verify) + 1):
        vn, ln = verify_at(verify, n), math.log(n)
        num, den = FIT_PRIOR * (n - 1) * d_all, FIT_PRIOR * (n - 1)
        for lm, e, t in excess:
            w = math.exp(-((lm - ln) ** 2) / (2 * FIT_BANDWIDTH**2))
            num += w * e
            den += w * t
        v = max(0.5 * vn, vn + (n - 1) * num / den)
        out.append(max(out[-1], v) if n > NARROW else v)
    return tuple(out), verify_scale(prompts, verify, tree_ratio)


def price_candidate(cand: Candidate, prompts: Sequence[PromptCal], verify: Sequence[float],
                    draft_curve: Sequence[float] | None = None, tree_ratio: float = 1.0, draft_tree_ratio: float = 1.0) -> Priced | None:
    """Predict a candidate's wall per prompt from its drafter's calibration lanes (None: no lane for it).

    c and o come from the calibration lanes (measured draft forward and per-step overhead, over the baseline's decode
    step on the same prompt), V is the curve given (the finder's: the target's profile fitted to this run, :func:`fitted_curve`).
    Step 0 is the calibration lane's prefill with its own first proposal's drafting replaced by the candidate's;
    the decode's tokens per unit come from the replayed steps (:func:`_decode_steps`). A tree's step verifies all its
    nodes, V(nodes + 1)·`tree_ratio` (what a tree's mask costs over a causal forward of as many tokens: the target
    profile's CostProfile.tree_ratio — 1.00 for fp32 PyTorch and llama.cpp on the 2-core CPU here, but an engine
    whose causal attention is cheaper than its masked one is priced as measured) and a static tree drafts them in one
    forward per level, each c·D(n) for n tokens fed, D the draft's own curve (`draft_curve`, its forward over n tokens
    over one token; default the target's V), a level of more than one token times `draft_tree_ratio` (the draft
    profile's). A ReDrafter head's step runs `depth` levels of its beam search, each c (its calibration's measured
    level: memory-bound, about as dear for 1 beam as for 4)."""
    pred: dict[str, float] = {}
    base: dict[str, float] = {}
    cats: dict[str, str] = {}
    tot_tok = tot_steps = tot_acc = tot_dr = 0.0
    tot_units = 0.0
    cs, os_ = [], []
    for pc in prompts:
        lane = pc.lanes.get(cand.drafter)
        if lane is None or pc.base_step_s <= 0:
            continue
        t1 = pc.base_step_s
        c = lane.draft_s_per_forward / t1
        price = StepPrice(tuple(verify), c=c, o=lane.overhead_s / t1, o_base=pc.base_overhead_s / t1)
        cs.append(c)
        os_.append(price.o)
        (d0, a0), steps = _decode_steps(cand, lane)
        tok = sum(a + 1 for _, a in steps)
        if cand.bit:  # every node verified; `depth` forwards wherever the calibration drafted, each c (a head's level; a
            # dynamic tree's root forward and one per level below it) — a head's cut prunes after its levels ran
            fw = float(cand.k)
            units = sum(price.v(d + 1) * tree_ratio + (fw * c if s.offered else 0.0) + price.o
                        for (d, _), s in zip(steps, lane.steps, strict=True))
        elif cand.shape:
            _, feeds = tree_nodes(cand.shape)
            # the tree's draft forwards, in c
            fw = sum(verify_at(tuple(draft_curve or verify), f) * (draft_tree_ratio if f > 1 else 1.0) for f in feeds)
            units = sum(price.v(d + 1) * tree_ratio + fw * c + price.o for d, _ in steps)
        else:
            fw = 0.0
            units = sum(price.units(d, d if lane.draft_s_per_forward > 0 else 0) for d, _ in steps)
        tot_acc += sum(a for _, a in steps)
        tot_dr += sum(d for d, _ in steps)
        prefill = lane.prefill_s
        if lane.step0 is not None and cand.dynamic:  # the union's nodes and forwards out, the tree's in
            prefill -= ((lane.step0.offered - d0) * price.marginal_verify() + (lane.step0.forwards - fw) * c) * t1
        elif lane.step0 is not None:  # its drafts were verified with the prompt: each cost a draft forward and a token
            per_draft = lane.draft_s_per_forward + price.marginal_verify() * t1
            if cand.shape:  # the calibration's chain out, the tree in
                prefill += fw * lane.draft_s_per_forward + d0 * price.marginal_verify() * t1 - lane.step0.offered * per_draft
            else:
                prefill -= (lane.step0.offered - d0) * per_draft
        decode = 0.0
        if steps:
            decode = max(0.0, pc.new_tokens - (a0 + 1.0)) * (units / tok) * t1
            tot_tok += tok
            tot_steps += len(steps)
            tot_units += units
        pred[pc.prompt_id] = max(prefill, 0.0) + decode
        base[pc.prompt_id] = pc.base_wall_s
        cats[pc.prompt_id] = pc.category
    if not pred:
        return None
    return Priced(cand, pred, base, tot_acc / tot_dr if tot_dr else None, tot_tok / tot_steps if tot_steps else 1.0,
                  tot_dr / tot_steps if tot_steps else 0.0, tot_units / tot_steps if tot_steps else 1.0,
                  sum(cs) / len(cs), sum(os_) / len(os_), cats)


#: the grid the finder prices for each model drafter (k × stop × cstop) and lookup drafter (k)
GRID_K = (1, 2, 3, 4, 6, 8, 12, 16, 24)
GRID_CSTOP = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7)
GRID_STOP = (0.0, 0.4, 0.75)


def _fmt(x: float) -> str:
    return f"{x:g}"


def grid(drafter: str, model: bool, ks: Sequence[int] = GRID_K) -> list[Candidate]:
    """Every fixed setup of one drafter the finder prices: for a model drafter k × cstop (stop 0) and k × stop
    (cstop 0); for a lookup drafter k. The setup strings parse back (app.core.setups)."""
    out: list[Candidate] = []
    head, _, rest = drafter.partition(",")
    tail = f",{rest}" if rest else ""
    for k in ks:
        if not model:
            out.append(Candidate(drafter, f"{head},k={k}{tail}", k))
            continue
        for cs in GRID_CSTOP:
            out.append(Candidate(drafter, f"{head},k={k}" + (f",cstop={_fmt(cs)}" if cs else "") + tail, k, 0.0, cs))
        for st in GRID_STOP[1:]:
            out.append(Candidate(drafter, f"{head},k={k},stop={_fmt(st)}{tail}", k, st, 0.0))
    return out


#: the path-probability cuts priced for ReDrafter heads (the head's own estimate that the target keeps a node's path)
GRID_BEAM_CSTOP = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3)


def beam_grid(drafter: str) -> list[Candidate]:
    """Every ReDrafter tree of one head (`redrafter:<head>[,dtype=…]`) the finder prices: beams × depth up to the
    calibration's (CAL_BEAMS × CAL_DEPTH) × path-probability cut. The setup strings parse back (app.lanes.redrafter)."""
    head, _, rest = drafter.partition(",")
    tail = f",{rest}" if rest else ""
    return [Candidate(drafter, f"{head},beams={b},depth={d}" + (f",cstop={_fmt(cs)}" if cs else "") + tail, d, cstop=cs, beams=b)
            for b in range(1, CAL_BEAMS + 1) for d in range(1, CAL_DEPTH + 1) for cs in GRID_BEAM_CSTOP]


def dynamic_grid(drafter: str) -> list[Candidate]:
    """Every dynamic token tree of one draft model (`tree:<engine>[,dtype=…]`, its calibration lane's drafter) the
    finder prices: nodes (DYN_NODES) × depth (1 … DYN_DEPTH) × branch (2 … DYN_BRANCH). The setups parse back."""
    head, _, rest = drafter.partition(",")
    tail = f",{rest}" if rest else ""
    return [Candidate(drafter, f"{head},nodes={n},depth={d},branch={b}{tail}", d, dynamic=(n, b))
            for b in range(2, DYN_BRANCH + 1) for d in range(1, DYN_DEPTH + 1) for n in DYN_NODES]


def _tree_shapes(max_nodes: int = 32) -> tuple[tuple[int, ...], ...]:
    """The static trees the finder prices: the root's best 2–4 tokens, 1 or 2 below each, then a chain of one-child
    levels, depth 2–8, at most `max_nodes` nodes (the cost profiles measure forwards up to 33 tokens)."""
    out = []
    for w1 in (2, 3, 4):
        for w2 in (1, 2):
            for depth in (2, 3, 4, 6, 8):
                shape = (w1, w2, *(1,) * (depth - 2))
                if tree_nodes(shape)[0] <= max_nodes:
                    out.append(shape)
    return tuple(out)


#: the static tree shapes the finder prices for each model drafter (`--kinds tree`)
TREE_SHAPES = _tree_shapes()


def tree_grid(drafter: str, shapes: Sequence[tuple[int, ...]] = TREE_SHAPES) -> list[Candidate]:
    """The static token trees of one model drafter (`draft:<engine>[,…]`) the finder prices, as `tree:` setups
    (app.lanes.tree) priced from the drafter's chain calibration."""
    engine, _, rest = drafter.removeprefix("draft:").partition(",")
    tail = f",{rest}" if rest else ""
    return [Candidate(drafter, f"tree:{engine},shape={'x'.join(map(str, s))}{tail}", len(s), shape=tuple(s)) for s in shapes]


def rank(priced: Iterable[Priced], prompt_ids: Iterable[str] | None = None) -> list[Priced]:
    """Fastest first by predicted speedup over the given prompts (all: None); ties: fewer drafts (a smaller node budget) first. Of the
    candidates of one drafter that would behave identically on every recorded step (e.g. any k where lookups never
    matched), only the first is kept."""
    ids = None if prompt_ids is None else list(prompt_ids)
    out, seen = [], set()
    for p in sorted(priced, key=lambda p: (-_finite(p.speedup(ids)), p.candidate.k, p.candidate.dynamic, p.candidate.setup)):
        same = (p.candidate.drafter, tuple(round(w, 9) for w in p.pred_wall_s.values()), round(p.tau, 9), round(p.mean_k, 9))
        if same not in seen:
            seen.add(same)
            out.append(p)
    return out


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -1.0


def winners(priced: Sequence[Priced]) -> dict[str, Priced]:
    """category → the candidate with the best predicted speedup on its prompts."""
    cats = sorted({c for p in priced for c in p.categories.values()})
    out = {}
    for cat in cats:
        best = rank(priced, [pid for pid, c in priced[0].categories.items() if c == cat]) if priced else []
        if best:
            out[cat] = best[0]
    return out


# --- break-even ----------------------------------------------------------------------------------------------
def chain_speedup(alpha: float, k: int, price: StepPrice) -> float:
    """Decode speedup of a chain of k drafts with i.i.d. acceptance α at this StepPrice (one forward per draft)."""
    if k <= 0:
        return price.speedup(1.0, 1.0 + price.o)
    tokens = float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return price.speedup(tokens, price.units(k))


def break_even_alpha(price: StepPrice, beat: float, ks: Sequence[int] = tuple(range(1, 25))) -> tuple[float, int] | None:
    """The lowest i.i.d. acceptance α (and the k it needs) at which a drafter of this cost beats `beat`x over the
    baseline; None when no α ≤ 1 does (the verify curve and c leave no room)."""
    best: tuple[float, int] | None = None
    for k in ks:
        if chain_speedup(1.0, k, price) <= beat:
            continue
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            if chain_speedup(mid, k, price) > beat:
                hi = mid
            else:
                lo = mid
        if best is None or hi < best[0]:
            best = (hi, k)
    return best


def verify_for_gain(p: Priced, verify: Sequence[float], gain: float = 0.1) -> tuple[int, float, float]:
    """What a cheaper verify would have to cost for a priced setup to go `gain` faster at its own predicted τ:
    (n, V(n) now, V(n) needed), n the tokens its mean step verifies (round(mean k) + 1). The step's other costs
    (drafting, overhead) stay; a needed V(n) below the curve's cheapest forward means no cheaper verify alone can do it
    (on some CPUs a forward over a few tokens costs less than one over a single token: the curve's minimum, not 1)."""
    n = max(1, round(p.mean_k)) + 1
    now = verify_at(tuple(verify), n)
    return n, now, now - p.units * (1.0 - 1.0 / (1.0 + gain))


def verify_gain_text(p: Priced, verify: Sequence[float], gain: float = 0.1, name: str | None = None) -> str:
    """One sentence on what a cheaper verify would do for a priced setup (:func:`verify_for_gain`): the V(n) it needs,
    or — where that is below the cheapest forward on the curve (on some CPUs a forward over a few tokens is the
    cheapest, not the one-token forward) — that it needs longer accepted runs or a cheaper draft instead."""
    n, now, need = verify_for_gain(p, verify, gain)
    name, pct = name or p.candidate.setup, round(100 * gain)
    floor = min(range(1, len(verify) + 1), key=lambda m: verify[m - 1]) if verify else 1
    cheapest = verify[floor - 1] if verify else 1.0
    if need >= cheapest:
        return (f"for {name} to gain another {pct} % at its τ {p.tau:.2f}, verifying its {n} tokens a step would have to cost "
                f"V({n}) ≤ {need:.2f} (it costs {now:.2f} here)")
    return (f"for {name} to gain another {pct} %, a cheaper verify alone would not do (its {n} tokens a step would have to cost "
            f"V({n}) ≤ {need:.2f}, less than any forward measured here: the cheapest, over {floor} token{'s' if floor > 1 else ''}, "
            f"costs {cheapest:.2f}): it needs longer accepted runs or a cheaper draft")


# --- explanations --------------------------------------------------------------------------------------------
def why(p: Priced, verify: Sequence[float], best: float, measured: float | None = None, tree_ratio: float = 1.0) -> str:
    """One sentence on why a candidate wins or loses here, from its predicted parts (`tree_ratio`: what a tree's
    verify was priced at over a causal one's, said for trees)."""
    price = StepPrice(tuple(verify), c=p.c, o=p.o)
    s = measured if measured is not None and math.isfinite(measured) else p.speedup()
    k = max(0, round(p.mean_k))
    parts = f"τ {p.tau:.2f} tokens per step for {p.units:.2f} steps' time (verify V({k + 1}) {price.v(k + 1):.2f}"
    if p.candidate.beams:
        parts = (f"τ {p.tau:.2f} tokens per step for {p.units:.2f} steps' time (verify of {p.mean_k:.1f} beam-tree nodes V({k + 1}) "
                 f"{price.v(k + 1):.2f}, {p.candidate.k} head levels × c {p.c:.2f}")
    elif p.candidate.dynamic:
        parts = (f"τ {p.tau:.2f} tokens per step for {p.units:.2f} steps' time (verify of {p.mean_k:.1f} tree nodes V({k + 1}) "
                 f"{price.v(k + 1):.2f}, {p.candidate.k} draft forwards at c {p.c:.2f}")
    elif p.candidate.shape:
        _, feeds = tree_nodes(p.candidate.shape)
        parts = (f"τ {p.tau:.2f} tokens per step for {p.units:.2f} steps' time (verify of {k} tree nodes V({k + 1}) "
                 f"{price.v(k + 1):.2f}, {len(feeds)} draft forwards over {'/'.join(map(str, feeds))} tokens at c {p.c:.2f}")
    elif p.c > 0:
        parts += f", {p.mean_k:.1f} drafts × c {p.c:.2f}"
    if (p.candidate.shape or p.candidate.bit) and abs(tree_ratio - 1.0) >= 0.005:
        parts += f", the tree's mask ×{tree_ratio:.2f}"
    parts += f", overhead {p.o:.2f})"
    if p.candidate.auto:
        parts = "k=auto replayed on the records: " + parts
    if p.alpha is None:
        return f"{'loses' if s < 1.0 else 'even'}: proposed nothing on these prompts (no draft to verify); {parts}"
    alpha = f"α {p.alpha:.2f}"
    if s < 1.0:
        need = break_even_alpha(price, 1.0)
        tail = (f"needs α > {need[0]:.2f} (at k={need[1]}) to pay" if need else "cannot pay even if every draft were accepted")
        return f"loses: {parts}; {alpha}: {tail}"
    if s >= best - 1e-9:
        return f"wins: {parts}; {alpha}" if measured is not None else f"predicted as fast as the winner (not confirmed): {parts}; {alpha}"
    r = s / best  # below 1 here: never printed as a tie (1.00x), 3 decimals rounded down where 2 would say 1.00
    return f"{r:.2f}x the winner: {parts}; {alpha}" if round(r, 2) < 1.0 else f"{math.floor(r * 1000) / 1000:.3f}x the winner: {parts}; {alpha}"

