"""`make gpu-check` (`python -m app gpu-check`): on a machine with an NVIDIA GPU, in a few minutes, run what has
never run on CPU-only machines — the HF engine on CUDA (bfloat16 and float16, SmolLM2 and the Qwen pair), real
NVML telemetry sampled during those runs, a GUI screenshot with its GPU plots (offscreen), and TensorRT-LLM lanes
when the library is installed — and print one summary: pass / fail / skip per part, with figures.

Without a GPU it says so and exits 0. Each part is a subprocess of the real CLI with its own time limit, so a
hang or crash in one part is reported and the others still run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Part", "PartResult", "gpu_presence", "plan_parts", "run_parts", "format_summary", "add_parser", "run"]

SMOL = "smollm2-135m-instruct"
QWEN_TARGET = "qwen2.5-coder-1.5b-instruct"
QWEN_DRAFT = "qwen2.5-coder-0.5b-instruct"


@dataclass(frozen=True)
class Part:
    """One check: a command line (argv after `python -m app`), its time limit, and how to read its result."""

    name: str
    argv: tuple[str, ...]
    timeout_s: float
    kind: str = "bench"  # bench (reads the --json report) | gui (checks the screenshot file)
    output: str = ""  # the report or screenshot path
    skip: str = ""  # why it is skipped (then it does not run)


@dataclass
class PartResult:
    name: str
    status: str  # pass | fail | skip
    detail: str = ""
    wall_s: float = 0.0
    figures: dict = field(default_factory=dict)


def gpu_presence(nvml_module=None) -> tuple[bool, str]:
    """(present, words): an NVIDIA GPU seen by NVML and by torch, or why not."""
    from app.telemetry.nvml import NvmlReader

    try:
        reader = NvmlReader(nvml_module)
    except Exception as e:  # pragma: no cover - NvmlReader reports its own state
        return False, f"NVML failed to start ({e})"
    try:
        state = reader.state
        n = reader.device_count if reader.available else 0
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        cuda = False
    if n == 0:
        return False, f"no NVIDIA GPU ({state}; torch.cuda.is_available() = {cuda})"
    if not cuda:
        return False, f"NVML sees {n} GPU(s) but this torch build has no CUDA (install a CUDA build of torch 2.13)"
    return True, f"{n} GPU(s) ({state})"


def _installed(engine: str) -> bool:
    try:
        from app.engines.status import all_status

        return any(s.name == engine and s.present for s in all_status())
    except Exception:
        return False


def plan_parts(out: Path, have: Callable[[str], bool] = _installed, trtllm: tuple[bool, str] | None = None,
               trt_engines: Sequence[str] = ()) -> list[Part]:
    """The checks to run, in order (each skipped part says why)."""
    parts = []
    for dtype in ("bfloat16", "float16"):
        rep = str(out / f"smollm2-{dtype}.json")
        parts.append(Part(f"SmolLM2 on CUDA, {dtype}", ("bench", "--target", SMOL, "--setup", "ngram", "--setup", f"draft:{SMOL},k=4",
                                                        "--suite", "quick", "--max-new-tokens", "32", "--device", "cuda", "--dtype", dtype,
                                                        "--mode", "interleaved", "--json", rep, "--quiet"), 150, output=rep,
                          skip="" if have(SMOL) else f"{SMOL} not installed (make models-test)"))
    rep = str(out / "qwen-bfloat16.json")
    qwen = have(QWEN_TARGET) and have(QWEN_DRAFT)
    parts.append(Part("Qwen pair on CUDA, bfloat16", ("bench", "--target", QWEN_TARGET, "--setup", f"draft:{QWEN_DRAFT},k=8",
                                                       "--setup", f"hf-assisted:{QWEN_DRAFT}", "--prompt",
                                                       "Write a Python function that checks whether a string is a palindrome.",
                                                       "--max-new-tokens", "64", "--device", "cuda", "--dtype", "bfloat16",
                                                       "--mode", "interleaved", "--json", rep, "--quiet"), 240, output=rep,
                      skip="" if qwen else "Qwen pair not installed (make models-qwen)"))
    shot = str(out / "gui-gpu.png")
    parts.append(Part("GUI screenshot with GPU plots", ("gui", "--preset", "smollm2", "--max-new-tokens", "32", "--autorun",
                                                         "--quit-after-run", "--screenshot", shot, "--settings", str(out / "gui.ini")),
                      120, kind="gui", output=shot, skip="" if have(SMOL) else f"{SMOL} not installed"))
    ok, why = trtllm if trtllm is not None else (False, "not checked")
    if not ok:
        parts.append(Part("TensorRT-LLM lanes", (), 0, skip=f"TensorRT-LLM unusable here: {why}"))
    elif not trt_engines:
        parts.append(Part("TensorRT-LLM lanes", (), 0, skip="no usable backend = \"trtllm\" manifest (engines/*.toml)"))
    else:
        for name in trt_engines:
            rep = str(out / f"trtllm-{name}.json")
            parts.append(Part(f"TensorRT-LLM {name}", ("bench", "--target", SMOL, "--setup", f"trtllm:{name}", "--prompt", "Hello",
                                                       "--max-new-tokens", "32", "--device", "cuda", "--json", rep, "--quiet"), 300, output=rep))
    return parts


def _read_bench(path: str) -> tuple[bool, str, dict]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return False, f"no report ({e})", {}
    rows = {s["setup"]: s for s in doc.get("summary", [])}
    runs = doc.get("runs", [])
    ident = sum(1 for r in runs if r.get("identical_to_baseline"))
    compared = sum(1 for r in runs if r.get("setup") != "baseline")
    figures = {s: {"tok/s": round(r["tokens_per_s"] or 0, 1), "speedup": r.get("speedup")} for s, r in rows.items()}
    ok = doc.get("device", "").startswith("cuda") and bool(runs) and not doc.get("errors")
    # bf16/fp16 may diverge from the baseline (batched verify numerics): shown, not failed
    detail = f"{doc.get('device')} {doc.get('dtype')}, {len(runs)} lanes, identical to baseline {ident}/{compared}"
    if doc.get("errors"):
        detail += f"; errors: {doc['errors'][0][:120]}"
    return ok, detail, figures


def run_parts(parts: Sequence[Part], runner: Callable[..., subprocess.CompletedProcess] = subprocess.run,
              env: dict | None = None, budget_s: float = float("inf")) -> list[PartResult]:
    """Run each part (a subprocess of `python -m app`) and judge it, all within `budget_s` seconds."""
    results = []
    deadline = time.perf_counter() + budget_s
    for p in parts:
        if p.skip:
            results.append(PartResult(p.name, "skip", p.skip))
            continue
        limit = min(p.timeout_s, deadline - time.perf_counter())
        if limit < 10:
            results.append(PartResult(p.name, "skip", "no time left in the check's budget"))
            continue
        t0 = time.perf_counter()
        try:
            r = runner([sys.executable, "-m", "app", *p.argv], capture_output=True, text=True, timeout=limit, env=env)
        except subprocess.TimeoutExpired:
            results.append(PartResult(p.name, "fail", f"timed out after {limit:.0f} s", time.perf_counter() - t0))
            continue
        wall = time.perf_counter() - t0
        tail = (r.stderr or r.stdout or "").strip().splitlines()[-1:] or [""]
        if p.kind == "gui":
            ok = r.returncode == 0 and Path(p.output).is_file() and Path(p.output).stat().st_size > 10_000
            results.append(PartResult(p.name, "pass" if ok else "fail", p.output if ok else f"rc {r.returncode}: {tail[0][:160]}", wall))
            continue
        ok, detail, figures = _read_bench(p.output)
        if r.returncode != 0:
            ok, detail = False, f"rc {r.returncode}: {tail[0][:160]}"
        results.append(PartResult(p.name, "pass" if ok else "fail", detail, wall, figures))
    return results


def format_summary(results: Sequence[PartResult], telemetry: dict | None = None) -> str:
    lines = ["gpu-check summary"]
    for r in results:
        lines.append(f"  [{r.status.upper():4}] {r.name}: {r.detail}" + (f" ({r.wall_s:.0f} s)" if r.wall_s else ""))
        for setup, f in r.figures.items():
            sp = f.get("speedup")
            lines.append(f"         {setup}: {f['tok/s']} tok/s" + (f", {sp:.2f}x" if isinstance(sp, (int, float)) else ""))
    if telemetry:
        lines.append("  NVML during the runs: " + ", ".join(f"{k} {v}" for k, v in telemetry.items()))
    n_fail = sum(r.status == "fail" for r in results)
    lines.append(f"{sum(r.status == 'pass' for r in results)} passed, {n_fail} failed, {sum(r.status == 'skip' for r in results)} skipped")
    return "\n".join(lines)


def _telemetry_summary(samples) -> dict:
    util = [g.util_pct for s in samples for g in s.gpus if g.util_pct == g.util_pct]
    mem = [g.mem_used_mib for s in samples for g in s.gpus if g.mem_used_mib == g.mem_used_mib]
    power = [g.power_w for s in samples for g in s.gpus if g.power_w == g.power_w]
    out = {"samples": len(samples)}
    if util:
        out["max util %"] = round(max(util))
        out["mean util %"] = round(sum(util) / len(util))
    if mem:
        out["max memory MiB"] = round(max(mem))
    if power:
        out["max power W"] = round(max(power))
    return out


def add_parser(sub) -> None:
    g = sub.add_parser("gpu-check", help="on a machine with an NVIDIA GPU: CUDA lanes, NVML telemetry, a GUI screenshot, TensorRT-LLM; one summary")
    g.add_argument("--out", default="out/gpu-check", help="folder for reports and the screenshot")
    g.add_argument("--budget-s", type=float, default=280.0, help="the whole check's time (parts that no longer fit are skipped)")
    g.set_defaults(func=run)


def run(args) -> int:
    present, words = gpu_presence()
    if not present:
        print(f"gpu-check: {words}. Nothing to check on this machine (run it where an NVIDIA GPU and a CUDA build of torch are).")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from app.engines.status import scan_status

    # each trtllm engine is checked in the environment its worker runs in (.venv-trtllm from `make trtllm-env`)
    trt_status = [s for s in scan_status()[0] if s.backend == "trtllm"]
    trt_engines = [s.name for s in trt_status if s.usable]
    trt = (True, "") if trt_engines else (False, trt_status[0].reason if trt_status else "no trtllm manifests")
    parts = plan_parts(out, trtllm=trt, trt_engines=trt_engines)
    print(f"gpu-check: {words}; {sum(not p.skip for p in parts)} parts to run, reports in {out}", flush=True)
    from app.telemetry.sampler import TelemetrySampler

    env = dict(os.environ, QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"))
    with TelemetrySampler(rate_hz=5.0, pids={"gpu-check": os.getpid()}) as sampler:
        results = run_parts(parts, env=env, budget_s=args.budget_s)
        telemetry = _telemetry_summary(sampler.samples())
    (out / "telemetry.json").write_text(json.dumps(sampler.to_json()), encoding="utf-8")
    print(format_summary(results, telemetry))
    return 1 if any(r.status == "fail" for r in results) else 0

