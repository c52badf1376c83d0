"""`python -m app tune`, the setup finder, end to end on the tiny models (a real worker, real lanes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.core.setups import parse_setup


@pytest.mark.xdist_group("tune_report")  # one xdist worker computes the session fixture for both
def test_tune_calibrates_prices_confirms_and_explains(tune_report):
    doc, out, _ = tune_report
    assert doc["prompts"]["calibrated"] == ["code-1", "edit-1", "qa-1"]  # categories in turn
    assert doc["prompts"]["confirmed"] == doc["prompts"]["calibrated"]
    # 3 prompts: the confirmation runs them twice (CONFIRM_RUNS 6), round after round, and says so
    assert doc["prompts"]["confirmed_runs"] == {"code-1": 2, "edit-1": 2, "qa-1": 2}
    assert "confirmed on 3 prompts × 2 runs in" in out
    cands = doc["candidates"]
    assert doc["priced"] == len(cands) > 5  # distinct behaviours only (identical ones deduplicated)
    preds = [c["predicted_speedup"] for c in cands]
    assert preds == sorted(preds, reverse=True) and [c["rank"] for c in cands] == list(range(1, len(cands) + 1))
    assert {parse_setup(c["setup"]).prefix for c in cands} == {"draft", "ngram", "tree", "redrafter"}
    trees = [c for c in cands if c["kind"] == "tree"]
    assert all(parse_setup(c["setup"]).shape == "x".join(map(str, c["shape"])) for c in trees if c["shape"])  # static; dynamic below
    assert not any("calibration stopped" in t for t in doc["not_tried"])  # --calibrate-all: no drafter dropped
    assert all("dtype=int8" in c["setup"] for c in cands if c["setup"].startswith("draft"))  # --dtypes int8
    for c in cands:
        assert parse_setup(c["setup"]).label == c["setup"] and c["why"]
    measured = [c for c in cands if c["measured"]]
    assert len(measured) >= 3  # the best three were run for real, beside the baseline
    for c in measured:
        assert c["predicted_confirmed_speedup"] > 0 and c["predicted_confirmed_tokens_per_s"] > 0  # on the prompts the confirmation measured
        m = c["measured"]
        assert m["speedup"] > 0 and m["tokens_per_s"] > 0 and m["runs"] == 6 and m["identical_runs"] == 6  # greedy: same tokens
        assert set(m["by_category"]) == {"coding", "editing", "qa"}
    # k=auto is priced like the rest (the policy replayed over the records) and confirmed by a real run
    auto = [c for c in cands if ",k=auto" in c["setup"]]
    assert len(auto) == 1 and auto[0]["auto"] and auto[0]["predicted_speedup"] > 0 and auto[0]["measured"]["speedup"] > 0
    assert not any(",k=auto" in e["setup"] for e in doc["other_measured"])
    # a ReDrafter head trained for the target (kind redrafter): its trees priced from its own calibration lane (every
    # beam tree up to 4 × 4 at once), the best confirmed by a real run
    heads = [c for c in cands if c["kind"] == "redrafter"]
    assert heads and all(parse_setup(c["setup"]).engine == "tiny-head" for c in heads)
    assert {(parse_setup(c["setup"]).beams, parse_setup(c["setup"]).depth) for c in heads} > {(1, 1)}  # deduplicated, not one
    best = heads[0]
    assert best["measured"] and best["measured"]["runs"] == 6 and best["measured"]["identical_runs"] == 6
    assert best["predicted_confirmed_speedup"] > 0 and "head levels × c" in best["why"]
    assert not any(e["setup"].startswith("redrafter:") for e in doc["other_measured"])
    assert "redrafter:tiny-head,beams=4,depth=4,widths=all" not in {c["setup"] for c in cands}  # the calibration lane is not a candidate
    # the misfit head's calibration lane failed, alone, and the report says why
    assert [t for t in doc["not_tried"] if t.startswith("redrafter")] == [
        "redrafter:tiny-misfit did not run: ReDrafter head tiny-misfit does not fit tiny-target (hidden 32 vs 64, vocab 49152 vs 49152)"]
    assert best["setup"] in out and "head levels × c" in out
    # each confirmed setup's walls per prompt; 3 prompts are too few to say which setups they cannot tell apart
    assert all(set(c["measured"]["walls"]) == set(doc["prompts"]["confirmed"]) for c in measured)
    assert doc["winner"]["tied"] == {} and "not told apart" not in out and "as fast as far as" not in out
    assert doc["winner"]["by"] == "measured" and doc["winner"]["speedup"] == max(
        [c["measured"]["speedup"] for c in measured] + [e["measured"]["speedup"] for e in doc["other_measured"]])
    assert set(doc["winners_by_category"]) == {"coding", "editing", "qa"}
    # one prompt a category: each winner line says so (a winner of one prompt is that prompt's)
    assert all(x["prompts"] == 1 for x in doc["winners_by_category"].values())
    assert sum(1 for x in out.splitlines() if x.startswith("  ") and x.rstrip().endswith("on 1 prompt")) == 3
    assert doc["break_even_text"] and all("beat" in t or "verify" in t for t in doc["break_even_text"])
    # dynamic trees: priced from their own calibration lane (every tree up to 32 nodes, depth 6, branch 4 at once), the
    # best confirmed by a real run; the static trees' ranks come from the chain calibration
    dyn = [c for c in cands if c["kind"] == "tree" and not c["shape"]]
    assert dyn and all(c["drafter"].startswith("tree:") and parse_setup(c["setup"]).shape is None for c in dyn)
    assert dyn[0]["measured"] and dyn[0]["measured"]["identical_runs"] == 6 and "draft forwards at c" in dyn[0]["why"]
    assert not doc["other_measured"] and any("dynamic trees of more than 32 nodes" in t for t in doc["not_tried"])
    assert len(doc["verify_curve"]) == 33 and doc["verify_curve"][0] == 1.0
    # priced with this run's verifies: the profile's curve moved to what the calibration lanes measured (their verifies
    # of 2+ tokens are recorded on every prompt); below 9 tokens it may fall (as measured), past 8 it never does, and
    # it stays above half the profile's; the one-figure scale is quoted where there is a positive one
    used, prof = doc["verify_curve"], doc["profile_verify_curve"]
    assert used != prof and all(b >= a for a, b in zip(used[7:], used[8:], strict=False))
    assert all(u >= 0.5 * v - 1e-12 for u, v in zip(used, prof, strict=True))
    s = doc["verify_scale"]
    assert (s is None or s > 0) and ("verify cost: this run's verifies cost" in out) == (s is not None)
    note = next(x for x in out.splitlines() if x.startswith("verify cost: this run's verifies"))
    assert "V(2) " in note and "priced with this run's" in note
    # the machine's speed in the two phases: the baseline's wall on the 3 confirmed prompts, each a mean of its 2 rounds
    speed = doc["baseline_speed"]
    assert speed["prompts"] == 3 and speed["calibration_s"] > 0 and speed["confirmation_s"] > 0
    assert speed["ratio"] == pytest.approx(speed["confirmation_s"] / speed["calibration_s"])
    assert ("machine speed: the baseline ran" in out) == (abs(speed["ratio"] - 1) > 0.05)
    # the table and the progress lines
    assert "fastest here:" in out and "winner per category:" in out and "break-even on this machine:" in out
    # the table ranks by prediction; the winner (measured) is the one row marked ►, explained under the table
    marked = [x for x in out.splitlines() if x.lstrip().startswith("►") and not x.startswith("► the winner")]
    assert len(marked) == 1 and doc["winner"]["setup"] in marked[0] and "► the winner, the fastest measured" in out
    assert "tune [" in out and "calibration: prompt 3 of 3 (qa-1)" in out


def test_the_heads_a_finder_tries(tmp_path, monkeypatch):
    """Kind `redrafter`: the heads trained for the target it calibrates and prices, best held-out first-token acceptance first, at most
    MAX_HEADS of them (the rest named); where none can run or none was trained, one line says why and how to train
    one; without the kind, nothing."""
    import json
    from types import SimpleNamespace

    from app.commands.tune import MAX_HEADS, heads_for

    monkeypatch.setenv("SPECDECK_HEADS", str(tmp_path))
    target = SimpleNamespace(name="qwen-t", backend="hf")
    kinds = ("draft", "redrafter")
    none = heads_for(target, kinds)
    assert none[0] == [] and len(none[1]) == 1 and f"no head trained for qwen-t in {tmp_path}" in none[1][0]
    assert "python -m app train-drafter --target qwen-t" in none[1][0]
    for name, tgt, first in (("a", "qwen-t", 0.2), ("b", "qwen-t", 0.4), ("c", "other", 0.9), ("d", "qwen-t", None), ("e", "qwen-t", 0.3)):
        (tmp_path / name).mkdir()
        training = {"heldout_acceptance": {"chain": [first, 0.1]}} if first is not None else {}
        (tmp_path / name / "head.json").write_text(json.dumps(dict(name=name, kind="redrafter", target=tgt, target_weights="",
                                                                   config={}, training=training)))
    setups, notes = heads_for(target, kinds)
    assert MAX_HEADS == 2 and setups == ["redrafter:b", "redrafter:e"]  # c is another target's
    assert len(notes) == 1 and "2 more head(s) for qwen-t not tried (a, d;" in notes[0]
    assert heads_for(target, ("draft",)) == ([], [])
    s, n = heads_for(SimpleNamespace(name="llamacpp-t", backend="llamacpp"), kinds)
    assert s == [] and "only hf (PyTorch) targets" in n[0]


def test_the_drafters_tried_by_default(tiny_pair):
    """Each PyTorch draft on a CPU at int8 and at its own precision, then n-gram lookup; a draft's static trees are
    priced from its chain calibration, so `--kinds tree` alone calibrates the draft's chains too."""
    from app.commands.tune import calibration_setup, drafters
    from app.engines.registry import resolve

    t, d = (str(p) for p in tiny_pair)
    got = drafters(resolve(t), [d], ("draft", "ngram", "tree"), None)
    assert got == [(f"draft:{d},dtype=int8", True), (f"draft:{d}", True), ("ngram:n=3", False)]
    assert drafters(resolve(t), [d], ("draft",), "float32") == [(f"draft:{d}", True)]
    assert drafters(resolve(t), [d], ("tree",), "int8") == [(f"draft:{d},dtype=int8", True)]
    for s, model in got:
        cal = parse_setup(calibration_setup(s, model))
        assert cal.k == 24 and getattr(cal, "cstop", 0.02) == 0.02


