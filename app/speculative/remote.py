"""The lane runner for remote engines (app.engines.remote): one streamed completion per lane, its chunks turned
into steps by the shared accounting.

A reader thread streams the request and stamps each chunk on arrival, so chunk times stay right however the
scheduler interleaves this lane with others; the thread holds the server's lock for the whole request (one request
in flight per server while timing) and closes the connection when the lane is cancelled.

Steps, by what the server reports:

* **llama.cpp** (native `/completion`, `return_tokens` + `timings_per_token`): every chunk is one token and
  carries the request's cumulative `draft_n` / `draft_n_accepted`. A chunk where they grew opens a verification
  step that drafted Δdraft_n tokens and kept Δaccepted: the step's tokens are that chunk and the next Δaccepted
  (accepted drafts, then the target token). Other chunks are one-token steps. Exact, rejected ids excepted
  (llama-server does not send them: "rejected ids unavailable").
* **vLLM** (`/v1/completions` with `return_token_ids`): each chunk is what one engine step produced, so a chunk
  of n tokens is a verification step that kept n − 1 drafts and added the target's token (k: the server's
  num_speculative_tokens once a response has reported it). The request's drafted/accepted totals come from the
  final chunk's `metrics.speculative_decoding` (`--per-request-spec-decode-metrics`), which also checks the chunk
  reading (a mismatch is noted), else from the deltas of its Prometheus counters, else are unavailable.
* **other servers** (`/v1/completions`): each chunk is one step of tokens only ("reference"); counts from the
  Prometheus deltas where the server has known counters, else unavailable (said in the lane's notes).

Times: a step ends when its first chunk arrives (the server sends a step's tokens together); step 0 runs from
the request to the first token (prefill, network included).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from app.core.accounting import LaneRecorder
from app.core.errors import EngineError, SetupError
from app.core.events import StepEvent
from app.core.prometheus import SPEC_COUNTERS, metric_sum
from app.core.setups import Sampling
from app.engines.remote import RemoteEngine, server_lock

__all__ = ["RemoteRunner", "Chunk", "NO_COUNTS_NOTE", "VLLM_STEPS_NOTE"]

NO_COUNTS_NOTE = ("the server reported no speculative-decoding statistics for this request (not drafting, or its "
                  "counters are off: llama-server reports them when a draft is set; vLLM with --per-request-spec-decode-metrics "
                  "or a metrics_url): drafted/accepted unavailable")


@dataclass
class Chunk:
    """One streamed chunk: arrival time (lane clock), new token ids, text, and the server's counters."""

    t: float
    ids: list[int]
    text: str = ""
    draft_n: int | None = None
    draft_accepted: int | None = None
    finish: str | None = None  # "eos" | "length" | other
    spec: dict = field(default_factory=dict)  # per-request speculative metrics (vLLM), final chunk
    token_ids: bool = False  # the server sent the ids (vLLM return_token_ids), not only text


VLLM_STEPS_NOTE = ("drafted/accepted totals are the server's per-request metrics; each step's accepted drafts are its "
                   "streamed chunk's size − 1 (one chunk per engine step), its k the server's num_speculative_tokens")


