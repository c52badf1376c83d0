"""LaneView without a worker: token kinds and colours, tooltips, hiding rejected drafts, bounded memory, and a
10,000-token stream whose frames cost no more CPU at the end than at the start."""

from __future__ import annotations

import time

from .helpers import expected_runs as _expected_runs
from .helpers import make_step


def _events():
    return [
        make_step("L1", 0),  # prefill: plain target token
        make_step("L1", 1, drafted=(1, 2, 3), accepted=3, kind="bonus"),
        make_step("L1", 2, drafted=(4, 5, 6, 7), accepted=1, kind="correction"),
        make_step("L1", 3, drafted=(8, 9), accepted=0, kind="correction"),
        make_step("L1", 4, drafted=(1, 2), accepted=2, target_id=None),  # ended at EOS on an accepted draft
    ]


def test_tokens_of_step_order_and_kinds():
    from app.ui.lane_view import tokens_of_step
    from app.ui.theme import KINDS

    toks = tokens_of_step(make_step("L1", 2, drafted=(4, 5, 6, 7), accepted=1, kind="correction"))
    assert [(t.text, KINDS[t.kind]) for t in toks] == [
        ("a2.0 ", "accepted"),
        ("r2.1 ", "rejected"),
        ("r2.2 ", "rejected"),
        ("r2.3 ", "rejected"),
        ("t2 ", "correction"),
    ]
    assert toks[0].q == 0.5 and toks[0].p == 0.25  # accepted: q and p known
    assert toks[1].p == 0.25  # the first rejected draft has p(d) from the verifier
    assert toks[-1].p == 0.75  # target token


def test_document_kinds_and_colours_match_events(qtbot):
    from PySide6.QtGui import QColor, QTextCursor

    from app.ui.lane_view import LaneView
    from app.ui.theme import KIND_PROPERTY, KINDS, LIGHT

    v = LaneView(0, "#0072B2", LIGHT)
    qtbot.addWidget(v)
    evs = _events()
    for ev in evs:
        v.add_step(ev)
    assert v.rendered_tokens == 0  # nothing is drawn per event ...
    v.flush()  # ... only per tick
    assert v.document_runs() == _expected_runs(evs)
    # every character's format has the kind's colour and second cue
    doc = v.text.document()
    cur = QTextCursor(doc)
    seen = set()
    for pos in range(1, doc.characterCount()):
        cur.setPosition(pos)
        f = cur.charFormat()
        kind = KINDS[int(f.property(KIND_PROPERTY))]
        seen.add(kind)
        if kind != "plain":
            assert f.foreground().color() == QColor(LIGHT.kind_color(kind)), kind
        assert f.fontStrikeOut() == (kind == "rejected")
    assert seen == {"plain", "accepted", "rejected", "correction", "bonus"}
    v.finish(None)
    assert v.acc.steps == 5 and v.acc.accepted == 3 + 1 + 0 + 2 and v.acc.drafted == 3 + 4 + 2 + 2
    header = v.stats_label.text().replace("\u00a0", " ")  # figures keep their spaces unbroken
    assert "steps" in header and "α 0.55" in header


def test_hide_rejected_rerenders_without_them(qtbot):
    from app.ui.lane_view import LaneView
    from app.ui.theme import LIGHT

    v = LaneView(0, "#0072B2", LIGHT)
    qtbot.addWidget(v)
    evs = _events()
    for ev in evs:
        v.add_step(ev)
    v.flush()
    v.set_show_rejected(False)
    assert v.document_runs() == _expected_runs(evs, show_rejected=False)
    assert "r2.1" not in v.text.toPlainText()
    v.set_show_rejected(True)
    assert "r2.1" in v.text.toPlainText()


