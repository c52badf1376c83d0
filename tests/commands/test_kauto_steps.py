"""resources/bench/kauto_steps.py on a literal run file: where a draft lane's steps win and lose time, and how often
drafts are kept by confidence and by where they stood."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import bench_run_file

SCRIPT = Path(__file__).resolve().parents[2] / "resources" / "bench" / "kauto_steps.py"
AUTO, K8 = "draft:smollm2-135m-instruct,k=auto", "draft:smollm2-135m-instruct,k=8,cstop=0.5"
BASE = [([], 0, [1], [], 1.0)] + [([], 0, [t], [], 0.25) for t in range(2, 16)]  # a decode step: 0.25 s
# (drafted, accepted, emitted, confidences, wall, drafting seconds); a draft forward takes 0.01 s
DRAFTING = [([], 0, [1], [], 1.0, 0.0),
            ([5, 6], 2, [5, 6, 7], [0.9, 0.96], 1.0, 0.5),  # k=auto: the draft read the prompt first (0.5 s)
            ([8], 0, [9], [0.6], 0.5, 0.01),
            ([10, 11], 2, [10, 11, 12], [0.97, 0.5], 0.5, 0.02)]
WHY = "k=auto chose {n} of {n} drafted: expect {e} tokens in {ms} ms (3.0 tok/s) vs 1 in 250 ms (4.0 tok/s) without drafting"
AUTO_STEPS = [DRAFTING[0],
              (*DRAFTING[1], WHY.format(n=2, e="3.00", ms=300)),  # the reading: its prediction priced the step alone
              (*DRAFTING[2], WHY.format(n=1, e="1.50", ms=400)),
              (*DRAFTING[3], WHY.format(n=2, e="2.50", ms=500)),
              ([], 0, [13], [], 0.25, 0.01),  # a look dropped: one draft forward, nothing verified
              ([], 0, [14], [], 0.25, 0.0)]


def _run(tmp_path, *args) -> subprocess.CompletedProcess:
    lanes = {("c1", "baseline"): BASE, ("c1", AUTO): AUTO_STEPS, ("c1", K8): DRAFTING, ("c2", AUTO): DRAFTING}
    walls = {"baseline": {"c1": 4.5}, AUTO: {"c1": 2.75, "c2": 2.5}, K8: {"c1": 2.5}}
    path = bench_run_file(tmp_path, ("baseline", AUTO, K8), lanes, walls)
    return subprocess.run([sys.executable, str(SCRIPT), path, *args], capture_output=True, text=True, timeout=120)


def test_steps_are_priced_against_the_prompts_baseline_step_by_how_many_drafts_they_verified(tmp_path):
    """Each decode step's wall over the prompt's mean baseline decode step (0.25 s), grouped by the drafts verified;
    k=auto's step that read the prompt and its dropped look are apart, a fixed lane's same step is not a reading; c2
    has no baseline lane and is left out of the prices."""
    out = tmp_path / "s.json"
    r = _run(tmp_path, "--json", str(out))
    assert r.returncode == 0, r.stderr
    econ = json.loads(out.read_text())["economics"]
    auto, fixed = econ[AUTO], econ[K8]
    assert auto["read"] == dict(steps=1, tokens=3, base_steps=pytest.approx(4.0), tokens_per_step=3.0,
                                base_steps_per_step=pytest.approx(4.0), tokens_per_base_step=pytest.approx(0.75))
    assert auto["1"]["tokens_per_base_step"] == pytest.approx(0.5)  # one token in two baseline steps' time
    assert auto["2-3"]["tokens"] == 3 and auto["2-3"]["base_steps"] == pytest.approx(2.0)
    assert auto["look dropped"]["steps"] == 1 and auto["0"]["steps"] == 1
    assert "read" not in fixed and fixed["2-3"]["steps"] == 2 and fixed["2-3"]["base_steps"] == pytest.approx(6.0)
    assert "machine: x" in r.stdout and "tok/base" in r.stdout


def test_tested_drafts_are_counted_once_by_confidence_and_where_they_stood(tmp_path):
    """Two lanes of one draft verified the same positions with the same tokens: each verdict counts once per prompt.
    Drafts past the first rejected one were not tested and are not counted."""
    out = tmp_path / "s.json"
    assert _run(tmp_path, "--json", str(out)).returncode == 0
    table = {(row["where"], row["q"]): (row["kept"], row["tested"]) for row in json.loads(out.read_text())["acceptance"]}
    assert table == {("after opening", 0.9): (2, 2),  # c1 and c2: one each
                     ("after unsure", 0.9): (2, 2),  # 0.96 after 0.9
                     ("after all kept", 0.6): (0, 2),
                     ("after none", 0.9): (2, 2),
                     ("after sure", 0.5): (2, 2)}  # 0.5 after 0.97


def test_a_category_with_no_draft_lane_beside_a_baseline_is_one_clear_error(tmp_path):
    r = _run(tmp_path, "--category", "c2")
    assert r.returncode == 2 and "no draft lane with a baseline of the same prompt" in r.stderr and "'c2'" in r.stderr


def test_k_auto_s_predictions_are_set_against_what_its_steps_made(tmp_path):
    """k=auto's `why` says what it expected of each step; summed per group of drafts verified, against the tokens the
    step emitted and its wall. The step that read the prompt is left out: its prediction priced the step alone."""
    out = tmp_path / "s.json"
    assert _run(tmp_path, "--json", str(out)).returncode == 0
    pred = json.loads(out.read_text())["predictions"]
    assert set(pred) == {"1", "2-3"}
    assert pred["1"] == dict(steps=1, predicted_tokens=1.5, tokens=1, predicted_s=pytest.approx(0.4), wall_s=0.5,
                             tokens_ratio=pytest.approx(1 / 1.5), time_ratio=pytest.approx(1.25))
    assert pred["2-3"]["tokens_ratio"] == pytest.approx(3 / 2.5) and pred["2-3"]["time_ratio"] == pytest.approx(1.0)


def test_a_run_file_that_cannot_be_read_is_one_error_naming_it(tmp_path):
    bad = tmp_path / "bad.specdeck"
    bad.write_bytes(b"not a run file")
    r = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "bad.specdeck" in r.stderr and "Traceback" not in r.stderr
