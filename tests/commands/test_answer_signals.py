"""resources/bench/answer_signals.py: per prompt, the target's confidence and prompt lookup's hits on its own greedy
answer, beside the best fixed setting's speedup from literal verdict reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import bench_script

SCRIPT = Path(__file__).resolve().parents[2] / "resources" / "bench" / "answer_signals.py"


def test_prompt_lookup_guesses_the_token_after_the_latest_earlier_occurrence():
    lookup = bench_script("answer_signals").lookup
    assert lookup([1, 2, 3, 1, 2, 4, 1, 2]) == 4  # the latest "1 2" was followed by 4
    assert lookup([1, 2, 3, 4]) is None
    assert lookup([5, 5, 5], n=2) == 5


def test_signals_beside_the_best_fixed_speedup_of_each_prompt(tiny_pair, tmp_path):
    """On the tiny target, two Spec-Bench prompts named in two literal verdict reports: each prompt's best fixed
    speedup is the mean over the reports (speedup over vs_best_fixed), rows come best first, and the signals are shares
    of the answer's tokens; a prompt no report names is left out."""
    target, _ = tiny_pair
    verdicts = []
    for i, (code, qa) in enumerate(((1.2, 0.8), (1.0, 0.9))):
        path = tmp_path / f"v{i}.json"
        path.write_text(json.dumps({"prompts": [dict(prompt="code-1", speedup=1.0, vs_best_fixed=1.0 / code),
                                                dict(prompt="qa-1", speedup=1.0, vs_best_fixed=1.0 / qa)]}))
        verdicts.append(str(path))
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(SCRIPT), *verdicts, "--target", str(target), "--tokens", "6", "--first", "3", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [(x["prompt"], x["category"]) for x in rows] == [("code-1", "coding"), ("qa-1", "qa")]
    assert [x["best_fixed"] for x in rows] == [pytest.approx(1.1), pytest.approx(0.85)]
    for x in rows:
        assert 1 <= x["tokens"] <= 6
        assert all(0.0 <= x[k] <= 1.0 for k in ("conf", "conf_first", "hits", "hits_first"))
    assert "code-1" in r.stdout and "machine:" in r.stdout
