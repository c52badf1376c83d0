"""resources/bench/tune_grid.py's priced verdict on a literal finder report: k=auto against the best fixed setup of the
grid per category, as the finder priced both on one set of calibration records."""

from __future__ import annotations

import pytest

from tests.helpers import bench_script


def _tune_grid():
    return bench_script("tune_grid")


def _cand(setup: str, **by_category: float) -> dict:
    return dict(setup=setup, predicted_by_category=by_category)


def test_priced_verdict_takes_the_best_fixed_setup_of_the_grid_in_each_category():
    tg = _tune_grid()
    fixed = tg.grid("d", ",dtype=int8")
    auto = "draft:d,k=auto,dtype=int8"
    tune = {"candidates": [
        _cand("draft:d,k=24,cstop=0.5,dtype=int8", coding=2.0, qa=1.2),
        _cand("draft:d,k=2,cstop=0.5,dtype=int8", coding=1.5, qa=1.5),
        # off the grid (k=12, a tree): the finder priced them, the grid's verdict leaves them out
        _cand("draft:d,k=12,cstop=0.5,dtype=int8", coding=3.0, qa=3.0),
        _cand("tree:d,shape=2x2,dtype=int8", coding=3.0, qa=3.0),
        _cand(auto, coding=1.9, qa=1.5, rag=1.4),  # rag: no fixed setup priced there
    ]}
    got = tg.priced_by_category(tune, fixed, auto)
    assert set(got) == {"coding", "qa"}
    assert got["coding"]["best_setup"] == "draft:d,k=24,cstop=0.5,dtype=int8"
    assert got["coding"]["ratio"] == pytest.approx(0.95)
    assert got["qa"]["best_setup"] == "draft:d,k=2,cstop=0.5,dtype=int8" and got["qa"]["ratio"] == pytest.approx(1.0)
    # a finder run that did not price k=auto: nothing to judge
    assert tg.priced_by_category({"candidates": tune["candidates"][:2]}, fixed, auto) == {}


def test_hand_tuning_runs_each_prompt_with_the_setup_fastest_on_its_categorys_other_prompts():
    """The measured verdict against hand tuning on a literal bench report: c1 gets k=8 (fastest on c2), c2 gets k=16
    (fastest on c1), m1 — alone in its category — k=16 (fastest on c1 + c2: 9 s against 10 s)."""
    tg = _tune_grid()
    k8, k16, auto = "draft:d,k=8,dtype=int8", "draft:d,k=16,dtype=int8", "draft:d,k=auto,dtype=int8"
    walls = {"baseline": {"c1": 10.0, "c2": 10.0, "m1": 10.0}, k8: {"c1": 6.0, "c2": 4.0, "m1": 4.0},
             k16: {"c1": 3.0, "c2": 6.0, "m1": 5.0}, auto: {"c1": 5.0, "c2": 5.0, "m1": 5.0}}
    bench = {"runs": [dict(setup=s, prompt_id=p, wall_s=w) for s, by in walls.items() for p, w in by.items()],
             "categories": {"c1": "coding", "c2": "coding", "m1": "math"}}
    got = tg.hand_tuned_by_category(bench, [k8, k16], auto)
    assert got["coding"]["picks"] == [k16, k8] and got["coding"]["hand_tuned"] == pytest.approx(20.0 / 12.0)
    assert got["coding"]["ratio"] == pytest.approx(1.2) and got["math"]["picks"] == [k16] and got["math"]["ratio"] == pytest.approx(1.0)
    assert got["all"]["ratio"] == pytest.approx(17.0 / 15.0) and got["all"]["auto"] == pytest.approx(2.0)
