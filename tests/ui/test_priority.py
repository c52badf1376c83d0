"""The GUI yields the CPU to the worker: by default its threads drop to nice +10 / SCHED_BATCH (SCHED_IDLE on
request), while workers — started from a thread kept at the original priority — stay at normal priority
(app.ui.priority). Run in a fresh process, so the test process itself is not lowered."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities via /proc: Linux only")

CODE = textwrap.dedent("""
    import json, os, threading
    from app.ui.priority import gui_priority, yield_to_worker
    from app.worker.client import WorkerClient, spawn_from_a_steady_thread

    def stat(pid, tid):
        f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[16]), int(f[38])  # nice, scheduling policy

    if __name__ == "__main__":
        keep = spawn_from_a_steady_thread()
        msg = yield_to_worker(keep={keep})
        later = []
        t = threading.Thread(target=lambda: later.append(stat(os.getpid(), threading.get_native_id())))
        t.start(); t.join()
        out = {"msg": msg, "mode": gui_priority(), "main": stat(os.getpid(), os.getpid()), "spawner": stat(os.getpid(), keep), "later": later[0]}
        if os.environ.get("START_WORKER") == "1":
            c = WorkerClient()
            ready = c.start()
            out["worker"] = stat(ready.pid, ready.pid)
            c.stop()
        print(json.dumps(out))
""")


def test_gui_threads_yield_and_workers_do_not():
    import os

    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "SPECDECK_GUI_PRIORITY": "", "START_WORKER": "1"})
    r = json.loads(out.stdout.strip().splitlines()[-1])
    batch = 3  # SCHED_BATCH
    assert r["msg"] == "" and r["mode"] == "batch" and r["main"] == [10, batch] and r["later"] == [10, batch]  # threads made later inherit it
    assert r["spawner"] == [0, 0] and r["worker"] == [0, 0]  # the worker is not lowered with the GUI


def test_idle_priority_on_request():
    """SPECDECK_GUI_PRIORITY=idle: the GUI's threads run SCHED_IDLE (only on CPU time the worker leaves), the thread
    that starts workers stays at normal priority. No worker is started here: a SCHED_IDLE thread that holds the GIL
    while the machine is busy stalls the whole process (minutes when the suite runs beside other work); that workers
    start from the steady thread is checked by the test above."""
    import os

    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "SPECDECK_GUI_PRIORITY": "idle"})
    r = json.loads(out.stdout.strip().splitlines()[-1])
    idle = 5  # SCHED_IDLE
    assert r["msg"] == "" and r["main"][1] == idle and r["later"][1] == idle
    assert r["spawner"] == [0, 0] and "worker" not in r


def test_normal_priority_on_request():
    import os

    from app.ui.priority import yield_to_worker

    old = os.environ.get("SPECDECK_GUI_PRIORITY")
    os.environ["SPECDECK_GUI_PRIORITY"] = "normal"
    try:
        assert "normal" in yield_to_worker()
    finally:
        if old is None:
            del os.environ["SPECDECK_GUI_PRIORITY"]
        else:
            os.environ["SPECDECK_GUI_PRIORITY"] = old


def test_a_bad_mode_is_named_with_the_choices():
    import os

    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "SPECDECK_GUI_PRIORITY": "fast"})
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["msg"].startswith("kept at normal priority: SPECDECK_GUI_PRIORITY='fast' is not a mode: use one of idle, batch, normal")
    assert r["mode"] == "normal" and r["main"] == [0, 0]


def test_serial_painting_only_on_few_cores_and_never_over_the_users_choice() -> None:
    from app.ui.priority import NO_POOL_ENV, serial_painting

    env: dict[str, str] = {}
    assert serial_painting(cores=2, environ=env) and env == {NO_POOL_ENV: "1"}
    env = {}
    assert not serial_painting(cores=16, environ=env) and env == {}
    env = {NO_POOL_ENV: ""}  # Qt reads "set at all" as off: so does SpecDeck, and leaves the value alone
    assert serial_painting(cores=16, environ=env) and env == {NO_POOL_ENV: ""}


POOL_CODE = textwrap.dedent("""
    import os, sys
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QColor, QImage, QPainter
    from PySide6.QtWidgets import QApplication
    from app.ui.priority import serial_painting

    serial_painting(cores=int(sys.argv[1]))
    app = QApplication([])
    img = QImage(1200, 900, QImage.Format.Format_ARGB32_Premultiplied)
    for _ in range(20):  # translucent fills go through spans: 900 of them, a job for Qt's pool when it has one
        p = QPainter(img)
        p.fillRect(0, 0, 1200, 900, QColor(30, 60, 90, 120))
        p.end()
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print(sum(n.startswith("Thread (pooled)") for n in names))
""")


@pytest.mark.parametrize("cores", [2, 16])
def test_qt_paints_without_its_thread_pool_on_few_cores(cores: int) -> None:
    """A real QApplication (offscreen) filling a large image: with the pool off (few cores) no pool thread ever
    starts; with it on, Qt starts its pool threads for the same fills — so the switch is what keeps them away."""
    import os

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    env.pop("QT_NO_GUI_THREADPOOL", None)
    out = subprocess.run([sys.executable, "-c", POOL_CODE, str(cores)], capture_output=True, text=True, timeout=120,
                         env=env, check=True).stdout.split()
    pooled = int(out[-1])
    assert (pooled == 0) if cores == 2 else (pooled >= 1), f"{pooled} Qt pool threads with {cores} cores"
