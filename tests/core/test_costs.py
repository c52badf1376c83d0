"""Cost profiles and the cost-aware theory (pure functions, literal tables)."""

from __future__ import annotations

import pytest

from app.core.costs import CostProfile, LaneCosts, load_profile, machine_key, predicted_wall_s, save_profile
from app.core.metrics import LaneStats, summarize


def profile(times, ns=None, **kw) -> CostProfile:
    ns = ns or tuple(range(1, len(times) + 1))
    base = dict(engine="t", backend="hf", precision="float32", device="cpu", weights="w", machine="m")
    base.update(kw)
    return CostProfile(**base, ns=tuple(ns), times_s=tuple(times))


def test_profile_interpolates_between_points_and_extends_the_last_segment():
    p = profile([0.1, 0.2, 0.6], ns=(1, 2, 6))
    assert p.t(1) == 0.1 and p.t(0) == 0.1
    assert p.t(4) == pytest.approx(0.4)  # halfway between n=2 and n=6
    assert p.t(8) == pytest.approx(0.8)  # slope 0.1 per token beyond n=6
    assert p.v(6) == pytest.approx(6.0)
    assert p.curve(3) == pytest.approx((1.0, 2.0, 3.0))


@pytest.mark.parametrize("ns,times", [((2, 3), (0.1, 0.2)), ((1, 1), (0.1, 0.1)), ((1, 2), (0.1,)), ((1, 2), (0.1, 0.0)), ((1, 2), (0.1, float("nan")))])
def test_profile_rejects_malformed_measurements(ns, times):
    with pytest.raises(ValueError):
        profile(times, ns=ns)


def test_profiles_round_trip_through_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDECK_PROFILES", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    p = profile([0.01, 0.012, 0.02], ns=(1, 2, 4), machine=machine_key())
    assert load_profile(p.key) is None
    path = save_profile(p)
    assert path is not None and path.parent == tmp_path / "specdeck" / "profiles"
    assert load_profile(p.key) == p
    path.write_text("{ not json")
    assert load_profile(p.key) is None  # unreadable: measured again, never an error


