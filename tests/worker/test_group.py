"""WorkerGroup: one client interface over SpecDeck's worker and workers in other environments. The worker
clients are fakes here (the real two-environment path runs in tests/worker/test_environments.py); what is
tested is the routing: segment order, one RunFinished per run, cancels reaching the segment that runs, and
heartbeats heard only from the worker that is busy."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from app.core.events import LaneDone, RunError
from app.core.setups import Sampling
from app.worker import group as group_mod
from app.worker.group import WorkerGroup, segments
from app.worker.messages import Cancel, Heartbeat, LaneSpec, RunFinished, RunLanes, WorkerReady

FOREIGN = "/envs/trt/bin/python"


def _where(spec: LaneSpec) -> str:
    return FOREIGN if spec.setup.startswith("trtllm:") else ""


def _run(mode: str) -> RunLanes:
    lanes = []
    for g in ("p#0", "p#1"):
        for i, s in enumerate(("baseline", "trtllm:e", "ngram")):
            lanes.append(LaneSpec(f"{g}/L{i + 1}", s, "p", "hi", group=g))
    return RunLanes("r", "t", tuple(lanes), Sampling(max_new_tokens=4), mode=mode)


def test_segments_keep_the_order_and_group_environments():
    inter = [(env, [s.lane_id for s in part.lanes], part.run_id) for env, part in segments(_run("interleaved"), _where)]
    assert inter == [
        ("", ["p#0/L1", "p#0/L3"], "r~0"), (FOREIGN, ["p#0/L2"], "r~1"),
        ("", ["p#1/L1", "p#1/L3"], "r~2"), (FOREIGN, ["p#1/L2"], "r~3"),
    ]
    seq = [(env, [s.lane_id for s in part.lanes]) for env, part in segments(_run("sequential"), _where)]
    assert seq == [("", ["p#0/L1"]), (FOREIGN, ["p#0/L2"]), ("", ["p#0/L3", "p#1/L1"]), (FOREIGN, ["p#1/L2"]), ("", ["p#1/L3"])]


class FakeClient:
    """Answers RunLanes with one LaneDone per lane (or waits for a Cancel when `hold` is set), then RunFinished."""

    made: list[FakeClient] = []

    def __init__(self, on_event=None, queue_events=True, python=None) -> None:
        self.on_event, self.python = on_event, python
        self.sent: list = []
        self.hold = threading.Event() if python else None
        self.alive, self.died, self.ready, self.proc, self.pid = False, None, None, None, 100 + len(FakeClient.made)
        FakeClient.made.append(self)

    def start(self, timeout=120.0):
        self.alive = True
        self.ready = WorkerReady(self.pid, 0.1, "none", f"fake {self.python}")
        self.on_event(self.ready)
        return self.ready

    def send(self, cmd) -> None:
        self.sent.append(cmd)
        if isinstance(cmd, RunLanes):
            threading.Thread(target=self._serve, args=(cmd,), daemon=True).start()
        elif isinstance(cmd, Cancel) and self.hold is not None:
            self.hold.set()

    def _serve(self, cmd: RunLanes) -> None:
        cancelled = False
        if self.hold is not None and wait_for_cancel.is_set():
            cancelled = self.hold.wait(5)
        for s in cmd.lanes:
            self.on_event(LaneDone(s.lane_id, None, cancelled=cancelled))
        self.on_event(RunFinished(cmd.run_id, cancelled=cancelled))

    def stop(self, timeout=5.0):
        self.alive = False

    def kill(self):
        self.alive = False


wait_for_cancel = threading.Event()


@pytest.fixture
def group(monkeypatch):
    FakeClient.made.clear()
    wait_for_cancel.clear()
    monkeypatch.setattr(group_mod, "lane_python", lambda setup: FOREIGN if setup.startswith("trtllm:") else None)
    g = WorkerGroup(client_factory=FakeClient)
    g.start()
    yield g
    g.stop()


def _until_finished(g: WorkerGroup, run_id: str) -> list:
    evs = []
    while True:
        ev = g.get(timeout=10)
        evs.append(ev)
        if isinstance(ev, RunFinished) and ev.run_id == run_id:
            return evs


def test_a_mixed_run_is_one_run_to_the_caller(group):
    group.send(_run("interleaved"))
    evs = _until_finished(group, "r")
    done = [e.lane_id for e in evs if isinstance(e, LaneDone)]
    assert done == ["p#0/L1", "p#0/L3", "p#0/L2", "p#1/L1", "p#1/L3", "p#1/L2"]
    assert [e for e in evs if isinstance(e, RunFinished)] == [RunFinished("r", cancelled=False)]  # sub-runs hidden
    own, foreign = FakeClient.made
    assert foreign.python == FOREIGN and [c.run_id for c in foreign.sent] == ["r~1", "r~3"]
    assert any("started" in getattr(e, "message", "") and FOREIGN in e.message for e in evs)  # the second worker is named


def test_an_own_environment_run_goes_through_unchanged(group):
    run = RunLanes("plain", "t", (LaneSpec("L1", "baseline", "p", "hi"), LaneSpec("L2", "ngram", "p", "hi")), Sampling(max_new_tokens=4))
    group.send(run)
    _until_finished(group, "plain")
    assert FakeClient.made[0].sent == [run] and len(FakeClient.made) == 1


def test_cancel_reaches_the_running_segment_and_skips_the_rest(group):
    wait_for_cancel.set()  # the foreign worker holds its segment until it is cancelled
    group.send(_run("sequential"))
    deadline = time.monotonic() + 10
    while (len(FakeClient.made) < 2 or not FakeClient.made[1].sent) and time.monotonic() < deadline:
        time.sleep(0.01)
    group.send(Cancel("r"))
    evs = _until_finished(group, "r")
    assert evs[-1] == RunFinished("r", cancelled=True)
    own, foreign = FakeClient.made
    assert Cancel("r~1", None) in foreign.sent
    assert [c.run_id for c in own.sent if isinstance(c, RunLanes)] == ["r~0"]  # nothing sent after the cancel
    assert not any(isinstance(e, RunError) for e in evs)


def test_heartbeats_are_heard_only_from_the_busy_worker(group):
    own = FakeClient.made[0]
    own.on_event(Heartbeat(1.0))
    assert group.get(timeout=1) == Heartbeat(1.0)
    group._active = FOREIGN  # a segment runs in the other environment
    own.on_event(Heartbeat(2.0))
    with pytest.raises(queue.Empty):
        group.get(timeout=0.2)
