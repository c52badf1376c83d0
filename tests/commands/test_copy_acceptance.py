"""resources/bench/copy_acceptance.py on a literal run file: which drafted tokens copy from the prompt, and how many
the target kept, by confidence band."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import bench_script

SCRIPT = Path(__file__).resolve().parents[2] / "resources" / "bench" / "copy_acceptance.py"
SETUP = "draft:smollm2-135m-instruct,k=4"
TEXT = "the quick brown fox jumps over a lazy dog"


def _run_file(tmp_path, steps, temperature: float = 0.0, setup: str = SETUP) -> str:
    """A real run file (app.worker.runfile): one prompt, the baseline and one draft lane with these literal steps
    (drafted, accepted, emitted, confidences)."""
    from app.core.events import StepEvent
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.worker.plan import RunPlan
    from app.worker.runfile import RunRecorder, save

    plan = RunPlan("smollm2-135m-instruct", ("baseline", setup), (Prompt("s1", TEXT, "summarization"),),
                   Sampling(max_new_tokens=8, temperature=temperature), mode="paced")
    rec = RunRecorder(plan, machine={"label": "t", "cpu": "x"}, t0=0.0)
    lane = plan.lane_id(1, plan.prompts[0])
    for i, (drafted, a, emitted, q) in enumerate(steps):
        rec.event(StepEvent(lane, i, tuple(drafted), a, emitted[-1], "bonus" if a == len(drafted) else "correction", 0.01, 0.2, 0.25,
                            tuple(emitted), draft_probs=tuple(q)), 0.1)
    rec.finish({"runs": []}, t_end=1.0)
    return str(save(rec.record(), tmp_path / "run.specdeck"))


@pytest.mark.parametrize("setup", [SETUP, "hf-assisted:smollm2-135m-instruct"])
def test_drafts_that_continue_the_prompt_are_counted_apart_by_confidence(tmp_path, smollm2_tokenizer, setup):
    """The answer repeats the prompt: step 0 drafts its first three tokens (q 0.6, all kept) — only the third is
    preceded by two of the prompt's tokens in the prompt's order, so it alone copies; step 1 drafts the fifth (q 0.3,
    copying, rejected) and one more, untested. transformers' assisted lanes count as SpecDeck's draft lanes do (their
    confidences are read from the assistant's forwards)."""
    tally = bench_script("copy_acceptance").tally
    ids = list(smollm2_tokenizer.encode(TEXT, add_special_tokens=False))
    grams = {tuple(ids[i:i + 3]) for i in range(len(ids) - 2)}
    assert len(ids) >= 6 and (ids[-2], ids[-1], ids[0]) not in grams and (ids[-1], ids[0], ids[1]) not in grams
    path = _run_file(tmp_path, [(ids[:3], 3, ids[:4], [0.6, 0.6, 0.6]), ([ids[4], 7], 0, [9], [0.3, 0.9])], setup=setup)
    totals, per_cat = tally([path], 2, tokenizer=smollm2_tokenizer)
    assert totals[(1, False)] == [2, 2] and totals[(1, True)] == [1, 1]  # 0.5–0.8: two not copying, one copying; all kept
    assert totals[(0, True)] == [0, 1] and totals[(0, False)] == [0, 0]  # below 0.5: the copying draft, rejected
    assert sum(t for _, t in totals.values()) == 4  # the draft after the rejection was not tested
    assert per_cat["summarization"][(1, True)] == [1, 1]


def test_a_sampled_run_is_one_error(tmp_path):
    """Sampled lanes' drafts are not the greedy ones it reads: exit 2 with one line, not a traceback."""
    path = _run_file(tmp_path, [([5], 1, [5, 6], [0.9])], temperature=0.7)
    r = subprocess.run([sys.executable, str(SCRIPT), path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "sampled run" in r.stderr, r.stderr
