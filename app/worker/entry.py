"""Worker process entry. Imports no Qt; torch and the engines load on first use.

Started two ways: as a `multiprocessing` spawn child of SpecDeck's interpreter (`main` with two pipes), or from
another Python environment as `python -m app.worker.entry` (app.worker.client, `python=`): it then reads the
socket address and parent pid from $SPECDECK_WORKER_ADDRESS / $SPECDECK_WORKER_PARENT and the auth key from the
first line of stdin, connects twice (commands, then events) and runs the same `main`. torch is optional there
(an environment may hold only what its backend needs).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque

__all__ = ["main", "WorkerServer"]


class _Shutdown(Exception):
    pass


def _watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Exit when the parent process is gone, so no orphan keeps holding (GPU) memory."""
    while True:
        time.sleep(interval_s)
        if os.getppid() != parent_pid:
            os._exit(3)


def _device_info() -> tuple[str, str]:
    """(what the worker computes on, torch's version or "none") — torch is optional in another environment."""
    try:
        import torch
    except ImportError:  # an environment started for a backend that does not need it
        return f"cpu ({os.cpu_count()} logical CPUs; no torch in {sys.prefix})", "none"
    dev = f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    return dev, torch.__version__


class WorkerServer:
    """The worker's command loop: one handler per command; every event goes out through `evt_conn`.

    Between commands it blocks on `cmd_conn`; during a run the scheduler polls it between steps (:meth:`poll`), so a
    Cancel or Shutdown lands within a step and other commands wait their turn.
    """

    def __init__(self, cmd_conn, evt_conn) -> None:
        from app.worker.pool import EnginePool

        self.cmd_conn, self.evt_conn = cmd_conn, evt_conn
        self._send = threading.Lock()
        self.pool = EnginePool(self.emit)
        self.pending: deque = deque()
        self.cancelled_runs: set[str] = set()
        self.cancelled_lanes: set[tuple[str, str]] = set()

    def emit(self, ev) -> None:
        with self._send:
            self.evt_conn.send(ev)

    def start(self, t_spawn: float) -> None:
        """Say WorkerReady (with the device and start-up time) and start the heartbeat."""
        from app.worker.messages import HEARTBEAT_S, Heartbeat, WorkerReady

        try:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except Exception:  # pragma: no cover - transformers is optional in another environment too
            pass
        dev, torch_version = _device_info()
        if sys.executable and os.environ.get("SPECDECK_WORKER_ADDRESS"):
            dev += f", python {sys.version.split()[0]} at {sys.executable}"
        self.emit(WorkerReady(pid=os.getpid(), startup_s=time.time() - t_spawn, torch_version=torch_version, device_info=dev))

        def heartbeat() -> None:
            while True:
                time.sleep(HEARTBEAT_S)
                try:
                    self.emit(Heartbeat(time.time()))
                except (BrokenPipeError, EOFError, OSError):
                    return

        threading.Thread(target=heartbeat, daemon=True, name="heartbeat").start()

    def serve(self) -> None:
        """Handle commands until Shutdown or until the client goes away."""
        from app.core.events import LogEvent
        from app.worker.messages import Cancel, LoadEngines, Ping, RunLanes, Shutdown

        handlers = {Ping: self.on_ping, Cancel: lambda cmd: None, LoadEngines: self.on_load, RunLanes: self.on_run}
        try:
            while True:
                cmd = self.pending.popleft() if self.pending else self.cmd_conn.recv()
                if isinstance(cmd, Shutdown):
                    return
                handler = handlers.get(type(cmd))
                if handler is None:
                    self.emit(LogEvent("warning", f"unknown command {type(cmd).__name__}"))
                else:
                    handler(cmd)
        except (_Shutdown, BrokenPipeError, EOFError):  # asked to stop, or the client went away
            return

    def poll(self) -> None:
        """Read the commands that arrived during a run: cancels and pings at once, the rest queued.

        Raises:
            _Shutdown: a Shutdown arrived (the run stops where it is).
        """
        from app.worker.messages import Cancel, Ping, Shutdown

        while self.cmd_conn.poll():
            cmd = self.cmd_conn.recv()
            if isinstance(cmd, Cancel):
                if cmd.lane_id is None:
                    self.cancelled_runs.add(cmd.run_id)
                else:
                    self.cancelled_lanes.add((cmd.run_id, cmd.lane_id))
            elif isinstance(cmd, Shutdown):
                raise _Shutdown
            elif isinstance(cmd, Ping):
                self.on_ping(cmd)
            else:
                self.pending.append(cmd)

    def on_ping(self, cmd) -> None:
        from app.worker.messages import Pong

        self.emit(Pong(cmd.request_id, time.time()))

    def on_load(self, cmd) -> None:
        """Load the target, its drafts and the other targets' (and their cost profiles); EnginesLoaded or RunError."""
        from app.core.errors import SpecDeckError
        from app.core.events import RunError
        from app.worker.messages import EnginesLoaded, LoadedEngine

        pool = self.pool
        engines: list = []

        def load(name: str, engine) -> None:
            engines.append((name, engine))

        try:
            target = pool.get(cmd.target, cmd.device, cmd.dtype)
            load(cmd.target, target)
            for d in cmd.drafts:
                d, ddtype = (d, None) if isinstance(d, str) else d
                load(d, pool.get_draft(cmd.target, target, d, cmd.device, ddtype or cmd.dtype))
            for other, drafts in cmd.others:  # lanes moved to another target (`…@<target>`)
                o = pool.get(other, cmd.device, cmd.dtype)
                load(other, o)
                for d, ddtype in drafts:
                    load(d, pool.get_draft(other, o, d, cmd.device, ddtype or cmd.dtype))
            if cmd.profile or cmd.force_profile:  # each sent as a ProfileReady event
                for e in dict.fromkeys(e for _, e in engines):  # once per engine object, load order
                    pool.profile(e, measure=True, force=cmd.force_profile)
            self.emit(EnginesLoaded(cmd.request_id, tuple(LoadedEngine(n, e.device, e.dtype, e.load_s) for n, e in engines)))
        except SpecDeckError as e:
            self.emit(RunError(None, str(e), kind=type(e).__name__))
        except Exception as e:
            self.emit(RunError(None, f"{type(e).__name__}: {e}", kind="internal"))

    def on_run(self, cmd) -> None:
        """Run a RunLanes command's lanes (sequential, interleaved or paced), then RunFinished."""
        from app.core.events import RunError
        from app.worker.messages import RunFinished
        from app.worker.scheduler import lane_events, schedule

        run_id = cmd.run_id

        def make(spec):
            def cancelled() -> bool:
                return run_id in self.cancelled_runs or (run_id, spec.lane_id) in self.cancelled_lanes

            return lane_events(self.pool, cmd.target, spec, cmd.sampling, cmd.chat, cancelled, cmd.device, cmd.dtype)

        try:
            schedule(list(cmd.lanes), make, cmd.mode, self.emit, self.poll)
        except _Shutdown:
            raise
        except Exception as e:
            self.emit(RunError(None, f"{type(e).__name__}: {e}", kind="internal"))
        self.emit(RunFinished(run_id, cancelled=run_id in self.cancelled_runs))
        self.cancelled_runs.discard(run_id)


