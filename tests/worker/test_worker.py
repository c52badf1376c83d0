"""Real worker processes with real (tiny random) models: round trips, scheduling, cancel, crash isolation."""

from __future__ import annotations

import os
import pickle
import queue
import signal
import statistics
import subprocess
import sys
import textwrap
import time

import pytest

from app.core.events import LaneDone, LaneStarted, Progress, RunError, StepEvent
from app.core.setups import Sampling
from app.worker.client import WorkerClient, describe_exit
from app.worker.messages import Cancel, LaneSpec, LoadEngines, Ping, Pong, RunFinished, RunLanes, WorkerDied

PROMPT = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n"


@pytest.fixture
def client():
    c = WorkerClient()
    c.start()
    yield c
    c.stop()


def until(c: WorkerClient, kind, timeout=120.0, pred=lambda e: True):
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        ev = c.get(timeout=max(0.01, deadline - time.monotonic()))
        seen.append(ev)
        if isinstance(ev, kind) and pred(ev):
            return ev, seen


def lanes(target, draft, group="g"):
    setups = ["baseline", f"draft:{draft},k=3", "ngram:n=2,k=4", f"draft:{draft},k=2,schedule=heuristic"]
    return tuple(LaneSpec(f"l{i}", s, "p", PROMPT, group=group) for i, s in enumerate(setups))


def test_messages_pickle_round_trip():
    from app.core.metrics import LaneStats

    msgs = [
        RunLanes("r", "t", (LaneSpec("a", "baseline", "p", "x"),), Sampling(0.5, 0.9, 5, 3, 10), "interleaved"),
        Cancel("r", "a"),
        LoadEngines("q", "t", ("d",)),
        StepEvent("a", 1, (1, 2), 1, 3, "correction", 0.1, 0.2, 0.3, (1, 3), ("x", "y"), ("z",)),
        LaneDone("a", LaneStats("s", "p", 0, 1, 1.0, 0.1, 0.1, 1, 0, 0, 0, 0.0, 0.0, (5,), "t")),
        RunError("a", "boom"),
        Progress("load", 1, 2, "MiB"),
        WorkerDied(-9, "x"),
    ]
    for m in msgs:
        assert pickle.loads(pickle.dumps(m)) == m


def test_round_trip_latency_and_loading_progress(client, tiny_pair):
    """Event delivery is event-driven: ping → pong round trips take about a millisecond."""
    rtts = []
    for i in range(50):
        t0 = time.perf_counter()
        client.send(Ping(f"p{i}"))
        until(client, Pong, 10)
        rtts.append(time.perf_counter() - t0)
    assert statistics.median(rtts) < 0.05
    client.send(LoadEngines("load", str(tiny_pair[0]), (str(tiny_pair[1]),)))
    ev, seen = until(client, __import__("app.worker.messages", fromlist=["EnginesLoaded"]).EnginesLoaded)
    assert [e.name for e in ev.engines] == [str(tiny_pair[0]), str(tiny_pair[1])]
    assert any(isinstance(e, Progress) for e in seen)


def run_collect(client, cmd):
    client.send(cmd)
    _, seen = until(client, RunFinished, 300, lambda e: e.run_id == cmd.run_id)
    done = {e.lane_id: e.stats for e in seen if isinstance(e, LaneDone)}
    steps = [e for e in seen if isinstance(e, StepEvent)]
    errors = [e for e in seen if isinstance(e, RunError)]
    return done, steps, errors, seen


def test_interleaved_and_paced_equal_sequential(client, tiny_pair):
    t, d = (str(p) for p in tiny_pair)
    s = Sampling(max_new_tokens=24)
    seq, _, e1, _ = run_collect(client, RunLanes("seq", t, lanes(t, d), s, "sequential", chat=False))
    inter, steps, e2, seen = run_collect(client, RunLanes("int", t, lanes(t, d), s, "interleaved", chat=False))
    assert not e1 and not e2
    assert {k: v.output_ids for k, v in seq.items()} == {k: v.output_ids for k, v in inter.items()}
    assert all(v.output_ids == seq["l0"].output_ids for v in seq.values())  # lossless, greedy
    # interleaved: lanes advance side by side (the second lane steps before the first one ends)
    order = [e.lane_id for e in seen if isinstance(e, (StepEvent, LaneDone))]
    first_done = next(i for i, e in enumerate(seen) if isinstance(e, LaneDone))
    assert len({lid for lid in order[:first_done]}) >= 2
    assert all(isinstance(e, LaneStarted) for e in seen if getattr(e, "prompt_ids", None) is not None)
    # paced, with real lanes: the same tokens, and each step is taken by a lane with the fewest tokens so far
    paced, _, e3, seen = run_collect(client, RunLanes("pace", t, lanes(t, d), s, "paced", chat=False))
    assert not e3 and {k: v.output_ids for k, v in paced.items()} == {k: v.output_ids for k, v in seq.items()}
    tokens, ended = {lid: 0 for lid in paced}, set()
    for e in seen:
        if isinstance(e, StepEvent):
            live = [n for lid, n in tokens.items() if lid not in ended]
            assert tokens[e.lane_id] == min(live), (e.lane_id, tokens)
            tokens[e.lane_id] += len(e.emitted_ids)
        elif isinstance(e, LaneDone):
            ended.add(e.lane_id)
    assert tokens == {lid: 24 for lid in paced}
    # each lane's LaneDone comes right after its final step, not once the other lanes have caught up
    order = [e for e in seen if isinstance(e, (StepEvent, LaneDone))]
    finals = [i for i, e in enumerate(order) if isinstance(e, StepEvent) and e.final]
    assert len(finals) == len(paced)
    assert all(isinstance(order[i + 1], LaneDone) and order[i + 1].lane_id == order[i].lane_id for i in finals)