def test_profile_cache_that_cannot_be_written_is_not_an_error(tmp_path, monkeypatch):
    (tmp_path / "specdeck").write_text("a file where the cache folder should be")
    monkeypatch.delenv("SPECDECK_PROFILES", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert save_profile(profile([0.1, 0.2])) is None


def test_lane_costs_extend_beyond_the_curve():
    c = LaneCosts((1.0, 1.5, 2.0))
    assert c.v(1) == 1.0 and c.v(3) == 2.0 and c.v(5) == pytest.approx(3.0)


def test_predicted_wall_counts_each_step_at_its_own_verify_width():
    costs = LaneCosts((1.0, 1.2, 1.4, 1.6, 1.8))
    # 10 decode steps: 4 drafted nothing, 6 drafted 4 (verify 5 tokens); 0.6 s of drafting measured
    wall = predicted_wall_s(costs=costs, k_hist=(4, 0, 0, 0, 6), draft_s=0.6, prefill_s=0.5, base_step_s=0.1, base_overhead_s=0.01)
    assert wall == pytest.approx(0.5 + (4 * 1.0 + 6 * 1.8) * 0.1 + 10 * 0.01 + 0.6)


def lane(setup, wall, steps, *, prefill=0.2, verify=0.0, tokens=20, k_hist=(), costs=None, drafted=0, accepted=0,
         fwd=0, t_draft=0.0, pid="p"):
    return LaneStats(setup, pid, 0, tokens, wall, prefill, prefill, steps, drafted, accepted, fwd, t_draft, verify, tuple(range(tokens)), "",
                     decode_k_hist=k_hist, costs=costs)


def test_summary_theory_is_predicted_from_the_cost_curve_not_assumed():
    # baseline: 20 tokens in 20 steps, 19 decode steps of 0.1 s forward + 0.01 s overhead
    base = lane("baseline", wall=0.2 + 19 * 0.11, steps=20, verify=19 * 0.1, k_hist=(19,))
    costs = LaneCosts((1.0, 1.1, 1.2, 1.3, 1.4))
    # the draft lane: 5 decode steps each verifying 5 tokens (k=4), 20 draft forwards
    spec = lane("draft:d,k=4", wall=1.0, steps=6, verify=5 * 0.14, k_hist=(0, 0, 0, 0, 5), costs=costs, drafted=24, accepted=15,
                fwd=20, t_draft=0.4)
    s = {x.setup: x for x in summarize([base, spec])}
    predicted = 0.2 + 5 * 1.4 * 0.1 + 5 * 0.01 + 0.4
    assert s["draft:d,k=4"].theoretical_speedup == pytest.approx(base.wall_s / predicted)
    assert s["baseline"].theoretical_speedup == 1.0
    # Leviathan's formula is kept beside it, and differs (it assumes V(5) = 1)
    assert s["draft:d,k=4"].uniform_theory is not None and s["draft:d,k=4"].uniform_theory != pytest.approx(s["draft:d,k=4"].theoretical_speedup)
    # no profile: not predicted, rather than a made-up figure
    bare = lane("draft:d,k=4", wall=1.0, steps=6, verify=0.7, k_hist=(0, 0, 0, 0, 5), drafted=24, accepted=15, fwd=20, t_draft=0.4)
    assert {x.setup: x for x in summarize([base, bare])}["draft:d,k=4"].theoretical_speedup is None


def test_theory_applies_when_everything_was_drafted_in_step_0():
    """k >= the token budget: every draft is verified by the prompt forward (measured), the rest is predicted."""
    base = lane("baseline", wall=0.2 + 19 * 0.11, steps=20, verify=19 * 0.1, k_hist=(19,))
    spec = lane("draft:d,k=32", wall=0.5, steps=2, verify=0.1, prefill=0.4, k_hist=(1,), costs=LaneCosts((1.0, 1.1)),
                drafted=31, accepted=18)
    s = {x.setup: x for x in summarize([base, spec])}["draft:d,k=32"]
    assert s.theoretical_speedup == pytest.approx(base.wall_s / (0.4 + 0.1 + 0.01))


def test_a_profile_measured_under_contention_is_flagged_and_named_in_the_table():
    from app.core.costs import CONTENDED_SPREAD, CONTENDED_WAIT, CostProfile
    from app.core.report_text import render_profiles

    base = dict(engine="e", backend="hf", precision="float32", device="cpu", weights="w", machine="m", ns=(1, 2), times_s=(0.05, 0.06))
    assert not CostProfile(**base, cpu_wait_share=0.01, spread=0.05).contended
    assert CostProfile(**base, cpu_wait_share=CONTENDED_WAIT + 0.01).contended
    assert CostProfile(**base, spread=CONTENDED_SPREAD + 0.01).contended
    old = CostProfile.from_json({k: v for k, v in CostProfile(**base).to_json().items() if k not in ("cpu_wait_share", "spread")})
    assert not old.contended  # a profile cached before these fields reads as it was
    text = render_profiles([CostProfile(**base, cpu_wait_share=0.4, spread=0.1).to_json()])
    assert "e (hf float32) !" in text and "waited 40 % of the time" in text and "not cached" in text


def test_the_table_says_where_a_wider_forward_is_cheaper():
    from app.core.costs import CostProfile
    from app.core.report_text import render_profiles

    base = dict(engine="e", backend="hf", precision="float32", device="cpu", weights="w", machine="m", ns=(1, 2, 3, 5))
    text = render_profiles([CostProfile(**base, times_s=(0.10, 0.12, 0.09, 0.09)).to_json()])
    assert "not always dearer here (V(1) 1.00, V(2) 1.20, V(3) 0.90, V(5) 0.90)" in text
    assert "not always dearer" not in render_profiles([CostProfile(**base, times_s=(0.10, 0.11, 0.12, 0.14)).to_json()])
