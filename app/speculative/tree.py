"""Token trees: drafts that branch, verified in one target forward (SpecInfer, Medusa, EAGLE-2, ReDrafter).

A :class:`DraftTree` holds n drafted nodes in topological order (every parent before its children): node i is the
token `ids[i]`, child of node `parents[i]` (−1: the root, which is the last token already in the sequence). Siblings
are distinct tokens. The target runs once over every node, each seeing the context and its own ancestors only
(a tree attention mask, position = context length + depth); row 0 of its output is the root's next-token
distribution and row i + 1 node i's.

Verification walks down from the root:

* greedy: go to the child whose token is the target's argmax; stop where none is, and emit the argmax there.
* sampling: recursive rejection sampling over the children of the current node (SpecInfer's multi-candidate rule;
  Jeon et al. 2024, "Recursive Speculative Decoding", for candidates drawn without replacement). With `q` (children
  drawn one after another without replacement from the draft's distribution at their parent), child x is accepted
  with probability min(1, r(x) / q'(x)), r being the target's distribution and q' the draft's with the siblings
  already tried removed; on a rejection r ← norm(max(0, r − q')), and x is removed from q'. Without `q` (candidates
  chosen deterministically: top-k, n-gram), x is accepted with probability r(x) and on a rejection r(x) ← 0. After
  the last rejected child, the emitted token is drawn from r. Either way each emitted token is distributed exactly as
  the target's: lossless, whatever the tree's shape (which may depend on the draft, never on the target's coins).

A chain (each node one child) verified this way is the usual speculative sampling (Leviathan et al. 2023), so the
loop sends chain-shaped proposals down the chain path and today's lanes keep their numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from app.speculative.verifier import sample

__all__ = ["DraftTree", "PrefixTree", "TreeVerdict", "verify_tree_greedy", "verify_tree_sampling", "parse_shape", "chain_parents"]


def chain_parents(n: int) -> list[int]:
    """Parents of a chain of n nodes: [-1, 0, 1, …]."""
    return list(range(-1, n - 1))


def parse_shape(text: str) -> list[int]:
    """`3x2x1` → [3, 2, 1]: the root gets 3 children, each of them 2, each of those 1.

    Raises:
        ValueError: not a positive-integer product, or too large (> 64 children in a level, > 16 levels).
    """
    parts = text.lower().replace("×", "x").split("x")
    try:
        shape = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"a tree shape is branch counts per depth joined by x, e.g. 3x2x1, got {text!r}") from None
    if not shape or any(b < 1 for b in shape):
        raise ValueError(f"every branch count of a tree shape must be >= 1, got {text!r}")
    if len(shape) > 16:
        raise ValueError(f"a tree shape has at most 16 levels, got {len(shape)}")
    width = 1
    for b in shape:
        width *= b
        if width > 64:
            raise ValueError(f"tree shape {text!r} has more than 64 nodes in one level")
    return shape


@dataclass
class DraftTree:
    """A drafted token tree.

    Attributes:
        ids: node tokens, parents before children.
        parents: parent node of each node (−1: the root).
        q: [n, V] draft distribution each node was drawn from (its parent's, siblings drawn one after another without
            replacement), or None for deterministically chosen candidates.
        q_drafted: the draft's probability of each node's token (tooltips).
    """

    ids: list[int]
    parents: list[int]
    q: torch.Tensor | None = None
    q_drafted: list[float] | None = None
    _kids: list[list[int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.parents):
            raise ValueError(f"{len(self.ids)} ids but {len(self.parents)} parents")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i}: parent {p} is not an earlier node or the root (-1)")

    def __len__(self) -> int:
        return len(self.ids)

    def children(self, node: int) -> list[int]:
        """Children of `node` (−1: the root), in drafting order (the draft's first choice first)."""
        if self._kids is None:
            kids: list[list[int]] = [[] for _ in range(len(self.ids) + 1)]
            for i, p in enumerate(self.parents):
                kids[p + 1].append(i)
            self._kids = kids
        return self._kids[node + 1]

    def depths(self) -> list[int]:
        """Depth of each node (the root's children are at depth 1)."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    @property
    def depth(self) -> int:
        return max(self.depths(), default=0)

    def is_chain(self) -> bool:
        return self.parents == chain_parents(len(self.parents))

    def main_line(self, node: int) -> list[int]:
        """Nodes below `node` following first children (the draft's top choice at each depth)."""
        out: list[int] = []
        kids = self.children(node)
        while kids:
            out.append(kids[0])
            kids = self.children(kids[0])
        return out


class PrefixTree:
    """Token paths from the root merged into one tree (beams, or several trees' nodes): a path's node is added once,
    after its parent's, and carries the OR of the masks it was added with (which trees hold it: the setup finder's
    calibrations). Attributes: ids, parents, q (the drafter's probability of each node's token), masks."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.parents: list[int] = []
        self.q: list[float] = []
        self.masks: list[int] = []
        self._node: dict[tuple[int, ...], int] = {}

    def __contains__(self, path: tuple[int, ...]) -> bool:
        return path in self._node

    def add(self, path: tuple[int, ...], q: float, mask: int = 0) -> int:
        """The node of `path` (its parent's path must be in already), added if new; `mask` ORed into its mask."""
        j = self._node.get(path)
        if j is None:
            j = self._node[path] = len(self.ids)
            self.ids.append(path[-1])
            self.parents.append(self._node[path[:-1]] if len(path) > 1 else -1)
            self.q.append(q)
            self.masks.append(0)
        self.masks[j] |= mask
        return j

    def tree(self) -> DraftTree:
        return DraftTree(self.ids, self.parents, None, self.q)


@dataclass(frozen=True, slots=True)
class TreeVerdict:
    """path: the accepted nodes from the root down; target_id: the target's token after the path (correction, or
    bonus when the path ends at a leaf)."""

    path: tuple[int, ...]
    target_id: int

    def is_bonus(self, tree: DraftTree) -> bool:
        last = self.path[-1] if self.path else -1
        return bool(self.path) and not tree.children(last)


def verify_tree_greedy(logits: torch.Tensor, tree: DraftTree) -> TreeVerdict:
    """Greedy verification of a tree.

    Args:
        logits: [n + 1, V]: row 0 the target's distribution after the root, row i + 1 after node i.
    """
    preds = logits.argmax(-1).tolist()
    node, path = -1, list[int]()
    while True:
        want = preds[node + 1]
        nxt = next((c for c in tree.children(node) if tree.ids[c] == want), None)
        if nxt is None:
            return TreeVerdict(tuple(path), int(want))
        path.append(nxt)
        node = nxt


def verify_tree_sampling(p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None) -> TreeVerdict:
    """Lossless multi-candidate verification (recursive rejection sampling, see the module's docstring).

    Args:
        p: target probabilities [n + 1, V] (already warped), rows as in :func:`verify_tree_greedy`.
        tree: the drafts; `tree.q` the draft distributions they were drawn from, or None (deterministic candidates).
        generator: the lane's random source.
    """
    node, path = -1, []
    while True:
        kids = tree.children(node)
        r = p[node + 1]
        if kids:
            u = torch.rand(len(kids), generator=generator).tolist()
            r = r.clone()
            qr = tree.q[kids[0]].clone() if tree.q is not None else None
            nxt = None
            for c, uc in zip(kids, u, strict=True):
                x = tree.ids[c]
                if qr is not None:
                    qx = float(qr[x])
                    if qx > 0 and uc < min(1.0, float(r[x]) / qx):
                        nxt = c
                        break
                    r = (r - qr).clamp_min(0.0)
                    qr[x] = 0.0
                    s = float(qr.sum())
                    if s > 0:
                        qr /= s
                else:
                    if uc < float(r[x]):
                        nxt = c
                        break
                    r[x] = 0.0
                s = float(r.sum())
                r = r / s if s > 0 else p[node + 1]
            if nxt is not None:
                path.append(nxt)
                node = nxt
                continue
        return TreeVerdict(tuple(path), sample(r, generator))
