"""Run orchestration shared by the CLI and the GUI (Qt-free): which lanes a run has, their ids and groups, the
warm-up run, and the collection of what comes back into stats, errors and the JSON report.

    plan = RunPlan(target, setups, prompts, sampling, mode="interleaved", repeats=2, warmup_tokens=8)
    client.send(plan.load_command())
    if (w := plan.warmup_command()) is not None: client.send(w)        # unrecorded
    client.send(plan.command())
    results = RunResults(plan); for ev in events: results.on_event(ev)
    doc = results.report(device, dtype)

Lane ids: ``L1``…``Ln`` (n setups) when the run has one prompt and one repeat (the GUI's lanes), else
``<prompt id>#<repeat>/L<i>``; warm-up lanes are ``warm/<lane id>`` in the run ``<run id>-warmup``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from functools import cached_property

from app.core.costs import CostProfile
from app.core.errors import SetupError
from app.core.events import LaneDone, ProfileReady, RunError, StepEvent
from app.core.metrics import LaneStats
from app.core.prompts import Prompt
from app.core.report import attach_baseline, build_report
from app.core.setups import Sampling, parse_setup
from app.worker.messages import LaneSpec, Mode, RunLanes

__all__ = ["RunPlan", "RunResults", "WARMUP_PREFIX"]

WARMUP_PREFIX = "warm/"


@dataclass(frozen=True)
class RunPlan:
    """One run: every setup on every prompt, `repeats` times, optionally after an unrecorded warm-up.

    Args:
        target: the target engine name (or folder).
        setups: setup strings, one lane per setup per prompt and repeat, in this order (the CLI puts the
            baseline first; the GUI passes its lanes as the user set them).
        prompts: the prompts (ids must be unique).
        warmup_tokens: tokens per setup in the warm-up run on the first prompt (0: none).

    Raises:
        SetupError: no setups or prompts, duplicate prompt ids, a bad setup string, repeats < 1.
    """

    target: str
    setups: tuple[str, ...]
    prompts: tuple[Prompt, ...]
    sampling: Sampling
    mode: Mode = "sequential"
    chat: bool = True
    repeats: int = 1
    device: str | None = None
    dtype: str | None = None
    warmup_tokens: int = 0
    run_id: str = field(default_factory=lambda: f"run{int(time.time() * 1000) % 10**9}")
    reference: str | None = None
    #: engine → its manifest's tokenizer tag, pinned when the run was recorded (:meth:`pinned`): a run replayed on
    #: another machine compares its lanes as it did where it ran
    tokenizer_tags: tuple[tuple[str, str], ...] = ()
    #: read from a run file: its engines need not exist here (the target's environment is not checked)
    recorded: bool = field(default=False, compare=False)
    #: runs put beside each other (app.worker.runfile.beside): the machine each setup ran on, e.g. "H200"; () for
    #: a run of this machine
    machines: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "setups", tuple(self.setups))
        object.__setattr__(self, "prompts", tuple(self.prompts))
        if not self.setups:
            raise SetupError("a run needs at least one setup", fix="add a lane (e.g. baseline)")
        if not self.prompts:
            raise SetupError("a run needs at least one prompt", fix="type a prompt, or use --prompt/--prompts/--suite")
        if self.repeats < 1:
            raise SetupError(f"repeats must be >= 1, got {self.repeats}", fix="use e.g. --repeats 1")
        if self.warmup_tokens < 0:
            raise SetupError(f"warm-up tokens must be >= 0, got {self.warmup_tokens}", fix="use 0 for no warm-up")
        seen: dict[str, int] = {}
        for i, p in enumerate(self.prompts):
            if p.id in seen:
                raise SetupError(f"prompt id {p.id!r} is used twice (prompts {seen[p.id] + 1} and {i + 1})",
                                 fix="give every prompt its own id: lanes are paired with the baseline by prompt id")
            seen[p.id] = i
        for s in self.setups:
            parse_setup(s)  # raises with the grammar
        if self.reference is not None and parse_setup(self.reference).label not in {parse_setup(s).label for s in self.setups}:
            raise SetupError(f"the reference lane {self.reference!r} is not one of the run's setups",
                             fix="name one of the --setup strings (or baseline) as --reference")
        self.sampling.validated()
        if not self.recorded:
            _check_target_environment(self.target)

    # --- lanes ------------------------------------------------------------------------------------------
    @property
    def single(self) -> bool:
        """One prompt, one repeat: lane ids are just L1…Ln."""
        return len(self.prompts) == 1 and self.repeats == 1

    def lane_id(self, setup_index: int, prompt: Prompt | None = None, repeat: int = 0) -> str:
        if self.single:
            return f"L{setup_index + 1}"
        p = prompt or self.prompts[0]
        return f"{p.id}#{repeat}/L{setup_index + 1}"

    @cached_property
    def lanes(self) -> tuple[LaneSpec, ...]:
        """Every recorded lane, prompt by prompt, repeat by repeat, setups in order; one group per prompt × repeat
        (interleaved and paced modes advance a group's lanes side by side)."""
        out = []
        for p in self.prompts:
            for r in range(self.repeats):
                for i, s in enumerate(self.setups):
                    out.append(LaneSpec(self.lane_id(i, p, r), s, p.id, p.prompt, repeat=r, group=f"{p.id}#{r}", category=p.category))
        return tuple(out)

    def setup_index(self, lane_id: str) -> int | None:
        """Which setup (0-based) a lane id — recorded or warm-up — belongs to."""
        tail = lane_id.removeprefix(WARMUP_PREFIX).rsplit("/", 1)[-1]
        if tail.startswith("L") and tail[1:].isdigit():
            i = int(tail[1:]) - 1
            return i if 0 <= i < len(self.setups) else None
        return None

    def machine_of(self, lane_id: str) -> str:
        """The machine a lane ran on when runs are beside each other ("" otherwise)."""
        i = self.setup_index(lane_id)
        return self.machines[i] if self.machines and i is not None and i < len(self.machines) else ""

    @staticmethod
    def is_warmup(lane_id: str | None) -> bool:
        return bool(lane_id) and str(lane_id).startswith(WARMUP_PREFIX)

    @property
    def drafts(self) -> tuple[tuple[str, str | None], ...]:
        """(engine, precision) of every draft model the setups on the run's target load beside it, once each."""
        return tuple(dict.fromkeys(d for s in self.setups if parse_setup(s).target is None for d in parse_setup(s).draft_engines))

    @property
    def other_targets(self) -> tuple[tuple[str, tuple[tuple[str, str | None], ...]], ...]:
        """(target, its drafts) of the lanes moved to another target engine (`…@<target>`), in setup order."""
        out: dict[str, dict] = {}
        for s in self.setups:
            setup = parse_setup(s)
            if setup.target is not None:
                out.setdefault(setup.target, {}).update(dict.fromkeys(setup.draft_engines))
        return tuple((t, tuple(d)) for t, d in out.items())

    @property
    def report_reference(self) -> str | None:
        """The lane every output is compared with (reference_divergence): the chosen one, else — when lanes run
        on more than one target — the run's baseline."""
        if self.reference is not None:
            return parse_setup(self.reference).label
        return "baseline" if self.other_targets and "baseline" in self.setups else None

    def same_tokenizer(self, a: str, b: str) -> bool:
        """Whether the targets of setups `a` and `b` share a tokenizer, by their manifests' tokenizer tags (an engine
        without a tag, or that does not resolve, is taken to share it: nothing says otherwise); pinned tags first."""
        pinned = dict(self.tokenizer_tags)

        def tag(engine: str) -> str:
            if engine in pinned:
                return pinned[engine]
            return "" if self.recorded else _tokenizer_tag(engine)

        ta, tb = (tag(parse_setup(x).target or self.target) for x in (a, b))
        return not ta or not tb or ta == tb

    def pinned(self) -> RunPlan:
        """This plan with the tokenizer tags of its targets pinned (what a run file keeps)."""
        engines = {self.target, *(parse_setup(s).target or self.target for s in self.setups)}
        return replace(self, tokenizer_tags=tuple(sorted((e, _tokenizer_tag(e)) for e in engines)))

    # --- commands -----------------------------------------------------------------------------------------
    @property
    def warmup_run_id(self) -> str:
        return f"{self.run_id}-warmup"

    def load_command(self, request_id: str = "load"):
        """LoadEngines for the run's target and drafts, and every other target with its drafts."""
        from app.worker.messages import LoadEngines

        return LoadEngines(request_id, self.target, self.drafts, self.device, self.dtype, others=self.other_targets,
                           profile=self.drafting)

    @property
    def drafting(self) -> bool:
        """Some lane drafts and is priced on the cost model (SetupKind.priced: our loop's lanes, and transformers'
        reference lanes whose steps are read): its theory needs the cost profiles of its target and draft
        (app.core.costs), measured at load with progress rather than when its lane starts, and k=auto decides with
        them."""
        from app.core.setups import kind_of

        return any(kind_of(x).priced and x.prefix != "baseline" for x in map(parse_setup, self.setups))

    def command(self, skip: Collection[int] = ()) -> RunLanes:
        """The recorded run; `skip`: setup indices whose lanes are left out (their setup failed in the warm-up)."""
        lanes = tuple(spec for spec in self.lanes if self.setup_index(spec.lane_id) not in set(skip))
        return RunLanes(self.run_id, self.target, lanes, self.sampling, mode=self.mode, chat=self.chat, device=self.device, dtype=self.dtype)

    def warmup_command(self) -> RunLanes | None:
        """The unrecorded warm-up run (one lane per setup on the first prompt), or None."""
        if self.warmup_tokens <= 0:
            return None
        p = self.prompts[0]
        lanes = tuple(LaneSpec(WARMUP_PREFIX + self.lane_id(i, p, 0), s, p.id, p.prompt, group="warmup", category=p.category) for i, s in enumerate(self.setups))
        s = self.sampling
        sampling = Sampling(s.temperature, s.top_p, s.top_k, s.seed, min(self.warmup_tokens, s.max_new_tokens))
        return RunLanes(self.warmup_run_id, self.target, lanes, sampling, mode=self.mode, chat=self.chat, device=self.device, dtype=self.dtype)


class RunResults:
    """Folds a run's events into per-lane stats and errors (warm-up lanes are ignored), in plan order.

    Attributes:
        stats: lane id → LaneStats of every lane that finished (cancelled ones included, marked in `cancelled`).
        errors: lane id (None: the whole run) → RunError.
        cancelled: ids of lanes that ended cancelled (partial stats kept).
        tokens: tokens emitted so far by recorded lanes.
        stopped: the run was stopped as a whole (set by :meth:`mark_finished`).
    """

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.stats: dict[str, LaneStats] = {}
        self.errors: dict[str | None, RunError] = {}
        self.cancelled: set[str] = set()
        self.tokens = 0
        self.t0 = time.perf_counter()
        self.t_end: float | None = None
        self.stopped = False
        self._order = {spec.lane_id: i for i, spec in enumerate(plan.lanes)}
        self.profiles: dict[str, CostProfile] = {}  # cost profiles of the run's engines, by key

    def on_event(self, ev: object) -> None:
        lane = getattr(ev, "lane_id", None)
        if RunPlan.is_warmup(lane):
            return
        if isinstance(ev, StepEvent):
            self.tokens += len(ev.emitted_ids)
        elif isinstance(ev, LaneDone):
            if isinstance(ev.stats, LaneStats):
                self.stats[ev.lane_id] = ev.stats
            if ev.cancelled:
                self.cancelled.add(ev.lane_id)
        elif isinstance(ev, RunError):
            self.errors[ev.lane_id] = ev
        elif isinstance(ev, ProfileReady):
            self.profiles[ev.profile.key] = ev.profile

    @property
    def finished(self) -> int:
        """Lanes that ended (done, cancelled or failed)."""
        return len(set(self.stats) | {k for k in self.errors if k is not None})

    @property
    def total(self) -> int:
        return len(self._order)

    def by_lane(self) -> dict[str, LaneStats]:
        """lane id → stats with baseline comparisons, in plan order, for lanes that completed (not cancelled)."""
        ids = [lid for lid in sorted(self.stats, key=lambda x: self._order.get(x, 1 << 30)) if lid not in self.cancelled]
        return dict(zip(ids, attach_baseline([self.stats[i] for i in ids], self.plan.report_reference, self.plan.same_tokenizer), strict=True))

    def completed(self) -> list[LaneStats]:
        """Stats of completed lanes, setup by setup in the plan's order (baseline comparisons filled in)."""
        rank = {s: i for i, s in enumerate(parse_setup(x).label for x in self.plan.setups)}
        return sorted(self.by_lane().values(), key=lambda r: rank.get(r.setup, len(rank)))

    @property
    def all_completed(self) -> bool:
        """Every lane finished with stats, none cancelled, no error."""
        return not self.errors and not self.cancelled and set(self.stats) >= set(self._order)

    def lane_error(self, lane_id: str) -> str | None:
        """The first line of why a lane has no complete result: its own error, the run's error when it never
        finished, "cancelled"; None when it completed (or is still running without an error)."""
        e = self.errors.get(lane_id) or (self.errors.get(None) if lane_id not in self.stats else None)
        if e is not None:
            return e.message.splitlines()[0] if e.message else e.kind
        return "cancelled" if lane_id in self.cancelled else None

    def mark_finished(self, stopped: bool = False) -> None:
        """The run has ended (every lane, or stopped): freezes `bench_wall_s` of the report."""
        if self.t_end is None:
            self.t_end = time.perf_counter()
        self.stopped = self.stopped or stopped

    def error_messages(self) -> list[str]:
        return [f"lane {k}: {e.message}" if k else e.message for k, e in self.errors.items()]

    def report(self, device: str, dtype: str, extra: dict | None = None) -> dict:
        """The JSON report (DESIGN.md schema) of the completed lanes, with the plan's metadata."""
        p, s = self.plan, self.plan.sampling
        meta = {
            "mode": p.mode,
            "repeats": p.repeats,
            "prompts": len(p.prompts),
            "categories": {x.id: x.category for x in p.prompts if x.category},
            "bench_wall_s": round((self.t_end or time.perf_counter()) - self.t0, 2),
            "errors": self.error_messages(),
            "cost_profiles": [p.to_json() for p in self.profiles.values()],
        }
        meta.update(extra or {})
        sampling = {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "seed": s.seed, "max_new_tokens": s.max_new_tokens}
        return build_report(p.target, device, dtype, self.completed(), sampling=sampling, extra=meta, reference=p.report_reference,
                            comparable=p.same_tokenizer)


def _check_target_environment(target: str) -> None:
    """The run's target is loaded by SpecDeck's own worker: an engine whose manifest (or backend) names another
    Python environment cannot be it — its lanes run there (`baseline@<engine>`, its backend's own kind).

    Raises:
        SetupError: naming the interpreter and the lanes to use instead.
    """
    from app.core.errors import EngineError
    from app.engines.environments import worker_python
    from app.engines.registry import resolve

    try:
        python = worker_python(resolve(target))
    except EngineError:
        return  # a bad or missing engine is reported when it loads, with its own fix
    if python is not None:
        raise SetupError(f"--target {target} runs in another Python environment ({python}): the run's target is loaded in SpecDeck's own",
                         fix=f"pick a target of this environment and run {target} as lanes: --setup baseline@{target} (or its own kind, "
                             "e.g. trtllm:<engine>)")


@functools.lru_cache(maxsize=64)
def _tokenizer_tag(engine: str) -> str:
    """The `tokenizer` family tag of an engine's manifest ("" when it has none or does not resolve)."""
    from app.core.errors import EngineError
    from app.engines.registry import resolve

    try:
        return str(resolve(engine).extra.get("tokenizer", ""))
    except EngineError:
        return ""
