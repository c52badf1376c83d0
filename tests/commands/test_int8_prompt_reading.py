"""resources/bench/int8_prompt_reading.py with SmolLM2 as target and draft: the agreement count on real forwards, and
the script end to end (its three drafts in one process, the table and the report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import bench_script

SCRIPT = Path(__file__).resolve().parents[2] / "resources" / "bench" / "int8_prompt_reading.py"


@pytest.mark.slow
def test_agreement_counts_the_positions_where_the_drafts_greedy_token_is_the_answers():
    """A draft fed its own greedy answer agrees at every position; change one token of that answer and the position
    that predicts it disagrees (the positions after it see another prefix, so they may move too, never that one)."""
    from app.engines.hf import HFEngine
    from app.engines.registry import resolve

    e = HFEngine(resolve("smollm2-135m-instruct"))
    ids = e.encode_prompt("Name three colours of the rainbow.")
    st, answer = e.new_state(), []
    logits = st.forward(ids, last_only=True)[-1]
    for _ in range(6):
        answer.append(int(logits.argmax()))
        logits = st.forward([answer[-1]], last_only=True)[-1]
    agreement = bench_script("int8_prompt_reading").agreement
    assert agreement(e, ids, answer) == 6
    wrong = list(answer)
    wrong[2] = (answer[2] + 1) % e.vocab_size
    assert agreement(e, ids, wrong[:3]) == 2


@pytest.mark.slow
def test_the_script_compares_the_three_drafts_in_one_run(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in (
        {"id": "c1", "category": "coding", "prompt": "Write a Python function that adds two numbers."},
        {"id": "q1", "category": "qa", "prompt": "What is the capital of France?"})) + "\n")
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--target", "smollm2-135m-instruct", "--draft", "smollm2-135m-instruct",
                        "--prompts", str(prompts), "--max-new-tokens", "4", "--reads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[2])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "machine:" in r.stdout and "per token against per tensor, prompt by prompt" in r.stdout
    rep = json.loads(out.read_text())
    names = ("int8, per token", "int8, per tensor", "fp32")
    assert [row["id"] for row in rep["prompts"]] == ["c1", "q1"]
    for row in rep["prompts"]:
        assert row["positions"] == 4 and all(0 <= row[n] <= 4 and row[f"{n} read_s"] > 0 for n in names)
    assert [t["rows"] for t in rep["table"]] == ["coding", "qa", "all"]
    assert rep["table"][-1]["fp32"] == 1.0  # the target itself, at its own precision, agrees with its answer everywhere
    # every SmolLM2 layer passes the int8 check per token; per tensor the worst stay fp32 (tests/engines/test_hf.py)
    assert rep["loads"]["int8, per token"]["int8_layers"] == 211 > rep["loads"]["int8, per tensor"]["int8_layers"] > 0
