"""Engines whose lanes run in another Python environment (issue 17: TensorRT-LLM 1.2 pins torch 2.9.x and
transformers 4.57.3 and cannot live in SpecDeck's environment).

A real second environment, made by `make test` (`make foreign-env`: a venv of this interpreter with
transformers==4.57.3 from the package index, no torch, no Qt, no SpecDeck install); a `backend = "trtllm"` manifest
names its interpreter.
Its lanes then run in a worker started from that interpreter — the FAKE tensorrt_llm (tests/engines/
fake_tensorrt_llm) standing in for the library, and tests/worker/foreign_site/sitecustomize.py making the
capability check see Python 3.12, MPI and a CUDA driver (the only mocked part: none of them exist here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.engines.environments import ROOT

pytestmark = pytest.mark.slow

FAKE = ROOT / "tests" / "engines" / "fake_tensorrt_llm"
SITE = Path(__file__).parent / "foreign_site"


@pytest.fixture(scope="session")
def foreign_python() -> str:
    """The interpreter of the second environment that `make test` makes (`make foreign-env`): a venv of the base
    interpreter with transformers as TensorRT-LLM pins it, nothing else."""
    py = Path(os.environ.get("SPECDECK_FOREIGN_PYTHON", ROOT / ".cache" / "foreign-env-transformers-4.57.3" / "bin" / "python"))
    if not py.is_file():
        if os.environ.get("SPECDECK_FOREIGN_PYTHON"):
            pytest.fail(f"the second environment is missing at {py}: `make foreign-env` makes it")
        pytest.skip("the second worker environment is made by `make foreign-env` (make test does it)")
    return str(py)


def _tokenizer_folder(tok, folder: Path) -> Path:
    """The SmolLM2 tokenizer saved for transformers 4.57 (5.x writes tokenizer_class "TokenizersBackend", which
    4.57 does not know; a model folder made for TensorRT-LLM 1.2 names PreTrainedTokenizerFast)."""
    tok.save_pretrained(folder)
    cfg = folder / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.write_text(json.dumps(data))
    (folder / "config.json").write_text('{"max_position_embeddings": 2048}')
    return folder


def _manifest(folder: Path, name: str, python: str, tokenizer_dir: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{name}.toml"
    p.write_text(textwrap.dedent(f"""\
        description = "fake TensorRT-LLM n-gram lane in its own environment"
        backend = "trtllm"
        python = "{python}"

        [source]
        model = "{tokenizer_dir}"

        [trtllm]
        decoding = "ngram"
        max_draft_len = 4
        max_matching_ngram_size = 2
        """))
    return p


def _env(engines: Path, *extra: Path) -> dict:
    env = dict(os.environ)
    env["SPECDECK_ENGINES_PATH"] = str(engines)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in extra] + [env.get("PYTHONPATH", "")])
    env["QT_QPA_PLATFORM"] = "offscreen"
    return env


def test_foreign_environment_is_what_the_worker_needs_only(foreign_python):
    """The second environment holds transformers 4.57.3 and no torch, Qt or SpecDeck install."""
    code = ("import importlib.util as u, transformers; "
            "print(transformers.__version__, [m for m in ('torch', 'PySide6', 'pyqtgraph', 'app') if u.find_spec(m)])")
    out = subprocess.run([foreign_python, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.split(maxsplit=1) == ["4.57.3", "[]\n"]


def test_trtllm_lane_runs_in_its_own_environment(foreign_python, tiny_pair, smollm2_tokenizer, tmp_path, monkeypatch):
    """`bench --setup trtllm:<engine>`: the baseline runs in SpecDeck's worker, the trtllm lane in a worker started
    from the manifest's interpreter (said on stderr), and both end in one report; the lane's tokens are the fake
    library's greedy output for the prompt as the other environment's tokenizer encoded it."""
    target, _ = tiny_pair
    tok_dir = _tokenizer_folder(smollm2_tokenizer, tmp_path / "tok")
    engines = tmp_path / "engines"
    _manifest(engines, "fake-trt-ngram", foreign_python, tok_dir)
    out_json = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(target), "--setup", "trtllm:fake-trt-ngram", "--prompt", "def add(a, b):",
           "--max-new-tokens", "12", "--no-chat", "--json", str(out_json)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(engines, FAKE, SITE), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"from {foreign_python}" in r.stderr and "python 3.11" in r.stderr  # the worker line names the interpreter
    doc = json.loads(out_json.read_text())
    runs = {x["setup"]: x for x in doc["runs"]}
    assert set(runs) == {"baseline", "trtllm:fake-trt-ngram"} and not doc["errors"]
    lane = runs["trtllm:fake-trt-ngram"]
    # the fake's toy model, loaded by path: importing `tensorrt_llm` here would leave the fake in sys.modules, where
    # later tests' capability checks would find it
    import importlib.util

    spec = importlib.util.spec_from_file_location("_fake_trt_toy", FAKE / "tensorrt_llm" / "_toy.py")
    assert spec is not None and spec.loader is not None
    _toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_toy)
    prompt = smollm2_tokenizer.encode("def add(a, b):")
    assert lane["new_tokens"] == 12 and tuple(lane["output_ids"]) == tuple(_toy.greedy(prompt, 12))
    assert lane["counts_source"] == "streamed"  # 1.2.x reports zero counters: α inferred, and said
    assert "~" in r.stdout and "inferred from streamed chunk sizes" in r.stdout


def test_engines_listing_asks_the_other_environment(foreign_python, smollm2_tokenizer, tmp_path):
    """`python -m app engines` checks a trtllm engine in the environment its worker runs in: there, without the
    test hook, TensorRT-LLM is found (the fake on its path) but Python 3.11 has no wheels; a missing interpreter
    is named with the fix."""
    tok_dir = _tokenizer_folder(smollm2_tokenizer, tmp_path / "tok")
    engines = tmp_path / "engines"
    _manifest(engines, "fake-trt", foreign_python, tok_dir)
    _manifest(engines, "gone-trt", str(tmp_path / "nowhere" / "python"), tok_dir)
    r = subprocess.run([sys.executable, "-m", "app", "engines"], capture_output=True, text=True, cwd=ROOT, env=_env(engines, FAKE), timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "fake-trt " in x or x.startswith("fake-trt"))
    rest = r.stdout[r.stdout.index(line):]
    assert f"in {foreign_python}: wrong Python 3.11" in rest
    assert "nowhere/python does not exist" in r.stdout


def test_a_worker_that_cannot_start_fails_its_lanes_only(tiny_pair, smollm2_tokenizer, tmp_path):
    """An interpreter that exits at once: the trtllm lane fails with the reason (and its stderr), the baseline
    still completes and is reported. (With a warm-up, the failing warm-up lane stops the bench before the run, as
    for any setup that fails there.)"""
    target, _ = tiny_pair
    tok_dir = _tokenizer_folder(smollm2_tokenizer, tmp_path / "tok")
    engines = tmp_path / "engines"
    bad = tmp_path / "bin" / "python"
    bad.parent.mkdir()
    bad.write_text("#!/bin/sh\necho 'this environment is broken' >&2\nexit 5\n")
    bad.chmod(0o755)
    _manifest(engines, "broken-trt", str(bad), tok_dir)
    out_json = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(target), "--setup", "trtllm:broken-trt", "--prompt", "hi",
           "--max-new-tokens", "6", "--no-chat", "--warmup", "0", "--json", str(out_json)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(engines), timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.count("exited with code 5 before connecting") == 1  # one clear message, no traceback
    assert "Traceback" not in r.stderr
    assert "this environment is broken" in r.stderr and "exited with code 5 before connecting" in r.stderr
    doc = json.loads(out_json.read_text())
    assert [x["setup"] for x in doc["runs"]] == ["baseline"]
