"""The lane runner for remote engines (app.engines.openai_api): one streamed completion per lane, its chunks turned
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
* **other servers** (`/v1/completions`): each chunk is one step of tokens only ("library"); counts from the
  Prometheus deltas where the server has known counters, else unavailable (said in the lane's notes).

Times: a step ends when its first chunk arrives (the server sends a step's tokens together); step 0 runs from
the request to the first token (prefill, network included).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from app.core.accounting import LaneRecorder, StepFacts
from app.core.errors import EngineError, SetupError
from app.core.events import LogEvent, StepEvent
from app.core.setups import Sampling
from app.engines.openai_api import MAX_LINE_BYTES, RemoteEngine, server_lock
from app.telemetry.prometheus import SPEC_COUNTERS, metric_sum

#: while a request waits on its server, the lane says so this often (seconds), naming timeout_s
WAIT_NOTICE_S = 10.0

__all__ = ["RemoteRunner", "Chunk", "NO_COUNTS_NOTE", "VLLM_STEPS_NOTE", "WAIT_NOTICE_S"]

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
            raise SetupError(f"{engine.name} is not a remote engine (backend = \"openai\")",
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
            return Chunk(t, self._checked(doc.get("tokens") or []), doc.get("content", ""),
                         timings.get("draft_n", 0 if timings else None), timings.get("draft_n_accepted", 0 if timings else None), finish)
        ch = (doc.get("choices") or [{}])[0]
        spec = ((doc.get("metrics") or {}).get("speculative_decoding") or {}) if isinstance(doc.get("metrics"), dict) else {}
        ids = ch.get("token_ids")
        text = ch.get("text", "")
        if ids is None and text:  # no ids from this server: the local tokenizer's reading of the text
            ids = self.engine.tokenizer.encode(text, add_special_tokens=False)
        fin = ch.get("finish_reason")
        return Chunk(t, self._checked(ids or []), text, None, None, "eos" if fin == "stop" else fin, spec, token_ids=ch.get("token_ids") is not None)

    def _checked(self, ids: list) -> list[int]:
        """`ids` from the server, each checked against the local tokenizer's vocabulary before anything decodes it
        (llama.cpp's detokenizer aborts the process on an id past its vocabulary).

        Raises:
            EngineError: an id that is not an integer in [0, vocabulary size).
        """
        e = self.engine
        n = e.vocab_size
        for x in ids:
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < n:
                raise e.failure(f"engine {e.name}: the server sent token id {x!r}, outside the vocabulary of the local tokenizer "
                                f"({n} ids, from engine {e.cfg.tokenizer!r}): the [openai] tokenizer does not match the served model",
                                fix=f"set tokenizer in the [openai] table of {e.manifest.where} to a local engine with the served model's "
                                    "tokenizer (python -m app engines)", cls=EngineError)
        return list(ids)

    def _reader(self, url: str, body: dict, out: queue.Queue, stop: threading.Event, clock: Callable[[], float]) -> None:
        """The reader thread: under the server's lock, the counters before, the stream's chunks, the counters after
        (each put on `out` as ("start" | "chunk" | "counters" | "error" | "end", value))."""
        e = self.engine
        with server_lock(e.cfg.base_url):
            before = self._counters()
            out.put(("start", clock()))
            try:
                if not self._stream(url, body, out, stop, clock):
                    return  # cancelled
            except EngineError as exc:
                out.put(("error", exc))
                return
            except Exception as exc:  # the connection dropped mid-stream
                out.put(("error", e.failure(f"engine {e.name}: the stream from {url} broke off: {type(exc).__name__}: {exc}",
                                            fix="is the server still running? See its log")))
                return
            out.put(("counters", (before, self._counters())))
        out.put(("end", None))

    def _stream(self, url: str, body: dict, out: queue.Queue, stop: threading.Event, clock: Callable[[], float]) -> bool:
        """Stream the request's chunks onto `out`; False when stopped (the lane was cancelled or ended).

        Raises:
            EngineError: the server's error, a chunk that is not JSON, a bad token id, a stall past timeout_s, an
                oversized line; ConnectionError and other OSErrors: the connection broke off.
        """
        e = self.engine
        finished = False
        with e.open(url, body, timeout=e.cfg.timeout_s) as resp:
            for line in self._lines(resp, url):
                if stop.is_set():
                    return False
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return True
                try:
                    doc = json.loads(payload)
                except json.JSONDecodeError:
                    raise e.failure(f"engine {e.name}: the server sent a chunk that is not JSON: {payload[:120]!r}",
                                    fix="check that base_url points at an OpenAI-compatible server", cls=EngineError) from None
                if isinstance(doc, dict) and "error" in doc:
                    err = doc["error"]
                    raise e.failure(f"engine {e.name}: the server reported an error mid-stream: "
                                    f"{err.get('message', err) if isinstance(err, dict) else err}", fix="see the server's log", cls=EngineError)
                chunk = self._parse(doc, clock())
                finished = finished or chunk is not None and chunk.finish is not None
                out.put(("chunk", chunk))
        if not finished:  # the connection closed cleanly but the server never said it was done
            raise ConnectionError("the stream ended without its final chunk")
        return True

    def _lines(self, resp, url: str) -> Iterator[str]:
        """The stream's lines, decoded and stripped, each at most MAX_LINE_BYTES.

        Raises:
            EngineError: nothing came for timeout_s seconds (names the setting), or a line is longer than the cap.
        """
        e = self.engine
        t_last = time.monotonic()
        while True:
            try:
                raw = resp.readline(MAX_LINE_BYTES + 1)
            except TimeoutError:
                waited = time.monotonic() - t_last
                raise e.failure(f"engine {e.name}: the stream from {url} stalled: nothing came for {_secs(waited)} s "
                                f"(timeout_s = {e.cfg.timeout_s:g})",
                                fix=f"if the server is just slow (a long prompt, a busy or cold server), raise timeout_s in the "
                                    f"[openai] table of {e.manifest.where}; else see the server's log", cls=EngineError) from None
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise e.failure(f"engine {e.name}: {url} sent a streamed line longer than {MAX_LINE_BYTES >> 20} MiB, the most SpecDeck "
                                "reads of one line: not an OpenAI-compatible event stream", fix=f"check base_url in {e.manifest.where}")
            t_last = time.monotonic()
            yield raw.decode("utf-8", "replace").strip()

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
    def run(self, rec: LaneRecorder, prompt_ids: list[int], sampling: Sampling, cancelled: Callable[[], bool]) -> Iterator[StepEvent | LogEvent]:
        """The lane's steps as the stream arrives; its counts are settled after the stream ends (see the module
        docstring). While the request waits on the server, a warning every WAIT_NOTICE_S seconds says for how long and
        names timeout_s (LogEvent, extra {"lane", "waiting_s"}: the window shows it on the lane, bench prints it).

        Raises:
            ValueError: an empty prompt; EngineError (ServerUnreachable, HTTPFailure, …): the request or stream failed.
        """
        if not prompt_ids:
            raise ValueError("empty prompt")
        s = sampling.validated()
        for n in self.engine.notes:
            rec.note(n)
        url, body = self._request(prompt_ids, s)
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        th = threading.Thread(target=self._reader, args=(url, body, out, stop, rec.clock), name=f"remote-{self.engine.name}", daemon=True)
        th.start()
        st = _Read()
        try:
            for c in self._chunks(out, st):
                if isinstance(c, _Waiting):
                    yield self._waiting(rec, c.waited_s)
                    continue
                if not c.ids or rec.done:  # after the lane's last token: read on for the final chunk's metrics
                    continue
                yield from self._steps(rec, c, st)
                if cancelled():
                    rec.stop("cancelled")
                    break
            if st.open_step is not None and st.pending and not rec.done:  # the stream ended inside a step (limit or EOS)
                k, _, t0 = st.open_step
                yield rec.step(StepFacts(st.pending, accepted=len(st.pending), drafted_count=k, has_target=False, t_verify_s=t0, t_wall_s=t0))
        finally:
            stop.set()
        if st.finish == "eos" and rec.stop_reason == "length" and not rec.done:
            rec.stop("eos")  # the server stopped at its EOS without sending it
        self._counts(rec, st)

    def _waiting(self, rec: LaneRecorder, waited_s: float) -> LogEvent:
        """What the lane says while its request waits on the server: how long, and the setting that ends the wait."""
        e = self.engine
        return LogEvent("warning", f"engine {e.name}: nothing from the server for {waited_s:.0f} s; SpecDeck gives up at timeout_s = "
                        f"{e.cfg.timeout_s:g} (the [openai] table of {e.manifest.where})", {"lane": rec.lane_id, "waiting_s": round(waited_s)})

    @staticmethod
    def _chunks(out: queue.Queue, st: _Read, notice_s: float | None = None) -> Iterator[Chunk | _Waiting]:
        """The reader thread's chunks, in order; its start time, counters and per-request metrics go into `st`. While
        the request is out and nothing comes, a :class:`_Waiting` every `notice_s` seconds (default WAIT_NOTICE_S).

        Raises:
            EngineError: the reader's error."""
        notice_s = WAIT_NOTICE_S if notice_s is None else notice_s
        sent = None  # monotonic time the request went out (None: still waiting for the server's lock)
        last = time.monotonic()
        while True:
            try:
                kind, val = out.get(timeout=notice_s)
            except queue.Empty:
                if sent is not None:
                    yield _Waiting(time.monotonic() - last)
                continue
            if kind in ("start", "chunk"):
                last = time.monotonic()
                sent = sent or last
            if kind == "start":
                st.t_last = val
            elif kind == "error":
                raise val
            elif kind == "counters":
                st.counters = val
            elif kind == "end":
                return
            else:
                c: Chunk = val
                st.spec = c.spec or st.spec
                st.finish = c.finish or st.finish
                st.per_chunk = st.per_chunk or c.draft_n is not None
                yield c

    def _steps(self, rec: LaneRecorder, c: Chunk, st: _Read) -> Iterator[StepEvent]:
        """One chunk's steps, by what the server reports."""
        if self.engine.server == "vllm" and c.token_ids:
            yield from self._vllm_steps(rec, c, st)
        elif not st.per_chunk or self.engine.server != "llama.cpp":
            # tokens only: one step per chunk (an engine iteration)
            dt, st.t_last = c.t - st.t_last, c.t
            yield rec.step(StepFacts(c.ids, kind="library" if rec.steps else "baseline", t_verify_s=dt, t_wall_s=dt))
        else:
            yield from self._llamacpp_steps(rec, c, st)

    def _vllm_steps(self, rec: LaneRecorder, c: Chunk, st: _Read) -> Iterator[StepEvent]:
        """vLLM: one chunk per engine step, so n tokens = n − 1 accepted drafts and the target's token."""
        n, dt = len(c.ids), c.t - st.t_last
        st.t_last = c.t
        if rec.steps == 0 or n == 1:
            yield rec.step(StepFacts(c.ids[:1], kind="baseline", t_verify_s=dt, t_wall_s=dt))
            for tok in c.ids[1:]:  # a coalesced first chunk: the rest as one-token steps
                if not rec.done:
                    yield rec.step(StepFacts([tok], kind="baseline", t_verify_s=0.0, t_wall_s=0.0))
        else:
            st.chunk_accepted += n - 1
            k = max(self.engine.spec_k or 0, n - 1)
            yield rec.step(StepFacts(c.ids, accepted=n - 1, drafted_count=k, t_verify_s=dt, t_wall_s=dt))

    def _llamacpp_steps(self, rec: LaneRecorder, c: Chunk, st: _Read) -> Iterator[StepEvent]:
        """llama-server: a chunk whose cumulative draft counters grew opens a verification step (its token, then
        Δaccepted more tokens); other chunks are one-token steps."""
        dn, da = (c.draft_n or 0), (c.draft_accepted or 0)
        for tok in c.ids:
            if st.open_step is not None:
                st.pending.append(tok)
                k, a, t0 = st.open_step
                if len(st.pending) == a + 1:
                    yield rec.step(StepFacts(st.pending, accepted=a, drafted_count=k, t_verify_s=t0, t_wall_s=t0))
                    st.open_step, st.pending = None, []
                continue
            dt, st.t_last = c.t - st.t_last, c.t
            if (dn, da) != st.prev and dn > st.prev[0]:
                k, a = dn - st.prev[0], da - st.prev[1]
                st.prev = (dn, da)
                if a == 0:
                    yield rec.step(StepFacts([tok], accepted=0, drafted_count=k, t_verify_s=dt, t_wall_s=dt))
                else:
                    st.open_step, st.pending = (k, a, dt), [tok]
            else:
                yield rec.step(StepFacts([tok], kind="baseline", t_verify_s=dt, t_wall_s=dt))

    def _counts(self, rec: LaneRecorder, st: _Read) -> None:
        """The lane's drafted/accepted totals when its steps do not give them: the server's per-request metrics, else
        its Prometheus counters' deltas, else a note that they are unavailable."""
        if st.per_chunk and rec.acc.drafted:
            return  # every step's counts known
        spec, counters = st.spec, st.counters
        if spec.get("num_draft_tokens") is not None:
            if isinstance(spec.get("num_spec_tokens"), int):
                self.engine.spec_k = spec["num_spec_tokens"]  # k of the next requests' steps
            drafted, accepted = int(spec["num_draft_tokens"]), int(spec.get("num_accepted_draft_tokens", 0))
            rec.override(drafted=drafted, accepted=accepted, counts_source="engine")
            rec.note(VLLM_STEPS_NOTE)
            if self.engine.server == "vllm" and st.chunk_accepted != accepted and rec.stop_reason != "length":
                rec.note(f"the streamed chunks held {st.chunk_accepted} accepted drafts, the server counted {accepted}: "
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


@dataclass
class _Read:
    """What a lane has read of its stream so far, shared by the step builders of each server kind."""

    t_last: float = 0.0  # lane clock of the last step's end (the request's start, at first)
    per_chunk: bool = False  # llama-server's per-token draft counters seen
    prev: tuple[int, int] = (0, 0)  # llama-server: cumulative (draft_n, draft_n_accepted) at the last opened step
    open_step: tuple[int, int, float] | None = None  # llama-server: (drafted, accepted, t) of the step being filled
    pending: list[int] = field(default_factory=list)  # its tokens so far
    chunk_accepted: int = 0  # vLLM: accepted drafts seen in multi-token chunks
    spec: dict = field(default_factory=dict)  # the final chunk's per-request speculative metrics
    counters: Any = None  # (before, after) Prometheus counters, when read
    finish: str | None = None


@dataclass(frozen=True)
class _Waiting:
    """Nothing came from the server for `waited_s` seconds (the request is out)."""

    waited_s: float


def _secs(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"
