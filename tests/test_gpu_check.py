"""`make gpu-check`: its logic on a CPU-only machine. The real GPU path cannot run here (no NVIDIA GPU): the
part runner is replaced by a stand-in that writes the report a bench would have written, and NVML by the
documented fake of pynvml (tests/telemetry/fake_pynvml.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from app.commands.gpu_check import Part, format_summary, gpu_presence, plan_parts, run_parts
from tests.telemetry.fake_pynvml import FakeGpu, FakeNvml


def test_without_a_gpu_it_says_so_and_exits_0():
    r = subprocess.run([sys.executable, "-m", "app", "gpu-check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no NVIDIA GPU" in r.stdout and "Nothing to check" in r.stdout


def test_a_gpu_that_torch_cannot_use_is_named():
    present, words = gpu_presence(FakeNvml([FakeGpu()]))
    assert not present and "no CUDA" in words  # NVML sees one, this CPU build of torch cannot use it


def test_plan_skips_what_is_missing_and_says_why(tmp_path):
    parts = plan_parts(tmp_path, have=lambda name: name.startswith("smollm2"), trtllm=(False, "not installed"))
    by = {p.name: p for p in parts}
    assert not by["SmolLM2 on CUDA, bfloat16"].skip and not by["SmolLM2 on CUDA, float16"].skip
    assert "--dtype" in by["SmolLM2 on CUDA, float16"].argv and "float16" in by["SmolLM2 on CUDA, float16"].argv
    assert "make models-qwen" in by["Qwen pair on CUDA, bfloat16"].skip
    assert "not installed" in by["TensorRT-LLM lanes"].skip
    trt = plan_parts(tmp_path, have=lambda n: True, trtllm=(True, ""), trt_engines=["llama-eagle3"])
    assert any(p.argv and "trtllm:llama-eagle3" in p.argv for p in trt)


def test_parts_are_judged_from_their_reports(tmp_path):
    good, bad, cpu = (str(tmp_path / n) for n in ("good.json", "bad.json", "cpu.json"))
    docs = {
        good: {"device": "cuda", "dtype": "bfloat16", "errors": [], "runs": [{"setup": "baseline"}, {"setup": "ngram", "identical_to_baseline": False}],
               "summary": [{"setup": "baseline", "tokens_per_s": 80.0, "speedup": 1.0}, {"setup": "ngram", "tokens_per_s": 120.0, "speedup": 1.5}]},
        cpu: {"device": "cpu", "dtype": "float32", "errors": [], "runs": [{"setup": "baseline"}], "summary": []},
    }

    def fake_run(cmd, **kw):
        out = cmd[cmd.index("--json") + 1] if "--json" in cmd else None
        if out == bad:
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])
        if out in docs:
            with open(out, "w") as f:
                json.dump(docs[out], f)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    parts = [Part("good", ("bench", "--json", good), 10, output=good), Part("hang", ("bench", "--json", bad), 10, output=bad),
             Part("on cpu", ("bench", "--json", cpu), 10, output=cpu), Part("trt", (), 0, skip="not installed")]
    res = {r.name: r for r in run_parts(parts, runner=fake_run)}
    assert res["good"].status == "pass" and "identical to baseline 0/1" in res["good"].detail  # divergence shown, not failed
    assert res["hang"].status == "fail" and "timed out" in res["hang"].detail
    assert res["on cpu"].status == "fail"  # a run that fell back to the CPU is not a GPU pass
    assert res["trt"].status == "skip"
    text = format_summary(list(res.values()), {"max util %": 97})
    late = run_parts([Part("late", ("bench", "--json", good), 100, output=good)], runner=fake_run, budget_s=5)
    assert late[0].status == "skip" and "budget" in late[0].detail
    assert "1 passed, 2 failed, 1 skipped" in text and "ngram: 120.0 tok/s, 1.50x" in text and "max util % 97" in text
