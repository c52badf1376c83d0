"""Does the GUI slow the lanes it measures? Tokens/s of the same lanes, headless (`bench`) and in the GUI.

Runs, alternating (the order rotates every round, so drift of the machine's load cancels out):

    python -m app bench --target T --setup ngram --setup draft:D,k=4 --prompt P --mode interleaved --warmup 4 --json A
    python -m app gui --target T --setup baseline --setup ngram --setup draft:D,k=4 --prompt P --mode interleaved
                      --autorun --quit-after-run --export B --settings tmp.ini        (one per --platform)

and prints per-setup tokens/s side by side (median over the rounds, and every round's value) with the ratio
GUI / headless, then each round's GUI run against its own headless run (the median of those paired ratios with a
bootstrapped 90 % interval, and whether it shows the GUI within 5 % of headless, slower, or not decided yet), how
long the lanes waited for a CPU (the worker's run-queue delay, LaneStats.cpu_wait_s: what other processes took
from them, a steadier figure than tokens/s), plus the load average around each run and, for the GUI
runs, the window's and the worker's CPU and how late the window's event loop ran (is the window still live?).

    python resources/bench/gui_vs_headless.py --rounds 3 --platform offscreen --platform xvfb

Platforms: `offscreen` (QT_QPA_PLATFORM=offscreen: Qt paints into memory, nothing is shown), `xvfb` (a real X
server in memory through xvfb-run: the GUI pays for what a desktop pays), `display` (the current $DISPLAY).
The default is xvfb when $DISPLAY is unset and xvfb-run exists, else the current display.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.core.costs import machine_summary  # noqa: E402 (after the path)

DEFAULT_PROMPT = (
    "Complete this Python function that checks whether a string is a palindrome, ignoring case and "
    "non-alphanumeric characters:\n\ndef is_palindrome(s: str) -> bool:\n"
)


def load_avg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, float, str]:
    t = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode, time.monotonic() - t, (r.stderr or "")[-1500:]


def per_setup(doc: dict) -> dict[str, float]:
    return {r["setup"]: r["tokens_per_s"] for r in doc.get("runs", []) if r.get("tokens_per_s") is not None}


def cpu_waits(doc: dict) -> dict[str, float]:
    """setup → its lanes' CPU wait, percent of their time (setups without the figure are left out)."""
    return {r["setup"]: 100 * r["cpu_wait_share"] for r in doc.get("summary", []) if r.get("cpu_wait_share") is not None}


def gui_cpu(doc: dict) -> tuple[float, float]:
    """(GUI, worker) mean CPU % of one core while the lanes ran (the export's own figure when it has one, else
    the mean over every telemetry sample of the run)."""
    load = (doc.get("gui") or {}).get("load") or {}
    if load.get("gui_cpu_pct") is not None:
        return load["gui_cpu_pct"], load.get("worker_cpu_pct") or float("nan")
    vals: dict[str, list[float]] = {"gui": [], "worker": []}
    for s in doc.get("telemetry", []):
        for p in s.get("host", {}).get("procs", []):
            if p.get("role") in vals and p.get("cpu_pct") is not None:
                vals[p["role"]].append(p["cpu_pct"])
    return tuple(statistics.fmean(v) if v else float("nan") for v in (vals["gui"], vals["worker"]))  # type: ignore[return-value]


