"""FAKE ``tensorrt_llm.runtime.ModelRunnerCpp``, following ``tensorrt_llm/runtime/model_runner_cpp.py`` of
TensorRT-LLM 1.2.0 (its docs snapshot).

* ``from_dir(engine_dir, **kw)`` takes only the keyword arguments the real one declares (others: TypeError). Its
  limits come from the engine folder's ``config.json`` (``build_config.max_input_len`` / ``max_seq_len``, as
  trtllm-build writes them) or, without one, from ``_toy.MAX_INPUT_LEN`` / ``_toy.MAX_SEQ_LEN``; the
  ``max_input_len`` / ``max_output_len`` arguments narrow them as in the real one. They are plain attributes
  ``max_input_len`` / ``max_seq_len``.
* ``generate(batch_input_ids, max_new_tokens, end_id, pad_id, streaming, output_sequence_lengths, return_dict,
  draft_tokens_list=None, **sampling)`` → dict ``output_ids [BS, 1, len]`` (prompt included) and
  ``sequence_lengths [BS, 1]``, or a generator of such dicts when streaming. Like ``_check_inputs``, an input
  longer than max_input_len, or input + max_new_tokens beyond max_seq_len, raises RuntimeError.
* Sampling as the C++ kernels do it: top_p 0.0 is turned into None (C++ default 0.0), top_k defaults to 0, and
  k == 0 with p == 0 means greedy (k = 1); top_k 1 is greedy too; anything else samples (``_toy.sampled_next``
  with random_seed).
* With ``draft_tokens_list`` the target verifies the drafts in its first iteration (the drafts it agrees with,
  then its own token) and then, like any request, keeps generating until max_new_tokens or end_id.

An engine_dir whose name contains "draft" behaves as the toy draft model, any other as the toy target.
torch is imported lazily (the worker-environment test runs the fake's LLM API in an environment without torch).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import _toy

_FROM_DIR_ARGS = frozenset(
    """lora_dir rank max_batch_size max_input_len max_output_len max_beam_width max_attention_window_size
    sink_token_length kv_cache_free_gpu_memory_fraction cross_kv_cache_fraction medusa_choices eagle_choices
    eagle_posterior_threshold eagle_use_dynamic_tree eagle_dynamic_tree_max_top_k lookahead_config debug_mode
    lora_ckpt_source gpu_weights_percent max_tokens_in_paged_kv_cache kv_cache_enable_block_reuse
    enable_chunked_context is_enc_dec multi_block_mode enable_context_fmha_fp32_acc cuda_graph_mode
    logits_processor_map device_ids is_orchestrator_mode use_runtime_defaults gather_generation_logits
    use_variable_beam_width_search mm_embedding_offloading fail_fast_on_attention_window_too_large""".split()
)


class ModelRunnerCpp:
    instances: list[ModelRunnerCpp] = []

    def __init__(self, engine_dir: str, kwargs: dict) -> None:
        self.engine_dir = engine_dir
        self.kwargs = kwargs
        self.calls: list[dict] = []
        self.is_draft = "draft" in str(engine_dir)
        cfg = Path(engine_dir) / "config.json"
        build = json.loads(cfg.read_text())["build_config"] if cfg.is_file() else {}
        engine_input = build.get("max_input_len", _toy.MAX_INPUT_LEN)
        engine_seq = build.get("max_seq_len", _toy.MAX_SEQ_LEN)
        self.max_input_len = kwargs.get("max_input_len") or engine_input
        out = kwargs.get("max_output_len")
        self.max_seq_len = engine_seq if out is None else self.max_input_len + out
        if engine_seq is not None and self.max_seq_len is not None:
            assert self.max_seq_len <= engine_seq

    @classmethod
    def from_dir(cls, engine_dir: str, **kwargs) -> ModelRunnerCpp:
        bad = set(kwargs) - _FROM_DIR_ARGS
        if bad:
            raise TypeError(f"from_dir() got an unexpected keyword argument {sorted(bad)[0]!r}")
        r = cls(engine_dir, kwargs)
        cls.instances.append(r)
        return r

    def _pack(self, seq: list[int]) -> dict:
        import torch

        return {"output_ids": torch.tensor([[seq]], dtype=torch.int32), "sequence_lengths": torch.tensor([[len(seq)]], dtype=torch.int32)}

    def _next_rule(self, kw: dict):
        top_p = kw.get("top_p")
        if top_p == 0.0:
            top_p = None  # generate(): top_p 0.0 → None, and the C++ default is 0.0
        top_k = kw.get("top_k") or 0
        p = 0.0 if top_p is None else top_p
        greedy = top_k == 1 or (top_k == 0 and p == 0.0)
        base = _toy.draft_next if self.is_draft else _toy.target_next
        return base if greedy else _toy.sampled_next(int(kw.get("random_seed") or 0) + (7 if self.is_draft else 0))

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
        import torch

        assert len(batch_input_ids) == 1 and batch_input_ids[0].dtype == torch.int32
        assert return_dict and output_sequence_lengths
        seq = batch_input_ids[0].tolist()
        if len(seq) > self.max_input_len:
            raise RuntimeError(f"Maximum input length ({len(seq)}) exceeds the engine or specified limit ({self.max_input_len})")
        if self.max_seq_len is not None and len(seq) + max_new_tokens > self.max_seq_len:
            raise RuntimeError(
                f"Maximum input length ({len(seq)}) + maximum new tokens ({max_new_tokens}) exceeds the engine or specified limit ({self.max_seq_len})"
            )
        self.calls.append(
            {"input_len": len(seq), "max_new_tokens": max_new_tokens, "draft_tokens_list": draft_tokens_list, "streaming": streaming, **kw}
        )
        nxt = self._next_rule(kw)
        if draft_tokens_list is not None:
            out: list[int] = []
            for d in draft_tokens_list[0]:
                t = nxt(seq + out)
                out.append(t)
                if t != d or t == end_id:
                    break
            else:
                out.append(nxt(seq + out))
            out = out[:max_new_tokens]
            if out and out[-1] != end_id and len(out) < max_new_tokens:  # the request goes on as a normal one
                out += _toy.greedy(seq + out, max_new_tokens - len(out), nxt, end_id)
            return self._pack(seq + out)
        gen = _toy.greedy(seq, max_new_tokens, nxt, end_id)
        if not streaming:
            return self._pack(seq + gen)
        k = _toy.STREAM_K

        def stream():
            done = 0
            for n in _toy.chunk_sizes(len(gen), k):
                done += n
                yield self._pack(seq + gen[:done])

        return stream()
