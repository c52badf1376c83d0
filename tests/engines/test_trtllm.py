"""TensorRT-LLM backend: the engine package (app/engines/trtllm/: capability, config, engine) and its lane runners
(app/runners/trtllm_generate.py), driven through the shared accounting (app.core.accounting: LaneRecorder + drive) or
the scheduler's `lane_events`.

TensorRT-LLM cannot be installed here (Linux + CUDA driver + Python 3.10/3.12 only; this machine has Python 3.11
and no CUDA), so almost everything runs
against ``tests/engines/fake_tensorrt_llm``: a FAKE ``tensorrt_llm`` package that mirrors TensorRT-LLM 1.2's
documented API — the LLM API reference (``LLM``, ``SamplingParams``, ``llmapi.DraftTargetDecodingConfig /
NGramDecodingConfig / Eagle3DecodingConfig / MTPDecodingConfig / KvCacheConfig``), ``tensorrt_llm/executor/
result.py`` (``GenerationResult`` / ``CompletionOutput`` streaming fields, ``request_perf_metrics``) and
``tensorrt_llm/runtime/model_runner_cpp.py`` (``ModelRunnerCpp.from_dir`` / ``generate``). Tests marked
``trtllm`` need the real library and are skipped without it.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from app.core.accounting import LaneRecorder, drive
from app.core.errors import EngineError
from app.core.events import LaneDone, LaneStarted, RunError, StepEvent
from app.core.metrics import LaneStats
from app.core.setups import Sampling
from app.engines import trtllm
from app.engines.manifest import EngineManifest
from app.engines.registry import REPO_ENGINES, load_manifest
from app.runners import trtllm_generate as lanes

FAKE = Path(__file__).parent / "fake_tensorrt_llm"
APP = Path(__file__).resolve().parents[2] / "app"
# the submodules themselves (the package attribute `capability` is the function, as before the split)
CAPABILITY = importlib.import_module("app.engines.trtllm.capability")
ENGINE = importlib.import_module("app.engines.trtllm.engine")


# --- helpers ----------------------------------------------------------------------------------------


class ToyTokenizer:
    """A tiny HF-like tokenizer over the fake models' 50-token vocabulary (0 pad, 1 bos, 2 eos)."""

    eos_token_id = 2
    pad_token_id = 0
    chat_template = None

    def __len__(self) -> int:
        return 50

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [3 + ord(c) % 47 for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + (i - 3) % 26) for i in ids if not (skip_special_tokens and i < 3))


def _manifest(tmp_path: Path, name: str, trt: dict, **source) -> EngineManifest:
    return EngineManifest(
        name=name,
        path=tmp_path / f"{name}.toml",
        backend="trtllm",
        source_kind="trtllm",
        source=tuple(source.values()),
        device="cuda",
        dtype="bfloat16",
        extra={"trtllm": trt, **source},
    )


def _lane(
    eng, sampling: Sampling, *, lane_id: str = "lane", setup: str = "trtllm", prompt_id: str = "prompt", repeat: int = 0,
    cancelled=lambda: False, prompt=None,
):
    """The lane's events as the scheduler produces them: runner_for(engine) driven with a LaneRecorder."""
    prompt = list(PROMPT if prompt is None else prompt)
    rec = LaneRecorder(lane_id, setup, prompt_id, repeat, sampling.max_new_tokens, eng.eos_ids, eng.detokenizer(prompt))
    return drive(lanes.runner_for(eng), rec, prompt, sampling, cancelled)


def _drain(gen) -> tuple[list[StepEvent], LaneStats, LaneDone]:
    evs = list(gen)
    done = evs[-1]
    assert isinstance(done, LaneDone)
    steps = evs[:-1]
    assert all(isinstance(e, StepEvent) for e in steps)
    return steps, done.stats, done


@pytest.fixture
def fake_trt(monkeypatch):
    """Put the fake ``tensorrt_llm`` on sys.path, report TensorRT-LLM usable, and reset the toy models."""
    for k in [k for k in sys.modules if k == "tensorrt_llm" or k.startswith("tensorrt_llm.")]:
        monkeypatch.delitem(sys.modules, k)
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.setattr(ENGINE, "capability", lambda: (True, ""))  # where the engine and load_engine look it up
    import tensorrt_llm
    from tensorrt_llm import _toy

    monkeypatch.setattr(_toy, "EOS_AT", None)
    monkeypatch.setattr(_toy, "PERF_METRICS", "zeros")  # what 1.2.x reports on the PyTorch backend
    monkeypatch.setattr(_toy, "STREAM_K", 4)
    monkeypatch.setattr(_toy, "PERF_TOTALS", None)
    monkeypatch.setattr(_toy, "MAX_SEQ_LEN", None)
    monkeypatch.setattr(_toy, "MAX_INPUT_LEN", 1024)
    tensorrt_llm.LLM.instances.clear()
    tensorrt_llm.runtime.ModelRunnerCpp.instances.clear()
    yield tensorrt_llm
    for k in [k for k in sys.modules if k == "tensorrt_llm" or k.startswith("tensorrt_llm.")]:
        del sys.modules[k]  # so find_spec no longer sees the fake


PROMPT = [1, 10, 20, 30]


# --- manifests --------------------------------------------------------------------------------------


def test_example_manifests_parse():
    """Every engines/trtllm-*.toml loads through the registry and validates; together they cover each kind."""
    kinds = set()
    paths = sorted(REPO_ENGINES.glob("trtllm-*.toml"))
    assert paths
    for p in paths:
        m = load_manifest(p)
        assert m.backend == "trtllm" and m.source_kind == "trtllm"
        c = trtllm.parse_config(m)
        kinds.add((c.api, c.kind))
        if c.api == "runner":
            assert c.tokenizer_dir and c.engine_dir and c.max_draft_len >= 1
        if c.kind != "none":
            assert c.max_draft_len >= 1
    assert kinds >= {("llm", "draft_target"), ("llm", "ngram"), ("llm", "eagle3"), ("llm", "mtp")}
    assert kinds >= {("runner", "draft_target"), ("runner", "redrafter"), ("runner", "medusa")}


