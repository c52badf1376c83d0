"""`k=auto`: a cost-aware number of drafts per step, chosen to maximise expected tokens per second.

Costs are counted in units of the target's one-token forward T(1) with the step model shared with the setup finder
(app.core.tuning.StepPrice): a step verifying j drafts made in f draft forwards costs V(j + 1) + f·c + o. V comes from
the target's cost profile; c (a draft forward over T(1)) and o (the step's time outside the forwards over T(1)) are
learnt from each step as ratios to that step's own verify time — so a machine that is uniformly slower for a while
(another process took a core) changes no decision, where costs in seconds would read it as verification getting dearer.
V itself is the profile's scaled by what the lane measured (:attr:`AutoK.verify_factor`): the profile times a target
forward after another, a lane's verify runs after the draft's forwards, and on llama.cpp on a 2-core Xeon it cost
1.06–1.4 times the profile's V(n) over the baseline's decode steps — priced with the profile's curve, steps of one
draft made 0.72 of the baseline's tokens a second on qa-1, and the saving measured after the prompt's reading came to
−0.02 of a step a token where those steps lost 0.13 (resources/bench/README.md, "k=auto's verify cost"). The factor is
a ratio of a wide verify to a plain decode step a few steps before it, so a uniform slowdown does not move it either.

By the renewal-reward argument, the throughput-optimal step maximises E[tokens] − λ · E[units], where λ is the best
achievable rate in tokens per unit: the policy uses what it achieved recently (tokens over the *modelled* units of its
steps, so a slow moment does not move it either), never below the baseline's 1 / (1 + o); an answer starts from the
rate over the earlier answers (:meth:`AutoK.begin_answer`), not from the last one's last steps. With P_j the probability that
the first j drafts are all accepted, keeping j drafts is worth 1 + Σ_{l≤j} P_l − λ·V(j + 1): the policy keeps the best
j, and drafts one more token only while some continuation would beat stopping now. So a step may draft nothing (the
lane then decodes like the baseline), and a draft model stops mid-proposal.

That rule prices every token a step leaves undrafted at the lane's average rate λ. Where the text ahead is easy it is
not: the next step drafts those tokens, at the rate of a step on such text. So a draft model's proposal is valued over
two steps (:meth:`AutoK.stop_value`): keeping j drafts is worth their gain plus, with probability P_{j+1} (the target's
own token after them is the draft's next one), the excess over an average step of a next step that drafts on from
there, S⁺ = max(0, 1 + max_m [Σ_{l≤m} Q_l − λ·(V(m + 1) + m·c + o)]) — the tokens already drafted at their calibrated
acceptance, those not yet drafted at p̂. On steady text a step's excess is 0 and the rule is the one above; before an
unsure draft followed by confident ones, stopping now and drafting the confident tail in the next step can beat
betting the whole tail on the unsure one (math-1: a draft of confidence 0.5–0.8 after two confident ones, rejected in
three steps running; replayed, the policy now drafts 72 tokens to keep 40 where it drafted 86:
resources/bench/README.md, "Two steps ahead").

Acceptance is estimated where it is decided, from the target's verdicts:

* a drafted token: its draft probability q, calibrated against what the target kept (:class:`Calibration`);
* the first token of a step, before anything is drafted: P(accepted) conditioned on how the previous step ended —
  all drafts kept, some, none, or nothing drafted (:class:`Acceptance`);
* the next token, not yet drafted: P(accepted | the previous draft was accepted, and its confidence bin) — a token
  after a confident one is likely confident too; an average over all drafts would be dominated by the unconfident
  last drafts where proposals stop, and would make the policy stop drafting where drafting pays.
* the first token's and the next token's estimates also per category of prompt where the prompt has one (a suite's,
  a prompts file's), around the pooled ones (:class:`Acceptance`, `by_category`): a run of confident drafts lasts
  longer on code than on a QA answer, and at the pooled estimate k=auto stopped every coding proposal at 3 drafts on
  llama.cpp (resources/bench/README.md, "k=auto's acceptance by category");
* and each of these shifted, within one answer, by what this answer's verdicts say of it (:meth:`AutoK.local`): a
  shift in log-odds, 0 when the answer starts, with a prior of variance ANSWER_SHIFT_VAR. The estimates above are
  learnt over many answers — from a saved memory, over hundreds of verdicts, which one answer's few do not move —
  and an answer can be unlike them: on a Spec-Bench editing prompt the target rejected the draft's confident
  tokens step after step, and k=auto drafted 140 tokens to keep 39 (1.17x, where `k=8,cstop=0.5` made 1.65x).

Each estimate starts from a prior worth PRIOR_WEIGHT verdicts, so that the first few steps of an answer do not swing
it; and a draft lane starts from what the previous lane of the same (target, draft) pair learnt in this worker
(:func:`recall`, :func:`remember`) — a 48-token answer has ~10 steps, too few to learn the draft from scratch each time.
In step 0 drafts ride on the prompt's forward: each costs the verify curve's last slope, not a decode step's V(n).
What a pair learnt is also saved on disk when a lane ends (:func:`save_learnt`, per target and draft profile key:
the same weights, precision and machine) and a new worker's first lane starts from it (:func:`load_learnt`): the
first answer of a run, or a run of one prompt, no longer starts from the priors, which over-draft until a few answers
have taught the calibration (resources/bench/README.md, "k=auto's first answer").

A draft model must read the context before its first draft of an answer: a forward over the whole prompt, which k=auto
pays in the first step that drafts (a lane where drafting never pays reads nothing). That reading is an investment
over the rest of the answer, so it is made only where drafting has lately saved enough per token to repay it
(:meth:`AutoK.worth_reading`): what the pair's steps saved against the baseline's price per token, once the draft had
read, measured on each step as a ratio to its own verify time (:meth:`AutoK.count_saving`), around a prior of
SAVING_PRIOR units a token. On llama.cpp on a 2-core Xeon the 0.5B draft took 4–14 target decode steps to read a
Spec-Bench prompt, and drafting then saved −0.3 … 3 steps over the 48-token answer: k=auto lost 9 % to the baseline
(resources/bench/README.md, "k=auto's reading of the prompt"). Where the prompt has a category (a suite's, a prompts
file's), that saving is the category's own (:meth:`AutoK.saving_of`), each from the prior: on llama.cpp there the best
fixed setting made 1.09–1.23x the baseline on two of three coding prompts and 0.79–0.86x on every translation one, and
a saving pooled over every answer, once a probe on a QA prompt had measured a loss, kept every coding prompt unread
(resources/bench/README.md, "k=auto's saving by category"). A draft that fell behind while steps drafted nothing
catches up the same way: the tokens it missed are an investment priced over the tokens left and gated by the same
saving, where charged whole to the step that resumed drafting they grew each step it waited, and a llama.cpp lane that
had stopped drafting for a few steps never drafted again (resources/bench/README.md, "k=auto's catch-up").

For n-gram lookup acceptance is estimated per match length and position, also from what was emitted after tokens it
did not propose (free evidence).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from app.core.costs import CostProfile, profiles_dir, verify_at
from app.core.paths import write_json_atomically
from app.core.tuning import StepPrice, expected_tokens

__all__ = ["AUTO_K_MAX", "PRIOR_WEIGHT", "ANSWER_SHIFT_VAR", "VERIFY_PRIOR", "VERIFY_DECAY", "VERIFY_CLIP", "VERIFY_FRESH", "VERIFY_SAVED_CAP", "CATEGORY_WEIGHT", "SAVING_PRIOR", "SAVING_WEIGHT", "SAVING_DECAY", "SAVING_POLICY", "SAVING_CAP", "saving_per_token", "StepTiming", "AutoK", "Calibration", "Acceptance", "STARTS", "recall", "remember",
           "forget", "SAVED_CAP", "saving_words", "sure_words", "scaled_verify", "saved_dir", "save_learnt", "load_learnt", "saved_summary", "forget_saved"]

#: The most drafts k=auto proposes in one step (the profiles measure forwards up to 33 tokens).
AUTO_K_MAX = 32
_EMA = 0.2
_RATE_DECAY = 0.9
#: what the rate over earlier answers is worth when an answer starts (units of T(1), about five decode steps; the rate
#: of the lane's recent steps has ~20): AutoK.begin_answer
START_UNITS = 10.0
#: per answer, the weight of earlier answers in that rate
_ANSWER_DECAY = 0.9
_RELAX = 0.05  # per skipped step, the first-token estimate after a skip moves this far back toward the optimistic prior
_OPTIMISTIC = 0.9
#: pseudo-observations behind each prior: a few verdicts must not swing an estimate (a 48-token answer has ~10 steps)
PRIOR_WEIGHT = 6.0
#: the shape of the acceptance prior given the draft's confidence q: q ** PRIOR_GAMMA (:func:`prior_acceptance`)
PRIOR_GAMMA = 0.7
#: what the prior on a step's first draft's confidence (Acceptance.first_q: every confidence alike) is worth, in first
#: drafts: worth PRIOR_WEIGHT, its share of confident first drafts kept a lane whose first drafts were all unsure (and
#: rejected) drafting one token to look at it in 43 of 48 steps (0.90x the baseline, app.speculative.replay on literal
#: records); worth one, the lane's own first drafts decide after about ten looks
FIRST_Q_PRIOR = 1.0
#: the prior of an answer's first draft being accepted: 14 of 24 on the Qwen pair's Spec-Bench prompts (AutoK.ended)
OPENING_PRIOR = 0.6
#: the prior variance, in log-odds, of how far one answer's acceptance is from the estimates learnt over many
#: (AutoK.local): a shift of ±0.5 (odds ×0.6 … ×1.65) is one standard deviation. Replayed over a calibration of the 24
#: Spec-Bench prompts (3 orders), k=auto went from 0.980 to 0.998 of the best fixed setting starting from a saved
#: memory of 46 answers (editing 0.91 → 1.06), and from 0.987 to 0.996 from its priors; in a sweep of the variance on
#: the same records 0.1 moved editing less and 0.5 and 1 lost more elsewhere (resources/bench/README.md, "An answer's
#: own acceptance")
ANSWER_SHIFT_VAR = 0.25
#: what drafting saves a token once the draft has read the context, in units of T(1) — the prior of AutoK.saving: a
#: lane that halves the time of a token saves 0.5, one at the baseline's speed 0 — worth SAVING_WEIGHT tokens (a third
#: of a 48-token answer: the first answer of a pair reads wherever reading costs less than 14 decode steps, and what it
#: measured decides from then on)
SAVING_PRIOR = 0.3
SAVING_WEIGHT = 16.0
#: per answer, the weight of what earlier answers measured of the saving (of a category's, per answer of that category):
#: a pair that stopped reading because drafting saved too little drifts back toward the prior, and reads again where a
#: prompt is cheap to read — a probe every few tens of answers (SAVING_CAP)
SAVING_DECAY = 0.97
#: the revision of the decision rule whose steps a saved saving measured: what drafting saves depends on how k=auto
#: drafts, so a memory saved by an earlier rule starts its savings from the prior (its acceptance estimates, the
#: pair's own, are kept). 2: acceptance by category (Acceptance.by_category); files without it are of revision 1
SAVING_POLICY = 2
#: the most tokens of measured saving a run starts from (load_learnt: ten 48-token answers, the mean kept): a pair
#: whose drafting saved nothing over them reads a 43-token prompt again (4.7 decode steps to read, llama.cpp on a
#: 2-core Xeon; 48-token answers) after about 90 answers, where a memory of 1600 tokens — what the decay settles at
#: over many runs — would wait about 130
SAVING_CAP = 480.0
#: what a verify of n ≥ 2 tokens costs in a lane over what the target's profile says (AutoK.verify_factor): each such
#: step after a recent plain decode step is one observation of the log-ratio, clipped to ±VERIFY_CLIP; the mean of
#: the observations, decayed by VERIFY_DECAY each, around a prior of 0 (the profile as it is) worth VERIFY_PRIOR of
#: them. On llama.cpp (the Qwen Q4_K_M pair, 2-core Xeon) a draft lane's verifies of 2–16 tokens cost 1.06–1.4 times
#: what the profile says, over the baseline's decode steps (the profile times forwards that follow the target's own; a
#: lane's verify follows the draft's forwards): resources/bench/README.md, "k=auto's verify cost"
VERIFY_PRIOR = 4.0
VERIFY_DECAY = 0.98
VERIFY_CLIP = 0.4
#: a plain decode step (one token, no draft) is a lane's own T(1) for VERIFY_FRESH steps: a wider verify further
#: from one is not compared with it (the context, and the machine's speed, moved on)
VERIFY_FRESH = 8
#: the most observations a saved verify factor is worth when a run starts from it
VERIFY_SAVED_CAP = 40.0
#: what the pooled acceptance estimates (over every answer of the pair) are worth, in verdicts, as the prior of a
#: category's own (Acceptance.by_category): six kept verdicts after sure drafts move a category's p̂ from the pooled
#: 0.92 to 0.96, past the 0.95 above which k=auto drafts on after three sure drafts on llama.cpp on a 2-core Xeon
CATEGORY_WEIGHT = PRIOR_WEIGHT
#: how the previous step ended, the condition of the first token's acceptance estimate
STARTS = ("bonus", "partial", "miss", "skip")


def saving_per_token(units: float, tokens: float) -> float:
    """What drafting saved a token, in units of T(1): `units` saved over `tokens` measured, around the prior
    SAVING_PRIOR worth SAVING_WEIGHT tokens (AutoK.saving, and what saved_summary shows of a saved memory)."""
    return (SAVING_PRIOR * SAVING_WEIGHT + units) / (SAVING_WEIGHT + tokens)


@dataclass(frozen=True)
class StepTiming:
    """What the loop measured of the previous decode step (seconds), for the policy's cost estimates."""

    n_verified: int  # tokens in the target forward (k + 1)
    t_verify_s: float
    t_draft_s: float
    draft_forwards: int
    t_wall_s: float
    emitted: int


