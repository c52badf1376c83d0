"""Shared fixtures: real SmolLM2 weights (converted once into the cache) and tiny random models built from a
config (real transformers models, fast) that share SmolLM2's tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SMOL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder (converted from the package's GGUF on first use)."""
    from app.engines.cache import prepare
    from app.engines.registry import resolve

    return prepare(resolve(SMOL))


def _tiny(folder: Path, tok_dir: Path, seed: int, hidden: int, layers: int, noise: float = 0.0) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    # Unit-scale embeddings and an untied head give varied, peaked next-token distributions (a tied head makes
    # a random model repeat its input), so drafts are sometimes accepted and sometimes rejected.
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.1)
        if noise:  # a draft that mostly agrees with the target: the same init, perturbed
            g = torch.Generator().manual_seed(seed + 1000)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * noise * (p.std() if p.numel() > 1 else 0.0))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_pair(smollm2_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): tiny random Llama models (vocab 49152, SmolLM2 tokenizer), as HF folders.

    The draft is the target's random init perturbed with noise, so it agrees often but not always.

    Engine arguments can be these folder paths directly.
    """
    root = tmp_path_factory.mktemp("tiny")
    return _tiny(root / "tiny-target", smollm2_dir, 0, 64, 2), _tiny(root / "tiny-draft", smollm2_dir, 0, 64, 2, noise=0.2)