def test_a_drafter_far_behind_is_calibrated_no_more():
    """After two prompts, a drafter whose best setup is priced below 0.85 of another's stops running (its lanes'
    time goes to more prompts), is left out of the ranking and is named with both figures. Literal calibration
    records: the same confident draft, once cheap and once as dear as the target; a lookup that never matched."""
    from app.commands.tune import Finder, Phase
    from app.core.tuning import CalStep, LaneCal, PromptCal

    flat = tuple(1.0 + 0.02 * (n - 1) for n in range(1, 34))
    steps = tuple([CalStep(8, 7, (0.95,) * 8, verify_s=0.12)] * 6)

    def rec(pid: str) -> PromptCal:
        lanes = {"draft:a": LaneCal(steps, None, 1.0, 0.005, 0.0), "draft:b": LaneCal(steps, None, 1.0, 0.1, 0.0),
                 "ngram:n=3": LaneCal(tuple([CalStep(0, 0)] * 40), None, 1.0, 0.0, 0.0)}
        return PromptCal(pid, "code", 49, 5.8, 1.0, 0.1, 0.0, lanes)

    f = Finder.__new__(Finder)
    f.drafters, f.quiet = [("draft:a", True), ("draft:b", True), ("ngram:n=3", False)], True
    f.kinds, f.profiles = ("draft", "ngram"), []
    f.calibration = Phase(None, None, prompts_done=["p1"])
    f.verify_curve = lambda: flat
    f.records = lambda: [rec(p) for p in f.calibration.prompts_done]
    f.drop_the_outpaced()
    assert f.calibration.dropped == {}  # one prompt: too early to tell
    f.calibration.prompts_done.append("p2")
    f.drop_the_outpaced()
    assert set(f.calibration.dropped) == {2, 3}
    assert f.calibration.dropped[2].startswith("draft:b: calibration stopped after 2 prompts: its best setup priced ")
    assert "for draft:a,k=" in f.calibration.dropped[2]
    assert {p.candidate.drafter for p in f.price(f.records())} == {"draft:a"}
    assert {p.candidate.drafter for p in f.price(f.records(), dropped=False)} == {"draft:a", "draft:b", "ngram:n=3"}