def prior_acceptance(q: float) -> float:
    """The prior of a draft's acceptance given its confidence q: q ** PRIOR_GAMMA (q^0.7). The target is the larger
    model of the draft's family and agrees with a draft's best guess more often than the draft's own probability says.
    PRIOR_GAMMA is the maximum-likelihood fit of q^γ to 665 verdicts on the Qwen pair (int8 0.5B draft, fp32 1.5B
    target, k=8, greedy) over the 16 Spec-Bench prompts that the 8-prompt k=auto runs leave out: drafts of confidence
    0.5–0.6 were kept 65 %, 0.7–0.8 83 %, 0.8–0.9 86 %, 0.9–1 99 % (resources/bench/README.md, "k=auto on all 24
    Spec-Bench prompts"). With q itself as the prior one early rejection of a q = 0.87 draft put its bin at 0.73 and
    kept proposals short for the rest of that answer; √q over-drafted (27 drafts to keep 15)."""
    return max(0.0, min(1.0, q)) ** PRIOR_GAMMA


class Calibration:
    """Maps a score in [0, 1] (the draft's probability of its token) to an acceptance probability: BINS equal bins
    with Beta counts around a prior mean (:func:`prior_acceptance` of the bin's centre, `weight` pseudo-observations)."""

    BINS = 10

    def __init__(self, weight: float = PRIOR_WEIGHT) -> None:
        self.acc = [weight * prior_acceptance((i + 0.5) / self.BINS) for i in range(self.BINS)]
        self.n = [weight] * self.BINS

    @classmethod
    def bin(cls, q: float) -> int:
        return min(cls.BINS - 1, max(0, int(q * cls.BINS)))

    def __call__(self, q: float) -> float:
        b = self.bin(q)
        return self.acc[b] / self.n[b]

    def update(self, q: float, accepted: bool) -> None:
        b = self.bin(q)
        self.acc[b] += 1.0 if accepted else 0.0
        self.n[b] += 1.0


