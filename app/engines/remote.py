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

Stdlib HTTP only (urllib), so the worker needs no extra package. The runner is app.speculative.remote.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from app.core.errors import EngineError
from app.core.prometheus import MetricsError, parse_metrics
from app.engines.base import TokenizerMixin

__all__ = ["RemoteConfig", "RemoteEngine", "HTTPFailure", "server_lock", "SERVERS", "gpu_metrics_sources"]

SERVERS = ("auto", "llama.cpp", "vllm", "sglang", "trtllm", "openai")
_KEYS = {"base_url", "model", "tokenizer", "api_key_env", "metrics_url", "gpu_metrics_url", "server", "verify_tls", "timeout_s",
         "connect_timeout_s"}
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


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
        def bad(why: str) -> EngineError:
            return EngineError(f"engine manifest {where}: [openai] {why}", fix=f"edit {where} (README, Outgrowing one machine)")

        if not isinstance(t, dict):
            raise bad("is missing: a backend = \"openai\" engine needs an [openai] table with base_url, model and tokenizer")
        for k in t:
            if k not in _KEYS:
                raise bad(f"unknown key {k!r} (allowed: {', '.join(sorted(_KEYS))})")
        for k in ("base_url", "model", "tokenizer"):
            if not isinstance(t.get(k), str) or not t[k].strip():
                raise bad(f"needs {k} (a non-empty string)")
        for k in ("base_url", "metrics_url", "gpu_metrics_url"):
            v = t.get(k)
            if v is not None and (not isinstance(v, str) or not v.startswith(("http://", "https://"))):
                raise bad(f"{k} must be an http:// or https:// URL, got {v!r}")
        env = t.get("api_key_env")
        if env is not None and (not isinstance(env, str) or not env or "=" in env):
            raise bad("api_key_env names an environment variable (the key itself never goes in a manifest)")
        server = t.get("server", "auto")
        if server not in SERVERS:
            raise bad(f"server must be one of {', '.join(SERVERS)}, got {server!r}")
        for k in ("timeout_s", "connect_timeout_s"):
            v = t.get(k)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
                raise bad(f"{k} must be a positive number of seconds")
        if "verify_tls" in t and not isinstance(t["verify_tls"], bool):
            raise bad("verify_tls must be true or false")
        return cls(base_url=t["base_url"].rstrip("/"), model=t["model"], tokenizer=t["tokenizer"], api_key_env=env,
                   metrics_url=t.get("metrics_url"), gpu_metrics_url=t.get("gpu_metrics_url"), server=server,
                   verify_tls=t.get("verify_tls", True), timeout_s=float(t.get("timeout_s", 120.0)),
                   connect_timeout_s=float(t.get("connect_timeout_s", 10.0)))


class HTTPFailure(EngineError):
    """A request to a server failed (unreachable, refused, an HTTP error); the message names the URL and the fix."""


