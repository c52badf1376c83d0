"""Synthetic StepEvents for GUI tests."""

from __future__ import annotations

#: the lanes of the fake_window fixture (tests/ui/conftest.py)
SETUPS = ("baseline", "ngram:n=3,k=8", "draft:tiny-draft,k=3")


def make_step(lane_id: str, step: int, drafted=(), accepted=0, target_id=7, kind=None, t_s=None, pieces=None, rejected=None):
    """A StepEvent with readable pieces: accepted 'a<step>.<i>', rejected 'r…', target 't…'."""
    from app.core.events import StepEvent

    drafted = tuple(drafted)
    k = len(drafted)
    emitted = (*drafted[:accepted], target_id) if target_id is not None else drafted[:accepted]
    if kind is None:
        kind = "baseline" if k == 0 else ("bonus" if accepted == k else "correction")
    if pieces is None:
        pieces = tuple(f"a{step}.{i} " for i in range(accepted)) + ((f"t{step} ",) if target_id is not None else ())
    if rejected is None:
        rejected = tuple(f"r{step}.{i} " for i in range(accepted, k))
    q = tuple(0.5 for _ in drafted) if k else None
    p = tuple(0.25 for _ in range(min(k, accepted + 1))) + ((0.75,) if target_id is not None else ())
    return StepEvent(
        lane_id=lane_id,
        step=step,
        drafted_ids=drafted,
        accepted_count=accepted,
        target_id=target_id,
        target_kind=kind,
        t_draft_s=0.001,
        t_verify_s=0.002,
        t_wall_s=0.003,
        emitted_ids=tuple(emitted),
        pieces=tuple(pieces),
        rejected_pieces=tuple(rejected),
        draft_probs=q,
        target_probs=p,
        t_s=0.003 * (step + 1) if t_s is None else t_s,
    )


def expected_runs(events, show_rejected=True):
    """(text, kind) runs a LaneView should show for these StepEvents."""
    from app.ui.lane_view import tokens_of_step
    from app.ui.theme import KINDS

    out = []
    for ev in events:
        for t in tokens_of_step(ev):
            kind = KINDS[t.kind]
            if (kind == "rejected" and not show_rejected) or not t.text:
                continue
            if out and out[-1][1] == kind:
                out[-1] = (out[-1][0] + t.text, kind)
            else:
                out.append((t.text, kind))
    return out


def make_stats(setup: str, output_ids, wall_s: float, drafted: int = 0, accepted: int = 0, prompt_id: str = "custom"):
    """LaneStats of a finished lane (one step per token unless drafted)."""
    from app.core.metrics import LaneStats

    ids = tuple(output_ids)
    steps = max(1, len(ids) - accepted)
    return LaneStats(setup, prompt_id, 0, len(ids), wall_s, wall_s / 10, wall_s / 10, steps, drafted, accepted, steps - 1 if drafted else 0,
                     0.0, wall_s / 2, ids, " ".join(map(str, ids)))


class FakeClient:
    """Stands in for WorkerClient in the bridge: starts at once (sending WorkerReady), records commands; tests
    feed events with `bridge.feed`."""

    instances: list = []

    def __init__(self, on_event=None, queue_events=False) -> None:
        self.on_event = on_event
        self.sent: list = []
        self.proc = None
        self._alive = False
        FakeClient.instances.append(self)

    @property
    def pid(self):
        return 4242 if self._alive else None

    @property
    def alive(self) -> bool:
        return self._alive

    def start(self, timeout: float = 120.0):
        from app.worker.messages import WorkerReady

        self._alive = True
        ready = WorkerReady(4242, 0.1, "none", "fake worker")
        self.on_event(ready)
        return ready

    def send(self, cmd) -> None:
        self.sent.append(cmd)

    def stop(self, timeout: float = 5.0):
        self._alive = False
        return 0

    def kill(self) -> None:
        self._alive = False