def test_cancel_stops_within_a_step(client, tiny_pair):
    t, d = (str(p) for p in tiny_pair)
    client.send(RunLanes("long", t, lanes(t, d)[:2], Sampling(max_new_tokens=1500), "interleaved", chat=False))
    until(client, StepEvent, 120, lambda e: e.step >= 3)
    t0 = time.perf_counter()
    client.send(Cancel("long"))
    ev, seen = until(client, RunFinished, 60)
    latency = time.perf_counter() - t0
    done = [e for e in seen if isinstance(e, LaneDone)]
    assert ev.cancelled and done and all(e.cancelled for e in done)
    assert latency < 2.0, latency


def test_failing_lane_does_not_stop_the_others(client, tiny_pair):
    t = str(tiny_pair[0])
    cmd = RunLanes("mix", t, (LaneSpec("bad", "draft:no-such-engine", "p", PROMPT), LaneSpec("good", "ngram", "p", PROMPT)), Sampling(max_new_tokens=8), chat=False)
    done, _, errors, _ = run_collect(client, cmd)
    assert [e.lane_id for e in errors] == ["bad"] and "unknown engine 'no-such-engine'" in errors[0].message
    assert "good" in done and done["good"].new_tokens == 8


def test_kill_9_mid_run_is_reported_and_a_new_worker_starts(tiny_pair):
    t, d = (str(p) for p in tiny_pair)
    c = WorkerClient()
    c.start()
    try:
        c.send(RunLanes("r", t, lanes(t, d)[:1], Sampling(max_new_tokens=2000), chat=False))  # within the 2,048 positions
        _, before = until(c, StepEvent, 120, lambda e: e.step >= 2)
        os.kill(c.pid, signal.SIGKILL)
        died, after = until(c, WorkerDied, 30)  # reported, not waited for by a silence timeout
        assert died.exitcode == -signal.SIGKILL and "SIGKILL" in died.message
        assert len([e for e in before + after if isinstance(e, StepEvent)]) >= 3  # results so far kept
        from app.core.errors import WorkerDiedError

        with pytest.raises(WorkerDiedError):
            c.send(Ping("x"))
        c.start()  # usable again
        c.send(Ping("again"))
        until(c, Pong, 10)
    finally:
        c.stop()


def test_describe_exit():
    assert "SIGSEGV" in describe_exit(-11) and "native" in describe_exit(-11)
    assert "code 1" in describe_exit(1)


def test_worker_exits_when_its_parent_dies(tmp_path):
    """A parent that is SIGKILLed leaves no orphan worker holding memory."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from app.worker.client import WorkerClient
            if __name__ == "__main__":
                c = WorkerClient()
                r = c.start()
                print(r.pid, flush=True)
                time.sleep(600)
            """
        )
    )
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        wpid = int(p.stdout.readline())
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(wpid, 0)
                with open(f"/proc/{wpid}/stat") as f:
                    if f.read().split()[2] == "Z":
                        break
            except (ProcessLookupError, FileNotFoundError):
                break
            time.sleep(0.05)
        else:
            os.kill(wpid, signal.SIGKILL)
            pytest.fail("worker outlived its parent by 10 s")
    finally:
        if p.poll() is None:
            p.kill()


def test_worker_entry_imports_no_qt():
    code = "import sys, app.worker.entry, app.worker.client, app.commands; print(any(m.startswith(('PySide6', 'pyqtgraph')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
    _ = queue


def test_pool_keeps_one_engine_per_precision(tiny_pair):
    """A draft asked for in int8 is its own engine, not the fp32 one already loaded under the same name."""
    from app.worker.pool import EnginePool

    pool = EnginePool()
    name = str(tiny_pair[1])
    fp32 = pool.get(name)
    assert pool.get(name) is fp32 and pool.get(name, None, "float32") is fp32
    q = pool.get(name, None, "int8")
    assert q is not fp32 and q.dtype == "int8" and fp32.dtype == "float32"
    assert pool.get_draft(str(tiny_pair[0]), pool.get(str(tiny_pair[0])), name, None, "int8") is q


