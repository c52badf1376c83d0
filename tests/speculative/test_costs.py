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
    """Three full rounds and 11 of the narrow forwards (n ≤ NARROW): 8 narrow-only rounds, counted in the progress and
    spread between the full ones (so both sample the same stretch of the machine's drift); the profile records every
    median as measured, and what a token tree's forward costs over the causal one of as many tokens (tree_ratio)."""
    from app.core.costs import NARROW, CostProfile
    from app.engines.hf import HFEngine
    from app.engines.registry import resolve
    from app.speculative.costs import measure_profile, round_plan

    engine = HFEngine(resolve(str(tiny_pair[0])))
    seen: list[tuple[float, float]] = []
    p = measure_profile(engine, reps=3, narrow_reps=11, progress=lambda task, done, total, unit: seen.append((done, total)))
    narrow = [n for n in p.ns if n <= NARROW]
    assert seen[-1] == (len(seen), (1 + 3) * len(p.ns) + 8 * len(narrow)) and p.reps == 3
    assert "".join("F" if f else "n" for f in round_plan(3, 8)) == "nnnFnnnFnnF" and all(round_plan(15, 0))
    assert len(p.medians_s) == len(p.ns) and all(t > 0 for t in p.medians_s)
    assert CostProfile.from_json(p.to_json()) == p  # the medians survive the cache
    # a token tree of 8 timed beside the causal 8 in each of those rounds: its cost over theirs, a plausible ratio
    assert p.tree_ratio is not None and 0.5 < p.tree_ratio < 3.0