@pytest.mark.parametrize(
    "trt, source, needle",
    [
        ({"decoding": "eagle3", "max_draft_len": 3}, {"model": "m"}, "needs speculative_model"),
        ({"decoding": "ngram"}, {"model": "m"}, "needs max_draft_len"),
        ({"decoding": "medusa"}, {"model": "m"}, "decoding must be one of"),
        ({"decodng": "ngram"}, {"model": "m"}, "did you mean 'decoding'"),
        (
            {"api": "runner", "mode": "draft_target", "max_draft_len": 4, "draft_engine_dir": "d"},
            {"engine_dir": "e"},
            "needs tokenizer_dir",
        ),
        (
            {"api": "runner", "mode": "draft_target", "max_draft_len": 4, "tokenizer_dir": "t"},
            {"engine_dir": "e"},
            "needs draft_engine_dir",
        ),
        ({"api": "runner", "mode": "medusa", "tokenizer_dir": "t"}, {"engine_dir": "e"}, "needs medusa_choices"),
        ({"api": "llm"}, {"engine_dir": "e"}, "needs [source] model"),
        ({"decoding": "ngram", "max_draft_len": "4"}, {"model": "m"}, "must be an integer"),
    ],
)
def test_parse_config_errors(tmp_path, trt, source, needle):
    """Bad [trtllm] tables are refused with the manifest's name and what to change."""
    with pytest.raises(EngineError) as ei:
        trtllm.parse_config(_manifest(tmp_path, "bad", trt, **source))
    assert needle in str(ei.value) and "bad.toml" in str(ei.value)


def test_parse_config_paths_and_defaults(tmp_path):
    """Relative folders resolve against the manifest's folder; HF ids stay ids; runner defaults are set."""
    (tmp_path / "draft-eng").mkdir()
    m = _manifest(
        tmp_path,
        "x",
        {"api": "runner", "mode": "draft_target", "max_draft_len": 4, "draft_engine_dir": "draft-eng", "tokenizer_dir": "./tok"},
        engine_dir="eng",
    )
    c = trtllm.parse_config(m)
    assert c.draft_engine_dir == str((tmp_path / "draft-eng").resolve())
    assert c.tokenizer_dir == str((tmp_path / "tok").resolve())
    assert c.engine_dir == "eng"  # not on disk and not ./-prefixed: left as written
    assert c.kv_cache_free_gpu_memory_fraction == 0.4 and c.device_ids == (0,) and not c.counts_only
    c2 = trtllm.parse_config(_manifest(tmp_path, "y", {"decoding": "mtp", "num_nextn_predict_layers": 3}, model="org/model"))
    assert c2.model == "org/model" and c2.max_draft_len == 3 and c2.counts_only


# --- capability ---------------------------------------------------------------------------------------


def test_capability_here_says_not_installed():
    """The real check on this machine (no tensorrt_llm): not usable, says why and how to install."""
    ok, why = trtllm.capability()
    assert not ok and why.startswith("not installed") and "make trtllm-env" in why and "3.10/3.12" in why
    from app.engines.status import backend_status

    assert backend_status("trtllm") == (False, why)


@pytest.mark.parametrize(
    "spec, version, py, system, cuda, expect",
    [
        (None, None, (3, 12), "Linux", True, "not installed in"),
        (None, None, (3, 11), "Linux", True, "not installed in"),
        (object(), "1.2.0", (3, 11), "Linux", True, "wrong Python 3.11 (TensorRT-LLM wheels exist for 3.10 and 3.12)"),
        (object(), "0.21.0", (3, 12), "Linux", True, "tensorrt_llm 0.21.0 is too old"),
        (object(), "1.2.0rc5", (3, 12), "Windows", True, "TensorRT-LLM needs Linux (this is Windows)"),
        (object(), "1.2.0", (3, 10), "Linux", False, "no CUDA driver (libcuda.so.1 not found)"),
        (object(), "1.3.0", (3, 12), "Linux", True, ""),
    ],
)
def test_capability_reasons(monkeypatch, spec, version, py, system, cuda, expect):
    """Each reason, with find_spec / the distribution version / Python / OS / libmpi / libcuda monkeypatched."""
    monkeypatch.setattr(CAPABILITY, "_find_spec", lambda name: spec)
    monkeypatch.setattr(CAPABILITY, "_dist_version", lambda name: version)
    monkeypatch.setattr(CAPABILITY, "_python_version", lambda: py)
    monkeypatch.setattr(CAPABILITY, "_system", lambda: system)
    monkeypatch.setattr(CAPABILITY, "_load_cuda_driver", lambda: cuda)
    monkeypatch.setattr(CAPABILITY, "_load_mpi", lambda: True)
    monkeypatch.setattr(CAPABILITY, "_requirement_mismatch", lambda: None)
    ok, why = trtllm.capability()
    assert ok == (expect == "")
    assert why.startswith(expect) if expect else why == ""
    if spec is None:
        assert "make trtllm-env" in why and ("this is Python 3.11" in why) == (py == (3, 11))


@pytest.mark.parametrize(
    "installed, requires, mpi, expect",
    [
        ({"torch": "2.13.0", "transformers": "5.23.0", "tensorrt": "10.14.1"},
         ["torch<=2.10.0a0,>=2.9.1", "transformers==4.57.3", "tensorrt~=10.14.1"], True, "torch 2.13.0 is installed but tensorrt_llm needs torch"),
        ({"torch": "2.9.1", "transformers": "5.23.0", "tensorrt": "10.14.1"},
         ["torch<=2.10.0a0,>=2.9.1", "transformers==4.57.3", "tensorrt~=10.14.1"], True, "transformers 5.23.0 is installed"),
        ({"torch": "2.9.1", "transformers": "4.57.3"}, ["torch<=2.10.0a0,>=2.9.1", "transformers==4.57.3", "tensorrt~=10.14.1"], True,
         "tensorrt is not installed"),
        ({"torch": "2.9.1+cu130", "transformers": "4.57.3", "tensorrt": "10.14.1.48"},
         ["torch<=2.10.0a0,>=2.9.1", "transformers==4.57.3", "tensorrt~=10.14.1", "mpi4py", "triton==3.5.1; sys_platform == 'win32'"], False,
         "no MPI library"),
        ({"torch": "2.9.1+cu130", "transformers": "4.57.3", "tensorrt": "10.14.1.48"},
         ["torch<=2.10.0a0,>=2.9.1", "transformers==4.57.3", "tensorrt~=10.14.1"], True, ""),
    ],
)
def test_capability_checks_the_pins_and_mpi(monkeypatch, installed, requires, mpi, expect):
    """Installed beside SpecDeck's torch 2.13 / transformers 5, TensorRT-LLM 1.2 (torch <=2.10.0a0, transformers
    ==4.57.3) is refused with the reason, before any import; likewise without the MPI library mpi4py needs.
    (Distribution metadata, libmpi and libcuda are monkeypatched: TensorRT-LLM cannot be installed here.)"""
    versions = {"tensorrt_llm": "1.2.0", **installed}
    monkeypatch.setattr(CAPABILITY, "_find_spec", lambda name: object())
    monkeypatch.setattr(CAPABILITY, "_dist_version", lambda name: versions.get(name))
    monkeypatch.setattr(CAPABILITY.md, "requires", lambda name: requires)
    monkeypatch.setattr(CAPABILITY, "_python_version", lambda: (3, 12))
    monkeypatch.setattr(CAPABILITY, "_system", lambda: "Linux")
    monkeypatch.setattr(CAPABILITY, "_load_mpi", lambda: mpi)
    monkeypatch.setattr(CAPABILITY, "_load_cuda_driver", lambda: True)
    ok, why = trtllm.capability()
    assert ok == (expect == "")
    assert why.startswith(expect) if expect else why == ""


