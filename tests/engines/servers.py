"""Real HTTP servers on 127.0.0.1 for the remote-lane tests: started as processes, waited for, stopped at teardown; and
small in-process servers (:class:`FakeServer`) for what a real server cannot be made to do (redirect elsewhere, send
huge or endless answers, bad token ids, stall, speak TLS with a self-signed certificate)."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

__all__ = ["free_port", "ServerProcess", "FakeServer", "self_signed", "send_json", "send_sse", "fake_llama_routes", "remote_manifest",
           "remote_lane"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`argv` (which must listen on `port`) run with its output in a log; up when `health` answers 200.

    Fails the test with the log's tail when the process exits or is not up within `timeout_s`.
    """

    def __init__(self, name: str, argv: Sequence[str], port: int, *, health: str = "/health", timeout_s: float = 120,
                 env: dict[str, str] | None = None, wait: bool = True) -> None:
        self.name = name
        self.port = port
        self.health = health
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{name}-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(list(argv), stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                     start_new_session=True)
        if wait:
            self.wait(timeout_s)

    def wait(self, timeout_s: float = 120) -> None:
        """Until `health` answers 200; fails the test with the log's tail when the process exits or is not up in time."""
        deadline = time.time() + timeout_s
        while time.time() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + self.health, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        tail = self.tail()
        self.stop()
        pytest.fail(f"{self.name} did not come up within {timeout_s:.0f} s (exit code {self.proc.poll()}); its log ends:\n{tail}")

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
        """Kill the server at once (a server dying mid-stream) and wait until it is gone: until the process has ended
        its listening socket may still take a connection and reset it, where a dead server refuses it (a test of the
        dead server's message failed so under load)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def remote_manifest(tmp_path, name: str, url: str, tokenizer: str, model: str = "smollm2", **openai):
    """A `backend = "openai"` manifest file for a server at `url`, [openai] keys from the arguments."""
    table = {"base_url": url, "model": model, "tokenizer": tokenizer, **openai}
    p = tmp_path / f"{name}.toml"
    p.write_text(f'backend = "openai"\ndescription = "{name}"\n[openai]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
    return p


def remote_lane(engine, prompt: str, max_new: int = 40, **kw):
    """One remote lane of `prompt` on `engine`: (its StepEvents, its LaneStats)."""
    from app.core.accounting import LaneRecorder, drive
    from app.core.events import StepEvent
    from app.core.setups import Sampling
    from app.runners.openai_stream import RemoteRunner

    ids = engine.encode_prompt(prompt)
    s = Sampling(max_new_tokens=max_new, **kw)
    rec = LaneRecorder("L", "remote", "p", 0, s.max_new_tokens, engine.eos_ids, engine.detokenizer(ids))
    evs = list(drive(RemoteRunner(engine), rec, ids, s))
    return [e for e in evs if isinstance(e, StepEvent)], evs[-1].stats


# --- in-process servers ---------------------------------------------------------------------------------------------
Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


class FakeServer:
    """An HTTP(S) server on 127.0.0.1 in this process, one thread per request.

    Args:
        routes: "GET /path" or "POST /path" → a function answering on the request handler it is given (unknown
            routes answer 404).
        tls: (certificate file, key file) to speak https.

    Attributes:
        url: its base URL; seen: (method, path, headers) of every request, in arrival order; release: set at close,
            for handlers that stall until then.
    """

    def __init__(self, routes: dict[str, Handler], tls: tuple[Path, Path] | None = None) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.release = threading.Event()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                outer.seen.append((self.command, self.path, dict(self.headers.items())))
                length = int(self.headers.get("Content-Length") or 0)
                self.body = json.loads(self.rfile.read(length)) if length else None
                route = routes.get(f"{self.command} {self.path}")
                if route is None:
                    send_json(self, {"error": {"message": f"no route {self.path}"}}, 404)
                    return
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up: what these tests provoke
                    pass

            do_GET = do_POST = _any  # noqa: N815

            def log_message(self, *a) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
        self.port = self.srv.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self.srv.serve_forever, daemon=True, name="fake-server").start()

    def headers_seen(self, name: str) -> list[str | None]:
        """The value of header `name` in every request so far (None where it was absent)."""
        return [next((v for k, v in h.items() if k.lower() == name.lower()), None) for _, _, h in self.seen]

    def close(self) -> None:
        self.release.set()
        self.srv.shutdown()
        self.srv.server_close()

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def send_json(h: http.server.BaseHTTPRequestHandler, doc, code: int = 200, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(doc).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(body)


def send_sse(h: http.server.BaseHTTPRequestHandler, docs, done: bool = False) -> None:
    """An event stream of `docs` (each a `data:` line; a str is sent as it is), closed at the end."""
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.end_headers()
    for d in docs:
        h.wfile.write(b"data: " + (d if isinstance(d, str) else json.dumps(d)).encode() + b"\n\n")
        h.wfile.flush()
    if done:
        h.wfile.write(b"data: [DONE]\n\n")


def fake_llama_routes(completion: Handler, model: str = "smollm2") -> dict[str, Handler]:
    """What RemoteEngine asks a llama-server when it opens (/v1/models, /props), with `completion` answering
    POST /completion."""
    return {"GET /v1/models": lambda h: send_json(h, {"object": "list", "data": [{"id": model, "owned_by": "llamacpp"}]}),
            "GET /props": lambda h: send_json(h, {"default_generation_settings": {}}),
            "POST /completion": completion}


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 / localhost: (certificate, key) files in `folder` (openssl)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not on PATH: it makes the self-signed certificate the TLS cases need; install Debian's "
                    "openssl (make test does, as root)", pytrace=False)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key
