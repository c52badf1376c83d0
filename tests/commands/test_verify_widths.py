"""resources/bench/verify_widths.py on a literal run file: V(n) as the lanes paid it, against the profile's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "resources" / "bench" / "verify_widths.py"
TARGET = "smollm2-135m-instruct"
DRAFT = f"draft:{TARGET},k=4"


def _run_file(tmp_path, with_profile: bool = True) -> str:
    """A real run file (app.worker.runfile): on prompts p1, p2 a baseline lane (decode steps of 0.10 s on p1, 0.20 s on
    p2: a longer context) and a draft lane whose steps verify 2 tokens in 1.2 and 4 tokens in 1.5 decode steps of
    their own prompt; the report carries the target's profile (V(2) 1.1, V(4) 1.5 as smoothed; medians V(2) 1.25)."""
    from app.core.costs import CostProfile
    from app.core.events import StepEvent
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.worker.plan import RunPlan
    from app.worker.runfile import RunRecorder, save

    plan = RunPlan(TARGET, ("baseline", DRAFT), (Prompt("p1", "a", "coding"), Prompt("p2", "b", "coding")),
                   Sampling(max_new_tokens=8), mode="paced")
    rec = RunRecorder(plan, machine={"label": "t", "cpu": "x"}, t0=0.0)
    for p, t1 in (("p1", 0.10), ("p2", 0.20)):
        prompt = next(x for x in plan.prompts if x.id == p)
        base, draft = plan.lane_id(0, prompt), plan.lane_id(1, prompt)
        for i in range(4):  # step 0 (the prompt's forward, 5 s) is no decode step
            rec.event(StepEvent(base, i, (), 0, 7, "target", 0.0, 5.0 if i == 0 else t1, 5.0 if i == 0 else t1, (7,)), 0.1)
        widths = [(2, 9.0), (1, 1.2), (3, 1.5), (1, 1.2), (3, 1.5)]  # (drafts, verify in decode steps)
        for i, (k, v) in enumerate(widths):
            rec.event(StepEvent(draft, i, tuple(range(k)), k, 7, "bonus", 0.01 * k, v * t1, v * t1 + 0.01 * k, (*range(k), 7)), 0.1)
    prof = CostProfile(engine=TARGET, backend="hf", precision="float32", device="cpu", weights="w", machine="m",
                       ns=(1, 2, 3, 4), times_s=(0.1, 0.11, 0.13, 0.15), medians_s=(0.1, 0.125, 0.13, 0.15))
    rec.finish(dict(target=TARGET, runs=[], cost_profiles=[prof.to_json()] if with_profile else [], created="t"), t_end=1.0)
    return str(save(rec.record(), tmp_path / "run.specdeck"))


def test_the_lanes_verify_widths_are_set_against_the_profiles_curve(tmp_path):
    out = tmp_path / "w.json"
    r = subprocess.run([sys.executable, str(SCRIPT), _run_file(tmp_path), "--min-steps", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {w["n"]: w for w in json.loads(out.read_text())["widths"]}
    # each verify over its own prompt's decode step: 1.2 at 2 tokens and 1.5 at 4, on both prompts (the two contexts'
    # decode steps differ twofold); step 0, which verified with the prompt, is left out
    assert rows[2]["lanes"] == pytest.approx(1.2) and rows[2]["steps"] == 4
    assert rows[4]["lanes"] == pytest.approx(1.5) and rows[4]["steps"] == 4
    assert rows[3]["lanes"] is None and rows[3]["steps"] == 0
    assert rows[2]["profile"] == pytest.approx(1.1) and rows[2]["medians"] == pytest.approx(1.25)
    assert "profile ÷ lanes over the 2 widths of 2 tokens or more with ≥ 2 steps: 0.958" in r.stdout  # (1.1/1.2 + 1.5/1.5) / 2


def test_a_run_file_without_the_targets_profile_is_refused_by_name(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), _run_file(tmp_path, with_profile=False)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and f"carries no cost profile of its target {TARGET}" in r.stderr
