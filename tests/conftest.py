"""Shared fixtures: real SmolLM2 weights (converted once into the cache) and tiny random models built from a
config (real transformers models, fast) that share SmolLM2's tokenizer.

Tests that need the real weights (`smollm2_dir`, or an engine named smollm2-135m-instruct) are marked `slow`;
`tiny_pair` reads only the tokenizer from the GGUF, so `pytest -m "not slow"` converts no weights. A fast test
that converts a real model anyway fails (see `_no_real_conversion_in_fast_tests`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _throwaway_profiles() -> None:
    """Cost profiles measured by tests go to a folder removed when the session ends, never into the user's cache: a
    tiny random model's profile is keyed by its weights' hash, so each session's would stay behind as an orphan.
    Worker processes inherit the variable. SPECDECK_PROFILES set by the caller is kept."""
    if os.environ.get("SPECDECK_PROFILES"):
        return
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="specdeck-test-profiles-")
    os.environ["SPECDECK_PROFILES"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


_throwaway_profiles()
# what k=auto learnt is not carried between tests' runs (a session's tiny pair would start each test from the last
# one's); the tests of that memory set their own folder
os.environ["SPECDECK_KAUTO_MEMORY"] = "off"

SMOL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder (converted from the package's GGUF on first use)."""
    from app.engines.cache import prepare
    from app.engines.registry import resolve

    return prepare(resolve(SMOL))


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's real tokenizer without its weights: from the converted cache when it exists, else read from the
    package's GGUF metadata (~10 s, the same call the conversion makes; no tensors are dequantised)."""
    from transformers import AutoTokenizer

    from app.engines.cache import cache_dir, is_cached, source_paths
    from app.engines.registry import resolve

    m = resolve(SMOL)
    if is_cached(m):
        return AutoTokenizer.from_pretrained(str(cache_dir(m)))
    gguf = source_paths(m)[0]
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


_REAL_MODEL_BYTES = 10 << 20  # a GGUF this big is a real model, not a test's hand-made file


def pytest_configure(config):
    """Python's cycle collector runs between tests (and from the Qt event loop's timer during Qt tests), never
    automatically: an automatic collection inside a Qt destructor that calls back into Python can free another Qt
    object there and deadlock Qt (app.ui.main.collect_garbage_in_the_event_loop)."""
    import gc

    gc.disable()
    # the xdist controller (not a worker) with its own vLLM server for the workers (tests.engines.vllm_server)
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        import tempfile

        from tests.engines import vllm_server

        if vllm_server.available():
            os.environ[vllm_server.STATE_ENV] = str(Path(tempfile.mkdtemp(prefix="specdeck-vllm-")) / "state")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """In the xdist controller: the first worker to have collected vLLM's tests starts the one shared server."""
    from tests.engines import vllm_server

    config = node.config
    state = os.environ.get(vllm_server.STATE_ENV)
    if state and vllm_server.EARLY not in config.stash and any(i.startswith("tests/engines/test_vllm.py") for i in ids):
        config.stash[vllm_server.EARLY] = vllm_server.EarlyServer(Path(state))


@pytest.fixture(autouse=True)
def _collect_garbage_between_tests():
    yield
    from app.ui.main import collect_due_garbage

    collect_due_garbage()


@pytest.fixture(autouse=True)
def _no_real_conversion_in_fast_tests(request, monkeypatch):
    """Keep the fast/slow split honest: converting a real GGUF (in this process) fails a test not marked slow."""
    if request.node.get_closest_marker("slow") is not None:
        return
    import app.engines.cache as cache

    real = cache.convert_gguf

    def guarded(gguf: Path, *args, **kwargs):
        # another thread's conversion is not this test's doing (the vLLM server started at collection converts
        # SmolLM2 in a thread of its own on a fresh machine, while fast tests run)
        if threading.current_thread() is threading.main_thread() and gguf.is_file() and gguf.stat().st_size > _REAL_MODEL_BYTES:
            pytest.fail(f"{request.node.nodeid} converts real weights ({gguf.name}): mark it @pytest.mark.slow", pytrace=False)
        return real(gguf, *args, **kwargs)

    monkeypatch.setattr(cache, "convert_gguf", guarded)


