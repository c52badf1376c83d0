"""Token trees: shapes, greedy and lossless sampling verification (seeded chi-square, with a broken rule that fails
it), the tree attention forward of the hf backend against plain forwards, and tree lanes on real tiny models."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from app.core.errors import SetupError
from app.core.events import LaneDone, StepEvent
from app.core.setups import Sampling, parse_setup
from app.engines.hf import HFEngine
from app.engines.registry import resolve
from app.speculative.tree import DraftTree, TreeVerdict, parse_shape, verify_tree_greedy, verify_tree_sampling
from app.speculative.tree_drafter import TreeDrafter
from app.speculative.verifier import sample
from tests.helpers import run_lane

V = 4


def test_shapes_parse_and_bad_ones_are_refused():
    assert parse_shape("3x2x1") == [3, 2, 1]
    assert parse_shape("4") == [4]
    for bad in ("", "3x0", "ax2", "65", "2x" * 17 + "2"):
        with pytest.raises(ValueError):
            parse_shape(bad)


def test_tree_setups_round_trip_and_refuse_mixed_parameters():
    s = parse_setup("tree:qwen2.5-coder-0.5b-instruct,shape=3x2x1")
    assert parse_setup(s.label) == s and "shape=3x2x1" in s.label
    d = parse_setup("tree:qwen2.5-coder-0.5b-instruct,nodes=24,depth=6")
    assert (d.shape, d.nodes, d.depth, d.branch) == (None, 24, 6, 4) and parse_setup(d.label) == d
    with pytest.raises(SetupError, match="branch counts per depth"):
        parse_setup("tree:x,shape=3y2")
    with pytest.raises(SetupError, match="not both"):
        parse_setup("tree:x,shape=3x2,nodes=8")


def test_greedy_follows_the_targets_argmax_down_the_tree():
    #        root
    #      /   |   \
    #    5(0) 7(1) 9(2)
    #    |     |
    #   6(3)  8(4)
    tree = DraftTree([5, 7, 9, 6, 8], [-1, -1, -1, 0, 1])
    logits = torch.zeros(6, 12)
    logits[0, 7] = 1  # root → 7 (node 1)
    logits[2, 8] = 1  # after node 1 → 8 (node 4)
    logits[5, 3] = 1  # after node 4 (a leaf) → bonus 3
    v = verify_tree_greedy(logits, tree)
    assert v == TreeVerdict((1, 4), 3) and v.is_bonus(tree)
    logits[2, 8], logits[2, 11] = 0, 1  # after node 1 the target wants 11, not 8
    v = verify_tree_greedy(logits, tree)
    assert v == TreeVerdict((1,), 11) and not v.is_bonus(tree)
    logits[0, 7], logits[0, 2] = 0, 1  # no child of the root is the argmax
    assert verify_tree_greedy(logits, tree) == TreeVerdict((), 2)
    assert tree.main_line(-1) == [0, 3] and tree.depth == 2 and not tree.is_chain()


# --- sampling: a toy language whose next-token distributions depend on the last token -----------------------------
def _toy(seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.softmax(torch.randn(V + 1, V, generator=g) * 1.6, -1)  # target: row V = after the start, row x = after x
    d = torch.softmax(torch.randn(V + 1, V, generator=g) * 1.6, -1)  # draft
    return t, d


def _draft_tree(ctx_last, d, shape, g, sampled):
    """A tree drafted from the toy draft: children drawn without replacement from the draft (sampled) or its top ones."""
    ids, parents, q = [], [], []
    frontier = [(-1, ctx_last)]
    for b in shape:
        new = []
        for node, last in frontier:
            dist = d[last]
            picks = torch.multinomial(dist, b, replacement=False, generator=g) if sampled else torch.topk(dist, b).indices
            for x in picks.tolist():
                ids.append(x)
                parents.append(node)
                q.append(dist)
                new.append((len(ids) - 1, x))
        frontier = new
    return DraftTree(ids, parents, torch.stack(q) if sampled else None)


def _emit_two(t, d, shape, g, verify, sampled):
    """Run tree steps from the start until two tokens are emitted; return them."""
    out: list[int] = []
    while len(out) < 2:
        last = out[-1] if out else V
        tree = _draft_tree(last, d, shape, g, sampled)
        rows = [t[last]] + [t[x] for x in tree.ids]  # after node i the target's distribution depends on its token
        v = verify(torch.stack(rows), tree, g)
        out += [tree.ids[j] for j in v.path] + [v.target_id]
    return out[:2]


def _broken_keeps_tried_siblings(p, tree, g):
    """Recursive rejection sampling that forgets to remove rejected siblings from q (the with-replacement rule
    applied to candidates drawn without replacement): biased."""
    node, path = -1, []
    while True:
        r = p[node + 1].clone()
        nxt = None
        for c in tree.children(node):
            x, qr = tree.ids[c], tree.q[c]
            if float(torch.rand(1, generator=g)) < min(1.0, float(r[x] / qr[x])):
                nxt = c
                break
            r = (r - qr).clamp_min(0)
            r = r / r.sum() if r.sum() > 0 else p[node + 1]
        if nxt is None:
            return TreeVerdict(tuple(path), sample(r, g))
        path.append(nxt)
        node = nxt


def _joint_counts(t, d, shape, verify, sampled, n, seed):
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V * V)
    for _ in range(n):
        a, b = _emit_two(t, d, shape, g, verify, sampled)
        counts[a * V + b] += 1
    expected = (t[V][:, None] * t[:V]).reshape(-1)  # P(a) · P(b | a)
    return counts, expected


@pytest.mark.parametrize("seed", [1, 2])
def test_tree_sampling_preserves_the_targets_joint_distribution(seed):
    """Two emitted tokens from trees of shape 3x1 (children drawn without replacement from the draft): their joint
    distribution is the target's, P(a)·P(b|a) (chi-square over the 16 pairs); forgetting to remove tried siblings
    from q fails the same test."""
    t, d = _toy(seed)
    n = 12000
    counts, expected = _joint_counts(t, d, [3, 1], verify_tree_sampling, True, n, seed)
    assert chisquare(counts.numpy(), (expected * n).numpy()).pvalue > 1e-3, (counts / n, expected)
    broken, _ = _joint_counts(t, d, [3, 1], _broken_keeps_tried_siblings, True, n, seed)
    assert chisquare(broken.numpy(), (expected * n).numpy()).pvalue < 1e-6  # the test has power


def test_tree_sampling_with_deterministic_candidates_is_lossless():
    """Top-k candidates (no q: point masses, as the dynamic tree uses) also leave the target's distribution intact."""
    t, d = _toy(3)
    n = 12000
    counts, expected = _joint_counts(t, d, [2, 2], verify_tree_sampling, False, n, 3)
    assert chisquare(counts.numpy(), (expected * n).numpy()).pvalue > 1e-3


