"""Peak memory of a worker-like process: load engines, run one short lane, report peak RSS against the weights' bytes.

    .venv/bin/python resources/bench/memory.py                       # the Qwen pair: 1.5B fp32 target + 0.5B int8 draft
    .venv/bin/python resources/bench/memory.py --draft none          # the target alone
    .venv/bin/python resources/bench/memory.py --target smollm2-135m-instruct --target-dtype int8 --draft none --json -

The measurement runs in a fresh child process (so nothing loaded before counts): it imports torch and transformers,
takes that RSS as the baseline, loads the engines the way the worker does (tokenizers, then weights, int8
quantization, oneDNN packing), records the peak RSS of the load (VmHWM), resets the peak (/proc/self/clear_refs) and
runs one greedy lane (the draft proposes k tokens, the target verifies them in one forward), then records the run's
peak. `weights` is what the engines hold afterwards (`cpu_kernels.weight_bytes`: parameters, buffers, packed and
int8 copies, each once, an embedding still mapped from its file included); the ratio is (peak − baseline) ÷
weights. Linux only (/proc). Sizes in MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
PROMPT = "Write a Python function that checks whether a string is a palindrome, ignoring case and punctuation."


def _status() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and VmHWM of this process, in MiB."""
    with open("/proc/self/status") as f:
        d = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: int(d[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM") if k in d}


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0); False when not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _lane(target, draft, prompt_ids: list[int], max_new: int, k: int) -> list[int]:
    """Greedy speculative decoding with the Engine protocol only (new_state / forward / crop): the draft proposes
    k tokens, the target verifies them in one (k+1)-token forward; without a draft, one token per forward."""
    ts = target.new_state()
    t = int(ts.forward(prompt_ids, last_only=True)[-1].argmax())
    out = [t]
    ds = draft.new_state() if draft is not None else None
    pending = [*prompt_ids, t]  # what the draft's cache lacks, up to the last emitted token t
    while len(out) < max_new and t not in target.eos_ids:
        if ds is None:
            t = int(ts.forward([t], last_only=True)[-1].argmax())
            out.append(t)
            continue
        drafts, x = [], pending
        for _ in range(k):
            drafts.append(int(ds.forward(x, last_only=True)[-1].argmax()))
            x = drafts[-1:]
        n = ts.length  # the target's cache ends just before t
        preds = ts.forward([t, *drafts]).argmax(-1).tolist()  # [k+1]
        a = 0
        while a < k and preds[a] == drafts[a]:
            a += 1
        ts.crop(n + 1 + a)  # keep t and the accepted drafts
        ds.crop(min(ds.length, n + 1 + a))
        t = preds[a]  # correction, or bonus when a == k
        out.extend([*drafts[:a], t])
        pending = [drafts[-1], t] if a == k else [t]
    return out[:max_new]


def child(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    from app.engines.cache import prepare
    from app.engines.cpu_kernels import weight_bytes
    from app.engines.hf import HFEngine, load_tokenizer
    from app.engines.registry import resolve

    specs = [(args.target, args.target_dtype)] + ([(args.draft, args.draft_dtype)] if args.draft != "none" else [])
    manifests = [resolve(name) for name, _ in specs]
    folders = [prepare(m) for m in manifests]  # conversion (first use only) is not what we measure
    base = _status()
    tokenizers = [load_tokenizer(f) for f in folders]  # as the worker's pool does, to check a draft's vocabulary
    with_tokenizers = _status()
    t0 = time.perf_counter()
    engines = [HFEngine(m, dtype=dtype, tokenizer=tok) for m, (_, dtype), tok in zip(manifests, specs, tokenizers, strict=True)]
    load_s = time.perf_counter() - t0
    after_load = _status()
    rows = []
    for e, folder in zip(engines, folders, strict=True):
        file_bytes = sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))
        rows.append(
            {
                "engine": e.name,
                "dtype": e.dtype,
                "file_mib": file_bytes / 2**20,
                "weights_mib": weight_bytes(e.model) / 2**20,
                "packed_linears": e.packed_linears,
                "int8_linears": e.int8_linears,
            }
        )
    target, draft = engines[0], (engines[1] if len(engines) > 1 else None)
    prompt_ids = target.encode_prompt(args.prompt)
    reset = _reset_peak()
    t0 = time.perf_counter()
    with torch.inference_mode():
        ids = _lane(target, draft, prompt_ids, args.max_new_tokens, args.k)
    run_s = time.perf_counter() - t0
    after_run = _status()
    weights = sum(r["weights_mib"] for r in rows)
    run_peak = after_run["VmHWM"] if reset else float("nan")
    return {
        "engines": rows,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "baseline_mib": base["VmRSS"],
        "tokenizers_mib": with_tokenizers["VmRSS"] - base["VmRSS"],
        "weights_mib": weights,
        "load_peak_mib": after_load["VmHWM"],
        "after_load": after_load,
        "run_peak_mib": run_peak,
        "after_run": after_run,
        "load_ratio": (after_load["VmHWM"] - base["VmRSS"]) / weights,
        "run_ratio": (run_peak - base["VmRSS"]) / weights,
        "load_ratio_without_tokenizers": (after_load["VmHWM"] - with_tokenizers["VmRSS"]) / weights,
        "load_s": load_s,
        "run_s": run_s,
        "prompt_tokens": len(prompt_ids),
        "new_tokens": len(ids),
        "text": target.decode(ids),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--target-dtype", default="float32")
    ap.add_argument("--draft", default=DRAFT, help='draft engine, or "none"')
    ap.add_argument("--draft-dtype", default="int8")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=4, help="drafted tokens per step")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON (- for stdout)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *(argv if argv is not None else sys.argv[1:])]
    p = subprocess.run(cmd, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode or line is None:
        sys.stderr.write(p.stderr[-4000:])
        return p.returncode or 1
    r = json.loads(line[len("RESULT ") :])
    for e in r["engines"]:
        print(
            f"{e['engine']:32s} {e['dtype']:8s} file {e['file_mib']:8.0f} MiB  holds {e['weights_mib']:8.0f} MiB"
            f"  ({e['packed_linears']} packed, {e['int8_linears']} int8 linears)"
        )
    print(
        f"baseline (torch + transformers imported) {r['baseline_mib']:.0f} MiB, tokenizers {r['tokenizers_mib']:.0f} MiB; "
        f"weights held {r['weights_mib']:.0f} MiB"
    )
    print(
        f"load: peak RSS {r['load_peak_mib']:.0f} MiB, {r['load_ratio']:.2f}x the weights "
        f"({r['load_ratio_without_tokenizers']:.2f}x without the tokenizers; {r['load_s']:.1f} s); "
        f"after: anon {r['after_load']['RssAnon']:.0f}, file {r['after_load']['RssFile']:.0f} MiB"
    )
    print(
        f"run ({r['prompt_tokens']} prompt + {r['new_tokens']} new tokens, {r['run_s']:.1f} s): peak RSS {r['run_peak_mib']:.0f} MiB, "
        f"{r['run_ratio']:.2f}x the weights"
    )
    if args.json:
        text = json.dumps(r, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
