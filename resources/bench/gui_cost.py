"""What the window itself costs while lanes run, with no model and no worker: steady enough to compare GUI changes.

Tokens/s of real lanes moves ±4–10 % between identical runs on a small machine, so the window's share of it cannot
be told apart run to run. Here a synthetic three-lane run (baseline 1 token a step at 22 tok/s, an n-gram lane 1.3
tokens a step at 26 tok/s, a k=4 draft lane 2.5 a step at 20 tok/s, with rejected drafts: what SmolLM2 does on
2 cores) is fed into the real MainWindow through its worker bridge at those rates, from a thread standing in for
the worker's pipe, and the window's CPU over the recorded lanes is printed: its main thread, and the whole process
(percent of one core; the feeding thread's own work is in the process figure), and how often its threads were
woken (Qt's GUI thread pool should show none on a machine with few cores: app.ui.priority.serial_painting). Single
runs vary by up to ± 0.3 % of a core and the machine's state moves the level, so compare builds in interleaved runs
(a worktree per build): that separates differences of a few tenths of a core, which real lanes' tokens/s cannot.

    python resources/bench/gui_cost.py                     # under xvfb-run when $DISPLAY is unset
    python resources/bench/gui_cost.py --tokens 64 --rounds 3 --no-live-plots --platform offscreen

On a machine with few cores (app.ui.load.FEW_CORES) the window draws at its few-core rates; the figures say what
it takes from the lanes' cores (gui_vs_headless.py measures what that does to their tokens/s).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: (tokens a step, tokens/s, drafted a step) of the three lanes
LANES = (("baseline", 1.0, 22.0, 0), ("ngram:n=3,k=8", 1.3, 26.0, 8), ("draft:smollm2-135m-instruct,k=4", 2.5, 20.0, 4))


def cpu_s(thread: int | None = None) -> float:
    """CPU seconds of this process, or of one of its threads (``threading`` ident), from the kernel's nanosecond
    run-time clocks: /proc's tick counts (10 ms) are rounded per thread and per process apart, so over a 1.6 s round a
    thread could read 1.2 % of a core above its whole process."""
    clock = time.pthread_getcpuclockid(thread) if thread else time.CLOCK_PROCESS_CPUTIME_ID
    return time.clock_gettime(clock)


def switches() -> dict[int, tuple[str, int]]:
    """native thread id → (its name, voluntary context switches so far): how often each thread went to sleep and was
    woken again (Linux /proc). Threads that end between two reads are left out."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            status = Path(f"/proc/self/task/{t}/status").read_text()
            name = Path(f"/proc/self/task/{t}/comm").read_text().strip()
        except OSError:
            continue
        out[int(t)] = (name, int(status.split("voluntary_ctxt_switches:")[1].split()[0]))
    return out


def wakeups(s0: dict[int, tuple[str, int]], s1: dict[int, tuple[str, int]], secs: float, main_tid: int,
            feeder_tid: int) -> dict[str, float]:
    """Wake-ups a second between two :func:`switches` reads: the main thread, Qt's GUI thread pool ("Thread
    (pooled)"), and the window's other threads (the replay's own feeding thread left out)."""
    out = {"main thread": 0.0, "Qt pool threads": 0.0, "other threads": 0.0}
    for tid, (name, n) in s1.items():
        if tid == feeder_tid:
            continue
        key = "main thread" if tid == main_tid else "Qt pool threads" if name.startswith("Thread (pooled)") else "other threads"
        out[key] += (n - s0.get(tid, (name, 0))[1]) / secs
    return out


def pieces_of(text: str, n: int = 3) -> list[str]:
    return [text[i:i + n] for i in range(0, len(text), n)]


