"""What a remote lane costs over a local one: the same llama.cpp GGUF decoded by SpecDeck's own llama.cpp lane and
by llama-server on 127.0.0.1 (started here, the same thread count, no draft), in one `bench` run, lanes one after
another (`--mode sequential`: a server on the same machine must not share the cores with a local lane).

The difference is what the HTTP path adds: a request, server-sent events per token, JSON parsing, a reader thread.

    make llama-server
    python resources/bench/remote_overhead.py --engine llamacpp-qwen2.5-coder-1.5b-instruct --tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.core.costs import machine_summary  # noqa: E402
from app.engines.cache import prepare_gguf  # noqa: E402
from app.engines.llamacpp import physical_cores  # noqa: E402
from app.engines.registry import resolve  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="llamacpp-qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--suite", default="quick")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--server", default=os.environ.get("SPECDECK_LLAMA_SERVER", str(ROOT / ".cache/llama-server/bin/llama-server")))
    ap.add_argument("--json", default=None, help="also write the bench report here")
    args = ap.parse_args()
    if not Path(args.server).is_file():
        sys.exit(f"llama-server not found at {args.server}: run `make llama-server`")
    m = resolve(args.engine)
    gguf = prepare_gguf(m)
    threads = int(m.extra.get("llamacpp", {}).get("n_threads", physical_cores()))
    url = f"http://127.0.0.1:{args.port}"
    log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log")  # noqa: SIM115
    proc = subprocess.Popen([args.server, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(args.port), "-c", "4096", "-t", str(threads),
                             "-np", "1", "--no-webui", "-a", "served"], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    log.seek(0)
                    sys.exit("llama-server exited:\n" + log.read()[-2000:])
                time.sleep(0.2)
        where = Path(tempfile.mkdtemp())
        manifest = where / f"served-{args.engine}.toml"  # found by name through SPECDECK_ENGINES_PATH
        manifest.write_text(f'backend = "openai"\ndescription = "{args.engine} on llama-server"\n[openai]\n'
                            f'base_url = "{url}"\nmodel = "served"\ntokenizer = "{args.engine}"\n')
        out = args.json or str(Path(tempfile.mkdtemp()) / "remote-overhead.json")
        cmd = [sys.executable, "-m", "app", "bench", "--target", args.engine, "--setup", f"remote:{manifest.stem}", "--suite", args.suite,
               "--max-new-tokens", str(args.tokens), "--repeats", str(args.repeats), "--mode", "sequential", "--json", out, "--quiet"]
        print("$", " ".join(cmd), flush=True)
        env = {**os.environ, "SPECDECK_ENGINES_PATH": os.pathsep.join(filter(None, [str(where), os.environ.get("SPECDECK_ENGINES_PATH")]))}
        r = subprocess.run(cmd, cwd=ROOT, env=env)
        if r.returncode:
            return r.returncode
        doc = json.loads(Path(out).read_text())
    finally:
        proc.terminate()
        proc.wait(20)
    rows: dict[str, list[dict]] = {}
    for run in doc["runs"]:
        rows.setdefault("local" if run["setup"] == "baseline" else "remote", []).append(run)

    def mean(rs: list[dict], key: str) -> float:
        return sum(float(x[key]) for x in rs) / len(rs)

    print(f"\nMachine: {machine_summary()}; llama-server -t {threads}, SpecDeck's llama.cpp lane n_threads {threads}")
    print(f"{'lane':<8}{'runs':>5}{'tok/s':>9}{'TTFT ms':>9}{'identical':>11}")
    for name in ("local", "remote"):
        rs = rows[name]
        ident = sum(1 for x in rs if x.get("identical_to_baseline") in (True, None))
        print(f"{name:<8}{len(rs):>5}{mean(rs, 'tokens_per_s'):>9.2f}{1000 * mean(rs, 'ttft_s'):>9.1f}{ident:>7}/{len(rs)}")
    loc, rem = mean(rows["local"], "tokens_per_s"), mean(rows["remote"], "tokens_per_s")
    print(f"remote/local: {rem / loc:.3f}x tokens/s; added per token: {1000 * (1 / rem - 1 / loc):+.2f} ms; "
          f"added to TTFT: {1000 * (mean(rows['remote'], 'ttft_s') - mean(rows['local'], 'ttft_s')):+.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
