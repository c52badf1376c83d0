"""Does drawing a run slow its lanes? One window and one worker run the same lanes pass after pass, live and frozen.

gui_vs_headless.py compares separate processes, and on a small VM whole processes run up to ±10 % apart (the
machine, not the build), so a few percent take ~100 of its rounds to show. Here one window (the real MainWindow,
started as `python -m app gui` starts it) and its one worker run the same lanes again and again:

    live    the window draws the run as it draws any run (lane text, plots, status bar, telemetry);
    frozen  the window's thread blocks from the moment the run is sent until the worker's last event of it has
            reached the window's event-draining thread: nothing is drawn and no timer fires while the lanes run.
            The worker, and the draining thread that collects its events, run as they do under `bench` (whose
            main thread collects the same events); the backlog is drawn afterwards.

The first pass warms both up (the models load, the window lays out its first run) and is shown apart. Then the
passes come in pairs, L F, F L, L F, … (a steady drift of the machine cancels), each pair giving the geometric mean
over the setups of live / frozen tokens/s; the median over the pairs with a bootstrapped 90 % interval says whether
the live window keeps the lanes within 5 % of a frozen one. Per mode it also prints how long the lanes waited for a
CPU (the worker's run-queue delay: what other threads took from them), the window process's CPU and how many times
its event loop ran while the lanes ran.

    python resources/bench/gui_live_vs_frozen.py --pairs 12          # under xvfb-run when $DISPLAY is unset
    python resources/bench/gui_live_vs_frozen.py --pairs 1 --max-new-tokens 8 --platform offscreen
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PROMPT = (
    "Complete this Python function that checks whether a string is a palindrome, ignoring case and "
    "non-alphanumeric characters:\n\ndef is_palindrome(s: str) -> bool:\n"
)
LIVE, FROZEN, WARMUP = "live", "frozen", "warm-up"


@functools.lru_cache(maxsize=1)
def _headless_script():
    """gui_vs_headless.py as a module: its report readers, bootstrap and verdict serve both scripts (bench scripts are
    not a package, so by path)."""
    spec = importlib.util.spec_from_file_location("gui_vs_headless", Path(__file__).with_name("gui_vs_headless.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def pass_order(pairs: int) -> list[str]:
    """The warm-up pass, then `pairs` pairs alternating which mode goes first: L F, F L, L F, …"""
    return [WARMUP] + [m for i in range(pairs) for m in ((LIVE, FROZEN) if i % 2 == 0 else (FROZEN, LIVE))]


def pair_ratios(passes: list[tuple[str, dict[str, float]]]) -> list[float]:
    """Per pair of consecutive passes after the warm-up (mode, setup → tok/s), the geometric mean over the setups
    both passes have of live / frozen tokens/s. A pair cut short (the last pass missing) is left out."""
    body = [p for p in passes if p[0] != WARMUP]
    out = []
    for a, b in zip(body[0::2], body[1::2], strict=False):
        modes = {a[0]: a[1], b[0]: b[1]}
        if set(modes) != {LIVE, FROZEN}:
            raise ValueError(f"a pair must be one live and one frozen pass, not {a[0]} and {b[0]}")
        live, frozen = modes[LIVE], modes[FROZEN]
        logs = [math.log(live[s] / frozen[s]) for s in live if s in frozen and live[s] > 0 and frozen[s] > 0]
        if logs:
            out.append(math.exp(statistics.fmean(logs)))
    return out


def figures(report: dict) -> tuple[dict[str, float], dict[str, float], dict]:
    """(setup → tok/s, setup → lanes' CPU wait %, the window's load figures) from MainWindow.report() (the bench
    schema: read as gui_vs_headless.py reads it)."""
    gvh = _headless_script()
    return gvh.per_setup(report), gvh.cpu_waits(report), (report.get("gui") or {}).get("load") or {}


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def run_passes(args) -> list[tuple[str, dict[str, float], dict[str, float], dict]]:
    """Start the window as `python -m app gui` does and run the passes; returns (mode, tok/s, wait %, load) per pass.
    Raises RuntimeError when a run is refused, fails, or its worker stays silent for `args.timeout` seconds."""
    from dataclasses import replace

    import shiboken6
    from PySide6.QtCore import QSettings, QTimer

    from app.core.errors import SpecDeckError
    from app.ui.main import gui_app
    from app.ui.main_window import MainWindow
    from app.worker.messages import RunFinished

    app, _ = gui_app()
    order = pass_order(args.pairs)
    out: list = []
    state: dict = {"i": 0, "run": None, "error": None}
    finished = threading.Event()
    with tempfile.TemporaryDirectory() as tmp:
        win = MainWindow(settings=QSettings(str(Path(tmp) / "s.ini"), QSettings.Format.IniFormat))
        s = win.session().with_(target=args.target, setups=tuple(args.setup), prompt=args.prompt, prompt_id="custom",
                                mode="interleaved")
        try:
            win.apply_session(s.with_(sampling=replace(s.sampling, max_new_tokens=args.max_new_tokens)))
        except SpecDeckError as e:
            win.shutdown()
            shiboken6.delete(win)
            raise RuntimeError(f"{e.message} (check --target, --setup and --max-new-tokens)") from None
        win.resize(1560, 980)
        win.show()
        bridge = win.bridge
        post = bridge._post  # the draining thread's hand-over: the run's RunFinished unblocks a frozen pass

        def seen(ev) -> None:
            post(ev)
            if isinstance(ev, RunFinished) and ev.run_id == state["run"]:
                finished.set()

        bridge._post = seen

        def fail(why: str) -> None:
            state["error"] = why
            app.quit()

        def next_pass() -> None:
            if state["i"] >= len(order):
                app.quit()
                return
            finished.clear()
            state["t_start"] = time.monotonic()
            state["run"] = win.run()
            if state["run"] is None:
                fail(f"the window refused the run: {win.status_label.text()}")
            elif order[state["i"]] == FROZEN and not finished.wait(args.timeout):
                fail(f"no end of the run from the worker in {args.timeout:.0f} s")

        def ended(run_id: str) -> None:
            watchdog.stop()
            try:
                record(run_id)
            except Exception as e:  # a slot's exception would leave the loop waiting for a pass that never starts
                fail(f"{type(e).__name__}: {e}")

        def record(_run_id: str) -> None:
            results = win.controller.results
            if results is None or not results.all_completed:
                fail(f"a lane did not finish: {win.status_label.text()}")
                return
            tps, waits, load = figures(win.report())
            mode = order[state["i"]]
            out.append((mode, tps, waits, load))
            print(f"pass {state['i']:>2} {mode:>7}: " + ", ".join(f"{k} {v:.2f}" for k, v in tps.items()) + " tok/s · lanes' CPU wait "
                  + ", ".join(f"{v:.1f}" for v in waits.values()) + f" % · window CPU {_num(load.get('gui_cpu_pct')):.1f} %"
                  + f" · event-loop ticks {load.get('lag_ticks') or 0} in {time.monotonic() - state['t_start']:.1f} s", flush=True)
            state["i"] += 1
            QTimer.singleShot(1000, next_pass)  # let the window settle (a frozen pass draws its backlog now)

        win.runEnded.connect(ended)
        watchdog = QTimer()
        watchdog.setInterval(int(args.timeout * 1000))
        watchdog.timeout.connect(lambda: fail(f"a live pass did not end in {args.timeout:.0f} s"))
        win.runStarted.connect(lambda _rid: watchdog.start())
        QTimer.singleShot(0, next_pass)
        app.exec()
        watchdog.stop()
        win.close()
        shiboken6.delete(win)  # before Qt is torn down (PySide 6.11 + pyqtgraph crash at exit otherwise)
    if state["error"]:
        raise RuntimeError(state["error"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--setup", action="append", help="a lane's setup (repeatable; default: baseline, ngram, "
                    "draft:smollm2-135m-instruct,k=4)")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--pairs", type=int, default=8, help="live/frozen pairs after the warm-up pass (default 8)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a pass may take")
    ap.add_argument("--platform", choices=("xvfb", "offscreen", "display"),
                    help="default: xvfb when $DISPLAY is unset and xvfb-run exists, else the current display")
    args = ap.parse_args(argv)
    args.setup = args.setup or ["baseline", "ngram", "draft:smollm2-135m-instruct,k=4"]
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    platform = args.platform or ("xvfb" if not os.environ.get("DISPLAY") and shutil.which("xvfb-run") else "display")
    if platform == "xvfb" and not os.environ.get("SPECDECK_LIVE_FROZEN_CHILD"):
        if not shutil.which("xvfb-run"):
            ap.error("xvfb-run is not installed (apt-get install xvfb), or pass --platform offscreen")
        cmd = ["xvfb-run", "-a", "-s", "-screen 0 1600x1000x24", sys.executable, str(Path(__file__).resolve()),
               *(argv if argv is not None else sys.argv[1:]), "--platform", "xvfb"]
        return subprocess.call(cmd, env={**os.environ, "SPECDECK_LIVE_FROZEN_CHILD": "1"}, cwd=ROOT)
    if platform == "offscreen":
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    sys.path.insert(0, str(ROOT))
    from app.core.costs import machine_summary
    from app.ui.load import cpu_cores

    print(f"{machine_summary()} ({cpu_cores()} usable) · {platform} · {args.target}: {', '.join(args.setup)} · "
          f"{args.max_new_tokens} tokens a lane, interleaved · 1 warm-up pass + {args.pairs} live/frozen pairs", flush=True)
    t0 = time.monotonic()
    try:
        passes = run_passes(args)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    gvh = _headless_script()
    ratios = pair_ratios([(m, t) for m, t, _w, _l in passes])
    print(f"\n{len(passes)} passes in {time.monotonic() - t0:.0f} s")
    print("each pair, live / frozen (geometric mean over the setups): " + ", ".join(f"{r:.3f}" for r in ratios))
    for mode in (LIVE, FROZEN):
        mine = [p for p in passes if p[0] == mode]
        waits = [statistics.fmean(p[2].values()) for p in mine if p[2]]
        cpu = [p[3]["gui_cpu_pct"] for p in mine if p[3].get("gui_cpu_pct") is not None]
        ticks = [p[3].get("lag_ticks") or 0 for p in mine]
        print(f"{mode:>7}: lanes' CPU wait {statistics.median(waits) if waits else float('nan'):.1f} % (median over passes) · "
              f"window process {statistics.median(cpu) if cpu else float('nan'):.1f} % of a core · event-loop ticks "
              f"{min(ticks)}–{max(ticks)} a pass")
    if 0 < len(ratios) < 3:
        print(f"live / frozen {statistics.median(ratios):.3f} ({len(ratios)} pair{'s' if len(ratios) > 1 else ''}: too few for an "
              "interval, run --pairs 3 or more)")
    elif ratios:
        med, lo, hi = gvh.paired_summary(ratios)
        said = gvh.verdict(lo, hi, than="a frozen window")
        print(f"live / frozen {med:.3f} (90 % interval {lo:.3f}–{hi:.3f}, {len(ratios)} pairs): {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
