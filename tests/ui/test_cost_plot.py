"""The Costs tab: V(n) per target engine and each draft's cost, from the run's ProfileReady events."""

from __future__ import annotations

import pytest

from app.core.costs import PROFILE_NS, CostProfile
from app.core.events import ProfileReady
from app.core.prompts import Prompt
from app.core.setups import Sampling
from app.ui.cost_plot import CostPanel
from app.worker.plan import RunPlan, RunResults


def prof(engine, v, t1, precision="float32", backend="hf"):
    return CostProfile(engine=engine, backend=backend, precision=precision, device="cpu", weights="w", machine="m", ns=PROFILE_NS,
                       times_s=tuple(t1 * v(n) for n in PROFILE_NS), machine_text="Test CPU, 2 cores, avx2")


def test_cost_panel_draws_each_targets_curve_and_each_drafts_cost(qtbot):
    panel = CostPanel()
    qtbot.addWidget(panel)
    plan = RunPlan("big", ("baseline", "draft:small,k=auto,dtype=int8", "baseline@lc-big", "draft:lc-small,k=4@lc-big"),
                   (Prompt("p", "x"),), Sampling())
    panel.start_run(plan, RunResults(plan))
    assert panel.lines() == []
    for p in (prof("big", lambda n: 1 + 0.07 * (n - 1), 0.3), prof("small", lambda n: 1 + 0.1 * n, 0.036, "int8"),
              prof("lc-big", lambda n: 0.3 + 0.7 * n, 0.06, "Q4_K_M", "llamacpp"), prof("lc-small", lambda n: n, 0.033, "Q4_K_M", "llamacpp")):
        panel.on_event(ProfileReady(p), 0.0)
    lines = panel.lines()
    curves = {label.split(" ")[0]: y for kind, label, y in lines if kind == "curve"}
    drafts = {label.split(" ")[1]: y for kind, label, y in lines if kind == "draft"}
    assert set(curves) == {"big", "lc-big"}  # the drafts are lines, not curves
    assert curves["big"][4] == pytest.approx(1.28) and curves["lc-big"][4] == pytest.approx(3.8)
    assert drafts == {"small": pytest.approx(0.036 * 1.1 / 0.3), "lc-small": pytest.approx(0.033 / 0.06)}
    assert "Test CPU" in panel.note.text()


def test_the_costs_tab_shows_what_k_auto_saved_of_each_pair_and_forgets_it(qtbot, tmp_path, monkeypatch):
    """Under the curves: what k=auto saved of the run's target–draft pairs on this machine (read when profiles arrive
    and when a run ends: the run's lanes save when they end), and a button that deletes it."""
    from PySide6.QtCore import Qt

    from app.speculative.policy import AutoK, Calibration, save_learnt

    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(tmp_path / "kauto"))
    panel = CostPanel()
    qtbot.addWidget(panel)
    plan = RunPlan("big", ("baseline", "draft:small,k=auto,dtype=int8"), (Prompt("p", "x"),), Sampling())
    panel.start_run(plan, RunResults(plan))
    big, small = prof("big", lambda n: 1 + 0.07 * (n - 1), 0.3), prof("small", lambda n: 1 + 0.1 * n, 0.036, "int8")
    for p in (big, small, prof("small", lambda n: 1 + 0.1 * n, 0.05)):  # the draft at another precision: another pair
        panel.on_event(ProfileReady(p), 0.0)
    assert panel.memory_row.isHidden()  # nothing saved yet
    auto, cal = AutoK(big, draft=small), Calibration()
    for _ in range(50):
        cal.update(0.95, True)
    auto.answers = 2
    saved = save_learnt((big.key, small.key), auto, cal)  # what the run's k=auto lane saves when it ends
    panel.finish(RunResults(plan))
    assert not panel.memory_row.isHidden() and panel.forget.isEnabled()
    text = panel.memory.text()
    assert "draft small (int8) for big: over 2 answer(s)" in text and "q>=0.9 100%" in text and "float32" not in text
    assert "drafting saved 0.30 of a decode step a token" in text  # nothing measured: the prior (AutoK.saving)
    assert "verifies cost 1.00x the profile's" in text  # nothing measured: the profile as it is (AutoK.verify_factor)
    assert "lanes" not in [kind for kind, _, _ in panel.lines()]  # so no curve of what the lanes paid
    auto._vf = [0.2 * 46, 46.0]  # the pair's verifies cost 1.2 times the profile's
    save_learnt((big.key, small.key), auto, cal)
    panel.finish(RunResults(plan))
    assert "verifies cost 1.20x the profile's" in panel.memory.text()
    paid = [(label, y) for kind, label, y in panel.lines() if kind == "lanes"]
    assert len(paid) == 1 and "×1.20" in paid[0][0] and "small" in paid[0][0]
    assert paid[0][1][0] == 1.0 and paid[0][1][4] == pytest.approx(1.2 * 1.28)  # V(5) 1.28 on the profile
    qtbot.mouseClick(panel.forget, Qt.MouseButton.LeftButton)
    assert not saved.exists() and "Forgot what k=auto learnt of 1 pair(s)" in panel.memory.text()
    assert "lanes" not in [kind for kind, _, _ in panel.lines()]
    assert not panel.forget.isEnabled()
    panel.refresh_memory()
    assert panel.memory_row.isHidden()