class Acceptance:
    """Acceptance estimates from the target's verdicts, for tokens not yet drafted (Beta counts around a prior).

    `first[start]`: P(the first draft of a step is accepted | how the previous step ended, one of STARTS); after a
    step that drafted nothing ("skip") the estimate over all steps (`pooled`) is used: a skip says nothing about the
    text, and learning "drafts after a skip fail" from the few probes of a bad stretch kept k=auto skipping for many
    steps after the text had become easy;
    `after[bin]`: P(a draft is accepted | the draft before it was accepted with confidence in that bin);
    `first_q[bin]`: how often a step's first draft had its confidence in that bin (what drafting one token to look at
    its confidence is likely to show: :meth:`AutoK.worth_a_look`);
    `opening`: P(the draft of the answer's first token is accepted) — the opening step's own position
    (:meth:`AutoK.ended`), whatever the draft's confidence.

    `first` and `after` are also learnt per category of prompt (`by_category`: the verdicts of answers whose prompt
    had that category, counted beside the pooled ones, no prior of their own): where the answer's prompt has a
    category (:attr:`category`, set by :meth:`AutoK.begin_answer`), an estimate is the category's counts around the
    pooled estimate worth CATEGORY_WEIGHT verdicts. How long a run of confident drafts lasts is a property of the
    text: on llama.cpp's Qwen pair (fixed lanes of all 24 Spec-Bench prompts) a draft after one of confidence ≥ 0.9
    was kept 0.97 of the time on coding and 0.99 on editing prompts, 0.84–0.86 on QA, summaries and translations —
    and at the pooled 0.92 k=auto stopped every coding proposal at 3 drafts, where the fixed `k=24,cstop=0.5` kept
    43 of 44 drafts in proposals of 4–15 on code-1 (resources/bench/README.md, "k=auto's acceptance by category").
    """

    def __init__(self, prior: float = 0.7, weight: float = PRIOR_WEIGHT) -> None:
        self.weight = weight
        self.first = {s: [prior * weight, weight] for s in STARTS if s != "skip"}  # after a skip: `pooled`
        self.pooled = [prior * weight, weight]
        bins = Calibration.BINS
        self.after = [[weight * prior_acceptance((i + 0.5) / bins), weight] for i in range(bins)]
        self.first_q = [FIRST_Q_PRIOR / bins] * bins  # prior: every confidence alike, worth one first draft
        self.opening = [OPENING_PRIOR * weight, weight]  # the answer's first token (AutoK.ended)
        self.category = ""  # the answer's prompt's category ("" where none: the pooled estimates alone)
        self.by_category: dict[str, dict] = {}  # per category, counts without a prior: {first, pooled, after}

    @staticmethod
    def empty_counts() -> dict:
        """A category's counts before its first verdict: {first: {start: [hits, n]}, pooled: [hits, n], after: per bin}."""
        return dict(first={s: [0.0, 0.0] for s in STARTS if s != "skip"}, pooled=[0.0, 0.0],
                    after=[[0.0, 0.0] for _ in range(Calibration.BINS)])

    def begin(self, category: str) -> None:
        """An answer whose prompt has this category starts (\"\" where none is known): its estimates from now on."""
        self.category = category
        if category:
            self.by_category.setdefault(category, self.empty_counts())

    def _own(self) -> dict | None:
        return self.by_category.get(self.category) if self.category else None

    @staticmethod
    def _around(pooled: list[float], own: list[float] | None) -> float:
        """A category's estimate: its own counts around the pooled mean worth CATEGORY_WEIGHT verdicts."""
        m = pooled[0] / pooled[1]
        return m if own is None else (own[0] + CATEGORY_WEIGHT * m) / (own[1] + CATEGORY_WEIGHT)

    @staticmethod
    def _mean(c: list[float]) -> float:
        return c[0] / c[1]

    def _first(self, start: str) -> list[float]:
        return self.pooled if start == "skip" else self.first[start]

    @staticmethod
    def _first_of(counts: dict, start: str) -> list[float]:
        return counts["pooled"] if start == "skip" else counts["first"][start]

    def p_first(self, start: str) -> float:
        own = self._own()
        return self._around(self._first(start), None if own is None else self._first_of(own, start))

    def _count_first(self, start: str, hit: float) -> None:
        """One (possibly soft) verdict on a step's first draft: under how the previous step ended, and pooled — over
        every answer, and over the answers of this one's category."""
        own = self._own()
        for counts in (dict(first=self.first, pooled=self.pooled), *(() if own is None else (own,))):
            for c in (counts["pooled"],) if start == "skip" else (counts["first"][start], counts["pooled"]):
                c[0] += hit
                c[1] += 1.0

    @property
    def p_opening(self) -> float:
        """P(the draft of an answer's first token is accepted), whatever its confidence (AutoK.ended)."""
        return self._mean(self.opening)

    def p_after(self, q: float) -> float:
        b = Calibration.bin(q)
        own = self._own()
        return self._around(self.after[b], None if own is None else own["after"][b])

    def verdict(self, start: str, qs: list[float], drafted: int, accepted: int, opening: bool = False) -> None:
        """Fold one step's verdict: its first draft (if any) under `start` — unless the step is the answer's opening
        (:meth:`AutoK.ended`) — then each tested draft after an accepted one under the previous draft's confidence
        bin."""
        if drafted <= 0:
            return
        if opening:
            self.opening[0] += 1.0 if accepted >= 1 else 0.0
            self.opening[1] += 1.0
        else:
            self._count_first(start, 1.0 if accepted >= 1 else 0.0)
        own = self._own()
        for i in range(1, min(drafted, accepted + 1)):
            if i - 1 < len(qs):
                b = Calibration.bin(qs[i - 1])
                for c in (self.after[b], *(() if own is None else (own["after"][b],))):
                    c[0] += 1.0 if i < accepted else 0.0
                    c[1] += 1.0

    def saw_first(self, q: float) -> None:
        """A step's first draft was made with confidence q (kept or not)."""
        self.first_q[Calibration.bin(q)] += 1.0

    def judged(self, start: str, p: float) -> None:
        """The first draft of a step was dropped unverified (the policy kept none of its drafts): no verdict, but its
        calibrated acceptance `p` is evidence (a soft count), or a lane that drafts and drops every step would never
        learn that its first drafts do not pay."""
        self._count_first(start, p)

    def relax(self, start: str, to: float = _OPTIMISTIC) -> None:
        """Move the first-token estimate after `start` a step back toward optimism (a lane that stopped drafting on
        bad luck probes again later, at the cost of one short draft)."""
        own = self._own()
        for c in (self._first(start), *(() if own is None else (self._first_of(own, start),))):
            c[0] += _RELAX * (to * c[1] - c[0])


def _verify_units(price: StepPrice, n: int) -> np.ndarray:
    """V(1) … V(n) of `price` as an array (read-only; computed once per verify curve)."""
    return _verify_array(price.verify, max(n, AUTO_K_MAX + 2))[:n]


@lru_cache(maxsize=16)
def _verify_array(verify: tuple[float, ...], n: int) -> np.ndarray:
    a = np.array([verify_at(verify, k) for k in range(1, n + 1)])
    a.flags.writeable = False
    return a


def scaled_verify(curve: tuple[float, ...], factor: float) -> tuple[float, ...]:
    """A verify curve V(1 …) with V(n ≥ 2) times `factor` (AutoK.verify_factor), V(1) kept: what k=auto pays, and what
    the Costs tab draws beside the profile's."""
    return curve if factor == 1.0 else (curve[0], *(v * factor for v in curve[1:]))


