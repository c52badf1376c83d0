"""Statistics of lanes and runs: α, τ, per-position acceptance, throughput, TTFT, speedups.

Plain data (stdlib only). The CLI table, the JSON export and the GUI all read these objects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from app.core.costs import LaneCosts, predicted_wall_s, uniform_theory
from app.core.events import StepEvent

__all__ = [
    "LaneStats",
    "LaneAccumulator",
    "SetupSummary",
    "theoretical_speedup",
    "predicted_theory",
    "summarize",
    "first_divergence",
    "DraftAt",
    "drafts_on_answer",
    "draft_differences",
]


#: Leviathan et al.'s formula (assumes a k-token verify costs one decode step); see app.core.costs.
theoretical_speedup = uniform_theory


#: where a lane's drafted/accepted counts come from (LaneStats.counts_source)
CountsSource = Literal["steps", "streamed", "engine"]


@dataclass(frozen=True)
class LaneStats:
    """Everything measured for one lane (one setup on one prompt, one repeat).

    Times are in seconds. `wall_s` is the whole generation, prefill included (Spec-Bench's convention), so
    tokens/s = new_tokens / wall_s; `prefill_s` is step 0 (the prompt forward, which verifies the first drafts too)
    and `ttft_s` the time from the start of the lane to its first emitted token. `step0_drafted` counts the drafts
    the prompt forward verified (their cost is in prefill_s, so c and theory use the later steps only);
    `stall_s` is lane time during which the worker barely ran (stopped or starved): a speedup built on it is flagged.
    `counts_source` says where `drafted`/`accepted` come from: "steps" (every step's drafts known), "streamed"
    (inferred from streamed chunk sizes, assuming k drafts per iteration: TensorRT-LLM's counts-only lanes) or
    "engine" (the backend's own per-request counters). `notes` are what the lane must tell the reader (e.g. a
    backend that decoded greedily although sampling was asked). `reference_divergence` is where the output first
    differs from the run's chosen reference lane (same prompt and repeat; e.g. PyTorch fp32 against llama.cpp),
    None when identical or not compared. `decode_k_hist[k]` counts the decode steps (after step 0) that drafted k
    tokens; `costs` holds the target's verify-cost curve and the draft's cost from their profiles (None: no
    profile), from which the summary's theory is predicted. `tree_steps` counts the steps that verified a token tree:
    there `drafted` counts tree nodes, the per-position counts are per depth, and the chain formula (uniform theory)
    does not apply. `cpu_wait_s` is how long the worker's threads waited for a CPU while the lane computed (Linux
    run-queue delay summed over its threads; None where not measured): time other processes took from its clock.
    """

    setup: str
    prompt_id: str
    repeat: int
    new_tokens: int
    wall_s: float
    ttft_s: float
    prefill_s: float
    steps: int
    drafted: int
    accepted: int
    draft_forwards: int
    t_draft_s: float
    t_verify_s: float
    output_ids: tuple[int, ...]
    output_text: str
    per_position_drafted: tuple[int, ...] = ()
    per_position_accepted: tuple[int, ...] = ()
    stop_reason: str = "length"
    identical_to_baseline: bool | None = None
    first_divergence: int | None = None
    speedup: float | None = None
    library: bool = False  # a library lane (its own loop; its drafting reported, and its theory priced, where its steps could be read)
    step0_drafted: int = 0
    stall_s: float = 0.0
    counts_source: CountsSource = "steps"
    notes: tuple[str, ...] = ()
    reference_divergence: int | None = None
    reference_comparable: bool = True  # False: its target's tokenizer differs from the reference lane's (ids not compared)
    decode_k_hist: tuple[int, ...] = ()
    costs: LaneCosts | None = None
    tree_steps: int = 0
    cpu_wait_s: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def acceptance_rate(self) -> float | None:
        """α = Σ accepted / Σ drafted; None when nothing was drafted (baseline, library lanes)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_len(self) -> float | None:
        """τ = tokens emitted / steps (the target token included)."""
        return self.new_tokens / self.steps if self.steps else None

    @property
    def per_position_acceptance(self) -> tuple[float, ...]:
        """Fraction of steps that drafted position i (1-based i = index + 1) whose draft was accepted."""
        return tuple(a / d if d else float("nan") for a, d in zip(self.per_position_accepted, self.per_position_drafted, strict=False))

    @property
    def mean_k(self) -> float:
        return self.drafted / self.steps if self.steps else 0.0

    @property
    def decode_steps(self) -> int:
        """Steps after step 0 (whose target forward is the prompt's prefill)."""
        return max(0, self.steps - 1)

    def with_baseline(self, baseline: LaneStats) -> LaneStats:
        """Fill in `identical_to_baseline`, `first_divergence` and `speedup` against a baseline lane."""
        div = first_divergence(self.output_ids, baseline.output_ids)
        sp = baseline.wall_s / self.wall_s if self.wall_s > 0 else None
        return replace(self, identical_to_baseline=div is None, first_divergence=div, speedup=sp)

    def to_json(self) -> dict:
        d = asdict(self)
        d["output_ids"] = list(self.output_ids)
        d["per_position_drafted"] = list(self.per_position_drafted)
        d["per_position_accepted"] = list(self.per_position_accepted)
        d["decode_k_hist"] = list(self.decode_k_hist)
        d["tokens_per_s"] = self.tokens_per_s
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_accepted_len"] = self.mean_accepted_len
        d["per_position_acceptance"] = [None if math.isnan(x) else x for x in self.per_position_acceptance]
        return d


def setup_target(label: str) -> str | None:
    """The engine a lane's setup label moves it to (`…@<engine>`), None for the run's target."""
    head, at, target = label.rpartition("@")
    return target if at and head else None


def baseline_of(label: str) -> str:
    """The label of the baseline lane a setup is measured against: the baseline of its own target."""
    t = setup_target(label)
    return f"baseline@{t}" if t else "baseline"


def is_baseline(label: str) -> bool:
    return label == baseline_of(label)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """0-based index of the first differing token, or None when the sequences are identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


@dataclass(frozen=True)
class DraftAt:
    """What a lane's draft proposed at one answer position, on the answer's true prefix: its token, its confidence
    q (None: not reported) and whether the target kept it."""

    token: int
    q: float | None
    kept: bool


def drafts_on_answer(steps: Sequence[StepEvent]) -> dict[int, DraftAt] | None:
    """Every answer position (0-based, in emitted tokens) at which the lane's draft proposed a token with the answer
    so far as its prefix — the kept drafts of each step and its first rejected one; drafts past a rejection followed
    a wrong prefix and are left out, and so is the draft after a step that ended without a target token (an EOS
    kept, the token limit), which the answer never reached. None where the steps do not say which tokens were drafted
    (a token tree, a library lane, a backend that reports counts only)."""
    out: dict[int, DraftAt] = {}
    pos = 0
    for s in steps:
        if s.tree is not None or s.target_kind == "library" or (s.drafted_count is not None and not s.drafted_ids):
            return None
        a = s.accepted_count
        for i, tok in enumerate(s.drafted_ids[: a + 1 if s.target_id is not None else a]):
            q = s.draft_probs[i] if s.draft_probs and i < len(s.draft_probs) else None
            out[pos + i] = DraftAt(int(tok), None if q is None else float(q), i < a)
        pos += len(s.emitted_ids)
    return out


def draft_differences(a: Sequence[StepEvent], b: Sequence[StepEvent]) -> tuple[int, list[tuple[int, DraftAt, DraftAt]]] | None:
    """Where two lanes of one prompt with the same draft model (greedy) drafted different tokens on the same prefix:
    (how many positions both drafted, [(position, a's draft, b's draft) where the tokens differ]). Where the lanes'
    answers differ, only positions up to their first divergence share a prefix, and only those are compared.

    With greedy decoding the draft's token at a position is a function of the prefix, so two lanes of the same draft
    differ there only through the draft's numerics — which depend on how its tokens were fed (one at a time, or
    several per forward, as each lane's step boundaries decide): an int8 draft's rounding turns a feeding's
    last-bit differences into different tokens where its two best are close (resources/bench/README.md,
    "Where two lanes of one draft part"). Where one lane's differing draft was kept and the other's rejected, the
    lanes' step counts part by luck, not by their rules. None where either lane's steps do not tell (see
    :func:`drafts_on_answer`)."""
    da, db = drafts_on_answer(a), drafts_on_answer(b)
    if da is None or db is None:
        return None
    div = first_divergence([t for s in a for t in s.emitted_ids], [t for s in b for t in s.emitted_ids])
    shared = sorted(p for p in da.keys() & db.keys() if div is None or p <= div)
    return len(shared), [(p, da[p], db[p]) for p in shared if da[p].token != db[p].token]


@dataclass
class LaneAccumulator:
    """Folds StepEvents into running counts (used by the loop for final stats and by the GUI live header)."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    t_draft_s: float = 0.0
    t_verify_s: float = 0.0
    t_wall_s: float = 0.0
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    first: StepEvent | None = None

    def add(self, ev: StepEvent) -> None:
        if self.first is None:
            self.first = ev
        self.steps += 1
        k = ev.k
        self.drafted += k
        self.accepted += ev.accepted_count
        self.new_tokens += len(ev.emitted_ids)
        self.t_draft_s += ev.t_draft_s
        self.t_verify_s += ev.t_verify_s
        self.t_wall_s += ev.t_wall_s
        positions = ev.tree.depth if ev.tree is not None else k  # a tree: per depth (drafted = the tree reached it)
        while len(self.per_position_drafted) < positions:
            self.per_position_drafted.append(0)
            self.per_position_accepted.append(0)
        for i in range(positions):
            self.per_position_drafted[i] += 1
            if i < ev.accepted_count:
                self.per_position_accepted[i] += 1

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_len(self) -> float | None:
        return self.new_tokens / self.steps if self.steps else None


@dataclass(frozen=True)
class SetupSummary:
    """One setup over all prompts and repeats of a run."""

    setup: str
    runs: int
    new_tokens: int
    wall_s: float
    tokens_per_s: float
    speedup: float | None
    acceptance_rate: float | None
    mean_accepted_len: float | None
    theoretical_speedup: float | None
    identical_runs: int
    c: float | None
    mean_k: float
    draft_share: float
    verify_share: float
    prefill_share: float
    overhead_share: float
    ttft_s: float
    stall_s: float = 0.0  # lane time lost to stalls, summed over the setup's runs (and flagged in displays)
    counts_source: str = "steps"  # where α's counts come from: one of CountsSource, or "mixed" when the runs differ
    counts_sources: tuple[str, ...] = ("steps",)  # each source of the setup's runs, once
    notes: tuple[str, ...] = ()  # the runs' notes, once each
    uniform_theory: float | None = None  # Leviathan et al.'s formula with the measured α, mean k and c (V(n) = 1)
    #: the worker's threads' wait for a CPU over the lanes' wall time (LaneStats.cpu_wait_s; None: not measured)
    cpu_wait_share: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def predicted_theory(paired: Sequence[tuple[LaneStats, LaneStats]]) -> float | None:
    """The cost-aware theory of a setup: Σ baseline wall / Σ predicted setup wall over the prompts both ran
    (app.core.costs.predicted_wall_s), each lane predicted against its own prompt's baseline. None when it
    cannot be predicted: a lane without a cost profile or per-step drafting counts (library lanes whose steps could
    not be read, backends that report counts only), or a baseline with no decode step to measure. A library lane
    whose steps were read (transformers' assisted generation and lookup) is priced as SpecDeck's lanes are: the
    theory then says what its steps cost on the cost model, and the measured speedup below it what its own loop
    added."""
    if not paired:
        return None
    base_wall = pred = 0.0
    for r, b in paired:
        if r.costs is None or not r.decode_k_hist or r.counts_source != "steps" or b.decode_steps <= 0:
            return None
        step = b.t_verify_s / b.decode_steps
        overhead = max(0.0, b.wall_s - b.prefill_s - b.t_verify_s - b.t_draft_s) / b.decode_steps
        pred += predicted_wall_s(costs=r.costs, k_hist=r.decode_k_hist, draft_s=r.t_draft_s, prefill_s=r.prefill_s,
                                 base_step_s=step, base_overhead_s=overhead)
        base_wall += b.wall_s
    return base_wall / pred if pred > 0 else None


def summarize(runs: Sequence[LaneStats]) -> list[SetupSummary]:
    """Pool runs per setup, in first-seen order.

    speedup = Σ baseline wall / Σ setup wall over the prompts and repeats both ran (same run, same
    prompts), the baseline being that of the setup's own target (`baseline` or `baseline@<target>`). α and τ
    are pooled (Σa/Σk, Σtokens/Σsteps). c = mean draft forward time / mean baseline target step time, both
    measured in this run on the same target.
    """
    order: list[str] = []
    by: dict[str, list[LaneStats]] = {}
    for r in runs:
        if r.setup not in by:
            order.append(r.setup)
            by[r.setup] = []
        by[r.setup].append(r)
    out = []
    for name in order:
        rs = by[name]
        base = {(r.prompt_id, r.repeat): r for r in by.get(baseline_of(name), [])}
        base_step = None
        if base:
            bs = sum(r.decode_steps for r in base.values())
            base_step = sum(r.t_verify_s for r in base.values()) / bs if bs else None
        wall = sum(r.wall_s for r in rs)
        toks = sum(r.new_tokens for r in rs)
        steps = sum(r.steps for r in rs)
        drafted = sum(r.drafted for r in rs)
        accepted = sum(r.accepted for r in rs)
        paired = [(r, base[(r.prompt_id, r.repeat)]) for r in rs if (r.prompt_id, r.repeat) in base]
        speedup = (sum(b.wall_s for _, b in paired) / sum(r.wall_s for r, _ in paired)) if paired else None
        alpha = accepted / drafted if drafted else None
        mean_k = drafted / steps if steps else 0.0
        fwd = sum(r.draft_forwards for r in rs)
        decode_drafted = drafted - sum(r.step0_drafted for r in rs)
        c = None
        # c needs drafting measured outside step 0 (whose cost hides in the prefill): with k >= the token budget
        # everything is drafted in step 0 and there is nothing to measure, so c and theory are not applicable
        if base_step and decode_drafted > 0:
            # model drafters: per forward; others (n-gram): per drafted token
            c = sum(r.t_draft_s for r in rs) / (fwd or decode_drafted) / base_step
        chain = not any(r.tree_steps for r in rs)  # Leviathan et al.'s formula is for chains of drafts
        uniform = uniform_theory(alpha, mean_k, c) if alpha is not None and c is not None and chain else None
        theo = 1.0 if is_baseline(name) else predicted_theory(paired)
        td = sum(r.t_draft_s for r in rs)
        tv = sum(r.t_verify_s for r in rs)
        tp = sum(r.prefill_s for r in rs)
        out.append(
            SetupSummary(
                setup=name,
                runs=len(rs),
                new_tokens=toks,
                wall_s=wall,
                tokens_per_s=toks / wall if wall > 0 else float("nan"),
                speedup=speedup,
                acceptance_rate=alpha,
                mean_accepted_len=toks / steps if steps else None,
                theoretical_speedup=theo,
                uniform_theory=uniform,
                identical_runs=sum(1 for r in rs if r.identical_to_baseline),
                c=c,
                mean_k=mean_k,
                draft_share=td / wall if wall > 0 else float("nan"),
                verify_share=tv / wall if wall > 0 else float("nan"),
                prefill_share=tp / wall if wall > 0 else float("nan"),
                overhead_share=max(0.0, wall - tp - td - tv) / wall if wall > 0 else float("nan"),
                ttft_s=_mean(r.ttft_s for r in rs),
                stall_s=sum(r.stall_s for r in rs),
                counts_source=_one_source(rs),
                counts_sources=tuple(dict.fromkeys(r.counts_source for r in rs)),
                notes=tuple(dict.fromkeys(n for r in rs for n in r.notes)),
                cpu_wait_share=cpu_wait_share(rs),
            )
        )
    return out


def cpu_wait_share(rs: Sequence[LaneStats]) -> float | None:
    """The lanes' CPU wait (summed over the worker's threads) per second of their wall time; None when any lane was
    not measured."""
    if not rs or any(r.cpu_wait_s is None for r in rs):
        return None
    wall = sum(r.wall_s for r in rs)
    return round(sum(r.cpu_wait_s or 0.0 for r in rs) / wall, 4) if wall > 0 else None


def _one_source(rs: Sequence[LaneStats]) -> str:
    """The runs' counts source when they agree, else "mixed"."""
    sources = {r.counts_source for r in rs}
    return sources.pop() if len(sources) == 1 else "mixed"
