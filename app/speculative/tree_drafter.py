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

from typing import Any

import torch

from app.speculative.drafters import DraftContext, Proposal
from app.speculative.tree import DraftTree
from app.speculative.verifier import warp

__all__ = ["TreeDrafter"]


class TreeDrafter:
    """A draft model proposing a token tree each step.

    Args:
        engine: the draft engine (its decode states need forward_tree/select: the hf and llamacpp backends).
        shape: branch counts per depth (static tree), or None for a dynamic tree.
        nodes, depth, branch: the dynamic tree's node budget, depth and expansion width.
    """

    wants_hidden = False

    def __init__(self, engine, shape: list[int] | None = None, nodes: int = 16, depth: int = 6, branch: int = 4) -> None:
        self.engine = engine
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
        sampling = ctx.temperature > 0 and self.shape is not None

        def dist(logits: torch.Tensor) -> torch.Tensor:
            if ctx.temperature > 0:
                return warp(logits[None], ctx.temperature, ctx.top_k, ctx.top_p)[0]
            return logits.softmax(-1)

        tok_ids: list[int] = []
        parents: list[int] = []
        q_rows: list[torch.Tensor] = []
        q_tok: list[float] = []
        score: list[float] = []  # path probability under the draft
        slot_of: dict[int, int] = {-1: len(self.seen) - 1}
        frontier: list[tuple[int, torch.Tensor]] = [(-1, root)]
        forwards = 1
        for level in range(depth_cap):
            width = self.shape[level] if self.shape else self.branch
            new: list[int] = []
            for node, logits in frontier:
                if node >= 0 and tok_ids[node] in ctx.eos_ids:
                    continue
                q = dist(logits)
                b = min(width, int((q > 0).sum()))
                if b <= 0:
                    continue
                picks = torch.multinomial(q, b, replacement=False, generator=ctx.generator) if sampling else torch.topk(q, b).indices
                base = score[node] if node >= 0 else 1.0
                for t in picks.tolist():
                    tok_ids.append(int(t))
                    parents.append(node)
                    q_rows.append(q)
                    q_tok.append(float(q[t]))
                    score.append(base * q_tok[-1])
                    new.append(len(tok_ids) - 1)
            if not new or level == depth_cap - 1:
                break
            if self.shape is None:  # dynamic: expand the `branch` most probable paths only
                new = sorted(sorted(new, key=lambda i: (-score[i], i))[: self.branch])
            start = self.state.length
            out = self.state.forward_tree([tok_ids[i] for i in new], [slot_of[parents[i]] for i in new])
            forwards += 1
            for j, i in enumerate(new):
                slot_of[i] = start + j
            frontier = list(zip(new, out, strict=True))
        if self.shape is None and len(tok_ids) > self.nodes:  # keep the `nodes` most probable: still a tree
            keep = sorted(sorted(range(len(tok_ids)), key=lambda i: (-score[i], i))[: self.nodes])
            renum = {old: new for new, old in enumerate(keep)}
            tok_ids = [tok_ids[i] for i in keep]
            parents = [renum[parents[i]] if parents[i] >= 0 else -1 for i in keep]
            q_rows = [q_rows[i] for i in keep]
            q_tok = [q_tok[i] for i in keep]
            slot_of = {-1: slot_of[-1], **{renum[i]: s for i, s in slot_of.items() if i in renum}}
        tree = DraftTree(tok_ids, parents, torch.stack(q_rows) if sampling and q_rows else None, q_tok)
        self._tree = tree
        self._slots = {i: s for i, s in slot_of.items() if i >= 0}
        return Proposal(tok_ids, tree.q, q_tok, forwards, parents=parents)

    def feedback(self, drafted: int, accepted: int) -> None:
        pass
