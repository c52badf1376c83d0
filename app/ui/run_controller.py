"""The GUI's run controller: owns the worker bridge, the current :class:`RunPlan` and its :class:`RunResults`,
and fans every event out to the run sinks (lane views, plots, results, status bar) in one list.

    ctl = RunController(sinks=[lanes, plots, results, status])
    ctl.start(RunPlan(target, setups, prompts, sampling, warmup_tokens=4))   # warm-up, then the recorded run
    ctl.stop()                                                               # both runs cancelled
"""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QObject, Signal

from app.core.events import RunError
from app.ui.bridge import WorkerBridge
from app.ui.sinks import RunSink
from app.worker.client import WorkerClient
from app.worker.messages import RunFinished, WorkerDied, WorkerReady
from app.worker.plan import RunPlan, RunResults

__all__ = ["RunController"]


class RunController(QObject):
    """Starts and stops runs and routes the worker's events.

    Signals:
        runStarted(str): run id, after the commands were handed to the bridge and the sinks started.
        runEnded(str): run id, after every lane ended (done, cancelled, failed) and the sinks finished.
        workerState(str, str): ("starting" | "ready" | "dead" | "died", a line for the status bar).

    Events of a run reach :attr:`results` first, then each sink's ``on_event``; events that arrive while no
    run is active (a cancelled run's stragglers) are dropped.
    """

    runStarted = Signal(str)
    runEnded = Signal(str)
    workerState = Signal(str, str)

    def __init__(self, parent: QObject | None = None, sinks: Iterable[RunSink] = (), client_factory=WorkerClient) -> None:
        super().__init__(parent)
        self.bridge = WorkerBridge(self, client_factory=client_factory)
        self.sinks: list[RunSink] = list(sinks)
        self.plan: RunPlan | None = None
        self.results: RunResults | None = None
        self.running = False
        self.worker_info = ""
        self.bridge.event.connect(self._on_event)
        self.bridge.state.connect(self._on_state)

    def subscribe(self, sink: RunSink) -> None:
        self.sinks.append(sink)

    # --- commands ----------------------------------------------------------------------------------
    def start(self, plan: RunPlan) -> str | None:
        """Start `plan` (its warm-up first when it has one); returns the run id, None while a run is active."""
        if self.running:
            return None
        self.plan, self.results = plan, RunResults(plan)
        self.running = True
        for s in self.sinks:
            s.start_run(plan, self.results)
        warm = plan.warmup_command()
        if warm is not None:
            self.bridge.run(warm)
        self.bridge.run(plan.command())
        self.runStarted.emit(plan.run_id)
        return plan.run_id

    def stop(self) -> None:
        """Cancel the current run and its warm-up (lanes stop within one step)."""
        if not self.running or self.plan is None:
            return
        self.bridge.cancel(self.plan.warmup_run_id)
        self.bridge.cancel(self.plan.run_id)

    # --- events ------------------------------------------------------------------------------------
    def _on_state(self, state: str) -> None:
        if state == "starting":
            self.workerState.emit("starting", "worker: starting…")
        elif state == "dead":
            self.workerState.emit("dead", "worker: stopped (Run restarts it)")

    def _on_event(self, ev: object, t: float) -> None:
        if isinstance(ev, WorkerReady):
            self.worker_info = f"worker pid {ev.pid} · {ev.device_info} · torch {ev.torch_version} · ready in {ev.startup_s:.1f} s"
            self.workerState.emit("ready", self.worker_info)
        elif isinstance(ev, WorkerDied):
            self.workerState.emit("died", "worker: died (Run restarts it)")
            if self.running:
                msg = f"{ev.message}. Results received so far are kept; press Run to restart the worker."
                self._deliver(RunError(None, msg, kind="WorkerDiedError"), t)
                self._finish(stopped=False)
            return
        elif isinstance(ev, RunFinished):
            if self.running and self.plan is not None and ev.run_id == self.plan.run_id:
                self._finish(stopped=ev.cancelled)
            return
        if self.running:
            self._deliver(ev, t)

    def _deliver(self, ev: object, t: float) -> None:
        assert self.results is not None
        self.results.on_event(ev)
        for s in self.sinks:
            s.on_event(ev, t)

    def _finish(self, stopped: bool) -> None:
        assert self.results is not None and self.plan is not None
        self.running = False
        self.results.mark_finished(stopped)
        for s in self.sinks:
            s.finish(self.results)
        self.runEnded.emit(self.plan.run_id)

    def shutdown(self) -> None:
        """Stop the worker (blocking briefly; the window is closing)."""
        self.bridge.shutdown()
