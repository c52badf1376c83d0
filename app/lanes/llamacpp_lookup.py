"""`llamacpp-lookup[:k=N,n=M]`: llama-cpp-python's own prompt-lookup decoding on a llama.cpp target (a library lane: tokens only)."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.setups import SetupBase, SetupKind, param, register

__all__ = ["LlamaCppLookup", "KIND"]


@dataclass(frozen=True)
class LlamaCppLookup(SetupBase):
    """Reference lane: llama-cpp-python's `LlamaPromptLookupDecoding` in `Llama.generate`; tokens only."""

    prefix = "llamacpp-lookup"

    k: int = param(10, min=1, max=256, always=True, help="num_pred_tokens: tokens proposed per lookup")
    n: int = param(2, min=1, max=16, help="max_ngram_size: the longest n-gram matched")


def build(setup: LlamaCppLookup, env):
    from app.runners.llamacpp_lookup import LlamaLookupRunner

    return LlamaLookupRunner(env.target(), k=setup.k, n=setup.n)


KIND = register(SetupKind(LlamaCppLookup, "llamacpp-lookup", "library lane: llama-cpp-python's prompt lookup decoding (tokens only; llama.cpp target)",
                          build, library=True))
