"""FAKE ``tensorrt_llm.llmapi`` decoding configs: field names as in the TensorRT-LLM 1.2 LLM API reference
(DraftTargetDecodingConfig, NGramDecodingConfig, Eagle3DecodingConfig, MTPDecodingConfig, KvCacheConfig).

Like the real pydantic StrictBaseModel they reject unknown fields; `model_fields` lists the declared ones.
`speculative_model_dir` is accepted as an alias of `speculative_model` (renamed in PR #10099, alias kept).
"""

from __future__ import annotations

from typing import Any, ClassVar


class _Strict:
    model_fields: ClassVar[dict[str, Any]] = {}
    _aliases: ClassVar[dict[str, str]] = {}

    def __init__(self, **kw) -> None:
        for k, v in kw.items():
            name = self._aliases.get(k, k)
            if name not in self.model_fields:
                raise TypeError(f"{type(self).__name__}: extra field {k!r} not permitted")
            setattr(self, name, v)
        for name, default in self.model_fields.items():
            if not hasattr(self, name):
                setattr(self, name, default)


_BASE = {"max_draft_len": None, "max_total_draft_tokens": None, "speculative_model": None, "max_concurrency": None, "load_format": None}
_ALIAS = {"speculative_model_dir": "speculative_model"}


class DraftTargetDecodingConfig(_Strict):
    model_fields = dict(_BASE, decoding_type="Draft_Target")
    _aliases = _ALIAS


class NGramDecodingConfig(_Strict):
    model_fields = dict(_BASE, max_matching_ngram_size=0, is_keep_all=True, is_use_oldest=True, is_public_pool=True, decoding_type="NGram")
    _aliases = _ALIAS


class Eagle3DecodingConfig(_Strict):
    model_fields = dict(_BASE, eagle_choices=None, eagle3_one_model=True, eagle3_layers_to_capture=None, decoding_type="Eagle3")
    _aliases = _ALIAS


class MTPDecodingConfig(_Strict):
    model_fields = dict(
        _BASE, num_nextn_predict_layers=1, use_relaxed_acceptance_for_thinking=False, relaxed_topk=1, relaxed_delta=0.0, decoding_type="MTP"
    )
    _aliases = _ALIAS


class KvCacheConfig(_Strict):
    model_fields = {"free_gpu_memory_fraction": None, "enable_block_reuse": True}