def test_chain_shaped_tree_is_ordinary_speculative_sampling():
    """One child per node, verified as a tree, accepts as many drafts as the chain verifier does (same distribution
    of accepted lengths over the same kind of drafts: a two-sample chi-square)."""
    from scipy.stats import chi2_contingency

    from app.speculative.verifier import verify_sampling

    t, d = _toy(4)
    g = torch.Generator().manual_seed(9)
    lengths = torch.zeros(2, 4)
    for _ in range(6000):
        tree = _draft_tree(V, d, [1, 1, 1], g, True)
        rows = torch.stack([t[V]] + [t[x] for x in tree.ids])
        lengths[0, len(verify_tree_sampling(rows, tree, g).path)] += 1
        lengths[1, verify_sampling(rows, tree.q, tree.ids, g).accepted] += 1
    assert chi2_contingency(lengths.numpy()).pvalue > 1e-3, lengths


# --- the hf backend's tree forward --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tiny_pair):
    t, d = tiny_pair
    return HFEngine(resolve(str(t))), HFEngine(resolve(str(d)))


def test_tree_forward_equals_a_plain_forward_along_every_branch(tiny):
    target, _ = tiny
    ctx = target.encode_prompt("def add(a, b):\n    return", chat=False)

    def plain(path):
        s = target.new_state()
        s.forward(ctx[:-1])
        return s.forward([ctx[-1], *path])[-1]

    s = target.new_state()
    s.forward(ctx[:-1])
    L = s.length
    toks, rel = [100, 200, 300, 400, 500, 600], [-1, -1, 0, 0, 1, 3]  # two branches off the root, one two levels down
    parents = [L - 1] + [L if p < 0 else L + 1 + p for p in rel]
    out = s.forward_tree([ctx[-1], *toks], parents)
    paths = {0: [100], 1: [200], 2: [100, 300], 3: [100, 400], 4: [200, 500], 5: [100, 400, 600]}
    torch.testing.assert_close(out[0], plain([]), atol=2e-4, rtol=1e-4)
    for node, path in paths.items():
        torch.testing.assert_close(out[node + 1], plain(path), atol=2e-4, rtol=1e-4)
    # keep the path 100 → 400 → 600 and go on as a plain sequence
    s.select([*range(L + 1), L + 1, L + 4, L + 6])
    assert s.length == L + 4
    torch.testing.assert_close(s.forward([7])[-1], plain([100, 400, 600, 7]), atol=2e-4, rtol=1e-4)
    n = s.length
    s.forward_tree([1, 2], [n - 1, n - 1])
    with pytest.raises(ValueError, match="not one path"):
        s.select([*range(n), n, n + 1])  # two siblings are not a path


PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Rename x to count:\nx = 0\nfor i in range(10):\n    x += i\nprint(x)\n",
]


def _run(target, drafter, ids, sampling):
    evs = list(run_lane(target, drafter, ids, sampling))
    assert isinstance(evs[-1], LaneDone)
    return [e for e in evs if isinstance(e, StepEvent)], evs[-1].stats


