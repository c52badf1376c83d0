"""Bootstrap intervals of speedups over prompts (app.commands.intervals), on literal walls."""

from __future__ import annotations

import pytest

from app.commands.intervals import MIN_UNITS, against_fastest, ratio_interval, speedup_intervals

BASE = {"p1": 10.0, "p2": 20.0, "p3": 15.0, "p4": 12.0, "p5": 18.0, "p6": 9.0}
#: a lane faster than `fast` (BASE / 2) on three prompts and slower on three
MIXED = {"p1": 4.8, "p2": 10.4, "p3": 7.2, "p4": 6.3, "p5": 8.8, "p6": 4.7}


def _doc(walls: dict[str, dict[str, float]], repeats: int = 1) -> dict:
    """A report with these walls: setup → prompt → wall of each repeat."""
    runs = [dict(setup=s, prompt_id=p, repeat=r, wall_s=w) for s, by in walls.items() for p, w in by.items() for r in range(repeats)]
    return dict(runs=runs, summary=[dict(setup=s) for s in walls])


def test_a_ratio_of_sums_with_an_interval_over_the_prompts():
    lane = {"p1": 5.0, "p2": 7.0, "p3": 6.0, "p4": 5.0, "p5": 10.0, "p6": 3.0}
    iv = ratio_interval(BASE, lane)
    assert iv is not None and iv.value == pytest.approx(84 / 36) and iv.units == 6 and iv.level == 0.9
    assert iv.lo < iv.value < iv.hi and iv.contains(iv.value) and not iv.contains(1.0)
    assert iv == ratio_interval(BASE, lane)  # seeded: the same report renders the same interval
    # only the prompts both ran count; below MIN_UNITS of them there is no interval (a bootstrap of a handful of
    # prompts only reshuffles them)
    assert MIN_UNITS == 6 and ratio_interval(BASE, {"p1": 5.0, "p2": 7.0, "p3": 6.0, "p4": 5.0, "p5": 10.0, "zz": 1.0}) is None
    # every prompt at the same ratio: nothing to resample
    same = ratio_interval(BASE, {k: v / 2 for k, v in BASE.items()})
    assert same is not None and same.lo == same.value == same.hi == pytest.approx(2.0)


def test_more_prompts_of_the_same_spread_narrow_the_interval():
    base, lane = {}, {}
    for i in range(48):
        base[f"p{i}"] = 10.0
        lane[f"p{i}"] = (4.0, 5.0, 6.0, 5.0, 4.5, 5.5)[i % 6]
    few = ratio_interval({k: base[k] for k in list(base)[:6]}, {k: lane[k] for k in list(lane)[:6]})
    many = ratio_interval(base, lane)
    assert few is not None and many is not None and few.value == pytest.approx(many.value) == pytest.approx(2.0)
    assert (many.hi - many.lo) < 0.5 * (few.hi - few.lo)


def test_two_setups_on_the_same_prompts_are_paired():
    """A prompt that is hard for both cancels: B 2 % slower than A on every prompt, with walls five times apart from
    prompt to prompt, is told apart from A (paired), where comparing two unpaired speedups would not."""
    a = {"p1": 2.0, "p2": 10.0, "p3": 4.0, "p4": 7.0, "p5": 3.0, "p6": 8.0}
    b = {k: v * 1.02 for k, v in a.items()}
    iv = ratio_interval(b, a)  # A's speedup over B's: > 1, A faster
    assert iv is not None and iv.lo == pytest.approx(1.02) and iv.hi == pytest.approx(1.02)
    unpaired = ratio_interval(b, dict(zip(a, reversed(list(a.values())), strict=True)))
    assert unpaired is not None and unpaired.lo < 1.0 < unpaired.hi  # the same walls, prompts mismatched: no verdict