def test_load_engine_unusable_raises(tmp_path):
    """load_engine on this machine raises EngineError carrying the capability reason and the install fix."""
    m = _manifest(tmp_path, "e", {"decoding": "none"}, model="org/model")
    with pytest.raises(EngineError) as ei:
        trtllm.load_engine(m)
    assert "not installed" in str(ei.value) and "fix:" in str(ei.value) and "make trtllm-env" in str(ei.value)


def test_cpu_device_refused(tmp_path, fake_trt):
    """TensorRT-LLM is CUDA only: --device cpu is refused with the fix."""
    m = _manifest(tmp_path, "e", {"decoding": "none"}, model="org/model")
    with pytest.raises(EngineError, match="CUDA GPUs only"):
        trtllm.load_engine(m, device="cpu", tokenizer=ToyTokenizer())


# --- LLM API objects ------------------------------------------------------------------------------------


def test_build_speculative_config_each_kind(tmp_path, fake_trt):
    """Against the fake llmapi (TensorRT-LLM 1.2 LLM API reference field names; strict like pydantic)."""
    llmapi = fake_trt.llmapi

    def cfg(trt):
        return trtllm.build_speculative_config(trtllm.parse_config(_manifest(tmp_path, "e", trt, model="org/model")), llmapi)

    assert cfg({"decoding": "none"}) is None
    dt = cfg({"decoding": "draft_target", "max_draft_len": 4, "speculative_model": "org/draft"})
    assert type(dt) is llmapi.DraftTargetDecodingConfig and dt.max_draft_len == 4 and dt.speculative_model == "org/draft"
    ng = cfg({"decoding": "ngram", "max_draft_len": 5, "max_matching_ngram_size": 3})
    assert type(ng) is llmapi.NGramDecodingConfig and (ng.max_draft_len, ng.max_matching_ngram_size, ng.is_keep_all) == (5, 3, True)
    e3 = cfg({"decoding": "eagle3", "max_draft_len": 3, "speculative_model": "org/eagle3", "eagle3_one_model": False})
    # 1.2.0 has no Eagle3DecodingConfig: EAGLE-3 is EagleDecodingConfig with eagle3_one_model
    assert not hasattr(llmapi, "Eagle3DecodingConfig")
    assert type(e3) is llmapi.EagleDecodingConfig and (e3.max_draft_len, e3.speculative_model, e3.eagle3_one_model) == (3, "org/eagle3", False)
    assert e3.allow_advanced_sampling is False
    mtp = cfg({"decoding": "mtp", "num_nextn_predict_layers": 2, "max_draft_len": 5})
    assert type(mtp) is llmapi.MTPDecodingConfig and mtp.num_nextn_predict_layers == 2 and mtp.max_draft_len == 2
    adv = cfg({"decoding": "mtp", "allow_advanced_sampling": True})
    assert adv.allow_advanced_sampling is True
    with pytest.raises(EngineError, match="allow_advanced_sampling must be true or false"):
        cfg({"decoding": "mtp", "allow_advanced_sampling": "yes"})


def test_speculative_model_field_name_follows_the_class(fake_trt):
    """Before 1.2 the field was `speculative_model_dir`; the builder uses whichever the class declares."""

    class OldDraftTarget(fake_trt.llmapi._Strict):
        model_fields = {"max_draft_len": None, "speculative_model_dir": None}

    class NS:
        DraftTargetDecodingConfig = OldDraftTarget

    c = trtllm.TRTLLMConfig(api="llm", kind="draft_target", model="m", max_draft_len=2, speculative_model="d")
    old = trtllm.build_speculative_config(c, NS)
    assert old.speculative_model_dir == "d" and old.max_draft_len == 2
    with pytest.raises(EngineError, match="no Eagle3DecodingConfig"):
        trtllm.build_speculative_config(
            trtllm.TRTLLMConfig(api="llm", kind="eagle3", model="m", max_draft_len=2, speculative_model="d"), NS
        )


def test_sampling_params_mapping(fake_trt):
    """Greedy leaves temperature/top-k/top-p unset (SamplingParams doc: greedy); sampling maps each field."""
    SP = fake_trt.SamplingParams
    g = trtllm.make_sampling_params(SP, Sampling(max_new_tokens=17, seed=5))
    assert (g.max_tokens, g.temperature, g.top_k, g.top_p, g.seed, g.return_perf_metrics) == (17, None, None, None, 5, True)
    s = trtllm.make_sampling_params(SP, Sampling(temperature=0.7, top_p=0.9, top_k=40, seed=3, max_new_tokens=8))
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed) == (8, 0.7, 0.9, 40, 3)
    s2 = trtllm.make_sampling_params(SP, Sampling(temperature=1.0))
    assert s2.top_p is None and s2.top_k is None  # 1.0 / 0 mean "off"


# --- LLM API lanes ------------------------------------------------------------------------------------------


def _llm_engine(tmp_path, trt, **kw):
    return trtllm.load_engine(_manifest(tmp_path, "e3", trt, model="org/target"), tokenizer=ToyTokenizer(), **kw)