def _verify_factor(vf: list[float]) -> float:
    """The verify factor of the sums [Σ clipped log-ratio, n] (AutoK.verify_factor): exp of their mean around a prior
    of 0 worth VERIFY_PRIOR observations, rounded to 0.005."""
    return round(math.exp(vf[0] / (vf[1] + VERIFY_PRIOR)) * 200.0) / 200.0


def _first_best(values: np.ndarray) -> tuple[float, int]:
    """The largest value and its index — the first of those within 1e-12 of it (ties keep fewer drafts)."""
    best, arg = -math.inf, 0
    for j, v in enumerate(values.tolist()):
        if v > best + 1e-12:
            best, arg = v, j
    return best, arg


class AutoK:
    """The cost model and decision rule shared by every k=auto drafter (costs in units of T(1): StepPrice).

    Args:
        target: the target's cost profile (V(n)).
        draft_s: seconds of one draft forward (the draft's profile T(1)); 0 for lookup drafters.
        k_max: the most drafts per step.
        p_prior: the first estimate of a draft's acceptance.
        draft: the draft model's own profile, when it has one: its T(1) over the target's is c until steps measure
            it; a draft that has fallen behind (steps without drafting) first catches up over several tokens, which
            costs more than one forward.
    """

    def __init__(self, target: CostProfile, draft_s: float | None = None, k_max: int = AUTO_K_MAX, p_prior: float = 0.7,
                 draft: CostProfile | None = None) -> None:
        self.profile = target
        self.draft_profile = draft
        d_s = draft_s if draft_s is not None else draft.t1_s if draft is not None else 0.0
        self._profile_verify = target.curve()  # V(n) as the profile says; the price's own is scaled (verify_factor)
        self.price = StepPrice(self._profile_verify, c=d_s / target.t1_s)
        self.k_max = k_max
        self.acceptance = Acceptance(p_prior)
        self.start = "skip"  # how the previous step ended (STARTS)
        self.sec_per_unit = target.t1_s  # seconds of one unit lately (only to print times in explanations)
        self._tok = 0.0  # decayed sums for the achieved rate (tokens per modelled unit)
        self._units = 0.0
        self._all_tok = 0.0  # the same over every answer so far, decayed per answer (begin_answer)
        self._all_units = 0.0
        self.last_why = ""
        self.answers = 0  # lanes (answers) whose verdicts this state holds: counted when a lane ends
        self._decode_price: StepPrice | None = None  # the decode steps' price while step 0's is in force (riding_on_the_prompt)
        self.shift = 0.0  # this answer's shift of the acceptance estimates, in log-odds (local)
        self._shift_h = 1.0 / ANSWER_SHIFT_VAR  # its precision: the prior's plus this answer's verdicts'
        self._saved = 0.0  # units saved against the baseline's price, and tokens emitted, by steps after the draft
        self._saved_tok = 0.0  # had read the context (count_saving), decayed per answer (begin_answer)
        self._saved_by: dict[str, list[float]] = {}  # the same sums [units, tokens] per category, decayed per answer of it
        self._vf = [0.0, 0.0]  # Σ log(verify over the profile's) of wider verifies and their count, decayed (verify_factor)
        self._t1_s: float | None = None  # the one-token forward lately (seconds), from plain decode steps — of this answer
        self._since_t1 = 0  # or the last ones (a lane that drafts from its first step has none), and the steps since

    # --- costs (units of T(1)) ----------------------------------------------------------------------------
    def t(self, n: int) -> float:
        """Units of a target forward over n tokens: V(n)."""
        return self.price.v(n)

    @property
    def d(self) -> float:
        """Units of one draft forward: c."""
        return self.price.c

    @property
    def base_rate(self) -> float:
        """Tokens per unit of plain decoding (one token per step)."""
        return 1.0 / self.price.base_units

    @property
    def rate(self) -> float:
        """λ: the rate a step must beat — what the lane achieved lately, at least the baseline's."""
        achieved = self._tok / self._units if self._units > 0 else 0.0
        return max(self.base_rate, achieved)

    def observe(self, s: StepTiming | None) -> None:
        """Fold the previous decode step's measured times into c, o and the achieved rate — each as a ratio to the
        step's own verify time over V(n), so that a uniformly slower machine changes none of them."""
        if s is None:
            return
        self._learn_verify(s)
        v = self.price.v(s.n_verified)
        if s.t_verify_s <= 0 or v <= 0:
            return
        unit = s.t_verify_s / v  # seconds of one unit in this step
        self.sec_per_unit += _EMA * (unit - self.sec_per_unit)
        c, o = self.price.c, self.price.o
        if s.draft_forwards and s.t_draft_s > 0:
            c += _EMA * (min(3.0 * max(c, 1e-3), s.t_draft_s / s.draft_forwards / unit) - c)
        if s.t_wall_s > 0:
            other = max(0.0, s.t_wall_s - s.t_verify_s - s.t_draft_s) / unit
            o += _EMA * (min(other, 5.0) - o)
        self.price = replace(self.price, c=c, o=o, o_base=o)
        units = v + s.draft_forwards * c + o
        self._tok = _RATE_DECAY * self._tok + s.emitted
        self._units = _RATE_DECAY * self._units + units
        self._all_tok += s.emitted
        self._all_units += units

    @property
    def verify_factor(self) -> float:
        """What this lane's verifies of n ≥ 2 tokens cost over the target's profile: the price's V(n) is the profile's
        times this (V(1) stays 1). Learnt from the lane's own steps (:meth:`observe`), each wider verify's time over
        the one-token forward of a plain decode step a few steps before it (VERIFY_FRESH) — a ratio of two times
        measured moments apart, so that a uniformly slower machine changes nothing — as the mean of the clipped
        log-ratios around a prior of 1 worth VERIFY_PRIOR steps; rounded to 0.005, so that the verify arrays the
        decisions read are cached (:func:`_verify_units`)."""
        return _verify_factor(self._vf)

    def _learn_verify(self, s: StepTiming) -> None:
        if s.t_verify_s <= 0:
            return
        if s.n_verified == 1 and s.draft_forwards == 0:  # a plain decode step: the lane's T(1) now
            self._t1_s, self._since_t1 = s.t_verify_s, 0
            return
        self._since_t1 += 1
        v = verify_at(self._profile_verify, s.n_verified)
        if s.n_verified < 2 or self._t1_s is None or self._since_t1 > VERIFY_FRESH or v <= 0:
            return
        x = min(VERIFY_CLIP, max(-VERIFY_CLIP, math.log(s.t_verify_s / self._t1_s / v)))
        self._vf = [VERIFY_DECAY * self._vf[0] + x, VERIFY_DECAY * self._vf[1] + 1.0]
        self._scale_verify()

    def _scale_verify(self) -> None:
        """The price's verify curve: the profile's, V(n ≥ 2) times verify_factor."""
        curve = scaled_verify(self._profile_verify, self.verify_factor)
        if curve != self.price.verify:
            self.price = replace(self.price, verify=curve)

    def count_saving(self, s: StepTiming | None) -> None:
        """Fold a decode step made after the draft had read the context into what drafting saves a token: its tokens at
        the baseline's price (1 + o each) less what the step took — verify, drafting (catching up included) and the
        rest — both in units of the step's own verify time over V(n), so that a uniformly slower machine changes
        nothing. A step that drafted nothing saves about 0; one whose drafts were all rejected, less than 0."""
        if s is None:
            return
        v = self.price.v(s.n_verified)
        if s.t_verify_s <= 0 or v <= 0:
            return
        took = max(v, s.t_wall_s * v / s.t_verify_s)
        saved = s.emitted * self.price.base_units - took
        self._saved += saved
        self._saved_tok += s.emitted
        if self.category:
            by = self._saved_by.setdefault(self.category, [0.0, 0.0])  # begin_answer made it; a state made otherwise
            by[0] += saved
            by[1] += s.emitted

    @property
    def category(self) -> str:
        """The category of this answer's prompt (begin_answer; the acceptance estimates keep it), "" where none is known."""
        return self.acceptance.category

    @property
    def saving(self) -> float:
        """Units of T(1) drafting saved a token lately, once the draft had read the context (count_saving), around the
        prior SAVING_PRIOR worth SAVING_WEIGHT tokens: on prompts of this answer's category where it has one
        (:meth:`saving_of`), else on every prompt."""
        return self.saving_of(self.category)

    def saving_of(self, category: str = "") -> float:
        """What drafting saved a token lately on prompts of `category` (each from the prior: a category not met yet is
        read, once, to learn it), or on every prompt (""). What drafting saves differs by category far more than
        from answer to answer within one: on llama.cpp on a 2-core Xeon the best fixed setting made 1.09–1.23x the
        baseline on two of three coding prompts and 0.79–0.86x on every translation prompt, where one saving pooled
        over all of them kept every coding prompt unread after a probe on a QA prompt (resources/bench/README.md,
        "k=auto's saving by category")."""
        if category:
            return saving_per_token(*self._saved_by.get(category, (0.0, 0.0)))
        return saving_per_token(self._saved, self._saved_tok)

    def worth_reading(self, n: int, tokens_left: int) -> bool:
        """Whether the draft should read the n tokens of context it has not read now, to draft in this and later steps —
        the prompt, before its first draft of an answer, or the tokens emitted while steps drafted nothing: what
        drafting saves a token lately (saving) over the tokens left must repay the reading (catch_up_units over the n
        tokens). A draft without a cost profile, whose reading cannot be priced, reads."""
        read = self.catch_up_units(n)
        return read <= 0 or self.saving * max(0, tokens_left) > read

    def begin_answer(self, category: str = "") -> None:
        """A new answer starts: λ starts from the rate over the earlier answers (worth START_UNITS), not from the
        last one's last steps — a rate learnt on easy text (4.2 tokens per unit after two editing answers) kept a
        summary's opening from drafting, and the first steps of a hard answer (a translation's) from drafting the
        unsure tokens that pay there (resources/bench/README.md, "k=auto's λ at an answer's start"). The answer's
        own shift of the acceptance estimates (:meth:`local`) starts at 0. `category`: the prompt's (a suite's or a
        prompts file's), whose own saving decides whether the draft reads it (:meth:`saving_of`); "" where none."""
        self.shift, self._shift_h = 0.0, 1.0 / ANSWER_SHIFT_VAR
        self._saved *= SAVING_DECAY
        self._saved_tok *= SAVING_DECAY
        self.acceptance.begin(category)  # and its own acceptance estimates (Acceptance.by_category)
        if category:  # met: kept with the memory even before a step measures anything of it
            by = self._saved_by.setdefault(category, [0.0, 0.0])
            by[0] *= SAVING_DECAY
            by[1] *= SAVING_DECAY
        self._all_tok *= _ANSWER_DECAY
        self._all_units *= _ANSWER_DECAY
        if self._all_units > 0:
            self._tok, self._units = self._all_tok / self._all_units * START_UNITS, START_UNITS

    # --- decisions --------------------------------------------------------------------------------------
    def _gains(self, cum: list[float], lam: float) -> np.ndarray:
        """Value of keeping the first j drafts (without sunk drafting), j = 0 … i: Σ_{l≤j} P_l − λ·V(j + 1)."""
        return np.concatenate(([0.0], np.cumsum(np.asarray(cum, dtype=float)))) - lam * _verify_units(self.price, len(cum) + 1)

    def best_k(self, cum: list[float], p_next: float | None = None, k_cap: int | None = None) -> int:
        """How many of the drafted tokens to verify, given P_1 … P_i: with `p_next` (p̂, the acceptance expected of the
        draft after the last one) valued over two steps (:meth:`stop_value`, the next step drafting at most `k_cap`,
        default k_max); without it (a lookup drafter, which proposes no confidences) by this step's gain alone."""
        if p_next is not None:
            return self.stop_value(cum, p_next, self.k_max if k_cap is None else k_cap)[1]
        return _first_best(self._gains(cum, self.rate))[1]

    def next_step_excess(self, conds: list[float], lam: float) -> float:
        """S⁺: how much more than an average step (whose tokens − λ·units is 0 at the rate λ) a next step is worth whose
        drafts would be kept with these conditional probabilities — 1 + max_m [Σ_{l≤m} Q_l − λ·(V(m + 1) + m·c + o)],
        Q_l the product of the first l — never below 0 (the next step need not draft them). Priced as a decode step
        even while step 0's price is in force."""
        return float(self._excesses(np.asarray(conds, dtype=float).reshape(1, -1), lam)[0])

    def _excesses(self, tails: np.ndarray, lam: float) -> np.ndarray:
        """next_step_excess of each row of `tails` (conditional acceptances, one next step per row), vectorised: in pure
        Python a 32-draft step's decisions took about as long as a GPU's decode step (resources/bench/README.md, "Two
        steps ahead")."""
        price = self._decode_price or self.price
        m = tails.shape[1]
        best = np.full(tails.shape[0], -lam * price.v(1))
        if m:
            have = np.cumsum(np.cumprod(tails, axis=1), axis=1)
            cost = _verify_units(price, m + 1)[1:] + np.arange(1, m + 1) * price.c
            best = np.maximum(best, (have - lam * cost).max(axis=1))
        return np.maximum(0.0, 1.0 - lam * price.o + best)

    def stop_value(self, cum: list[float], p_next: float, k_cap: int, lam: float | None = None) -> tuple[float, int]:
        """The value of drafting no more, and the best number of drafts to keep: max over j of this step's gain with j
        drafts plus P_{j+1} times the next step's excess (:meth:`next_step_excess`) when it drafts on after the target's
        token — the drafts j + 2 … i already made (their conditionals from `cum`) and then tokens at `p_next`, at most
        `k_cap`. Ties keep fewer drafts."""
        lam = self.rate if lam is None else lam
        i = len(cum)
        c = np.asarray(cum, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):  # after a draft kept with probability 0: 0
            conds = np.nan_to_num(c / np.concatenate(([1.0], c[:-1])), nan=0.0, posinf=0.0) if i else c
        # row j: the conditionals of drafts j + 2, j + 3, … (index j + 1 + l), then p_next
        idx = np.arange(i + 1)[:, None] + 1 + np.arange(k_cap)[None, :]
        tails = np.where(idx < i, conds[np.minimum(idx, max(i - 1, 0))] if i else 0.0, p_next)
        reach = np.append(c, (c[-1] if i else 1.0) * p_next)  # P_{j+1}
        return _first_best(self._gains(cum, lam) + reach * self._excesses(tails, lam))

    def catch_up_units(self, feed: int) -> float:
        """Extra units of a draft forward over `feed` tokens (catching up) beyond a one-token forward."""
        if feed <= 1 or self.draft_profile is None:
            return 0.0
        dp = self.draft_profile
        return self.price.c * (dp.t(feed) - dp.t1_s) / dp.t1_s

    def local(self, p: float) -> float:
        """An acceptance estimate learnt over many answers, shifted to this answer: logit(p) + shift."""
        if self.shift == 0.0:
            return p
        p = min(max(p, 1e-6), 1.0 - 1e-6)
        return 1.0 / (1.0 + math.exp(-(math.log(p / (1.0 - p)) + self.shift)))

    def answer_verdict(self, p: float, kept: bool) -> None:
        """One verdict of this answer on a draft the policy expected to be kept with probability `p` (already shifted):
        one Newton step of the shift's log-posterior — a Gaussian prior of variance ANSWER_SHIFT_VAR around 0, a
        Bernoulli likelihood per verdict — so that a few verdicts move it a little and a run of them a lot."""
        self._shift_h += p * (1.0 - p)
        self.shift += ((1.0 if kept else 0.0) - p) / self._shift_h

    def p_next(self, q_last: float | None) -> float:
        """Acceptance expected of the next draft, not yet drafted: after the draft with confidence `q_last`, or — at
        the start of a step (None) — after how the previous step ended; shifted to this answer (:meth:`local`)."""
        return self.local(self.acceptance.p_first(self.start) if q_last is None else self.acceptance.p_after(q_last))

    def worth_drafting_more(self, cum: list[float], k_cap: int, p_next: float | None = None, extra: float = 0.0) -> bool:
        """Whether drafting (at least) one more token can beat drafting no more, both valued over two steps: some
        m ≥ 1 with Σ_{l≤i} P_l + Σ_{l=1..m} P_i·p̂^l − λ·(V(i + m + 1) + m·c + extra) + P_i·p̂^(m+1)·S⁺(p̂) > the value
        of stopping now (:meth:`stop_value`; S⁺(p̂): the excess of a next step drafting at p̂, :meth:`next_step_excess`)
        (extra: units of a draft catching up over several tokens first; p̂: `p_next`, default the estimate at the
        start of a step)."""
        i = len(cum)
        if i >= k_cap:
            return False
        lam = self.rate
        p = self.p_next(None) if p_next is None else p_next
        stop_value = self.stop_value(cum, p, k_cap, lam)[0]
        excess = self.next_step_excess([p] * k_cap, lam)
        m = np.arange(1, k_cap - i + 1)
        last = (cum[-1] if cum else 1.0) * p ** m  # P_{i+m}
        cost = _verify_units(self.price, k_cap + 1)[i + 1:] + m * self.d + extra  # V(i + m + 1) + m·c + extra
        value = sum(cum) + np.cumsum(last) - lam * cost + last * p * excess
        return bool((value > stop_value + 1e-12).any())

    def worth_a_look(self, cal: Calibration, k_cap: int, extra: float = 0.0) -> bool:
        """Whether drafting one token only to see its confidence pays, when drafting blind does not
        (:meth:`worth_drafting_more` said no): the look costs a draft forward (c, plus `extra` to catch up) and buys
        the choice between drafting nothing and the best continuation from that first draft's confidence q —

            E_q[max(0, max_m Σ_{l≤m} P_l − λ·(V(m + 1) − V(1) + (m − 1)·c))] > λ·(c + extra),

        P_1 = cal(q), P_{l+1} = P_l·p_after(q), q distributed as the lane's first drafts were (`first_q`). A cheap
        draft with often-confident first drafts looks every step (the look is dropped unverified when its q says no);
        an expensive one, or one whose first drafts are mostly unsure, does not."""
        if k_cap <= 0:
            return False
        lam = self.rate
        counts = np.asarray(self.acceptance.first_q, dtype=float)
        total = counts.sum()
        if total <= 0:
            return False
        # one row per confidence bin (its centre q), one column per m, vectorised: it runs before every step that
        # drafts nothing, and as a Python loop over 10 bins × 32 drafts it took 0.21 ms of the 0.7 ms k=auto spent on
        # each 52 ms llama.cpp decode step where it drafted nothing (0.06 ms now, and 0.59 ms a step in all:
        # resources/bench/README.md, "On an AVX2 machine")
        qs = [(b + 0.5) / Calibration.BINS for b in range(Calibration.BINS)]
        p1 = np.array([self.local(cal(q)) for q in qs])
        p_hat = np.array([self.local(self.acceptance.p_after(q)) for q in qs])
        m = np.arange(1, k_cap + 1)
        have = np.cumsum(p1[:, None] * p_hat[:, None] ** (m - 1)[None, :], axis=1)  # Σ_{l≤m} P_l per bin
        v = _verify_units(self.price, k_cap + 1)
        cost = v[1:] - v[0] + (m - 1) * self.d  # V(m + 1) − V(1) + (m − 1)·c
        best = np.maximum(0.0, (have - lam * cost[None, :]).max(axis=1))
        return float((counts / total) @ best) > lam * (self.d + extra) + 1e-12

    @contextmanager
    def riding_on_the_prompt(self, on: bool = True):
        """Within: price drafts verified by the prompt's own forward (step 0). That forward is paid anyway; each draft
        appended to it costs the curve's last slope (a forward over many tokens grows by about that per token), so
        V(j + 1) reads 1 + slope·j."""
        if not on:
            yield
            return
        saved = self.price
        v = saved.verify
        n = len(v)
        slope = max(0.0, (v[-1] - v[max(0, n - 9)]) / max(1, min(8, n - 1))) if n > 1 else 0.0
        self.price = replace(saved, verify=tuple(1.0 + slope * j for j in range(max(n, 2))))
        self._decode_price = saved  # the next step is a decode step (next_step_excess)
        try:
            yield
        finally:
            self.price, self._decode_price = saved, None

    def can_ever_pay(self, k_cap: int) -> bool:
        """Whether drafting could beat plain decoding even if every draft were accepted."""
        return self.worth_drafting_more([], k_cap, p_next=1.0)

    def ended(self, drafted: int, accepted: int, qs: list[float] | None = None, dropped: float | None = None,
              opening: bool = False) -> None:
        """A step ended: fold its verdict into the acceptance estimates and remember how it ended (`dropped`: the
        calibrated acceptance of a first draft made and then not verified).

        `opening`: the step was step 0, whose first draft is the answer's first token — a position of its own, where a
        draft and its target differ in how they begin an answer far more than later: on 24 Spec-Bench prompts (the
        Qwen pair, greedy) 14 of 24 opening drafts were kept and 2 of 4 of confidence ≥ 0.8, against 164 of 206 and
        111 of 116 for later steps' first drafts. Its first verdict teaches neither the first-draft estimates nor
        (the drafter's part) the calibration, and the step after it starts as after a skip: one rejected opening had
        kept proposals short for the rest of an answer. It teaches the opening's own estimate (`Acceptance.opening`),
        which is the first draft's acceptance in the next answer's opening, whatever its confidence: with the later
        steps' calibration, a q = 0.87 opening drafted 10 tokens on the prompt's forward and lost them all, and a
        q = 0.27 one (sum-1, where 13 drafts in a row were kept) was not drafted on; of those 24 openings 3 of 6 were kept
        at q ≥ 0.7 and 4 of 8 below 0.5."""
        self.acceptance.verdict(self.start, list(qs or []), drafted, accepted, opening=opening)
        if drafted <= 0 and dropped is not None and not opening:
            self.acceptance.judged(self.start, dropped)
        self.start = "skip" if opening or drafted <= 0 else "bonus" if accepted >= drafted else "partial" if accepted else "miss"

    def skipped(self) -> None:
        """A step drafted nothing: the estimate after a skip drifts back toward optimism, so that a lane that stopped
        drafting on bad luck probes again later (bounded cost: one short draft)."""
        self.acceptance.relax("skip")
        self.start = "skip"

    def explain(self, cum: list[float], k: int, forwards: int | None = None) -> str:
        """One line for the step's tooltip: what was predicted for the chosen k against drafting nothing."""
        sec = self.sec_per_unit
        u_k = self.price.units(k, len(cum) if forwards is None else forwards)
        e_k = expected_tokens(cum, k)
        u_0 = self.price.base_units
        why = (f"k=auto chose {k} of {len(cum)} drafted: expect {e_k:.2f} tokens in {u_k * sec * 1e3:.0f} ms "
               f"({e_k / (u_k * sec):.1f} tok/s) vs 1 in {u_0 * sec * 1e3:.0f} ms ({1 / (u_0 * sec):.1f} tok/s) without drafting; "
               f"verify V({k + 1}) {self.t(k + 1):.2f}x one token, a draft c {self.d:.2f}")
        if k > 0 and abs(self.verify_factor - 1.0) >= 0.03:
            why += f" (verifies cost {self.verify_factor:.2f}x the profile's in this lane)"
        if cum:
            why += "; P(all accepted) " + " ".join(f"{p:.2f}" for p in cum[: min(len(cum), 8)]) + (" …" if len(cum) > 8 else "")
        if abs(self.shift) >= 0.1:
            why += (f"; this answer's drafts kept {'less' if self.shift < 0 else 'more'} often than learnt "
                    f"(odds ×{math.exp(self.shift):.2f})")
        self.last_why = why
        return why


