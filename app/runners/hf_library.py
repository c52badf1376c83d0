"""Reference lanes: transformers' own speculative implementations, timed like ours.

`hf-assisted:<engine>[,k=N]` runs `model.generate(assistant_model=...)`; `hf-lookup[:k=N]` runs
`model.generate(prompt_lookup_num_tokens=N)`. transformers' API reports no per-step accept/reject, so the lane reads
its steps from the models themselves: forward hooks on the target and the assistant time every forward, and each
target forward's input is a verify — the last token, then the candidates (on the first, the prompt, then the
candidates) — followed by one chunk to the streamer, the kept candidates and the target's token. One step per target
forward: its candidates, how many the chunk kept, its draft forwards and their time, each draft's confidence q
(greedy: the assistant's top probability at the position it drafted), its verify time. Where the
forwards and chunks do not line up so (another transformers), the lane falls back to tokens only: one step (kind
"library") per chunk, drafting unknown, and says so in its notes. The shared LaneRecorder builds events and stats.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from app.core.accounting import LaneRecorder, StepFacts
from app.core.errors import SpecDeckError
from app.core.events import StepEvent
from app.core.setups import Sampling

__all__ = ["LibraryRunner", "steps_from_forwards"]


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


class _Forwards:
    """Forward hooks on transformers' models inside `generate`: every forward's role ("verify": the target,
    "draft": the assistant), start and end on the lane's clock, a verify's input ids, and with `confidence` a draft
    forward's confidence — its top token's probability at the last position, which a greedy assistant drafts (read
    after the forward's end is stamped, so its draft time is the forward's own)."""

    def __init__(self, clock, sync, confidence: bool = False) -> None:
        self.clock, self.sync, self.confidence = clock, sync, confidence
        # [role, t0, t1 (None while running), the verify's input ids, a draft's confidence (None: not read)]
        self.calls: list[list] = []
        self._handles: list = []

    def watch(self, model, role: str) -> None:
        open_: list[int] = []

        def pre(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            open_.append(len(self.calls))
            self.calls.append([role, self.clock(), None, ids[0].tolist() if role == "verify" and ids is not None else None, None])

        def post(module, args, output):
            self.sync()  # a GPU forward's time, not its launch
            if open_:
                call = self.calls[open_.pop()]
                call[2] = self.clock()
                logits = getattr(output, "logits", None)
                if role == "draft" and self.confidence and logits is not None:
                    last = logits[0, -1].float()
                    call[4] = float((last.max() - torch.logsumexp(last, dim=-1)).exp())  # its top probability, no softmax copy

        self._handles += [model.register_forward_pre_hook(pre, with_kwargs=True), model.register_forward_hook(post)]

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def steps_from_forwards(calls: list[list], chunks: list[tuple[float, list[int]]], prompt: list[int], t0: float) -> list[StepFacts] | None:
    """One StepFacts per target forward, from the hooks' `calls` and the streamer's `chunks` — or None where they do
    not line up as transformers' assisted and prompt-lookup decoding run (one chunk per verify; a verify's input the
    prompt or the previous chunk's last token, then the candidates). A step's draft_probs are its draft forwards'
    confidences (a call's fifth item) where every one was read and there is one per candidate, else None."""
    verifies = [c for c in calls if c[0] == "verify"]
    if not chunks or len(verifies) != len(chunks) or any(c[2] is None or (c[0] == "verify" and c[3] is None) for c in calls):
        return None
    out: list[StepFacts] = []
    draft_s, forwards, prev_t, prev_last = 0.0, 0, t0, None
    qs: list[float | None] = []
    j = 0
    for role, start, end, ids, *rest in calls:
        if role == "draft":
            draft_s += end - start
            forwards += 1
            qs.append(rest[0] if rest else None)
            continue
        t_chunk, emitted = chunks[j]
        if j == 0:
            if ids[: len(prompt)] != prompt:
                return None
            cand = ids[len(prompt):]
        else:
            if not ids or ids[0] != prev_last:
                return None
            cand = ids[1:]
        a = 0
        while a < min(len(cand), len(emitted)) and cand[a] == emitted[a]:
            a += 1
        read = [q for q in qs if q is not None]
        out.append(StepFacts(emitted, accepted=a, drafted_ids=cand, has_target=a < len(emitted), t_draft_s=draft_s,
                             t_verify_s=end - start, t_wall_s=t_chunk - prev_t, draft_forwards=forwards,
                             draft_probs=read if len(read) == len(qs) == len(cand) > 0 else None))
        draft_s, forwards, prev_t, prev_last, qs = 0.0, 0, t_chunk, emitted[-1] if emitted else prev_last, []
        j += 1
    return out


class LibraryRunner:
    """A transformers reference lane (blocking inside generate; its steps are reported after it returns).

    Args:
        target: HFEngine of the target.
        assistant: HFEngine of the draft for `assisted` (transformers' assisted generation), else None.
        k: num_assistant_tokens (assisted) or prompt_lookup_num_tokens (lookup); None: transformers' defaults.
        costs: the target's verify-cost curve (app.worker.scheduler lane_costs), put in the lane's stats where its
            steps were read: the theory column prices them as it does SpecDeck's lanes' (None: no theory).
    """

    def __init__(self, target, *, assistant=None, k: int | None = None, lookup: bool = False, costs=None) -> None:
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
        self.costs = costs

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
        probe = _Forwards(clock, sync, confidence=sampling.greedy)  # a sampled draft's q needs its distribution
        probe.watch(model, "verify")
        if self.assistant is not None:
            probe.watch(self.assistant.model, "draft")
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
            probe.close()
            for key, value in saved.items():
                setattr(gc, key, value)
        facts = steps_from_forwards(probe.calls, recorder.chunks, list(prompt_ids), t0)
        if facts is not None:
            rec.costs = self.costs  # its steps priced like SpecDeck's lanes' (the theory column)
        else:  # tokens only: each chunk is one target step, its drafting unknown
            rec.note("transformers' steps could not be read from its forwards: tokens only (drafting unknown)")
            facts, prev = [], t0
            for t, ids in recorder.chunks:
                facts.append(StepFacts(ids, accepted=0, kind="library", t_wall_s=t - prev))
                prev = t
        for f in facts:
            yield rec.step(f)
            if rec.done:
                break
        wall = t_end - t0
        ttft = (recorder.chunks[0][0] - t0) if recorder.chunks else wall
        rec.override(wall_s=wall, ttft_s=ttft, prefill_s=ttft, library=True)