def test_llm_lane_streamed_updates_become_steps(tmp_path, fake_trt, monkeypatch):
    """Fake LLM API (GenerationResult streaming, 1.2 executor/result.py fields): each update of n new tokens is
    one step with accepted = n − 1 of k = max_draft_len, bonus when n − 1 == k; drafted_ids are () (rejected ids
    unavailable); the request's perf metrics, when filled (TensorRT-LLM after PR #17082), give LaneStats'
    drafted/accepted and say so (counts_source "engine")."""
    from tensorrt_llm import _toy

    monkeypatch.setattr(_toy, "PERF_METRICS", "filled")
    eng = _llm_engine(
        tmp_path, {"decoding": "eagle3", "max_draft_len": 3, "speculative_model": "org/eagle3", "kv_cache_free_gpu_memory_fraction": 0.5}
    )
    llm = fake_trt.LLM.instances[-1]
    assert llm.model == "org/target" and type(llm.speculative_config).__name__ == "EagleDecodingConfig"
    assert llm.kwargs["dtype"] == "bfloat16" and llm.kwargs["kv_cache_config"].free_gpu_memory_fraction == 0.5
    assert (eng.backend, eng.device, eng.vocab_size, eng.eos_ids) == ("trtllm", "cuda", 50, frozenset({2}))
    steps, st, done = _drain(_lane(eng, Sampling(max_new_tokens=20), lane_id="L", setup="trtllm:e3", prompt_id="p", repeat=1))

    expected = _toy.greedy(PROMPT, 20)
    sizes = _toy.chunk_sizes(20, 3)  # [1, 3, 1, 4→cap 4, 2, 1, 3, 1, 4, ...]
    assert [len(e.emitted_ids) for e in steps] == sizes
    assert steps[0].target_kind == "baseline" and steps[0].accepted_count == 0
    for e, n in zip(steps[1:], sizes[1:], strict=True):
        assert e.drafted_ids == () and e.accepted_count == n - 1
        assert e.target_kind == ("bonus" if n - 1 == 3 else "correction")
        assert e.target_id == e.emitted_ids[-1] and e.rejected_ids == ()
        assert len(e.pieces) == n
    assert [e.step for e in steps] == list(range(len(steps)))
    assert st.output_ids == tuple(expected) == tuple(t for e in steps for t in e.emitted_ids)
    assert st.output_text == ToyTokenizer().decode(expected)
    assert st.new_tokens == 20 and st.steps == len(sizes) and st.stop_reason == "length" and not st.library
    perf = fake_trt.LLM.instances[-1].results[-1].outputs[0].request_perf_metrics.speculative_decoding
    assert (
        (st.drafted, st.accepted) == (perf.total_draft_tokens, perf.total_accepted_draft_tokens) == (3 * (len(sizes) - 1), 20 - len(sizes))
    )
    assert st.acceptance_rate == pytest.approx((20 - len(sizes)) / (3 * (len(sizes) - 1)))
    assert st.mean_accepted_len == pytest.approx(20 / len(sizes))
    assert st.per_position_drafted == (len(sizes) - 1,) * 3
    assert st.per_position_accepted[0] == sum(1 for n in sizes[1:] if n >= 2)
    assert (st.setup, st.prompt_id, st.repeat, done.lane_id, done.cancelled) == ("trtllm:e3", "p", 1, "L", False)
    assert st.ttft_s == st.prefill_s == steps[0].t_wall_s and st.wall_s == pytest.approx(sum(e.t_wall_s for e in steps))
    assert st.t_draft_s == 0.0 and st.draft_forwards == 0
    assert st.counts_source == "engine" and st.notes == ()


def test_llm_lane_without_perf_metrics_uses_step_counts(tmp_path, fake_trt, monkeypatch):
    """When the request's speculative counters are zero (1.2.x: the PyTorch backend's TorchSampler never fills
    them) or absent, they are "not reported": drafted = Σ k (k = max_draft_len), accepted = Σ (n − 1), and the
    lane says its α is inferred from streamed chunks (counts_source "streamed" and a note)."""
    from tensorrt_llm import _toy

    for mode in ("zeros", None):
        monkeypatch.setattr(_toy, "PERF_METRICS", mode)
        eng = _llm_engine(tmp_path, {"decoding": "draft_target", "max_draft_len": 4, "speculative_model": "org/draft"})
        steps, st, _ = _drain(_lane(eng, Sampling(max_new_tokens=12)))
        assert st.drafted == 4 * (len(steps) - 1) and st.accepted == sum(e.accepted_count for e in steps) == 12 - len(steps)
        assert st.drafted > 0 and st.acceptance_rate is not None and st.acceptance_rate > 0
        assert st.counts_source == "streamed" and any("inferred from streamed chunk sizes" in n for n in st.notes)
    zeros = fake_trt.LLM.instances[0].results[-1].outputs[0].request_perf_metrics.speculative_decoding
    assert zeros.total_draft_tokens == 0  # the counters were there, and zero


def test_llm_lane_perf_metrics_replace_step_estimate(tmp_path, fake_trt, monkeypatch):
    """The executor's per-request counters win over the per-update estimate in LaneStats (drafted, accepted);
    the StepEvents keep the per-update counts."""
    from tensorrt_llm import _toy

    monkeypatch.setattr(_toy, "PERF_METRICS", "filled")
    monkeypatch.setattr(_toy, "PERF_TOTALS", (17, 9))
    eng = _llm_engine(tmp_path, {"decoding": "ngram", "max_draft_len": 4})
    steps, st, _ = _drain(_lane(eng, Sampling(max_new_tokens=12)))
    assert (st.drafted, st.accepted) == (17, 9) and st.acceptance_rate == pytest.approx(9 / 17)
    assert sum(e.k for e in steps) == 4 * (len(steps) - 1) != 17


def test_llm_lane_no_speculation_and_eos(tmp_path, fake_trt, monkeypatch):
    """decoding = "none": one baseline step per token; the engine stops at EOS (not returned, finish 'stop')."""
    from tensorrt_llm import _toy

    monkeypatch.setattr(_toy, "EOS_AT", len(PROMPT) + 6)
    eng = _llm_engine(tmp_path, {"decoding": "none"})
    steps, st, _ = _drain(_lane(eng, Sampling(max_new_tokens=20)))
    assert [e.target_kind for e in steps] == ["baseline"] * 6 and all(len(e.emitted_ids) == 1 for e in steps)
    assert st.output_ids == tuple(_toy.greedy(PROMPT, 6)) and st.stop_reason == "eos" and st.drafted == 0


def test_llm_lane_cancel_aborts_request(tmp_path, fake_trt):
    """Cancellation is polled between updates; the request is aborted and LaneDone says cancelled."""
    eng = _llm_engine(tmp_path, {"decoding": "ngram", "max_draft_len": 4})
    seen = []
    gen = _lane(eng, Sampling(max_new_tokens=30), cancelled=lambda: len(seen) >= 2)
    for ev in gen:
        seen.append(ev)
    done = seen[-1]
    assert isinstance(done, LaneDone) and done.cancelled and done.stats.stop_reason == "cancelled" and len(seen) == 3
    assert fake_trt.LLM.instances[-1].results[-1].aborted_called


# --- runner lanes -----------------------------------------------------------------------------------------


def _runner_engine(tmp_path, trt):
    m = _manifest(tmp_path, "dtm", {"api": "runner", "tokenizer_dir": "tok", **trt}, engine_dir="target-eng")
    return trtllm.load_engine(m, tokenizer=ToyTokenizer())


