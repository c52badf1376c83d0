"""The GUI's run controller: owns the worker bridge, the current :class:`RunPlan` and its :class:`RunResults`,
and fans every event out to the run sinks (lane views, plots, results, status bar) in one list.

    ctl = RunController(sinks=[lanes, plots, results, status])
    ctl.start(RunPlan(target, setups, prompts, sampling, warmup_tokens=4))   # warm-up, then the recorded run
    ctl.stop()                                                               # both runs cancelled

While a run is going the controller paints in frames: a timer (:func:`frame_ms`: 20 a second, 4 on a machine with
few cores, where the window shares the lanes' cores) delivers the steps that arrived since the last frame (the
bridge batches them instead of waking the GUI thread per step), then calls each sink's optional ``on_frame()``
(the lane text is drawn there). Ends, errors and the worker's state still go out at once.

Every run is recorded as it goes (:attr:`RunController.recorder`, an :class:`app.worker.runfile.RunRecorder`: the
events the sinks got, with their receive times), and :meth:`RunController.replay` plays a recorded run back through
the same sinks — at its recorded pace, faster, or at once — with no worker: a replayed run folds into the same
:class:`RunResults` and draws the same lanes, plots and tables as the live one did. While a replay runs,
:attr:`RunController.clock` is its clock (recorded seconds, mapped onto the monotonic clock of its start), which
sinks with a ``clock`` attribute (the plots) read instead of ``time.monotonic``.

While a run is going, the worker sends at least a Heartbeat every second (from a thread of its own, even during a
long forward or load). When nothing at all arrives for :data:`SILENT_S` seconds, the controller tells the sinks
(a :class:`WorkerSilence` event) and :meth:`RunController.stop` kills the worker instead of asking it to cancel.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from PySide6.QtCore import QObject, QTimer, Signal

from app.core.events import RunError
from app.ui.bridge import WorkerBridge
from app.ui.load import few_cores
from app.ui.sinks import RunSink, WorkerSilence
from app.worker.group import WorkerGroup
from app.worker.messages import Heartbeat, RunFinished, WorkerDied, WorkerReady
from app.worker.plan import RunPlan, RunResults
from app.worker.runfile import RunRecord, RunRecorder, register

register(WorkerSilence)  # a display's own notice, recorded with the worker's events

__all__ = ["RunController", "WorkerSilence", "SILENT_S", "FRAME_MS", "FEW_CORES_FRAME_MS", "frame_ms", "REPLAY_SPEEDS"]

#: replay speeds the window offers (0: at once, the run as it finished)
REPLAY_SPEEDS = (1.0, 2.0, 4.0, 0.0)

#: seconds without any event from a running worker (heartbeats included) before it is called silent
SILENT_S = 20.0
#: a display frame during a run (steps delivered, lane text drawn): 20 a second…
FRAME_MS = 50
#: …and 4 a second on a machine with at most FEW_CORES cores, where every frame's drawing is taken from the lanes'
#: cores, so out of their tokens/s (what each rate cost: resources/bench/README.md, "The window's own CPU")
FEW_CORES_FRAME_MS = 250


def frame_ms(cores: int | None = None) -> int:
    """Milliseconds between display frames during a run on a machine with `cores` cores (default: this one's)."""
    return FEW_CORES_FRAME_MS if few_cores(cores) else FRAME_MS


class RunController(QObject):
    """Starts and stops runs and routes the worker's events.

    Signals:
        runStarted(str): run id, after the commands were handed to the bridge and the sinks started.
        runEnded(str): run id, after every lane ended (done, cancelled, failed) and the sinks finished.
        workerState(str, str): ("starting" | "ready" | "dead" | "died", a line for the status bar).
        replaySample(float, dict): a replay reached a recorded telemetry sample: (its time on :attr:`clock`'s scale,
            the sample as saved); the window hands it to the plots.

    Events of a run reach :attr:`results` first, then each sink's ``on_event``; events that arrive while no
    run is active (a cancelled run's stragglers) are dropped.
    """

    runStarted = Signal(str)
    runEnded = Signal(str)
    workerState = Signal(str, str)
    replaySample = Signal(float, dict)

    def __init__(self, parent: QObject | None = None, sinks: Iterable[RunSink] = (), client_factory=WorkerGroup,
                 silent_s: float = SILENT_S) -> None:
        super().__init__(parent)
        self.bridge = WorkerBridge(self, client_factory=client_factory)
        self.sinks: list[RunSink] = list(sinks)
        self.plan: RunPlan | None = None
        self.results: RunResults | None = None
        self.running = False
        self.worker_info = ""
        self.silent_s = silent_s
        self.last_heard = time.monotonic()  # last event from the worker (or the run's start / the worker's readiness)
        self.silent = False  # a WorkerSilence notice is out
        self._killing = False  # Stop killed a silent worker; its WorkerDied ends the run
        self._killed_after = 0.0  # how long it had been silent then
        self.watchdog = QTimer(self)
        self.watchdog.setInterval(1000)
        self.watchdog.timeout.connect(self._check_silence)
        self.frame = QTimer(self)
        self.frame.setInterval(frame_ms())
        self.frame.timeout.connect(self._frame)
        self.bridge.event.connect(self._on_event)
        self.bridge.state.connect(self._on_state)
        self.machine: dict | None = None  # what recordings say they ran on (None: app.worker.runfile.machine_info())
        self.recorder: RunRecorder | None = None  # the current or last live run, as recorded
        self.replaying: RunRecord | None = None  # the record being replayed (None: a live run, or none)
        self.replay_speed = 0.0
        self._replay_base = 0.0  # monotonic time the replay started
        self._replay_next = 0  # the next event to deliver
        self._replay_next_sample = 0
        self.replay_timer = QTimer(self)
        self.replay_timer.setInterval(FRAME_MS)
        self.replay_timer.timeout.connect(self._replay_tick)

    # --- clock ---------------------------------------------------------------------------------------
    def clock(self) -> float:
        """Now, on the run's clock: ``time.monotonic()``, or during a replay the recorded time reached, mapped onto
        the monotonic clock of the replay's start."""
        if self.replaying is None:
            return time.monotonic()
        if self.replay_speed <= 0:
            return self._replay_base + self.replaying.duration_s
        return self._replay_base + min(self.replaying.duration_s, (time.monotonic() - self._replay_base) * self.replay_speed)

    # --- commands ----------------------------------------------------------------------------------
    def start(self, plan: RunPlan) -> str | None:
        """Start `plan` (its warm-up first when it has one); returns the run id, None while a run is active."""
        if self.running:
            return None
        self.replaying = None
        self.plan, self.results = plan, RunResults(plan)
        self.running = True
        self.silent = self._killing = False
        self.last_heard = time.monotonic()
        self.recorder = RunRecorder(plan, self.machine, t0=self.last_heard)
        self.watchdog.start(int(1000 * min(1.0, self.silent_s / 4)))
        self._start_sinks(plan)
        self.bridge.set_batching(True)
        self.frame.start()
        warm = plan.warmup_command()
        if warm is not None:
            self.bridge.run(warm)
        self.bridge.run(plan.command())
        self.runStarted.emit(plan.run_id)
        return plan.run_id

    def _start_sinks(self, plan: RunPlan) -> None:
        assert self.results is not None
        for s in self.sinks:
            if hasattr(s, "clock"):
                s.clock = self.clock
            s.start_run(plan, self.results)

    def replay(self, record: RunRecord, speed: float = 0.0) -> str | None:
        """Play `record` through the sinks: at `speed` times its recorded pace, or at once (`speed` 0: the run as it
        finished); no worker is involved. Returns the run id (None while a run is active). Stop ends it where it is."""
        if self.running:
            return None
        self.replaying, self.replay_speed = record, max(0.0, float(speed))
        self.plan, self.results = record.plan, RunResults(record.plan)
        self.running = True
        self._replay_base = time.monotonic()
        self._replay_next = self._replay_next_sample = 0
        self._start_sinks(record.plan)
        self.runStarted.emit(record.plan.run_id)
        if self.replay_speed <= 0:
            self._replay_tick()
        else:
            self.replay_timer.start()
        return record.plan.run_id

    def _replay_tick(self) -> None:
        """Deliver what the replay's clock has reached: events (stamped with their place on that clock) and telemetry
        samples; then the sinks draw; at the record's end the run finishes as it did."""
        rec = self.replaying
        if rec is None or not self.running:
            self.replay_timer.stop()
            return
        base = self._replay_base
        reached = math.inf if self.replay_speed <= 0 else (time.monotonic() - base) * self.replay_speed
        while self._replay_next_sample < len(rec.telemetry) and rec.telemetry[self._replay_next_sample][0] <= reached:
            t, sample = rec.telemetry[self._replay_next_sample]
            self.replaySample.emit(base + t, sample)
            self._replay_next_sample += 1
        while self._replay_next < len(rec.events) and rec.events[self._replay_next][0] <= reached:
            t, ev = rec.events[self._replay_next]
            self._replay_next += 1
            self._deliver(ev, base + t)
        for s in self.sinks:
            f = getattr(s, "on_frame", None)
            if f is not None:
                f()
        if self._replay_next >= len(rec.events) and reached >= rec.duration_s:
            self.replay_timer.stop()
            self._finish(stopped=rec.stopped)

    def stop(self) -> None:
        """Cancel the current run and its warm-up (lanes stop within one step); a silent worker (see
        :class:`WorkerSilence`) is killed instead, and the run ends when its death is seen. A replay ends where it
        is."""
        if not self.running or self.plan is None:
            return
        if self.replaying is not None:
            self.replay_timer.stop()
            self._finish(stopped=True)
            return
        if self.silent and self.bridge.alive:
            self._killing = True
            self._killed_after = time.monotonic() - self.last_heard
            self.bridge.kill()
            QTimer.singleShot(5000, self._killed_without_news)
            return
        self.bridge.cancel(self.plan.warmup_run_id)
        self.bridge.cancel(self.plan.run_id)

    def _killed_without_news(self) -> None:
        """The killed worker's death was not reported within 5 s: end the run anyway."""
        if self.running and self._killing:
            self._deliver(RunError(None, self._killed_message(), kind="WorkerDiedError"), time.monotonic())
            self._finish(stopped=True)

    def _killed_message(self) -> str:
        return (f"the worker did not answer for {self._killed_after:.0f} s and Stop killed it. "
                "Results received so far are kept; press Run to restart the worker.")

    # --- silence -----------------------------------------------------------------------------------
    def _check_silence(self) -> None:
        """Watchdog tick (1 s): a worker that is up but has sent nothing for `silent_s` is reported once."""
        if not self.running:
            self.watchdog.stop()
            return
        if not self.bridge.alive or self.bridge.starting:
            self.last_heard = time.monotonic()  # starting (the client's own time-out applies) or dead (reported)
            return
        quiet = time.monotonic() - self.last_heard
        if quiet >= self.silent_s and not self.silent:
            self.silent = True
            self._deliver(WorkerSilence(quiet), time.monotonic())

    # --- events ------------------------------------------------------------------------------------
    def _on_state(self, state: str) -> None:
        self.last_heard = time.monotonic()
        if state == "starting":
            self.workerState.emit("starting", "worker: starting…")
        elif state == "dead":
            self.workerState.emit("dead", "worker: stopped (Run restarts it)")

    def _on_event(self, ev: object, t: float) -> None:
        self.last_heard = time.monotonic()
        if self.silent and self.running and not self._killing:
            self.silent = False
            self._deliver(WorkerSilence(0.0), t)
        if isinstance(ev, Heartbeat):
            return  # liveness only: the sinks need not see one a second
        if self.replaying is not None and not isinstance(ev, WorkerReady | WorkerDied):
            return  # a replay owns the sinks: a previous run's stragglers are dropped
        if isinstance(ev, WorkerReady):
            self.worker_info = f"worker pid {ev.pid} · {ev.device_info} · torch {ev.torch_version} · ready in {ev.startup_s:.1f} s"
            self.workerState.emit("ready", self.worker_info)
        elif isinstance(ev, WorkerDied):
            self.workerState.emit("died", "worker: died (Run restarts it)")
            if self.running and self.replaying is None:
                killed = self._killing
                msg = self._killed_message() if killed else f"{ev.message}. Results received so far are kept; press Run to restart the worker."
                self._deliver(RunError(None, msg, kind="WorkerDiedError"), t)
                self._finish(stopped=killed)
            return
        elif isinstance(ev, RunFinished):
            if self.running and self.plan is not None and ev.run_id == self.plan.run_id:
                self._finish(stopped=ev.cancelled)
            return
        if self.running and self.replaying is None:
            self._deliver(ev, t)

    def _deliver(self, ev: object, t: float) -> None:
        assert self.results is not None
        self.results.on_event(ev)
        if self.recorder is not None and self.replaying is None:
            self.recorder.event(ev, t)
        for s in self.sinks:
            s.on_event(ev, t)

    def _frame(self) -> None:
        """Display frame: deliver the steps that arrived since the last one, then let the sinks draw."""
        self.bridge.pump()
        if not self.running:
            return
        for s in self.sinks:
            f = getattr(s, "on_frame", None)
            if f is not None:
                f()

    def _finish(self, stopped: bool) -> None:
        assert self.results is not None and self.plan is not None
        self.running = False
        self.frame.stop()
        self.bridge.set_batching(False)
        self.watchdog.stop()
        self.silent = self._killing = False
        self.results.mark_finished(stopped)
        for s in self.sinks:
            s.finish(self.results)
        self.runEnded.emit(self.plan.run_id)

    def shutdown(self) -> None:
        """Stop the worker (blocking briefly; the window is closing)."""
        self.bridge.shutdown()
