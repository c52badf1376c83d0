"""`k=auto`: a cost-aware number of drafts per step, chosen to maximise expected tokens per second.

Each step the policy weighs what drafting is expected to give (tokens) against what it costs (seconds), with the
engines' measured cost profiles (app.core.costs): verifying n tokens costs T(n) = T(1)·V(n) on the target, a draft
forward d. By the renewal-reward argument, the throughput-optimal step maximises

    E[tokens] − λ · E[seconds]

where λ is the best achievable rate (tokens/s); the policy uses the rate it has achieved recently, never below the
baseline's 1 / (T(1) + overhead). With P_j the probability that the first j drafts are all accepted (a product of
per-token acceptance estimates), keeping j drafts is worth 1 + Σ_{l≤j} P_l − λ·T(j + 1): the policy keeps the best
j, and drafts one more token only while some continuation of m tokens (acceptance p̂ each) would beat stopping
now. So a step may draft nothing (the lane then decodes like the baseline), and a draft model stops mid-proposal.

Acceptance estimates are learnt online: for a draft model, from its own probability of each drafted token,
calibrated against what the target kept (binned, with a prior); for n-gram lookup, per match length and position,
also from what was emitted after tokens it did not propose (free evidence). Costs are the profiles' times, scaled
by what the lane observes (EMA), plus the observed per-step overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.costs import CostProfile

__all__ = ["AUTO_K_MAX", "StepTiming", "AutoK", "Calibration"]

#: The most drafts k=auto proposes in one step (the profiles measure forwards up to 33 tokens).
AUTO_K_MAX = 32
_EMA = 0.2
_RATE_DECAY = 0.9
_RELAX = 0.05  # per skipped step, the next-token estimate moves this far back toward the optimistic prior
_OPTIMISTIC = 0.9


@dataclass(frozen=True)
class StepTiming:
    """What the loop measured of the previous decode step (seconds), for the policy's cost estimates."""

    n_verified: int  # tokens in the target forward (k + 1)
    t_verify_s: float
    t_draft_s: float
    draft_forwards: int
    t_wall_s: float
    emitted: int


class Calibration:
    """Maps a score in [0, 1] (the draft's probability of its token) to an acceptance probability: BINS equal bins
    with Beta counts around a prior mean (the bin's centre, `weight` pseudo-observations)."""

    BINS = 10

    def __init__(self, weight: float = 2.0) -> None:
        self.acc = [weight * (i + 0.5) / self.BINS for i in range(self.BINS)]
        self.n = [weight] * self.BINS

    def _bin(self, q: float) -> int:
        return min(self.BINS - 1, max(0, int(q * self.BINS)))

    def __call__(self, q: float) -> float:
        b = self._bin(q)
        return self.acc[b] / self.n[b]

    def update(self, q: float, accepted: bool) -> None:
        b = self._bin(q)
        self.acc[b] += 1.0 if accepted else 0.0
        self.n[b] += 1.0


