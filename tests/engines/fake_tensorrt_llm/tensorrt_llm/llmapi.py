"""FAKE ``tensorrt_llm.llmapi`` decoding configs, as TensorRT-LLM **1.2.0** declares them
(``tensorrt_llm/llmapi/llm_args.py`` of the 1.2.0 docs snapshot): DraftTargetDecodingConfig, NGramDecodingConfig,
EagleDecodingConfig (1.2.0 has no Eagle3DecodingConfig: EAGLE-3 is EagleDecodingConfig with eagle3_one_model),
MTPDecodingConfig, KvCacheConfig.

As strict as the real pydantic models: unknown fields raise ValueError (pydantic's ValidationError is one);
`model_fields` lists the declared ones; every decoding config inherits DecodingBaseConfig's fields, among them
`allow_advanced_sampling = False` ("only applicable to 1-model code paths"). Validators mirrored:
EagleDecodingConfig raises ValueError("max_draft_len is required for Eagle"); MTPDecodingConfig.__init__ sets
max_draft_len (and max_total_draft_tokens) to num_nextn_predict_layers when that is given; NGram's
max_matching_ngram_size defaults to 0 (the LLM's validator then refuses it, see ``tensorrt_llm.LLM``).
`speculative_model_dir` is accepted as an alias of `speculative_model` (AliasChoices).
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
                raise ValueError(f"1 validation error for {type(self).__name__}\n{k}\n  Extra inputs are not permitted")
            setattr(self, name, v)
        for name, default in self.model_fields.items():
            if not hasattr(self, name):
                setattr(self, name, default)


_BASE = {
    "max_draft_len": None,
    "max_total_draft_tokens": None,
    "speculative_model": None,
    "max_concurrency": None,
    "load_format": None,
    "acceptance_window": None,
    "acceptance_length_threshold": None,
    "allow_advanced_sampling": False,
}
_ALIAS = {"speculative_model_dir": "speculative_model"}


class DraftTargetDecodingConfig(_Strict):
    model_fields = dict(_BASE, decoding_type="Draft_Target")
    _aliases = _ALIAS


class NGramDecodingConfig(_Strict):
    model_fields = dict(_BASE, max_matching_ngram_size=0, is_keep_all=True, is_use_oldest=True, is_public_pool=True, decoding_type="NGram")
    _aliases = _ALIAS


class EagleDecodingConfig(_Strict):
    model_fields = dict(
        _BASE, eagle_choices=None, greedy_sampling=True, posterior_threshold=None, use_dynamic_tree=False, dynamic_tree_max_topK=None,
        num_eagle_layers=None, max_non_leaves_per_layer=None, eagle3_one_model=True, eagle3_layers_to_capture=None, decoding_type="Eagle",
    )
    _aliases = _ALIAS

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        if self.max_draft_len is None:
            raise ValueError("max_draft_len is required for Eagle")


class MTPDecodingConfig(_Strict):
    model_fields = dict(
        _BASE, num_nextn_predict_layers=1, use_relaxed_acceptance_for_thinking=False, relaxed_topk=1, relaxed_delta=0.0,
        use_mtp_vanilla=False, mtp_eagle_one_model=True, decoding_type="MTP",
    )
    _aliases = _ALIAS

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        if "num_nextn_predict_layers" in kw:
            self.max_draft_len = kw["num_nextn_predict_layers"]
            self.max_total_draft_tokens = kw["num_nextn_predict_layers"]


class KvCacheConfig(_Strict):
    model_fields = {"free_gpu_memory_fraction": None, "enable_block_reuse": True, "max_tokens": None}