def test_runner_draft_target_knows_rejected_ids(tmp_path, fake_trt):
    """Fake ModelRunnerCpp (1.2 model_runner_cpp.py signatures): the draft engine proposes k tokens, the target
    verifies them via draft_tokens_list; StepEvents carry real drafted ids, accepted counts and rejected ids, and
    the output equals the target's own greedy output."""
    from tensorrt_llm import _toy

    eng = _runner_engine(tmp_path, {"mode": "draft_target", "max_draft_len": 4, "draft_engine_dir": "draft-eng"})
    draft_r, target_r = fake_trt.runtime.ModelRunnerCpp.instances
    assert draft_r.is_draft and not target_r.is_draft
    for r in (draft_r, target_r):
        assert r.kwargs["kv_cache_enable_block_reuse"] is True and r.kwargs["kv_cache_free_gpu_memory_fraction"] == 0.4
        assert r.kwargs["device_ids"] == [0] and r.kwargs["is_orchestrator_mode"] is True
    steps, st, _ = _drain(_lane(eng, Sampling(max_new_tokens=24)))
    assert st.output_ids == tuple(_toy.greedy(PROMPT, 24))
    assert steps[0].target_kind == "baseline" and steps[0].drafted_ids == ()
    seq = list(PROMPT) + list(steps[0].emitted_ids)
    saw = set()
    for e in steps[1:]:
        k = len(e.drafted_ids)
        if k == 0:  # the target's own decode iterations after a verification (the runner filled max_new_tokens)
            assert e.target_kind == "baseline" and len(e.emitted_ids) == 1
            seq += list(e.emitted_ids)
            continue
        assert list(e.drafted_ids) == _toy.greedy(seq, k, _toy.draft_next)  # what the draft really proposed
        a = e.accepted_count
        assert e.accepted_ids == e.emitted_ids[:a] and e.emitted_ids[a:] == (e.target_id,)
        assert e.target_kind == ("bonus" if a == k else "correction")
        if a < k:
            assert e.rejected_ids[0] != e.target_id and len(e.rejected_pieces) == k - a
        saw.add(e.target_kind)
        assert e.t_draft_s >= 0 and e.t_verify_s >= 0
        seq += list(e.emitted_ids)
    assert saw == {"bonus", "correction"}
    assert all(c["draft_tokens_list"] is not None for c in target_r.calls)  # the target engine always verifies
    calls = [c for c in target_r.calls if c["draft_tokens_list"] != [[2]]]  # [end_id] = the empty-draft placeholder
    assert calls and all(c["max_new_tokens"] == len(c["draft_tokens_list"][0]) + 1 for c in calls)
    assert st.drafted == sum(len(e.drafted_ids) for e in steps) and st.accepted == sum(e.accepted_count for e in steps)
    assert 0 < st.acceptance_rate < 1 and st.draft_forwards == st.drafted
    assert st.mean_accepted_len == pytest.approx(24 / st.steps)
    assert all(c["top_k"] == 1 for c in target_r.calls)  # greedy on the runner: top_k 1 (examples/run.py)


def test_runner_draft_target_stops_at_eos(tmp_path, fake_trt, monkeypatch):
    """An EOS from the target ends the lane with stop_reason eos, EOS included (as app/speculative/loop.py does)."""
    from tensorrt_llm import _toy

    monkeypatch.setattr(_toy, "EOS_AT", len(PROMPT) + 9)
    eng = _runner_engine(tmp_path, {"mode": "draft_target", "max_draft_len": 3, "draft_engine_dir": "draft-eng"})
    steps, st, _ = _drain(_lane(eng, Sampling(max_new_tokens=40)))
    assert st.stop_reason == "eos" and st.output_ids[-1] == 2 and len(st.output_ids) == 10
    assert st.output_ids == tuple(_toy.greedy(PROMPT, 40))


