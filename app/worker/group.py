"""Workers in several Python environments behind one client: SpecDeck's own worker, plus one per other
environment that a run's lanes need (an engine whose manifest names another interpreter, e.g. TensorRT-LLM:
app.engines.environments).

:class:`WorkerGroup` has :class:`app.worker.client.WorkerClient`'s interface (start, send, get, stop, kill,
pid, alive, ready, died, proc), so the CLI and the GUI's bridge use it unchanged. A run whose lanes all run in
SpecDeck's environment goes to its worker as it is. A run that mixes environments is cut into segments in the
run's order — within an interleaved or paced group, the lanes of one environment side by side, then the next
environment's — and a dispatcher thread sends them one after another, each to its worker (started on first
use), so two lanes never run at once on one machine. The caller sees one run: one RunFinished, cancels routed
to the segment that runs, and a dead or unstartable worker reported as errors of the lanes it held while the
other segments still run.

Heartbeats: only the worker running a segment (SpecDeck's worker when none runs) is heard, so a stopped
worker in another environment is noticed by the caller's silence check as it would be in SpecDeck's own.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import replace

from app.core.errors import SpecDeckError
from app.core.events import LaneDone, RunError
from app.worker.client import WorkerClient, call_sink
from app.worker.messages import Cancel, Heartbeat, LaneSpec, RunFinished, RunLanes, Shutdown, WorkerDied, WorkerReady

__all__ = ["WorkerGroup", "lane_python", "segments"]

_OWN = ""  # key of SpecDeck's own environment


def lane_python(setup: str) -> str | None:
    """The interpreter whose environment runs a lane of `setup` (None: SpecDeck's own).

    Raises:
        SpecDeckError: the setup string or its engine's manifest is bad, or the interpreter it names is missing.
    """
    from app.core.setups import parse_setup
    from app.engines.environments import worker_python
    from app.engines.registry import resolve

    parsed = parse_setup(setup)
    engine = parsed.lane_engine or parsed.target  # the lane's own engine, or the target it was moved to
    if engine is None:
        return None
    return worker_python(resolve(engine))


def segments(cmd: RunLanes, where: Callable[[LaneSpec], str]) -> list[tuple[str, RunLanes]]:
    """Cut a run into consecutive single-environment runs, keeping its order.

    Sequential mode: maximal stretches of lanes in one environment. Interleaved and paced modes: within each group (in
    order), the group's lanes of one environment together (in order of first appearance), so a group becomes one
    segment per environment; neighbouring segments of the same environment are merged.

    Returns:
        (environment key, RunLanes with run id `<run id>~<n>`) pairs.
    """
    ordered: list[LaneSpec] = []
    if cmd.mode != "sequential":
        groups: dict[str, list[LaneSpec]] = {}
        for spec in cmd.lanes:
            groups.setdefault(spec.group, []).append(spec)
        for lanes in groups.values():
            envs = list(dict.fromkeys(where(s) for s in lanes))
            ordered += [s for e in envs for s in lanes if where(s) == e]
    else:
        ordered = list(cmd.lanes)
    chunks: list[tuple[str, list[LaneSpec]]] = []
    for spec in ordered:
        env = where(spec)
        if chunks and chunks[-1][0] == env:
            chunks[-1][1].append(spec)
        else:
            chunks.append((env, [spec]))
    return [(env, replace(cmd, run_id=f"{cmd.run_id}~{i}", lanes=tuple(lanes))) for i, (env, lanes) in enumerate(chunks)]


class _Dispatch:
    """One mixed-environment run being sent segment by segment."""

    def __init__(self, cmd: RunLanes, parts: list[tuple[str, RunLanes]], errors: dict[str, str]) -> None:
        self.cmd = cmd
        self.parts = parts
        self.errors = errors  # lane id → why it cannot run (bad engine / interpreter), reported up front
        self.cancelled = False
        self.cancelled_lanes: set[str] = set()
        self.current: tuple[str, RunLanes] | None = None
        self.segment_done = threading.Event()
        self.ended: set[str] = set()  # lanes of the current segment that ended (LaneDone / RunError)


class WorkerGroup:
    """SpecDeck's worker plus, on demand, workers in other environments, behind WorkerClient's interface.

    Args:
        on_event, queue_events: as for WorkerClient (events of every worker arrive here, in one stream).
        client_factory: builds each worker's client (`python=None` for SpecDeck's own; tests pass fakes).
    """

    def __init__(self, on_event: Callable[[object], None] | None = None, queue_events: bool = True,
                 client_factory: Callable[..., WorkerClient] = WorkerClient) -> None:
        self.on_event = on_event
        self.queue_events = queue_events
        self.events: queue.Queue = queue.Queue()
        self._factory = client_factory
        self.primary = client_factory(on_event=self._listener(_OWN), queue_events=False)
        self.others: dict[str, WorkerClient] = {}
        self._lock = threading.Lock()
        self._active = _OWN  # whose heartbeats are heard
        self._runs: dict[str, _Dispatch] = {}
        self._threads: list[threading.Thread] = []

    # --- WorkerClient's interface ----------------------------------------------------------------
    @property
    def proc(self):
        return self.primary.proc

    @property
    def pid(self) -> int | None:
        return self.primary.pid

    @property
    def alive(self) -> bool:
        return self.primary.alive

    @property
    def ready(self) -> WorkerReady | None:
        return self.primary.ready

    @property
    def died(self) -> WorkerDied | None:
        return self.primary.died

    def start(self, timeout: float = 120.0) -> WorkerReady:
        """Start SpecDeck's worker (the others start when a run needs them). Raises WorkerDiedError."""
        if not self.primary.alive:
            self.events = queue.Queue()
        return self.primary.start(timeout)

    def get(self, timeout: float | None = None):
        return self.events.get(timeout=timeout)

    def send(self, cmd) -> None:
        """Send a command; a run that needs other environments is dispatched segment by segment."""
        if isinstance(cmd, RunLanes):
            self._send_run(cmd)
        elif isinstance(cmd, Cancel) and cmd.run_id in self._runs:
            self._cancel(self._runs[cmd.run_id], cmd.lane_id)
        elif isinstance(cmd, Shutdown):
            for c in self._clients():
                try:
                    c.send(cmd)
                except SpecDeckError:
                    pass
        else:
            self.primary.send(cmd)

    def stop(self, timeout: float = 5.0) -> int | None:
        for d in list(self._runs.values()):
            d.cancelled = True
            d.segment_done.set()
        for c in self.others.values():
            c.stop(timeout)
        return self.primary.stop(timeout)

    def kill(self) -> None:
        for c in self._clients():
            c.kill()

    def __enter__(self) -> WorkerGroup:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- events ----------------------------------------------------------------------------------
    def _clients(self) -> list[WorkerClient]:
        return [self.primary, *self.others.values()]

    def _listener(self, env: str) -> Callable[[object], None]:
        def on_event(ev) -> None:
            self._from(env, ev)

        return on_event

    def _deliver(self, ev) -> None:
        if self.queue_events and not isinstance(ev, WorkerReady):
            self.events.put(ev)
        call_sink(self.on_event, ev)

    def _from(self, env: str, ev) -> None:
        """Events of every worker (on its drain thread): segment bookkeeping, heartbeat filtering, forwarding."""
        if isinstance(ev, Heartbeat):
            if env == self._active:
                self._deliver(ev)
            return
        if isinstance(ev, WorkerReady) and env != _OWN:
            return  # the dispatcher says which worker started
        d = self._dispatch_of(ev)
        if d is not None:
            if isinstance(ev, RunFinished):
                d.segment_done.set()
                return
            if isinstance(ev, (LaneDone, RunError)) and ev.lane_id is not None:
                d.ended.add(ev.lane_id)
        if isinstance(ev, WorkerDied) and env != _OWN:
            with self._lock:
                for d in self._runs.values():
                    if d.current is not None and d.current[0] == env:
                        d.segment_done.set()  # the dispatcher reports the lanes it held
            return
        self._deliver(ev)

    def _dispatch_of(self, ev) -> _Dispatch | None:
        with self._lock:
            if isinstance(ev, RunFinished):
                return next((d for d in self._runs.values() if d.current and d.current[1].run_id == ev.run_id), None)
            lane = getattr(ev, "lane_id", None)
            if lane is None:
                return None
            return next((d for d in self._runs.values() if d.current and any(s.lane_id == lane for s in d.current[1].lanes)), None)

    # --- runs ------------------------------------------------------------------------------------
    def _send_run(self, cmd: RunLanes) -> None:
        homes: dict[str, str] = {}
        errors: dict[str, str] = {}
        for spec in cmd.lanes:
            if spec.setup not in homes:
                try:
                    homes[spec.setup] = lane_python(spec.setup) or _OWN
                except SpecDeckError as e:
                    homes[spec.setup] = _OWN
                    errors[spec.setup] = str(e)
        if not errors and all(h == _OWN for h in homes.values()):
            self.primary.send(cmd)  # the usual case: one worker, the run as it is
            return
        if not self.primary.alive:
            self.primary.send(cmd)  # raises WorkerDiedError, as WorkerClient.send would
        d = _Dispatch(cmd, segments(cmd, lambda s: homes[s.setup]), {s.lane_id: errors[s.setup] for s in cmd.lanes if s.setup in errors})
        with self._lock:
            self._runs[cmd.run_id] = d
        th = threading.Thread(target=self._run_segments, args=(d,), daemon=True, name=f"specdeck-dispatch-{cmd.run_id}")
        self._threads = [t for t in self._threads if t.is_alive()] + [th]
        th.start()

    def _client_for(self, env: str) -> WorkerClient:
        if env == _OWN:
            return self.primary
        c = self.others.get(env)
        if c is None or not c.alive:
            c = self._factory(on_event=self._listener(env), queue_events=False, python=env)
            self.others[env] = c
            self._active = _OWN  # starting can take long (importing the backend): its own time-out applies
            ready = c.start()
            from app.core.events import LogEvent

            self._deliver(LogEvent("info", f"worker pid {ready.pid} started in {ready.startup_s:.1f} s from {env} ({ready.device_info})"))
        return c

    def _run_segments(self, d: _Dispatch) -> None:
        try:
            for env, part in d.parts:
                if d.cancelled or not self.primary.alive:
                    break
                lanes = [s for s in part.lanes if s.lane_id not in d.errors and s.lane_id not in d.cancelled_lanes]
                for s in part.lanes:
                    if s.lane_id in d.errors:
                        self._deliver(RunError(s.lane_id, d.errors[s.lane_id], kind="EngineError"))
                if not lanes:
                    continue
                part = replace(part, lanes=tuple(lanes))
                try:
                    client = self._client_for(env)
                except SpecDeckError as e:
                    for s in lanes:
                        self._deliver(RunError(s.lane_id, str(e), kind="WorkerDiedError"))
                    continue
                with self._lock:
                    d.current, d.ended = (env, part), set()
                    d.segment_done.clear()
                self._active = env
                try:
                    client.send(part)
                except SpecDeckError as e:
                    self._lost(d, part, f"could not send to the worker for {env}: {e}")
                    continue
                while not d.segment_done.wait(0.5):
                    if not client.alive:
                        break
                if client is not self.primary and (client.died is not None or not client.alive):
                    why = client.died.message if client.died else "worker process is gone"
                    self._lost(d, part, f"the worker for {env} died: {why}")
        finally:
            self._active = _OWN
            with self._lock:
                d.current = None
                self._runs.pop(d.cmd.run_id, None)
            if self.primary.alive:
                self._deliver(RunFinished(d.cmd.run_id, cancelled=d.cancelled))

    def _lost(self, d: _Dispatch, part: RunLanes, why: str) -> None:
        for s in part.lanes:
            if s.lane_id not in d.ended:
                self._deliver(RunError(s.lane_id, why, kind="WorkerDiedError"))

    def _cancel(self, d: _Dispatch, lane_id: str | None) -> None:
        if lane_id is None:
            d.cancelled = True
        else:
            d.cancelled_lanes.add(lane_id)
        cur = d.current
        if cur is not None:
            env, part = cur
            client = self.primary if env == _OWN else self.others.get(env)
            if client is not None and client.alive:
                try:
                    client.send(Cancel(part.run_id, lane_id))
                except SpecDeckError:
                    pass
