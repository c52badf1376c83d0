"""`tree:<engine>`: a draft model proposes a token tree; the target verifies every branch in one pass."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.errors import SetupError
from app.core.setups import DRAFT_DTYPES, SetupBase, SetupKind, engine_arg, param, register

__all__ = ["TreeDraft", "KIND"]


@dataclass(frozen=True)
class TreeDraft(SetupBase):
    """A draft model proposes a token tree each step, verified in one target forward with a tree attention mask
    (app.speculative.tree); the target keeps the longest path it agrees with, plus its own next token.

    shape: branch counts per depth, e.g. 3x2x1 (the draft's 3 best tokens, 2 below each, 1 below those: 15 nodes,
    3 draft forwards). Unset: a dynamic tree (EAGLE-2) — at each of `depth` levels the `branch` most probable paths
    are expanded with their `branch` best tokens, and the `nodes` most probable nodes are verified. `widths=all` is
    the setup finder's calibration lane (every smaller dynamic tree verified at once).
    """

    prefix = "tree"

    engine: str = engine_arg("draft", backends=("hf",), help="draft model: an hf engine sharing the target's tokenizer")
    shape: str | None = param(None, unset="dynamic (nodes, depth, branch)", metavar="AxBxC",
                              help="static tree: branch counts per depth joined by x, e.g. 3x2x1; unset: dynamic")
    nodes: int = param(16, min=1, max=128, help="dynamic tree: nodes verified per step")
    depth: int = param(5, min=1, max=16, help="dynamic tree: the deepest level drafted (draft forwards per step)")
    branch: int = param(4, min=1, max=16, help="dynamic tree: paths expanded per level, and tokens per expansion")
    dtype: str | None = param(None, choices=DRAFT_DTYPES, unset="target's dtype",
                              help="the draft's precision: float32 | bfloat16 | float16 | int8 (CPU); default: the target's")
    widths: str | None = param(None, choices=("all",), unset="one dynamic tree",
                               help="all: verify every dynamic tree up to `nodes`, `depth` and `branch` at once, each node tagged "
                                    "with the trees that hold it (the setup finder's calibration: it prices each of them from one run)")

    def problem(self) -> str:
        if self.shape is None:
            return ""
        if self.widths:
            return "widths=all calibrates dynamic trees: leave out shape"
        from app.speculative.tree import parse_shape

        try:
            parse_shape(self.shape)
        except ValueError as e:
            return str(e)
        if (self.nodes, self.depth, self.branch) != (16, 5, 4):
            return "nodes, depth and branch shape a dynamic tree: give them or a shape, not both"
        return ""


def build(setup: TreeDraft, env):
    from app.speculative.loop import LoopRunner
    from app.speculative.tree import parse_shape
    from app.speculative.tree_drafter import TreeDrafter

    target = env.target()
    draft = env.draft(setup.engine, setup.dtype)
    for role, e in (("target", target), ("draft", draft)):
        if not e.supports_tree:
            raise SetupError(f"{setup.label}: the {role} {e.name} ({e.backend}) cannot verify a token tree in one forward yet",
                             fix="tree lanes run on hf (PyTorch) and llamacpp engines: pick such a target and draft, or use draft:… for a chain")
    shape = parse_shape(setup.shape) if setup.shape else None
    return LoopRunner(target, TreeDrafter(draft, shape, setup.nodes, setup.depth, setup.branch, setup.widths == "all"), costs=env.lane_costs(target))


KIND = register(SetupKind(TreeDraft, "token tree", "a draft model proposes a token tree, the target verifies every branch at once", build))