def test_a_fixed_draft_lane_sends_its_drafts_cached_profile_and_measures_none(tiny_pair, tmp_path, monkeypatch):
    """A fixed-k draft lane needs only the target's cost profile; the draft's is sent too when it is cached (the
    Costs tab draws its c and shows what k=auto saved of the pair), and never measured for it."""
    from dataclasses import replace

    from app.core.costs import PROFILE_NS, CostProfile, save_profile
    from app.core.events import ProfileReady
    from app.speculative.costs import profile_key_parts
    from app.worker.pool import EnginePool
    from app.worker.scheduler import lane_events

    monkeypatch.setenv("SPECDECK_PROFILES", str(tmp_path / "profiles"))
    t, d = (str(p) for p in tiny_pair)

    def run_lane() -> list[str]:
        """The engines whose profiles the lane sent; asserts that nothing was measured."""
        events: list = []
        pool = EnginePool(emit=events.append)
        evs = list(lane_events(pool, t, LaneSpec("L", f"draft:{d},k=3", "p", PROMPT), Sampling(max_new_tokens=6), chat=False,
                               cancelled=lambda: False))
        assert isinstance(evs[-1], LaneDone), evs[-1]
        assert not [e.task for e in events if isinstance(e, Progress) and e.task.split(": ", 1)[-1].startswith("profile ")]
        return sorted(e.profile.engine for e in events if isinstance(e, ProfileReady))

    loader = EnginePool()
    target, draft = loader.get(t), loader.get(d)
    quiet = CostProfile(ns=PROFILE_NS, times_s=tuple(0.01 * (1 + 0.01 * n) for n in PROFILE_NS), **profile_key_parts(target))
    save_profile(quiet)  # the target's profile cached: nothing is measured in this test
    assert run_lane() == [target.name]  # the draft's profile is not cached: not sent, not measured
    save_profile(replace(quiet, times_s=tuple(x / 4 for x in quiet.times_s), **profile_key_parts(draft)))
    assert run_lane() == sorted([target.name, draft.name])


def _comes_back_up(c: WorkerClient) -> None:
    """The client's next start brings up a real worker that answers, then stops it."""
    try:
        c.start()
        c.send(Ping("after"))
        until(c, Pong, 10)
    finally:
        c.stop()


@pytest.mark.parametrize("when", ["before the fork", "after the fork"])
def test_an_interrupt_inside_the_spawn_leaves_no_worker_and_the_client_usable(monkeypatch, when):
    """A stop signal's KeyboardInterrupt can land inside multiprocessing's Process.start (the finder's dialog stops it
    while it starts its worker). The signal's timing cannot be aimed, so `_spawn` is replaced by one that raises at
    either edge of the real start: no child is left, stop() does not fail ("can only join a started process"), and
    the next start brings up a real worker."""
    import app.worker.client as client_mod

    started = []

    def interrupted(start):
        proc = start.__self__
        if when == "after the fork":
            start()
            started.append(proc)
        raise KeyboardInterrupt

    c = WorkerClient()
    monkeypatch.setattr(client_mod, "_spawn", interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.start()
    assert c.proc is None and c.stop() is None
    for proc in started:  # the child that was forked is gone, not orphaned
        assert proc.exitcode is not None
    monkeypatch.undo()
    _comes_back_up(c)


def test_an_interrupt_before_the_drain_thread_starts_leaves_stop_working(monkeypatch):
    """The same signal landing just after the spawn, as the client starts the thread that drains the worker's events
    (seen about once in ten runs of the finder dialog's stop test: stop() raised "cannot join thread before it is
    started" and the finder exited 1 with a traceback). Aimed by a Thread whose start raises for the drain thread:
    stop() ends the spawned worker without raising, and the next start brings up a real one."""
    import threading

    import app.worker.client as client_mod

    class Interrupted(threading.Thread):
        def start(self):
            if self.name == "specdeck-drain":
                raise KeyboardInterrupt
            super().start()

    c = WorkerClient()
    monkeypatch.setattr(client_mod.threading, "Thread", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.start()
    monkeypatch.undo()
    proc = c.proc
    assert proc is not None  # spawned before the interrupt
    c.stop()
    assert proc.exitcode is not None  # ended, not orphaned
    _comes_back_up(c)


def test_a_worker_stopped_while_it_starts_is_ended_at_once():
    """stop() before WorkerReady: nothing to save, so no grace for a Shutdown the worker only reads once started."""
    import multiprocessing as mp

    from app.worker import entry

    c = WorkerClient()
    ctx = mp.get_context("spawn")
    cmd_r, c._cmd = ctx.Pipe(duplex=False)
    evt_r, evt_w = ctx.Pipe(duplex=False)
    c.proc = ctx.Process(target=entry.main, args=(cmd_r, evt_w, os.getpid(), time.time()), daemon=True)
    c.proc.start()
    # terminated while it imports, not left to start (seconds) and read the Shutdown within its 30 s grace
    assert c.stop(timeout=30) == -signal.SIGTERM
