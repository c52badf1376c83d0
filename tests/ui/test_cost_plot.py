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
