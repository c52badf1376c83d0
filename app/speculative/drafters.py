"""Drafters: propose tokens given a context object; receive feedback of how many were accepted."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from app.speculative.policy import AutoK, Calibration, StepTiming, load_learnt, recall, remember, save_learnt
from app.speculative.verifier import sample, warp

__all__ = ["ALTS", "UNREAD_NOTE", "BEHIND_NOTE", "DraftContext", "Proposal", "Drafter", "NoDrafter", "NGramDrafter", "DraftModelDrafter"]

#: a greedy draft model's best tokens recorded at each drafted position (Proposal.alts)
ALTS = 4
#: a k=auto lane's note when its draft never read the prompt (DraftModelDrafter.finish)
UNREAD_NOTE = ("k=auto did not read the prompt into the draft, and decoded as the baseline does: reading it would have cost "
               "more than drafting had lately saved over the tokens left (a step's tooltip says how much; `profile TARGET "
               "--draft DRAFT` shows the saving)")


#: a k=auto lane's note when it ended with its draft left behind (DraftModelDrafter.finish)
BEHIND_NOTE = ("k=auto left the draft behind at the end of the answer: catching it up over the tokens emitted while steps "
               "drafted nothing would have cost more than drafting had lately saved over the tokens left (a step's tooltip "
               "says how much)")


@dataclass
class DraftContext:
    """What a drafter sees each step.

    Attributes:
        ids: the whole sequence so far (prompt + generated); do not mutate.
        max_k: the most tokens worth proposing now (token budget left − 1).
        temperature, top_k, top_p: the run's sampling (drafters sample with the same warp).
        generator: the lane's random source.
        last: the previous decode step's measured times (None in steps 0 and 1), for cost-aware drafters.
        hidden: for drafters that declare `wants_hidden = True` (ReDrafter), the target's final normed hidden state
            that produced the last token of `ids`; None in step 0.
    """

    ids: list[int]
    max_k: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    last: StepTiming | None = None
    hidden: Any = None  # drafters with `wants_hidden`: the target's final hidden state [H] at the last accepted position


@dataclass
class Proposal:
    """ids: drafted tokens; q: their draft distributions [k, V] when sampled from a model (else None);
    q_drafted: q(d_i) per token when known (tooltips); forwards: draft model forward passes spent;
    why: the reason for this k (k=auto), for tooltips; read_s: seconds of this proposal the draft spent reading the
    prompt, not drafting (k=auto's draft reads it in the first step that drafts: the loop counts it as prefill and
    keeps it out of the step times the policy learns c from); catch_up_s: seconds of it the draft spent catching up over
    tokens emitted while steps drafted nothing (k=auto: a decode step's cost, but kept out of the step times the policy
    learns c and what drafting saves from, as the reading is); parents: for a token tree, each token's parent index
    (−1: the last token of the sequence; see app.speculative.tree), None for a chain; alts: a greedy draft model's
    ALTS best tokens at each drafted position, best (its draft) first — where the target rejects a draft, the rank of
    the target's token among them is what a token tree that wide there would have caught (StepEvent.correction_rank);
    searches: for a tree merged from several trees (the setup finder's calibrations: app.speculative.redrafter.beam_trees,
    TreeDrafter with all_widths), each node's mask of the trees that hold it (TreeStep.searches)."""

    ids: list[int]
    q: torch.Tensor | None = None
    q_drafted: list[float] | None = None
    forwards: int = 0
    why: str = ""
    parents: list[int] | None = None
    alts: list[tuple[int, ...]] | None = None
    read_s: float = 0.0
    searches: list[int] | None = None
    catch_up_s: float = 0.0


class Drafter(Protocol):
    """Proposes drafts for the loop (app.speculative.loop) and hears how many were accepted.

    Attributes:
        k: the most tokens it drafts a step.
        wants_hidden: it needs the target's hidden state at the last accepted position (`DraftContext.hidden`):
            the loop then asks the target for it (ReDrafter heads); False for every other drafter.

    Optional: `notes` (lines the loop adds to the lane's notes when the lane starts) and `finish()` (called once when
    the lane ends, however it ended: k=auto keeps what the lane taught it).
    """

    k: int
    wants_hidden: bool

    def start(self, prompt_ids: list[int]) -> None: ...

    def propose(self, ctx: DraftContext) -> Proposal: ...

    def feedback(self, drafted: int, accepted: int) -> None: ...