def test_the_finder_prices_trees_with_the_profiles_tree_ratios():
    """The target's and the draft's measured tree ratios (CostProfile.tree_ratio) reach the tree candidates' prices
    and their `why`; chains are priced as without them; an engine measured without one counts as 1."""
    from types import SimpleNamespace

    from app.commands.tune import Finder, Phase
    from app.core.costs import PROFILE_NS, CostProfile
    from app.core.tuning import CalStep, LaneCal, PromptCal, price_candidate, tree_grid

    def profile(engine: str, precision: str, ratio: float | None) -> CostProfile:
        return CostProfile(engine=engine, backend="hf", precision=precision, device="cpu", weights="w", machine="m", ns=PROFILE_NS,
                           times_s=tuple(0.1 * (1.0 + 0.02 * (n - 1)) for n in PROFILE_NS), tree_ratio=ratio)

    steps = tuple(CalStep(4, 1, (0.9, 0.6, 0.6, 0.6), rank=2, verify_s=0.11) for _ in range(6))
    rec = PromptCal("p1", "code", 37, 4.6, 1.0, 0.1, 0.0, {"draft:a,dtype=int8": LaneCal(steps, None, 1.0, 0.02, 0.0)})
    f = Finder.__new__(Finder)
    f.drafters, f.quiet, f.kinds = [("draft:a,dtype=int8", True)], True, ("draft", "tree")
    f.target = SimpleNamespace(name="t", backend="hf")
    f.calibration = Phase(None, None, prompts_done=["p1"])
    f.tree_capable = lambda d: True
    f.profiles = [profile("t", "float32", 1.3), profile("a", "int8", 1.5)]
    assert (f.tree_ratio(), f.tree_ratio("draft:a,dtype=int8")) == (1.3, 1.5)
    verify, _ = f.priced_curve([rec])
    priced = {p.candidate.setup: p for p in f.price([rec])}
    tree = tree_grid("draft:a,dtype=int8", [(2, 2, 1)])[0]
    draft_curve = f.draft_curve("draft:a,dtype=int8")
    want = price_candidate(tree, [rec], verify, draft_curve, tree_ratio=1.3, draft_tree_ratio=1.5)
    assert priced[tree.setup].units == pytest.approx(want.units)
    assert priced[tree.setup].units > price_candidate(tree, [rec], verify, draft_curve).units
    chain = next(p for p in priced.values() if p.candidate.kind == "draft" and not p.candidate.auto)
    assert chain.units == pytest.approx(price_candidate(chain.candidate, [rec], verify, draft_curve).units)
    f.profiles = [profile("t", "float32", None), profile("a", "int8", None)]
    assert (f.tree_ratio(), f.tree_ratio("draft:a,dtype=int8")) == (1.0, 1.0)


