"""What every command that runs lanes or loads engines does with its worker: start it, send a command, wait for its
events with progress on stderr, and notice a silent worker. `bench` and `profile` use it; the GUI has its own
asynchronous bridge (app.ui.bridge). Saving reports: app.core.report.write_json.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from app.commands.progress import ProgressBars
from app.core.errors import SpecDeckError, WorkerDiedError

__all__ = ["WorkerRun", "Stuck", "silence_s", "stop_signals"]


class Stuck(SpecDeckError):
    """Nothing at all, not even a heartbeat, came from the worker for the silence limit: stopped (SIGSTOP) or hung."""


def silence_s() -> float:
    """How long a worker may say nothing at all before it counts as stuck ($SPECDECK_WORKER_SILENCE_S, default 30)."""
    return float(os.environ.get("SPECDECK_WORKER_SILENCE_S", "30"))


class WorkerRun:
    """One command's conversation with its worker(s) (a WorkerGroup: one worker per Python environment).

    Args:
        quiet: no progress and no info lines on stderr.
        client: the worker client (default: a new WorkerGroup).
    """

    def __init__(self, quiet: bool = False, client: Any = None, tap: Callable[[Any, float], None] | None = None) -> None:
        if client is None:
            from app.worker.group import WorkerGroup

            client = WorkerGroup()
        self.client = client
        self.quiet = quiet
        self.bar = ProgressBars(quiet)
        self.silence_s = silence_s()
        self.tap = tap  # sees every event received, with its monotonic receive time (bench --record)
        self.ready: Any = None  # the worker's WorkerReady, once started
        # Set by a stop signal (stop_signals). Checked while waiting for the worker, so a stop still stops the command when
        # its KeyboardInterrupt landed where Python swallows exceptions (a __del__, a weakref callback: "Exception ignored").
        self.stop_requested = threading.Event()
        self.stop_signal: int | None = None  # the signal that asked (SIGINT, SIGTERM)

    def stopped_by(self) -> str:
        """Who stopped the command, for its message: "Ctrl-C" (SIGINT, or no handler of ours saw it) or the signal's name."""
        return "Ctrl-C" if self.stop_signal in (None, signal.SIGINT) else signal.Signals(self.stop_signal).name

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr)

    def show(self, ev: Any) -> None:
        """Progress events become progress lines/bars; the worker's info, warning and error logs become lines."""
        from app.core.events import LogEvent, Progress

        if isinstance(ev, Progress):
            self.bar(ev.task, ev.done, ev.total, ev.unit)
        elif isinstance(ev, LogEvent) and ev.level in ("info", "warning", "error"):
            self.say(f"{'' if ev.level == 'info' else ev.level + ': '}{ev.message}")

    def _next(self, doing: str) -> Any:
        """The worker's next event. Raises KeyboardInterrupt once a stop was requested, Stuck after the silence limit."""
        deadline = time.monotonic() + self.silence_s
        while True:
            if self.stop_requested.is_set():
                raise KeyboardInterrupt
            try:
                ev = self.client.get(timeout=max(0.0, min(0.25, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() < deadline:
                    continue
                raise Stuck(f"the worker (pid {self.client.pid}) sent nothing, not even a heartbeat, for {self.silence_s:.0f} s{doing}",
                            fix="it was stopped (kill -STOP?) or is hung; rerun on a quiet machine, or raise SPECDECK_WORKER_SILENCE_S") from None
            if self.tap is not None:
                self.tap(ev, time.monotonic())
            return ev

    def load(self, cmd: Any) -> tuple[Any, list]:
        """Start the worker, send a LoadEngines and wait for its EnginesLoaded, showing progress.

        Returns:
            (the EnginesLoaded, the cost profiles the worker sent meanwhile (ProfileReady)).
        Raises:
            SpecDeckError: a load error (the worker's message); WorkerDiedError; Stuck.
        """
        from app.core.events import ProfileReady, RunError
        from app.worker.messages import EnginesLoaded, WorkerDied

        ready = self.client.start()
        self.ready = ready
        self.say(f"worker pid {ready.pid} ready in {ready.startup_s:.1f} s ({ready.device_info}, torch {ready.torch_version})")
        self.client.send(cmd)
        profiles: list = []
        while True:
            ev = self._next(" while loading")
            self.show(ev)
            if isinstance(ev, ProfileReady):
                profiles.append(ev.profile)
            elif isinstance(ev, EnginesLoaded):
                break
            elif isinstance(ev, RunError):
                raise SpecDeckError(ev.message)
            elif isinstance(ev, WorkerDied):
                raise WorkerDiedError(ev.message, fix="rerun the command")
        for e in dict.fromkeys(ev.engines):
            self.say(f"loaded {e.name} on {e.device} ({e.dtype}) in {e.load_s:.1f} s")
        return ev, profiles

    def run(self, cmd: Any, on_event: Callable[[Any], None]) -> None:
        """Send a run command and feed its events (progress shown first) to `on_event` until its RunFinished.

        Raises:
            WorkerDiedError: the worker died (everything received before stays with the caller).
            Stuck: silence for the silence limit.
        """
        from app.worker.messages import RunFinished, WorkerDied

        self.client.send(cmd)
        while True:
            ev = self._next("")
            self.show(ev)
            on_event(ev)
            if isinstance(ev, WorkerDied):
                raise WorkerDiedError(f"{ev.message} (exit code {ev.exitcode})",
                                      fix="rerun the command; if it was out of memory, use a smaller model or fewer tokens")
            if isinstance(ev, RunFinished) and ev.run_id == cmd.run_id:
                return

    def close(self, kill: bool = False) -> None:
        """End the progress bars and the worker (`kill`: at once, for a stuck worker)."""
        self.bar.close()
        if kill:
            self.client.kill()
        self.client.stop()


@contextmanager
def stop_signals(run: WorkerRun, *signums: int) -> Iterator[None]:
    """While inside, each of `signums` (SIGINT, SIGTERM) stops the command: KeyboardInterrupt is raised where the main
    thread is, `run.stop_signal` names the signal, and `run.stop_requested` is set so that the next wait for the worker
    raises it again should Python have swallowed the first. The previous handlers come back on leaving."""

    def handler(signum, frame):
        run.stop_signal = signum
        run.stop_requested.set()
        raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