class NoDrafter:
    """The baseline: nothing drafted, one target token per step."""

    k = 0
    wants_hidden = False

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        return Proposal([])

    def feedback(self, drafted: int, accepted: int) -> None:
        pass


class NGramDrafter:
    """Prompt lookup: find the most recent earlier occurrence of the last m tokens (m = n … 1) in
    prompt + output and propose up to k tokens that followed it. An index of n-grams is kept incrementally,
    so a step costs O(n) lookups, not a scan of the text.

    With `auto` (k=auto) the continuation is looked up to AUTO_K_MAX tokens and the policy keeps as many as pay
    on this target: acceptance is estimated per match length m and position, learnt from what the target emitted
    after every lookup — also where nothing was proposed, so a lane that stopped drafting keeps learning.
    """

    wants_hidden = False

    def __init__(self, n: int = 3, k: int = 8, auto: AutoK | None = None) -> None:
        self.n, self.k = n, k
        self.auto = auto
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(n + 1)]
        self._indexed = 0  # n-grams ending before this position are indexed
        self._stats: dict[tuple[int, int], list[float]] = {}  # (m, position) -> [accepted, seen] (auto)
        self._pending: tuple[int, int, list[int]] | None = None  # (len(ids), m, candidate) of the last lookup

    def start(self, prompt_ids: list[int]) -> None:
        self._index = [{} for _ in range(self.n + 1)]
        self._indexed = 0
        self._pending = None

    def _update(self, ids: list[int]) -> None:
        # index n-grams ending at `end` (inclusive) whose continuation ids[end + 1] exists
        for end in range(self._indexed, len(ids) - 1):
            for m in range(1, self.n + 1):
                s = end - m + 1
                if s >= 0:
                    self._index[m][tuple(ids[s : end + 1])] = end + 1
        self._indexed = max(self._indexed, len(ids) - 1)

    def _lookup(self, ids: list[int], k: int) -> tuple[int, list[int]]:
        for m in range(min(self.n, len(ids)), 0, -1):
            start = self._index[m].get(tuple(ids[-m:]))
            if start is not None:
                return m, list(ids[start : start + k])
        return 0, []

    def _p(self, m: int, pos: int) -> float:
        a, n = self._stats.get((m, min(pos, 8)), (1.0, 2.0))
        return a / n

    def _learn(self, ids: list[int]) -> None:
        """Score the last lookup's candidate against what was emitted since (equality is acceptance here: the
        candidate is one token per position, so a rejected draft is never what the target emits instead)."""
        if self._pending is None:
            return
        n0, m, cand = self._pending
        self._pending = None
        for pos, (c, e) in enumerate(zip(cand, ids[n0:], strict=False), start=1):
            st = self._stats.setdefault((m, min(pos, 8)), [1.0, 2.0])
            st[1] += 1.0
            if c != e:
                break
            st[0] += 1.0

    def propose(self, ctx: DraftContext) -> Proposal:
        ids = ctx.ids
        if self.auto is None:
            k = min(self.k, ctx.max_k)
            if k <= 0:
                return Proposal([])
            self._update(ids)
            return Proposal(self._lookup(ids, k)[1])
        auto = self.auto
        auto.observe(ctx.last)
        self._learn(ids)
        k_cap = min(auto.k_max, ctx.max_k)
        if k_cap <= 0:
            return Proposal([])
        self._update(ids)
        m, cand = self._lookup(ids, k_cap)
        if not cand:
            return Proposal([], why="k=auto: no earlier occurrence of the last tokens")
        self._pending = (len(ids), m, cand)
        cum, p = [], 1.0
        for pos in range(1, len(cand) + 1):
            p *= self._p(m, pos)
            cum.append(p)
        k = auto.best_k(cum)
        return Proposal(cand[:k], why=auto.explain(cum, k, forwards=0) + f" (match of {m} tokens)")

    def feedback(self, drafted: int, accepted: int) -> None:
        pass


