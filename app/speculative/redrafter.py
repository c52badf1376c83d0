"""ReDrafter: a small recurrent head on the target's last hidden state drafts beams, merged into one token tree.

After Cheng et al. 2024 ("Recurrent Drafter for Fast Speculative Decoding", Apple; in TensorRT-LLM). The head sees
h, the target's final (normed) hidden state at the last accepted position — the one that produced the token just
emitted — and the embeddings of the tokens drafted so far:

    g_0 = 0,   g_j = SiLU(W e(x_j) + U g_{j−1} + b)          x_1: the token the target just emitted
    z_j = MLP([g_j; h]) + g_j                                 (two linears, SiLU between)
    logits_j = O · RMSNorm(z_j)                               O: a reduced vocabulary (the training labels' most
                                                              frequent target tokens, EAGLE-3 style), initialised
                                                              from the target's output rows, trained

Beam search of width B over D steps gives B beams; beams sharing a prefix share nodes, so the target verifies one
prefix tree (app.speculative.tree) and keeps the longest path it agrees with. Candidates are the head's top tokens
(deterministic), verified as point masses: lossless for greedy and sampling alike.

A head is trained for one target by `python -m app train-drafter` (app.commands.train_drafter, app.speculative.redrafter_training) and stored with a manifest in
the cache (:func:`heads_dir`): `head.safetensors` (float32) and `head.json`. The target's embedding is not stored:
it is borrowed from the loaded target.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from app.core.errors import SetupError
from app.core.paths import cache_root
from app.core.tuning import search_bit
from app.speculative.drafters import DraftContext, Proposal
from app.speculative.tree import DraftTree, PrefixTree

__all__ = ["HEAD_DTYPES", "for_inference", "HeadConfig", "ReDrafterHead", "HeadManifest", "heads_dir", "find_head", "list_heads", "load_head", "save_head",
           "beam_tree", "beam_trees", "ReDrafterDrafter"]


def heads_dir() -> Path:
    """Where trained heads live: $SPECDECK_HEADS, else $XDG_CACHE_HOME/specdeck/heads."""
    if os.environ.get("SPECDECK_HEADS"):
        return Path(os.environ["SPECDECK_HEADS"])
    return cache_root() / "heads"


HEAD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def head_folder(name: str) -> Path:
    """The folder of the head called `name`: always a direct child of :func:`heads_dir` (what `--fresh` may delete).

    Raises:
        SetupError: a name that is not a plain name (a path, `..`, a separator, a leading dot, other characters).
    """
    if not HEAD_NAME.fullmatch(name) or ".." in name:
        raise SetupError(f"head name {name!r} is not a plain name: it names a folder inside {heads_dir()}, never a path",
                         fix="use letters, digits, '.', '_' and '-' (at most 100, not starting with '.'), e.g. --name my-head")
    return heads_dir() / name


@dataclass
class HeadConfig:
    hidden: int  # the target's hidden size
    vocab: int  # rows of the reduced output layer
    target_vocab: int  # the target's vocabulary (ids the reduced rows map to)


@dataclass
class HeadManifest:
    """head.json: what the head is, for which target, and how it was trained."""

    name: str
    kind: str
    target: str  # the engine name it was trained for
    target_weights: str  # the target's weights identity (the cache folder name: name and sha)
    config: dict
    training: dict = field(default_factory=dict)  # minutes, positions, data sources, held-out acceptance per depth

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


class _RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class ReDrafterHead(nn.Module):
    """The recurrent draft head (see the module's docstring). `vocab_ids[r]` is the target id of output row r."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.cfg = cfg
        self.w = nn.Linear(h, h)
        self.u = nn.Linear(h, h, bias=False)
        self.mlp1 = nn.Linear(2 * h, h)
        self.mlp2 = nn.Linear(h, h)
        self.norm = _RMSNorm(h)
        self.out = nn.Linear(h, cfg.vocab, bias=False)
        self.register_buffer("vocab_ids", torch.zeros(cfg.vocab, dtype=torch.long))
        nn.init.zeros_(self.mlp2.weight)
        nn.init.zeros_(self.mlp2.bias)
        nn.init.normal_(self.u.weight, std=0.02)

    def step(self, g: torch.Tensor, e: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One recurrent step. g: [..., H] state, e: [..., H] embedding of the input token, h: [..., H] target hidden.
        Returns (new state, logits over the reduced vocabulary [..., vocab])."""
        g = nn.functional.silu(self.w(e) + self.u(g))
        z = self.mlp2(nn.functional.silu(self.mlp1(torch.cat([g, h], -1)))) + g
        return g, self.out(self.norm(z))


def save_head(folder: Path, head: ReDrafterHead, manifest: HeadManifest) -> None:
    """Write head.safetensors and head.json into `folder` (atomically: temporary files renamed)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "head.safetensors.tmp"
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(tmp))
    os.replace(tmp, folder / "head.safetensors")
    tmpj = folder / "head.json.tmp"
    tmpj.write_text(manifest.to_json(), encoding="utf-8")
    os.replace(tmpj, folder / "head.json")


def list_heads() -> list[HeadManifest]:
    """Every trained head in the cache (unreadable manifests skipped)."""
    out = []
    root = heads_dir()
    for f in sorted(root.glob("*/head.json")) if root.is_dir() else []:
        try:
            out.append(HeadManifest(**json.loads(f.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):
            continue
    return out


def find_head(name: str) -> tuple[Path, HeadManifest]:
    """The folder and manifest of the head `name` (a name in the cache, or a folder holding head.json).

    Raises:
        SetupError: no such head (naming the trained ones and the command that trains one), or a broken manifest.
    """
    folder = Path(name).expanduser()
    if not (folder / "head.json").is_file():
        folder = heads_dir() / name
    f = folder / "head.json"
    if not f.is_file():
        have = ", ".join(m.name for m in list_heads()) or "none yet"
        raise SetupError(f"no ReDrafter head named {name!r} in {heads_dir()} (trained: {have})",
                         fix=f"train one: python -m app train-drafter --target <engine> --kind redrafter --name {name}")
    try:
        m = HeadManifest(**json.loads(f.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as e:
        raise SetupError(f"ReDrafter head {name!r}: {f} is unreadable ({type(e).__name__}: {e})",
                         fix=f"train it again: python -m app train-drafter --target <engine> --kind redrafter --name {name} --fresh") from None
    return folder, m


def load_head(name: str) -> tuple[ReDrafterHead, HeadManifest]:
    from safetensors.torch import load_file

    folder, m = find_head(name)
    head = ReDrafterHead(HeadConfig(**m.config))
    try:
        head.load_state_dict(load_file(str(folder / "head.safetensors")))
    except Exception as e:
        raise SetupError(f"ReDrafter head {m.name}: cannot load {folder / 'head.safetensors'} ({type(e).__name__}: {e})",
                         fix=f"train it again: python -m app train-drafter --target {m.target} --kind redrafter --name {m.name} --fresh") from None
    head.eval()
    return head, m


HEAD_DTYPES = ("float32", "int8")


def for_inference(head: ReDrafterHead, dtype: str | None = None) -> ReDrafterHead:
    """The head made cheap to run on a CPU, in place. Drafting is memory-bound here: each level of the beam search
    reads every weight once for a few rows (147 MB a level for a 1536-wide head over 16,384 tokens in float32, most
    of it the output layer), so the linears are oneDNN-packed (app.engines.cpu_kernels: the same outputs up to
    rounding, faster for few rows) and with `dtype="int8"` the output layer is int8 per channel (a quarter of the
    bytes; None: int8 where this torch/CPU runs int8 linears, else float32). The head's precision changes only what
    it drafts, never what the target emits.

    Raises:
        SetupError: int8 asked where this torch/CPU cannot run int8 linears.
    """
    from app.engines import cpu_kernels

    if dtype is None:
        dtype = "int8" if cpu_kernels.int8_available() else "float32"
    if dtype not in HEAD_DTYPES:
        raise SetupError(f"ReDrafter head precision {dtype!r} is not one of {', '.join(HEAD_DTYPES)}", fix="dtype=float32 or dtype=int8")
    if dtype == "int8":
        if not cpu_kernels.int8_available():
            raise SetupError("int8 linears (fbgemm/x86) are not available in this torch build or on this CPU",
                             fix="use dtype=float32 for the ReDrafter head")
        with torch.no_grad():
            head.out = cpu_kernels.int8_linear(head.out)
    cpu_kernels.pack_linears(head)
    head.eval()
    return head


def _search(head: ReDrafterHead, embed: torch.Tensor, h: torch.Tensor, last: int, depth: int, beams: int,
            eos_ids: frozenset[int]) -> list[list[tuple[float, list[int], list[float]]]]:
    """Beam search with the head from (h, last token), `beams` wide, `depth` levels: after each level the beams it
    would return if it stopped there — (score, tokens, the head's probability of each token), best first; beams that
    drafted an EOS stay finished. Stops early when every beam has finished (fewer levels returned)."""
    vid = head.vocab_ids
    hh = h.reshape(1, -1).float()
    g = torch.zeros(1, hh.shape[-1])
    toks = torch.tensor([last])
    score = torch.zeros(1)
    seqs: list[list[int]] = [[]]  # active beams, best first
    probs: list[list[float]] = [[]]  # the head's probability of each beam token
    finished: list[tuple[float, list[int], list[float]]] = []  # beams that drafted an EOS
    levels: list[list[tuple[float, list[int], list[float]]]] = []
    for _ in range(depth):
        g, logits = head.step(g, embed[toks].float(), hh.expand(g.shape[0], -1))
        logp = logits.float().log_softmax(-1)  # [b, vocab]
        width = logp.shape[1]
        top = torch.topk((score[:, None] + logp).reshape(-1), min(beams - len(finished), logp.numel()))
        b_idx = (top.indices // width).tolist()
        r_idx = top.indices % width
        new_toks = vid[r_idx].tolist()
        p_tok = logp[top.indices // width, r_idx].exp().tolist()
        keep = []
        for n, (b, t, pt) in enumerate(zip(b_idx, new_toks, p_tok, strict=True)):
            beam, pr = seqs[b] + [int(t)], probs[b] + [pt]
            if int(t) in eos_ids:
                finished.append((float(top.values[n]), beam, pr))
            else:
                keep.append((n, b, beam, pr))
        sel = torch.tensor([n for n, *_ in keep], dtype=torch.long)
        seqs, probs = [x[2] for x in keep], [x[3] for x in keep]
        score = top.values[sel]
        levels.append(sorted([(float(sc), s, p) for sc, s, p in zip(score.tolist(), seqs, probs, strict=True)] + finished,
                             key=lambda x: -x[0]))
        if not keep:
            break
        g = g[[x[1] for x in keep]]
        toks = torch.tensor([s[-1] for s in seqs])
    return levels


def _merge(ranked: list[tuple[list[int], list[float], int]], cstop: float) -> tuple[DraftTree, list[int]]:
    """Beams (tokens, probabilities, mask) merged into a prefix tree, level by level in the order given (so first
    children follow the first beam); each node's mask is the OR of the masks of the beams through it. Nodes whose
    path probability (the product of the head's probabilities from the root) is below `cstop` are left out, with
    their subtrees (probabilities ≤ 1: those are less likely still)."""
    pt = PrefixTree()
    for d in range(max((len(s) for s, _, _ in ranked), default=0)):
        for s, pr, m in ranked:
            key = tuple(s[: d + 1])
            if len(s) > d and (key in pt or (math.prod(pr[: d + 1]) >= cstop and (not d or key[:-1] in pt))):
                pt.add(key, pr[d], m)
    return pt.tree(), pt.masks


@torch.inference_mode()
def beam_tree(head: ReDrafterHead, embed: torch.Tensor, h: torch.Tensor, last: int, depth: int, beams: int,
              eos_ids: frozenset[int] = frozenset(), cstop: float = 0.0) -> DraftTree:
    """Beam search with the head from (h, last token), `beams` wide and `depth` deep; the beams merged into a prefix
    tree whose first children are the best beam's tokens.

    Args:
        embed: the target's input embedding matrix [V, H].
        h: the target's hidden state [H] at the last accepted position.
        last: the token the target emitted from h.
        cstop: nodes whose path probability under the head (the product of its token probabilities from the root:
            its own estimate that the target accepts the whole path) is below this are left out, with their subtrees
            — every node costs the target's forward some compute, and an unlikely one rarely pays it back.
    """
    return _beam_tree(head, embed, h, last, depth, beams, eos_ids, cstop)[0]


def _beam_tree(head: ReDrafterHead, embed: torch.Tensor, h: torch.Tensor, last: int, depth: int, beams: int,
               eos_ids: frozenset[int], cstop: float) -> tuple[DraftTree, int]:
    """:func:`beam_tree` and the head levels its search ran."""
    levels = _search(head, embed, h, last, depth, beams, eos_ids)
    return _merge([(s, p, 0) for _, s, p in (levels[-1] if levels else [])], cstop)[0], len(levels)


@torch.inference_mode()
def beam_trees(head: ReDrafterHead, embed: torch.Tensor, h: torch.Tensor, last: int, depth: int, beams: int,
               eos_ids: frozenset[int] = frozenset(), tag_depth: int | None = None) -> tuple[DraftTree, list[int], int]:
    """Every beam tree up to `beams` wide and `depth` deep at once (the setup finder's calibration): the union of the
    trees :func:`beam_tree` gives for each width w ≤ beams and depth d ≤ depth (one search per width; a search
    stopped after d levels returns the beams alive then), and per node a mask with app.core.tuning.search_bit(w, d) set where
    that tree holds it. Verifying the union tells, exactly for greedy decoding, how many tokens each of those trees
    would have had accepted here (the accepted path's prefix it holds). `tag_depth` (default `depth`): the deepest
    tree tagged — a search the token budget cut to `depth` levels is what every deeper tree would draft there too.
    Returns (tree, masks, head levels run)."""
    ranked: list[tuple[list[int], list[float], int]] = []
    runs = 0
    for w in range(1, beams + 1):
        levels = _search(head, embed, h, last, depth, w, eos_ids)
        runs += len(levels)
        for d in range(1, max(depth, tag_depth or 0) + 1):
            beams_d = levels[min(d, len(levels)) - 1] if levels else []
            ranked += [(s, p, search_bit(w, d)) for _, s, p in beams_d]
    tree, masks = _merge(ranked, 0.0)
    return tree, masks, runs


class ReDrafterDrafter:
    """Drafts with a trained ReDrafter head: beam search from the target's last hidden state, as a token tree.

    Args:
        head: the trained head; embed: the target's input embedding [V, H]; beams, depth: the beam search.
        all_widths: propose every tree up to `beams` wide and `depth` deep at once, each node tagged with the trees
            that hold it (:func:`beam_trees`; the setup finder's calibration lane).
    """

    wants_hidden = True  # the loop passes the target's hidden state at the last accepted position (ctx.hidden)

    def __init__(self, head: ReDrafterHead, embed: torch.Tensor, beams: int = 2, depth: int = 2, cstop: float = 0.0,
                 all_widths: bool = False) -> None:
        self.head = head
        self.embed = embed
        self.beams, self.depth, self.cstop = beams, depth, cstop
        self.all_widths = all_widths
        self.k = depth

    @property
    def shape_label(self) -> str:
        if self.all_widths:
            return f"ReDrafter every tree up to {self.beams} beams × {self.depth} (calibration)"
        return f"ReDrafter {self.beams} beams × {self.depth}" + (f", path p ≥ {self.cstop:g}" if self.cstop else "")

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        """The beam tree (its nodes' head probabilities as q_drafted; `forwards`: the head's levels run)."""
        depth = min(self.depth, ctx.max_k)
        h: Any = ctx.hidden
        if depth <= 0 or h is None:  # step 0 (no hidden state before the prompt's forward) or no budget
            return Proposal([])
        if self.all_widths:
            tree, masks, runs = beam_trees(self.head, self.embed, h, ctx.ids[-1], depth, self.beams, ctx.eos_ids, tag_depth=self.depth)
            return Proposal(tree.ids, None, tree.q_drafted, runs, parents=tree.parents, searches=masks)
        with torch.inference_mode():
            tree, levels = _beam_tree(self.head, self.embed, h, ctx.ids[-1], depth, self.beams, ctx.eos_ids, self.cstop)
        return Proposal(tree.ids, None, tree.q_drafted, levels, parents=tree.parents)

    def feedback(self, drafted: int, accepted: int) -> None:
        pass