class RemoteEngine(TokenizerMixin):
    """A target served over HTTP. Loading checks the server: reachable, the key accepted, the model served, the
    metrics URL Prometheus; the tokenizer is the local engine's named by `[openai] tokenizer`.

    Attributes:
        cfg: the RemoteConfig; server: the server kind after asking it ("llama.cpp", "vllm", …, "openai").
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
        progress(f"connect to {self.cfg.base_url}", 0, 1, "")
        self.tokenizer = tokenizer if tokenizer is not None else _local_tokenizer(self.cfg.tokenizer, self.name, progress)
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

    # --- HTTP -------------------------------------------------------------------------------------
    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream, text/plain"}
        if self.cfg.api_key_env:
            key = os.environ.get(self.cfg.api_key_env)
            if not key:
                raise EngineError(f"engine {self.name}: the API key variable ${self.cfg.api_key_env} is not set",
                                  fix=f"export {self.cfg.api_key_env}=<key> before starting SpecDeck")
            h["Authorization"] = f"Bearer {key}"
        return h

    def _context(self) -> ssl.SSLContext | None:
        if not self.cfg.verify_tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        return None

    def open(self, url: str, body: dict | None = None, timeout: float | None = None):
        """An open HTTP response (GET, or POST of JSON `body`).

        Raises:
            HTTPFailure: unreachable, refused, or an HTTP error status, with the server's own words.
        """
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, headers=self.headers(), method="POST" if body is not None else "GET")
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.cfg.connect_timeout_s, context=self._context())
        except urllib.error.HTTPError as e:
            detail = _error_text(e)
            if e.code in (401, 403):
                how = (f"check the key in ${self.cfg.api_key_env}" if self.cfg.api_key_env
                       else f"the server wants a key: set [openai] api_key_env in {self.manifest.where} and export it")
                raise HTTPFailure(f"engine {self.name}: {url} refused the request (HTTP {e.code}): {detail}", fix=how) from None
            raise HTTPFailure(f"engine {self.name}: {url} answered HTTP {e.code}: {detail}",
                              fix=f"check base_url/model in {self.manifest.where} and the server's log") from None
        except urllib.error.URLError as e:
            raise HTTPFailure(f"engine {self.name}: cannot reach {url}: {e.reason}",
                              fix=f"is the server running? Check base_url in {self.manifest.where}") from None
        except (TimeoutError, OSError) as e:
            raise HTTPFailure(f"engine {self.name}: cannot reach {url}: {e}",
                              fix=f"is the server running? Check base_url in {self.manifest.where}") from None

    def get_json(self, path: str) -> Any:
        with self.open(self.cfg.base_url + path) as r:
            return json.loads(r.read().decode("utf-8", "replace"))

    def _models(self) -> None:
        try:
            doc = self.get_json("/v1/models")
        except json.JSONDecodeError:
            raise HTTPFailure(f"engine {self.name}: {self.cfg.base_url}/v1/models is not JSON: not an OpenAI-compatible server",
                              fix=f"check base_url in {self.manifest.where}") from None
        served = [m.get("id") for m in doc.get("data", []) if isinstance(m, dict)] if isinstance(doc, dict) else []
        # llama-server answers to any model name and lists its aliases; vLLM, SGLang and trtllm-serve check it
        if served and self.cfg.model not in served and not self._lenient(doc):
            raise EngineError(f"engine {self.name}: {self.cfg.base_url} serves {', '.join(map(str, served))}, not {self.cfg.model!r}",
                              fix=f"set model = {served[0]!r} in [openai] of {self.manifest.where}")

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

    def read_metrics(self) -> list[tuple[str, dict[str, str], float]]:
        """The server's Prometheus samples.

        Raises:
            HTTPFailure: unreachable; EngineError: the page is not Prometheus text.
        """
        url = self.cfg.metrics_url
        assert url is not None
        with self.open(url) as r:
            text = r.read().decode("utf-8", "replace")
        try:
            return parse_metrics(text)
        except MetricsError as e:
            raise EngineError(f"engine {self.name}: {url} is not Prometheus metrics ({e})",
                              fix=f"point metrics_url in {self.manifest.where} at the server's /metrics (llama-server needs --metrics), "
                                  "or remove it") from None

    def read_gpus(self):
        """The server's GPUs from its DCGM exporter (GpuSamples).

        Raises:
            HTTPFailure: unreachable; EngineError: not a DCGM exporter's page.
        """
        from app.telemetry.dcgm import DcgmReader

        url = self.cfg.gpu_metrics_url
        assert url is not None
        try:
            return DcgmReader(self.name, url, timeout_s=self.cfg.connect_timeout_s).fetch()
        except MetricsError as e:
            raise EngineError(f"engine {self.name}: {url} is not a DCGM exporter's metrics ({e})",
                              fix=f"point gpu_metrics_url in {self.manifest.where} at the server's dcgm-exporter (port 9400, /metrics), "
                                  "or remove it") from None
        except urllib.error.HTTPError as e:
            raise HTTPFailure(f"engine {self.name}: its GPU metrics at {url} answered HTTP {e.code}: {_error_text(e)}",
                              fix=f"check gpu_metrics_url in {self.manifest.where} (a dcgm-exporter serves /metrics without a key)") from None
        except OSError as e:
            raise HTTPFailure(f"engine {self.name}: cannot reach its GPU metrics at {url}: {getattr(e, 'reason', e)}",
                              fix=f"is dcgm-exporter running on the server? Check gpu_metrics_url in {self.manifest.where}") from None

    # --- what the scheduler asks -------------------------------------------------------------------
    @property
    def context_length(self) -> int | None:
        return None


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        raw = e.read().decode("utf-8", "replace")
    except Exception:
        return e.reason if isinstance(e.reason, str) else str(e)
    try:
        doc = json.loads(raw)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
        msg = err.get("message", err) if isinstance(err, dict) else err
        return str(msg)[:300]
    except json.JSONDecodeError:
        return raw.strip()[:300] or str(e.reason)


def _local_tokenizer(name: str, engine: str, progress):
    """The tokenizer of a local engine (GGUF vocabulary only, or an HF folder's tokenizer), without its weights."""
    from app.engines.registry import resolve

    try:
        m = resolve(name)
    except EngineError as e:
        raise EngineError(f"engine {engine}: its tokenizer engine {name!r} is unknown ({e})",
                          fix="set [openai] tokenizer to a local engine of the same model family (python -m app engines)") from None
    if m.source_kind in ("gguf", "gguf_parts"):  # the GGUF's vocabulary only: no weights read
        from app.engines.llamacpp import load_gguf_tokenizer

        return load_gguf_tokenizer(m, progress)
    if m.backend == "hf":
        from app.engines.cache import prepare
        from app.engines.hf import load_tokenizer

        return load_tokenizer(prepare(m, progress))
    raise EngineError(f"engine {engine}: tokenizer engine {name!r} has backend {m.backend!r}",
                      fix="name an hf or llamacpp engine whose tokenizer matches the served model")


def gpu_metrics_sources(target: str, setups) -> dict[str, str]:
    """Engine name → DCGM URL for every remote engine of a run (its target, `@engine` lane targets, `remote:`
    lanes) whose manifest sets gpu_metrics_url; engines that do not resolve are skipped (the run reports them)."""
    from app.core.setups import parse_setup
    from app.engines.registry import resolve

    names = [target]
    for text in setups:
        try:
            st = parse_setup(text)
        except Exception:
            continue
        names += [n for n in (st.target, st.lane_engine) if n]
    out: dict[str, str] = {}
    for n in dict.fromkeys(names):
        try:
            m = resolve(n)
        except Exception:
            continue
        t = m.extra.get("openai") if m.backend == "openai" else None
        url = t.get("gpu_metrics_url") if isinstance(t, dict) else None
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            out[m.name] = url
    return out