def test_speedup_intervals_and_the_setups_against_the_fastest():
    doc = _doc({
        "baseline": BASE,
        "fast": {k: v / 2.0 for k, v in BASE.items()},
        "slower": {k: v / 1.8 for k, v in BASE.items()},  # slower on every prompt
        "mixed": MIXED,
        "baseline@other": BASE,
        "other-lane@other": {k: v / 3.0 for k, v in BASE.items()},  # another target: against its own baseline
        "two-prompts": {"p1": 5.0, "p2": 10.0},
    }, repeats=2)
    ivs = speedup_intervals(doc)
    assert set(ivs) == {"fast", "slower", "mixed", "other-lane@other"}  # no baselines; two prompts give no interval
    assert ivs["fast"]["value"] == pytest.approx(2.0) and ivs["other-lane@other"]["value"] == pytest.approx(3.0)
    assert ivs["fast"]["units"] == 6  # repeats of a prompt are one unit
    # per target: its lanes against its own fastest (the other target has one lane: nothing to compare)
    (group,) = against_fastest(doc)
    by = {r["setup"]: r for r in group["rows"]}
    assert group["fastest"] == "fast" and set(by) == {"slower", "mixed"}
    assert by["slower"]["ratio"]["hi"] < 1.0 and by["slower"]["faster"] == 0 and by["slower"]["prompts"] == 6
    assert by["mixed"]["ratio"]["lo"] <= 1.0 <= by["mixed"]["ratio"]["hi"] and by["mixed"]["faster"] == 3


def test_the_bench_table_shows_the_intervals_and_the_paired_verdicts():
    from app.core.report_text import render_summary

    doc = _doc({"baseline": BASE, "fast": {k: v / 2.0 for k, v in BASE.items()}, "slower": {k: v / 1.8 for k, v in BASE.items()},
                "mixed": MIXED})
    nan = float("nan")
    for s in doc["summary"]:
        s.update(tokens_per_s=1.0, speedup=1.0, theoretical_speedup=None, acceptance_rate=None, mean_accepted_len=None, mean_k=0.0, c=None,
                 ttft_s=0.1, prefill_share=nan, draft_share=nan, verify_share=nan, overhead_share=nan)
    doc.update(target="t", device="cpu", dtype="float32")
    plain = render_summary(doc)
    assert "interval" not in plain and "against the fastest" not in plain  # a report without intervals (the window's)
    doc["speedup_intervals"] = speedup_intervals(doc)
    doc["against_fastest"] = against_fastest(doc)  # as the bench command adds them
    text = render_summary(doc)
    assert "90% interval" in text and f"{doc['speedup_intervals']['fast']['lo']:.2f}–" in text
    lines = text.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("against the fastest, fast")))
    rows = {x.split()[0]: x for x in lines[at + 3: at + 5]}
    assert rows["slower"].endswith("slower") and "0/6" in rows["slower"]
    assert rows["mixed"].endswith("not told apart") and "3/6" in rows["mixed"]


def test_the_bench_table_says_where_lanes_of_one_draft_parted():
    """A report's draft_parting (bench, greedy): a note when the draft's lanes drafted other tokens on the same prefix,
    none when they agreed everywhere."""
    from app.core.report_text import render_summary

    doc = _doc({"baseline": BASE, "fast": {k: v / 2.0 for k, v in BASE.items()}})
    nan = float("nan")
    for s in doc["summary"]:
        s.update(tokens_per_s=1.0, speedup=1.0, theoretical_speedup=None, acceptance_rate=None, mean_accepted_len=None, mean_k=0.0, c=None,
                 ttft_s=0.1, prefill_share=nan, draft_share=nan, verify_share=nan, overhead_share=nan)
    doc.update(target="t", device="cpu", dtype="float32")
    doc["draft_parting"] = [dict(draft="draft:d,dtype=int8", setups=5, shared=880, differ=14, prompts=24, prompts_differ=10)]
    assert ("note: draft:d,dtype=int8: its 5 setups' lanes drafted other tokens on the same prefix at 14 of the 880 answer "
            "positions two of them drafted (1.6 %; on 10 of 24 prompts)") in render_summary(doc)
    doc["draft_parting"][0].update(differ=0, prompts_differ=0)
    assert "drafted other tokens" not in render_summary(doc)
