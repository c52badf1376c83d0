"""`redrafter:<head>`: a ReDrafter head trained here drafts beams from the target's hidden state; one tree verifies them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.core.errors import SetupError
from app.core.setups import SetupBase, SetupKind, engine_arg, param, register

__all__ = ["ReDrafter", "KIND"]


@dataclass(frozen=True)
class ReDrafter(SetupBase):
    """A recurrent draft head (Apple's ReDrafter) on the target's last hidden state: beam search `beams` wide and
    `depth` deep, the beams merged into a prefix tree the target verifies in one forward (app.speculative.redrafter).
    The defaults (2 beams × 2, int8 output layer) are the fastest measured on a 2-core CPU, where every tree node
    and every byte the head reads costs; a GPU affords the paper's wider trees (beams=4 or more, depth=4).
    Train a head for a target with `python -m app train-drafter --target <engine>`; the head is named after the colon.
    `widths=all` is the setup finder's calibration lane (every narrower, shallower tree verified at once).
    """

    prefix = "redrafter"

    engine: str = engine_arg("head", help="a head trained with `python -m app train-drafter` (its name, or its folder)",
                             example="qwen2.5-coder-1.5b-instruct-redrafter")
    beams: int = param(2, min=1, max=16, always=True, help="beams of the head's beam search (the tree's leaves, at most)")
    depth: int = param(2, min=1, max=16, always=True, help="tokens each beam drafts (the tree's depth)")
    cstop: float = param(0.0, min=0.0, max=1.0, max_exclusive=True, gui="cstop",
                         help="leave out tree nodes whose path probability under the head is below this (0: the whole beam tree)")
    dtype: str | None = param(None, choices=("float32", "int8"), unset="int8 where this CPU runs int8 linears",
                              help="the head's output layer precision on a CPU (int8: a quarter of the bytes each level reads; drafts only)")
    widths: str | None = param(None, choices=("all",), unset="one search, `beams` wide and `depth` deep",
                               help="all: verify every beam tree up to `beams` wide and `depth` deep at once, each node tagged "
                                    "with the trees that hold it (the setup finder's calibration: it prices each of them from one run)")


def build(setup: ReDrafter, env):
    from app.speculative.loop import LoopRunner
    from app.speculative.redrafter import ReDrafterDrafter, for_inference, load_head

    target = env.target()
    head, m = load_head(setup.engine)
    train = f"python -m app train-drafter --target {target.name} --kind redrafter"
    if m.target != target.name:
        raise SetupError(f"ReDrafter head {m.name} was trained for {m.target}, not for the target {target.name}",
                         fix=f"run it with --target {m.target}, or train a head for {target.name}: {train}")
    weights = Path(str(getattr(target, "folder", ""))).name
    if m.target_weights and weights and Path(m.target_weights).name != weights:
        raise SetupError(f"ReDrafter head {m.name} was trained on other weights of {target.name} ({Path(m.target_weights).name}, "
                         f"loaded: {weights})", fix=f"train it again for these weights: {train} --name {m.name} --fresh")
    if not target.supports_hidden or not target.supports_tree:
        raise SetupError(f"{target.name} ({target.backend}) cannot give its hidden states or verify a tree",
                         fix="ReDrafter lanes run on hf (PyTorch) targets")
    embed = target.input_embeddings.detach()
    if head.cfg.hidden != embed.shape[1] or head.cfg.target_vocab != target.vocab_size:
        raise SetupError(f"ReDrafter head {m.name} does not fit {target.name} (hidden {head.cfg.hidden} vs {embed.shape[1]}, "
                         f"vocab {head.cfg.target_vocab} vs {target.vocab_size})", fix=f"train it again: {train} --name {m.name} --fresh")
    if embed.device.type == "cpu":
        head = for_inference(head, setup.dtype)
    return LoopRunner(target, ReDrafterDrafter(head, embed, setup.beams, setup.depth, setup.cstop, setup.widths == "all"), costs=env.lane_costs(target))


KIND = register(SetupKind(ReDrafter, "ReDrafter head", "a trained recurrent head drafts beams from the target's hidden state; one tree verifies them", build))