# --- what k=auto learnt, carried from lane to lane ------------------------------------------------------------------
_LEARNT: dict[tuple, tuple[AutoK, Calibration]] = {}


def recall(key: tuple) -> tuple[AutoK, Calibration] | None:
    """A copy of what the last lane of this (target, draft) pair learnt in this process — costs, the calibration of
    the draft's confidence, the acceptance estimates, the achieved rate — to start from (None: nothing yet). A lane
    of a 48-token answer has ~10 steps: starting each prompt from the priors again would spend them re-learning."""
    got = _LEARNT.get(key)
    if got is None:
        return None
    auto, cal = copy.deepcopy(got)
    auto.start = "skip"
    return auto, cal


def remember(key: tuple, auto: AutoK, cal: Calibration) -> None:
    """Keep this lane's policy state as the pair's latest (the next lane of the pair copies it)."""
    _LEARNT[key] = (auto, cal)


def forget(key: tuple) -> None:
    """Drop what lanes of this key learnt (the next lane starts from the priors)."""
    _LEARNT.pop(key, None)


# --- what k=auto learnt, saved between runs -------------------------------------------------------------------------
#: the most a saved estimate is worth when a run starts from it, in verdicts (each Beta count scaled down to it, its
#: mean kept): the saved state replaces the priors, but a new kind of text still moves it within a few answers
SAVED_CAP = 100.0
_SAVED_VERSION = 1


