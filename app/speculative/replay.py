"""`k=auto` replayed over a finder calibration: what the policy would have done on these prompts, priced like any
fixed setup, with no model run.

The real DraftModelDrafter and AutoK run; only the draft model and the target are replaced. With greedy decoding the
draft's token and its confidence at a position of the answer depend only on the true prefix, and the calibration
recorded both (app.core.tuning.positions): a :class:`_ReplayDraft` proposes, at each position, a token the target
keeps or rejects as it did, with the recorded confidence; past a rejection it repeats the confidences the calibration
drafted there (then 0.05: a draft that has lost the thread). The target's verdict is the record's, and each step's
times come from the finder's cost model — V(n) the verify curve fitted to this run, c and o the calibration lane's,
T(1) the baseline's — so the policy learns costs as it would in a lane (StepTiming), with the target's cost profile as
its own prior, as a real lane has. The calibration's draft forwards were at most 2 tokens wide; a draft that catches up
after steps that drafted nothing pays for the rest of its forward's width as the draft's cost profile prices it.

The prompts are replayed in order in one "worker": what the policy learnt on one prompt carries to the next (the
lane's `memory`), kept apart from this process's real lanes; the first starts, as a real lane does, from what earlier
runs saved of the pair (`saved`). Where the calibration has no record — a position after
a fully kept proposal, where the target emitted its own token — a fixed setup's priced step ends
(app.core.tuning.replay_positions), and k=auto's draft proposes a token it is unsure of (LOST_Q) that the target
rejects: the policy stops there, at the cost of that one draft, so that no setup is priced drafting through a
position the calibration never drafted (resources/bench/README.md, "k=auto and the order of the prompts").
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence

import torch

from app.core.costs import CostProfile
from app.core.tuning import Candidate, Position, Priced, PromptCal, StepPrice, positions
from app.speculative import policy
from app.speculative.drafters import DraftContext, DraftModelDrafter
from app.speculative.policy import AUTO_K_MAX, AutoK, StepTiming

__all__ = ["replay_auto", "read_len", "UNRECORDED_Q", "LOST_Q", "PROMPT_LEN"]

#: the draft's confidence past the answer's recorded end (kept), and of drafts past a rejection beyond those the
#: calibration made and at a position the calibration did not draft (off the answer)
UNRECORDED_Q = 0.9
LOST_Q = 0.05
_V = 1 << 16  # vocabulary of the replayed draft: large enough that a confidence of 1e-4 is still its best token
_PROMPT, _TRUE, _WRONG, _OFF = 0, 1, 2, 3  # token ids: the prompt's, the answer's, a rejected draft's, past it
#: the replayed prompt's length where the draft has no cost profile or read nothing (the records keep the time the draft
#: took to read the prompt, not its length: :func:`read_len`)
PROMPT_LEN = 64
#: the longest prompt read_len gives
_MAX_PROMPT = 8192


def read_len(draft: CostProfile | None, read_s: float) -> int:
    """The prompt length whose reading the draft's cost profile prices at `read_s` seconds (the reading the
    calibration recorded, in the profile's time): the policy decides whether to read from that price
    (AutoK.worth_reading), so the replayed prompt is as long as the recorded reading says — one token where the
    reading took no time; PROMPT_LEN without a profile."""
    if draft is None:
        return PROMPT_LEN
    if read_s <= 0:
        return 1
    lo, hi = 1, _MAX_PROMPT  # the first n whose reading takes read_s (bisection: the profile's t grows with n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if draft.t(mid) - draft.t1_s < read_s else (lo, mid)
    return hi


class _ReplayState:
    """A draft decode state answering from the records: the answer is `_TRUE` at every position."""

    def __init__(self, seq: Sequence[Position], prompt_len: int) -> None:
        self.seq, self.prompt_len = seq, prompt_len
        self.toks: list[int] = []

    @property
    def length(self) -> int:
        return len(self.toks)

    def crop(self, n: int) -> None:
        del self.toks[n:]

    def forward(self, ids: list[int], last_only: bool = True, keep: int = 0) -> torch.Tensor:
        self.toks.extend(ids)
        gen = self.toks[self.prompt_len:]
        off = next((i for i, t in enumerate(gen) if t != _TRUE), None)
        if off is None:  # on the answer: the record at this position
            pos = self.seq[len(gen)] if len(gen) < len(self.seq) else None
            if pos is None:
                q, tok = UNRECORDED_Q, _TRUE
            elif pos.q is None:  # the calibration's bonus position: priced as fixed setups are (see the module doc)
                q, tok = LOST_Q, _WRONG
            else:
                q, tok = pos.q, (_TRUE if pos.kept else _WRONG)
        else:  # past a rejected draft: the confidences the calibration drafted there
            after = self.seq[off].after if off < len(self.seq) else ()
            j = len(gen) - off - 1
            q, tok = (after[j] if j < len(after) else LOST_Q), _OFF
        q = min(max(q, 1e-4), 1.0 - 1e-7)
        logits = torch.full((_V,), math.log((1.0 - q) / (_V - 1)))
        logits[tok] = math.log(q)
        return logits[None]


class _ReplayDraft:
    def __init__(self, seq: Sequence[Position], prompt_len: int) -> None:
        self.seq, self.prompt_len = seq, prompt_len

    def new_state(self) -> _ReplayState:
        return _ReplayState(self.seq, self.prompt_len)

    def sync(self) -> None:
        """Nothing runs asynchronously here (engines: wait for the device)."""


def replay_auto(prompts: Sequence[PromptCal], drafter: str, setup: str, target: CostProfile, draft: CostProfile | None,
                verify: Sequence[float], counts: dict[str, tuple[int, int, int]] | None = None,
                memory: tuple | None = None, saved: tuple | None = None) -> Priced | None:
    """Price `setup` (the drafter's k=auto) by replaying the policy over each prompt's calibration lane of `drafter`.

    Args:
        prompts: the calibration records, in the order the policy should meet them.
        drafter: the calibration lane's drafter name (a draft model's; lookups have no confidences to replay).
        setup: the setup string the candidate runs as (`draft:…,k=auto[,dtype=…]`).
        target, draft: the cost profiles the real lane would start from (the policy's own prior on costs).
        verify: the verify curve of this run (the finder's, fitted to the calibration's verifies): the replay's time.
        counts: if given, filled with each replayed prompt's (steps, drafted, kept), step 0 included — what a bench
            reports of a lane.
        memory: the key under which what the policy learns carries from prompt to prompt; given, it also carries to
            the next call with the same key (the caller ends it with policy.forget), so prompts of several
            calibrations can be replayed in one order; None: this call's own, forgotten at its end.
        saved: the real pair's key (target and draft profile keys): the first replayed prompt starts, as the pair's
            next real lane will, from what earlier runs saved of it (policy.load_learnt; read only, never written).

    Returns:
        A Priced candidate (k = AUTO_K_MAX, its predicted wall per prompt, α, τ, mean drafts and units per decode
        step), or None where no prompt has a recorded lane of the drafter with confidences.
    """
    key = memory if memory is not None else ("replay", uuid.uuid4().hex)  # apart from real lanes'
    pred: dict[str, float] = {}
    base: dict[str, float] = {}
    cats: dict[str, str] = {}
    tot = dict(tok=0.0, steps=0, acc=0.0, dr=0.0, units=0.0)
    cs, os_ = [], []
    try:
        for pc in prompts:
            lane = pc.lanes.get(drafter)
            if lane is None or pc.base_step_s <= 0 or not any(s.q for s in (*lane.steps, *([lane.step0] if lane.step0 else []))):
                continue
            t1 = pc.base_step_s
            price = StepPrice(tuple(verify), c=lane.draft_s_per_forward / t1, o=lane.overhead_s / t1, o_base=pc.base_overhead_s / t1)
            cs.append(price.c)
            os_.append(price.o)
            # the draft reading the prompt: what the calibration's step 0 took beyond the target's prompt forward and its drafts
            # (the baseline's step 0 stands for the target's prompt forward); the target's prompt forward: the rest of it —
            # so that, as for the fixed setups priced from the same lane (app.core.tuning.price_candidate), step 0 is the
            # calibration lane's, its drafts replaced by k=auto's: a baseline whose own prompt forward ran slow or fast
            # (3.5 s against the lane's 1.4 s on qa-2) moves neither
            per_draft = lane.draft_s_per_forward + price.marginal_verify() * t1
            own_s = max(0.0, lane.prefill_s - (lane.step0.offered if lane.step0 else 0) * per_draft)
            read_s = max(0.0, own_s - pc.base_prefill_s)
            prompt_s = own_s - read_s
            seq = positions(lane)
            n_prompt = read_len(draft, read_s * target.t1_s / t1)  # this run's seconds in the profiles' time
            auto = AutoK(target, draft=draft)
            d = DraftModelDrafter(_ReplayDraft(seq, n_prompt), auto=auto, memory=key, category=pc.category)
            if saved is not None and d.auto is auto:  # nothing recalled: the first prompt, as a real lane's first
                policy.load_learnt(saved, auto, d.calibration)
            prompt = [_PROMPT] * n_prompt
            d.start(prompt)
            ids, n_gen, last, wall, read = list(prompt), 0, None, 0.0, False
            n_steps = n_drafted = n_kept = 0
            while n_gen < pc.new_tokens:
                budget = pc.new_tokens - n_gen - 1
                behind = len(ids) - d.common_prefix(ids)  # what the draft must read first (catching up)
                prop = d.propose(DraftContext(ids, max_k=budget, last=last))
                drafted = prop.ids[: max(0, budget)]
                k = len(drafted)
                a = next((i for i, t in enumerate(drafted) if t != _TRUE), k)
                d.feedback(k, a)
                n_steps, n_drafted, n_kept = n_steps + 1, n_drafted + k, n_kept + a
                t_draft = prop.forwards * price.c * t1
                # the draft reading the prompt, in the first step that drafts (Proposal.read_s), or catching up over the
                # tokens emitted while steps drafted nothing (Proposal.catch_up_s): not a draft forward, kept out of the
                # times the policy learns from. The calibration's draft forwards (c) were at most 2 tokens wide; the rest
                # of a wider one as the draft's profile prices it, from the prompt's recorded reading on
                rs = 0.0
                if prop.forwards and not read:
                    rs = read_s
                    if behind - 1 > n_prompt and draft is not None:  # read late: the tokens emitted since, too
                        rs += price.c * t1 * (draft.t(behind - 1) - draft.t(n_prompt)) / draft.t1_s
                    read = True
                elif prop.forwards and behind > 2 and draft is not None:
                    rs = price.c * t1 * (draft.t(behind) - draft.t(2)) / draft.t1_s
                t_draft += rs
                if n_gen == 0:  # step 0: the prompt's forward verifies the drafts
                    wall += prompt_s + t_draft + k * price.marginal_verify() * t1
                else:
                    t_v = price.v(k + 1) * t1
                    w = t_v + t_draft + price.o * t1
                    wall += w
                    last = StepTiming(k + 1, t_v, t_draft - rs, prop.forwards, w - rs, a + 1)  # as the loop tells a drafter
                    tot["tok"] += a + 1
                    tot["steps"] += 1
                    tot["acc"] += a
                    tot["dr"] += k
                    tot["units"] += w / t1
                ids += [_TRUE] * (a + 1)
                n_gen += a + 1
            pred[pc.prompt_id] = wall
            if counts is not None:
                counts[pc.prompt_id] = (n_steps, n_drafted, n_kept)
            base[pc.prompt_id] = pc.base_wall_s
            cats[pc.prompt_id] = pc.category
    finally:
        if memory is None:
            policy.forget(key)
    if not pred:
        return None
    steps = tot["steps"] or 1
    return Priced(Candidate(drafter, setup, AUTO_K_MAX, auto=True), pred, base, tot["acc"] / tot["dr"] if tot["dr"] else None,
                  tot["tok"] / steps if tot["steps"] else 1.0, tot["dr"] / steps, tot["units"] / steps,
                  sum(cs) / len(cs), sum(os_) / len(os_), cats)
