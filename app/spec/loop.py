"""The speculative decoding loop: a generator yielding one StepEvent per step, then RunDone(stats).

Each step: the drafter proposes k ≤ budget−1 tokens; the target runs one forward over
[pending tokens, d_1 … d_k] and the verifier keeps a_t of them plus one target token (correction or bonus);
the target cache is cropped back past the rejected drafts. The pending tokens are the whole prompt in step 0
(so the prefill forward verifies the first drafts too, as transformers' assisted generation does) and the last
emitted token afterwards. The baseline is the same loop with no drafter, so every setup is timed the same way.

Timing (seconds, lane clock): each step's `t_draft_s`/`t_verify_s`/`t_wall_s` wrap its phases (synchronising
CUDA first). Step 0 (prompt forward, with the draft's own prefill) is reported as `prefill_s`; `t_draft_s`,
`t_verify_s` and `draft_forwards` of LaneStats count the later steps only, so per-step costs and c are not
skewed by prompt length. `wall_s` is the whole generation, prefill included (Spec-Bench's convention);
`ttft_s` is lane start → first token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from app.core.events import RunDone, StepEvent
from app.core.metrics import LaneAccumulator, LaneStats
from app.core.setups import Sampling
from app.spec.drafters import DraftContext, Drafter, NoDrafter
from app.spec.verifier import verify_greedy, verify_sampling, warp

__all__ = ["run_lane", "make_generator"]


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


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
) -> Iterator[StepEvent | RunDone]:
    """Decode one prompt with one setup.

    Args:
        target: an Engine (the model whose distribution is preserved).
        drafter: the setup's drafter; None for the baseline.
        prompt_ids: the prompt, already tokenized (chat template applied).
        sampling: temperature/top-k/top-p/seed/max_new_tokens (temperature 0 = greedy).
        cancelled: polled between steps; True ends the lane with RunDone(cancelled=True).

    Yields:
        StepEvent per step, then one RunDone whose `stats` is a LaneStats.
    """
    if not prompt_ids:
        raise ValueError("empty prompt")
    drafter = drafter or NoDrafter()
    sampling = sampling.validated()
    greedy = sampling.greedy
    gen = make_generator(sampling.seed)
    eos = target.eos_ids
    sync = getattr(target, "sync", lambda: None)
    detok = target.detokenizer(prompt_ids)
    acc = LaneAccumulator()
    seq = list(prompt_ids)
    out: list[int] = []
    text: list[str] = []
    stop_reason = "length"
    tsess = target.new_session()
    pending = list(prompt_ids)  # fed to the target before the drafts: the prompt, then the last token
    lane_t = 0.0
    prefill_s = 0.0
    draft_forwards = 0
    step = 0
    while len(out) < sampling.max_new_tokens:
        if step > 0 and cancelled():
            stop_reason = "cancelled"
            break
        t0 = clock()
        if step == 0:
            drafter.start(list(prompt_ids))
        remaining = sampling.max_new_tokens - len(out)
        ctx = DraftContext(seq, remaining - 1, sampling.temperature, sampling.top_k, sampling.top_p, gen, eos)
        prop = drafter.propose(ctx)
        drafted = prop.ids[: max(0, remaining - 1)]
        k = len(drafted)
        sync()
        t1 = clock()
        base_len = tsess.length
        logits = tsess.forward([*pending, *drafted], keep=k + 1)  # [k + 1, V]
        if greedy:
            verdict = verify_greedy(logits, drafted)
            probs = logits.softmax(-1)
        else:
            probs = warp(logits.cpu(), sampling.temperature, sampling.top_k, sampling.top_p)  # [k + 1, V]
            q = prop.q[:k].cpu() if prop.q is not None else None
            verdict = verify_sampling(probs, q, drafted, gen)
        a = verdict.accepted
        tsess.crop(base_len + len(pending) + a)
        sync()
        t2 = clock()
        drafter.feedback(k, a)
        # emitted: accepted drafts then the target token; stop at the first EOS
        emitted = [*drafted[:a], verdict.target_id]
        target_id: int | None = verdict.target_id
        for j, t in enumerate(emitted):
            if t in eos:
                if j < a:
                    a, target_id = j + 1, None
                emitted = emitted[: j + 1]
                stop_reason = "eos"
                break
        pieces = [detok.push(t) for t in emitted[:a]]
        rejected_pieces = detok.peek(drafted[a:]) if a < k else []
        if target_id is not None:
            pieces.append(detok.push(target_id))
        # p(accepted drafts), p(first rejected draft), p(target token): one gather
        rows = list(range(min(k, a + 1)))
        cols = drafted[: len(rows)]
        if target_id is not None:
            rows.append(a)
            cols.append(target_id)
        t_probs = probs[rows, cols].tolist() if rows else []
        seq.extend(emitted)
        out.extend(emitted)
        text.extend(pieces)
        pending = [emitted[-1]]
        t3 = clock()
        lane_t += t3 - t0
        if step == 0:
            prefill_s = t3 - t0
        else:
            draft_forwards += prop.forwards
        ev = StepEvent(
            lane_id=lane_id,
            step=step,
            drafted_ids=tuple(drafted),
            accepted_count=a,
            target_id=target_id,
            target_kind=verdict.kind(k) if target_id is not None else ("bonus" if a == k else "correction"),
            t_draft_s=t1 - t0,
            t_verify_s=t2 - t1,
            t_wall_s=t3 - t0,
            emitted_ids=tuple(emitted),
            pieces=tuple(pieces),
            rejected_pieces=tuple(rejected_pieces),
            draft_probs=tuple(prop.q_drafted[:k]) if prop.q_drafted else None,
            target_probs=tuple(t_probs),
            t_s=lane_t,
        )
        acc.add(ev)
        yield ev
        step += 1
        if stop_reason == "eos":
            break
    first = acc.first
    stats = LaneStats(
        setup=setup,
        prompt_id=prompt_id,
        repeat=repeat,
        new_tokens=len(out),
        wall_s=lane_t,
        ttft_s=prefill_s,
        prefill_s=prefill_s,
        steps=acc.steps,
        drafted=acc.drafted,
        accepted=acc.accepted,
        draft_forwards=draft_forwards,
        t_draft_s=acc.t_draft_s - (first.t_draft_s if first else 0.0),  # decode steps only
        t_verify_s=acc.t_verify_s - (first.t_verify_s if first else 0.0),
        output_ids=tuple(out),
        output_text="".join(text),
        per_position_drafted=tuple(acc.per_position_drafted),
        per_position_accepted=tuple(acc.per_position_accepted),
        stop_reason=stop_reason,
    )
    yield RunDone(lane_id, stats, cancelled=stop_reason == "cancelled")
