"""Real HTTP servers on 127.0.0.1 for the remote-lane tests: started as processes, waited for, stopped at teardown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence

import pytest

__all__ = ["free_port", "ServerProcess"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`argv` (which must listen on `port`) run with its output in a log; up when `health` answers 200.

    Fails the test with the log's tail when the process exits or is not up within `timeout_s`.
    """

    def __init__(self, name: str, argv: Sequence[str], port: int, *, health: str = "/health", timeout_s: float = 120,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{name}-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(list(argv), stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                     start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + health, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        tail = self.tail()
        self.stop()
        pytest.fail(f"{name} did not come up within {timeout_s:.0f} s (exit code {self.proc.poll()}); its log ends:\n{tail}")

    def tail(self, n: int = 15) -> str:
        self.log.flush()
        self.log.seek(0)
        return "".join(self.log.readlines()[-n:])

    def stop(self) -> None:
        """SIGTERM to the server's process group (vLLM runs an engine process beside its API server), then SIGKILL."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(10)
        self.log.close()

    def kill(self) -> None:
        """Kill the server at once (a server dying mid-stream)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remote_manifest(tmp_path, name: str, url: str, tokenizer: str, model: str = "smollm2", **openai):
    """A `backend = "openai"` manifest file for a server at `url`, [openai] keys from the arguments."""
    import json

    table = {"base_url": url, "model": model, "tokenizer": tokenizer, **openai}
    p = tmp_path / f"{name}.toml"
    p.write_text(f'backend = "openai"\ndescription = "{name}"\n[openai]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
    return p


def remote_lane(engine, prompt: str, max_new: int = 40, **kw):
    """One remote lane of `prompt` on `engine`: (its StepEvents, its LaneStats)."""
    from app.core.accounting import LaneRecorder, drive
    from app.core.events import StepEvent
    from app.core.setups import Sampling
    from app.speculative.remote import RemoteRunner

    ids = engine.encode_prompt(prompt)
    s = Sampling(max_new_tokens=max_new, **kw)
    rec = LaneRecorder("L", "remote", "p", 0, s.max_new_tokens, engine.eos_ids, engine.detokenizer(ids))
    evs = list(drive(RemoteRunner(engine), rec, ids, s))
    return [e for e in evs if isinstance(e, StepEvent)], evs[-1].stats
