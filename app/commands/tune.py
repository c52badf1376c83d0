"""`python -m app tune`: which decoding setup is fastest here — a setup finder.

1. **Calibration** (about half of the time budget left after loading): the baseline and one calibration lane per
   drafter (a draft model at each precision tried, n-gram lookup, ReDrafter heads trained for the target) run paced
   (app.worker.scheduler: every lane of a prompt spans the same stretch of time), prompt by prompt, categories in
   turn. Each calibration lane drafts long (k = CAL_K, cumulative stop CAL_CSTOP) and records every step's draft
   confidences and the target's verdict; a head's verifies every beam tree up to CAL_BEAMS × CAL_DEPTH at once, and
   (kind `tree`) a draft's dynamic-tree lane every dynamic tree up to DYN_NODES × DYN_DEPTH × DYN_BRANCH, each node
   tagged with the trees that hold it (app.core.tuning).
2. **Pricing**: every fixed setup of a grid (drafter × precision × k × stop / cstop; static token trees of each
   draft, from the ranks its chain recorded where the target corrected it; dynamic trees × nodes × depth × branch;
   lookup × k; head × beams × depth × cstop) is priced from those records
   with the target's cost profile — per prompt, per category and overall — and each draft model's `k=auto` by
   replaying the policy itself over the records (app.speculative.replay). No model runs in this phase.
3. **Confirmation** (the rest of the budget): the best few, each category's winner and `k=auto` on the best model
   drafter run for real, paced with the baseline, on the calibrated prompts (as many as the budget allows; on
   fewer than CONFIRM_RUNS, round after round until each setup has run CONFIRM_RUNS times, at most CONFIRM_ROUNDS),
   with each ReDrafter head's best priced tree (kind `redrafter`) and each draft's best dynamic tree (kind `tree`).

Output: a ranked table — predicted and measured tokens/s and speedup, α, τ, one sentence on why each wins or
loses — the winner per category, the break-even line (what α a drafter of a given cost needs to beat the baseline
and the winner here, what V(k + 1) the winner's α would need), and what was not tried. `--json` writes all of it;
the window's Run ▸ Find the fastest setup runs this command and turns the winners into lanes.

Progress lines on stderr: ``tune [ 42%] calibration: prompt 3 of 6 (code-2)`` (the GUI reads them). Ctrl-C (or
SIGTERM) stops between prompts' steps and reports what was measured so far; exit 130 then, 2 on a user error.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.errors import SetupError

__all__ = ["add_parser", "run", "render", "predicted_cell", "partial_note", "verify_note", "speed_note", "baseline_speed", "measured_only_why", "calibration_failures", "heads_for", "tied_with_winner", "headline", "category_figures", "KINDS", "PRICED_KINDS"]

#: drafter kinds `--kinds` accepts, all priced: chains of drafts, lookups, token trees (static ones from the draft's
#: chain calibration, dynamic ones from their own lane), ReDrafter heads trained for the target (from their own lanes)
KINDS = ("draft", "ngram", "tree", "redrafter")
PRICED_KINDS = KINDS
#: the most ReDrafter heads calibrated (those with the best held-out acceptance)
MAX_HEADS = 2
#: share of the budget the calibration may take (the rest confirms)
CALIBRATION_SHARE = 0.5
#: a drafter whose best priced setup is below DROP_BELOW of another's after DROP_AFTER prompts is calibrated no more
DROP_AFTER = 2
DROP_BELOW = 0.85
#: the confirmation runs its prompts again, round after round while the budget allows, until each confirmed setup has
#: run CONFIRM_RUNS times (at most CONFIRM_ROUNDS rounds; six prompts or more: one round): one run of the two palindrome
#: and rename prompts measured the first one's lanes 17–39 % slower than the grid's bench of the same setups minutes
#: later, and three of five predictions 11–15 % high against it. Three rounds measured those lanes as the bench did;
#: the predictions were then 17–22 % high against a baseline that ran 10 % faster than in the bench, which more runs
#: do not average away (resources/bench/README.md, "On an AVX2 machine"): the baseline ran its last 40 steps alone,
#: after the lanes it is divided by. Paced (app.worker.scheduler), they were within 9 % ("Paced lanes")
CONFIRM_RUNS = 6
CONFIRM_ROUNDS = 3
#: the report says so (:func:`speed_note`) when the baseline's wall on the confirmed prompts moved by more than this
#: between the calibration and the confirmation: the predictions were priced at one speed of the machine and measured
#: at another (on 8 Spec-Bench prompts, 2 cores: 24 % slower in the confirmation, and every confirmed speedup came out
#: 4–13 % above its prediction: resources/bench/README.md, "Paced lanes")
SPEED_NOTE = 0.05


def add_parser(sub) -> None:
    from app.core.prompts import list_suites

    t = sub.add_parser("tune", help="find the fastest decoding setup for a target on this machine (calibrate, price a grid, confirm)")
    t.add_argument("--target", required=True, help="engine name (see `engines`)")
    t.add_argument("--draft", action="append", metavar="ENGINE", help="draft model engine, repeatable (default: the engines "
                   "sharing the target's tokenizer and backend that are smaller than it)")
    t.add_argument("--kinds", default="draft,ngram,tree", help=f"drafter kinds to try, comma-separated, of {', '.join(KINDS)} "
                   "(default draft,ngram,tree: static token trees are priced from the draft's chain calibration, dynamic ones from a "
                   "calibration lane of their own; redrafter: the heads trained for the target, beams × depth × cstop priced from "
                   "their own calibration)")
    t.add_argument("--dtypes", default=None, help="draft precisions to try for PyTorch drafts (default int8 and the draft's own)")
    t.add_argument("--suite", help="built-in suite: " + ", ".join(list_suites()) + " (default specbench)")
    t.add_argument("--prompts", help="JSONL file with id, prompt[, category]")
    t.add_argument("--prompt", action="append", help="prompt text (repeatable)")
    t.add_argument("--minutes", type=float, default=15.0, help="time budget, calibration and confirmation together (default 15)")
    t.add_argument("--confirm", type=int, default=3, help="the best N priced setups confirmed by a real run (default 3), besides "
                   "each category's winner and k=auto")
    t.add_argument("--calibrate-all", action="store_true", help=f"calibrate every drafter on every prompt (default: a drafter "
                   f"whose best setup is priced below {DROP_BELOW:g} of another's after {DROP_AFTER} prompts is calibrated no more)")
    t.add_argument("--max-new-tokens", type=int, default=64)
    t.add_argument("--temperature", type=float, default=0.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    t.add_argument("--json", metavar="PATH", help="write the finder's report to PATH (- for stdout, then no table)")
    t.add_argument("--quiet", action="store_true", help="no progress")
    t.set_defaults(func=run)


# --- what to try ---------------------------------------------------------------------------------------------
def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise SetupError(f"unknown drafter kind {', '.join(bad) or '(none)'} in --kinds", fix=f"use a comma-separated list of {', '.join(KINDS)}")
    return kinds


def default_drafts(target_manifest) -> list[str]:
    """Engines that can draft for the target: same tokenizer tag and backend, smaller weights, smallest first."""
    from app.engines.registry import list_manifests

    tag = target_manifest.extra.get("tokenizer")
    if not tag:
        return []
    size = target_manifest.size or 0
    out = [m for m in list_manifests() if m.name != target_manifest.name and m.backend == target_manifest.backend
           and m.extra.get("tokenizer") == tag and (not size or (m.size or 0) < size)]
    return [m.name for m in sorted(out, key=lambda m: m.size or 0)]


def drafters(target_manifest, drafts: list[str], kinds: tuple[str, ...], dtypes: str | None) -> list[tuple[str, bool]]:
    """(drafter, is a model) for every drafter tried: `draft:<engine>[,dtype=…]` per draft and precision (a chain
    calibration prices its chains and, with kind `tree`, its static trees), `ngram`."""
    from app.engines.registry import resolve

    out: list[tuple[str, bool]] = []
    if "draft" in kinds or "tree" in kinds:
        if not drafts:
            raise SetupError(f"no draft model for {target_manifest.name}: no other engine shares its tokenizer and backend",
                             fix="name one with --draft ENGINE, or try --kinds ngram")
        for d in drafts:
            m = resolve(d)  # an unknown engine is said now, with the known names
            if m.backend != "hf":
                out.append((f"draft:{d}", True))
                continue
            wanted = [x.strip() for x in dtypes.split(",")] if dtypes else (["int8", None] if m.device in ("cpu", "auto") else [None])
            for dt in wanted:
                out.append((f"draft:{d}" + (f",dtype={dt}" if dt and dt != m.dtype else ""), True))
    if "ngram" in kinds:
        out.append(("ngram:n=3", False))
    return list(dict.fromkeys(out))


def heads_for(target_manifest, kinds: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """With kind `redrafter`: the `redrafter:<head>` drafters the finder calibrates and prices — heads trained for
    this target (`train-drafter`), the MAX_HEADS with the best held-out depth-1 acceptance first — and what the report
    says of the kind where none is tried (no hf target, no head trained, more heads than tried)."""
    if "redrafter" not in kinds:
        return [], []
    from app.speculative.redrafter import heads_dir, list_heads

    name = target_manifest.name
    train = f"python -m app train-drafter --target {name} --minutes 10"
    if target_manifest.backend != "hf":
        return [], [f"redrafter: heads draft from the target's hidden states, which only hf (PyTorch) targets give ({name} is "
                    f"{target_manifest.backend})"]

    def first_token(m) -> float:
        chain = (m.training.get("heldout_acceptance") or {}).get("chain") or [0.0]
        return float(chain[0])

    mine = sorted((m for m in list_heads() if m.target == name), key=lambda m: (-first_token(m), m.name))
    if not mine:
        return [], [f"redrafter: no head trained for {name} in {heads_dir()} (train one: {train})"]
    setups = [f"redrafter:{m.name}" for m in mine[:MAX_HEADS]]
    notes = ([f"redrafter: {len(mine) - MAX_HEADS} more head(s) for {name} not tried "
              f"({', '.join(m.name for m in mine[MAX_HEADS:])}; the finder tries the {MAX_HEADS} with the best held-out acceptance)"]
             if len(mine) > MAX_HEADS else [])
    return setups, notes


def is_head(drafter: str) -> bool:
    """A ReDrafter head (`redrafter:<head>`), calibrated and priced by its beam trees."""
    return drafter.startswith("redrafter:")


def is_dynamic(drafter: str) -> bool:
    """A draft's dynamic trees (`tree:<engine>[,dtype=…]`), calibrated and priced together."""
    return drafter.startswith("tree:")