class ReplayClient:
    """Stands in for the worker group in the window's bridge: ready at once; each RunLanes command is answered from
    a thread with LaneStarted, StepEvents at the lanes' rates, LaneDone and RunFinished."""

    def __init__(self, on_event=None, queue_events=False, tokens: int = 192, marks: dict | None = None,
                 main_ident: int = 0) -> None:
        self.on_event = on_event
        self.proc = None
        self._alive = False
        self.tokens = tokens
        self.marks = marks if marks is not None else {}
        self.main_ident = main_ident
        self.pieces = pieces_of((ROOT / "app" / "ui" / "lanes_area.py").read_text(encoding="utf-8"))

    @property
    def pid(self):
        return os.getpid() if self._alive else None

    @property
    def alive(self) -> bool:
        return self._alive

    def start(self, timeout: float = 120.0):
        from app.worker.messages import WorkerReady

        self._alive = True
        ready = WorkerReady(os.getpid(), 0.1, "none", "replayed run")
        self.on_event(ready)
        return ready

    def send(self, cmd) -> None:
        if type(cmd).__name__ == "RunLanes":
            threading.Thread(target=self._run, args=(cmd,), daemon=True).start()

    def stop(self, timeout: float = 5.0):
        self._alive = False
        return 0

    def kill(self) -> None:
        self._alive = False

    def _run(self, cmd) -> None:
        from app.core.events import LaneDone, LaneStarted, StepEvent
        from app.core.metrics import LaneStats
        from app.worker.messages import Heartbeat, RunFinished

        warm = any(lane.group == "warmup" for lane in cmd.lanes)
        if not warm:
            self.marks["t0"] = (time.monotonic(), cpu_s(self.main_ident), cpu_s())
            self.marks["s0"], self.marks["feeder"] = switches(), threading.get_native_id()
        pi = 0
        for j, lane in enumerate(cmd.lanes):
            _, per_step, rate, k = LANES[j % len(LANES)]
            self.on_event(LaneStarted(lane.lane_id, lane.setup, lane.prompt_id, 0, (1, 2, 3), "replayed prompt", "replayed engine"))
            n = 4 if warm else self.tokens
            t_lane = last_hb = time.monotonic()
            out = step = drafted = accepted = 0
            debt = 0.0
            while out < n:
                debt += per_step
                emit = max(1, int(debt))
                debt -= emit
                acc = min(k, emit - 1)
                text = tuple(self.pieces[(pi + i) % len(self.pieces)] for i in range(acc + 1))
                rejected = tuple(self.pieces[(pi + acc + 1 + i) % len(self.pieces)] for i in range(k - acc))
                pi += acc + 1
                time.sleep(max(0.0, t_lane + (out + emit) / rate - time.monotonic()))
                draft = tuple(range(100, 100 + k))
                self.on_event(StepEvent(
                    lane_id=lane.lane_id, step=step, drafted_ids=draft, accepted_count=acc, target_id=7,
                    target_kind="baseline" if k == 0 else ("bonus" if acc == k else "correction"),
                    t_draft_s=0.001, t_verify_s=0.002, t_wall_s=0.003, emitted_ids=(*draft[:acc], 7), pieces=text,
                    rejected_pieces=rejected, draft_probs=tuple(0.5 for _ in draft) if k else None,
                    target_probs=tuple(0.25 for _ in range(min(k, acc + 1))) + (0.75,), t_s=time.monotonic() - t_lane))
                out, step, drafted, accepted = out + acc + 1, step + 1, drafted + k, accepted + acc
                if time.monotonic() - last_hb >= 1.0:
                    self.on_event(Heartbeat(time.monotonic()))
                    last_hb = time.monotonic()
            wall = time.monotonic() - t_lane
            ids = tuple(range(out))
            stats = LaneStats(lane.setup, lane.prompt_id, 0, out, wall, wall / 10, wall / 10, step, drafted, accepted,
                              step - 1 if drafted else 0, 0.0, wall / 2, ids, " ".join(map(str, ids)))
            self.on_event(LaneDone(lane.lane_id, stats))
        if not warm:
            self.marks["t1"] = (time.monotonic(), cpu_s(self.main_ident), cpu_s())
            self.marks["s1"] = switches()
        self.on_event(RunFinished(cmd.run_id))