def main(cmd_conn, evt_conn, parent_pid: int, t_spawn: float) -> None:
    """Serve commands until Shutdown (or the parent dies). Every event goes through `evt_conn`."""
    # Ctrl-C in a terminal reaches the whole process group: the client decides (it cancels and shuts us down),
    # so the worker ignores SIGINT instead of dying with a traceback mid-forward.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="parent-watch").start()
    # Quiet transformers' own progress bars and info logs: progress travels as Progress events.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    server = WorkerServer(cmd_conn, evt_conn)
    try:
        server.start(t_spawn)
        server.serve()
    finally:
        try:
            evt_conn.close()
        except Exception:
            pass
        sys.stdout.flush()


def _connect_main() -> None:
    """`python -m app.worker.entry`: a worker started from another environment (see the module docstring)."""
    t_spawn = time.time()
    from multiprocessing.connection import Client

    address = os.environ["SPECDECK_WORKER_ADDRESS"]
    parent = int(os.environ.get("SPECDECK_WORKER_PARENT", os.getppid()))
    key = bytes.fromhex(sys.stdin.readline().strip())
    cmd_conn = Client(address, family="AF_UNIX", authkey=key)
    evt_conn = Client(address, family="AF_UNIX", authkey=key)
    main(cmd_conn, evt_conn, parent, t_spawn)


if __name__ == "__main__":
    _connect_main()
