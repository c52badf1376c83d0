"""Client of the worker process, used by the CLI directly and by the GUI through a thin Qt bridge. No Qt.

Events arrive on a draining thread (event-driven: it blocks in `multiprocessing.connection.wait` on the
event pipe and the process sentinel), which puts them on a queue and calls `on_event` when given.
If the worker dies, one `WorkerDied` event names the exit code or signal within milliseconds; everything
received before it stays received, and `start()` can bring up a new worker.

A worker normally is a `multiprocessing` spawn child of SpecDeck's own interpreter. With `python=<interpreter>`
it is started from another Python environment instead (an engine that cannot live in SpecDeck's, e.g.
TensorRT-LLM: app.engines.environments): `<python> -m app.worker.entry` with this checkout on PYTHONPATH, which
connects back over two authenticated Unix sockets (multiprocessing.connection) and then speaks the same pickled
messages. Its stderr is passed through, and the last lines are kept for the error when it fails to start.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection, Listener, wait
from typing import Any

from app.core.errors import WorkerDiedError
from app.worker.messages import Command, Shutdown, WorkerDied, WorkerReady

__all__ = ["WorkerClient", "describe_exit", "call_sink", "spawn_from_a_steady_thread"]

_spawner: ThreadPoolExecutor | None = None
_spawner_tid: int | None = None


def spawn_from_a_steady_thread() -> int:
    """From now on, start every worker process from one long-lived thread made now, so that workers inherit this
    moment's scheduling priority even if the process then lowers its other threads' (the GUI does, at start-up).
    Returns that thread's native id."""
    global _spawner, _spawner_tid
    if _spawner is None:
        ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdeck-spawner")
        _spawner_tid = ex.submit(threading.get_native_id).result()
        _spawner = ex
    assert _spawner_tid is not None
    return _spawner_tid



def _spawn(start: Callable[[], Any]) -> Any:
    """Run a process-starting call on the steady thread when there is one, else here."""
    return _spawner.submit(start).result() if _spawner is not None else start()


def call_sink(on_event: Callable[[object], None] | None, ev) -> None:
    """Hand an event to a display sink on the draining thread; a sink's exception is printed, never kills the drain."""
    if on_event is None:
        return
    try:
        on_event(ev)
    except Exception:
        import traceback

        traceback.print_exc()


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


