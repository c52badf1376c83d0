"""app.worker.scheduler.schedule: the order lanes step in. The lanes are plain iterators here: the order is what is
tested (real lanes through the scheduler: tests/worker/test_worker.py, tests/engines/test_llamacpp.py)."""

from __future__ import annotations

from app.core.events import RunError
from app.worker.messages import LaneSpec
from app.worker.scheduler import schedule

GROUPS = [f"p{i}#0" for i in range(12)]
LANES = 4
STEPS = 3


def _plan() -> list[LaneSpec]:
    return [LaneSpec(f"{g}/L{i}", "baseline", g.split("#")[0], "prompt", group=g) for g in GROUPS for i in range(LANES)]


def _run(mode: str) -> list[tuple[str, int]]:
    """(lane id, step) in the order the scheduler advanced the lanes."""
    out: list = []

    def make(spec: LaneSpec):
        for step in range(STEPS):
            yield (spec.lane_id, step)
        yield RunError(spec.lane_id, "done")  # a lane's last event

    schedule(_plan(), make, mode, out.append)
    assert sum(isinstance(e, RunError) for e in out) == len(GROUPS) * LANES
    return [e for e in out if isinstance(e, tuple)]


def test_interleaved_groups_take_turns_at_stepping_first():
    """Interleaved: a group's lanes advance one step each, round by round, in the same turn order every round;
    groups run one after another; each group starts its rounds at another lane (not always the plan's first, where
    the baseline is), the same for a rerun. Sequential: the plan's order."""
    steps = _run("interleaved")
    assert len(steps) == len(GROUPS) * LANES * STEPS
    assert [s[0].split("/")[0] for s in steps] == [g for g in GROUPS for _ in range(LANES * STEPS)]  # groups in turn
    firsts = []
    for gi, g in enumerate(GROUPS):
        mine = steps[gi * LANES * STEPS : (gi + 1) * LANES * STEPS]
        rounds = [mine[r * LANES : (r + 1) * LANES] for r in range(STEPS)]
        for r, lanes in enumerate(rounds):
            assert {s[1] for s in lanes} == {r} and sorted(s[0] for s in lanes) == [f"{g}/L{i}" for i in range(LANES)]
            assert [s[0] for s in lanes] == [s[0] for s in rounds[0]]  # one turn order for the whole group
        order = [int(s[0].rsplit("L", 1)[1]) for s in rounds[0]]
        assert order == [(order[0] + i) % LANES for i in range(LANES)]  # the plan's order, turned
        firsts.append(order[0])
    assert len(set(firsts)) >= 3, firsts  # 12 groups: not always lane 0
    assert _run("interleaved") == steps
    seq = _run("sequential")
    assert [s[0] for s in seq] == [sp.lane_id for sp in _plan() for _ in range(STEPS)]
