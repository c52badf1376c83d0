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
OTHER = f"draft:{TARGET},k=4@other-engine"  # verified by another target: not this profile's to price


def _run_file(tmp_path, with_profile: bool = True, waited: float = 0.0) -> str:
    """A real run file (app.worker.runfile) on prompts p1, p2: a baseline lane (decode steps of 0.09 and 0.11 s on p1,
    0.18 and 0.22 s on p2, a longer context; step 0, the prompt's forward, 0.05 s) and a draft lane whose steps verify 2 tokens in 1.2 of
    their own prompt's decode steps (p1 twice, p2 three times: a median over the pooled baseline would differ), 4
    tokens in 1.5 and 5 tokens — no profile width — in 1.6; a lane verified by another target pays 3.0 at 2 tokens. The
    report carries the target's profile (V(2) 1.1, V(4) 1.5, V(6) 1.7 as smoothed; medians V(2) 1.25); `waited`: the
    share of its wall p2's draft lane waited for a CPU."""
    from app.core.costs import CostProfile
    from app.core.events import StepEvent
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.worker.plan import RunPlan
    from app.worker.runfile import RunRecorder, save

    plan = RunPlan(TARGET, ("baseline", DRAFT, OTHER), (Prompt("p1", "a", "coding"), Prompt("p2", "b", "coding")),
                   Sampling(max_new_tokens=8), mode="paced")
    rec = RunRecorder(plan, machine={"label": "t", "cpu": "x"}, t0=0.0)
    for p, t1, twos in (("p1", 0.10, 2), ("p2", 0.20, 3)):
        prompt = next(x for x in plan.prompts if x.id == p)
        base, draft, other = (plan.lane_id(i, prompt) for i in range(3))
        for i, t in enumerate((0.05, 0.9 * t1, 1.1 * t1)):  # the median of the decode steps: t1 (with step 0: 0.9 t1)
            rec.event(StepEvent(base, i, (), 0, 7, "baseline", 0.0, t, t, (7,)), 0.1)
        widths = [(2, 9.0)] + [(1, 1.2)] * twos + [(3, 1.5), (4, 1.6)]  # (drafts, verify in decode steps); step 0 first
        for i, (k, v) in enumerate(widths):
            rec.event(StepEvent(draft, i, tuple(range(k)), k, 7, "bonus", 0.01 * k, v * t1, v * t1 + 0.01 * k, (*range(k), 7)), 0.1)
        for i in range(2):
            rec.event(StepEvent(other, i, (0,), 1, 7, "bonus", 0.01, 3.0 * t1, 3.0 * t1, (0, 7)), 0.1)
    prof = CostProfile(engine=TARGET, backend="hf", precision="float32", device="cpu", weights="w", machine="m",
                       ns=(1, 2, 4, 6), times_s=(0.1, 0.11, 0.15, 0.17), medians_s=(0.1, 0.125, 0.15, 0.17))
    runs = [dict(setup=DRAFT, prompt_id="p2", repeat=0, wall_s=2.0, cpu_wait_s=2.0 * waited)]
    rec.finish(dict(target=TARGET, runs=runs, cost_profiles=[prof.to_json()] if with_profile else [], created="t"), t_end=1.0)
    return str(save(rec.record(), tmp_path / "run.specdeck"))


def _widths(tmp_path, run: str) -> tuple[dict[int, dict], dict, str]:
    out = tmp_path / "w.json"
    r = subprocess.run([sys.executable, str(SCRIPT), run, "--min-steps", "2", "--json", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    return {w["n"]: w for w in doc["widths"]}, doc["summary"], r.stdout


def test_the_lanes_verify_widths_are_set_against_the_profiles_curve(tmp_path):
    rows, summary, out = _widths(tmp_path, _run_file(tmp_path))
    # each verify over its own prompt's decode step (the baseline's step 0 left out): 1.2 at 2 tokens, 5 steps (over
    # the pooled baseline's median, 0.15 s, they would read 1.6), 1.5 at 4; the draft's step 0 and the lanes verified by
    # another target left out; a 5-token verify counted once, in the nearest row (6 tokens), priced at its own width
    assert rows[2]["lanes"] == pytest.approx(1.2) and rows[2]["steps"] == 5
    assert rows[4]["lanes"] == pytest.approx(1.5) and rows[4]["steps"] == 2
    assert rows[6]["lanes"] == pytest.approx(1.6) and rows[6]["steps"] == 2 and rows[6]["profile"] == pytest.approx(1.6)
    assert rows[1]["steps"] == 0 and rows[1]["lanes"] is None
    assert rows[2]["profile"] == pytest.approx(1.1) and rows[2]["medians"] == pytest.approx(1.25)
    assert summary["widths"] == [2, 4, 6] and summary["left_out"] == []
    assert summary["profile_over_lanes"] == pytest.approx((1.1 / 1.2 + 1.0 + 1.0) / 3)
    assert summary["baseline_step_s"] == {"p1": pytest.approx(0.1), "p2": pytest.approx(0.2)}
    assert "profile/lanes over the 3 rows from 2 tokens on with ≥ 2 steps (2, 4, 6): 0.972" in out


def test_a_prompt_whose_lane_waited_for_a_cpu_is_left_out(tmp_path):
    rows, summary, out = _widths(tmp_path, _run_file(tmp_path, waited=0.3))
    assert summary["left_out"] == ["p2"] and rows[2]["steps"] == 2 and "p2" not in summary["baseline_step_s"]
    assert "left out, a lane waited for a CPU: p2" in out


def test_a_run_file_without_the_targets_profile_or_unreadable_is_refused_in_one_message(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), _run_file(tmp_path, with_profile=False)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and f"carries no cost profile of its target {TARGET}" in r.stderr
    bad = tmp_path / "bad.specdeck"
    bad.write_bytes(b"not a run file")
    r = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
