"""Client of the worker process, used by the CLI directly and by the GUI through a thin Qt bridge. No Qt.

Events arrive on a draining thread (event-driven: it blocks in `multiprocessing.connection.wait` on the
event pipe and the process sentinel), which puts them on a queue and calls `on_event` when given.
If the worker dies, one `WorkerDied` event names the exit code or signal within milliseconds; everything
received before it stays received, and `start()` can bring up a new worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

from app.core.errors import WorkerDiedError
from app.worker.messages import Command, Shutdown, WorkerDied, WorkerReady

__all__ = ["WorkerClient", "describe_exit"]


def describe_exit(exitcode: int | None) -> str:
    """Human words for a worker's exit code (negative = killed by a signal)."""
    if exitcode is None:
        return "worker process is gone (exit status unknown)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        cause = {
            "SIGKILL": "killed from outside or by the out-of-memory killer",
            "SIGSEGV": "a crash in a native library",
            "SIGABRT": "a native library aborted",
            "SIGTERM": "terminated",
        }.get(name, "killed by a signal")
        return f"worker process died: {name} ({cause})"
    if exitcode == 3:
        return "worker process exited because its parent went away"
    return f"worker process exited with code {exitcode}"


class WorkerClient:
    """Start, feed, drain and stop a worker process.

    Args:
        on_event: called on the draining thread with each event (the Qt bridge re-emits it as a signal).
        queue_events: also put events on `events` for blocking readers (`get`); a sink that only uses
            `on_event` passes False so nothing accumulates (start-up events are queued regardless).
    """

    def __init__(self, on_event: Callable[[object], None] | None = None, queue_events: bool = True) -> None:
        self.on_event = on_event
        self.queue_events = queue_events
        self.events: queue.Queue = queue.Queue()
        self.proc: mp.process.BaseProcess | None = None
        self._cmd: Connection | None = None  # commands to the worker
        self._evt: Connection | None = None  # events from the worker (read by the drain thread)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.ready: WorkerReady | None = None
        self.died: WorkerDied | None = None

    # --- lifecycle -------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive() and self.died is None

    def start(self, timeout: float = 120.0) -> WorkerReady:
        """Spawn the worker and wait for WorkerReady.

        Raises:
            WorkerDiedError: the worker exited or did not answer within `timeout`.
        """
        if self.alive:
            assert self.ready is not None
            return self.ready
        ctx = mp.get_context("spawn")
        cmd_r, cmd_w = ctx.Pipe(duplex=False)
        evt_r, evt_w = ctx.Pipe(duplex=False)
        from app.worker import entry

        self.proc = ctx.Process(target=entry.main, args=(cmd_r, evt_w, os.getpid(), time.time()), name="specdeck-worker", daemon=True)
        self.died = None
        self.ready = None
        self._stopping = False
        self.events = queue.Queue()
        self.proc.start()
        cmd_r.close()
        evt_w.close()
        self._cmd, self._evt = cmd_w, evt_r
        self._thread = threading.Thread(target=self._drain, args=(evt_r, self.proc), daemon=True, name="specdeck-drain")
        self._thread.start()
        deadline = time.monotonic() + timeout
        held = []
        try:
            while True:
                ev = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
                if isinstance(ev, WorkerReady):
                    self.ready = ev
                    return ev
                if isinstance(ev, WorkerDied):
                    raise WorkerDiedError(ev.message, fix="see the log above; run again to restart the worker")
                held.append(ev)
        except queue.Empty:
            self.kill()
            raise WorkerDiedError(f"worker did not start within {timeout:.0f} s", fix="check that `python -m app engines` works") from None
        finally:
            for ev in held:
                self.events.put(ev)

    def _drain(self, conn, proc) -> None:
        while True:
            ready = wait([conn, proc.sentinel])
            if conn in ready:
                try:
                    ev = conn.recv()
                except (EOFError, OSError):
                    ev = None
                if ev is not None:
                    self._deliver(ev)
                    continue
            # the pipe closed or the process ended: deliver what is left, then say how it ended
            try:
                while conn.poll():
                    self._deliver(conn.recv())
            except (EOFError, OSError):
                pass
            proc.join(timeout=2.0)
            code = proc.exitcode
            # Another thread polling the process at the same moment (send() checks is_alive) can win the waitpid;
            # its Popen then records the status a moment later, while ours saw None. Wait for it briefly.
            until = time.monotonic() + 2.0
            while code is None and time.monotonic() < until:
                time.sleep(0.02)
                code = proc.exitcode
            if not self._stopping:
                self.died = WorkerDied(code, describe_exit(code))
                self._deliver(self.died)
            return

    def _deliver(self, ev) -> None:
        if self.queue_events or self.ready is None:
            self.events.put(ev)
        if self.on_event is not None:
            try:
                self.on_event(ev)
            except Exception:  # a display sink must not kill the drain
                import traceback

                traceback.print_exc()

    def send(self, cmd: Command) -> None:
        """Send a command. Raises WorkerDiedError (saying how the worker ended) when it is not running."""
        if self.proc is not None and not self.proc.is_alive() and self.died is None and self._thread is not None:
            self._thread.join(2.0)  # let the drain thread record how it ended
        if not self.alive or self._cmd is None:
            raise WorkerDiedError(self.died.message if self.died else "worker is not running", fix="start a new run to restart the worker")
        try:
            self._cmd.send(cmd)
        except (BrokenPipeError, OSError):
            if self._thread is not None:
                self._thread.join(2.0)
            msg = self.died.message if self.died else "worker process is gone"
            raise WorkerDiedError(msg, fix="start a new run to restart the worker") from None

    def get(self, timeout: float | None = None):
        """Next event (raises queue.Empty after `timeout` seconds)."""
        return self.events.get(timeout=timeout)

    def stop(self, timeout: float = 5.0) -> int | None:
        """Ask the worker to shut down, join it (draining so the join cannot block), terminate as a fallback."""
        if self.proc is None:
            return None
        self._stopping = True
        try:
            if self._cmd is not None and self.proc.is_alive():
                self._cmd.send(Shutdown())
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2.0)
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for c in (self._cmd, self._evt):
            try:
                if c is not None:
                    c.close()
            except OSError:
                pass
        code = self.proc.exitcode
        self._cmd = self._evt = None
        return code

    def kill(self) -> None:
        """Kill the worker at once (tests, and a GUI 'force stop')."""
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()

    def __enter__(self) -> WorkerClient:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
