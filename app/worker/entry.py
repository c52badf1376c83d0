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

__all__ = ["main"]


class _Shutdown(Exception):
    pass


def _watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Exit when the parent process is gone, so no orphan keeps holding (GPU) memory."""
    while True:
        time.sleep(interval_s)
        if os.getppid() != parent_pid:
            os._exit(3)


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

    from app.core.errors import SpecDeckError
    from app.core.events import LogEvent, RunError
    from app.worker.messages import (
        HEARTBEAT_S,
        Cancel,
        EnginesLoaded,
        Heartbeat,
        LoadEngines,
        Ping,
        Pong,
        RunFinished,
        RunLanes,
        Shutdown,
        WorkerReady,
    )

    send_lock = threading.Lock()

    def emit(ev) -> None:
        with send_lock:
            evt_conn.send(ev)

    try:
        import torch
    except ImportError:  # an environment started for a backend that does not need it
        torch = None
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - transformers is optional in another environment too
        pass
    if torch is None:
        dev, torch_version = f"cpu ({os.cpu_count()} logical CPUs; no torch in {sys.prefix})", "none"
    else:
        dev = f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
        torch_version = torch.__version__
    if sys.executable and os.environ.get("SPECDECK_WORKER_ADDRESS"):
        dev += f", python {sys.version.split()[0]} at {sys.executable}"
    emit(WorkerReady(pid=os.getpid(), startup_s=time.time() - t_spawn, torch_version=torch_version, device_info=dev))

    def heartbeat() -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                emit(Heartbeat(time.time()))
            except (BrokenPipeError, EOFError, OSError):
                return

    threading.Thread(target=heartbeat, daemon=True, name="heartbeat").start()

    from app.worker.pool import EnginePool
    from app.worker.scheduler import lane_events, schedule

    pool = EnginePool(emit)
    pending: deque = deque()
    cancelled_runs: set[str] = set()
    cancelled_lanes: set[tuple[str, str]] = set()

    def poll() -> None:
        while cmd_conn.poll():
            cmd = cmd_conn.recv()
            if isinstance(cmd, Cancel):
                if cmd.lane_id is None:
                    cancelled_runs.add(cmd.run_id)
                else:
                    cancelled_lanes.add((cmd.run_id, cmd.lane_id))
            elif isinstance(cmd, Shutdown):
                raise _Shutdown
            elif isinstance(cmd, Ping):
                emit(Pong(cmd.request_id, time.time()))
            else:
                pending.append(cmd)

    try:
        while True:
            if pending:
                cmd = pending.popleft()
            else:
                try:
                    cmd = cmd_conn.recv()
                except EOFError:
                    return
            if isinstance(cmd, Shutdown):
                return
            if isinstance(cmd, Ping):
                emit(Pong(cmd.request_id, time.time()))
            elif isinstance(cmd, Cancel):
                continue  # nothing running
            elif isinstance(cmd, LoadEngines):
                try:
                    loaded, engines = [], []
                    t = pool.get(cmd.target, cmd.device, cmd.dtype)
                    loaded.append((cmd.target, t.device, t.dtype, getattr(t, "load_s", 0.0)))
                    engines.append(t)
                    for d in cmd.drafts:
                        d, ddtype = (d, None) if isinstance(d, str) else d
                        e = pool.get_draft(cmd.target, t, d, cmd.device, ddtype or cmd.dtype)
                        loaded.append((d, e.device, e.dtype, getattr(e, "load_s", 0.0)))
                        engines.append(e)
                    for other, drafts in cmd.others:  # lanes moved to another target (`…@<target>`)
                        o = pool.get(other, cmd.device, cmd.dtype)
                        loaded.append((other, o.device, o.dtype, getattr(o, "load_s", 0.0)))
                        engines.append(o)
                        for d, ddtype in drafts:
                            e = pool.get_draft(other, o, d, cmd.device, ddtype or cmd.dtype)
                            loaded.append((d, e.device, e.dtype, getattr(e, "load_s", 0.0)))
                            engines.append(e)
                    if cmd.profile or cmd.force_profile:  # each sent as a ProfileReady event
                        for e in dict.fromkeys(engines):  # once per engine object, load order
                            pool.profile(e, measure=True, force=cmd.force_profile)
                    emit(EnginesLoaded(cmd.request_id, tuple(loaded)))
                except SpecDeckError as e:
                    emit(RunError(None, str(e), kind=type(e).__name__))
                except Exception as e:
                    emit(RunError(None, f"{type(e).__name__}: {e}", kind="internal"))
            elif isinstance(cmd, RunLanes):
                run_id = cmd.run_id

                def make(spec, cmd=cmd, run_id=run_id):
                    def cancelled() -> bool:
                        return run_id in cancelled_runs or (run_id, spec.lane_id) in cancelled_lanes

                    return lane_events(pool, cmd.target, spec, cmd.sampling, cmd.chat, cancelled, cmd.device, cmd.dtype)

                try:
                    schedule(list(cmd.lanes), make, cmd.mode, emit, poll)
                except _Shutdown:
                    raise
                except Exception as e:
                    emit(RunError(None, f"{type(e).__name__}: {e}", kind="internal"))
                emit(RunFinished(run_id, cancelled=run_id in cancelled_runs))
                cancelled_runs.discard(run_id)
            else:
                emit(LogEvent("warning", f"unknown command {type(cmd).__name__}"))
    except _Shutdown:
        return
    except (BrokenPipeError, EOFError):  # the client went away
        return
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
