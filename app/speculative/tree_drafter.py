"""A draft model that proposes a token tree: top-k branching with a static shape, or a dynamic tree (EAGLE-2).

Each depth costs one draft forward over that depth's expanded nodes (a tree attention mask in the draft's own KV
cache), so a tree of depth D costs D draft forwards like a chain of D tokens, only wider. Between steps the draft's
cache keeps the accepted path only (:meth:`HFDecodeState.select`).

* static `shape=3x2x1`: the root gets the draft's 3 most likely tokens, each of them its 2 most likely, each of
  those its most likely one (15 nodes, 3 forwards). When sampling, children are drawn without replacement from the
  draft's warped distribution instead of taken as its top tokens, so the verifier can use q (recursive rejection
  sampling): with one child per node this is exactly the chain draft.
* dynamic (`nodes=N,depth=D,branch=B`, after EAGLE-2, Li et al. 2024): at each depth the B frontier nodes with the
  highest path probability (the product of the draft's probabilities from the root) are expanded, each with its
  top-B tokens; after D depths the N nodes of highest path probability are kept (a path probability never exceeds
  its parent's, so they form a tree). Candidates are the draft's top tokens (deterministic) in greedy and sampling
  runs alike; the verifier then treats them as point masses, lossless either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from app.speculative.drafters import DraftContext, Proposal
from app.speculative.tree import DraftTree, PrefixTree
from app.speculative.verifier import warp

__all__ = ["TreeDrafter"]


@dataclass
class _Expansion:
    """One grown tree, before any node cut: tokens, parents, depths, the draft's distribution and probability of
    each, path probabilities, the draft cache slot of each node fed to the draft, and the draft forwards spent."""

    ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    q_rows: list[torch.Tensor] = field(default_factory=list)
    q_tok: list[float] = field(default_factory=list)
    score: list[float] = field(default_factory=list)
    slot_of: dict[int, int] = field(default_factory=dict)
    forwards: int = 1

    def best(self, n: int, depth: int) -> list[int]:
        """The n most probable nodes down to `depth`, in tree order (a path probability never exceeds its parent's,
        so they form a tree)."""
        return sorted(sorted((i for i in range(len(self.ids)) if self.depth[i] <= depth), key=lambda i: (-self.score[i], i))[:n])


class TreeDrafter:
    """A draft model proposing a token tree each step.

    Args:
        engine: the draft engine (its decode states need forward_tree/select: the hf and llamacpp backends).
        shape: branch counts per depth (static tree), or None for a dynamic tree.
        nodes, depth, branch: the dynamic tree's node budget, depth and expansion width.
        all_widths: (dynamic, greedy) propose every dynamic tree up to `nodes`, `depth` and `branch` at once, each
            node tagged with the trees that hold it (the setup finder's calibration lane).
    """

    wants_hidden = False

    def __init__(self, engine, shape: list[int] | None = None, nodes: int = 16, depth: int = 6, branch: int = 4,
                 all_widths: bool = False) -> None:
        self.engine = engine
        self.all_widths = all_widths and shape is None
        self.shape = list(shape) if shape else None
        self.nodes, self.depth, self.branch = nodes, depth, branch
        self.k = len(self.shape) if self.shape else depth  # the deepest a step can accept
        self.state: Any = None
        self.seen: list[int] = []  # the plain sequence in the draft's cache
        self._tree: DraftTree | None = None  # the last proposal
        self._slots: dict[int, int] = {}  # node -> draft cache slot, for the nodes fed to the draft

    @property
    def shape_label(self) -> str:
        """`tree 3x2x1` or `tree ≤16 nodes, depth 6, branch 4` (lane headers)."""
        if self.shape:
            return "tree " + "x".join(map(str, self.shape))
        return f"tree ≤{self.nodes} nodes, depth {self.depth}, branch {self.branch}"

    def start(self, prompt_ids: list[int]) -> None:
        self.state = self.engine.new_state()
        self.seen = []
        self._tree, self._slots = None, {}
        if len(prompt_ids) > 1:
            self.state.forward(prompt_ids[:-1], last_only=True)
            self.seen = list(prompt_ids[:-1])

    def _keep_accepted(self, ids: list[int]) -> None:
        """Cut the last tree in the draft's cache down to the nodes the target kept (those the draft was fed)."""
        tree, self._tree = self._tree, None
        if tree is None:
            return
        keep = list(range(len(self.seen)))
        node = -1
        for tok in ids[len(self.seen) :]:
            nxt = next((c for c in tree.children(node) if tree.ids[c] == tok), None)
            if nxt is None or nxt not in self._slots:
                break
            keep.append(self._slots[nxt])
            self.seen.append(tok)
            node = nxt
        self.state.select(keep)
        self._slots = {}

    def propose(self, ctx: DraftContext) -> Proposal:
        depth_cap = min(self.k, ctx.max_k)
        self._keep_accepted(ctx.ids)
        if depth_cap <= 0:
            return Proposal([])
        ids = ctx.ids
        common = 0
        lim = min(len(self.seen), len(ids) - 1)
        while common < lim and self.seen[common] == ids[common]:
            common += 1
        if common < len(self.seen):
            self.state.crop(common)
            del self.seen[common:]
        feed = ids[common:]
        root = self.state.forward(feed, last_only=True)[-1]
        self.seen.extend(feed)
        if self.all_widths:
            return self._every_tree(root, depth_cap, ctx)
        sampling = ctx.temperature > 0 and self.shape is not None
        x = self._expand(root, self.branch, depth_cap, ctx, sampling)
        tok_ids, parents, q_rows, q_tok, slot_of = x.ids, x.parents, x.q_rows, x.q_tok, x.slot_of
        if self.shape is None and len(tok_ids) > self.nodes:  # keep the `nodes` most probable: still a tree
            keep = x.best(self.nodes, depth_cap)
            renum = {old: new for new, old in enumerate(keep)}
            tok_ids = [tok_ids[i] for i in keep]
            parents = [renum[parents[i]] if parents[i] >= 0 else -1 for i in keep]
            q_rows = [q_rows[i] for i in keep]
            q_tok = [q_tok[i] for i in keep]
            slot_of = {-1: slot_of[-1], **{renum[i]: s for i, s in slot_of.items() if i in renum}}
        tree = DraftTree(tok_ids, parents, torch.stack(q_rows) if sampling and q_rows else None, q_tok)
        self._tree = tree
        self._slots = {i: s for i, s in slot_of.items() if i >= 0}
        return Proposal(tok_ids, tree.q, q_tok, x.forwards, parents=parents)

    def _expand(self, root: torch.Tensor, branch: int, depth_cap: int, ctx: DraftContext, sampling: bool) -> _Expansion:
        """Grow the tree from the root's logits: each level's frontier expanded with its `width` best tokens (the
        shape's, else `branch`); a dynamic tree feeds only its `branch` most probable new nodes to the next level.
        Nodes of every level but the last are fed to the draft (new cache slots)."""

        def dist(logits: torch.Tensor) -> torch.Tensor:
            if ctx.temperature > 0:
                return warp(logits[None], ctx.temperature, ctx.top_k, ctx.top_p)[0]
            return logits.softmax(-1)

        x = _Expansion(slot_of={-1: len(self.seen) - 1})
        frontier: list[tuple[int, torch.Tensor]] = [(-1, root)]
        for level in range(depth_cap):
            width = self.shape[level] if self.shape else branch
            new: list[int] = []
            for node, logits in frontier:
                if node >= 0 and x.ids[node] in ctx.eos_ids:
                    continue
                q = dist(logits)
                b = min(width, int((q > 0).sum()))
                if b <= 0:
                    continue
                picks = torch.multinomial(q, b, replacement=False, generator=ctx.generator) if sampling else torch.topk(q, b).indices
                base = x.score[node] if node >= 0 else 1.0
                for t in picks.tolist():
                    x.ids.append(int(t))
                    x.parents.append(node)
                    x.depth.append(level + 1)
                    x.q_rows.append(q)
                    x.q_tok.append(float(q[t]))
                    x.score.append(base * x.q_tok[-1])
                    new.append(len(x.ids) - 1)
            if not new or level == depth_cap - 1:
                break
            if self.shape is None:  # dynamic: expand the `branch` most probable paths only
                new = sorted(sorted(new, key=lambda i: (-x.score[i], i))[:branch])
            start = self.state.length
            out = self.state.forward_tree([x.ids[i] for i in new], [x.slot_of[x.parents[i]] for i in new])
            x.forwards += 1
            for j, i in enumerate(new):
                x.slot_of[i] = start + j
            frontier = list(zip(new, out, strict=True))
        return x

    def _every_tree(self, root: torch.Tensor, depth_cap: int, ctx: DraftContext) -> Proposal:
        """The setup finder's calibration of dynamic trees (greedy): one expansion per branch width 2 … `branch` from
        the same root, and the union of every tree they give — each width's `nodes` most probable nodes (n in
        app.core.tuning.DYN_NODES, n ≤ `nodes`) down to each depth (≤ `depth`) — with each node's mask of the trees
        that hold it (app.core.tuning.tree_bit). A search the token budget cut short is what deeper trees would
        draft there too."""
        from app.core.tuning import DYN_NODES, tree_bit

        pt = PrefixTree()
        slots: dict[int, int] = {}
        src: dict[int, int] = {}  # union node → the width whose draft cache slot it keeps (its path's, all one width's)
        forwards = 1
        for b in range(self.branch, 1, -1):  # the widest first: it feeds the most nodes to the draft
            x = self._expand(root, b, depth_cap, ctx, False)
            forwards += x.forwards - 1  # its levels below the root (the root's forward is shared)
            key: list[tuple[int, ...]] = []
            for t, par in zip(x.ids, x.parents, strict=True):
                key.append((key[par] if par >= 0 else ()) + (t,))
            tagged: dict[int, int] = {}
            for d in range(1, self.depth + 1):
                for n in (n for n in DYN_NODES if n <= self.nodes):
                    for i in x.best(n, min(d, depth_cap)):
                        tagged[i] = tagged.get(i, 0) | tree_bit(b, d, n)
            for i in sorted(tagged, key=lambda i: (x.depth[i], i)):  # parents first
                j = pt.add(key[i], x.q_tok[i], tagged[i])
                # a slot attends to its parent's slot of the same width: keep it only where the parent kept that width's
                if i in x.slot_of and j not in slots and (pt.parents[j] < 0 or src.get(pt.parents[j]) == b):
                    slots[j], src[j] = x.slot_of[i], b
        self._tree = pt.tree()
        self._slots = slots
        return Proposal(pt.ids, None, pt.q, forwards, parents=pt.parents, searches=pt.masks)

    def feedback(self, drafted: int, accepted: int) -> None:
        pass
