"""app.worker.scheduler.schedule: the order lanes step in. The lanes are plain iterators here: the order is what is
tested (real lanes through the scheduler: tests/worker/test_worker.py, tests/engines/test_llamacpp.py)."""

from __future__ import annotations

from app.core.events import LaneDone, LaneStarted, RunError, StepEvent
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


def _lanes(per_step: dict[str, int], total: int = 48, group: str = "p#0", mode: str = "paced",
           unmarked: tuple[str, ...] = ()) -> tuple[list[tuple[str, int]], list]:
    """Schedule lanes that emit `per_step[lane]` tokens a step (the last step cut at `total`), each lane's events as the
    loop makes them, its last step marked final (StepEvent.final) but for the lanes in `unmarked` (a backend that
    reports its end later): ((lane, tokens it had emitted before this step) in the order the lanes stepped, every
    event emitted)."""
    order: list = []
    events: list = []
    specs = [LaneSpec(f"{group}/{name}", "baseline", "p", "prompt", group=group) for name in per_step]

    def make(spec: LaneSpec):
        name = spec.lane_id.split("/")[1]
        yield LaneStarted(spec.lane_id, spec.setup, "p", 0, (1, 2), "prompt")
        done, step = 0, 0
        while done < total:
            n = min(per_step[name], total - done)
            order.append((name, done))
            done += n
            yield StepEvent(spec.lane_id, step, tuple(range(n - 1)), n - 1, 7, "bonus", 0.0, 0.0, 0.0, tuple(range(n)),
                            final=done == total and name not in unmarked)
            step += 1
        yield LaneDone(spec.lane_id, None)

    schedule(specs, make, mode, events.append)
    return order, events


def _paced(per_step: dict[str, int], total: int = 48, group: str = "p#0") -> list[tuple[str, int]]:
    """(lane, tokens it had emitted before this step) in the order the paced scheduler stepped the lanes (_lanes)."""
    return _lanes(per_step, total, group)[0]


def test_paced_lanes_step_by_fewest_tokens_and_end_together():
    """Paced: the lane that has emitted the fewest tokens steps next (ties in the group's turned order), so a baseline
    of 48 one-token steps is spread over the whole time a lane of 8 tokens a step runs, instead of running its last
    40 steps alone as in the race (where a slowdown late in the group would fall on the baseline only)."""
    order = _paced({"base": 1, "spec": 8, "mid": 3})
    assert len(order) == 48 + 6 + 16
    tokens = {"base": 0, "spec": 0, "mid": 0}
    for lane, before in order:
        assert before == tokens[lane]
        live = [n for n in ("base", "spec", "mid") if tokens[n] < 48]
        assert tokens[lane] == min(tokens[n] for n in live), (lane, tokens)  # the fewest tokens steps next
        tokens[lane] += {"base": 1, "spec": 8, "mid": 3}[lane]
    # every lane's last step falls in the last stretch: the spec lane (6 steps) does not end before the baseline's
    # 40th token (the race ends it after the baseline's 6th step)
    last = {lane: i for i, (lane, _) in enumerate(order)}
    assert last["spec"] > [i for i, (lane, before) in enumerate(order) if lane == "base" and before == 40][0]
    assert _paced({"base": 1, "spec": 8, "mid": 3}) == order  # the same order for a rerun
    race = _run("interleaved")  # the race is unchanged: one step each per round
    assert len(race) == len(GROUPS) * LANES * STEPS


def test_paced_ties_go_in_the_groups_turned_order_and_all_groups_run():
    """Lanes tied on tokens step in the group's turned order (not always the plan's first lane); groups run one after
    another and every lane of each ends."""
    starts = []
    for g in GROUPS:
        order = _paced({"a": 2, "b": 2, "c": 2}, total=6, group=g)
        assert len(order) == 9
        first_round = [lane for lane, _ in order[:3]]
        assert sorted(first_round) == ["a", "b", "c"]
        assert [lane for lane, _ in order[3:6]] == first_round == [lane for lane, _ in order[6:]]
        starts.append(first_round[0])
    assert len(set(starts)) >= 2, starts


def test_a_lane_that_ended_passes_its_lane_done_on_at_once():
    """A lane's final step (StepEvent.final: it reached EOS or its token limit) comes with its LaneDone: paced, a
    lane of 8 tokens a step does not show as running until the baseline's last one-token steps are done;
    interleaved, it does not wait for another round. The LaneDone is pulled right after the final step, before any
    other lane steps (paced, the spec lane's last step falls when the others have 40 of their 48 tokens: without the
    mark its LaneDone waited for them all to end); a lane whose last step is not marked final (a backend that reports
    its end later) ends on its next turn, as before."""
    for mode in ("paced", "interleaved"):
        _, emitted = _lanes({"base": 1, "spec": 8, "late": 8}, mode=mode, unmarked=("late",))
        events = [e for e in emitted if isinstance(e, (StepEvent, LaneDone))]
        last_spec = max(i for i, e in enumerate(events) if isinstance(e, StepEvent) and e.lane_id == "p#0/spec")
        assert isinstance(events[last_spec + 1], LaneDone) and events[last_spec + 1].lane_id == "p#0/spec", mode
        base_after = sum(isinstance(e, StepEvent) and e.lane_id == "p#0/base" for e in events[last_spec:])
        late_last = max(i for i, e in enumerate(events) if isinstance(e, StepEvent) and e.lane_id == "p#0/late")
        late_done = next(i for i, e in enumerate(events) if isinstance(e, LaneDone) and e.lane_id == "p#0/late")
        if mode == "paced":
            assert base_after == 7, base_after  # told while the baseline still has 7 of its 48 steps to go
            assert late_done - late_last > 1  # unmarked: told on its next turn, after other lanes stepped
        assert sum(isinstance(e, LaneDone) for e in events) == 3
