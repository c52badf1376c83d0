"""Cost profiles measured on a real (tiny) engine: a measurement while other processes take the CPU is flagged and
never cached; a quiet one is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

linux = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="run-queue delay is read from Linux /proc")


@linux
def test_a_profile_measured_beside_busy_processes_is_flagged_and_not_cached(tiny_pair, tmp_path, monkeypatch):
    from app.core.costs import load_profile
    from app.engines.hf import HFEngine
    from app.engines.registry import resolve
    from app.speculative.costs import cached_or_measure, profile_key

    monkeypatch.setenv("SPECDECK_PROFILES", str(tmp_path / "profiles"))  # its own cache: a quiet profile from another test would answer
    engine = HFEngine(resolve(str(tiny_pair[0])))
    cpus = sorted(os.sched_getaffinity(0))
    # two busy processes on each core this process may use: its threads wait for a CPU most of the time
    hogs = [subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{c}}})\nwhile True: pass"])
            for c in cpus for _ in range(2)]
    try:
        p, measured = cached_or_measure(engine, reps=3)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert measured and p.contended and p.cpu_wait_share is not None and p.cpu_wait_share > 0.10, (p.cpu_wait_share, p.spread)
    assert load_profile(profile_key(engine)) is None  # not cached: the next run measures again


def test_narrow_forwards_get_extra_rounds_and_their_medians_are_kept(tiny_pair):
    """Where the budget times fewer than NARROW_ROUNDS full rounds, the forwards of at most NARROW tokens get extra
    rounds (each one forward per narrow n, counted in the progress); the profile records every median as measured,
    and its times are those medians smoothed."""
    from app.core.costs import NARROW, CostProfile
    from app.engines.hf import HFEngine
    from app.engines.registry import resolve
    from app.speculative.costs import NARROW_ROUNDS, measure_profile

    engine = HFEngine(resolve(str(tiny_pair[0])))
    seen: list[tuple[float, float]] = []
    p = measure_profile(engine, budget_s=0.5, progress=lambda task, done, total, unit: seen.append((done, total)))
    narrow = [n for n in p.ns if n <= NARROW]
    done, total = seen[-1]
    extra, rest = divmod(total - (p.reps + 1) * len(p.ns), len(narrow))
    assert done == total and rest == 0 and extra >= 0 and p.reps + extra <= max(p.reps, NARROW_ROUNDS)
    if p.reps < NARROW_ROUNDS:
        assert extra > 0
    assert len(p.medians_s) == len(p.ns) and all(t > 0 for t in p.medians_s)
    assert CostProfile.from_json(p.to_json()) == p  # the medians survive the cache