class AutoK:
    """The cost model and decision rule shared by every k=auto drafter.

    Args:
        target: the target's cost profile (verify cost T(n)).
        draft_s: seconds of one draft forward (the draft's profile T(1)); 0 for lookup drafters.
        k_max: the most drafts per step.
        p_prior: the first estimate of a draft's acceptance.
        draft: the draft model's own profile, when it has one: a draft that has fallen behind (steps without
            drafting) first catches up over several tokens, which costs more than one forward.
    """

    def __init__(self, target: CostProfile, draft_s: float | None = None, k_max: int = AUTO_K_MAX, p_prior: float = 0.7,
                 draft: CostProfile | None = None) -> None:
        self.profile = target
        self.draft_profile = draft
        self.d_prof = draft_s if draft_s is not None else draft.t1_s if draft is not None else 0.0
        self.k_max = k_max
        self.scale_t = 1.0  # observed / profiled verify time
        self.scale_d = 1.0
        self.overhead_s = 0.0
        self.p_next = p_prior  # acceptance expected of a draft token not yet drafted
        self._tok = 0.0  # decayed sums for the achieved rate
        self._sec = 0.0
        self.last_why = ""

    # --- costs ----------------------------------------------------------------------------------------
    def t(self, n: int) -> float:
        """Predicted seconds of a target forward over n tokens."""
        return self.scale_t * self.profile.t(n)

    @property
    def d(self) -> float:
        return self.scale_d * self.d_prof

    @property
    def base_rate(self) -> float:
        """Tokens/s of plain decoding (one token per step)."""
        return 1.0 / (self.t(1) + self.overhead_s)

    @property
    def rate(self) -> float:
        """λ: the rate a step must beat — what the lane achieved lately, at least the baseline's."""
        achieved = self._tok / self._sec if self._sec > 0 else 0.0
        return max(self.base_rate, achieved)

    def observe(self, s: StepTiming | None) -> None:
        """Fold the previous decode step's measured times into the cost estimates and the achieved rate."""
        if s is None:
            return
        pred = self.profile.t(s.n_verified)
        if pred > 0 and s.t_verify_s > 0:
            self.scale_t += _EMA * (min(3.0, max(0.33, s.t_verify_s / pred)) - self.scale_t)
        if s.draft_forwards and self.d_prof > 0 and s.t_draft_s > 0:
            self.scale_d += _EMA * (min(3.0, max(0.33, s.t_draft_s / s.draft_forwards / self.d_prof)) - self.scale_d)
        if s.t_wall_s > 0:
            other = max(0.0, s.t_wall_s - s.t_verify_s - s.t_draft_s)
            self.overhead_s += _EMA * (other - self.overhead_s)
            self._tok = _RATE_DECAY * self._tok + s.emitted
            self._sec = _RATE_DECAY * self._sec + s.t_wall_s

    # --- decisions --------------------------------------------------------------------------------------
    def _gain(self, cum: list[float], j: int, lam: float) -> float:
        """Value of keeping the first j drafts (without sunk drafting): Σ_{l≤j} P_l − λ·T(j + 1)."""
        return sum(cum[:j]) - lam * self.t(j + 1)

    def best_k(self, cum: list[float]) -> int:
        """How many of the drafted tokens to verify, given P_1 … P_i."""
        lam = self.rate
        return max(range(len(cum) + 1), key=lambda j: (self._gain(cum, j, lam), -j))

    def catch_up_s(self, feed: int) -> float:
        """Extra seconds of a draft forward over `feed` tokens (catching up) beyond a one-token forward."""
        if feed <= 1 or self.draft_profile is None:
            return 0.0
        return self.scale_d * (self.draft_profile.t(feed) - self.draft_profile.t1_s)

    def worth_drafting_more(self, cum: list[float], k_cap: int, p_next: float | None = None, extra_s: float = 0.0) -> bool:
        """Whether drafting (at least) one more token can beat verifying the best subset of those drafted so far:
        some m ≥ 1 with Σ_{l≤i} P_l + Σ_{l=1..m} P_i·p̂^l − λ·(T(i + m + 1) + m·d + extra_s) > the best keep value
        (extra_s: a draft catching up over several tokens first)."""
        i = len(cum)
        if i >= k_cap:
            return False
        lam = self.rate
        p = self.p_next if p_next is None else p_next
        stop_value = max(self._gain(cum, j, lam) for j in range(i + 1))
        have = sum(cum)
        last = cum[-1] if cum else 1.0
        extra = 0.0
        for m in range(1, k_cap - i + 1):
            last *= p
            extra += last
            if have + extra - lam * (self.t(i + m + 1) + m * self.d + extra_s) > stop_value + 1e-12:
                return True
            if last < 1e-4:
                break
        return False

    def can_ever_pay(self, k_cap: int) -> bool:
        """Whether drafting could beat plain decoding even if every draft were accepted."""
        return self.worth_drafting_more([], k_cap, p_next=1.0)

    def skipped(self) -> None:
        """A step drafted nothing: drift the next-token estimate back toward optimism, so that a lane that stopped
        drafting on bad luck probes again later (bounded cost: one short draft)."""
        self.p_next += _RELAX * (_OPTIMISTIC - self.p_next)

    def learnt(self, p: float) -> None:
        """A calibrated acceptance estimate of a drafted token: the next one is expected to be alike."""
        self.p_next += _EMA * (p - self.p_next)

    def explain(self, cum: list[float], k: int) -> str:
        """One line for the step's tooltip: what was predicted for the chosen k against drafting nothing."""
        t_k = self.t(k + 1) + self.overhead_s + (self.d * len(cum))
        e_k = 1.0 + sum(cum[:k])
        t_0 = self.t(1) + self.overhead_s
        why = (f"k=auto chose {k} of {len(cum)} drafted: expect {e_k:.2f} tokens in {t_k * 1e3:.0f} ms "
               f"({e_k / t_k:.1f} tok/s) vs 1 in {t_0 * 1e3:.0f} ms ({1 / t_0:.1f} tok/s) without drafting; "
               f"verify {self.t(k + 1) * 1e3:.0f} ms = V({k + 1}) {self.profile.v(k + 1):.2f}x one token")
        if cum:
            why += "; P(all accepted) " + " ".join(f"{p:.2f}" for p in cum[: min(len(cum), 8)]) + (" …" if len(cum) > 8 else "")
        self.last_why = why
        return why
