"""Remote engines (`backend = "openai"`): a target served by llama.cpp's llama-server, vLLM, SGLang or
`trtllm-serve`, reached over HTTP, so lanes on a laptop can compare setups that run on a GPU cluster.

A manifest names the server and a local tokenizer::

    backend = "openai"
    description = "Llama 3.1 405B on our vLLM cluster, EAGLE-3"
    [openai]
    base_url = "https://llm.internal:8000"     # the server (its OpenAI routes are under /v1)
    model = "meta-llama/Llama-3.1-405B-Instruct"
    tokenizer = "llama-3.1-8b-instruct"        # a local engine with the same tokenizer (prompt ids, text, EOS)
    api_key_env = "CLUSTER_API_KEY"            # the key is read from this variable; never stored or logged
    metrics_url = "https://llm.internal:8000/metrics"  # Prometheus: speculative counters, by delta per request
    gpu_metrics_url = "http://llm.internal:9400/metrics"  # a DCGM exporter: the GUI plots the server's GPUs
    server = "auto"                             # llama.cpp | vllm | sglang | trtllm | openai (auto: asked)
    verify_tls = true
    timeout_s = 120                             # per read; connect_timeout_s = 10

What each server gives (README, "Outgrowing one machine"): llama-server's native `/completion` streams one token
id per chunk and, with `timings_per_token`, cumulative draft counts in every chunk — so SpecDeck rebuilds each
verification step exactly (drafted, accepted, the target token); vLLM streams the token ids of each engine step
(`return_token_ids`) and, when started with `--per-request-spec-decode-metrics`, the request's draft counts in its
final chunk; otherwise the counters of `metrics_url` are read before and after each request (one request in
flight per server while timing). A server that reports nothing speculative still runs: its counts are shown as
unavailable.

The API key goes only to base_url's origin, redirects to another origin are refused, server text quoted in an
error has the key redacted, and no answer is read past MAX_BODY_BYTES (a streamed line past MAX_LINE_BYTES).

Stdlib HTTP only (urllib), so the worker needs no extra package. The runner is app.runners.openai_stream.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import re
import socket
import ssl
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from app.core.errors import EngineError
from app.engines.base import EngineBase
from app.engines.manifest import Key, read_table
from app.telemetry.prometheus import MetricsError, parse_metrics

__all__ = ["RemoteConfig", "RemoteEngine", "HTTPFailure", "ServerUnreachable", "server_lock", "SERVERS", "tokenizer_only", "origin",
           "key_warnings", "MAX_LINE_BYTES", "MAX_BODY_BYTES"]

SERVERS = ("auto", "llama.cpp", "vllm", "sglang", "trtllm", "openai")
MAX_LINE_BYTES = 1 << 20  # the most read of one streamed (SSE) line, in bytes
MAX_BODY_BYTES = 8 << 20  # the most read of one answer that is not streamed (/v1/models, /metrics, …), in bytes
_ERROR_BODY_BYTES = 64 << 10  # the most read of an HTTP error's body (only its first 300 characters are quoted)
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_warned: set[str] = set()  # warnings printed in this process (each once)


def server_lock(base_url: str) -> threading.Lock:
    """One lock per server: one request in flight per server while a lane is timed."""
    with _locks_guard:
        return _locks.setdefault(base_url.rstrip("/"), threading.Lock())


@dataclass(frozen=True)
class RemoteConfig:
    """The `[openai]` table of a manifest (see the module docstring)."""

    base_url: str
    model: str
    tokenizer: str
    api_key_env: str | None = None
    metrics_url: str | None = None
    gpu_metrics_url: str | None = None
    server: str = "auto"
    verify_tls: bool = True
    timeout_s: float = 120.0
    connect_timeout_s: float = 10.0

    @classmethod
    def from_table(cls, t: Any, where: str) -> RemoteConfig:
        """The validated `[openai]` table of manifest `where`.

        Raises:
            EngineError: a missing table or key, an unknown key, a bad value (app.engines.manifest.read_table).
        """
        if not isinstance(t, dict):
            raise EngineError(f"engine manifest {where}: [openai] is missing: a backend = \"openai\" engine needs an [openai] table with "
                              "base_url, model and tokenizer", fix=f"edit {where} (README, Outgrowing one machine)")
        v = read_table(t, _TABLE, where, "[openai]", fix=f"edit {where} (README, Outgrowing one machine)")
        return cls(base_url=v["base_url"].rstrip("/"), model=v["model"], tokenizer=v["tokenizer"], api_key_env=v["api_key_env"],
                   metrics_url=v["metrics_url"], gpu_metrics_url=v["gpu_metrics_url"], server=v["server"], verify_tls=v["verify_tls"],
                   timeout_s=v["timeout_s"], connect_timeout_s=v["connect_timeout_s"])


def _url(v: str) -> str | None:
    return None if v.startswith(("http://", "https://")) else "must be an http:// or https:// URL"


_TABLE = [
    Key("base_url", required=True, check=_url, what="the server's address; its OpenAI routes are under /v1"),
    Key("model", required=True, what="the model name the server serves"),
    Key("tokenizer", required=True, what="a local engine with the same tokenizer"),
    Key("api_key_env", check=lambda v: None if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)
        else "names an environment variable (the key itself never goes in a manifest)"),
    Key("metrics_url", check=_url), Key("gpu_metrics_url", check=_url),
    Key("server", default="auto", choices=SERVERS),
    Key("verify_tls", bool, default=True),
    Key("timeout_s", float, default=120.0, above=0, what="seconds a read may wait"),
    Key("connect_timeout_s", float, default=10.0, above=0, what="seconds a connection may take"),
]


def tokenizer_only(manifest, progress, lookup):
    """A server's tokenizer: the local engine's its `[openai] tokenizer` names (read through `lookup`)."""
    return lookup(RemoteConfig.from_table(manifest.extra.get("openai"), manifest.where).tokenizer)


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of `url`, lower case, the port filled in (80 for http, 443 for https): two URLs may
    share an API key only when their origins are equal."""
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    try:
        port = u.port
    except ValueError:
        port = None
    return scheme, (u.hostname or "").lower(), port or (443 if scheme == "https" else 80)


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def key_warnings(cfg: RemoteConfig, name: str, where: str) -> list[str]:
    """Why the API key of `cfg` could be read on its way to the server: plain http:// to another machine, or TLS
    without checking the certificate (so any server answering at that address gets it). Empty without a key."""
    if not cfg.api_key_env:
        return []
    scheme, host, port = origin(cfg.base_url)
    if scheme == "http" and not _loopback(host):
        return [f"engine {name}: the API key in ${cfg.api_key_env} is sent over plain http:// to {host}:{port}, readable by anyone on "
                f"the network path; use an https:// base_url in {where} (or an SSH tunnel to a 127.0.0.1 port)"]
    if scheme == "https" and not cfg.verify_tls:
        return [f"engine {name}: the API key in ${cfg.api_key_env} is sent to {host}:{port} with verify_tls = false, so whoever answers "
                f"at that address gets it; trust the server's certificate instead (export SSL_CERT_FILE=<its CA bundle>) and remove "
                f"verify_tls = false from {where}"]
    return []


