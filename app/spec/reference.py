"""Reference lanes: transformers' own speculative implementations, timed like ours.

`hf-assisted:<engine>[,k=N]` runs `model.generate(assistant_model=...)`; `hf-lookup[:k=N]` runs
`model.generate(prompt_lookup_num_tokens=N)`. transformers exposes no per-step accept/reject, so these lanes
yield tokens only: one StepEvent (kind "reference") per chunk its streamer receives (one per target step),
with drafted/accepted unknown (reported as 0).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from app.core.events import RunDone, StepEvent
from app.core.metrics import LaneStats
from app.core.setups import HFAssisted, HFLookup, Sampling

__all__ = ["run_reference_lane"]


class _Recorder:
    """A transformers streamer (duck-typed BaseStreamer) that timestamps each chunk of new tokens."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.chunks: list[tuple[float, list[int]]] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        ids = value.reshape(-1).tolist()
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.chunks.append((self.clock(), [int(i) for i in ids]))

    def end(self) -> None:
        pass


def run_reference_lane(
    target,
    setup: HFAssisted | HFLookup,
    prompt_ids: list[int],
    sampling: Sampling,
    *,
    draft=None,
    lane_id: str = "lane",
    prompt_id: str = "prompt",
    repeat: int = 0,
    clock=time.perf_counter,
) -> Iterator[StepEvent | RunDone]:
    """Run one reference lane (blocking inside generate; events are yielded after it returns).

    Args:
        target: HFEngine of the target.
        setup: HFAssisted (needs `draft`, an HFEngine) or HFLookup.
    """
    sampling = sampling.validated()
    model = target.model
    x = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
    kw: dict = dict(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=sampling.max_new_tokens,
        min_new_tokens=0,
        pad_token_id=next(iter(target.eos_ids), None),
        eos_token_id=sorted(target.eos_ids) or None,
    )
    if sampling.greedy:
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
        torch.manual_seed(sampling.seed)
    overrides: dict = {}
    if isinstance(setup, HFAssisted):
        assert draft is not None
        if setup.k is not None:
            overrides = {"num_assistant_tokens": setup.k, "num_assistant_tokens_schedule": "constant"}
        kw["assistant_model"] = draft.model
    else:
        kw["prompt_lookup_num_tokens"] = setup.k
    rec = _Recorder(clock)
    kw["streamer"] = rec
    sync = getattr(target, "sync", lambda: None)
    # transformers reads the assistant's settings from the assistant model's generation_config (and its
    # candidate generator may update num_assistant_tokens in place): set ours for this call only and put the
    # model's own back afterwards, so the next lane on the same draft engine sees transformers' defaults.
    gc = draft.model.generation_config if isinstance(setup, HFAssisted) else None
    saved = {key: getattr(gc, key, None) for key in ("num_assistant_tokens", "num_assistant_tokens_schedule")} if gc is not None else {}
    try:
        for key, value in overrides.items():
            setattr(gc, key, value)
        t0 = clock()
        with torch.inference_mode():
            model.generate(**kw)
        sync()
        t_end = clock()
    finally:
        for key, value in saved.items():
            setattr(gc, key, value)
    detok = target.detokenizer(prompt_ids)
    out: list[int] = []
    text: list[str] = []
    prev = t0
    for step, (t, ids) in enumerate(rec.chunks):
        pieces = [detok.push(i) for i in ids]
        out.extend(ids)
        text.extend(pieces)
        yield StepEvent(lane_id, step, (), 0, ids[-1], "reference", 0.0, 0.0, t - prev, tuple(ids), tuple(pieces), t_s=t - t0)
        prev = t
    wall = t_end - t0
    ttft = (rec.chunks[0][0] - t0) if rec.chunks else wall
    stats = LaneStats(
        setup=setup.label,
        prompt_id=prompt_id,
        repeat=repeat,
        new_tokens=len(out),
        wall_s=wall,
        ttft_s=ttft,
        prefill_s=ttft,
        steps=len(rec.chunks),
        drafted=0,
        accepted=0,
        draft_forwards=0,
        t_draft_s=0.0,
        t_verify_s=0.0,
        output_ids=tuple(out),
        output_text="".join(text),
        stop_reason="eos" if out and out[-1] in target.eos_ids else "length",
        reference=True,
    )
    yield RunDone(lane_id, stats)
