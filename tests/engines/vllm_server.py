"""vLLM's CPU build serving SmolLM2 (with itself as its draft model) for tests/engines/test_vllm.py, started early:
tests/conftest.py starts it in the background as soon as the session has collected its tests and runs those tests
last, so its start-up overlaps the others. (A module of its own: the conftest and the test module must share the
stash key, and pytest imports test modules under names of its own.)"""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from pathlib import Path

import pytest

from app.engines.cache import prepare
from app.engines.registry import resolve
from tests.engines.servers import ServerProcess, free_port

__all__ = ["VLLM_PY", "K", "PROMPT", "EarlyServer", "EARLY", "available"]

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = Path(os.environ.get("SPECDECK_VLLM_PYTHON", ROOT / ".cache/vllm-env/bin/python"))
K = 4
PROMPT = "Copy this code exactly, then stop:\n\ndef add(a, b):\n    total = a + b\n    return total\n\ndef mul(a, b):\n    total = a * b\n    return total\n"


def available() -> bool:
    """vLLM's environment is there (make test makes it)."""
    return VLLM_PY.is_file()


class EarlyServer:
    """vLLM serving SmolLM2 with itself as the draft model, started in the background as soon as the session has
    collected its tests (its start-up, a minute or two of imports and loading, overlaps the other tests: tests/conftest
    runs this module's tests last). VLLM_CPU_CI_ENV=1 keeps torch.compile on its eager backend (up in ~30 s instead of
    ~200 s of inductor compilation); 1 GiB of KV cache instead of vLLM's default of most of the machine's memory."""

    def __init__(self) -> None:
        self.server: ServerProcess | None = None
        self.error: BaseException | None = None
        self.port = free_port()
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
        except BaseException as e:  # reported by the fixture, in the test that needs the server
            self.error = e

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



#: the server started at collection time (tests/conftest.py), if it was
EARLY = pytest.StashKey[EarlyServer]()
