"""vLLM's CPU build serving SmolLM2 (with itself as its draft model) for tests/engines/test_vllm.py, started early:
tests/conftest.py starts it in the background as soon as the session has collected its tests and runs those tests
last, so its start-up overlaps the others. (A module of its own: the conftest and the test module must share the
stash key, and pytest imports test modules under names of its own.)

Under pytest-xdist one server serves every worker: the controller starts it once a worker has collected the vLLM
tests (each worker collects every test, and a server per worker would start vLLM twice) and writes how it went to the
file named by STATE_ENV, which the workers read (:class:`SharedServer`); it stops it when the session ends."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from app.engines.cache import prepare
from app.engines.registry import resolve
from tests.engines.servers import ServerProcess, free_port

__all__ = ["VLLM_PY", "K", "PROMPT", "STATE_ENV", "EarlyServer", "SharedServer", "EARLY", "available"]

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = Path(os.environ.get("SPECDECK_VLLM_PYTHON", ROOT / ".cache/vllm-env/bin/python"))
K = 4
#: names the file where the xdist controller's server says "ready URL" or "error: WHY"
STATE_ENV = "SPECDECK_TEST_VLLM_STATE"
PROMPT = "Copy this code exactly, then stop:\n\ndef add(a, b):\n    total = a + b\n    return total\n\ndef mul(a, b):\n    total = a * b\n    return total\n"


def available() -> bool:
    """vLLM's environment is there (make test makes it)."""
    return VLLM_PY.is_file()


class EarlyServer:
    """vLLM serving SmolLM2 with itself as the draft model, started in the background as soon as the session has
    collected its tests (its start-up, a minute or two of imports and loading, overlaps the other tests: tests/conftest
    runs this module's tests last). VLLM_CPU_CI_ENV=1 keeps torch.compile on its eager backend (up in ~30 s instead of
    ~200 s of inductor compilation); 1 GiB of KV cache instead of vLLM's default of most of the machine's memory."""

    def __init__(self, state: Path | None = None) -> None:
        self.server: ServerProcess | None = None
        self.error: BaseException | None = None
        self.port = free_port()
        self.state = state  # where to say how the start went (the xdist controller's server)
        self.thread = threading.Thread(target=self._start, name="vllm-start", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            folder = str(prepare(resolve("smollm2-135m-instruct")))
            spec = json.dumps({"method": "draft_model", "model": folder, "num_speculative_tokens": K})
            self.server = ServerProcess("vllm", [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
                                                 "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(self.port),
                                                 "--max-model-len", "2048", "--dtype", "float32", "--speculative-config", spec,
                                                 "--per-request-spec-decode-metrics", "detailed"],
                                        self.port, env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_CI_ENV": "1"}, wait=False)
            self.server.wait(timeout_s=300)
            # the first request is slow (vLLM prepares its kernels and buffers on it): made here, in the background. (A
            # prompt of a token or two with draft-model speculation aborts vLLM 0.32's CPU worker: the tests' own prompt.)
            body = json.dumps({"model": "smollm2", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}).encode()
            req = urllib.request.Request(self.server.url + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                r.read()
            self._say(f"ready {self.server.url}")
        except BaseException as e:  # reported by the fixture, in the test that needs the server
            self.error = e
            self._say(f"error: {e}")

    def _say(self, text: str) -> None:
        if self.state is not None:
            tmp = self.state.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self.state)

    def ready(self) -> ServerProcess:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.server is not None
        return self.server

    def stop(self) -> None:
        self.thread.join()
        if self.server is not None:
            self.server.stop()



class _Url:
    def __init__(self, url: str) -> None:
        self.url = url


class SharedServer:
    """The xdist controller's EarlyServer as a worker sees it: `ready()` waits for the state file; `stop()` leaves the
    server to the controller."""

    def __init__(self, state: Path) -> None:
        self.state = state

    def ready(self, timeout_s: float = 600) -> _Url:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            text = self.state.read_text() if self.state.is_file() else ""
            if text.startswith("ready "):
                return _Url(text.split(" ", 1)[1])
            if text.startswith("error"):
                pytest.fail(f"vLLM's server (started by the xdist controller) failed: {text}", pytrace=False)
            time.sleep(0.5)
        pytest.fail(f"vLLM's server (started by the xdist controller) said nothing in {timeout_s:.0f} s ({self.state})", pytrace=False)

    def stop(self) -> None:
        pass


#: the server started at collection time (tests/conftest.py), if it was
EARLY = pytest.StashKey["EarlyServer | SharedServer"]()
