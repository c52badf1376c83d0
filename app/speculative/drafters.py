"""Drafters: propose tokens given a context object; receive feedback of how many were accepted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from app.speculative.verifier import sample, warp

__all__ = ["DraftContext", "Proposal", "Drafter", "NoDrafter", "NGramDrafter", "DraftModelDrafter"]


@dataclass
class DraftContext:
    """What a drafter sees each step.

    Attributes:
        ids: the whole sequence so far (prompt + generated); do not mutate.
        max_k: the most tokens worth proposing now (token budget left − 1).
        temperature, top_k, top_p: the run's sampling (drafters sample with the same warp).
        generator: the lane's random source.
    """

    ids: list[int]
    max_k: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    eos_ids: frozenset[int] = field(default_factory=frozenset)


@dataclass
class Proposal:
    """ids: drafted tokens; q: their draft distributions [k, V] when sampled from a model (else None);
    q_drafted: q(d_i) per token when known (tooltips); forwards: draft model forward passes spent."""

    ids: list[int]
    q: torch.Tensor | None = None
    q_drafted: list[float] | None = None
    forwards: int = 0


class Drafter(Protocol):
    k: int

    def start(self, prompt_ids: list[int]) -> None: ...

    def propose(self, ctx: DraftContext) -> Proposal: ...

    def feedback(self, drafted: int, accepted: int) -> None: ...


class NoDrafter:
    """The baseline: nothing drafted, one target token per step."""

    k = 0

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
    """

    def __init__(self, n: int = 3, k: int = 8) -> None:
        self.n, self.k = n, k
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(n + 1)]
        self._indexed = 0  # n-grams ending before this position are indexed

    def start(self, prompt_ids: list[int]) -> None:
        self._index = [{} for _ in range(self.n + 1)]
        self._indexed = 0

    def _update(self, ids: list[int]) -> None:
        # index n-grams ending at `end` (inclusive) whose continuation ids[end + 1] exists
        for end in range(self._indexed, len(ids) - 1):
            for m in range(1, self.n + 1):
                s = end - m + 1
                if s >= 0:
                    self._index[m][tuple(ids[s : end + 1])] = end + 1
        self._indexed = max(self._indexed, len(ids) - 1)

    def propose(self, ctx: DraftContext) -> Proposal:
        k = min(self.k, ctx.max_k)
        if k <= 0:
            return Proposal([])
        ids = ctx.ids
        self._update(ids)
        for m in range(min(self.n, len(ids)), 0, -1):
            start = self._index[m].get(tuple(ids[-m:]))
            if start is not None:
                return Proposal(list(ids[start : start + k]))
        return Proposal([])

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
    """

    def __init__(self, engine, k: int = 4, schedule: str = "constant", stop: float = 0.0, cstop: float = 0.0) -> None:
        self.engine = engine
        self.k = k
        self.schedule = schedule
        self.stop = stop
        self.cstop = cstop
        self.state = engine.new_state()
        self.seen: list[int] = []  # ids in the draft's cache

    def start(self, prompt_ids: list[int]) -> None:
        self.state = self.engine.new_state()
        self.seen = []
        if len(prompt_ids) > 1:
            self.state.forward(prompt_ids[:-1], last_only=True)
            self.seen = list(prompt_ids[:-1])

    def propose(self, ctx: DraftContext) -> Proposal:
        k = min(self.k, ctx.max_k)
        if k <= 0:
            return Proposal([])
        ids = ctx.ids
        # roll back to the common prefix with the real sequence, keep at least one id to feed
        common = 0
        lim = min(len(self.seen), len(ids) - 1)
        while common < lim and self.seen[common] == ids[common]:
            common += 1
        if common < len(self.seen):
            self.state.crop(common)
            del self.seen[common:]
        feed = ids[common:]
        sampling = ctx.temperature > 0
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        q_drafted: list[float] = []
        forwards = 0
        p_all = 1.0
        while True:
            logits = self.state.forward(feed, last_only=True)[-1]  # [V]
            forwards += 1
            self.seen.extend(feed)
            if sampling:
                q = warp(logits[None], ctx.temperature, ctx.top_k, ctx.top_p)[0]
                tok = sample(q, ctx.generator)
                qs.append(q)
                q_drafted.append(float(q[tok]))
            else:
                tok = int(logits.argmax())
                q_drafted.append(float(logits.softmax(-1)[tok]))
            drafted.append(tok)
            p_all *= q_drafted[-1]
            if len(drafted) >= k or tok in ctx.eos_ids or q_drafted[-1] < self.stop or p_all < self.cstop:
                break
            feed = [tok]
        return Proposal(drafted, torch.stack(qs) if sampling else None, q_drafted, forwards)

    def feedback(self, drafted: int, accepted: int) -> None:
        if self.schedule == "heuristic" and drafted:
            self.k = self.k + 2 if accepted == drafted else max(1, self.k - 1)
