"""Peak memory of an engine load: RSS stays within 1.2x the bytes of the weights the engine holds.

Each case loads a small random Llama (~460 MB of fp32 weights, so weights dominate the process) in a fresh
interpreter, whose RSS is clean: the baseline is its RSS once torch, transformers, the model's code, the kernels'
code and the tokenizer are loaded; the peak (VmHWM) is taken after the load and again after a short run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_RATIO = 1.2

CHILD = r"""
import json, sys, warnings
import torch
warnings.simplefilter("ignore")
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from app.engines.cpu_kernels import int8_linear, pack_linears, weight_bytes
from app.engines.hf import HFEngine
from app.engines.registry import resolve

def status(key):  # in bytes
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

def rss():  # resident now
    return status("VmRSS")

def peak():  # this process's peak RSS; not ru_maxrss, which Linux carries over from the parent across fork + exec
    return status("VmHWM")

folder, dtype = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(folder)
# Before the baseline, what is not weights: the model's Python code (~100 MiB) and the kernels' machine code (a
# forward of a minute copy of the model, an int8 and a packed linear: ~30 MiB of library pages on first use).
cfg = AutoConfig.from_pretrained(folder)
cfg.update({"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8})
with torch.inference_mode():
    AutoModelForCausalLM.from_config(cfg)(input_ids=torch.tensor([[1, 2, 3]]))
    int8_linear(torch.nn.Linear(32, 32))(torch.randn(2, 32))
    pack_linears(torch.nn.Sequential(torch.nn.Linear(32, 32)))
base = rss()
e = HFEngine(resolve(folder), dtype=dtype, tokenizer=tok)
load_peak = peak()
ids = e.encode_prompt("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n", chat=False)
s = e.new_state()
t = int(s.forward(ids, last_only=True)[-1].argmax())
for _ in range(8):
    t = int(s.forward([t, t, t, t, t])[-1].argmax())
print(json.dumps({"base": base, "load_peak": load_peak, "run_peak": peak(), "weights": weight_bytes(e.model),
                  "packed": e.packed_linears, "int8": e.int8_linears}))
"""


def _model(folder: Path, tok, tied: bool) -> Path:
    """A random Llama whose weights (~460 MB fp32; 310 MB tied) dwarf the rest: vocab 49152 (SmolLM2's tokenizer),
    hidden 768, 6 layers; `tied`: lm_head shares the embedding (SmolLM2) instead of having its own matrix (Qwen)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=tied,
    )
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models(smollm2_tokenizer, tmp_path_factory) -> dict[bool, Path]:
    root = tmp_path_factory.mktemp("memory")
    return {tied: _model(root / ("tied" if tied else "untied"), smollm2_tokenizer, tied) for tied in (False, True)}


@pytest.mark.slow  # five fresh interpreters, each loading ~460 MB: about a minute
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    ("dtype", "tied"), [("float32", False), ("float32", True), ("int8", False), ("int8", True), ("bfloat16", False)]
)
def test_peak_rss_stays_within_1_2x_the_weights_held(models, dtype, tied):
    """fp32 is packed for oneDNN, int8 quantized with fp32 fallbacks, bf16 converted from the fp32 file: none may
    hold the file's fp32 original (mapped pages included) next to its packed, int8 or bf16 copy."""
    from app.engines.cpu_kernels import int8_available

    if dtype == "int8" and not int8_available():
        pytest.skip("no int8 CPU kernels in this torch build")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([sys.executable, "-c", CHILD, str(models[tied]), dtype], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    mib = {k: round(v / 2**20) for k, v in r.items() if k in ("base", "load_peak", "run_peak", "weights")}
    assert r["weights"] > 100 << 20, mib
    ratios = {phase: round((r[phase] - r["base"]) / r["weights"], 2) for phase in ("load_peak", "run_peak")}
    assert max(ratios.values()) <= MAX_RATIO, f"peak RSS over the weights held: {ratios} ({mib} MiB; {r['packed']} packed, {r['int8']} int8 linears)"