def saved_dir() -> Path | None:
    """Where what k=auto learnt is saved: $SPECDECK_KAUTO_MEMORY (a folder, or `off`: neither saved nor read), else
    the `kauto` folder beside the cost profiles (app.core.costs.profiles_dir)."""
    v = os.environ.get("SPECDECK_KAUTO_MEMORY", "")
    if v.strip().lower() == "off":
        return None
    return Path(v) if v else profiles_dir() / "kauto"


def _saved_path(key: tuple) -> Path | None:
    d = saved_dir()
    if d is None:
        return None
    return d / (hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:20] + ".json")


def save_learnt(key: tuple, auto: AutoK, cal: Calibration) -> Path | None:
    """Write what a lane of the pair `key` learnt — the calibration, the acceptance estimates, the costs c and o, the
    achieved rate, how many answers taught it — atomically; returns the path, or None when it is not saved (turned
    off, or the folder cannot be written: never an error, the next run then starts from the priors)."""
    path = _saved_path(key)
    if path is None:
        return None
    a = auto.acceptance
    doc = dict(version=_SAVED_VERSION, key=list(key), saved=time.strftime("%Y-%m-%d %H:%M", time.localtime()), answers=auto.answers,
               calibration=dict(acc=cal.acc, n=cal.n),
               acceptance=dict(first=a.first, pooled=a.pooled, after=a.after, first_q=a.first_q, opening=a.opening,
                               by_category=a.by_category),
               costs=dict(c=auto.price.c, o=auto.price.o, o_base=auto.price.o_base),
               rate=dict(tokens=auto._tok, units=auto._units, all_tokens=auto._all_tok, all_units=auto._all_units),
               saving=dict(units=auto._saved, tokens=auto._saved_tok, by_category={c: list(v) for c, v in auto._saved_by.items()},
                           policy=SAVING_POLICY),
               verify=dict(log_sum=auto._vf[0], n=auto._vf[1]))
    return write_json_atomically(path, doc)


