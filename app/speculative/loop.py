"""The speculative decoding loop: a generator yielding one StepEvent per step, then LaneDone(stats).

Each step: the drafter proposes k ≤ budget−1 tokens; the target runs one forward over
[pending tokens, d_1 … d_k] and the verifier keeps a_t of them plus one target token (correction or bonus);
the target cache is cropped back past the rejected drafts. The pending tokens are the whole prompt in step 0
(so the prefill forward verifies the first drafts too, as transformers' assisted generation does) and the last
emitted token afterwards. The baseline is the same loop with no drafter, so every setup is timed the same way.

Timing (seconds, lane clock): each step's `t_draft_s`/`t_verify_s`/`t_wall_s` wrap its phases (synchronising
CUDA first). Step 0 (prompt forward, with the draft's own prefill) is reported as `prefill_s`; `t_draft_s`,
`t_verify_s` and `draft_forwards` of LaneStats count the later steps only, so per-step costs and c are not
skewed by prompt length. A draft that reads the prompt in a later step (k=auto's, in the first step it drafts:
Proposal.read_s) has that reading counted in `prefill_s` as well, and kept out of the times the drafter learns from.
`wall_s` is the whole generation, prefill included (Spec-Bench's convention); `ttft_s` is lane start → first token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from app.core.accounting import LaneRecorder, StepFacts
from app.core.costs import LaneCosts
from app.core.errors import SetupError
from app.core.events import StepEvent, TreeStep
from app.core.setups import Sampling
from app.engines.base import StepEngine
from app.speculative.drafters import DraftContext, Drafter, NoDrafter
from app.speculative.policy import StepTiming
from app.speculative.tree import DraftTree, chain_parents, verify_tree_greedy, verify_tree_sampling
from app.speculative.verifier import verify_greedy, verify_sampling, warp

__all__ = ["LoopRunner", "make_generator"]


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


class LoopRunner:
    """Our speculative loop as a lane runner: the drafter proposes, the target verifies in one forward.

    Args:
        target: an Engine with step-by-step decode states (the model whose distribution is preserved).
        drafter: the setup's drafter; None (or NoDrafter) for the baseline.
        costs: the target's verify-cost curve and the draft's cost (from cost profiles), put in the lane's stats
            for the predicted theory; None when there is no profile.
    """

    def __init__(self, target: StepEngine, drafter: Drafter | None = None, costs: LaneCosts | None = None) -> None:
        if not isinstance(target, StepEngine):
            from app.core.setups import kinds

            own = [f"{k.prefix}:{target.name}" for k in kinds() if k.engine and k.engine.backends and target.backend in k.engine.backends]
            raise SetupError(f"{target.name} ({target.backend}) decodes inside its own library or server: our loop cannot verify drafts on it",
                             fix=f"on {target.name} run baseline@{target.name}" + (f" or {' or '.join(own)}" if own else "")
                             + "; draft:/ngram lanes need an hf or llamacpp target")
        self.engine = target
        self.drafter = drafter or NoDrafter()
        self.costs = costs

    def run(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool]) -> Iterator[StepEvent]:
        if not prompt_ids:
            raise ValueError("empty prompt")
        target, drafter = self.engine, self.drafter
        rec.costs = self.costs
        sampling = sampling.validated()
        gen = make_generator(sampling.seed)
        tstate: Any = target.new_state()  # hf states also hold `hidden` (capture_hidden)
        if drafter.wants_hidden:
            if not target.supports_hidden:
                raise SetupError(f"{target.name} ({target.backend}) does not expose its hidden states, which this drafter needs",
                                 fix="run ReDrafter lanes on an hf (PyTorch) target")
            tstate.capture_hidden = True
        try:
            yield from self._steps(rec, prompt_ids, sampling, cancelled, tstate, gen)
        finally:  # a drafter that learns keeps what this lane taught it, however the lane ended
            finish = getattr(drafter, "finish", None)
            if finish is not None:
                finish()
            for note in getattr(drafter, "notes", ()):  # what it has to say of the lane as a whole (kept once each)
                rec.note(note)

    def _steps(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool], tstate, gen) -> Iterator[StepEvent]:
        target, drafter = self.engine, self.drafter
        seq = list(prompt_ids)
        pending = list(prompt_ids)  # fed to the target before the drafts: the prompt, then the last token
        last: StepTiming | None = None  # the previous decode step's times (cost-aware drafters)
        hidden = None  # the target's hidden state that produced the last token (drafters that want it)
        while not rec.done:
            if rec.steps > 0 and cancelled():
                rec.stop("cancelled")
                return
            t0 = rec.begin_step()
            if rec.steps == 0:
                drafter.start(list(prompt_ids))
                for note in getattr(drafter, "notes", ()):
                    rec.note(note)
            ctx = DraftContext(seq, rec.remaining - 1, sampling.temperature, sampling.top_k, sampling.top_p, gen, target.eos_ids, last, hidden)
            prop = drafter.propose(ctx)
            if prop.parents is not None and prop.ids and prop.parents != chain_parents(len(prop.ids)):
                ev, row, k = *self._tree_step(rec, tstate, pending, prop, sampling, gen, t0), len(prop.ids)
            else:
                ev, row, k = self._chain_step(rec, tstate, pending, prop, sampling, gen, t0)
            if drafter.wants_hidden:
                hidden = tstate.hidden[row]
            if ev.step > 0:  # the draft reading the prompt, or catching up, is not a draft forward (Proposal.read_s, catch_up_s)
                read = min(prop.read_s + prop.catch_up_s, ev.t_draft_s)
                last = StepTiming(k + 1, ev.t_verify_s, ev.t_draft_s - read, prop.forwards, ev.t_wall_s - read, len(ev.emitted_ids))
            seq.extend(ev.emitted_ids)
            if ev.emitted_ids:
                pending = [ev.emitted_ids[-1]]
            yield ev

    def _chain_step(self, rec: LaneRecorder, tstate, pending: list[int], prop, sampling: Sampling, gen, t0: float) -> tuple[StepEvent, int, int]:
        """One step verifying a chain of drafts: one target forward over [pending, d_1 … d_k], the verifier's verdict,
        the cache cropped past the rejected drafts. Returns the event, the logits row that produced the target token
        (after the kept drafts) and k."""
        drafted = prop.ids[: max(0, rec.remaining - 1)]
        k = len(drafted)
        self.engine.sync()
        t1 = rec.clock()
        base_len = tstate.length
        logits = tstate.forward([*pending, *drafted], keep=k + 1)  # [k + 1, V]
        if sampling.greedy:
            verdict = verify_greedy(logits, drafted)
            probs = logits.softmax(-1)
        else:
            probs = warp(logits.cpu(), sampling.temperature, sampling.top_k, sampling.top_p)  # [k + 1, V]
            q = prop.q[:k].cpu() if prop.q is not None else None
            verdict = verify_sampling(probs, q, drafted, gen)
        a = verdict.accepted
        tstate.crop(base_len + len(pending) + a)
        self.engine.sync()
        t2 = rec.clock()
        self.drafter.feedback(k, a)

        def t_probs(a_final: int, target_id: int | None) -> list[float]:
            # p(accepted drafts), p(first rejected draft), p(target token): one gather
            rows = list(range(min(k, a_final + 1)))
            cols = drafted[: len(rows)]
            if target_id is not None:
                rows.append(a_final)
                cols.append(target_id)
            return probs[rows, cols].tolist() if rows else []

        alts = prop.alts[a] if prop.alts and a < min(k, len(prop.alts)) else None
        ev = rec.step(StepFacts(
            [*drafted[:a], verdict.target_id],
            accepted=a,
            drafted_ids=drafted,
            correction_rank=(alts.index(verdict.target_id) + 1 if verdict.target_id in alts else 0) if alts else None,
            t_draft_s=t1 - t0,
            t_verify_s=t2 - t1,
            t_read_s=prop.read_s,
            t_start=t0,
            draft_forwards=prop.forwards,
            draft_probs=prop.q_drafted[:k] if prop.q_drafted else None,
            target_probs=t_probs,
            why=prop.why,
        ))
        return ev, a, k

    def _tree_step(self, rec: LaneRecorder, tstate, pending: list[int], prop, sampling: Sampling, gen, t0: float) -> tuple[StepEvent, int]:
        """One step verifying a token tree: one target forward over every node (tree attention), the accepted path
        kept in the cache, the rest dropped (app.speculative.tree). Returns the event and the logits row (0: the
        root, 1 + node) that produced the target token."""
        tree = DraftTree(prop.ids, prop.parents, prop.q, prop.q_drafted)
        n, lp = len(tree), len(pending)
        self.engine.sync()
        t1 = rec.clock()
        base_len = tstate.length
        slot = base_len + lp  # the first node's cache slot; a node's parent is the root (the last pending token) or a node
        parents = [base_len + i - 1 for i in range(lp)] + [slot - 1 if p < 0 else slot + p for p in tree.parents]
        logits = tstate.forward_tree([*pending, *tree.ids], parents, keep=n + 1)  # [n + 1, V]
        if sampling.greedy:
            verdict = verify_tree_greedy(logits, tree)
            probs = logits.softmax(-1)
        else:
            probs = warp(logits.cpu(), sampling.temperature, sampling.top_k, sampling.top_p)
            verdict = verify_tree_sampling(probs, tree, gen)
        path = list(verdict.path)
        tstate.select([*range(slot), *(slot + j for j in path)])
        self.engine.sync()
        t2 = rec.clock()
        a = len(path)
        self.drafter.feedback(n, a)
        # shown inline: the accepted path, then the draft's first choice below where it ends (the rejected line)
        line = path + tree.main_line(path[-1] if path else -1)
        q = tree.q_drafted or []

        def t_probs(a_final: int, target_id: int | None) -> list[float]:
            rows = [0] + [j + 1 for j in line]  # row of each line node's parent: the root, then the line before it
            out = [float(probs[rows[i], tree.ids[line[i]]]) for i in range(min(len(line), a_final + 1))]
            if target_id is not None:
                out.append(float(probs[rows[a_final], target_id]))
            return out

        ev = rec.step(StepFacts(
            [*(tree.ids[j] for j in path), verdict.target_id],
            accepted=a,
            drafted_ids=[tree.ids[j] for j in line],
            drafted_count=n,
            kind="bonus" if verdict.is_bonus(tree) else "correction",
            t_draft_s=t1 - t0,
            t_verify_s=t2 - t1,
            t_read_s=prop.read_s,
            t_start=t0,
            draft_forwards=prop.forwards,
            draft_probs=[q[j] for j in line] if q else None,
            target_probs=t_probs,
            why=prop.why,
            tree=TreeStep(tuple(tree.ids), tuple(tree.parents), tuple(path), q=tuple(q), searches=tuple(prop.searches or ())),
        ))
        return ev, (path[-1] + 1 if path else 0)
