"""Run files: every event type survives the round trip as itself; a file that is not one, from a newer SpecDeck or
damaged is refused with one message naming the file and what is wrong — never a half-read record."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from app.core.costs import CostProfile
from app.core.events import LaneDone, LaneStarted, LogEvent, ProfileReady, Progress, RunError, StepEvent, TreeStep
from app.core.metrics import LaneStats
from app.core.prompts import Prompt
from app.core.setups import Sampling
from app.worker.messages import EnginesLoaded, LoadedEngine
from app.worker.plan import RunPlan
from app.worker.runfile import VERSION, RunFileError, RunRecorder, decode, encode, load, save


def _plan() -> RunPlan:
    return RunPlan("smollm2-135m-instruct", ("baseline", "ngram:n=3,k=8"), (Prompt("p1", "def f(x):", "coding"),),
                   Sampling(temperature=0.7, top_p=0.9, seed=3, max_new_tokens=8), mode="interleaved")


def _stats(**kw) -> LaneStats:
    base = dict(setup="ngram:n=3,k=8", prompt_id="p1", repeat=0, new_tokens=3, wall_s=0.5, ttft_s=0.1,
                prefill_s=0.05, steps=2, drafted=4, accepted=2, draft_forwards=0, t_draft_s=0.01, t_verify_s=0.3,
                output_ids=(5, 6, 7), output_text="a b c", per_position_drafted=(2, 2), per_position_accepted=(2, 0),
                notes=("n1",), decode_k_hist=(0, 1))
    return LaneStats(**{**base, **kw})


EVENTS = [
    Progress("load smollm2", 10.0, 100.0, "MiB"),
    LaneStarted("L2", "ngram:n=3,k=8", "p1", 0, (1, 2, 3), "def f(x):", "smollm2 · hf · float32"),
    StepEvent("L2", 0, (5, 6, 9), 2, 7, "correction", 0.01, 0.2, 0.25, (5, 6, 7), ("a", " b", " c"), (" z",),
              (0.5, 0.25, 0.125), (0.9, 0.8, 0.01, 0.7), 0.25, None, "k=3: 1.8 tok/step", TreeStep((5, 6, 9), (-1, 0, 1), (0, 1), ("a", " b", " z"))),
    StepEvent("L2", 1, (), 0, 8, "baseline", 0.0, 0.1, 0.1, (8,), ("é",), t_s=0.35, drafted_count=4),
    LogEvent("warning", "slow", {"lane": "L2", "n": [1, 2]}),
    RunError("L3", "it failed", kind="EngineError", details="trace"),
    LaneDone("L2", _stats(), cancelled=False),
    LaneDone("L4", _stats(wall_s=float("nan"), speedup=float("inf")), cancelled=True),
    EnginesLoaded("load", (LoadedEngine("smollm2", "cpu", "float32", 1.5),)),
    ProfileReady(CostProfile("smollm2", "hf", "float32", "cpu", "w1", "m1", (1, 2, 5), (0.01, 0.011, 0.014), cpu_wait_share=0.02)),
]


def test_every_event_comes_back_as_itself():
    for ev in EVENTS:
        back = decode(json.loads(json.dumps(encode(ev))))
        assert type(back) is type(ev)
        if isinstance(ev, LaneDone) and ev.lane_id == "L4":  # NaN != NaN: compare the rest
            assert back.stats.speedup == float("inf") and back.stats.wall_s != back.stats.wall_s
        else:
            assert back == ev, ev


def test_the_plan_comes_back_as_itself():
    plan = _plan()
    back = decode(json.loads(json.dumps(encode(plan))))
    assert back == plan and back.prompts[0].category == "coding" and back.sampling.seed == 3


def test_a_recording_saves_and_loads(tmp_path):
    plan = _plan()
    rec = RunRecorder(plan, machine={"label": "laptop", "cpu": "x"}, t0=100.0)
    for i, ev in enumerate(EVENTS[:7]):
        rec.event(ev, 100.0 + 0.1 * i)
    rec.finish({"summary": [{"setup": "baseline"}]}, (), stopped=True, t_end=101.0)
    path = save(rec.record(), tmp_path / "r.specdeck")
    r = load(path)
    assert r.plan == plan.pinned() and r.plan.recorded and r.stopped and r.label == "laptop"
    assert [ev for _, ev in r.events] == EVENTS[:7] and r.events[3][0] == pytest.approx(0.3)
    assert r.duration_s == pytest.approx(1.0) and r.report == {"summary": [{"setup": "baseline"}]}
    assert not list(tmp_path.glob("*.part"))


def _doc(tmp_path) -> dict:
    rec = RunRecorder(_plan(), t0=0.0)
    rec.event(EVENTS[1], 0.5)
    rec.finish({}, (), t_end=1.0)
    save(rec.record(), tmp_path / "good.specdeck")
    return json.loads(gzip.decompress((tmp_path / "good.specdeck").read_bytes()))


def _write(tmp_path, doc, name="bad.specdeck"):
    p = tmp_path / name
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return p


@pytest.mark.parametrize("damage, says", [
    (lambda p, d: p.write_text("hello"), "is not a SpecDeck run file (not gzip-compressed"),
    (lambda p, d: p.write_bytes(gzip.compress(b"{not json")), "its JSON does not parse"),
    (lambda p, d: p.write_bytes(gzip.compress(json.dumps(d).encode())[:-20]), "cut short or corrupt"),
    (lambda p, d: _write(p.parent, {**d, "format": "something-else"}), "is not a SpecDeck run file"),
    (lambda p, d: _write(p.parent, {**d, "version": VERSION + 1, "app": "9.0"}), "was saved by a newer SpecDeck (9.0, run file version 2)"),
    (lambda p, d: _write(p.parent, {**d, "events": [[0.1, {"$t": "Teleport", "x": 1}]]}), "of type 'Teleport', which this SpecDeck does not know"),
    (lambda p, d: _write(p.parent, {**d, "events": [[0.1, {**d["events"][0][1], "colour": 1}]]}), "have a field 'colour'"),
    (lambda p, d: _write(p.parent, {k: v for k, v in d.items() if k != "plan"}), "damaged run file (KeyError"),
    (lambda p, d: _write(p.parent, {**d, "plan": {**d["plan"], "setups": ["medusa:x"]}}), "cannot be rebuilt here"),
    (lambda p, d: _write(p.parent, {**d, "events": [[1.0, d["events"][0][1]], [0.5, d["events"][0][1]]]}), "go backwards"),
])
def test_a_bad_run_file_is_one_message(tmp_path, damage, says):
    d = _doc(tmp_path)
    p = tmp_path / "bad.specdeck"
    damage(p, d)
    with pytest.raises(RunFileError) as e:
        load(p)
    assert says in str(e.value) and str(p) in str(e.value), str(e.value)
    assert "\n" not in e.value.message


def test_gui_refuses_a_bad_run_file_before_any_window(tmp_path):
    """`specdeck gui FILE` with a file from a newer SpecDeck: exit 2, one error line naming the fix, no traceback."""
    p = _write(tmp_path, {**_doc(tmp_path), "version": VERSION + 1})
    r = subprocess.run([sys.executable, "-m", "app", str(p)], capture_output=True, text=True, timeout=120,
                       env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 2 and "newer SpecDeck" in r.stderr and "update SpecDeck" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len([x for x in r.stderr.splitlines() if x.startswith("error:")]) == 1
