"""Reference lanes: transformers' own speculative implementations, timed like ours.

`hf-assisted:<engine>[,k=N]` runs `model.generate(assistant_model=...)`; `hf-lookup[:k=N]` runs
`model.generate(prompt_lookup_num_tokens=N)`. transformers exposes no per-step accept/reject, so these lanes
yield tokens only: one step (kind "library") per chunk its streamer receives (one per target step),
with drafted/accepted unknown (reported as 0); the shared LaneRecorder builds events and stats.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from app.core.accounting import LaneRecorder, StepFacts
from app.core.errors import SpecDeckError
from app.core.events import StepEvent
from app.core.setups import Sampling

__all__ = ["LibraryRunner"]


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


class LibraryRunner:
    """A transformers reference lane (blocking inside generate; its steps are reported after it returns).

    Args:
        target: HFEngine of the target.
        assistant: HFEngine of the draft for `assisted` (transformers' assisted generation), else None.
        k: num_assistant_tokens (assisted) or prompt_lookup_num_tokens (lookup); None: transformers' defaults.
    """

    def __init__(self, target, *, assistant=None, k: int | None = None, lookup: bool = False) -> None:
        from app.engines.hf import HFEngine

        if not isinstance(target, HFEngine):
            raise SpecDeckError(f"transformers' own lanes need a Hugging Face target, {target.name} is {target.backend}",
                                fix="use an hf engine as --target")
        if lookup == (assistant is not None):
            raise ValueError("give an assistant (assisted generation) or lookup=True")
        self.engine = target
        self.assistant = assistant
        self.k = k
        self.lookup = lookup

    def run(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled) -> Iterator[StepEvent]:
        target = self.engine
        sampling = sampling.validated()
        clock = rec.clock
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
        if self.assistant is not None:
            if self.k is not None:
                overrides = {"num_assistant_tokens": self.k, "num_assistant_tokens_schedule": "constant"}
            kw["assistant_model"] = self.assistant.model
        else:
            kw["prompt_lookup_num_tokens"] = self.k if self.k is not None else 10
        recorder = _Recorder(clock)
        kw["streamer"] = recorder
        sync = target.sync
        # transformers reads the assistant's settings from the assistant model's generation_config (and its
        # candidate generator may update num_assistant_tokens in place): set ours for this call only and put the
        # model's own back afterwards, so the next lane on the same draft engine sees transformers' defaults.
        gc = self.assistant.model.generation_config if self.assistant is not None else None
        keys = ("num_assistant_tokens", "num_assistant_tokens_schedule")
        saved = {key: getattr(gc, key, None) for key in keys} if gc is not None else {}
        try:
            for key, value in overrides.items():
                setattr(gc, key, value)
            t0, c0 = clock(), time.process_time()
            with torch.inference_mode():
                model.generate(**kw)
            sync()
            t_end = clock()
            rec.note_stall(t_end - t0, time.process_time() - c0)
        finally:
            for key, value in saved.items():
                setattr(gc, key, value)
        prev = t0
        for t, ids in recorder.chunks:
            # transformers exposes no per-step accept/reject: each chunk is one target step, tokens only
            yield rec.step(StepFacts(ids, accepted=0, kind="library", t_wall_s=t - prev))
            prev = t
            if rec.done:
                break
        wall = t_end - t0
        ttft = (recorder.chunks[0][0] - t0) if recorder.chunks else wall
        rec.override(wall_s=wall, ttft_s=ttft, prefill_s=ttft, library=True)