def _read_saved(key: tuple) -> tuple[Path, dict] | None:
    """The saved file of the pair `key` and its JSON object, or None: the memory off, nothing saved, a file that cannot
    be read or parsed, or one of another version or key (what load_learnt and saved_summary then ignore)."""
    path = _saved_path(key)
    if path is None:
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("version") != _SAVED_VERSION or d.get("key") != json.loads(json.dumps(list(key))):
        return None
    return path, d


def _saving_sums(units: float, tokens: float) -> tuple[float, float]:
    """A measured saving's sums (units, tokens), worth at most SAVING_CAP tokens with its mean kept. Raises ValueError
    where they are not a saving's."""
    units, tokens = float(units), float(tokens)
    if not (math.isfinite(units) and math.isfinite(tokens) and tokens >= 0):
        raise ValueError(f"bad saving {units!r}, {tokens!r}")
    return (units * SAVING_CAP / tokens, SAVING_CAP) if tokens > SAVING_CAP else (units, tokens)


def _of_this_policy(d: dict) -> bool:
    """Whether a saved memory's savings measured this rule's steps (SAVING_POLICY; files without the field: revision 1).
    Raises ValueError where the `saving` object is damaged."""
    sv = d.get("saving", {})
    if not isinstance(sv, dict):
        raise ValueError(f"bad saving {sv!r}")
    return sv.get("policy", 1) == SAVING_POLICY


def _saved_saving(d: dict) -> tuple[float, float]:
    """The measured saving (units, tokens) of a saved memory, worth at most SAVING_CAP tokens with its mean kept; (0, 0)
    in files from before it was saved, or where it measured another rule's steps (SAVING_POLICY). Raises ValueError
    (or TypeError, AttributeError) where it is damaged."""
    sv = d.get("saving", {})
    sums = _saving_sums(sv.get("units", 0.0), sv.get("tokens", 0.0))
    return sums if _of_this_policy(d) else (0.0, 0.0)


def _saved_saving_by(d: dict) -> dict[str, tuple[float, float]]:
    """The measured saving per category {category: (units, tokens)} of a saved memory, each worth at most SAVING_CAP
    tokens; {} in files from before it was saved, or where it measured another rule's steps. Raises ValueError (or
    TypeError, AttributeError) where it is damaged."""
    by = d.get("saving", {}).get("by_category", {})
    if not isinstance(by, dict):
        raise ValueError(f"bad saving by category {by!r}")
    out = {}
    for c, v in by.items():
        units, tokens = v
        out[str(c)] = _saving_sums(units, tokens)
    return out if _of_this_policy(d) else {}


def _saved_verify(d: dict) -> list[float]:
    """The verify factor's sums [Σ log-ratio, n] of a saved memory, worth at most VERIFY_SAVED_CAP observations with
    their mean kept; [0, 0] (the profile as it is) in files from before it was saved. Raises ValueError (or TypeError,
    AttributeError) where it is damaged."""
    vf = d.get("verify", {})
    total, n = float(vf.get("log_sum", 0.0)), float(vf.get("n", 0.0))
    if not (math.isfinite(total) and math.isfinite(n) and n >= 0 and abs(total) <= VERIFY_CLIP * n + 1e-9):
        raise ValueError(f"bad verify {vf!r}")
    return [total * VERIFY_SAVED_CAP / n, VERIFY_SAVED_CAP] if n > VERIFY_SAVED_CAP else [total, n]


def _capped(c: list[float], cap: float) -> list[float]:
    """A Beta count [hits, n] worth at most `cap` verdicts, its mean kept."""
    hits, n = float(c[0]), float(c[1])
    if not (math.isfinite(n) and n > 0 and 0 <= hits <= n):
        raise ValueError(f"bad count {c!r}")
    return [hits * cap / n, cap] if n > cap else [hits, n]


def _counts(c: list[float], cap: float) -> list[float]:
    """Counts [hits, n] without a prior (a category's own, n may be 0), worth at most `cap` verdicts, the mean kept."""
    hits, n = float(c[0]), float(c[1])
    if n == 0 and hits == 0:
        return [0.0, 0.0]
    return _capped([hits, n], cap)