class RemoteRunner:
    """`remote:<engine>` lanes and the baseline on a remote target: one streamed request per lane."""

    def __init__(self, engine: RemoteEngine) -> None:
        if not isinstance(engine, RemoteEngine):
            raise SetupError(f"{getattr(engine, 'name', '?')} is not a remote engine (backend = \"openai\")",
                             fix="name an engine whose manifest has backend = \"openai\"")
        self.engine = engine

    # --- the request -----------------------------------------------------------------------------
    def _request(self, prompt_ids: list[int], s: Sampling) -> tuple[str, dict]:
        e = self.engine
        if e.server == "llama.cpp":
            body: dict[str, Any] = {"prompt": prompt_ids, "n_predict": s.max_new_tokens, "stream": True, "return_tokens": True,
                                    "timings_per_token": True, "cache_prompt": False, "seed": s.seed, "temperature": s.temperature,
                                    "top_k": s.top_k, "top_p": s.top_p}
            return e.cfg.base_url + "/completion", body
        body = {"model": e.cfg.model, "prompt": prompt_ids, "max_tokens": s.max_new_tokens, "stream": True, "temperature": s.temperature,
                "top_p": s.top_p, "seed": s.seed, "stream_options": {"include_usage": True}}
        if s.top_k:
            body["top_k"] = s.top_k
        if e.server == "vllm":
            body["return_token_ids"] = True
        return e.cfg.base_url + "/v1/completions", body

    def _parse(self, doc: dict, t: float) -> Chunk | None:
        if "choices" not in doc:  # llama-server native
            timings = doc.get("timings") or {}
            stop_type = str(doc.get("stop_type") or "")
            finish = ({"eos": "eos", "limit": "length"}.get(stop_type, stop_type) or "stop") if doc.get("stop") else None
            return Chunk(t, [int(x) for x in doc.get("tokens") or []], doc.get("content", ""),
                         timings.get("draft_n", 0 if timings else None), timings.get("draft_n_accepted", 0 if timings else None), finish)
        ch = (doc.get("choices") or [{}])[0]
        spec = ((doc.get("metrics") or {}).get("speculative_decoding") or {}) if isinstance(doc.get("metrics"), dict) else {}
        ids = ch.get("token_ids")
        text = ch.get("text", "")
        if ids is None and text:  # no ids from this server: the local tokenizer's reading of the text
            ids = self.engine.tokenizer.encode(text, add_special_tokens=False)
        fin = ch.get("finish_reason")
        return Chunk(t, [int(x) for x in ids or []], text, None, None, "eos" if fin == "stop" else fin, spec, token_ids=ch.get("token_ids") is not None)

    def _reader(self, url: str, body: dict, out: queue.Queue, stop: threading.Event, clock: Callable[[], float]) -> None:
        e = self.engine
        lock = server_lock(e.cfg.base_url)
        with lock:
            before = self._counters()
            out.put(("start", clock()))
            try:
                resp = e.open(url, body, timeout=e.cfg.timeout_s)
            except Exception as exc:
                out.put(("error", exc))
                return
            finished = False
            try:
                with resp:
                    for raw in resp:
                        if stop.is_set():
                            return
                        line = raw.decode("utf-8", "replace").strip()
                        if not line.startswith("data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == "[DONE]":
                            finished = True
                            break
                        try:
                            doc = json.loads(payload)
                        except json.JSONDecodeError:
                            out.put(("error", EngineError(f"engine {e.name}: the server sent a chunk that is not JSON: {payload[:120]!r}",
                                                          fix="check that base_url points at an OpenAI-compatible server")))
                            return
                        if isinstance(doc, dict) and "error" in doc:
                            err = doc["error"]
                            out.put(("error", EngineError(f"engine {e.name}: the server reported an error mid-stream: "
                                                          f"{err.get('message', err) if isinstance(err, dict) else err}",
                                                          fix="see the server's log")))
                            return
                        chunk = self._parse(doc, clock())
                        finished = finished or chunk is not None and chunk.finish is not None
                        out.put(("chunk", chunk))
                if not finished:  # the connection closed cleanly but the server never said it was done
                    raise ConnectionError("the stream ended without its final chunk")
            except Exception as exc:  # the connection dropped mid-stream
                out.put(("error", EngineError(f"engine {e.name}: the stream from {url} broke off: {type(exc).__name__}: {exc}",
                                              fix="is the server still running? See its log")))
                return
            out.put(("counters", (before, self._counters())))
        out.put(("end", None))

    def _counters(self) -> tuple[float, float, float] | None:
        """(drafts, draft tokens, accepted) from the server's Prometheus counters, when it has them."""
        e = self.engine
        names = SPEC_COUNTERS.get(e.server)
        if not e.cfg.metrics_url or names is None:
            return None
        try:
            samples = e.read_metrics()
        except Exception:
            return None
        vals = [metric_sum(samples, n) for n in names]
        return None if any(v is None for v in vals) else (vals[0] or 0.0, vals[1] or 0.0, vals[2] or 0.0)

    # --- the lane --------------------------------------------------------------------------------
    def run(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool]) -> Iterator[StepEvent]:
        if not prompt_ids:
            raise ValueError("empty prompt")
        s = sampling.validated()
        url, body = self._request(prompt_ids, s)
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        th = threading.Thread(target=self._reader, args=(url, body, out, stop, rec.clock), name=f"remote-{self.engine.name}", daemon=True)
        th.start()
        t_last: float | None = None
        pending: list[int] = []  # tokens of the open verification step
        open_step: tuple[int, int, float] | None = None  # (drafted, accepted, t_start)
        prev = (0, 0)
        per_chunk = False
        spec: dict = {}
        chunk_accepted = 0  # vLLM: accepted drafts seen in multi-token chunks
        counters = None
        finish = None
        try:
            while True:
                kind, val = out.get()
                if kind == "start":
                    t_last = val
                    continue
                if kind == "error":
                    raise val
                if kind == "counters":
                    counters = val
                    continue
                if kind == "end":
                    break
                c: Chunk = val
                assert t_last is not None
                spec = c.spec or spec
                finish = c.finish or finish
                if c.draft_n is not None:
                    per_chunk = True
                if not c.ids or rec.done:  # after the lane's last token: read on for the final chunk's metrics
                    continue
                if self.engine.server == "vllm" and c.token_ids:
                    # one chunk per engine step: n tokens = n − 1 accepted drafts and the target's token
                    n, dt = len(c.ids), c.t - t_last
                    t_last = c.t
                    if rec.steps == 0 or n == 1:
                        yield rec.step(c.ids[:1], kind="baseline", t_verify_s=dt, t_wall_s=dt)
                        for tok in c.ids[1:]:  # a coalesced first chunk: the rest as one-token steps
                            if not rec.done:
                                yield rec.step([tok], kind="baseline", t_verify_s=0.0, t_wall_s=0.0)
                    else:
                        chunk_accepted += n - 1
                        k = max(self.engine.spec_k or 0, n - 1)
                        yield rec.step(c.ids, accepted=n - 1, drafted_count=k, t_verify_s=dt, t_wall_s=dt)
                elif not per_chunk or self.engine.server != "llama.cpp":
                    # tokens only: one step per chunk (an engine iteration)
                    yield rec.step(c.ids, kind="reference" if rec.steps else "baseline", t_verify_s=c.t - t_last, t_wall_s=c.t - t_last)
                    t_last = c.t
                else:
                    for tok in c.ids:
                        dn, da = (c.draft_n or 0), (c.draft_accepted or 0)
                        if open_step is not None:
                            pending.append(tok)
                            k, a, t0 = open_step
                            if len(pending) == a + 1:
                                yield rec.step(pending, accepted=a, drafted_count=k, t_verify_s=t0, t_wall_s=t0)
                                open_step, pending = None, []
                            continue
                        if (dn, da) != prev and dn > prev[0]:
                            k, a = dn - prev[0], da - prev[1]
                            prev = (dn, da)
                            dt = c.t - t_last
                            t_last = c.t
                            if a == 0:
                                yield rec.step([tok], accepted=0, drafted_count=k, t_verify_s=dt, t_wall_s=dt)
                            else:
                                open_step, pending = (k, a, dt), [tok]
                        else:
                            dt = c.t - t_last
                            t_last = c.t
                            yield rec.step([tok], kind="baseline", t_verify_s=dt, t_wall_s=dt)
                if cancelled():
                    rec.stop("cancelled")
                    break
            if open_step is not None and pending and not rec.done:  # the stream ended inside a step (limit or EOS)
                k, a, t0 = open_step
                yield rec.step(pending, accepted=len(pending), drafted_count=k, has_target=False, t_verify_s=t0, t_wall_s=t0)
        finally:
            stop.set()
        if finish == "eos" and rec.stop_reason == "length" and not rec.done:
            rec.stop("eos")  # the server stopped at its EOS without sending it
        self._counts(rec, per_chunk, spec, counters, chunk_accepted)

    def _counts(self, rec: LaneRecorder, per_chunk: bool, spec: dict, counters, chunk_accepted: int = 0) -> None:
        if per_chunk and rec.acc.drafted:
            return  # every step's counts known
        if spec.get("num_draft_tokens") is not None:
            if isinstance(spec.get("num_spec_tokens"), int):
                self.engine.spec_k = spec["num_spec_tokens"]  # k of the next requests' steps
            drafted, accepted = int(spec["num_draft_tokens"]), int(spec.get("num_accepted_draft_tokens", 0))
            rec.override(drafted=drafted, accepted=accepted, counts_source="engine")
            rec.note(VLLM_STEPS_NOTE)
            if self.engine.server == "vllm" and chunk_accepted != accepted and rec.stop_reason != "length":
                rec.note(f"the streamed chunks held {chunk_accepted} accepted drafts, the server counted {accepted}: "
                         "chunks were coalesced (--stream-interval) or split, so the per-step view is approximate")
            return
        if counters is not None and counters[0] is not None and counters[1] is not None:  # (before, after)
            (_, d0, a0), (_, d1, a1) = counters
            if d1 > d0:
                rec.override(drafted=int(d1 - d0), accepted=int(a1 - a0), counts_source="engine")
                rec.note("drafted/accepted from the server's Prometheus counters, read before and after the request")
                return
        if not rec.acc.drafted:
            rec.note(NO_COUNTS_NOTE)

