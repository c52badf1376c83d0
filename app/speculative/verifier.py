"""Verification of drafts: pure functions of logits/probabilities and draft ids.

* greedy: accept the longest prefix on which the target's argmax agrees, then the target's own token.
* speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept d_i with probability
  min(1, p_i(d_i) / q_i(d_i)); on the first rejection resample from norm(max(0, p_i − q_i)); when all k are
  accepted draw a bonus token from p_k. The emitted sequence is distributed exactly as sampling from p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Verdict", "warp", "verify_greedy", "verify_sampling", "sample"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """accepted: a_t; target_id: the correction (a_t < k) or bonus (a_t == k) token."""

    accepted: int
    target_id: int

    def kind(self, k: int) -> str:
        return "baseline" if k == 0 else ("bonus" if self.accepted == k else "correction")


def warp(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Logits [n, V] → probabilities [n, V] after temperature, top-k and top-p (nucleus) filtering.

    temperature 0 gives a one-hot on the argmax (the greedy distribution).
    """
    logits = logits.float()
    if temperature == 0.0:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    x = logits / temperature
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]  # [n, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, idx = torch.sort(x, dim=-1, descending=True)
        probs = sorted_x.softmax(-1)
        cum = probs.cumsum(-1)
        remove = (cum - probs) >= top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_x = sorted_x.masked_fill(remove, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, idx, sorted_x)
    return x.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one id from a probability vector [V]."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def verify_greedy(target_logits: torch.Tensor, drafted: list[int]) -> Verdict:
    """Greedy verification.

    Args:
        target_logits: [k + 1, V]; row i is the target's distribution after the i-th drafted token
            (row 0: after the context).
        drafted: k draft ids.
    """
    preds = target_logits.argmax(-1).tolist()  # [k + 1]
    a = 0
    while a < len(drafted) and preds[a] == drafted[a]:
        a += 1
    return Verdict(accepted=a, target_id=int(preds[a]))


def verify_sampling(
    p: torch.Tensor,
    q: torch.Tensor | None,
    drafted: list[int],
    generator: torch.Generator | None,
) -> Verdict:
    """Speculative sampling verification.

    Args:
        p: target probabilities [k + 1, V] (already warped).
        q: draft probabilities [k, V] the drafts were sampled from, or None for a deterministic drafter
            (n-gram: q is a point mass on each drafted token).
        drafted: k draft ids.
        generator: source of randomness (seeded per lane for reproducible runs).
    """
    k = len(drafted)
    if k == 0:
        return Verdict(0, sample(p[0], generator))
    idx = torch.tensor(drafted, device=p.device)
    p_d = p[:k].gather(-1, idx[:, None])[:, 0]  # [k]
    q_d = q[:k].gather(-1, idx[:, None])[:, 0] if q is not None else torch.ones_like(p_d)
    u = torch.rand(k, generator=generator, device=p.device if generator is None else generator.device).to(p.device)
    ratio = torch.where(q_d > 0, p_d / q_d.clamp_min(1e-30), torch.zeros_like(p_d))
    ok = (u < ratio).tolist()  # accept d_i with probability min(1, p/q)
    for i in range(k):
        if not ok[i]:
            if q is not None:
                residual = (p[i] - q[i]).clamp_min(0.0)
            else:
                residual = p[i].clone()
                residual[drafted[i]] = 0.0
            s = residual.sum()
            residual = residual / s if s > 0 else p[i]
            return Verdict(i, sample(residual, generator))
    return Verdict(k, sample(p[k], generator))