def _saved_acceptance_by(acc: dict) -> dict[str, dict]:
    """The acceptance counts per category of a saved memory (Acceptance.by_category), each worth at most SAVED_CAP
    verdicts; {} in files from before they were saved. Raises ValueError (or KeyError, TypeError, AttributeError)
    where they are damaged."""
    by = acc.get("by_category", {})
    if not isinstance(by, dict):
        raise ValueError(f"bad acceptance by category {by!r}")
    out = {}
    for cat, c in by.items():
        first = {s: _counts(c["first"][s], SAVED_CAP) for s in STARTS if s != "skip"}
        after = [_counts(x, SAVED_CAP) for x in c["after"]]
        if len(after) != Calibration.BINS:
            raise ValueError(f"bad acceptance of category {cat!r}")
        out[str(cat)] = dict(first=first, pooled=_counts(c["pooled"], SAVED_CAP), after=after)
    return out


def load_learnt(key: tuple, auto: AutoK, cal: Calibration) -> str | None:
    """Start `auto` and `cal` (fresh, made from the pair's cost profiles) from what was saved for `key`, each estimate
    worth at most SAVED_CAP verdicts; returns a line for the lane's notes, or None (nothing saved, turned off, or a
    file of another version, key or shape: ignored, the priors stay)."""
    if (got := _read_saved(key)) is None:
        return None
    path, d = got
    try:
        bins = Calibration.BINS
        cal_pairs = [_capped([h, n], SAVED_CAP) for h, n in zip(d["calibration"]["acc"], d["calibration"]["n"], strict=True)]
        acc = d["acceptance"]
        first = {s: _capped(acc["first"][s], SAVED_CAP) for s in auto.acceptance.first}
        after = [_capped(c, SAVED_CAP) for c in acc["after"]]
        first_q = [float(x) for x in acc["first_q"]]
        if len(cal_pairs) != bins or len(after) != bins or len(first_q) != bins or min(first_q) < 0:
            return None
        scale = min(1.0, SAVED_CAP / sum(first_q)) if sum(first_q) > 0 else 1.0
        pooled, opening = _capped(acc["pooled"], SAVED_CAP), _capped(acc["opening"], SAVED_CAP)
        acc_by = _saved_acceptance_by(acc)
        costs, rate = d["costs"], d["rate"]
        c, o, o_base = (float(costs[x]) for x in ("c", "o", "o_base"))
        tok, units = float(rate["tokens"]), float(rate["units"])
        all_tok, all_units = float(rate.get("all_tokens", 0.0)), float(rate.get("all_units", 0.0))  # absent from older files: 0
        saved_units, saved_tok = _saved_saving(d)
        saved_by = _saved_saving_by(d)
        vf = _saved_verify(d)
        answers, saved = int(d.get("answers", 0)), str(d.get("saved", "?"))
        if not all(math.isfinite(x) and x >= 0 for x in (c, o, o_base, tok, units, all_tok, all_units, *first_q)):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    cal.acc, cal.n = [h for h, _ in cal_pairs], [n for _, n in cal_pairs]
    a = auto.acceptance
    a.first, a.pooled, a.after, a.first_q, a.opening = first, pooled, after, [x * scale for x in first_q], opening
    a.by_category = acc_by
    a.begin(a.category)  # a category already begun keeps its entry
    auto.price = replace(auto.price, c=c, o=o, o_base=o_base)
    auto._tok, auto._units, auto._all_tok, auto._all_units, auto.answers = tok, units, all_tok, all_units, answers
    auto._saved, auto._saved_tok = saved_units, saved_tok
    auto._saved_by = {c: list(v) for c, v in saved_by.items()}
    auto._vf = vf
    auto._scale_verify()
    return (f"k=auto started from what it learnt of this pair on this machine over {answers} earlier answer(s) (saved {saved}, "
            f"{path}); SPECDECK_KAUTO_MEMORY=off starts it from its priors")


def saved_summary(key: tuple) -> dict | None:
    """What is saved for the pair `key`, for `profile` to show: {path, answers, saved, kept, saving, saving_by_category,
    verify, sure_next, sure_next_by_category} — `kept`: the calibrated share of drafts the target kept per confidence
    band ("q<0.5", "0.5-0.9", "q>=0.9"), the saved counts with their priors; `saving`: what drafting saved a token, in
    decode steps, with its prior (AutoK.saving: a prompt is read into the draft only where that repays the reading),
    over every prompt, and `saving_by_category` {category: (saving, tokens measured)} on the prompts of each category
    met (AutoK.saving_of);
    `verify`: what the pair's verifies of several tokens cost over the target's profile (AutoK.verify_factor);
    `sure_next`: how often a draft after one of confidence ≥ 0.9 was kept, and `sure_next_by_category` {category:
    (estimate, verdicts of its own)} (Acceptance.by_category, sure_words); None where nothing readable is saved (or
    the memory is off)."""
    if (got := _read_saved(key)) is None:
        return None
    path, d = got
    try:
        acc, n = d["calibration"]["acc"], d["calibration"]["n"]
        bands = {"q<0.5": range(0, 5), "0.5-0.9": range(5, 9), "q>=0.9": range(9, Calibration.BINS)}
        kept = {b: sum(acc[i] for i in r) / sum(n[i] for i in r) for b, r in bands.items()}
        saving = saving_per_token(*_saved_saving(d))  # as a run would start from it
        by = {c: (saving_per_token(u, t), t) for c, (u, t) in sorted(_saved_saving_by(d).items())}
        verify = _verify_factor(_saved_verify(d))  # as a run would start from it
        top = Calibration.BINS - 1
        sure = _capped(d["acceptance"]["after"][top], SAVED_CAP)
        sure_by = {c: (Acceptance._around(sure, v["after"][top]), v["after"][top][1])
                   for c, v in sorted(_saved_acceptance_by(d["acceptance"]).items()) if v["after"][top][1] > 0}
        return dict(path=str(path), answers=int(d.get("answers", 0)), saved=str(d.get("saved", "?")), kept=kept, saving=saving,
                    saving_by_category=by, verify=verify, sure_next=sure[0] / sure[1], sure_next_by_category=sure_by)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError, IndexError, AttributeError):
        return None


def saving_words(summary: dict) -> str:
    """What a saved memory says drafting saved (saved_summary): "drafting saved 0.05 of a decode step a token", then
    per category where steps measured it, "(by category: coding 0.12, qa -0.20)" — the words `profile` and the Costs
    tab show."""
    words = f"drafting saved {summary['saving']:.2f} of a decode step a token"
    by = {c: v for c, v in (summary.get("saving_by_category") or {}).items() if v[1] > 0}  # categories measured
    if by:
        words += " (by category: " + ", ".join(f"{c} {s:.2f}" for c, (s, _) in by.items()) + ")"
    return words


def sure_words(summary: dict) -> str:
    """What a saved memory says of runs of confident drafts (saved_summary): "after a draft of confidence ≥ 0.9 the next
    was kept 0.92 of the time", then per category where verdicts measured it, "(by category: coding 0.97, qa 0.84)" —
    what decides how long k=auto's proposals run (Acceptance.by_category)."""
    words = f"after a draft of confidence ≥ 0.9 the next was kept {summary['sure_next']:.2f} of the time"
    by = summary.get("sure_next_by_category") or {}
    if by:
        words += " (by category: " + ", ".join(f"{c} {p:.2f}" for c, (p, _) in by.items()) + ")"
    return words


def forget_saved(key: tuple) -> Path | None:
    """Delete what is saved for the pair `key` (its next lane starts from the priors); the path removed, or None."""
    path = _saved_path(key)
    if path is None or not path.exists():
        return None
    path.unlink()
    return path