class _ExternalProcess:
    """A worker started from another interpreter (subprocess.Popen), with the few methods of
    multiprocessing.Process the client uses; `sentinel` is a pidfd that becomes readable when it exits."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.sentinel = os.pidfd_open(popen.pid)
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self._relay = threading.Thread(target=self._pass_stderr, daemon=True, name="specdeck-worker-stderr")
        self._relay.start()

    def _pass_stderr(self) -> None:
        stream = self.popen.stderr
        if stream is None:
            return
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            self.stderr_tail.append(line.rstrip())
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        if self.popen.returncode is not None:
            self._relay.join(1.0)

    def terminate(self) -> None:
        if self.is_alive():
            self.popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self.popen.kill()

    def close(self) -> None:
        try:
            os.close(self.sentinel)
        except OSError:
            pass


class WorkerClient:
    """Start, feed, drain and stop a worker process.

    Args:
        on_event: called on the draining thread with each event (the Qt bridge re-emits it as a signal).
        queue_events: also put events on `events` for blocking readers (`get`); a sink that only uses
            `on_event` passes False so nothing accumulates (start-up events are queued regardless).
        python: start the worker from this interpreter (another environment) instead of SpecDeck's own.
    """

    def __init__(self, on_event: Callable[[object], None] | None = None, queue_events: bool = True, python: str | None = None) -> None:
        self.on_event = on_event
        self.queue_events = queue_events
        self.python = python
        self.events: queue.Queue = queue.Queue()
        self.proc: mp.process.BaseProcess | _ExternalProcess | None = None
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
        self.died = None
        self.ready = None
        self._stopping = False
        self.events = queue.Queue()
        deadline = time.monotonic() + timeout
        if self.python is None:
            ctx = mp.get_context("spawn")
            cmd_r, cmd_w = ctx.Pipe(duplex=False)
            evt_r, evt_w = ctx.Pipe(duplex=False)
            from app.worker import entry

            proc = ctx.Process(target=entry.main, args=(cmd_r, evt_w, os.getpid(), time.time()), name="specdeck-worker", daemon=True)
            try:
                _spawn(proc.start)
            except BaseException:
                # A stop signal's KeyboardInterrupt can land inside multiprocessing's start: leave no half-started worker
                # and no Process that stop() could not join ("can only join a started process").
                if proc.pid is not None:
                    proc.kill()
                    proc.join(5.0)
                for c in (cmd_r, cmd_w, evt_r, evt_w):
                    c.close()
                self.proc = None
                raise
            self.proc = proc
            cmd_r.close()
            evt_w.close()
            self._cmd, self._evt = cmd_w, evt_r
        else:
            self._cmd, self._evt = self._start_external(self.python, deadline)
        # the drain thread is the client's once started: a stop signal's KeyboardInterrupt landing between the two
        # would leave stop() a thread it cannot join ("cannot join thread before it is started")
        drain = threading.Thread(target=self._drain, args=(self._evt, self.proc), daemon=True, name="specdeck-drain")
        drain.start()
        self._thread = drain
        held = []
        try:
            while True:
                ev = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
                if isinstance(ev, WorkerReady):
                    self.ready = ev
                    return ev
                if isinstance(ev, WorkerDied):
                    raise WorkerDiedError(ev.message + self._stderr_tail(), fix="see the log above; run again to restart the worker")
                held.append(ev)
        except queue.Empty:
            self.kill()
            raise WorkerDiedError(f"worker did not start within {timeout:.0f} s", fix="check that `python -m app engines` works") from None
        finally:
            for ev in held:
                self.events.put(ev)

    def _stderr_tail(self) -> str:
        tail = list(getattr(self.proc, "stderr_tail", ()))
        return (":\n  " + "\n  ".join(tail[-6:])) if tail else ""

    def _start_external(self, python: str, deadline: float) -> tuple[Connection, Connection]:
        """Start `<python> -m app.worker.entry` and accept its two connections (commands, then events).

        Raises:
            WorkerDiedError: the interpreter cannot start, or the worker exits or stays silent before connecting.
        """
        from app.engines.environments import worker_env

        key = os.urandom(32)
        folder = tempfile.mkdtemp(prefix="specdeck-worker-")
        address = os.path.join(folder, "socket")
        listener = Listener(address, family="AF_UNIX", authkey=key)
        env = worker_env({"SPECDECK_WORKER_ADDRESS": address, "SPECDECK_WORKER_PARENT": str(os.getpid())})
        try:
            popen = _spawn(lambda: subprocess.Popen([python, "-m", "app.worker.entry"], env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE))
        except OSError as e:
            listener.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise WorkerDiedError(f"cannot start a worker with {python}: {e}", fix="check the engine's python setting (or $SPECDECK_TRTLLM_PYTHON)") from None
        self.proc = proc = _ExternalProcess(popen)
        assert popen.stdin is not None
        try:
            popen.stdin.write(key.hex().encode() + b"\n")  # the key travels on a pipe, never in argv or the environment
            popen.stdin.close()
        except OSError:
            pass
        conns: list[Connection] = []
        failure: list[BaseException] = []

        def accept() -> None:
            try:
                for _ in range(2):
                    conns.append(listener.accept())
            except BaseException as e:  # noqa: BLE001 - reported below
                failure.append(e)

        th = threading.Thread(target=accept, daemon=True, name="specdeck-worker-accept")
        th.start()
        try:
            while th.is_alive() and proc.is_alive() and time.monotonic() < deadline:
                th.join(0.05)
            if len(conns) == 2:
                return conns[0], conns[1]
            proc.kill()
            proc.join(2.0)
            if proc.exitcode is not None and not failure:
                why = f"{describe_exit(proc.exitcode)} before connecting"
            elif failure:
                why = f"connection failed: {failure[0]}"
            else:
                why = "it did not connect in time"
            raise WorkerDiedError(f"the worker started with {python} failed: {why}{self._stderr_tail()}",
                                  fix="run `<python> -c 'import app.worker.entry'` with this checkout on PYTHONPATH to see why")
        finally:
            listener.close()  # unblocks a pending accept
            shutil.rmtree(folder, ignore_errors=True)

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
        call_sink(self.on_event, ev)

    def send(self, cmd: Command) -> None:
        """Send a command. Raises WorkerDiedError (saying how the worker ended) when it is not running."""
        if self.proc is not None and not self.proc.is_alive() and self.died is None:
            self._join_drain(2.0)  # let the drain thread record how it ended
        if not self.alive or self._cmd is None:
            raise WorkerDiedError(self.died.message if self.died else "worker is not running", fix="start a new run to restart the worker")
        try:
            self._cmd.send(cmd)
        except (BrokenPipeError, OSError):
            self._join_drain(2.0)
            msg = self.died.message if self.died else "worker process is gone"
            raise WorkerDiedError(msg, fix="start a new run to restart the worker") from None

    def _join_drain(self, timeout: float) -> None:
        """Wait up to `timeout` for the drain thread to end, if it was started (a start interrupted by a stop signal
        may have left none)."""
        if self._thread is not None and self._thread.ident is not None:
            self._thread.join(timeout)

    def get(self, timeout: float | None = None):
        """Next event (raises queue.Empty after `timeout` seconds)."""
        return self.events.get(timeout=timeout)

    def stop(self, timeout: float = 5.0) -> int | None:
        """Ask the worker to shut down, join it (draining so the join cannot block), terminate as a fallback.

        A worker that has not said WorkerReady (stopped while it starts) holds nothing: it is terminated at once
        instead of being given `timeout` to read a Shutdown it only reads once started."""
        if self.proc is None:
            return None
        self._stopping = True
        try:
            if self._cmd is not None and self.proc.is_alive():
                self._cmd.send(Shutdown())
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout if self.ready is not None else 0)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2.0)
        self._join_drain(2.0)
        for c in (self._cmd, self._evt):
            try:
                if c is not None:
                    c.close()
            except OSError:
                pass
        code = self.proc.exitcode
        self._cmd = self._evt = None
        if isinstance(self.proc, _ExternalProcess):
            self.proc.close()
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
