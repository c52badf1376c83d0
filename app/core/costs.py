"""What a forward costs on this machine: the verify-cost curve, cost profiles, and the theory built on them.

Whether speculation pays depends on what one target forward over n tokens costs against one over a single token,
and that differs by engine and machine by an order of magnitude (fp32 PyTorch with oneDNN packing, Qwen 1.5B:
10 tokens ≈ 1.6x one; llama.cpp Q4_K_M: ≈ 7.4x). A :class:`CostProfile` holds the measured seconds of one
forward over n tokens (n on a grid, after a fixed context) for one engine at one precision on one device and
machine; V(n) = T(n) / T(1) is its **verify-cost curve** and T(1) is also that engine's cost per token when it
drafts. Profiles are measured in the worker (app.speculative.costs), cached as JSON under
``$SPECDECK_PROFILES`` (default ``$XDG_CACHE_HOME/specdeck/profiles``) and carried in reports.

:func:`predicted_wall_s` is the theory every table shows: expected tokens per step from the lane's measured
per-step record (how many steps verified how many drafts: not an i.i.d. α, not a constant k) and time per step
from V and the drafting cost measured in the run, against the baseline of the same target in the same run. Leviathan et al.'s formula
(:func:`uniform_theory`) is kept for comparison: it assumes V(n) = 1 and i.i.d. acceptance.

Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.core.paths import cache_root, write_json_atomically

__all__ = [
    "PROFILE_VERSION",
    "PROFILE_NS",
    "NARROW",
    "TREE_PROBE",
    "CostProfile",
    "LaneCosts",
    "verify_at",
    "machine_summary",
    "machine_key",
    "profiles_dir",
    "profile_path",
    "load_profile",
    "save_profile",
    "predicted_wall_s",
    "uniform_theory",
]

#: 2: narrow forwards keep a median that is off the line beyond noise (app.speculative.costs.smooth); medians_s;
#: 3: tree_ratio
PROFILE_VERSION = 3
#: Tokens per forward measured by a profile (k = n − 1 drafts; k=auto drafts at most PROFILE_NS[-1] − 1).
PROFILE_NS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 28, 33)
#: forwards of at most this many tokens ("narrow") may cost less than narrower ones (a GEMM kernel's blocking): a
#: profile keeps such a measured shape there (app.speculative.costs.smooth); past it a curve never decreases
NARROW = 8
#: the token tree a profile times beside the causal forward of as many tokens (CostProfile.tree_ratio): each token's
#: parent as an index into the tree, −1 for the plain sequence's last token — a root, its 2 children, their 4
#: children and one token below the first of those (8 tokens, a width the profile measures)
TREE_PROBE: tuple[int, ...] = (-1, 0, 0, 1, 1, 2, 2, 3)


def _cpuinfo() -> tuple[str, set[str]]:
    model: str = platform.processor() or "?"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name") and model in ("?", "", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def machine_summary() -> str:
    """`AMD EPYC 7B13, 2 cores, avx2` — the CPU model, logical cores and SIMD flags that every figure is quoted with."""
    model, flags = _cpuinfo()
    simd: list[str] = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile") if f in flags] or ["no avx2"]
    return f"{model}, {os.cpu_count()} cores, {' '.join(simd)}"


def machine_key() -> str:
    """12 hex digits naming this machine for profile caching: CPU model, flags, logical cores, platform."""
    model, flags = _cpuinfo()
    raw = "|".join([model, " ".join(sorted(flags)), str(os.cpu_count()), platform.machine(), platform.system()])
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


#: a profile whose measuring threads waited for a CPU this share of the measurement's wall time, or whose rounds
#: disagreed by this much (interquartile range over median, the median over n), was measured under contention
CONTENDED_WAIT = 0.10
CONTENDED_SPREAD = 1.0


@dataclass(frozen=True)
class CostProfile:
    """Measured forward times of one engine at one precision on one device and machine.

    Attributes:
        engine: the engine's name; backend: "hf" | "llamacpp" | …; precision: its dtype as loaded; device.
        weights: the weights' identity (the cache key of its source), so a changed file is re-measured.
        machine: :func:`machine_key`; machine_text: :func:`machine_summary` (for people).
        ns: tokens per forward, ascending, starting at 1; times_s: the seconds of one forward over n tokens after
            `context_tokens` of context (logits for all n rows, as verification needs them): the rounds' medians
            smoothed (app.speculative.costs.smooth); medians_s: those medians as measured (empty: not recorded).
        reps: rounds timed of every n (the narrow ones may have had more, up to
            app.speculative.costs.NARROW_ROUNDS); measured_at: ISO time; measure_s: seconds the measurement took (loading
            excluded); version: PROFILE_VERSION.
        cpu_wait_share: how long the measuring threads waited for a CPU, per second of the measurement (other
            processes had the cores; None: not Linux); spread: how far the timed rounds disagreed (the largest
            interquartile range of each n's rounds over its median, the median over n). A profile measured under contention
            (:attr:`contended`) is used for its run but never cached: it would price every later run on this machine.
    """

    engine: str
    backend: str
    precision: str
    device: str
    weights: str
    machine: str
    ns: tuple[int, ...]
    times_s: tuple[float, ...]
    context_tokens: int = 0
    reps: int = 0
    machine_text: str = ""
    measured_at: str = ""
    measure_s: float = 0.0
    version: int = PROFILE_VERSION
    cpu_wait_share: float | None = None
    spread: float = 0.0
    medians_s: tuple[float, ...] = ()
    tree_ratio: float | None = None

    def __post_init__(self) -> None:
        if not self.ns or self.ns[0] != 1 or len(self.ns) != len(self.times_s) or list(self.ns) != sorted(set(self.ns)):
            raise ValueError("a cost profile needs ascending ns starting at 1, one time each")
        if any(not (t > 0 and math.isfinite(t)) for t in self.times_s):
            raise ValueError("a cost profile's times must be positive")

    @property
    def key(self) -> str:
        """The cache key: engine, backend, precision, device, weights and machine."""
        return f"{self.engine}-{self.backend}-{self.precision}-{self.device}-{self.weights}-{self.machine}"

    @property
    def contended(self) -> bool:
        """Measured while other processes took its CPU (CONTENDED_WAIT) or with rounds that disagree (CONTENDED_SPREAD)."""
        return (self.cpu_wait_share or 0.0) > CONTENDED_WAIT or self.spread > CONTENDED_SPREAD

    @property
    def t1_s(self) -> float:
        """Seconds of a one-token forward: a decode step, and this engine's cost per drafted token."""
        return self.times_s[0]

    @property
    def max_n(self) -> int:
        return self.ns[-1]

    def t(self, n: int | float) -> float:
        """Seconds of one forward over n tokens: linear between measured points, extended along the last segment."""
        ns, ts = self.ns, self.times_s
        if n <= 1 or len(ns) == 1:
            return ts[0]
        for i in range(1, len(ns)):
            if n <= ns[i]:
                f = (n - ns[i - 1]) / (ns[i] - ns[i - 1])
                return ts[i - 1] + f * (ts[i] - ts[i - 1])
        slope = max(0.0, (ts[-1] - ts[-2]) / (ns[-1] - ns[-2]))
        return ts[-1] + slope * (n - ns[-1])

    def v(self, n: int | float) -> float:
        """V(n) = T(n) / T(1): the verify-cost curve."""
        return self.t(n) / self.t1_s

    def curve(self, n_max: int | None = None) -> tuple[float, ...]:
        """V(1), V(2), … V(n_max) (default: the profile's largest n)."""
        return tuple(self.v(n) for n in range(1, (n_max or self.max_n) + 1))

    def to_json(self) -> dict:
        d = asdict(self)
        d["ns"], d["times_s"], d["medians_s"] = list(self.ns), list(self.times_s), list(self.medians_s)
        d["key"] = self.key
        return d

    @classmethod
    def from_json(cls, d: dict) -> CostProfile:
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        fields["ns"] = tuple(int(n) for n in fields["ns"])
        fields["times_s"] = tuple(float(t) for t in fields["times_s"])
        fields["medians_s"] = tuple(float(t) for t in fields.get("medians_s", ()))
        return cls(**fields)


@dataclass(frozen=True)
class LaneCosts:
    """What a lane's theory needs of the cost profiles, carried in its LaneStats (plain data).

    Attributes:
        verify: V(1) … V(N) of the lane's target (V(1) = 1); beyond N the last segment is extended.
        profiles: the keys of the profiles used.
    """

    verify: tuple[float, ...]
    profiles: tuple[str, ...] = field(default=())

    def v(self, n: int) -> float:
        return verify_at(self.verify, n)


def verify_at(vs: Sequence[float], n: int) -> float:
    """V(n) from V(1) … V(N): the listed value, or past N the last segment extended (never decreasing)."""
    if not vs:
        return 1.0
    if n <= len(vs):
        return vs[max(1, n) - 1]
    slope = vs[-1] - vs[-2] if len(vs) > 1 else 0.0
    return vs[-1] + max(0.0, slope) * (n - len(vs))


def profiles_dir() -> Path:
    """Where cost profiles live: $SPECDECK_PROFILES, else $XDG_CACHE_HOME/specdeck/profiles."""
    if os.environ.get("SPECDECK_PROFILES"):
        return Path(os.environ["SPECDECK_PROFILES"])
    return cache_root() / "profiles"


def profile_path(key: str) -> Path:
    return profiles_dir() / f"{key}.json"


def load_profile(key: str) -> CostProfile | None:
    """The cached profile with this key, or None (missing, unreadable, or of another format version)."""
    try:
        d = json.loads(profile_path(key).read_text(encoding="utf-8"))
        p = CostProfile.from_json(d)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return p if p.version == PROFILE_VERSION and p.key == key else None


def save_profile(p: CostProfile) -> Path | None:
    """Write the profile atomically; returns the path, or None when the cache cannot be written (not an error:
    the profile is then measured again next time)."""
    return write_json_atomically(profile_path(p.key), p.to_json(), indent=1)


def predicted_wall_s(
    *,
    costs: LaneCosts,
    k_hist: Sequence[int],
    draft_s: float,
    prefill_s: float,
    base_step_s: float,
    base_overhead_s: float,
) -> float:
    """Predicted wall time of a speculative lane, from the verify-cost curve and its measured acceptance.

    Each decode step is predicted at its own verify width: a step that drafted k tokens verifies k + 1 in one
    forward, costing base_step_s · V(k + 1), plus the baseline's per-step overhead. How many steps of each width
    there were comes from the lane itself (its accepted counts decide how many steps the tokens took), so
    acceptance is never assumed i.i.d. and k never assumed constant. Drafting is counted as measured in the run
    (the draft's cost c per forward, as in Leviathan et al.), and the prompt forward (step 0) is measured too.

    Args:
        costs: the target's V.
        k_hist: decode steps by drafted count (k_hist[k] = steps that drafted k tokens).
        draft_s: the lane's drafting seconds in decode steps.
        prefill_s: the lane's step 0 (prompt forward, first drafts verified), measured.
        base_step_s, base_overhead_s: the baseline's mean decode forward and mean per-step time outside it, same
            prompt and repeat.

    Returns:
        Seconds.
    """
    verify = sum(n_steps * costs.v(k + 1) for k, n_steps in enumerate(k_hist)) * base_step_s
    return prefill_s + verify + sum(k_hist) * base_overhead_s + draft_s


def uniform_theory(alpha: float, k: float, c: float) -> float:
    """Leviathan et al. (2023): (1 − α^(k+1)) / ((1 − α)(k·c + 1)) — assumes verifying k + 1 tokens costs one
    decode step and acceptance is i.i.d.; kept for comparison with :func:`predicted_wall_s`."""
    if k <= 0:
        return 1.0
    if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
        return float("nan")
    denom = k * c + 1.0
    if alpha >= 1.0 - 1e-12:
        return (k + 1.0) / denom
    return (1.0 - alpha ** (k + 1.0)) / ((1.0 - alpha) * denom)