def test_tree_lanes_match_the_baseline_greedy(tiny):
    """Static and dynamic trees emit exactly the baseline's tokens; each step's path is a root path of its tree and
    the events say so (k = nodes, a = path length, bonus only at a leaf); some steps accept a second choice."""
    target, draft = tiny
    s = Sampling(max_new_tokens=40)
    second_choice = 0
    for prompt in PROMPTS:
        ids = target.encode_prompt(prompt, chat=False)
        _, base = _run(target, None, ids, s)
        for drafter in (TreeDrafter(draft, [3, 2, 1]), TreeDrafter(draft, None, nodes=12, depth=4, branch=3), TreeDrafter(draft, [2, 2, 2, 2])):
            steps, st = _run(target, drafter, ids, s)
            assert st.output_ids == base.output_ids, (prompt, drafter.shape_label)
            assert st.tree_steps == sum(1 for e in steps if e.k) > 0  # a step with one token left drafts nothing
            for e in steps:
                if not e.k:
                    continue
                tree = e.tree
                assert tree is not None and e.k == len(tree.ids)
                path = tree.path
                assert e.accepted_count == len(path)
                assert all(tree.parents[c] == (path[i - 1] if i else -1) for i, c in enumerate(path))  # a root path
                if e.target_id is not None:
                    assert e.emitted_ids == (*(tree.ids[j] for j in path), e.target_id)
                    leaf = bool(path) and all(p != path[-1] for p in tree.parents)
                    assert e.target_kind == ("bonus" if leaf else "correction")
                assert e.drafted_ids[: len(path)] == tuple(tree.ids[j] for j in path)
                second_choice += sum(1 for c in path if tree.parents.index(tree.parents[c]) != c)
            assert st.per_position_drafted[0] == st.tree_steps  # per depth: steps whose tree reached it
            assert all(a <= n for a, n in zip(st.per_position_accepted, st.per_position_drafted, strict=True))
    assert second_choice > 0  # branches paid: some accepted node was not its parent's first child


def test_tree_sampling_lane_is_reproducible(tiny):
    target, draft = tiny
    ids = target.encode_prompt(PROMPTS[2], chat=False)
    s = Sampling(temperature=0.8, top_p=0.95, seed=5, max_new_tokens=30)
    _, a = _run(target, TreeDrafter(draft, [3, 2]), ids, s)
    _, b = _run(target, TreeDrafter(draft, [3, 2]), ids, s)
    assert a.output_ids == b.output_ids and a.new_tokens == 30 and a.tree_steps > 0


def test_the_calibration_tells_each_dynamic_tree_what_it_would_keep(tiny):
    """The finder's dynamic-tree calibration lane (`widths=all`: every dynamic tree up to 32 nodes, depth 6, branch
    4 verified at once) emits the baseline's tokens; on step 0, which every lane starts at the same position,
    replaying its record for a tree (app.core.tuning.replay_masked) gives exactly the nodes that tree's own lane
    verifies and the drafts it keeps, for every budget, depth and branch priced."""
    from app.core.tuning import DYN_NODES, CalStep, replay_masked, tree_bit

    target, draft = tiny
    s = Sampling(max_new_tokens=40)
    kept = set()
    for prompt in PROMPTS:
        ids = target.encode_prompt(prompt, chat=False)
        _, base = _run(target, None, ids, s)
        # (long enough that kept paths run through nodes of several widths' expansions: the draft's cache keeps one's)
        steps, st = _run(target, TreeDrafter(draft, None, nodes=32, depth=6, branch=4, all_widths=True), ids, s)
        assert st.output_ids == base.output_ids
        t = steps[0].tree
        assert t is not None and len(t.searches) == len(t.ids) == len(t.q) and all(t.searches)
        rec = CalStep(len(t.ids), steps[0].accepted_count, t.q, False, 0.0, None, t.parents, t.searches, t.path)
        for b in (2, 3, 4):
            for d in (1, 3, 6):
                for n in DYN_NODES:
                    lane = run_lane(target, TreeDrafter(draft, None, nodes=n, depth=d, branch=b), ids, s, cancelled=lambda: True)
                    real = next(e for e in lane if isinstance(e, StepEvent))  # step 0 (the lane stops after it)
                    assert replay_masked(rec, tree_bit(b, d, n), d) == (real.k, real.accepted_count), (prompt, b, d, n)
                    kept.add(real.accepted_count)
    assert len(kept) > 1  # trees that kept different numbers of drafts were told apart


def test_the_dynamic_calibration_counts_the_forwards_it_spends(tiny):
    """Its proposal's draft forwards: the root's once, then each width's levels below the root (what the finder
    divides its drafting time by to price a draft forward)."""
    from app.speculative.drafters import DraftContext

    _, draft = tiny
    ids = draft.encode_prompt(PROMPTS[0], chat=False)

    def proposal(d: TreeDrafter):
        d.start(ids)
        return d.propose(DraftContext(list(ids), 20))

    union = proposal(TreeDrafter(draft, None, nodes=32, depth=6, branch=4, all_widths=True))
    single = [proposal(TreeDrafter(draft, None, nodes=32, depth=6, branch=b)).forwards for b in (2, 3, 4)]
    assert all(f == 6 for f in single)  # the root's and one per level below it but the last
    assert union.forwards == 1 + sum(f - 1 for f in single) == 16