def _built(folder: Path, max_input_len: int, max_seq_len: int) -> str:
    """An engine folder with the config.json trtllm-build writes (build_config holds the limits)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        '{"version": "1.2.0", "pretrained_config": {"architecture": "LlamaForCausalLM"}, '
        f'"build_config": {{"max_input_len": {max_input_len}, "max_seq_len": {max_seq_len}, "max_draft_len": 4}}}}'
    )
    return str(folder)


def test_runner_limits_are_checked_before_the_run(tmp_path, fake_trt):
    """The draft/target runner re-sends the whole sequence every step, so a long run once crashed mid-way when
    the input passed the engine's max_input_len (RuntimeError from ModelRunnerCpp). The engines' limits (their
    config.json / the runner's max_input_len and max_seq_len) now bound the lane up front: the scheduler refuses
    with the numbers before a token is made, and a run within them completes."""
    from tensorrt_llm import _toy

    from app.worker.messages import LaneSpec
    from app.worker.pool import EnginePool
    from app.worker.scheduler import lane_events

    target = _built(tmp_path / "target-eng", max_input_len=20, max_seq_len=40)
    draft = _built(tmp_path / "draft-eng", max_input_len=30, max_seq_len=40)
    eng = _runner_engine(tmp_path, {"mode": "draft_target", "max_draft_len": 3, "draft_engine_dir": draft})
    assert [r.max_input_len for r in fake_trt.runtime.ModelRunnerCpp.instances] == [30, 20] and target
    assert eng.context_length == 21 and eng.max_prompt_tokens is None  # max_input_len + 1: the last step's input
    pool = EnginePool()
    pool.put("dtm", eng)
    prompt = ToyTokenizer().encode("hello")  # 6 tokens
    evs = list(lane_events(pool, "t", LaneSpec("L", "trtllm:dtm", "p", "hello"), Sampling(max_new_tokens=30), chat=False, cancelled=lambda: False))
    assert len(evs) == 1 and isinstance(evs[0], RunError) and evs[0].kind == "SetupError"
    assert "6 tokens and up to 30 new tokens" in evs[0].message and "36 > the 21 positions of dtm" in evs[0].message
    assert "lower --max-new-tokens to at most 15" in evs[0].message and "shorten" not in evs[0].message
    assert not fake_trt.runtime.ModelRunnerCpp.instances[1].calls  # nothing ran
    evs = list(lane_events(pool, "t", LaneSpec("L", "trtllm:dtm", "p", "hello"), Sampling(max_new_tokens=15), chat=False, cancelled=lambda: False))
    done = evs[-1]
    assert isinstance(done, LaneDone) and done.stats.output_ids == tuple(_toy.greedy(prompt, 15))


def test_streaming_runner_prompt_limit(tmp_path, fake_trt):
    """ReDrafter/Medusa send the prompt once: its length is bounded by max_input_len, prompt + new tokens by
    max_seq_len; both refused up front with the numbers."""
    from app.worker.messages import LaneSpec
    from app.worker.pool import EnginePool
    from app.worker.scheduler import lane_events

    eng_dir = _built(tmp_path / "rd-eng", max_input_len=4, max_seq_len=30)
    m = _manifest(tmp_path, "rd", {"api": "runner", "tokenizer_dir": "tok", "mode": "redrafter", "max_draft_len": 3}, engine_dir=eng_dir)
    eng = trtllm.load_engine(m, tokenizer=ToyTokenizer())
    assert (eng.context_length, eng.max_prompt_tokens) == (30, 4)
    pool = EnginePool()
    pool.put("rd", eng)
    (err,) = lane_events(pool, "t", LaneSpec("L", "trtllm:rd", "p", "hello"), Sampling(max_new_tokens=8), chat=False, cancelled=lambda: False)
    assert isinstance(err, RunError) and "the prompt is 6 tokens: more than the 4 rd accepts as input" in err.message


def test_llm_api_limits(tmp_path, fake_trt):
    """LLM API: max_seq_len from the LLM's args when given, else the model folder's max_position_embeddings (what
    TensorRT-LLM infers it from); prompts bounded by max_num_tokens (8192) unless chunked prefill is on."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    m = _manifest(tmp_path, "l", {"decoding": "none"}, model=str(model))
    eng = trtllm.load_engine(m, tokenizer=ToyTokenizer())
    assert (eng.context_length, eng.max_prompt_tokens) == (4096, 8192)
    m = _manifest(tmp_path, "l2", {"decoding": "none", "llm_args": {"max_seq_len": 2048, "enable_chunked_prefill": True}}, model=str(model))
    eng = trtllm.load_engine(m, tokenizer=ToyTokenizer())
    assert (eng.context_length, eng.max_prompt_tokens) == (2048, None)


def test_llm_args_with_an_unknown_key_fail_at_load_with_the_library_message(tmp_path, fake_trt):
    """LLM(...) refuses keywords it does not know (1.2: ValueError "LLM got invalid argument"); the load error
    names the manifest and keeps that message."""
    m = _manifest(tmp_path, "bad", {"decoding": "mtp", "llm_args": {"allow_advanced_sampling": True}}, model="org/m")
    with pytest.raises(EngineError, match="LLM got invalid argument: allow_advanced_sampling") as ei:
        trtllm.load_engine(m, tokenizer=ToyTokenizer())
    assert "bad" in str(ei.value)


def test_runner_draft_target_cancel(tmp_path, fake_trt):
    """Cancellation is polled before each draft/verify step (after the prefill)."""
    eng = _runner_engine(tmp_path, {"mode": "draft_target", "max_draft_len": 3, "draft_engine_dir": "draft-eng"})
    seen: list = []
    for ev in _lane(eng, Sampling(max_new_tokens=40), cancelled=lambda: len(seen) >= 2):
        seen.append(ev)
    done = seen[-1]
    assert done.cancelled and done.stats.stop_reason == "cancelled" and done.stats.steps == len(seen) - 1 < 8
    assert done.stats.new_tokens < 40


@pytest.mark.parametrize(
    "mode, extra, k", [("medusa", {"medusa_choices": [[0], [0, 0], [1], [0, 0, 0]]}, 3), ("redrafter", {"max_draft_len": 5}, 5)]
)
def test_runner_streaming_modes_give_counts(tmp_path, fake_trt, monkeypatch, mode, extra, k):
    """ReDrafter / Medusa stream through one ModelRunnerCpp: counts only (accepted = n − 1 of k per iteration)."""
    from tensorrt_llm import _toy

    monkeypatch.setattr(_toy, "STREAM_K", k)
    eng = _runner_engine(tmp_path, {"mode": mode, **extra})
    (runner,) = fake_trt.runtime.ModelRunnerCpp.instances
    if mode == "medusa":
        assert runner.kwargs["medusa_choices"] == extra["medusa_choices"]
    steps, st, _ = _drain(_lane(eng, Sampling(max_new_tokens=15)))
    sizes = _toy.chunk_sizes(15, k)
    assert [len(e.emitted_ids) for e in steps] == sizes
    assert all(e.drafted_ids == () and e.accepted_count == len(e.emitted_ids) - 1 for e in steps[1:])
    assert st.output_ids == tuple(_toy.greedy(PROMPT, 15)) and st.drafted == k * (len(sizes) - 1)
    assert runner.calls[0]["streaming"] is True


def test_trtllm_engine_is_not_a_session_target(tmp_path, fake_trt):
    """Used as --target of an HF setup, the engine explains that it runs only as a trtllm:<engine> lane."""
    from app.core.errors import SetupError
    from app.engines.base import Engine, StepEngine
    from app.speculative.loop import LoopRunner

    eng = _llm_engine(tmp_path, {"decoding": "none"})
    assert isinstance(eng, Engine) and not isinstance(eng, StepEngine)
    with pytest.raises(SetupError, match="trtllm:e3"):
        LoopRunner(eng)


# --- runner choice, shared accounting, scheduler -------------------------------------------------------------


@pytest.mark.parametrize(
    "trt, source, cls",
    [
        ({"decoding": "none"}, {"model": "org/target"}, lanes.LLMApiRunner),
        ({"decoding": "ngram", "max_draft_len": 4}, {"model": "org/target"}, lanes.LLMApiRunner),
        (
            {"api": "runner", "tokenizer_dir": "tok", "mode": "draft_target", "max_draft_len": 4, "draft_engine_dir": "draft-eng"},
            {"engine_dir": "target-eng"},
            lanes.CppDraftTargetRunner,
        ),
        ({"api": "runner", "tokenizer_dir": "tok", "mode": "redrafter", "max_draft_len": 5}, {"engine_dir": "target-eng"}, lanes.CppStreamRunner),
        (
            {"api": "runner", "tokenizer_dir": "tok", "mode": "medusa", "medusa_choices": [[0], [0, 0]]},
            {"engine_dir": "target-eng"},
            lanes.CppStreamRunner,
        ),
    ],
)
def test_runner_for_follows_the_config(tmp_path, fake_trt, trt, source, cls):
    """runner_for picks the lane runner by `[trtllm] api` and mode; the runner's engine encodes the prompt."""
    eng = trtllm.load_engine(_manifest(tmp_path, "e", trt, **source), tokenizer=ToyTokenizer())
    r = lanes.runner_for(eng)
    assert type(r) is cls and r.engine is eng


def test_runner_for_refuses_other_backends():
    """trtllm:<engine> naming an hf engine is a clear EngineError, not an AttributeError."""

    class HF:
        name, backend = "qwen", "hf"

    with pytest.raises(EngineError, match='trtllm:qwen needs a backend = "trtllm" engine'):
        lanes.runner_for(HF())


def test_counts_only_steps_table():
    """CountsOnlySteps on a bare LaneRecorder (k = 3, token limit 8, EOS 2): a coalesced first update is split
    into the prefill (one baseline token, half the time) and a step; then n tokens → accepted n − 1 of
    max(k, n − 1); the limit truncates (no target token left: accepted = what remains); empty updates are no step."""
    rec = LaneRecorder("L", "trtllm", "p", 0, 8, {2})
    steps = lanes.CountsOnlySteps(rec, 3)
    evs = steps.push([10, 11, 12], 1.0)
    evs += steps.push([], 0.3)
    evs += steps.push([13, 14, 15, 16], 0.5)
    evs += steps.push([17, 18, 19], 0.25)
    got = [(e.emitted_ids, e.drafted_count, e.accepted_count, e.target_id, e.target_kind, e.t_wall_s) for e in evs]
    assert got == [
        ((10,), None, 0, 10, "baseline", 0.5),
        ((11, 12), 3, 1, 12, "correction", 0.5),
        ((13, 14, 15, 16), 3, 3, 16, "bonus", 0.5),
        ((17,), 3, 1, None, "correction", 0.25),  # only one token of room left: taken as an accepted draft
    ]
    assert steps.push([20], 0.1) == [] and rec.done
    st = rec.stats()
    assert (st.steps, st.drafted, st.accepted, st.new_tokens, st.prefill_s, st.wall_s) == (4, 9, 5, 8, 0.5, 1.75)
    assert st.per_position_drafted == (3, 3, 3) and st.per_position_accepted == (3, 1, 1)


def test_counts_only_steps_without_speculation_and_eos():
    """k = 0: each token of an update is one baseline step sharing the update's time; EOS ends the lane."""
    rec = LaneRecorder("L", "trtllm", "p", 0, 20, {2})
    steps = lanes.CountsOnlySteps(rec, 0)
    evs = steps.push([10], 0.2) + steps.push([11, 12, 2, 13], 0.4)
    assert [(e.emitted_ids, e.target_kind, e.t_wall_s) for e in evs] == [((10,), "baseline", 0.2)] + [
        ((t,), "baseline", 0.1) for t in (11, 12, 2)
    ]
    assert rec.stop_reason == "eos" and rec.stats().drafted == 0


def test_llm_request_aborted_when_the_lane_is_dropped(tmp_path, fake_trt):
    """A consumer that stops reading a lane (closes its generator) leaves no request running in the executor."""
    eng = _llm_engine(tmp_path, {"decoding": "ngram", "max_draft_len": 4})
    gen = _lane(eng, Sampling(max_new_tokens=30))
    next(gen), next(gen)
    result = fake_trt.LLM.instances[-1].results[-1]
    assert not result.aborted_called
    gen.close()
    assert result.aborted_called


def test_lane_events_through_the_scheduler(tmp_path, fake_trt):
    """`trtllm:<engine>` through app.worker.scheduler.lane_events with the engine `put` in the pool: the registry
    builds runner_for's runner, the prompt is encoded by the engine's tokenizer, and the events equal a direct
    drive of the same runner."""
    from tensorrt_llm import _toy

    from app.worker.messages import LaneSpec
    from app.worker.pool import EnginePool
    from app.worker.scheduler import lane_events

    eng = _llm_engine(tmp_path, {"decoding": "eagle3", "max_draft_len": 3, "speculative_model": "org/eagle3"})
    pool = EnginePool()
    pool.put("e3", eng)
    spec = LaneSpec("L1", "trtllm:e3", "p1", "hi", repeat=2)
    evs = list(lane_events(pool, "some-hf-target", spec, Sampling(max_new_tokens=10), chat=True, cancelled=lambda: False))
    start, *steps, done = evs
    prompt = ToyTokenizer().encode("hi")
    assert isinstance(start, LaneStarted) and start.setup == "trtllm:e3" and start.prompt_ids == tuple(prompt)
    assert isinstance(done, LaneDone) and all(isinstance(e, StepEvent) for e in steps)
    assert done.stats.output_ids == tuple(_toy.greedy(prompt, 10)) and done.stats.repeat == 2
    assert [len(e.emitted_ids) for e in steps] == _toy.chunk_sizes(10, 3)
    fake_trt.LLM.instances[-1].results.clear()
    ref_steps, ref, _ = _drain(_lane(eng, Sampling(max_new_tokens=10), lane_id="L1", setup="trtllm:e3", prompt_id="p1", repeat=2, prompt=prompt))
    assert [(e.emitted_ids, e.accepted_count, e.drafted_count, e.target_kind) for e in steps] == [
        (e.emitted_ids, e.accepted_count, e.drafted_count, e.target_kind) for e in ref_steps
    ]
    assert (done.stats.drafted, done.stats.accepted, done.stats.output_text) == (ref.drafted, ref.accepted, ref.output_text)


def test_trtllm_engine_as_loop_target_is_a_lane_error(tmp_path, fake_trt):
    """A baseline lane whose --target is a TensorRT-LLM engine ends in RunError saying to use trtllm:<engine>."""
    from app.worker.messages import LaneSpec
    from app.worker.pool import EnginePool
    from app.worker.scheduler import lane_events

    pool = EnginePool()
    pool.put("e3", _llm_engine(tmp_path, {"decoding": "none"}))
    evs = list(lane_events(pool, "e3", LaneSpec("L", "baseline", "p", "hi"), Sampling(max_new_tokens=4), chat=True, cancelled=lambda: False))
    err = evs[-1]
    assert isinstance(err, RunError) and "trtllm:e3" in err.message and err.kind == "SetupError"


def _module_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_engine_package_builds_no_events():
    """The engine package computes or streams tokens only: no events, stats or accounting imports (anywhere in
    the module, lazy ones included), no lane loop left on the engine; capability never imports tensorrt_llm."""
    pkg = APP / "engines" / "trtllm"
    for p in pkg.glob("*.py"):
        bad = {m for m in _module_imports(p) if m in ("app.core.events", "app.core.metrics", "app.core.accounting")}
        assert not bad, (p.name, bad)
    assert not any(m.startswith("tensorrt_llm") for m in _module_imports(pkg / "capability.py"))
    assert not hasattr(trtllm.TRTLLMEngine, "run_lane") and not hasattr(trtllm, "open_engine")


# --- real library -----------------------------------------------------------------------------------------


@pytest.mark.trtllm
def test_real_llmapi_accepts_our_configs():
    """Needs the real TensorRT-LLM (>= 1.2): our configs and SamplingParams build against its classes."""
    ok, why = trtllm.capability()
    if not ok:
        pytest.skip(f"TensorRT-LLM unusable here: {why}")
    import tensorrt_llm
    from tensorrt_llm import llmapi

    for kind, extra in [("draft_target", {"speculative_model": "d"}), ("ngram", {}), ("eagle3", {"speculative_model": "e"}), ("mtp", {})]:
        c = trtllm.TRTLLMConfig(api="llm", kind=kind, model="m", max_draft_len=3 if kind != "mtp" else 1, **extra)
        assert trtllm.build_speculative_config(c, llmapi) is not None
    sp = trtllm.make_sampling_params(tensorrt_llm.SamplingParams, Sampling(temperature=0.7, top_p=0.9, top_k=20, seed=1))
    assert sp.max_tokens == 96 and sp.temperature == 0.7


# --- the 1.2 API's traps (issue 17): each test failed on the code before it ---------------------------------


def test_runner_samples_when_top_p_is_off(tmp_path, fake_trt):
    """Sampling with top-p off once sent top_p 0.0: ModelRunnerCpp turns it into None, the C++ default is 0.0, and
    top_k 0 with top_p 0 is greedy in the sampling kernels — the lane silently decoded greedily. Now top-p off is
    sent as 1.0 and the runner lanes really sample (the fake applies the kernels' rule)."""
    from tensorrt_llm import _toy

    eng = _runner_engine(tmp_path, {"mode": "draft_target", "max_draft_len": 3, "draft_engine_dir": "draft-eng"})
    _, st, _ = _drain(_lane(eng, Sampling(temperature=0.8, top_p=1.0, top_k=0, seed=11, max_new_tokens=16)))
    target_r = fake_trt.runtime.ModelRunnerCpp.instances[-1]
    assert all(c["top_p"] == 1.0 and c["top_k"] == 0 and c["temperature"] == 0.8 for c in target_r.calls)
    assert st.output_ids != tuple(_toy.greedy(PROMPT, 16))  # it sampled
    rd = trtllm.load_engine(_manifest(tmp_path, "rd", {"api": "runner", "tokenizer_dir": "tok", "mode": "redrafter", "max_draft_len": 4},
                                      engine_dir="rd-eng"), tokenizer=ToyTokenizer())
    _, st, _ = _drain(_lane(rd, Sampling(temperature=0.8, seed=11, max_new_tokens=16)))
    assert st.output_ids != tuple(_toy.greedy(PROMPT, 16))
    _, st, _ = _drain(_lane(rd, Sampling(max_new_tokens=16)))  # greedy stays greedy
    assert st.output_ids == tuple(_toy.greedy(PROMPT, 16))


@pytest.mark.parametrize("trt", [
    {"decoding": "eagle3", "max_draft_len": 3, "speculative_model": "org/eagle3"},
    {"decoding": "mtp", "num_nextn_predict_layers": 2},
])
def test_one_model_paths_say_they_decoded_greedily(tmp_path, fake_trt, trt):
    """One-model EAGLE-3 (the manifest default) and MTP ignore sampling in 1.2 unless allow_advanced_sampling is
    set: the lane says it decoded greedily; with the switch in the manifest it reaches the decoding config and the
    lane samples, without the note."""
    from tensorrt_llm import _toy

    hot = Sampling(temperature=0.8, seed=3, max_new_tokens=14)
    eng = _llm_engine(tmp_path, trt)
    assert eng.config.greedy_only
    _, st, _ = _drain(_lane(eng, hot))
    assert st.output_ids == tuple(_toy.greedy(PROMPT, 14))
    assert any("decoded greedily although sampling was asked" in n and "allow_advanced_sampling" in n for n in st.notes)
    _, st, _ = _drain(_lane(eng, Sampling(max_new_tokens=14)))
    assert not any("greedily" in n for n in st.notes)  # greedy asked: nothing to say
    eng = _llm_engine(tmp_path, {**trt, "allow_advanced_sampling": True})
    assert fake_trt.LLM.instances[-1].speculative_config.allow_advanced_sampling is True and not eng.config.greedy_only
    _, st, _ = _drain(_lane(eng, hot))
    assert st.output_ids != tuple(_toy.greedy(PROMPT, 14)) and not any("greedily" in n for n in st.notes)


def test_mtp_k_is_read_back_from_the_config_tensorrt_llm_kept(tmp_path, fake_trt):
    """MTP: TensorRT-LLM overwrites max_draft_len with num_nextn_predict_layers, so a manifest's max_draft_len 3
    with one MTP module drafts 1 token per step; the lane's k (and α's denominator) follow what the library kept,
    and the lane says so."""
    from tensorrt_llm import _toy

    _toy_sizes = _toy.chunk_sizes(12, 1)
    eng = _llm_engine(tmp_path, {"decoding": "mtp", "max_draft_len": 3, "num_nextn_predict_layers": 1})
    assert eng.config.max_draft_len == 3 and eng.draft_len == 1
    steps, st, _ = _drain(_lane(eng, Sampling(max_new_tokens=12)))
    assert [len(e.emitted_ids) for e in steps] == _toy_sizes
    assert all(e.k == 1 for e in steps[1:]) and st.drafted == len(steps) - 1
    assert st.acceptance_rate == pytest.approx(sum(n - 1 for n in _toy_sizes[1:]) / (len(_toy_sizes) - 1))
    assert any("k = 1" in n and "num_nextn_predict_layers" in n for n in st.notes)


def test_medusa_refuses_temperatures_other_than_one(tmp_path, fake_trt):
    """TensorRT-LLM's Medusa samples at temperature 1.0 only: other temperatures are refused with the fix;
    greedy and 1.0 run."""
    eng = _runner_engine(tmp_path, {"mode": "medusa", "medusa_choices": [[0], [0, 0]]})
    with pytest.raises(Exception, match="temperature 1.0 only") as ei:
        list(_lane(eng, Sampling(temperature=0.7, max_new_tokens=8)))
    assert "--temperature 1.0" in str(ei.value)
    for s in (Sampling(max_new_tokens=8), Sampling(temperature=1.0, max_new_tokens=8)):
        _, st, _ = _drain(_lane(eng, s))
        assert st.new_tokens == 8