def _tiny(folder: Path, tok, seed: int, hidden: int, layers: int, noise: float = 0.0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").is_file():
        return folder
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
    # Seeded, and without moving the global RNG: the models are the same whichever test asks first (random order).
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        # Unit-scale embeddings and an untied head give varied, peaked next-token distributions (a tied head makes
        # a random model repeat its input), so drafts are sometimes accepted and sometimes rejected.
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
def tiny_pair(smollm2_tokenizer, tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): tiny random Llama models (vocab 49152, SmolLM2 tokenizer), as HF folders.

    The draft is the target's random init perturbed with noise, so it agrees often but not always. No real
    weights are loaded: tests using only this fixture are fast.

    Engine arguments can be these folder paths directly.
    """
    root = tmp_path_factory.mktemp("tiny")
    tok = smollm2_tokenizer
    return _tiny(root / "tiny-target", tok, 0, 64, 2), _tiny(root / "tiny-draft", tok, 0, 64, 2, noise=0.2)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """vLLM's server starts in the background as soon as its tests are collected, and its tests run last (after the
    random order is drawn): its start-up (a minute or two) overlaps the other tests instead of adding to them. Under
    pytest-xdist the controller starts the one server every worker uses (pytest_xdist_node_collection_finished)."""
    vllm_items = [it for it in items if it.nodeid.startswith("tests/engines/test_vllm.py")]
    if not vllm_items:
        return
    items[:] = [it for it in items if it not in vllm_items] + vllm_items
    from tests.engines import vllm_server

    if vllm_server.available() and vllm_server.EARLY not in config.stash:
        state = os.environ.get(vllm_server.STATE_ENV)
        config.stash[vllm_server.EARLY] = vllm_server.SharedServer(Path(state)) if state else vllm_server.EarlyServer()


def pytest_sessionfinish(session, exitstatus):
    from tests.engines import vllm_server

    early = session.config.stash.get(vllm_server.EARLY, None)
    if early is not None:  # started but its tests did not run (interrupted, or all deselected later), or the controller's
        early.stop()
    state = os.environ.get(vllm_server.STATE_ENV)
    if state and not hasattr(session.config, "workerinput"):
        import shutil

        shutil.rmtree(Path(state).parent, ignore_errors=True)


@pytest.fixture(scope="session")
def tune_report(tiny_pair, tmp_path_factory) -> tuple[dict, str, Path]:
    """The setup finder run once, as users run it (`python -m app tune`), on the tiny pair and the quick suite:
    (its JSON report, its stdout, the report's path). Shared by the CLI's and the dialog's tests (~1.5 min). Every
    drafter is calibrated on every prompt (`--calibrate-all`), so the report does not hang on whether the tiny draft
    is dropped after two prompts (tested on literal records in test_tune.py). With kind `redrafter`: two ReDrafter heads
    saved for the tiny target in a heads folder of its own, which the finder calibrates and prices: one with random
    weights, one whose hidden size does not fit the target (its calibration lane fails; the others run on)."""
    import json
    import subprocess
    import sys

    import torch

    from app.engines.registry import resolve
    from app.speculative.redrafter import HeadConfig, HeadManifest, ReDrafterHead, save_head

    t, d = (str(p) for p in tiny_pair)
    root = tmp_path_factory.mktemp("tune")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        head = ReDrafterHead(HeadConfig(hidden=64, vocab=4096, target_vocab=49152))
        head.vocab_ids.copy_(torch.arange(0, 49152, 12))
    for name, h in (("tiny-head", head), ("tiny-misfit", ReDrafterHead(HeadConfig(hidden=32, vocab=16, target_vocab=49152)))):
        save_head(root / "heads" / name, h, HeadManifest(name=name, kind="redrafter", target=resolve(t).name, target_weights="",
                                                          config=vars(h.cfg)))
    out = root / "tune.json"
    env = {**os.environ, "SPECDECK_HEADS": str(root / "heads")}
    r = subprocess.run([sys.executable, "-m", "app", "tune", "--target", t, "--draft", d, "--kinds", "draft,ngram,tree,redrafter",
                        "--dtypes", "int8", "--suite", "quick", "--minutes", "6", "--calibrate-all", "--max-new-tokens", "12", "--no-chat",
                        "--json", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text()), r.stdout + r.stderr, out
