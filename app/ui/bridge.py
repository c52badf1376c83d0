"""Thin Qt bridge over :class:`app.worker.group.WorkerGroup` (WorkerClient's interface).

The client's draining thread hands every event to :meth:`WorkerBridge._on_event`, which stamps it with the
receipt time (``time.monotonic()``) and appends it to a lock-free deque; one queued wake-up call per burst
brings the GUI thread to :meth:`WorkerBridge._pump`, which re-emits each event as Qt signals. While a run is
going the run controller sets :attr:`WorkerBridge.batching`: the many-a-second events (steps, progress,
heartbeats) then wake nobody and wait for the controller's next display frame (:meth:`WorkerBridge.pump`), so the
GUI thread wakes a few times a second rather than once per step (each wake-up takes a core from the lanes). The
GUI never blocks on the worker: the worker starts on a plain thread ("starting worker…"), commands are sent once it is
ready, and a dead worker is restarted by the next :meth:`run`. Events the bridge makes itself (a run that could
not be sent, a worker that did not start) take the same path as the worker's.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.core.events import Progress, RunError, StepEvent
from app.worker.group import WorkerGroup
from app.worker.messages import Cancel, Heartbeat, RunFinished, RunLanes, WorkerDied, WorkerReady

__all__ = ["WorkerBridge"]


class WorkerBridge(QObject):
    """Owns one WorkerGroup (SpecDeck's worker, plus workers in other environments when a run needs them);
    emits worker events as Qt signals on the GUI thread.

    Signals:
        event(object, float): every event (app.core.events and the worker messages) and its receipt time on
            the monotonic clock (seconds).
        state(str): "starting" | "ready" | "dead".
    """

    event = Signal(object, float)
    state = Signal(str)

    _wake = Signal()

    #: events that come many times a second: while `batching`, they wait for the next :meth:`pump`
    BATCHED = (StepEvent, Progress, Heartbeat)

    def __init__(self, parent: QObject | None = None, client_factory=WorkerGroup) -> None:
        super().__init__(parent)
        self._client_factory = client_factory
        self.client: WorkerGroup | None = None
        self._inbox: deque = deque()
        self._wake_pending = threading.Event()
        self._starting = False
        self._pending: list = []  # commands waiting for the worker to be ready
        self._closed = False
        self.slice_s = 0.012  # longest stretch of event dispatch per event-loop turn
        self.batching = False  # a run is going: BATCHED events wait for pump() (the controller's frames)
        self.ready_info: WorkerReady | None = None
        self._wake.connect(self._pump, Qt.ConnectionType.QueuedConnection)

    # --- properties ------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        c = self.client
        return c.pid if c is not None and c.alive else None

    @property
    def alive(self) -> bool:
        return self.client is not None and self.client.alive

    @property
    def starting(self) -> bool:
        """The worker is being started (commands wait for it)."""
        return self._starting

    # --- commands --------------------------------------------------------------------------------
    def ensure_started(self) -> None:
        """Start the worker in the background unless it runs or is starting."""
        if self._closed or self._starting or self.alive:
            return
        self._starting = True
        self.state.emit("starting")
        client = self._client_factory(on_event=self._on_event, queue_events=False)
        self.client = client
        threading.Thread(target=self._start, args=(client,), daemon=True, name="specdeck-worker-start").start()

    def _start(self, client: WorkerGroup) -> None:
        try:
            client.start()
        except Exception as e:  # WorkerDiedError: the client already delivered WorkerDied; say why anyway
            self._post(("start-failed", str(e)))
        else:
            self._post(("started", None))

    def run(self, cmd: RunLanes) -> None:
        """Send a run now or as soon as the worker is ready (starting it when needed)."""
        if self.alive and not self._starting:
            self._send(cmd)
            return
        self._pending.append(cmd)
        self.ensure_started()

    def cancel(self, run_id: str, lane_id: str | None = None) -> None:
        """Cancel a run (or one lane); a run still waiting for the worker is dropped at once."""
        before = len(self._pending)
        self._pending = [c for c in self._pending if not (isinstance(c, RunLanes) and c.run_id == run_id and lane_id is None)]
        if len(self._pending) != before:
            self.feed(RunFinished(run_id, cancelled=True))
            return
        if self.alive:
            self._send(Cancel(run_id, lane_id))

    def _send(self, cmd) -> None:
        try:
            assert self.client is not None
            self.client.send(cmd)
        except Exception as e:
            if isinstance(cmd, RunLanes):
                self.feed(RunError(None, f"could not send the run to the worker: {e}", kind="WorkerDiedError"))
                self.feed(RunFinished(cmd.run_id, cancelled=False))

    def shutdown(self, timeout: float = 3.0) -> None:
        """Stop the worker (blocking up to `timeout` s); used when the window closes."""
        self._closed = True
        c = self.client
        if c is not None and c.proc is not None:
            try:
                c.stop(timeout=timeout)
            except Exception:
                c.kill()

    def kill(self) -> None:
        """Kill the worker at once (force stop; tests)."""
        if self.client is not None:
            self.client.kill()

    # --- event path ------------------------------------------------------------------------------
    def _on_event(self, ev) -> None:
        """Draining thread: stamp, queue, wake the GUI thread once per burst."""
        self._post(ev)

    def _post(self, item) -> None:
        self._inbox.append((item, time.monotonic()))
        if self.batching and isinstance(item, self.BATCHED):
            return  # the next frame's pump() takes it
        if not self._wake_pending.is_set():
            self._wake_pending.set()
            try:
                self._wake.emit()
            except RuntimeError:  # the QObject is gone (application shutting down)
                pass

    def feed(self, ev, t_recv: float | None = None) -> None:
        """Inject an event as if the worker had sent it (tests, replays); GUI thread only."""
        self._dispatch(ev, time.monotonic() if t_recv is None else t_recv)

    def pump(self) -> None:
        """GUI thread: dispatch the events waiting now (a display frame while batching)."""
        if self._inbox:
            self._pump()

    def set_batching(self, on: bool) -> None:
        """GUI thread: batch BATCHED events into frames (a run starts) or not (it ended: what waits goes out now)."""
        self.batching = on
        if not on:
            self.pump()

    @Slot()
    def _pump(self) -> None:
        self._wake_pending.clear()
        # time-sliced: a burst of thousands of events must not hold the event loop (repaints, input)
        deadline = time.monotonic() + self.slice_s
        while self._inbox:
            item, t = self._inbox.popleft()
            self._dispatch(item, t)
            if time.monotonic() > deadline and self._inbox:
                if not self._wake_pending.is_set():
                    self._wake_pending.set()
                    self._wake.emit()
                break

    def _dispatch(self, ev, t: float) -> None:
        if isinstance(ev, tuple):  # internal notices from the start thread
            what, msg = ev
            self._starting = False
            if what == "started" and self.alive:
                self.state.emit("ready")
                pending, self._pending = self._pending, []
                for cmd in pending:
                    self._send(cmd)
            else:
                pending, self._pending = self._pending, []
                self.state.emit("dead")
                for cmd in pending:
                    if isinstance(cmd, RunLanes):
                        self.feed(RunError(None, f"the worker did not start: {msg}", kind="WorkerDiedError"))
                        self.feed(RunFinished(cmd.run_id, cancelled=False))
            return
        if isinstance(ev, WorkerReady):
            self.ready_info = ev
        elif isinstance(ev, WorkerDied) and not self._starting:
            self.state.emit("dead")
        self.event.emit(ev, t)
