"""What several test modules share: a lane run in this process through our loop and the shared accounting, without
a worker (the scheduler does the same in the worker)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from app.core.accounting import LaneRecorder, drive
from app.core.events import LaneDone, StepEvent
from app.core.setups import Sampling
from app.speculative.drafters import Drafter
from app.speculative.loop import LoopRunner


def run_lane(
    target,
    drafter: Drafter | None,
    prompt_ids: list[int],
    sampling: Sampling,
    *,
    lane_id: str = "lane",
    setup: str = "baseline",
    prompt_id: str = "prompt",
    repeat: int = 0,
    cancelled: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[StepEvent | LaneDone]:
    """Decode one prompt with one setup (our loop, recorded by the shared accounting).

    Args:
        target: an Engine (the model whose distribution is preserved).
        drafter: the setup's drafter; None for the baseline.
        prompt_ids: the prompt, already tokenized (chat template applied).
        sampling: temperature/top-k/top-p/seed/max_new_tokens (temperature 0 = greedy).
        cancelled: polled between steps; True ends the lane with LaneDone(cancelled=True).

    Yields:
        StepEvent per step, then one LaneDone whose `stats` is a LaneStats.
    """
    if not prompt_ids:
        raise ValueError("empty prompt")
    sampling = sampling.validated()
    rec = LaneRecorder(lane_id, setup, prompt_id, repeat, sampling.max_new_tokens, target.eos_ids, target.detokenizer(prompt_ids), clock)
    yield from drive(LoopRunner(target, drafter), rec, prompt_ids, sampling, cancelled)


def bench_step(lane: str, i: int, drafted: list[int], a: int, emitted: list[int], q: list[float], wall: float = 0.25,
               draft_s: float = 0.01, why: str = ""):
    """A literal StepEvent of a bench lane: its drafting took `draft_s`, verification the rest of `wall` less 0.04 s;
    `why` as k=auto's tooltip says it."""
    from app.core.events import StepEvent

    return StepEvent(lane, i, tuple(drafted), a, emitted[-1], "bonus" if a == len(drafted) else "correction", draft_s,
                     wall - draft_s - 0.04, wall, tuple(emitted), draft_probs=tuple(q), why=why)


def bench_run_file(tmp_path, setups: tuple[str, ...], lanes: dict, walls: dict) -> str:
    """A real run file (app.worker.runfile) of prompts c1, c2 (coding) with these lanes' literal steps — each step
    (drafted ids, accepted count, emitted ids, draft confidences[, wall[, drafting seconds[, why]]]) — and each setup's wall per prompt (the bench
    report's runs), saved as run.specdeck under tmp_path: for the bench scripts that read run files."""
    from app.core.prompts import Prompt
    from app.core.setups import Sampling
    from app.worker.plan import RunPlan
    from app.worker.runfile import RunRecorder, save

    plan = RunPlan("smollm2-135m-instruct", setups, (Prompt("c1", "a", "coding"), Prompt("c2", "b", "coding")),
                   Sampling(max_new_tokens=5), mode="paced")
    rec = RunRecorder(plan, machine={"label": "t", "cpu": "x"}, t0=0.0)
    for (p, s), steps in lanes.items():
        lane = plan.lane_id(plan.setups.index(s), next(x for x in plan.prompts if x.id == p))
        for i, (drafted, a, emitted, q, *times) in enumerate(steps):
            rec.event(bench_step(lane, i, drafted, a, emitted, q, *times), 0.1)
    rec.finish(dict(runs=[dict(setup=s, prompt_id=p, repeat=0, wall_s=w, cpu_wait_s=0.0) for s, by in walls.items() for p, w in by.items()],
                    categories={"c1": "coding", "c2": "coding"}, created="t"), t_end=1.0)
    return str(save(rec.record(), tmp_path / "run.specdeck"))


def bench_script(name: str) -> ModuleType:
    """resources/bench/<name>.py imported as a module (the bench scripts are not a package), under a name of its own
    so that a test's import never shadows another module."""
    path = Path(__file__).resolve().parents[1] / "resources" / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
