"""RemoteRunner (app.runners.openai_stream) against small in-process servers that stream what a real server cannot be
made to: token ids past the tokenizer's vocabulary, an endless line, a stall, an echoed key, and vLLM's per-step
chunks without a vLLM (tests/engines/test_vllm.py runs the real one). The tokenizer is SmolLM2's, read from its GGUF.
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from app.core.accounting import LaneRecorder
from app.core.errors import EngineError
from app.core.events import StepEvent
from app.core.setups import Sampling
from app.engines.registry import load_manifest, open_engine
from app.runners.openai_stream import NO_COUNTS_NOTE, VLLM_STEPS_NOTE, RemoteRunner
from tests.engines.servers import FakeServer, fake_llama_routes, remote_lane, remote_manifest, send_json, send_sse

pytest.importorskip("llama_cpp", reason="the remote tests read SmolLM2's tokenizer from its GGUF through llama-cpp-python")

PROMPT = "Say hello."
VOCAB = 49152  # SmolLM2's
KEY = "s3cret-test-key"


def manifest(tmp_path, name: str, url: str, **openai):
    return remote_manifest(tmp_path, name, url, "llamacpp-smollm2-135m-instruct", **openai)


def llama_chunk(tok: int, stop: bool = False) -> dict:
    return {"tokens": [tok], "content": "x", "stop": stop, "timings": {"draft_n": 0, "draft_n_accepted": 0},
            **({"stop_type": "limit"} if stop else {})}


def partial_lane(eng, max_new: int = 40, logs: list | None = None):
    """Run a lane by hand: (the StepEvents it yielded, the error that ended it, or None); its LogEvents go to `logs`."""
    ids = eng.encode_prompt(PROMPT)
    rec = LaneRecorder("L", "remote", "p", 0, max_new, eng.eos_ids, eng.detokenizer(ids))
    got: list[StepEvent] = []
    try:
        for ev in RemoteRunner(eng).run(rec, ids, Sampling(max_new_tokens=max_new), lambda: False):
            if isinstance(ev, StepEvent):
                got.append(ev)
            elif logs is not None:
                logs.append(ev)
    except EngineError as e:
        return got, e
    return got, None


# --- token ids ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("server", ["llama.cpp", "vllm"])
def test_a_token_id_past_the_vocabulary_fails_the_lane_before_anything_decodes_it(tmp_path, server):
    """llama.cpp's detokenizer would abort the whole worker (std::out_of_range) on such an id."""
    if server == "llama.cpp":
        routes = fake_llama_routes(lambda h: send_sse(h, [llama_chunk(1000), llama_chunk(VOCAB + 7)]))
    else:
        routes = {"GET /v1/models": lambda h: send_json(h, {"data": [{"id": "smollm2", "owned_by": "vllm"}]}),
                  "POST /v1/completions": lambda h: send_sse(h, [{"choices": [{"text": "x", "token_ids": [1000]}]},
                                                                 {"choices": [{"text": "y", "token_ids": [VOCAB + 7, 5]}]}], done=True)}
    with FakeServer(routes) as srv:
        eng = open_engine(load_manifest(manifest(tmp_path, "badids", srv.url, server=server)))
        got, err = partial_lane(eng)
    assert [e.emitted_ids for e in got] == [(1000,)]  # what came before the bad id is kept
    assert err is not None and type(err) is EngineError
    assert str(err) == (f"engine badids: the server sent token id {VOCAB + 7}, outside the vocabulary of the local tokenizer ({VOCAB} ids, "
                        "from engine 'llamacpp-smollm2-135m-instruct'): the [openai] tokenizer does not match the served model\n"
                        f"  fix: set tokenizer in the [openai] table of {tmp_path / 'badids.toml'} to a local engine with the served "
                        "model's tokenizer (python -m app engines)")