class HTTPFailure(EngineError):
    """A request to a server failed (refused, an HTTP error, TLS, a redirect elsewhere, an oversized answer); the
    message names the URL and the fix."""


class ServerUnreachable(HTTPFailure):
    """The server at `base_url` cannot be reached at all (connection refused, no such host, no route, no answer to
    connect). The message is the same for every request to that server, whatever the route: "engine <name>: cannot
    reach <base_url> (<why>)", so a run with many lanes on a stopped server can say it once."""


# what a URL of each `[openai]` key is, in messages (base_url: the server itself)
_ROLE = {"base_url": "", "metrics_url": "its metrics at ", "gpu_metrics_url": "its GPU metrics at "}
# OpenSSL's reasons when an https:// request meets a server that answers in plain HTTP
_PLAIN_HTTP_REASONS = {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"}


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the origin of the URL asked for, and refuses one to another origin with an
    HTTPFailure that names where it pointed (`refuse(url, target)` builds it).

    Refused rather than followed without the key: a lane must time, and send its prompt to, the server its manifest
    names; a load balancer or an http → https upgrade that moves elsewhere means base_url should say the new
    address, and following it without the key would only end in a misleading 401. A redirect's body is read up
    to MAX_BODY_BYTES (urllib would read it whole).
    """

    def __init__(self, refuse, too_big) -> None:
        self.refuse = refuse
        self.too_big = too_big

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if origin(newurl) != origin(req.full_url):
            fp.close()
            raise self.refuse(req.full_url, newurl)
        if len(fp.read(MAX_BODY_BYTES + 1)) > MAX_BODY_BYTES:
            fp.close()
            raise self.too_big(req.full_url)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    """True when `host:port` completes a TLS handshake (certificate unchecked: this only asks which protocol)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as s, ctx.wrap_socket(s, server_hostname=host):
            return True
    except (OSError, ValueError):
        return False


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


class RemoteEngine(EngineBase):
    """A target served over HTTP. Loading checks the server: reachable, the key accepted, the model served, the
    metrics URL Prometheus; the tokenizer is the local engine's named by `[openai] tokenizer`.

    The API key (`Authorization: Bearer`) is sent only to base_url's origin (scheme, host, port): not to a
    metrics_url or gpu_metrics_url elsewhere, and never along a redirect (those to another origin are refused).
    Server text quoted in an error has the key replaced by `***`. A key that would travel over plain http:// to
    another machine, or with verify_tls = false, is warned about once on stderr and in each lane's notes.

    Attributes:
        cfg: the RemoteConfig; server: the server kind after asking it ("llama.cpp", "vllm", …, "openai");
        notes: warnings about this engine's configuration, added to the notes of every lane it runs.
    """

    backend = "openai"

    def __init__(self, manifest, device: str | None = None, dtype: str | None = None, progress=None, tokenizer=None) -> None:
        progress = progress or (lambda *a: None)
        self.manifest = manifest
        self.name = manifest.name
        self.cfg = RemoteConfig.from_table(manifest.extra.get("openai"), manifest.where)
        self.device = "remote"
        self.dtype = "server"
        self.load_s = 0.0
        self.spec_k: int | None = None  # the server's num_speculative_tokens, once a response has reported it
        self._opener: urllib.request.OpenerDirector | None = None
        self.notes = key_warnings(self.cfg, self.name, manifest.where)
        for w in self.notes:
            if w not in _warned:
                _warned.add(w)
                print(f"warning: {w}", file=sys.stderr, flush=True)
        progress(f"connect to {self.cfg.base_url}", 0, 1, "")
        if tokenizer is None:
            raise TypeError("a RemoteEngine is given its tokenizer (app.engines.registry.open_engine reads it)")
        self.tokenizer = tokenizer
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else [])
        self.vocab_size = len(self.tokenizer)
        self._models()
        self.server = self.cfg.server if self.cfg.server != "auto" else self._detect()
        if self.cfg.metrics_url:
            self.read_metrics()  # a wrong metrics URL fails here, once, with the fix
        if self.cfg.gpu_metrics_url:
            self.read_gpus()
        progress(f"connect to {self.cfg.base_url}", 1, 1, "")

    # --- the key ----------------------------------------------------------------------------------
    def _key(self) -> str | None:
        if not self.cfg.api_key_env:
            return None
        key = os.environ.get(self.cfg.api_key_env)
        if not key:
            raise EngineError(f"engine {self.name}: the API key variable ${self.cfg.api_key_env} is not set",
                              fix=f"export {self.cfg.api_key_env}=<key> before starting SpecDeck")
        return key

    def headers(self, url: str | None = None) -> dict[str, str]:
        """The headers of a request to `url` (default: base_url): the key only when `url` has base_url's origin.

        Raises:
            EngineError: `api_key_env` names a variable that is not set.
        """
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream, text/plain"}
        key = self._key()
        if key and origin(url or self.cfg.base_url) == origin(self.cfg.base_url):
            h["Authorization"] = f"Bearer {key}"
        return h

    def redact(self, text: str) -> str:
        """`text` (server words quoted in a message) with the API key replaced by `***`."""
        key = os.environ.get(self.cfg.api_key_env) if self.cfg.api_key_env else None
        return text.replace(key, "***") if key else text

    def failure(self, message: str, fix: str | None = None, cls: type[EngineError] = HTTPFailure) -> EngineError:
        """An error `cls(message, fix)` with the API key redacted from both (they may quote the server)."""
        return cls(self.redact(message), fix=self.redact(fix) if fix else None)

    # --- HTTP -------------------------------------------------------------------------------------
    def _context(self) -> ssl.SSLContext | None:
        if not self.cfg.verify_tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        return None

    def _open_url(self, req: urllib.request.Request, timeout: float):
        if self._opener is None:
            handlers: list[Any] = [_SameOriginRedirects(self._redirect_refused, self._too_big)]
            ctx = self._context()
            if ctx is not None:
                handlers.append(urllib.request.HTTPSHandler(context=ctx))
            self._opener = urllib.request.build_opener(*handlers)
        return self._opener.open(req, timeout=timeout)

    def open(self, url: str, body: dict | None = None, timeout: float | None = None, setting: str = "base_url"):
        """An open HTTP response (GET, or POST of JSON `body`); redirects are followed within `url`'s origin only.

        Args:
            url: the address; setting: the `[openai]` key it comes from (base_url, metrics_url, gpu_metrics_url),
                named in messages; timeout: seconds per connect and per read (default connect_timeout_s).

        Raises:
            ServerUnreachable: base_url's server cannot be reached (the same message for every route).
            HTTPFailure: an HTTP error status (with the server's own words, key redacted), a TLS failure, a
                redirect to another origin, no answer within the timeout; each names the setting to change.
        """
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, headers=self.headers(url), method="POST" if body is not None else "GET")
        wait = timeout or self.cfg.connect_timeout_s
        try:
            return self._open_url(req, wait)
        except urllib.error.HTTPError as e:
            raise self._http_error(url, e, setting) from None
        except urllib.error.URLError as e:  # before an answer: connecting, TLS, sending
            raise self._transport_error(url, e.reason, setting, wait, timeout is not None) from None
        except (OSError, http.client.HTTPException) as e:  # connected, then no (HTTP) answer
            raise self._transport_error(url, e, setting, wait, timeout is not None, connected=True) from None

    def read_body(self, resp, url: str, setting: str = "base_url") -> bytes:
        """The body of an open answer that is not streamed, at most MAX_BODY_BYTES.

        Raises:
            HTTPFailure: the body is larger; TimeoutError/OSError from the connection.
        """
        data = resp.read(MAX_BODY_BYTES + 1)
        if len(data) > MAX_BODY_BYTES:
            raise self._too_big(url, setting)
        return data

    def _too_big(self, url: str, setting: str = "base_url") -> EngineError:
        return self.failure(f"engine {self.name}: {url} sent more than {_mib(MAX_BODY_BYTES)}, the most SpecDeck reads of one answer: "
                            "not an OpenAI-compatible server's reply", fix=f"check {setting} in {self.manifest.where}")

    def _redirect_refused(self, url: str, target: str) -> EngineError:
        s, h, p = origin(target)
        return self.failure(f"engine {self.name}: {url} redirected to {target}, another origin: SpecDeck sends requests and the API key "
                            f"only to the origin a manifest names",
                            fix=f"if {s}://{h}:{p} is the server to use, put that address in the [openai] table of {self.manifest.where}")

    def _http_error(self, url: str, e: urllib.error.HTTPError, setting: str) -> EngineError:
        detail = self.redact(_error_text(e))[:300]  # redacted before it is cut: no piece of the key is left
        where = self.manifest.where
        if "plain HTTP request was sent to HTTPS port" in detail:  # nginx
            return self._wrong_scheme(url, setting, tls=True)
        if setting != "base_url":
            fix = f"check {setting} in {where}"
            if e.code in (401, 403):
                fix = (f"make {url} readable without a key (the API key goes only to base_url's origin; a dcgm-exporter or "
                       f"/metrics endpoint needs none), or remove {setting} from {where}")
            return self.failure(f"engine {self.name}: {_ROLE[setting]}{url} answered HTTP {e.code}: {detail}", fix=fix)
        if e.code in (401, 403):
            how = (f"check the key in ${self.cfg.api_key_env}" if self.cfg.api_key_env
                   else f"the server wants a key: set [openai] api_key_env in {where} and export it")
            return self.failure(f"engine {self.name}: {url} refused the request (HTTP {e.code}): {detail}", fix=how)
        return self.failure(f"engine {self.name}: {url} answered HTTP {e.code}: {detail}",
                            fix=f"check base_url/model in {where} and the server's log")

    def _wrong_scheme(self, url: str, setting: str, tls: bool) -> EngineError:
        _, h, p = origin(url)
        if tls:  # http:// to a TLS server
            return self.failure(f"engine {self.name}: {url} is plain http://, but the server at {h}:{p} speaks TLS",
                                fix=f"use https:// in {setting} in the [openai] table of {self.manifest.where}")
        return self.failure(f"engine {self.name}: {url} is https://, but the server at {h}:{p} answers in plain HTTP",
                            fix=f"use http:// in {setting} in the [openai] table of {self.manifest.where}")

    def _transport_error(self, url: str, why: Any, setting: str, wait: float, read_timeout: bool, connected: bool = False) -> EngineError:
        """The error for a request that got no HTTP answer: `why` is the socket/TLS/http.client exception."""
        where, role = self.manifest.where, _ROLE.get(setting, "")
        scheme, host, port = origin(url)
        if isinstance(why, ssl.SSLCertVerificationError):
            return self.failure(f"engine {self.name}: {role}{url}: the server's TLS certificate is not trusted ({why.verify_message})",
                                fix=f"if the server is yours, trust its certificate (export SSL_CERT_FILE=<its CA bundle>) or set "
                                    f"verify_tls = false in the [openai] table of {where}")
        if isinstance(why, ssl.SSLError) and getattr(why, "reason", None) in _PLAIN_HTTP_REASONS:
            return self._wrong_scheme(url, setting, tls=False)
        if isinstance(why, ssl.SSLError):
            return self.failure(f"engine {self.name}: {role}{url}: the TLS handshake failed ({getattr(why, 'reason', None) or why})",
                                fix=f"check http:// vs https:// in {setting} in {where}, and the server's TLS setup")
        if (scheme == "http" and isinstance(why, (ConnectionResetError, http.client.BadStatusLine))
                and _speaks_tls(host, port, self.cfg.connect_timeout_s)):
            return self._wrong_scheme(url, setting, tls=True)
        if connected and isinstance(why, TimeoutError):
            key = "timeout_s" if read_timeout else "connect_timeout_s"
            return self.failure(f"engine {self.name}: {role}{url} did not answer within {wait:g} s ({key} = {wait:g})",
                                fix=f"if the server is just slow (a long prompt, a busy or cold server), raise {key} in the [openai] "
                                    f"table of {where}; else see the server's log")
        if connected:
            return self.failure(f"engine {self.name}: {role}{url} closed the connection without an HTTP answer ({type(why).__name__}: {why})",
                                fix=f"is {setting} an HTTP server's address? See the server's log; check {setting} in {where}")
        reason = self._unreachable_reason(why, wait)
        if setting == "base_url":
            return self.failure(f"engine {self.name}: cannot reach {self.cfg.base_url} ({reason})",
                                fix=f"is the server running? Check base_url in {where}", cls=ServerUnreachable)
        service = "dcgm-exporter" if setting == "gpu_metrics_url" else "the metrics endpoint"
        return self.failure(f"engine {self.name}: cannot reach {role}{url}: {reason}",
                            fix=f"is {service} running on the server? Check {setting} in {where}")

    @staticmethod
    def _unreachable_reason(why: Any, wait: float) -> str:
        """A short reason that is the same each time the same server is down (no addresses or ports of sockets)."""
        if isinstance(why, ConnectionRefusedError):
            return "connection refused"
        if isinstance(why, socket.gaierror):
            return f"the host name does not resolve: {why.strerror or why}"
        if isinstance(why, TimeoutError):
            return f"no answer to connect within {wait:g} s"
        if isinstance(why, OSError) and why.strerror:
            return why.strerror[0].lower() + why.strerror[1:]
        return str(why)

    def get_json(self, path: str) -> Any:
        """base_url + `path`'s answer, read as JSON (json.JSONDecodeError when it is not)."""
        return json.loads(self._page(self.cfg.base_url + path, "base_url"))

    def _models(self) -> None:
        try:
            doc = self.get_json("/v1/models")
        except json.JSONDecodeError:
            raise self.failure(f"engine {self.name}: {self.cfg.base_url}/v1/models is not JSON: not an OpenAI-compatible server",
                               fix=f"check base_url in {self.manifest.where}") from None
        served = [m.get("id") for m in doc.get("data", []) if isinstance(m, dict)] if isinstance(doc, dict) else []
        # llama-server answers to any model name and lists its aliases; vLLM, SGLang and trtllm-serve check it
        if served and self.cfg.model not in served and not self._lenient(doc):
            raise self.failure(f"engine {self.name}: {self.cfg.base_url} serves {', '.join(map(str, served))}, not {self.cfg.model!r}",
                               fix=f"set model = {served[0]!r} in [openai] of {self.manifest.where}", cls=EngineError)

    @staticmethod
    def _lenient(doc: Any) -> bool:
        return isinstance(doc, dict) and any(isinstance(m, dict) and m.get("owned_by") == "llamacpp" for m in doc.get("data", []))

    def _detect(self) -> str:
        """Ask the server what it is: llama-server has /props, vLLM /version; else plain OpenAI."""
        for path, kind, key in (("/props", "llama.cpp", "default_generation_settings"), ("/version", "vllm", "version")):
            try:
                doc = self.get_json(path)
            except (HTTPFailure, json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(doc, dict) and key in doc:
                return kind
        return "openai"

    def _page(self, url: str, setting: str) -> str:
        """The text at `url` (GET, at most MAX_BODY_BYTES), every failure an HTTPFailure."""
        try:
            with self.open(url, setting=setting) as r:
                return self.read_body(r, url, setting).decode("utf-8", "replace")
        except (TimeoutError, OSError, http.client.HTTPException) as e:  # the body broke off
            raise self._transport_error(url, e, setting, self.cfg.connect_timeout_s, False, connected=True) from None

    def read_metrics(self) -> list[tuple[str, dict[str, str], float]]:
        """The server's Prometheus samples.

        Raises:
            HTTPFailure: unreachable, an HTTP error, over MAX_BODY_BYTES; EngineError: the page is not Prometheus text.
        """
        url = self.cfg.metrics_url
        assert url is not None
        text = self._page(url, "metrics_url")
        try:
            return parse_metrics(text)
        except MetricsError as e:
            raise self.failure(f"engine {self.name}: {url} is not Prometheus metrics ({e})",
                               fix=f"point metrics_url in {self.manifest.where} at the server's /metrics (llama-server needs --metrics), "
                                   "or remove it", cls=EngineError) from None

    def read_gpus(self):
        """The server's GPUs from its DCGM exporter (GpuSamples).

        Raises:
            HTTPFailure: unreachable, an HTTP error, over MAX_BODY_BYTES; EngineError: not a DCGM exporter's page.
        """
        from app.telemetry.dcgm import gpus_from_dcgm

        url = self.cfg.gpu_metrics_url
        assert url is not None
        text = self._page(url, "gpu_metrics_url")
        try:
            return gpus_from_dcgm(text, self.name)
        except MetricsError as e:
            raise self.failure(f"engine {self.name}: {url} is not a DCGM exporter's metrics ({e})",
                               fix=f"point gpu_metrics_url in {self.manifest.where} at the server's dcgm-exporter (port 9400, /metrics), "
                                   "or remove it", cls=EngineError) from None


def _error_text(e: urllib.error.HTTPError) -> str:
    """The server's words in an HTTP error (its JSON `error.message`, else the body's start; at most 300 characters,
    cut by the caller's redaction only after this)."""
    try:
        raw = e.read(_ERROR_BODY_BYTES).decode("utf-8", "replace")
    except Exception:
        return e.reason if isinstance(e.reason, str) else str(e)
    try:
        doc = json.loads(raw)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
        msg = err.get("message", err) if isinstance(err, dict) else err
        return str(msg)
    except json.JSONDecodeError:
        return raw.strip() or str(e.reason)