def test_a_calibration_that_failed_is_said_with_its_prompts():
    """A drafter whose calibration lane failed everywhere did not run; one that failed on some prompts is priced on
    the others, and the report names them with the first error."""
    from types import SimpleNamespace

    from app.commands.tune import calibration_failures
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.worker.plan import RunPlan

    prompts = (Prompt("code-1", "a", "coding"), Prompt("edit-1", "b", "editing"), Prompt("qa-1", "c", "qa"))
    plan = RunPlan("t", ("baseline", "draft:d,k=24", "tree:d,widths=all", "redrafter:h"), prompts, Sampling(), mode="interleaved")
    drafters = [("draft:d", True), ("tree:d", False), ("redrafter:h", False)]
    err = SimpleNamespace(message="ValueError: slots [91] after 90 are not one path\nmore")
    errors = {plan.lane_id(2, prompts[1]): err, plan.lane_id(2, prompts[2]): err, plan.lane_id(3, prompts[0]): SimpleNamespace(message="no such head"),
              None: SimpleNamespace(message="worker")}
    assert calibration_failures(drafters, plan, errors, {"draft:d", "tree:d"}) == [
        "tree:d: its calibration failed on edit-1, qa-1 (ValueError: slots [91] after 90 are not one path); priced on the other prompts",
        "redrafter:h did not run: no such head"]