def test_tooltip_names_step_kind_and_probs(qtbot):
    from app.ui.lane_view import LaneView
    from app.ui.theme import LIGHT

    v = LaneView(0, "#0072B2", LIGHT)
    qtbot.addWidget(v)
    v.resize(500, 300)
    v.show()
    for ev in _events():
        v.add_step(ev)
    v.flush()
    text = v.text.toPlainText()
    pos = text.index("r2.1")
    tok = v.token_at(pos + 1)
    assert tok is not None and tok.step == 2
    # through the widget: the rectangle of that character → tooltip text
    from PySide6.QtGui import QTextCursor

    cur = QTextCursor(v.text.document())
    cur.setPosition(pos + 1)
    rect = v.text.cursorRect(cur)
    tip = v.tooltip_at(rect.center())
    assert "rejected draft" in tip and "step 2" in tip and "q = 0.500" in tip and "p = 0.250" in tip


def test_memory_is_bounded(qtbot):
    from app.ui.lane_view import LaneView
    from app.ui.theme import LIGHT

    v = LaneView(0, "#0072B2", LIGHT, max_tokens=1000)
    qtbot.addWidget(v)
    for i in range(5000):
        v.add_step(make_step("L1", i, drafted=(1, 2), accepted=1, kind="correction"))
        if i % 50 == 0:
            v.flush()
    v.flush()
    assert v.kept_tokens <= 1000
    assert v.trimmed_tokens > 0
    assert v.text.document().characterCount() < 1000 * 8
    assert v.acc.steps == 5000  # the stats still count everything
    # the index still maps positions to the right tokens after trimming
    text = v.text.toPlainText()
    pos = text.rindex("t4999")
    assert v.token_at(pos).step == 4999


def test_10k_token_stream_through_the_bridge_shows_every_token_in_bounded_memory(qtbot):
    """10,000 steps pushed through the bridge from a background thread (like the worker's draining thread, ~4 events
    per ms) all reach the lane and the plots, and the plot's ring stays bounded. How responsive the window stays
    meanwhile is wall-clock and machine-dependent: resources/bench/lane_stream.py measures it (heartbeat gaps,
    token-to-screen latency)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("lane_stream", Path(__file__).resolve().parents[2] / "resources/bench/lane_stream.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    f = bench.stream(10_000)
    assert f["tokens"] == 10_000 and f["flushes"] > 1
    assert f["plot_points"] <= 2048  # bounded ring


def test_a_flush_costs_the_same_cpu_when_the_text_is_long(qtbot):
    """The regression this guards against: a repaint or layout whose cost grows with the text (a whole-document
    relayout per append) makes a long lane's frames ever slower. Measured as the main thread's CPU time per
    flush + repaint (time.thread_time: what this thread computed, not what other processes took from it, so it
    holds on a loaded machine), early in a 10,000-step lane against late in it."""
    from app.ui.lane_view import LaneView
    from app.ui.theme import LIGHT

    view = LaneView(0, "#0072B2", LIGHT)
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    costs = []
    for batch in range(200):
        for i in range(batch * 50, batch * 50 + 50):
            d = (1, 2, 3, 4) if i % 2 else ()
            view.add_step(make_step("L1", i, drafted=d, accepted=min(len(d), i % 3), target_id=None if d and i % 3 >= len(d) else 7))
        c0 = time.thread_time()
        view.flush(header=True)
        view.text.viewport().repaint()
        costs.append(time.thread_time() - c0)
    early, late = sorted(costs[5:25])[10], sorted(costs[-20:])[10]
    print(f"\nCPU per flush of 50 steps: early {early * 1e3:.2f} ms, late {late * 1e3:.2f} ms")
    assert view.events_seen == 10_000
    assert late < 3 * early + 0.002, (early, late)  # the same work per frame, whatever the text's length


def test_counts_only_steps_keep_their_kinds():
    """TensorRT-LLM's LLM API reports how many drafts it made, not which: the target token is still a correction."""
    from app.core.events import StepEvent
    from app.core.metrics import LaneAccumulator
    from app.ui.lane_view import tokens_of_step
    from app.ui.theme import KINDS

    ev = StepEvent("L", 3, (), 1, 9, "correction", 0.0, 0.1, 0.1, (5, 9), ("a", "b"), drafted_count=4)
    toks = tokens_of_step(ev)
    assert [KINDS[t.kind] for t in toks] == ["accepted", "correction"]  # Token.kind indexes KINDS
    acc = LaneAccumulator()
    acc.add(ev)
    assert acc.drafted == 4 and acc.per_position_drafted == [1, 1, 1, 1] and acc.per_position_accepted == [1, 0, 0, 0]


