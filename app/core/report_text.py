"""A run's report as text: the aligned tables `python -m app bench` prints (per setup, per prompt category, the
verify-cost profiles) and the stall and CPU-wait warnings. Pure functions of the report's JSON document
(app.core.report) or its stats, for the commands and the GUI alike; standard library only."""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.core.metrics import cpu_wait_share

__all__ = ["format_table", "render_summary", "render_categories", "render_profiles", "stall_warnings", "cpu_wait_warnings", "CPU_WAIT_WARN", "CPU_WAIT_WARN_LANE",
           "PROFILE_COLUMNS"]

#: a setup whose lanes waited for a CPU this share of their time (the worker's threads' run-queue delay) is flagged
CPU_WAIT_WARN = 0.05
#: one lane's wait for a CPU over its wall above which the bench names it (above what quiet runs show: resources/bench/README.md, "How sure")
CPU_WAIT_WARN_LANE = 0.12


def _fmt(x, spec: str = ".2f", none: str = "–") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return format(x, spec)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    """A plain aligned text table: each column as wide as its widest cell; the columns in `left` (default the first)
    left-aligned, the rest right-aligned; no trailing spaces (a long last column pushes nothing else right)."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]
    lefts = {i % len(headers) for i in left}

    def line(cells) -> str:
        return "  ".join(str(c).ljust(w) if i in lefts else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=False))).rstrip()

    last = len(headers) - 1
    rule = "  ".join("-" * (len(str(headers[i])) if i == last and i in lefts else w) for i, w in enumerate(widths))
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def stall_warnings(runs) -> list[str]:
    """One line per lane whose clock includes a stall (the worker stopped or starved mid-step)."""
    return [
        f"{r.setup} on {r.prompt_id} (repeat {r.repeat}): {r.stall_s:.1f} s of its {r.wall_s:.1f} s were a stall (the worker "
        "was stopped or starved of CPU); speedups involving it are not trustworthy: rerun on a quiet machine"
        for r in runs
        if r.stall_s > 0
    ]


def cpu_wait_warnings(runs) -> list[str]:
    """One line per setup whose lanes waited for a CPU for CPU_WAIT_WARN of their time or more (LaneStats.cpu_wait_s:
    other processes took the worker's cores, so its tokens/s reads low); else, one naming the setup's lanes that
    waited CPU_WAIT_WARN_LANE of their own time or more — a few busy seconds are diluted in a setup's total, and skew
    the prompts they fell on."""
    by: dict[str, list] = {}
    for r in runs:
        by.setdefault(r.setup, []).append(r)
    out = []
    for setup, rs in by.items():
        share = cpu_wait_share(rs)
        if share is not None and share >= CPU_WAIT_WARN:
            out.append(f"{setup}: the worker's threads waited for a CPU {100 * share:.0f}% of its lanes' time (other processes "
                       "had the cores), so its tokens/s may read up to that much low: rerun on a quiet machine")
            continue
        bad = [r for r in rs if r.cpu_wait_s is not None and r.wall_s > 0 and r.cpu_wait_s / r.wall_s >= CPU_WAIT_WARN_LANE]
        if bad:
            where = ", ".join(f"{r.prompt_id}{f' (repeat {r.repeat})' if r.repeat else ''} {100 * r.cpu_wait_s / r.wall_s:.0f}%" for r in bad)
            out.append(f"{setup}: on {where} of the lane's time the worker's threads waited for a CPU (other processes had the "
                       "cores), so those prompts' speedups read low: rerun them on a quiet machine")
    return out


def render_summary(doc: dict) -> str:
    """The human table of a report: one row per setup, with speedup beside theoretical speedup."""
    rows = []
    stalled = {s["setup"] for s in doc["summary"] if s.get("stall_s")}
    runs_by: dict[str, list[dict]] = {}
    for r in doc["runs"]:
        runs_by.setdefault(r["setup"], []).append(r)
    for s in doc["summary"]:
        rs = runs_by.get(s["setup"], [])
        n_ident = sum(1 for r in rs if r.get("identical_to_baseline"))
        divs = [r.get("first_divergence") for r in rs if r.get("identical_to_baseline") is False]
        ident = f"{n_ident}/{len(rs)}" + (f" (first diff @{min(d for d in divs if d is not None)})" if divs and any(d is not None for d in divs) else "")
        if doc.get("reference"):
            if s["setup"] == doc["reference"]:
                ident += " | ref"
            else:
                rdivs = [r.get("reference_divergence") for r in rs if r.get("reference_comparable", True)]
                if len(rdivs) < len(rs):
                    ident += " | ref: other tokenizer"
                elif rdivs and all(d is None for d in rdivs):
                    ident += " | = ref"
                else:
                    ident += f" | ref @{min(d for d in rdivs if d is not None)}"
        rows.append(
            [
                s["setup"],
                _fmt(s["tokens_per_s"], ".2f"),
                _fmt(s["speedup"], ".2f") + ("x" if s["speedup"] is not None else "")
                + ("!" if s["speedup"] is not None and (stalled & {s["setup"], "baseline"}) else ""),
                _fmt(s["theoretical_speedup"], ".2f") + ("x" if s["theoretical_speedup"] is not None else ""),
                ("~" if "streamed" in s.get("counts_sources", ()) and s["acceptance_rate"] is not None else "") + _fmt(s["acceptance_rate"], ".2f"),
                _fmt(s["mean_accepted_len"], ".2f"),
                _fmt(s["mean_k"], ".1f") if s["mean_k"] else "–",
                _fmt(s["c"], ".3f"),
                _fmt(s["ttft_s"], ".2f"),
                ident,
                "/".join(_fmt(100 * (s[k] or 0), ".0f") for k in ("prefill_share", "draft_share", "verify_share", "overhead_share")),
            ]
        )
    head = f"target {doc['target']} on {doc['device']} ({doc['dtype']}), {doc.get('prompts', '?')} prompt(s) x {doc.get('repeats', 1)} repeat(s), mode {doc.get('mode', '?')}"
    headers = ["setup", "tok/s", "speedup", "theory", "α", "τ", "k", "c", "TTFT s", "identical", "time % prefill/draft/verify/other"]
    intervals = doc.get("speedup_intervals") or {}
    if intervals:  # the bench command's (app.commands.intervals): how far the speedup could move over other prompts of the same kind
        level = next(iter(intervals.values()))["level"]
        headers.insert(3, f"{100 * level:.0f}% interval")
        for row, s in zip(rows, doc["summary"], strict=True):
            iv = intervals.get(s["setup"])
            row.insert(3, f"{iv['lo']:.2f}–{iv['hi']:.2f}" if iv else "–")
    table = format_table(headers, rows)
    if doc.get("reference"):
        table += (f"\nidentical: against the baseline of the lane's own target; after |: against the reference lane {doc['reference']} "
                  "(= same tokens, @N first difference)")
    if intervals:
        table += (f"\ninterval: the speedup's {100 * level:.0f} % bootstrap interval over the prompts (each prompt's repeats together): "
                  "how far it could move on other prompts like these")
    if stalled:
        table += "\n! a lane's clock includes a stall (the worker was stopped or starved): that speedup is not trustworthy"
    if any("streamed" in s.get("counts_sources", ()) for s in doc["summary"]):
        table += "\n~ α inferred from streamed chunk sizes (k drafts assumed per iteration), not counted by the engine"
    for s in doc["summary"]:
        for note in s.get("notes") or ():
            table += f"\nnote: {s['setup']}: {note}"
    for d in doc.get("draft_parting") or ():
        if d["differ"]:
            table += (f"\nnote: {d['draft']}: its {d['setups']} setups' lanes drafted other tokens on the same prefix at {d['differ']} of the "
                      f"{d['shared']} answer positions two of them drafted ({100 * d['differ'] / d['shared']:.1f} %; on {d['prompts_differ']} of "
                      f"{d['prompts']} prompts): the draft's numerics depend on how each lane's steps feed it, so on one prompt two of these "
                      "setups can part by a step by luck, not by their rules; over many prompts it evens out "
                      "(resources/bench/README.md#draft-parting)")

    paired = render_against_fastest(doc)
    if paired:
        table += "\n\n" + paired
    costs = render_profiles(doc.get("cost_profiles") or [])
    if costs:
        table += "\n\n" + costs
    by_cat = render_categories(doc)
    return head + "\n" + table + ("\n\nspeedup by category (Σ baseline wall / Σ setup wall)\n" + by_cat if by_cat else "")


def render_against_fastest(doc: dict) -> str:
    """Each setup against the report's fastest, prompt by prompt (`against_fastest`, which the bench command adds:
    app.commands.intervals): is it slower, or do these prompts not tell them apart? One table per target with two
    setups or more to compare ("" if none)."""
    parts = []
    for group in doc.get("against_fastest") or ():
        out = []
        for r in group["rows"]:
            iv = r["ratio"]
            verdict = "not told apart" if iv["lo"] <= 1.0 <= iv["hi"] else "slower" if iv["hi"] < 1.0 else "faster"
            out.append([r["setup"], f"{iv['value']:.3f}", f"{iv['lo']:.3f}–{iv['hi']:.3f}", f"{r['faster']}/{r['prompts']}", verdict])
        level = group["rows"][0]["ratio"]["level"]
        parts.append(f"against the fastest, {group['fastest']} (paired by prompt; ratio of speedups, < 1: slower)\n"
                     + format_table(["setup", "ratio", f"{100 * level:.0f}% interval", "faster on", "verdict"], out))
    return "\n\n".join(parts)


def render_categories(doc: dict) -> str:
    """Speedup per prompt category (Spec-Bench style), when the prompts have categories; each setup against the
    baseline of its own target, as in the main table."""
    from app.core.report import category_speedups

    names = list(dict.fromkeys((doc.get("categories") or {}).values()))
    if len(names) < 2:
        return ""
    by = category_speedups(doc)
    rows = [[s["setup"], *(f"{by[s['setup']][c]:.2f}x" if c in by[s["setup"]] else "–" for c in names)] for s in doc["summary"]]
    return format_table(["setup", *names], rows)


#: the n of V(n) shown in the cost-profile table (k = n - 1 drafts)
PROFILE_COLUMNS = (2, 3, 5, 9, 17, 25, 33)


def render_profiles(profiles: Sequence[dict]) -> str:
    """The verify-cost curves of a report's engines: T(1) and V(n) = T(n)/T(1) at a few n (k = n − 1 drafts), and
    what a token tree's forward costs over a causal one (CostProfile.tree_ratio; – where not measured)."""
    from app.core.costs import NARROW, CostProfile

    if not profiles:
        return ""
    ps = [CostProfile.from_json(p) for p in profiles]
    rows = [[f"{p.engine} ({p.backend} {p.precision})" + (" !" if p.contended else ""), f"{p.t1_s * 1e3:.1f}",
             *(f"{p.v(n):.2f}" for n in PROFILE_COLUMNS), f"{p.tree_ratio:.2f}" if p.tree_ratio else "–"] for p in ps]
    head = (f"verify cost on {ps[0].machine_text or 'this machine'}: T(1) = one-token forward, V(n) = forward over n tokens ÷ T(1) "
            "(a step verifying k drafts costs V(k+1) decode steps); tree: a token tree's forward ÷ a causal one of as many tokens")
    notes = [f"! {p.engine} ({p.precision}) was measured while other processes took its CPU (waited {100 * (p.cpu_wait_share or 0):.0f} % "
             f"of the time; rounds spread {100 * p.spread:.0f} %): used for this run only, not cached; measure it on a quiet machine "
             f"(python -m app profile {p.engine} --force)" for p in ps if p.contended]
    for p in ps:
        narrow = [(n, p.v(n)) for n in p.ns if n <= NARROW]
        if any(b < a for (_, a), (_, b) in zip(narrow, narrow[1:], strict=False)):
            notes.append(f"{p.engine} ({p.precision}): a wider forward is not always dearer here (" + ", ".join(f"V({n}) {v:.2f}" for n, v in narrow)
                         + "): priced as measured (a narrow forward off its line beyond its rounds' noise keeps its median)")
    return "\n".join([head, format_table(["engine", "T(1) ms", *(f"V({n})" for n in PROFILE_COLUMNS), "tree"], rows), *notes])
