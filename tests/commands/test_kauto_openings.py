"""resources/bench/kauto_openings.py on literal run files: the openings of fixed draft lanes, counted by the confidence
band k=auto values them by (Acceptance.p_opening)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import bench_run_file

SCRIPT = Path(__file__).resolve().parents[2] / "resources" / "bench" / "kauto_openings.py"
AUTO = "draft:smollm2-135m-instruct,k=auto"
K8, K4 = "draft:smollm2-135m-instruct,k=8,cstop=0.5", "draft:smollm2-135m-instruct,k=4"
K8_INT8 = "draft:smollm2-135m-instruct,k=8,dtype=int8"


def _run(tmp_path, name: str, c1_q: float, c1_kept: int) -> str:
    """A run file where c1's fixed lanes open at confidence c1_q, keeping c1_kept drafts, and c2's open at 0.3, rejected;
    k=auto opens c1 at 0.99, kept (not counted: k=auto's opening is not every draft's)."""
    base = [([], 0, [1], [])]
    c1 = [([5, 6], c1_kept, [5, 6, 7][: c1_kept + 1], [c1_q, 0.9]), ([], 0, [8], [])]
    c2 = [([5], 0, [9], [0.3]), ([6], 1, [6, 7], [0.9])]
    lanes = {("c1", "baseline"): base, ("c1", AUTO): [([5], 1, [5, 6], [0.99])], ("c1", K8): c1, ("c1", K4): c1,
             ("c2", K8): c2, ("c2", K8_INT8): [([5], 1, [5, 6], [0.85])]}
    d = tmp_path / name
    d.mkdir()
    return bench_run_file(d, ("baseline", AUTO, K8, K4, K8_INT8), lanes, {"baseline": {"c1": 1.0}})


def test_openings_are_counted_once_per_prompt_and_draft_by_confidence_band(tmp_path):
    """Each (prompt, draft) of a run file counts its fixed lanes' step 0 once — c1's two lanes of one draft once, c2's
    int8 draft apart from its fp32 one — by band (< 0.5, 0.5–0.8, ≥ 0.8); k=auto's openings and a later step's first
    draft are not openings of every draft. Over two run files the prompts count once per file, and once in all in the
    distinct counts; the per-band estimate fits these verdicts better than one for all."""
    a = _run(tmp_path, "a", 0.9, 2)
    b = _run(tmp_path, "b", 0.9, 1)
    out = tmp_path / "openings.json"
    res = subprocess.run([sys.executable, str(SCRIPT), a, b, "--json", str(out)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    rows = doc["openings"]
    assert sorted((r["prompt"], r["draft"], r["q"], r["kept"]) for r in rows if r["file"] == a) == sorted(
        [("c1", "smollm2-135m-instruct", 0.9, True), ("c2", "smollm2-135m-instruct", 0.3, False),
             ("c2", "smollm2-135m-instruct,dtype=int8", 0.85, True)])
    s = doc["summary"]["PyTorch"]
    assert s["openings"] == 6 and s["kept"] == 4
    assert s["by_band"] == {"q<0.5": [0, 2], "0.5-0.8": [0, 0], "q>=0.8": [4, 4]}
    assert s["distinct_by_band"] == {"q<0.5": [0, 1], "0.5-0.8": [0, 0], "q>=0.8": [2, 2]}
    assert s["loglik_banded"] > s["loglik_pooled"]
    assert "PyTorch: 6 openings over 2 run files, kept 4 (0.67); by confidence: q<0.5 0/2, 0.5-0.8 0/0, q>=0.8 4/4" in res.stdout
