"""resources/bench/hf_ahead.py on literal bench reports: where hf-assisted beat a fixed draft setting, per run and prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "resources" / "bench" / "hf_ahead.py"
FIXED, OTHER, FP32, HF = ("draft:d,k=24,cstop=0.5,dtype=int8", "draft:d,k=8,dtype=int8", "draft:d,k=24,cstop=0.5",
                          "hf-assisted:d,dtype=int8")


def _report(path: Path, walls: dict[str, dict[str, float]], created: str, waited: dict[tuple[str, str], float] | None = None) -> str:
    runs = [dict(setup=s, prompt_id=p, repeat=0, wall_s=w, cpu_wait_s=(waited or {}).get((s, p), 0.0)) for s, by in walls.items()
            for p, w in by.items()]
    path.write_text(json.dumps(dict(runs=runs, created=created)))
    return str(path)


def test_hf_assisted_ahead_is_counted_per_run_and_prompt(tmp_path):
    """Run 1: hf-assisted faster than k=24,cstop=0.5 on p2 (4 s against 5); run 2: on p1 and p2, but p2's hf lane waited
    for a CPU half its wall: left out. The fp32 lane (another precision than the hf lane's assistant) and k=8 are not
    compared; a copy of run 1 (its run file, the same run) counts once."""
    one = {FIXED: {"p1": 5.0, "p2": 5.0}, OTHER: {"p1": 1.0, "p2": 1.0}, FP32: {"p1": 1.0, "p2": 1.0}, HF: {"p1": 6.0, "p2": 4.0}}
    two = {FIXED: {"p1": 5.0, "p2": 5.0}, HF: {"p1": 4.5, "p2": 2.0}}
    a = _report(tmp_path / "a.json", one, "t1")
    a2 = _report(tmp_path / "a-copy.json", one, "t1")
    b = _report(tmp_path / "b.json", two, "t2", waited={(HF, "p2"): 1.0})
    out = tmp_path / "h.json"
    r = subprocess.run([sys.executable, str(SCRIPT), a, a2, b, "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    h = json.loads(out.read_text())
    assert [(x["report"], x["draft"], x["prompts"], x["below"]) for x in h["runs"]] == [
        ("a.json", "draft:d,dtype=int8", 2, ["p2"]), ("b.json", "draft:d,dtype=int8", 1, ["p1"])]
    assert h["prompts"]["p1"] == dict(runs=2, hf_ahead=1, fixed_over_hf=pytest.approx((1.2 * 0.9) ** 0.5))
    assert h["prompts"]["p2"] == dict(runs=1, hf_ahead=1, fixed_over_hf=pytest.approx(0.8))
    assert "2 runs; hf-assisted ahead of k=24,cstop=0.5 on 1–1 prompts of a run" in r.stdout


def test_no_pair_and_a_bad_setting_say_so(tmp_path):
    a = _report(tmp_path / "a.json", {FIXED: {"p1": 5.0}}, "t1")
    r = subprocess.run([sys.executable, str(SCRIPT), a], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no report ran `k=24,cstop=0.5` beside hf-assisted" in r.stderr
    r = subprocess.run([sys.executable, str(SCRIPT), a, "--setting", "k=banana"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("--setting k=banana:")