class DraftModelDrafter:
    """A small model proposes k tokens autoregressively with its own KV cache, rolled back on rejection.

    schedule "heuristic" adapts k from the last step like transformers' assisted generation
    (+2 when every draft was accepted, −1 otherwise, at least 1); "constant" keeps it. `stop` > 0 ends a
    draft early after a token the draft itself gives probability < stop (transformers' ConfidenceCriteria),
    which saves draft forwards and verification width where the draft is unsure. `cstop` > 0 ends it once the
    product of those probabilities (the draft's own estimate that the whole proposal is accepted) is below `cstop`:
    long drafts through predictable text, short ones where a single doubt already makes the rest unlikely to count.
    With `auto` (k=auto) the cost-aware policy decides, token by token, whether drafting one more can pay on this
    target (app.speculative.policy), from the draft's probabilities calibrated against what the target kept and the
    acceptance of the next draft conditioned on the last one's confidence (at the start of a step: on how the previous
    step ended).
    """

    wants_hidden = False

    def __init__(self, engine, k: int = 4, schedule: str = "constant", stop: float = 0.0, cstop: float = 0.0,
                 auto: AutoK | None = None, memory: tuple | None = None, learn: bool = True, saved: bool = False,
                 category: str = "") -> None:
        self.engine = engine
        self.k = k
        self.schedule = schedule
        self.stop = stop
        self.cstop = cstop
        self.auto = auto  # k=auto: the cost-aware policy decides each step (see app.speculative.policy)
        self.calibration = Calibration()
        # k=auto: start from what the last lane of this (target, draft) pair learnt in this process (policy.recall)
        # (learn=False: a warm-up lane starts from it too, but leaves it as it was — it rehearses the prompt a measured
        # lane then runs, whose first verdicts would otherwise count twice)
        # (saved=True: a real lane's pair also starts from, and saves to, what earlier runs learnt: policy.load_learnt)
        self.memory = memory if auto is not None else None
        self.learn = learn
        self.saved = saved and self.memory is not None
        self.category = category  # the prompt's: k=auto's saving and acceptance of that category (AutoK.saving_of, Acceptance.by_category)
        self.notes: list[str] = []  # lines for the lane's notes (the loop adds them when the lane starts, and ends)
        if self.memory is not None and (got := recall(self.memory)) is not None:
            self.auto, self.calibration = got
        elif self.saved and self.memory is not None and self.auto is not None and (note := load_learnt(self.memory, self.auto, self.calibration)):
            self.notes.append(note)
        self._scores: list[float] = []  # q of the drafts verified last step (auto)
        self._dropped: float | None = None  # auto: the calibrated acceptance of a first draft made, then not verified
        self._opening = False  # auto: the step being verified is step 0 (its first draft: the answer's first token)
        self._prompt_len = 0
        self._held = False  # auto: the last step drafted nothing because reading or catching up would not repay itself
        self._unread = False  # auto: a step declined to read the context into the draft (AutoK.worth_reading)
        self._left_behind = False  # auto: a step declined to catch the draft up, and none has drafted since
        self.state: Any = None  # the draft's decode state (its KV cache), made by start(): one per lane
        self.seen: list[int] = []  # ids in the draft's cache

    def start(self, prompt_ids: list[int]) -> None:
        self.seen = []
        self._scores = []
        self._held = self._unread = self._left_behind = False
        self._prompt_len = len(prompt_ids)
        if self.auto is not None:
            self.auto.begin_answer(self.category)
        # k=auto makes its state and prefills lazily (in the first step that drafts): a lane where drafting never
        # pays spends nothing on the draft (a llama.cpp context alone takes ~0.1 s to set up)
        self.state = self.engine.new_state() if self.auto is None else None
        if self.auto is None:
            self._read_all_but_last(prompt_ids)

    def _read_all_but_last(self, ids: list[int]) -> None:
        """Feed the draft all but the last of `ids` it has not read: the last goes in with the first draft. Every draft
        lane reads its prompt this way — an int8 draft quantizes activations over each forward, so one forward over the
        whole prompt proposes other tokens (on a Spec-Bench coding prompt the second draft was one token at 0.62 after
        one forward, another at 0.38 after these two, which the finder's calibration records)."""
        if len(ids) - len(self.seen) > 1:
            self.state.forward(ids[len(self.seen):-1], last_only=True)
            self.seen.extend(ids[len(self.seen):-1])

    def propose(self, ctx: DraftContext) -> Proposal:
        auto = self.auto
        if auto is not None:
            auto.observe(ctx.last)
            if self.state is not None and not self._held:  # a step made with the context read (AutoK.count_saving)
                auto.count_saving(ctx.last)
            self._held = False
            k = min(auto.k_max, ctx.max_k)
            first = len(ctx.ids) <= self._prompt_len  # step 0: drafts ride on the prompt's forward
            if k <= 0 or (first and not auto.can_ever_pay(k)):
                return Proposal([])
            self._opening = first
            with auto.riding_on_the_prompt(first):
                return self._propose(ctx, k, auto)
        k = min(self.k, ctx.max_k)
        if k <= 0:
            return Proposal([])
        return self._propose(ctx, k, None)

    def common_prefix(self, ids: list[int]) -> int:
        """How many of `ids` the draft has read as they are — its cache's common prefix with them, at most all but the
        last (a proposal feeds at least one id); the rest, len(ids) minus this, is what it must read before drafting."""
        common, lim = 0, min(len(self.seen), len(ids) - 1)
        while common < lim and self.seen[common] == ids[common]:
            common += 1
        return common

    def _propose(self, ctx: DraftContext, k: int, auto: AutoK | None) -> Proposal:
        ids = ctx.ids
        common = self.common_prefix(ids)  # roll back to it: the draft reads the rest
        # a draft that is behind first catches up, which the first draft must pay for. After a step that kept all its
        # drafts the draft has not read the last of them nor the target's token after it (after one that kept some, the
        # target's token): that much is fed with every step's first draft, the step's own cost. What lies beyond — the
        # prompt, before the draft first reads; the tokens emitted while steps drafted nothing — is read once, an
        # investment in every later step that drafts: its price is spread over the tokens left (charged whole to one
        # step, a long prompt kept k=auto from ever starting, and a draft that had fallen behind fell further behind
        # each step it waited, until it never drafted again: resources/bench/README.md, "k=auto's catch-up"), and it is
        # made only where what drafting saves a token lately repays it over the tokens left (AutoK.worth_reading)
        behind = len(ids) - common
        extra = 0.0
        if auto is not None:
            own = auto.catch_up_units(min(behind, 2)) if self.state is not None else 0.0  # a first reading: all of it
            extra = own + (auto.catch_up_units(behind) - own) / max(1, ctx.max_k + 1)
        p_opening = auto.acceptance.p_opening if auto is not None and self._opening else None  # AutoK.ended
        if auto is not None and not auto.worth_drafting_more([], k, p_next=p_opening, extra=extra) and (
                p_opening is not None or not auto.worth_a_look(self.calibration, k, extra=extra)):
            p_first = auto.p_next(None) if p_opening is None else p_opening
            auto.skipped()
            if not auto.can_ever_pay(k):
                why = "k=auto: drafting cannot pay on this target even if every draft were accepted"
            else:
                why = f"k=auto: expected acceptance of a first draft {p_first:.2f} too low to pay"
                if behind > 1:
                    why += f" (the draft would first catch up over {behind} tokens)"
            return Proposal([], why=why)
        if auto is not None and behind > 2 and not auto.worth_reading(behind, ctx.max_k + 1):
            # held back by the reading, not by what drafting would make: such a step is no evidence of what drafting
            # saves (count_saving skips it), or the gate would hold the draft back for good
            self._held = True
            self._unread |= self.state is None
            self._left_behind = self.state is not None
            what = (f"reading the {behind} tokens so far into the draft" if self.state is None else
                    f"catching the draft up over the {behind} tokens it has not read")
            return Proposal([], why=(f"k=auto: {what} would cost {auto.catch_up_units(behind):.1f} decode steps, more than "
                                     f"drafting saved here lately{f' on {auto.category} prompts' if auto.category else ''} "
                                     f"({auto.saving:.2f} of a step a token, "
                                     f"{auto.saving * (ctx.max_k + 1):.1f} over the {ctx.max_k + 1} tokens left)"))
        # catching up over more than a step's own 2 tokens: its share of the first forward is timed (Proposal.catch_up_s)
        catch_up = auto.draft_profile if auto is not None and self.state is not None and behind > 2 else None
        read_s = 0.0
        if self.state is None:
            t_read = time.perf_counter()
            self.state = self.engine.new_state()
            self._read_all_but_last(ids)  # as start() does for the other lanes (seen is empty: common is 0)
            self.engine.sync()
            read_s = time.perf_counter() - t_read
            common = len(self.seen)
        if common < len(self.seen):
            self.state.crop(common)
            del self.seen[common:]
        feed = ids[common:]
        sampling = ctx.temperature > 0
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        q_drafted: list[float] = []
        alts: list[tuple[int, ...]] = []  # greedy: the draft's best tokens at each position (Proposal.alts)
        cum: list[float] = []  # auto: P(first j drafts all accepted)
        forwards = 0
        p_all = 1.0
        catch_up_s = 0.0
        self._left_behind = False
        while True:
            t_fwd = time.perf_counter()
            logits = self.state.forward(feed, last_only=True)[-1]  # [V]
            if catch_up is not None:  # the catch-up's share of this forward, as the draft's profile prices it
                self.engine.sync()
                catch_up_s = (time.perf_counter() - t_fwd) * (1.0 - catch_up.t(2) / catch_up.t(behind))
                catch_up = None
            forwards += 1
            self.seen.extend(feed)
            if sampling:
                q = warp(logits[None], ctx.temperature, ctx.top_k, ctx.top_p)[0]
                tok = sample(q, ctx.generator)
                qs.append(q)
                q_drafted.append(float(q[tok]))
            else:
                best = tuple(logits.topk(ALTS).indices.tolist())
                tok = best[0]
                q_drafted.append(float(logits.softmax(-1)[tok]))
                alts.append(best)
            drafted.append(tok)
            p_all *= q_drafted[-1]
            if auto is not None:
                p = auto.local(self.calibration(q_drafted[-1]))
                if not cum and p_opening is not None:
                    p = p_opening  # the answer's first token: the opening's own estimate, whatever its confidence (AutoK.ended)
                cum.append(cum[-1] * p if cum else p)
                if tok in ctx.eos_ids or not auto.worth_drafting_more(cum, k, p_next=auto.p_next(q_drafted[-1])):
                    break
            elif len(drafted) >= k or tok in ctx.eos_ids or q_drafted[-1] < self.stop or p_all < self.cstop:
                break
            feed = [tok]
        why = ""
        if auto is not None:
            if not self._opening:
                auto.acceptance.saw_first(q_drafted[0])
            keep = auto.best_k(cum, p_next=auto.p_next(q_drafted[-1]), k_cap=k)
            why = auto.explain(cum, keep)
            self._dropped = cum[0] if cum and not keep else None
            drafted, q_drafted, qs, alts = drafted[:keep], q_drafted[:keep], qs[:keep], alts[:keep]
            self._scores = list(q_drafted)
        return Proposal(drafted, torch.stack(qs) if sampling and qs else None, q_drafted, forwards, why, alts=alts or None,
                        read_s=read_s, catch_up_s=catch_up_s)

    def feedback(self, drafted: int, accepted: int) -> None:
        if self.auto is not None:
            # positions up to the first rejection were tested by the target; later ones were not (nor does the
            # answer's first token, in the opening step, teach the calibration: AutoK.ended)
            for i, q in enumerate(self._scores[: min(drafted, accepted + 1)]):
                if i or not self._opening:
                    self.auto.answer_verdict(self.auto.local(self.calibration(q)), i < accepted)  # this answer's shift
                    self.calibration.update(q, i < accepted)
            self.auto.ended(drafted, accepted, self._scores, self._dropped, opening=self._opening)
            self._scores, self._dropped, self._opening = [], None, False
            if self.memory is not None and self.learn:
                remember(self.memory, self.auto, self.calibration)
        if self.schedule == "heuristic" and drafted:
            self.k = self.k + 2 if accepted == drafted else max(1, self.k - 1)

    def finish(self) -> None:
        """The lane ended (the loop calls this once, also when it was stopped): k=auto counts the answer and, for a
        real lane (`saved`), writes what the pair has learnt for the next run (policy.save_learnt). A lane whose draft
        never read its prompt, because drafting had lately saved too little to repay the reading, says so in its notes
        (the loop adds them when the lane ends)."""
        if self.auto is not None and self.state is None and self._unread:
            self.notes.append(UNREAD_NOTE)
        elif self.auto is not None and self._left_behind:
            self.notes.append(BEHIND_NOTE)
        if self.auto is None or self.memory is None or not self.learn:
            return
        self.auto.answers += 1  # the state feedback() remembered is this one
        if self.saved:
            save_learnt(self.memory, self.auto, self.calibration)
