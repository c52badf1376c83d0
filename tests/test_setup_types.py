"""A new kind of lane is one module: a toy setup type defined in this file alone runs through the parser, the
grammar, the run plan, `bench` and the worker (the GUI editor's toy test is tests/ui/test_setup_editor.py).

The toy `repeat:k=N` drafts the last token N times and lets our loop verify it: it runs a real model and, at
temperature 0, must emit exactly the baseline's tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from app.core.prompts import Prompt
from app.core.setups import Sampling as S
from app.core.setups import SetupBase, SetupKind, get_kind, grammar, param, parse_setup, register, unregister
from app.worker.plan import RunPlan, RunResults


@dataclass(frozen=True)
class Repeat(SetupBase):
    """Draft the last token k times."""

    prefix = "repeat"

    k: int = param(2, min=1, max=8, always=True, help="how many copies of the last token to draft")


class RepeatDrafter:
    wants_hidden = False

    def __init__(self, k: int) -> None:
        self.k = k

    def start(self, prompt_ids):
        pass

    def propose(self, ctx):
        from app.speculative.drafters import Proposal

        return Proposal([ctx.ids[-1]] * min(self.k, ctx.max_k))

    def feedback(self, drafted, accepted):
        pass


def build(setup: Repeat, env):
    from app.speculative.loop import LoopRunner

    return LoopRunner(env.target(), RepeatDrafter(setup.k))


# Not registered at import: the worker loads it through SPECDECK_SETUP_KINDS (which registers KIND), the tests below
# through the `toy` fixture, so other tests never see it.
KIND = SetupKind(Repeat, "repeat last", "draft the last token k times (a toy)", build)


@pytest.fixture
def toy():
    register(KIND)
    yield KIND
    unregister("repeat")


def test_the_toy_type_parses_labels_and_shows_in_the_grammar(toy):
    s = parse_setup("repeat:k=3")
    assert s == Repeat(3) and s.label == "repeat:k=3" and parse_setup("repeat").label == "repeat:k=2"
    assert "repeat[:k=2]" in grammar() and get_kind("repeat") is toy
    with pytest.raises(Exception, match=r"k must be in \[1, 8\]"):
        parse_setup("repeat:k=9")


def test_unregistered_it_is_unknown():
    with pytest.raises(Exception, match="unknown method 'repeat'"):
        parse_setup("repeat:k=2")
    assert "repeat" not in grammar()


def test_run_plan_lanes_ids_warmup_and_duplicates(toy):
    prompts = (Prompt("a", "x"), Prompt("b", "y"))
    plan = RunPlan("t", ("baseline", "repeat:k=3"), prompts, S(max_new_tokens=8), mode="interleaved", repeats=2, warmup_tokens=4, run_id="r")
    ids = [s.lane_id for s in plan.lanes]
    assert ids[:4] == ["a#0/L1", "a#0/L2", "a#1/L1", "a#1/L2"] and len(ids) == 8
    assert {s.group for s in plan.lanes} == {"a#0", "a#1", "b#0", "b#1"}
    w = plan.warmup_command()
    assert w.run_id == "r-warmup" and [s.lane_id for s in w.lanes] == ["warm/a#0/L1", "warm/a#0/L2"] and w.sampling.max_new_tokens == 4
    assert plan.setup_index("warm/a#0/L2") == 1 and RunPlan.is_warmup("warm/L1") and not RunPlan.is_warmup("L1")
    single = RunPlan("t", ("baseline",), prompts[:1], S())
    assert [s.lane_id for s in single.lanes] == ["L1"] and single.warmup_command() is None
    with pytest.raises(Exception, match="prompt id 'a' is used twice"):
        RunPlan("t", ("baseline",), (Prompt("a", "x"), Prompt("a", "y")), S())
    with pytest.raises(Exception, match="unknown method"):
        RunPlan("t", ("nope",), prompts, S())


def test_results_pair_lanes_with_their_own_baseline():
    from app.core.events import LaneDone, RunError
    from app.core.metrics import LaneStats

    plan = RunPlan("t", ("baseline", "ngram"), (Prompt("a", "x"), Prompt("b", "y")), S(), run_id="r")

    def st(setup, pid, wall, ids):
        return LaneStats(setup, pid, 0, len(ids), wall, 0.1, 0.1, len(ids), 0, 0, 0, 0.0, 0.0, tuple(ids), "")

    res = RunResults(plan)
    res.on_event(LaneDone("b#0/L2", st("ngram:n=3,k=8", "b", 1.0, [1, 2, 3])))
    res.on_event(LaneDone("warm/a#0/L1", st("baseline", "a", 9.0, [9])))  # warm-up: ignored
    res.on_event(LaneDone("a#0/L1", st("baseline", "a", 2.0, [1, 2])))
    res.on_event(LaneDone("b#0/L1", st("baseline", "b", 3.0, [1, 2, 4])))
    res.on_event(RunError("a#0/L2", "boom"))
    out = res.completed()
    assert [(r.setup, r.prompt_id) for r in out] == [("baseline", "a"), ("baseline", "b"), ("ngram:n=3,k=8", "b")]
    ng = out[-1]
    assert ng.speedup == pytest.approx(3.0) and ng.identical_to_baseline is False and ng.first_divergence == 2
    assert res.finished == 4 and res.total == 4
    doc = res.report("cpu", "float32")
    assert doc["errors"] == ["lane a#0/L2: boom"] and len(doc["runs"]) == 3


def test_the_toy_type_runs_through_bench_and_the_worker(tiny_pair):
    """The worker process learns the toy type from SPECDECK_SETUP_KINDS (this module exposes KIND)."""
    target, _ = tiny_pair
    env = dict(os.environ, SPECDECK_SETUP_KINDS="tests.test_setup_types")
    r = subprocess.run([sys.executable, "-m", "app", "bench", "--target", str(target), "--setup", "repeat:k=3", "--prompt",
                        "ha ha ha ha ha ha", "--max-new-tokens", "16", "--no-chat", "--warmup", "0", "--json", "-", "--quiet"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    runs = {x["setup"]: x for x in doc["runs"]}
    assert set(runs) == {"baseline", "repeat:k=3"}
    toy = runs["repeat:k=3"]
    assert toy["identical_to_baseline"] is True and toy["output_ids"] == runs["baseline"]["output_ids"]
    assert toy["drafted"] > 0 and toy["steps"] < toy["new_tokens"] + 1


def test_the_readme_grammar_is_the_registry_s():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- setup-grammar -->\n```\n", 1)[1].split("\n```\n<!-- /setup-grammar -->", 1)[0]
    assert block == grammar(), "README's setup grammar is stale: paste `python -c 'from app.core.setups import grammar; print(grammar())'`"


def test_setups_command_lists_every_type_and_parameter():
    from app.commands.setups import describe_setups
    from app.core.setups import kinds

    text = describe_setups()
    for k in kinds():
        assert f"{k.prefix}: {k.summary}" in text
        for p in k.params:
            assert p.help in text


@pytest.mark.parametrize("module, says", [
    ("os", "setup kind module 'os' (SPECDECK_SETUP_KINDS) registers no setup kind"),
    ("tests.broken_plugin_that_does_not_exist", "cannot import setup kind module 'tests.broken_plugin_that_does_not_exist'"),
    ("tests.plugin_that_raises", "cannot import setup kind module 'tests.plugin_that_raises' (SPECDECK_SETUP_KINDS): ZeroDivisionError"),
])
def test_a_plugin_that_registers_nothing_or_breaks_is_one_clear_error(tmp_path, module, says):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "plugin_that_raises.py").write_text("x = 1 / 0\n")
    env = dict(os.environ, SPECDECK_SETUP_KINDS=module, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.getcwd()}")
    r = subprocess.run([sys.executable, "-m", "app", "setups"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") <= 2  # the error and its fix
