"""resources/bench/kauto_memory.py rendering literal single-prompt bench reports (`--reports`): k=auto ÷ the fixed
setup from its priors and from a saved memory, runs where a lane waited for a CPU left out of the means."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "resources" / "bench" / "kauto_memory.py"
AUTO, FIXED = "draft:d,k=auto,dtype=int8", "draft:d,k=16,cstop=0.5,dtype=int8"


def _report(path: Path, pid: str, auto_wall: float, fixed_wall: float, saved: bool, wait: float = 0.0) -> None:
    lane = dict(prompt_id=pid, repeat=0, steps=5, drafted=40, output_ids=[1, 2], cpu_wait_s=0.0)
    runs = [dict(lane, setup="baseline", wall_s=10.0), dict(lane, setup=FIXED, wall_s=fixed_wall, cpu_wait_s=wait * fixed_wall),
            dict(lane, setup=AUTO, wall_s=auto_wall, notes=["k=auto started from what it learnt …"] if saved else [])]
    path.write_text(json.dumps(dict(runs=runs, created="t", cost_profiles=[dict(machine_text="CPU flags")])))


def test_the_memory_bench_compares_priors_and_saved_memory(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n')
    _report(tmp_path / "seed.json", "s", 4.0, 4.0, False)
    _report(tmp_path / "priors-a-1.json", "a", 5.0, 4.0, False)  # 0.8 from the priors
    _report(tmp_path / "saved-a-1.json", "a", 4.0, 4.0, True)  # 1.0 from the memory
    _report(tmp_path / "priors-b-1.json", "b", 4.0, 4.4, False)  # 1.1
    _report(tmp_path / "saved-b-1.json", "b", 2.0, 4.0, True, wait=0.3)  # 2.0, but a lane waited: left out
    out = tmp_path / "m.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--reports", str(tmp_path), "--prompts", str(prompts), "--passes", "1",
                        "--draft", "d", "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert abs(s["priors"]["mean"] - 0.95) < 1e-9 and s["priors"]["runs"] == 2
    assert abs(s["saved"]["mean"] - 1.0) < 1e-9 and s["saved"]["runs"] == 1
    assert s["saved_better"] == [1, 1]  # prompt b's pair is left out: one of its runs waited
    rows = {x["prompt"]: x for x in doc["rows"]}
    assert rows["a"]["saved"]["from_memory"] and not rows["a"]["priors"]["from_memory"]
    assert "CPU flags" in r.stdout and "2.000*" in r.stdout and "from the saved memory 1.000 (1 runs)" in r.stdout