def run(*args):
    return subprocess.run([sys.executable, "-m", "app", "tune", *args], capture_output=True, text=True, timeout=120)


def test_tune_says_what_is_wrong_with_its_input():
    r = run("--target", "smollm2-135m-instruct", "--kinds", "draft,medusa")
    assert r.returncode == 2 and "unknown drafter kind medusa" in r.stderr and "draft, ngram, tree, redrafter" in r.stderr
    r = run("--target", "smollm2-135m-instruct", "--kinds", "draft")
    assert r.returncode == 2 and "no draft model for smollm2-135m-instruct" in r.stderr and "--draft ENGINE" in r.stderr
    r = run("--target", "no-such-engine")
    assert r.returncode == 2 and "no-such-engine" in r.stderr


def test_a_prediction_beside_a_measurement_is_on_the_same_prompts():
    """Where the confirmation ran out of time before every calibrated prompt, a confirmed setup's predicted cell is
    its prediction on the prompts measured (marked *): beside 2.60x measured on 2 prompts, 2.17x predicted on all 4
    read as a 17 % error where it was 2 % (a real finder run on 4 Spec-Bench prompts)."""
    from app.commands.tune import predicted_cell

    c = dict(predicted_speedup=2.17, predicted_confirmed_speedup=2.64, measured=dict(speedup=2.60))
    assert predicted_cell(c, partial=True) == "2.64x*" and predicted_cell(c, partial=False) == "2.17x"
    assert predicted_cell(dict(predicted_speedup=2.0, predicted_confirmed_speedup=None, measured=None), True) == "2.00x"
    assert predicted_cell(dict(predicted_speedup=float("nan"), measured=None), False) == "–"
    c.update(predicted_tokens_per_s=4.6, predicted_confirmed_tokens_per_s=5.2)
    assert predicted_cell(c, True, "tokens_per_s") == "5.2*" and predicted_cell(c, False, "tokens_per_s") == "4.6"


def test_the_confirmations_runs_are_said_beside_its_prompts():
    """The finder's first line says how many times the confirmation ran its prompts: nothing for once each (and for
    reports from before it repeated them), the count for every prompt alike, the range where the budget stopped a
    round part-way."""
    from app.commands.tune import confirm_rounds

    assert confirm_rounds(dict(prompts=dict(confirmed=["a", "b"]))) == ""
    assert confirm_rounds(dict(prompts=dict(confirmed_runs={"a": 1, "b": 1}))) == ""
    assert confirm_rounds(dict(prompts=dict(confirmed_runs={"a": 3, "b": 3}))) == " × 3 runs"
    assert confirm_rounds(dict(prompts=dict(confirmed_runs={"a": 3, "b": 2}))) == " × 2–3 runs"