def dynamic_drafter(drafter: str) -> str:
    """`draft:<engine>[,dtype=…]` → `tree:<engine>[,dtype=…]`: the draft's dynamic trees, as a calibration drafter."""
    return "tree:" + drafter.removeprefix("draft:")


def calibration_setup(drafter: str, model: bool) -> str:
    """The setup string of a drafter's calibration lane: long proposals and a low cumulative stop; for a ReDrafter
    head every beam tree up to CAL_BEAMS × CAL_DEPTH at once, for a draft's dynamic trees every one up to DYN_NODES,
    DYN_DEPTH and DYN_BRANCH (`widths=all`)."""
    from app.core.tuning import CAL_BEAMS, CAL_CSTOP, CAL_DEPTH, CAL_K, DYN_BRANCH, DYN_DEPTH, DYN_NODES

    head, _, rest = drafter.partition(",")
    tail = f",{rest}" if rest else ""
    if is_head(drafter):
        return f"{head},beams={CAL_BEAMS},depth={CAL_DEPTH},widths=all{tail}"
    if is_dynamic(drafter):
        return f"{head},nodes={max(DYN_NODES)},depth={DYN_DEPTH},branch={DYN_BRANCH},widths=all{tail}"
    return f"{head},k={CAL_K},cstop={CAL_CSTOP}{tail}" if model else f"{head},k={CAL_K}{tail}"


def auto_setup(drafter: str) -> str:
    head, _, rest = drafter.partition(",")
    return f"{head},k=auto" + (f",{rest}" if rest else "")


def order_prompts(prompts: list) -> list:
    """Categories in turn (the first prompt of each, then the second, …), so that a budget that ends early has
    measured every category it could."""
    by: dict[str, list] = {}
    for p in prompts:
        by.setdefault(p.category or "", []).append(p)
    out: list = []
    for i in range(max((len(v) for v in by.values()), default=0)):
        out.extend(v[i] for v in by.values() if i < len(v))
    return out