def paired_summary(ratios: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """(median, 5th, 95th percentile of the bootstrapped median) of per-round GUI/headless ratios: scipy's percentile
    bootstrap with a fixed seed, so a summary of the same reports prints the same interval. One ratio: (r, r, r)."""
    if len(ratios) < 2:  # nothing to resample (scipy refuses a single observation)
        return (ratios[0],) * 3
    ci = scipy.stats.bootstrap((ratios,), np.median, confidence_level=0.90, n_resamples=resamples, method="percentile",
                               rng=np.random.default_rng(seed)).confidence_interval
    return statistics.median(ratios), float(ci.low), float(ci.high)


def pooled_round_ratios(headless: dict[str, dict[int, float]], gui: dict[str, dict[int, float]]) -> dict[int, float]:
    """Per round, the geometric mean of its setups' GUI/headless ratios (setup → round → tok/s; rounds where a
    setup is missing from either side use the setups both have). One figure a round from all its lanes: the window's
    cost is about the same for every lane, while each lane's own noise partly averages out."""
    rounds = sorted({r for s in gui for r in gui[s]} & {r for s in headless for r in headless[s]})
    out = {}
    for r in rounds:
        logs = [math.log(gui[s][r] / headless[s][r]) for s in gui if s in headless and r in gui[s] and r in headless[s]]
        if logs:
            out[r] = math.exp(statistics.fmean(logs))
    return out


def round_wait_increments(headless: dict[str, dict[int, float]], gui: dict[str, dict[int, float]]) -> dict[int, float]:
    """Per round, the mean over its setups of the lanes' CPU wait in the GUI run minus the headless run (points)."""
    out = {}
    for r in sorted({r for s in gui for r in gui[s]} & {r for s in headless for r in headless[s]}):
        d = [gui[s][r] - headless[s][r] for s in gui if s in headless and r in gui[s] and r in headless[s]]
        if d:
            out[r] = statistics.fmean(d)
    return out


def verdict(lo: float, hi: float, within: float = 0.05, than: str = "headless") -> str:
    """What a 90 % interval of a ratio to `than` says about "within `within` of `than`"."""
    if lo >= 1 - within:
        return f"within {100 * within:.0f} % of {than}"
    if hi < 1 - within:
        return f"more than {100 * within:.0f} % slower than {than}"
    return f"not decided by these rounds (the interval spans {1 - within:.2f}: run more)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default="smollm2-135m-instruct")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--platform", action="append", choices=("offscreen", "xvfb", "display"),
                    help="how the GUI is shown (repeatable); default: xvfb without $DISPLAY, else display")
    ap.add_argument("--out", help="keep the JSON reports in this folder (default: a temporary one)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--reports", metavar="DIR", help="run nothing: summarise the reports an earlier --out DIR kept")
    args = ap.parse_args(argv)
    if args.reports:
        args.out = args.reports
        found = [int(f.stem.rsplit("-", 1)[1]) for f in Path(args.reports).glob("bench-*.json")]
        if not found:
            ap.error(f"no bench-N.json reports in {args.reports}")
        args.rounds = max(found) + 1
        args.platform = args.platform or sorted({f.stem.rsplit("-", 1)[0] for f in Path(args.reports).glob("*-*.json")} - {"bench"})

    platforms = args.platform or (["xvfb"] if not os.environ.get("DISPLAY") and shutil.which("xvfb-run") else ["display"])
    if "xvfb" in platforms and not args.reports and not shutil.which("xvfb-run"):  # summarising kept reports runs nothing
        ap.error("xvfb-run is not installed (apt-get install xvfb)")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gui-vs-headless-"))
    out.mkdir(parents=True, exist_ok=True)
    setups = ["ngram", f"draft:{args.draft},k=4"]
    common = ["--target", args.target, "--prompt", args.prompt, "--mode", "interleaved", "--max-new-tokens", str(args.max_new_tokens)]
    base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base_env.pop("QT_QPA_PLATFORM", None)

    def command(kind: str, path: Path, rnd: int) -> tuple[list[str], dict[str, str]]:
        env = dict(base_env)
        if kind == "bench":
            cmd = [sys.executable, "-m", "app", "bench", *common, *(x for s in setups for x in ("--setup", s)),
                   "--warmup", "4", "--quiet", "--json", str(path)]
            return cmd, env
        cmd = [sys.executable, "-m", "app", "gui", *common, *(x for s in ["baseline", *setups] for x in ("--setup", s)),
               "--autorun", "--quit-after-run", "--export", str(path), "--settings", str(out / f"{kind}-{rnd}.ini")]
        if kind == "offscreen":
            env["QT_QPA_PLATFORM"] = "offscreen"
        elif kind == "xvfb":
            cmd = ["xvfb-run", "-a", "-s", "-screen 0 1600x1000x24", *cmd]
        return cmd, env

    kinds = ["bench", *platforms]
    tps: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
    waits: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
    waits_by_round: dict[str, dict[str, dict[int, float]]] = {k: {} for k in kinds}  # kind → setup → round → wait %
    by_round: dict[str, dict[str, dict[int, float]]] = {k: {} for k in kinds}  # kind → setup → round → tok/s
    lags: dict[str, list[float]] = {k: [] for k in platforms}
    cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in platforms}
    loads: list[float] = []
    print(f"CPU: {machine_summary()}")
    print(f"target {args.target}, setups baseline + {' + '.join(setups)}, {args.max_new_tokens} tokens, interleaved; reports in {out}\n")
    for rnd in range(args.rounds):
        order = kinds[rnd % len(kinds):] + kinds[: rnd % len(kinds)]
        for kind in order:
            path = out / f"{kind}-{rnd}.json"
            if args.reports:  # summarise an earlier run's reports
                if not path.is_file():
                    continue
                rc, wall, err, l0, l1 = 0, 0.0, "", float("nan"), float("nan")
            else:
                cmd, env = command(kind, path, rnd)
                l0 = load_avg()
                rc, wall, err = run(cmd, env, args.timeout)
                l1 = load_avg()
                loads += [l0, l1]
            if rc != 0 or not path.is_file():
                print(f"round {rnd + 1} {kind}: exit {rc} after {wall:.0f} s\n{err}", file=sys.stderr)
                continue
            doc = json.loads(path.read_text(encoding="utf-8"))
            got = per_setup(doc)
            for s, v in got.items():
                tps[kind].setdefault(s, []).append(v)
                by_round[kind].setdefault(s, {})[rnd] = v
            for s, v in cpu_waits(doc).items():
                waits[kind].setdefault(s, []).append(v)
                waits_by_round[kind].setdefault(s, {})[rnd] = v
            extra = ""
            if kind != "bench":
                g, w = gui_cpu(doc)
                cpu[kind].append((g, w))
                lag = ((doc.get("gui") or {}).get("load") or {}).get("lag_max_ms")
                if lag is not None:
                    lags[kind].append(lag)
                extra = f"; GUI CPU {g:.0f} %, worker {w:.0f} % of one core" + (f", event loop ≤ {lag:.0f} ms late" if lag is not None else "")
            print(f"round {rnd + 1} {kind:>9}: " + ", ".join(f"{s} {v:.2f}" for s, v in got.items())
                  + f" tok/s  ({'kept report' if args.reports else f'{wall:.0f} s, load {l0:.2f} → {l1:.2f}'}{extra})", flush=True)

    print()
    names = list(dict.fromkeys(s for k in kinds for s in tps[k]))
    head = (["setup", "headless tok/s"] + [f"{p} tok/s" for p in platforms] + [f"{p}/headless" for p in platforms]
            + ["CPU wait: headless"] + list(platforms))

    def med_wait(kind: str, s: str) -> str:
        w = waits[kind].get(s, [])
        return f"{statistics.median(w):.1f} %" if w else "–"

    rows = []
    for s in names:
        h = tps["bench"].get(s, [])
        hm = statistics.median(h) if h else float("nan")
        row = [s, f"{hm:.2f} ({', '.join(f'{x:.1f}' for x in h)})"]
        ratios = []
        for p in platforms:
            g = tps[p].get(s, [])
            gm = statistics.median(g) if g else float("nan")
            row.append(f"{gm:.2f} ({', '.join(f'{x:.1f}' for x in g)})")
            ratios.append(f"{gm / hm:.3f}" if h and g else "–")
        rows.append(row + ratios + [med_wait(k, s) for k in kinds])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    print()
    print("each round's GUI run against its own headless run (adjacent in time, so the machine's drift cancels):")
    for p in platforms:
        for s in names:
            h, g = by_round["bench"].get(s, {}), by_round[p].get(s, {})
            ratios = [g[r] / h[r] for r in sorted(set(h) & set(g))]
            if not ratios:
                continue
            med, lo, hi = paired_summary(ratios)
            wh, wg = waits["bench"].get(s, []), waits[p].get(s, [])
            extra = f", lanes' CPU wait +{statistics.median(wg) - statistics.median(wh):.1f} points" if wh and wg else ""
            print(f"  {p} {s}: GUI/headless {med:.3f} (90 % interval {lo:.3f}–{hi:.3f}, {len(ratios)} pairs{extra}): "
                  f"{verdict(lo, hi)}")
        pooled = pooled_round_ratios(by_round["bench"], by_round[p])
        if len(names) > 1 and pooled:
            med, lo, hi = paired_summary(list(pooled.values()))
            print(f"  {p} all setups (each round's ratios, geometric mean): GUI/headless {med:.3f} (90 % interval "
                  f"{lo:.3f}–{hi:.3f}, {len(pooled)} rounds): {verdict(lo, hi)}")
            extra = round_wait_increments(waits_by_round["bench"], waits_by_round[p])
            both = sorted(set(pooled) & set(extra))
            if len(both) >= 3:
                print("  each round, all setups: GUI/headless and the lanes' extra CPU wait (points) — if the window's"
                      " load moved the ratio, the two would move together:")
                print("    " + ", ".join(f"{pooled[r]:.3f} {extra[r]:+.1f}" for r in both))
                xs, ys = [extra[r] for r in both], [pooled[r] for r in both]
                if statistics.pstdev(xs) > 0 and statistics.pstdev(ys) > 0:
                    print(f"    correlation {statistics.correlation(xs, ys):+.2f} over {len(both)} rounds")
    for p in platforms:
        if cpu[p]:
            g = statistics.fmean(x[0] for x in cpu[p])
            w = statistics.fmean(x[1] for x in cpu[p])
            late = f"; its event loop ran up to {max(lags[p]):.0f} ms late" if lags[p] else ""
            print(f"{p}: GUI process {g:.0f} % of one core, worker {w:.0f} % during the GUI runs{late}")
    if loads:
        print(f"load average (1 min) around the runs: {min(loads):.2f} – {max(loads):.2f}, mean {statistics.fmean(loads):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