def one_round(tokens: int, live_plots: bool) -> tuple[float, float, float, dict[str, float]]:
    """(seconds of recorded lanes, main thread %, process %, :func:`wakeups`) of one replayed run in this process's
    QApplication."""
    from dataclasses import replace

    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.ui.main_window import MainWindow
    from app.ui.priority import serial_painting, yield_to_worker

    serial_painting()  # as `python -m app gui` does, before the QApplication
    app = QApplication.instance() or QApplication(sys.argv[:1])
    yield_to_worker(keep=set())  # the window's threads at the priority the GUI gives them
    marks: dict = {}
    main_tid, main_ident = threading.get_native_id(), threading.get_ident()
    with tempfile.TemporaryDirectory() as tmp:
        settings = QSettings(str(Path(tmp) / "s.ini"), QSettings.Format.IniFormat)
        settings.setValue("ui/live_plots", live_plots)
        win = MainWindow(settings=settings, client_factory=lambda on_event=None, **kw: ReplayClient(
            on_event, tokens=tokens, marks=marks, main_ident=main_ident))
        s = win.session().with_(target="smollm2-135m-instruct", setups=tuple(x[0] for x in LANES),
                                prompt="def is_palindrome(s: str) -> bool:", prompt_id="custom", mode="interleaved")
        win.apply_session(s.with_(sampling=replace(s.sampling, max_new_tokens=tokens)))
        win.resize(1560, 980)
        win.show()
        win.runEnded.connect(lambda _rid: QTimer.singleShot(300, app.quit))
        QTimer.singleShot(500, win.run)
        app.exec()
        win.close()
        import shiboken6

        shiboken6.delete(win)
    (a, m0, p0), (b, m1, p1) = marks["t0"], marks["t1"]
    woke = wakeups(marks["s0"], marks["s1"], b - a, main_tid, marks["feeder"])
    return b - a, 100 * (m1 - m0) / (b - a), 100 * (p1 - p0) / (b - a), woke


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=192, help="tokens per lane (default 192: ~25 s of lanes)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-live-plots", action="store_true", help="as with View ▸ Live plots unticked")
    ap.add_argument("--platform", choices=("xvfb", "offscreen", "display"),
                    help="default: xvfb when $DISPLAY is unset and xvfb-run exists, else the current display")
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux"):
        ap.error("reads per-thread CPU from /proc: Linux only")
    platform = args.platform or ("xvfb" if not os.environ.get("DISPLAY") and shutil.which("xvfb-run") else "display")
    if platform == "xvfb" and not os.environ.get("SPECDECK_GUI_COST_CHILD"):
        if not shutil.which("xvfb-run"):
            ap.error("xvfb-run is not installed (apt-get install xvfb), or pass --platform offscreen")
        cmd = ["xvfb-run", "-a", "-s", "-screen 0 1600x1000x24", sys.executable, str(Path(__file__).resolve()), *(argv or sys.argv[1:]),
               "--platform", "xvfb"]
        return subprocess.call(cmd, env={**os.environ, "SPECDECK_GUI_COST_CHILD": "1"}, cwd=ROOT)
    if platform == "offscreen":
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    sys.path.insert(0, str(ROOT))
    from app.core.costs import machine_summary
    from app.ui.load import cpu_cores

    print(f"{machine_summary()} ({cpu_cores()} usable) · {platform} · {args.tokens} tokens a lane · "
          f"live plots {'off' if args.no_live_plots else 'on'}")
    for r in range(args.rounds):
        secs, main_pct, proc_pct, woke = one_round(args.tokens, not args.no_live_plots)
        print(f"round {r + 1}: lanes {secs:.1f} s · window main thread {main_pct:.2f} % of a core · whole process {proc_pct:.2f} %",
              flush=True)
        print("  wake-ups a second (each may push a lane's compute thread off its core): "
              + " · ".join(f"{k} {v:.0f}" for k, v in woke.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