# --- the finder ------------------------------------------------------------------------------------------------
@dataclass
class Phase:
    """One phase's lanes, run prompt by prompt on one worker: its plan, what came back, and how far it got."""

    plan: Any
    results: Any
    steps: dict[str, list] = field(default_factory=dict)  # lane id → its StepEvents
    prompts_done: list[str] = field(default_factory=list)
    #: prompt id → how many rounds ran it (the confirmation's repeats: CONFIRM_RUNS)
    runs: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    #: setup index → why its lanes stopped running (a drafter the calibration dropped)
    dropped: dict[int, str] = field(default_factory=dict)


class Finder:
    """Runs the finder's phases on one worker (engines loaded once) and keeps everything measured."""

    def __init__(self, args, quiet: bool) -> None:
        from app.commands.bench import prompts_of
        from app.commands.worker_run import WorkerRun
        from app.core.setups import Sampling
        from app.engines.registry import resolve

        self.args = args
        self.t0 = time.monotonic()
        self.budget_s = max(0.5, float(args.minutes)) * 60.0
        self.target = resolve(args.target)
        self.kinds = _kinds(args.kinds)
        if not (args.prompt or args.prompts or args.suite):
            args.suite = "specbench"
        self.prompts = order_prompts(prompts_of(args))
        drafts = args.draft if args.draft else (default_drafts(self.target) if "draft" in self.kinds else [])
        self.heads, self.head_notes = heads_for(self.target, self.kinds)
        self.drafters = drafters(self.target, drafts, self.kinds, args.dtypes) + [(h, False) for h in self.heads]
        if not self.drafters:
            raise SetupError(f"nothing to price: {'; '.join(self.head_notes) or 'no drafter'}",
                             fix="train a head (python -m app train-drafter), or add kinds: --kinds draft,ngram,tree,redrafter")
        # dynamic trees (kind `tree`): calibrated on their own lane per tree-capable draft (every dynamic tree at once)
        if "tree" in self.kinds:
            self.drafters += [(dynamic_drafter(d), False) for d, m in list(self.drafters) if m and self.tree_capable(d)]
        self.sampling = Sampling(args.temperature, 1.0, 0, args.seed, args.max_new_tokens).validated()
        self.chat = not args.no_chat
        self.w = WorkerRun(quiet)
        self.quiet = quiet
        self.profiles: list = []
        self.calibration: Phase | None = None
        self.confirm: Phase | None = None
        self.stopped = ""

    # --- helpers ----------------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say_progress(self, what: str) -> None:
        if not self.quiet:
            pct = min(100, int(100 * self.elapsed() / self.budget_s))
            print(f"tune [{pct:3d}%] {what}", file=sys.stderr, flush=True)

    def plan(self, setups: list[str], run_id: str, warmup: int):
        from app.worker.plan import RunPlan

        return RunPlan(self.args.target, tuple(setups), tuple(self.prompts), self.sampling, mode="paced", chat=self.chat,
                       warmup_tokens=warmup, run_id=run_id)

    def run_phase(self, phase: Phase, name: str, until_s: float, after_prompt=None) -> None:
        """Run the phase's lanes prompt by prompt (after its warm-up, if any), round after round where the plan repeats,
        while the budget allows: a prompt starts only if the mean prompt so far fits before `until_s` (the first always
        runs). `after_prompt()` runs after each prompt; lanes of the setups in `phase.dropped` are left out from then
        on."""
        from app.core.events import StepEvent

        plan, results = phase.plan, phase.results

        def on_event(ev) -> None:
            results.on_event(ev)
            if isinstance(ev, StepEvent) and not plan.is_warmup(ev.lane_id):
                phase.steps.setdefault(ev.lane_id, []).append(ev)

        warm = plan.warmup_command()
        if warm is not None:
            self.say_progress(f"{name}: warm-up")
            self.w.run(warm, lambda ev: None)
        cmd = plan.command()
        t_start = time.monotonic()
        units = [(r, j, p) for r in range(plan.repeats) for j, p in enumerate(plan.prompts)]
        for i, (r, j, p) in enumerate(units):
            per = (time.monotonic() - t_start) / i if i else 0.0
            if i and self.elapsed() + per > until_s:
                break
            rounds = f"round {r + 1} of {plan.repeats}, " if plan.repeats > 1 else ""
            self.say_progress(f"{name}: {rounds}prompt {j + 1} of {len(plan.prompts)} ({p.id})")
            lanes = tuple(x for x in cmd.lanes
                          if x.prompt_id == p.id and x.repeat == r and plan.setup_index(x.lane_id) not in phase.dropped)
            self.w.run(replace(cmd, run_id=f"{cmd.run_id}-{i}", lanes=lanes), on_event)
            if r == 0:
                phase.prompts_done.append(p.id)
            phase.runs[p.id] = r + 1
            if after_prompt is not None:
                after_prompt()
        phase.wall_s = time.monotonic() - t_start
        results.mark_finished()

    # --- phases -----------------------------------------------------------------------------------------------
    def load(self) -> None:
        from app.core.errors import SpecDeckError

        plan = self.plan(["baseline", *(calibration_setup(d, m) for d, m in self.drafters)], "tune-cal", 8)
        self.say_progress(f"loading {self.target.name} and {len({d for d, m in self.drafters if m})} draft(s); cost profiles")
        ev, self.profiles = self.w.load(plan.load_command())
        if not self.verify_curve():
            raise SpecDeckError(f"no cost profile for {self.target.name}: the finder prices setups with it",
                                fix=f"the target must be an engine our loop drafts on (hf or llamacpp); run `python -m app profile --target {self.target.name}`")
        self._cal_plan = plan

    def target_profile(self):
        """The target's cost profile (None: none loaded)."""
        return next((p for p in self.profiles if p.engine == self.target.name), None)

    def verify_curve(self) -> tuple[float, ...] | None:
        p = self.target_profile()
        return p.curve(40) if p is not None else None

    def calibrate(self) -> None:
        from app.worker.plan import RunResults

        self.calibration = Phase(self._cal_plan, RunResults(self._cal_plan))
        # the share is of the time left after loading: measuring missing cost profiles (once per machine) must not
        # leave the calibration without prompts
        loaded = self.elapsed()
        self.run_phase(self.calibration, "calibration", loaded + max(0.0, self.budget_s - loaded) * CALIBRATION_SHARE,
                       after_prompt=None if self.args.calibrate_all else self.drop_the_outpaced)

    def drop_the_outpaced(self) -> None:
        """After DROP_AFTER prompts, stop calibrating a drafter whose best priced setup is below DROP_BELOW of
        another drafter's best on the same prompts: its lanes' time goes to more prompts for the others. It is
        named in the report's `not_tried` with both figures."""
        ph = self.calibration
        if ph is None or len(ph.prompts_done) < DROP_AFTER:
            return
        records = self.records()
        ids = [r.prompt_id for r in records]
        best = {}
        for p in self.price(records, dropped=False):
            d = p.candidate.drafter
            if d not in best and all(x in p.pred_wall_s for x in ids):
                best[d] = p
        if len(best) < 2:
            return
        lead = max(best.values(), key=lambda p: p.speedup())
        for i, (d, _) in enumerate(self.drafters, start=1):
            p = best.get(d)
            if p is not None and i not in ph.dropped and p.speedup() < DROP_BELOW * lead.speedup():
                ph.dropped[i] = (f"{d}: calibration stopped after {len(ids)} prompts: its best setup priced {p.speedup():.2f}x "
                                 f"against {lead.speedup():.2f}x for {lead.candidate.setup}")
                self.say_progress(f"calibration: dropped {d} (best priced {p.speedup():.2f}x against {lead.speedup():.2f}x)")

    def records(self) -> list:
        """The calibration as app.core.tuning records, one per prompt the baseline and every drafter finished."""
        from app.core.tuning import CAL_CSTOP, CAL_K, DYN_BRANCH, DYN_DEPTH, CalStep, LaneCal, PromptCal

        assert self.calibration is not None
        ph = self.calibration
        stats = ph.results.stats
        out = []
        for p in ph.plan.prompts:
            if p.id not in ph.prompts_done:
                continue
            base = stats.get(ph.plan.lane_id(0, p))
            if base is None or base.decode_steps <= 0:
                continue
            step_s = base.t_verify_s / base.decode_steps
            over = max(0.0, base.wall_s - base.prefill_s - base.t_verify_s - base.t_draft_s) / base.decode_steps
            pc = PromptCal(p.id, p.category, base.new_tokens, base.wall_s, base.prefill_s, step_s, over)
            for i, (d, model) in enumerate(self.drafters, start=1):
                lid = ph.plan.lane_id(i, p)
                st = stats.get(lid)
                if st is None or st.decode_steps <= 0:
                    continue
                steps, step0 = [], None
                for ev in ph.steps.get(lid, []):
                    if is_head(d) or is_dynamic(d):  # every tree at once: the nodes' masks, probabilities and the accepted path
                        t = ev.tree
                        # step 0's draft forwards (a dynamic calibration's: the root's, then each width's levels below it)
                        fw0 = 1 + (DYN_BRANCH - 1) * (min(DYN_DEPTH, pc.new_tokens - 1) - 1) if ev.step == 0 and is_dynamic(d) else 0
                        cs = (CalStep(len(t.ids), ev.accepted_count, t.q, False, ev.t_verify_s, None, t.parents, t.searches, t.path, fw0)
                              if t is not None else CalStep(ev.k, ev.accepted_count, (), False, ev.t_verify_s))
                        n = cs.offered
                    else:
                        q = tuple(ev.draft_probs or ()) if model else ()
                        n = len(ev.drafted_ids)
                        open_end = (not model) or n >= CAL_K or math.prod(q) < CAL_CSTOP
                        cs = CalStep(n, ev.accepted_count, q, open_end, ev.t_verify_s, ev.correction_rank if model else None)
                    if ev.step == 0:
                        step0 = cs if n else None
                    else:
                        steps.append(cs)
                drafts = model or is_head(d) or is_dynamic(d)  # drafting timed apart (a lookup's is part of its overhead)
                per_fw = st.t_draft_s / st.draft_forwards if drafts and st.draft_forwards else 0.0
                drafting = st.t_draft_s if drafts else 0.0
                over_l = max(0.0, st.wall_s - st.prefill_s - st.t_verify_s - drafting) / st.decode_steps
                pc.lanes[d] = LaneCal(tuple(steps), step0, st.prefill_s, per_fw, over_l)
            out.append(pc)
        return out

    def priced_curve(self, records: list) -> tuple[tuple[float, ...], float | None]:
        """The target's verify curve as this run measured it — its profile's, moved width by width to the
        calibration lanes' verify times (app.core.tuning.fitted_curve; the profile as it is where nothing was
        verified) — and the overall ratio quoted for people (None: none to quote)."""
        from app.core.tuning import fitted_curve

        return fitted_curve(records, self.verify_curve() or (1.0,), self.tree_ratio())

    def tree_ratio(self, drafter: str | None = None) -> float:
        """What a token tree's forward costs over a causal one of as many tokens: the target's (or, given a model
        drafter, its draft's) cost profile's tree_ratio; 1 where none was measured."""
        p = self.target_profile() if drafter is None else self.draft_profile(drafter)
        return p.tree_ratio if p is not None and p.tree_ratio else 1.0

    def price(self, records: list, dropped: bool = True) -> list:
        """Every grid candidate priced on the records, ranked; without the drafters the calibration dropped unless
        `dropped` is False."""
        from app.core.tuning import beam_grid, dynamic_grid, grid, price_candidate, rank, tree_grid

        verify, _ = self.priced_curve(records)
        out = set(self.calibration.dropped) if dropped and self.calibration is not None else set()
        target = self.target_profile()
        priced = []
        for i, (d, model) in enumerate(self.drafters, start=1):
            if i in out:
                continue
            if is_head(d):
                cands = beam_grid(d)
            elif is_dynamic(d):
                cands = dynamic_grid(d)
            else:
                cands = grid(d, model) if "draft" in self.kinds or not model else []
                cands += tree_grid(d) if model and "tree" in self.kinds and self.tree_capable(d) else []
            curve = self.draft_curve(d) if model else None
            trees = dict(tree_ratio=self.tree_ratio(), draft_tree_ratio=self.tree_ratio(d) if model else 1.0)
            for cand in cands:
                p = price_candidate(cand, records, verify, curve, **trees)
                if p is not None:
                    priced.append(p)
            if model and "draft" in self.kinds and target is not None:  # k=auto: the policy replayed on the records
                from app.speculative.replay import replay_auto

                dp = self.draft_profile(d)
                # from what earlier runs saved of the pair, as the confirmation's k=auto lane starts (app.lanes.draft)
                p = replay_auto(records, d, auto_setup(d), target, dp, verify, saved=(target.key, dp.key) if dp is not None else None)
                if p is not None:
                    priced.append(p)
        return rank(priced)

    def draft_curve(self, drafter: str) -> tuple[float, ...] | None:
        """A model drafter's own cost curve (its forward over n tokens over one), from its cost profile at the
        precision the drafter runs (None: no profile: the finder then prices a tree's wider draft forwards with the
        target's curve)."""
        p = self.draft_profile(drafter)
        return p.curve(40) if p is not None else None

    def draft_profile(self, drafter: str):
        """A model drafter's cost profile at the precision it runs (None: none loaded)."""
        from app.core.setups import parse_setup
        from app.engines.registry import resolve

        d = parse_setup(drafter)
        mine = [p for p in self.profiles if p.engine == d.engine]
        if not mine:
            return None
        want = d.dtype or resolve(d.engine).dtype
        got = [p for p in mine if p.precision == want] or (mine if len(mine) == 1 else [])
        return got[0] if got else None

    def tree_capable(self, drafter: str) -> bool:
        """Whether the target and this drafter's engine can verify and draft token trees (hf and llamacpp)."""
        from app.core.setups import parse_setup
        from app.engines.registry import resolve

        return self.target.backend in ("hf", "llamacpp") and resolve(parse_setup(drafter).engine).backend in ("hf", "llamacpp")

    def confirm_setups(self, ranked: list) -> list[str]:
        from app.core.tuning import winners

        chosen: list[str] = [p.candidate.setup for p in ranked[: max(0, self.args.confirm)]]
        chosen += [p.candidate.setup for p in winners(ranked).values()]
        # k=auto on the best model drafter, or on the first tried where the calibration dropped every one
        models = [p.candidate.drafter for p in ranked if p.candidate.kind == "draft"] + [d for d, m in self.drafters if m]
        if models:
            chosen.append(auto_setup(models[0]))
        chosen = list(dict.fromkeys(chosen))[:8]
        # each head's and each dynamic-tree calibration's best tree: their pricing is checked where it is shown
        own = [d for d, _ in self.drafters if is_head(d) or is_dynamic(d)]
        chosen += [best.candidate.setup for d in own if (best := next((p for p in ranked if p.candidate.drafter == d), None))]
        return list(dict.fromkeys(chosen))

    def run_confirm(self, setups: list[str]) -> None:
        from app.worker.plan import RunResults

        assert self.calibration is not None
        prompts = tuple(p for p in self.prompts if p.id in self.calibration.prompts_done)
        rounds = max(1, min(CONFIRM_ROUNDS, -(-CONFIRM_RUNS // max(1, len(prompts)))))
        plan = replace(self.plan(["baseline", *setups], "tune-confirm", 0), prompts=prompts, repeats=rounds)
        self.confirm = Phase(plan, RunResults(plan))
        self.run_phase(self.confirm, "confirmation", self.budget_s)


# --- the report --------------------------------------------------------------------------------------------
def _measured(confirm: Phase | None) -> dict[str, dict]:
    """setup → measured speedup, tokens/s, α, τ overall and speedup by category (the bench report's figures)."""
    if confirm is None or not confirm.results.completed():
        return {}
    from app.commands.intervals import walls_by_prompt
    from app.core.report import category_speedups

    doc = confirm.results.report("", "")
    by = category_speedups(doc)
    return {s["setup"]: dict(speedup=s["speedup"], tokens_per_s=s["tokens_per_s"], alpha=s["acceptance_rate"], tau=s["mean_accepted_len"],
                             identical_runs=s["identical_runs"], runs=s["runs"], by_category=by.get(s["setup"], {}),
                             walls=walls_by_prompt(doc, s["setup"]))
            for s in doc["summary"]}


def tied_with_winner(measured: dict[str, dict], winner: str) -> dict[str, dict]:
    """setup → its measured speedup over the winner's, paired prompt by prompt (app.commands.intervals.Interval.to_json), for
    every confirmed setup whose interval contains 1: the confirmation's prompts do not tell it apart from the winner."""
    from app.commands.intervals import ratio_interval

    ref = (measured.get(winner) or {}).get("walls") or {}
    out = {}
    for s, m in measured.items():
        if s in ("baseline", winner) or not m.get("walls"):
            continue
        iv = ratio_interval(ref, m["walls"])
        if iv is not None and iv.contains(1.0):
            out[s] = iv.to_json()
    return out


def calibration_failures(drafters: list[tuple[str, bool]], plan, errors: dict, priced: set[str]) -> list[str]:
    """One line per drafter whose calibration lanes failed (`errors`: lane id → its error, as RunResults keeps them):
    why it did not run at all, or on which prompts it failed — it is then priced on the others only."""
    out = []
    for i, (d, _) in enumerate(drafters, start=1):  # setup 0 is the baseline
        errs = [(k, e) for k, e in errors.items() if k is not None and plan.setup_index(k) == i]
        if not errs:
            continue
        first = errs[0][1].message.splitlines()[0]
        if d not in priced:
            out.append(f"{d} did not run: {first}")
        else:
            ids = ", ".join(p.id for p in plan.prompts if any(plan.lane_id(i, p) == k for k, _ in errs))
            out.append(f"{d}: its calibration failed on {ids} ({first}); priced on the other prompts")
    return out


def measured_only_why(setup: str) -> str:
    """The `why` of a setup the confirmation measured but the finder did not price (k=auto without a cost profile)."""
    return "measured only (not priced)"


def _tokens_per_s(p, tokens: dict[str, int], prompt_ids: list[str]) -> float | None:
    ids = [x for x in prompt_ids if x in p.pred_wall_s]
    wall = sum(p.pred_wall_s[x] for x in ids)
    return sum(tokens[x] for x in ids) / wall if wall > 0 else None


def build_report(f: Finder, records: list, ranked: list, measured: dict[str, dict]) -> dict:
    """The finder's report (JSON-ready): candidates ranked, the winner per category, break-even, what was not tried."""
    from app.core.costs import machine_summary
    from app.core.setups import parse_setup
    from app.core.tuning import DYN_BRANCH, DYN_DEPTH, DYN_NODES, StepPrice, break_even_alpha, verify_gain_text, why, winners
    from app.speculative.drafters import ALTS

    verify, scale = f.priced_curve(records)
    tokens = {r.prompt_id: r.new_tokens for r in records}
    confirmed = {parse_setup(s).label: m for s, m in measured.items()}

    def label(s: str) -> str:
        return parse_setup(s).label

    # the winner's speedup: the best measured where a real run confirmed setups (the real run decides), else predicted
    measured_best = max((m["speedup"] for s, m in confirmed.items() if s != "baseline" and m.get("speedup")), default=None)
    best = measured_best if measured_best is not None else (ranked[0].speedup() if ranked else 1.0)
    on_confirmed = list(f.confirm.prompts_done) if f.confirm is not None else []
    cands = []
    for i, p in enumerate(ranked):
        m = confirmed.get(label(p.candidate.setup))
        cands.append(dict(
            rank=i + 1, setup=label(p.candidate.setup), drafter=p.candidate.drafter, kind=p.candidate.kind, auto=p.candidate.auto, k=p.candidate.k,
            stop=p.candidate.stop, cstop=p.candidate.cstop, shape=list(p.candidate.shape) or None, predicted_speedup=p.speedup(),
            # the prediction on the prompts the confirmation measured (it may have run out of time before all of them)
            predicted_confirmed_speedup=p.speedup(on_confirmed) if m and on_confirmed else None,
            predicted_tokens_per_s=_tokens_per_s(p, tokens, list(p.pred_wall_s)),
            predicted_confirmed_tokens_per_s=_tokens_per_s(p, tokens, on_confirmed) if m and on_confirmed else None,
            predicted_by_category=p.by_category(), alpha=p.alpha, tau=p.tau, mean_k=p.mean_k, c=p.c, overhead=p.o,
            measured=m, why=why(p, verify, best, m["speedup"] if m else None, f.tree_ratio())))
    # anything measured but not priced (k=auto where its drafter had no profile or records)
    extra = [dict(setup=s, measured=m, why=measured_only_why(s)) for s, m in confirmed.items()
             if s != "baseline" and s not in {c["setup"] for c in cands}]
    # the winner: measured where confirmed (the real run decides), else predicted
    scored = [(c["measured"]["speedup"], c["setup"], "measured") for c in cands if c["measured"] and c["measured"].get("speedup")]
    scored += [(e["measured"]["speedup"], e["setup"], "measured") for e in extra if e["measured"].get("speedup")]
    if not scored and cands:
        scored = [(cands[0]["predicted_speedup"], cands[0]["setup"], "predicted")]
    winner = max(scored, default=None)
    tied = tied_with_winner(confirmed, winner[1]) if winner and winner[2] == "measured" else {}
    for c in [*cands, *extra]:
        if (iv := tied.get(c["setup"])) is not None:
            c["why"] = (f"not told apart from the winner on these {iv['units']} prompts ({iv['value']:.2f}x its speedup, "
                        f"{100 * iv['level']:.0f} % interval {iv['lo']:.2f}–{iv['hi']:.2f}) — {c['why']}")
    by_cat: dict[str, dict] = {}
    for cat, p in winners(ranked).items():
        m = confirmed.get(label(p.candidate.setup))
        by_cat[cat] = dict(setup=label(p.candidate.setup), predicted_speedup=p.by_category().get(cat),
                           measured_speedup=(m or {}).get("by_category", {}).get(cat),
                           prompts=sum(1 for c in p.categories.values() if c == cat))
    # break-even: from the records' mean step price (c of the cheapest model drafter, 0 for lookups)
    o_base = sum(r.base_overhead_s / r.base_step_s for r in records) / len(records) if records else 0.0
    lines = []
    beat_w = winner[0] if winner else 1.0
    drafter_costs = sorted({(p.candidate.drafter, round(p.c, 3), round(p.o, 3)) for p in ranked}, key=lambda x: x[1])
    be: list[dict] = []
    for d, c, o in drafter_costs:
        price = StepPrice(tuple(verify), c=c, o=o, o_base=o_base)
        for what, s in (("the baseline", 1.0), (f"the winner ({beat_w:.2f}x)", beat_w))[: 2 if beat_w > 1.0 else 1]:
            a = break_even_alpha(price, s)
            be.append(dict(drafter=d, c=c, beat=what, speedup=s, alpha=a[0] if a else None, k=a[1] if a else None))
            lines.append(f"{d} (c {c:.2f}) needs α ≥ {a[0]:.2f} at k={a[1]} to beat {what}" if a else
                         f"{d} (c {c:.2f}) cannot beat {what} here even if every draft were accepted")
    if winner and ranked:
        wp = next((p for p in ranked if label(p.candidate.setup) == winner[1]), ranked[0])
        if wp.alpha is not None and wp.mean_k > 0:
            lines.append(verify_gain_text(wp, verify, name=label(wp.candidate.setup)))
    cal, conf = f.calibration, f.confirm
    not_tried = list(f.head_notes)
    if cal is not None:  # drafters whose calibration lanes failed (a head for other weights, a broken file)
        not_tried += calibration_failures(f.drafters, cal.plan, cal.results.errors, {d for r in records for d in r.lanes})
    if "tree" in f.kinds:
        not_tried.append(f"static trees wider than {ALTS} at a level (the calibration records the draft's {ALTS} best tokens), "
                         f"dynamic trees of more than {max(DYN_NODES)} nodes, depth {DYN_DEPTH} or branch {DYN_BRANCH}: try them by hand")
    not_tried += list(cal.dropped.values()) if cal is not None else []
    if cal is not None and len(cal.prompts_done) < len(f.prompts):
        not_tried.append(f"{len(f.prompts) - len(cal.prompts_done)} of {len(f.prompts)} prompts not calibrated (time budget)")
    if conf is not None and cal is not None and len(conf.prompts_done) < len(cal.prompts_done):
        not_tried.append(f"confirmed on {len(conf.prompts_done)} of {len(cal.prompts_done)} calibrated prompts (time budget)")
    if conf is None:
        not_tried.append("no setup confirmed by a real run" + (f" ({f.stopped})" if f.stopped else " (time budget)"))
    a = f.args
    return {
        "target": f.target.name,
        "request": {"drafts": list(a.draft or []), "kinds": list(f.kinds), "suite": a.suite, "prompts_file": a.prompts,
                    "prompts_given": len(a.prompt or []), "minutes": float(a.minutes), "max_new_tokens": f.sampling.max_new_tokens},
        "machine": machine_summary(),
        "sampling": {"temperature": f.sampling.temperature, "seed": f.sampling.seed, "max_new_tokens": f.sampling.max_new_tokens},
        "budget_s": f.budget_s,
        "wall_s": round(f.elapsed(), 1),
        "drafters": [d for d, _ in f.drafters],
        "prompts": {"calibrated": list(cal.prompts_done) if cal else [], "confirmed": list(conf.prompts_done) if conf else [],
                    "confirmed_runs": dict(conf.runs) if conf else {}},
        "categories": {p.id: p.category for p in f.prompts},
        "calibration_s": round(cal.wall_s, 1) if cal else None,
        "confirmation_s": round(conf.wall_s, 1) if conf else None,
        "verify_curve": list(verify[:33]),
        "profile_verify_curve": list((f.verify_curve() or (1.0,))[:33]),
        "verify_scale": scale,
        "baseline_speed": baseline_speed(records, confirmed, dict(conf.runs) if conf else {}),
        "candidates": cands,
        "priced": len(cands),
        "other_measured": extra,
        "winner": {"setup": winner[1], "speedup": winner[0], "by": winner[2], "tied": tied} if winner else None,
        "winners_by_category": by_cat,
        "break_even": be,
        "break_even_text": lines,
        "not_tried": not_tried,
        "stopped": f.stopped or None,
    }


def baseline_speed(records: list, measured: dict[str, dict], runs: dict[str, int]) -> dict | None:
    """The baseline's wall in the calibration and in the confirmation, summed over the prompts both ran (the
    confirmation's a mean over its rounds, `runs`: prompt → rounds), and their ratio (> 1: slower in the
    confirmation); None without a measured baseline."""
    walls = (measured.get("baseline") or {}).get("walls") or {}
    cal = {r.prompt_id: r.base_wall_s for r in records}
    ids = [p for p in walls if p in cal and runs.get(p)]
    a, b = sum(cal[p] for p in ids), sum(walls[p] / runs[p] for p in ids)
    return dict(prompts=len(ids), calibration_s=a, confirmation_s=b, ratio=b / a) if ids and a > 0 and b > 0 else None


def speed_note(doc: dict) -> str:
    """One line when the machine ran at another speed in the confirmation than in the calibration (the baseline's wall
    moved by more than SPEED_NOTE): the predictions and the measurements then compare two speeds of the machine, and
    a speedup moves with it. "" otherwise."""
    b = doc.get("baseline_speed")
    if not b or abs(b["ratio"] - 1.0) <= SPEED_NOTE:
        return ""
    how = "slower" if b["ratio"] > 1.0 else "faster"
    return (f"machine speed: the baseline ran {100 * abs(b['ratio'] - 1.0):.0f} % {how} in the confirmation than in the calibration "
            f"on the same {b['prompts']} prompt(s) ({b['confirmation_s']:.1f} s against {b['calibration_s']:.1f} s): the predictions "
            f"were priced at the calibration's speed, and a speedup moves with the machine's speed")


def verify_note(doc: dict) -> str:
    """One line on how this run's verifies compared with the target's cost profile ("" when not measured)."""
    s, prof, used = doc.get("verify_scale"), doc.get("profile_verify_curve") or [], doc.get("verify_curve") or []
    if len(prof) < 9 or len(used) < 9 or used == prof:
        return ""
    at = ", ".join(f"V({n}) {prof[n - 1]:.2f} → {used[n - 1]:.2f}" for n in (2, 5, 9, 17, 25) if n <= min(len(prof), len(used)))
    if s is None:  # no one ratio to quote (verifies that read cheaper than one forward in sum, or a profile below 1)
        return f"verify cost: this run's verifies moved the cost profile's curve ({at}); every setup was priced with this run's curve"
    return (f"verify cost: this run's verifies cost {s:.2f}x what the cost profile says above one forward ({at}); "
            f"every setup was priced with this run's curve")


def predicted_cell(c: dict, partial: bool, what: str = "speedup") -> str:
    """A candidate's predicted speedup (`what`="speedup") or tokens/s ("tokens_per_s") as the table shows it: where
    the confirmation measured it on fewer prompts than were calibrated, the prediction on those same prompts, marked
    `*` (beside a measurement, the prediction over all prompts would read as an error it is not)."""
    fmt, unit = ("{:.2f}", "x") if what == "speedup" else ("{:.1f}", "")
    x = c.get(f"predicted_confirmed_{what}") if partial and c.get("measured") else None
    if isinstance(x, (int, float)) and math.isfinite(x):
        return fmt.format(x) + unit + "*"
    y = c.get(f"predicted_{what}")
    return fmt.format(y) + unit if isinstance(y, (int, float)) and math.isfinite(y) else "–"


def confirm_rounds(doc: dict) -> str:
    """" × N runs" where the confirmation ran its prompts more than once (every prompt alike), " × 1–N runs" where
    the budget stopped a round part-way; "" for one run each (reports from before CONFIRM_RUNS have no counts)."""
    runs = sorted(set((doc["prompts"].get("confirmed_runs") or {}).values()))
    if not runs or runs == [1]:
        return ""
    return f" × {runs[0]} runs" if len(runs) == 1 else f" × {runs[0]}–{runs[-1]} runs"


def partial_note(doc: dict) -> str:
    """The footnote of the table's `*` cells ("" where the confirmation measured every calibrated prompt)."""
    conf, cal = len(doc["prompts"]["confirmed"]), len(doc["prompts"]["calibrated"])
    return f"* predicted on the {conf} prompts the confirmation measured (the ranking is on all {cal} calibrated)" if conf < cal else ""


def headline(doc: dict) -> list[str]:
    """The winner, and the confirmed setups its confirmation cannot tell apart from it (paired by prompt)."""
    wn = doc.get("winner")
    if not wn:
        return ["no setup beat the baseline here"]
    out = [f"fastest here: {wn['setup']} — {wn['speedup']:.2f}x the baseline ({wn['by']})"]
    if wn.get("tied"):
        iv0 = next(iter(wn["tied"].values()))
        out.append(f"  as fast as far as its {iv0['units']} confirmed prompts tell (paired by prompt, {100 * iv0['level']:.0f} % interval of "
                   "the ratio of speedups): " + ", ".join(f"{s} {iv['value']:.2f}x ({iv['lo']:.2f}–{iv['hi']:.2f})" for s, iv in wn["tied"].items()))
    return out


def category_figures(x: dict) -> str:
    """A category winner's figures: predicted and measured speedup, and on how many prompts — a winner of one prompt
    is that prompt's, and its prediction as far off as one answer's luck (Spec-Bench's editing prompt: 2.28x
    predicted, 1.99x measured, where the finder's predictions over 7 prompts were within 6 %)."""
    ms = f", measured {x['measured_speedup']:.2f}x" if x.get("measured_speedup") else ""
    n = x.get("prompts")
    on = f" on {n} prompt{'s' if n != 1 else ''}" if n else ""
    sp = x.get("predicted_speedup")
    return f"predicted {sp:.2f}x{ms}{on}" if isinstance(sp, (int, float)) else f"predicted –{ms}{on}"


def render(doc: dict, top: int = 12) -> str:
    """The report as text: the ranked table (the confirmed setups and the best priced ones), winners, break-even."""
    lines = [f"Setup finder: {doc['target']} on {doc['machine']}",
             f"calibrated on {len(doc['prompts']['calibrated'])} prompts in {doc['calibration_s'] or 0:.0f} s; priced {doc['priced']} setups; "
             f"confirmed on {len(doc['prompts']['confirmed'])} prompts{confirm_rounds(doc)} in {doc['confirmation_s'] or 0:.0f} s; "
             f"total {doc['wall_s']:.0f} s", ""]
    shown = [c for c in doc["candidates"] if c["measured"]] + [c for c in doc["candidates"][:top] if not c["measured"]]
    shown.sort(key=lambda c: c["rank"])
    w = max([len(c["setup"]) for c in shown] + [len(e["setup"]) for e in doc["other_measured"]] + [5])
    lines.append(f"{'rank':>4}  {'setup':<{w}}  {'pred tok/s':>10} {'pred x':>7}  {'meas tok/s':>10} {'meas x':>7}  {'α':>5} {'τ':>5}  why")

    def num(x, f="{:.2f}"):
        return f.format(x) if isinstance(x, (int, float)) and x is not None and math.isfinite(x) else "–"

    partial = len(doc["prompts"]["confirmed"]) < len(doc["prompts"]["calibrated"])
    winner = (doc.get("winner") or {}).get("setup")
    for c in shown:
        m = c["measured"] or {}
        rank = ("►" if c["setup"] == winner else "") + str(c["rank"])  # ranked by prediction; ► the winner, measured
        lines.append(f"{rank:>4}  {c['setup']:<{w}}  {predicted_cell(c, partial, 'tokens_per_s'):>10} {predicted_cell(c, partial):>7}  "
                     f"{num(m.get('tokens_per_s'), '{:.1f}'):>10} {(num(m.get('speedup')) + 'x') if m else '–':>7}  "
                     f"{num(c['alpha']):>5} {num(c['tau']):>5}  {c['why']}")
    for e in doc["other_measured"]:
        m = e["measured"]
        lines.append(f"{'►' if e['setup'] == winner else '':>4}  {e['setup']:<{w}}  {'':>10} {'':>7}  {num(m.get('tokens_per_s'), '{:.1f}'):>10} {num(m.get('speedup')) + 'x':>7}  "
                     f"{num(m.get('alpha')):>5} {num(m.get('tau')):>5}  {e.get('why') or measured_only_why(e['setup'])}")
    if any(c["measured"] for c in shown) and partial_note(doc):
        lines.append(partial_note(doc))
    if winner and any(x["setup"] == winner for x in [*shown, *doc["other_measured"]]):
        lines.append("► the winner, the fastest measured (the table ranks by predicted speedup)")
    if doc["winner"]:
        lines += ["", *headline(doc)]
    if doc["winners_by_category"]:
        lines.append("winner per category:")
        for cat, x in doc["winners_by_category"].items():
            lines.append(f"  {cat or '(none)':<14} {x['setup']}  {category_figures(x)}")
    lines += [note for note in (verify_note(doc), speed_note(doc)) if note]
    if doc["break_even_text"]:
        lines.append("break-even on this machine:")
        lines += [f"  {t}" for t in doc["break_even_text"]]
    if doc["not_tried"]:
        lines.append("not tried:")
        lines += [f"  {t}" for t in doc["not_tried"]]
    if doc.get("stopped"):
        lines.append(f"stopped: {doc['stopped']}")
    return "\n".join(lines)


def run(args) -> int:
    from app.commands.worker_run import Stuck, stop_signals
    from app.core.errors import WorkerDiedError
    from app.core.report import check_writable, write_json

    if args.json and args.json != "-":
        check_writable(args.json)
    f = Finder(args, args.quiet)
    records: list = []
    ranked: list = []
    rc = 0
    try:
        with stop_signals(f.w, signal.SIGINT, signal.SIGTERM):
            try:
                f.load()
                f.calibrate()
                records = f.records()
                if not records:
                    raise SetupError("the calibration finished no prompt", fix="raise --minutes or lower --max-new-tokens")
                ranked = f.price(records)
                f.say_progress(f"priced {len(ranked)} setups on {len(records)} prompts; confirming the best")
                if f.elapsed() < f.budget_s:
                    f.run_confirm(f.confirm_setups(ranked))
            except KeyboardInterrupt:
                f.stopped, rc = "stopped by the user", 130
            except (WorkerDiedError, Stuck) as e:
                f.stopped, rc = str(e), 2
    finally:
        f.w.close()
    if not ranked and f.calibration is not None and f.calibration.prompts_done:
        records = f.records()
        ranked = f.price(records) if records else []
    if not ranked:
        print(f"error: nothing to report ({f.stopped or 'no prompt calibrated'})", file=sys.stderr)
        return rc or 2
    f.say_progress("done")
    doc = build_report(f, records, ranked, _measured(f.confirm))
    if args.json == "-":
        print(json.dumps(doc, indent=1, ensure_ascii=False))
    else:
        print(render(doc))
        if args.json:
            write_json(doc, args.json)
    return rc