# --- bounded reads, stalls ---------------------------------------------------------------------------------------------
def test_an_endless_line_is_cut_at_one_mib(tmp_path):
    def endless(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.write(b"data: {\"tokens\": [")
        for _ in range(3):  # 3 MiB without a line end (the server closes after it, so the old reader ended too)
            h.wfile.write(b"1," * (1 << 19))

    with FakeServer(fake_llama_routes(endless)) as srv:
        eng = open_engine(load_manifest(manifest(tmp_path, "endless", srv.url)))
        got, err = partial_lane(eng)
    assert not got and err is not None
    assert str(err).startswith(f"engine endless: {srv.url}/completion sent a streamed line longer than 1 MiB, the most SpecDeck reads "
                               "of one line")


def test_a_stalled_stream_names_timeout_s_and_the_manifest(tmp_path):
    gate = threading.Event()

    def stall(h):  # one token, then nothing
        send_sse(h, [llama_chunk(1000)])
        gate.wait(30)

    def silent(h):  # accepts the request and never answers
        gate.wait(30)

    try:
        with FakeServer(fake_llama_routes(stall)) as srv:
            eng = open_engine(load_manifest(manifest(tmp_path, "stalled", srv.url, timeout_s=1.0)))
            t0 = time.monotonic()
            got, err = partial_lane(eng)
            assert time.monotonic() - t0 < 10
        assert [e.emitted_ids for e in got] == [(1000,)] and err is not None
        assert re.fullmatch(rf"engine stalled: the stream from {srv.url}/completion stalled: nothing came for 1\.\d s \(timeout_s = 1\)\n"
                            r"  fix: if the server is just slow \(a long prompt, a busy or cold server\), raise timeout_s in the \[openai\] "
                            rf"table of {re.escape(str(tmp_path / 'stalled.toml'))}; else see the server's log", str(err)), str(err)
        with FakeServer(fake_llama_routes(silent)) as srv:
            eng = open_engine(load_manifest(manifest(tmp_path, "silent", srv.url, timeout_s=1.0)))
            got, err = partial_lane(eng)
        assert not got and err is not None
        assert f"engine silent: {srv.url}/completion did not answer within 1 s (timeout_s = 1)" in str(err)
        assert f"raise timeout_s in the [openai] table of {tmp_path / 'silent.toml'}" in str(err)
    finally:
        gate.set()


def test_a_lane_waiting_on_its_server_says_so_while_it_waits(tmp_path, monkeypatch):
    """While nothing comes, the lane says every WAIT_NOTICE_S how long it has waited and names timeout_s and the
    manifest (the window shows it on the lane, bench prints it) — before the stall ends the lane."""
    import app.runners.openai_stream as stream

    monkeypatch.setattr(stream, "WAIT_NOTICE_S", 0.3)
    gate = threading.Event()

    def stall(h):
        send_sse(h, [llama_chunk(1000)])
        gate.wait(30)

    try:
        with FakeServer(fake_llama_routes(stall)) as srv:
            eng = open_engine(load_manifest(manifest(tmp_path, "slowpoke", srv.url, timeout_s=2.0)))
            logs: list = []
            got, err = partial_lane(eng, logs=logs)
    finally:
        gate.set()
    assert [e.emitted_ids for e in got] == [(1000,)] and err is not None and "stalled" in str(err)
    assert len(logs) >= 2 and all(x.level == "warning" and x.extra["lane"] == "L" for x in logs)
    assert re.fullmatch(rf"engine slowpoke: nothing from the server for \d+ s; SpecDeck gives up at timeout_s = 2 \(the \[openai\] "
                        rf"table of {re.escape(str(tmp_path / 'slowpoke.toml'))}\)", logs[-1].message), logs[-1].message
    assert logs[-1].extra["waiting_s"] >= 1


# --- the key in server text --------------------------------------------------------------------------------------------
def test_a_key_echoed_mid_stream_is_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_KEY", KEY)

    def echo_error(h):
        send_sse(h, [llama_chunk(1000), {"error": {"message": f"bad header {h.headers['Authorization']}"}}])

    def echo_garbage(h):
        send_sse(h, [f"not json {h.headers['Authorization']}"])

    for name, answer, said in (("midstream", echo_error, "the server reported an error mid-stream: bad header Bearer ***"),
                               ("garbage", echo_garbage, "the server sent a chunk that is not JSON: 'not json Bearer ***'")):
        with FakeServer(fake_llama_routes(answer)) as srv:
            eng = open_engine(load_manifest(manifest(tmp_path, name, srv.url, api_key_env="TEST_KEY")))
            _, err = partial_lane(eng)
        assert err is not None and said in str(err) and KEY not in str(err)


# --- steps by server kind (the runner's three readings) ----------------------------------------------------------------
def test_vllm_chunks_are_steps_and_its_final_metrics_the_counts(tmp_path):
    """One chunk per engine step: n tokens = n − 1 accepted drafts and the target token; totals from the final chunk."""
    chunks = [[1000], [1001, 1002, 1003], [1004], [1005, 1006]]
    docs = [{"choices": [{"text": "t", "token_ids": c, "finish_reason": None}]} for c in chunks]
    docs.append({"choices": [{"text": "", "token_ids": [], "finish_reason": "length"}],
                 "metrics": {"speculative_decoding": {"num_draft_tokens": 6, "num_accepted_draft_tokens": 3, "num_spec_tokens": 2}}})
    routes = {"GET /v1/models": lambda h: send_json(h, {"data": [{"id": "smollm2", "owned_by": "vllm"}]}),
              "POST /v1/completions": lambda h: send_sse(h, docs, done=True)}
    with FakeServer(routes) as srv:
        eng = open_engine(load_manifest(manifest(tmp_path, "fakevllm", srv.url, server="vllm")))
        steps, st = remote_lane(eng, PROMPT, 7)
    assert [(e.emitted_ids, e.accepted_count, e.target_kind) for e in steps] == [
        ((1000,), 0, "baseline"), ((1001, 1002, 1003), 2, "bonus"), ((1004,), 0, "baseline"), ((1005, 1006), 1, "bonus")]
    assert (st.drafted, st.accepted, st.counts_source) == (6, 3, "engine") and VLLM_STEPS_NOTE in st.notes
    assert eng.spec_k == 2


def test_a_plain_openai_server_gives_token_only_steps(tmp_path):
    """No ids from the server: the local tokenizer reads each chunk's text; one step per chunk, counts unavailable."""
    docs = [{"choices": [{"text": t, "finish_reason": None}]} for t in (" Hello", " world", ",")]
    docs.append({"choices": [{"text": " friend", "finish_reason": "length"}]})
    routes = {"GET /v1/models": lambda h: send_json(h, {"data": [{"id": "smollm2", "owned_by": "someone"}]}),
              "POST /v1/completions": lambda h: send_sse(h, docs, done=True)}
    with FakeServer(routes) as srv:
        eng = open_engine(load_manifest(manifest(tmp_path, "plainapi", srv.url)))
        assert eng.server == "openai"
        steps, st = remote_lane(eng, PROMPT, 4)
    assert st.output_text == " Hello world, friend" and len(steps) == 4
    assert steps[0].target_kind == "baseline" and st.drafted == 0 and NO_COUNTS_NOTE in st.notes