def test_the_setups_a_confirmation_cannot_tell_from_the_winner():
    """Paired by prompt: a setup slower on every confirmed prompt is not tied with the winner; one faster on some
    prompts and slower on others is, and the headline names it with its interval; a setup measured on fewer than
    MIN_UNITS prompts: no claim either way."""
    from app.commands.tune import headline, tied_with_winner

    walls = {"p1": 5.0, "p2": 10.0, "p3": 7.5, "p4": 6.0, "p5": 9.0, "p6": 4.5}
    measured = {"baseline": dict(walls={k: 2 * v for k, v in walls.items()}),
                "win": dict(walls=walls),
                "slower": dict(walls={k: v * 1.05 for k, v in walls.items()}),
                "mixed": dict(walls={"p1": 4.8, "p2": 10.4, "p3": 7.3, "p4": 6.2, "p5": 8.8, "p6": 4.7}),
                "head": dict(walls={"p1": 5.5})}  # one prompt: no interval
    tied = tied_with_winner(measured, "win")
    assert set(tied) == {"mixed"} and tied["mixed"]["lo"] <= 1.0 <= tied["mixed"]["hi"] and tied["mixed"]["units"] == 6
    lines = headline(dict(winner=dict(setup="win", speedup=2.0, by="measured", tied=tied)))
    assert lines[0] == "fastest here: win — 2.00x the baseline (measured)"
    assert "as fast as far as its 6 confirmed prompts tell" in lines[1] and "mixed" in lines[1]
    assert headline(dict(winner=dict(setup="win", speedup=2.0, by="predicted", tied={}))) == ["fastest here: win — 2.00x the baseline (predicted)"]
    assert headline(dict(winner=None)) == ["no setup beat the baseline here"]


def test_the_verify_note_says_when_the_run_moved_the_curve():
    """With a ratio to quote it is quoted; without one (verifies cheaper than one forward in sum) the moved curve is
    still named; a curve the run did not move gets no line."""
    from app.commands.tune import verify_note

    prof = [1.0, 1.17, 0.85, 0.79, 0.85, 0.75, 0.9, 0.98, 1.08, 1.1]
    used = [1.0, 1.10, 0.80, 0.75, 0.80, 0.70, 0.85, 0.95, 1.05, 1.1]
    assert verify_note(dict(verify_scale=0.9, profile_verify_curve=prof, verify_curve=used)).startswith(
        "verify cost: this run's verifies cost 0.90x what the cost profile says above one forward (V(2) 1.17 → 1.10, V(5) 0.85 → 0.80")
    assert verify_note(dict(verify_scale=None, profile_verify_curve=prof, verify_curve=used)).startswith(
        "verify cost: this run's verifies moved the cost profile's curve (V(2) 1.17 → 1.10")
    assert verify_note(dict(verify_scale=None, profile_verify_curve=prof, verify_curve=prof)) == ""


def test_the_speed_note_says_when_the_machine_ran_at_another_speed_in_the_confirmation():
    """The baseline's wall on the prompts both phases ran (the confirmation's a mean over its rounds) is compared; a
    move of more than SPEED_NOTE gets one line naming which way and by how much, a smaller one none."""
    from app.commands.tune import SPEED_NOTE, baseline_speed, speed_note
    from app.core.tuning import PromptCal

    records = [PromptCal("a", "code", 48, 10.0, 1.0, 0.19, 0.0), PromptCal("b", "qa", 48, 14.0, 1.5, 0.26, 0.0),
               PromptCal("c", "qa", 48, 99.0, 1.5, 0.26, 0.0)]  # c: not confirmed
    measured = {"baseline": {"walls": {"a": 36.0, "b": 50.4}}, "x": {"walls": {"a": 5.0, "b": 6.0}}}
    b = baseline_speed(records, measured, {"a": 3, "b": 3})
    assert b == dict(prompts=2, calibration_s=24.0, confirmation_s=pytest.approx(28.8), ratio=pytest.approx(1.2))
    line = speed_note(dict(baseline_speed=b))
    assert line.startswith("machine speed: the baseline ran 20 % slower in the confirmation than in the calibration on the same 2 prompt(s)")
    assert "(28.8 s against 24.0 s)" in line
    faster = baseline_speed(records, {"baseline": {"walls": {"a": 8.0}}}, {"a": 1})
    assert faster["ratio"] == pytest.approx(0.8) and "20 % faster" in speed_note(dict(baseline_speed=faster))
    near = baseline_speed(records, {"baseline": {"walls": {"a": 10.0 * (1 + SPEED_NOTE / 2)}}}, {"a": 1})
    assert speed_note(dict(baseline_speed=near)) == ""
    assert baseline_speed(records, {"x": {"walls": {"a": 5.0}}}, {"a": 1}) is None and speed_note({}) == ""
