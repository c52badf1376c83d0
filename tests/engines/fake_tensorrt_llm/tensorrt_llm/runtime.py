"""FAKE ``tensorrt_llm.runtime.ModelRunnerCpp`` (signatures of tensorrt_llm/runtime/model_runner_cpp.py, TensorRT-LLM
1.2): `from_dir(engine_dir, **kw)`; `generate(batch_input_ids, max_new_tokens, end_id, pad_id, streaming,
output_sequence_lengths, return_dict, draft_tokens_list=None, **sampling)` → dict `output_ids [BS, 1, len]`
(prompt included) and `sequence_lengths [BS, 1]`, or a generator of such dicts when streaming.

An engine_dir whose name contains "draft" behaves as the toy draft model, any other as the toy target. With
`draft_tokens_list` the target runs one verification iteration: the drafts it agrees with, then its own token.
With `_toy.MAX_SEQ_LEN` set, no call returns tokens past that sequence length (a built engine's max_seq_len).
"""

from __future__ import annotations

import torch

from . import _toy


class ModelRunnerCpp:
    instances: list[ModelRunnerCpp] = []

    def __init__(self, engine_dir: str, kwargs: dict) -> None:
        self.engine_dir = engine_dir
        self.kwargs = kwargs
        self.calls: list[dict] = []
        self.is_draft = "draft" in str(engine_dir)

    @classmethod
    def from_dir(cls, engine_dir: str, **kwargs) -> ModelRunnerCpp:
        r = cls(engine_dir, kwargs)
        cls.instances.append(r)
        return r

    def _pack(self, seq: list[int]) -> dict:
        return {"output_ids": torch.tensor([[seq]], dtype=torch.int32), "sequence_lengths": torch.tensor([[len(seq)]], dtype=torch.int32)}

    def generate(
        self,
        batch_input_ids,
        max_new_tokens: int,
        end_id: int,
        pad_id: int,
        streaming: bool = False,
        output_sequence_lengths=False,
        return_dict=False,
        draft_tokens_list=None,
        **kw,
    ):
        assert len(batch_input_ids) == 1 and batch_input_ids[0].dtype == torch.int32
        assert return_dict and output_sequence_lengths
        seq = batch_input_ids[0].tolist()
        room = max(0, _toy.MAX_SEQ_LEN - len(seq)) if _toy.MAX_SEQ_LEN is not None else max_new_tokens
        self.calls.append(
            {"input_len": len(seq), "max_new_tokens": max_new_tokens, "draft_tokens_list": draft_tokens_list, "streaming": streaming, **kw}
        )
        nxt = _toy.draft_next if self.is_draft else _toy.target_next
        if draft_tokens_list is not None:
            out: list[int] = []
            for d in draft_tokens_list[0]:
                t = nxt(seq + out)
                out.append(t)
                if t != d or t == end_id:
                    break
            else:
                out.append(nxt(seq + out))
            return self._pack(seq + out[: min(max_new_tokens, room)])
        gen = _toy.greedy(seq, min(max_new_tokens, room), nxt, end_id)
        if not streaming:
            return self._pack(seq + gen)
        k = _toy.STREAM_K

        def stream():
            done = 0
            for n in _toy.chunk_sizes(len(gen), k):
                done += n
                yield self._pack(seq + gen[:done])

        return stream()