def test_a_library_step_shows_its_whole_chunk(qtbot):
    """A tokens-only lane (a server, llama-cpp-python's lookup: drafting unknown) reports a chunk of tokens per step, its
    last standing for the target token: every token of the chunk is drawn, plain, in order (before, only the
    chunk's first token was: a 48-token hf-assisted lane read "```python the =")."""
    from app.core.events import StepEvent
    from app.ui.lane_view import LaneView, tokens_of_step
    from app.ui.theme import KINDS

    ev = StepEvent("L", 1, (), 0, 9, "library", 0.0, 0.1, 0.1, (5, 6, 9), ("def", " f", "(x"))
    toks = tokens_of_step(ev)
    assert [t.text for t in toks] == ["def", " f", "(x"] and {KINDS[t.kind] for t in toks} == {"plain"}
    v = LaneView(0, "#000000")
    qtbot.addWidget(v)
    v.add_step(StepEvent("L", 0, (), 0, 4, "library", 0.0, 0.1, 0.1, (4,), ("```",)), 0.0)
    v.add_step(ev, 0.1)
    v.flush(header=True)
    assert v.text.toPlainText() == "```def f(x"


def test_tree_steps_show_their_tree_in_the_tooltip_and_depth_acceptance_in_the_header(qtbot):
    """A tree lane's step (recorded by the real recorder, with text per node): the tooltip draws the tree with the
    accepted path marked and the rejected branches struck; the header gives nodes per step and acceptance by depth."""
    from PySide6.QtGui import QTextCursor

    from app.core.accounting import LaneRecorder, StepFacts
    from app.core.events import TreeStep
    from app.ui.lane_view import LaneView
    from app.ui.theme import LIGHT

    class Detok:  # ids are letters: 0 → "a", 1 → "b", …
        def push(self, t):
            return chr(97 + t)

        def peek(self, ids):
            return [chr(97 + t) for t in ids]

    rec = LaneRecorder("l", "tree:x", "p", 0, 50, [], Detok())
    # root → b(0) → d(2) ; root → c(1) ; b → e(3): accepted b, d, then target f
    tree = TreeStep((1, 2, 3, 4), (-1, -1, 0, 0), (0, 2))
    ev0 = rec.step(StepFacts([0], t_draft_s=0, t_verify_s=0.01))
    ev1 = rec.step(StepFacts([1, 3, 5], accepted=2, drafted_ids=[1, 3], drafted_count=4, kind="bonus", t_verify_s=0.01, tree=tree))
    assert ev1.k == 4 and ev1.tree.pieces == ("b", "c", "d", "e") and ev1.rejected_pieces == ()
    v = LaneView(0, "#0072B2", LIGHT)
    qtbot.addWidget(v)
    v.resize(500, 300)
    v.show()
    v.add_step(ev0)
    v.add_step(ev1)
    v.flush(header=True)
    header = v.stats_label.text().replace("\xa0", " ")
    assert "tree 4 nodes" in header and "by depth 1.00 1.00" in header and "α" not in header
    text = v.text.toPlainText()
    cur = QTextCursor(v.text.document())
    cur.setPosition(text.index("b") + 1)
    tip = v.tooltip_at(v.text.cursorRect(cur).center())
    assert "token tree: 4 nodes, depth 2, accepted 2" in tip
    assert "b ✓" in tip and "d ✓" in tip and "<s" in tip and ">c</s>" in tip and ">e</s>" in tip
    assert tip.index("b ✓") < tip.index("d ✓") < tip.index(">e</s>") < tip.index(">c</s>")  # depth-first, first child first
