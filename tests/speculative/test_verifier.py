"""Verifier: literal tables (logits whose argmax is the intended token) and a seeded statistical test that
speculative sampling preserves the target distribution (and that a broken acceptance rule does not)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from app.speculative.verifier import Verdict, verify_greedy, verify_sampling, warp

V = 6


def onehot_logits(ids: list[int]) -> torch.Tensor:
    x = torch.full((len(ids), V), -5.0)
    for i, t in enumerate(ids):
        x[i, t] = 5.0
    return x


@pytest.mark.parametrize(
    "target_argmax, drafted, expected",
    [
        ([1, 2, 3, 4], [1, 2, 3], Verdict(3, 4)),  # all accepted + bonus
        ([1, 2, 3, 4], [1, 5, 3], Verdict(1, 2)),  # mismatch at position 2 -> correction 2
        ([0, 2, 3, 4], [1, 2, 3], Verdict(0, 0)),  # first rejected
        ([4], [], Verdict(0, 4)),  # baseline step
    ],
)
def test_greedy_table(target_argmax, drafted, expected):
    v = verify_greedy(onehot_logits(target_argmax), drafted)
    assert v == expected
    assert v.kind(len(drafted)) == ("baseline" if not drafted else "bonus" if v.accepted == len(drafted) else "correction")


def test_warp_greedy_topk_topp():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert warp(logits, 0.0).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    p = warp(logits, 1.0, top_k=2)
    assert (p[0, [0, 3]] == 0).all() and p.sum().item() == pytest.approx(1.0)
    full = logits.softmax(-1)[0]
    p = warp(logits, 1.0, top_p=float(full[1]) + 1e-4)  # needs the top two tokens
    assert (p[0] > 0).tolist() == [False, True, True, False]
    p = warp(logits, 1.0, top_p=0.01)  # always keeps the most likely token
    assert p[0].tolist() == [0.0, 1.0, 0.0, 0.0]


def _first_token_dist(p, q, n, rule, seed=0, k=2):
    """Run one speculative step n times (draft from q, verify against p); histogram of the first emitted token."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    for _ in range(n):
        drafted = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)]
        v = rule(p, q, drafted, g)
        first = drafted[0] if v.accepted >= 1 else v.target_id
        counts[first] += 1
    return counts


def broken_rule(p, q, drafted, g):
    """Accept with min(1, p/q) but resample from p (not the residual): biased towards the draft."""
    u = torch.rand(len(drafted), generator=g)
    for i, d in enumerate(drafted):
        if u[i] >= min(1.0, float(p[i, d] / q[i, d])):
            return Verdict(i, int(torch.multinomial(p[i], 1, generator=g)))
    return Verdict(len(drafted), int(torch.multinomial(p[len(drafted)], 1, generator=g)))


def _dists(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(3, V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(3, V, generator=g) * 1.5, -1)
    return p, q


@pytest.mark.parametrize("seed", [1, 2])
def test_speculative_sampling_preserves_target_distribution(seed):
    p, q = _dists(seed)
    n = 20000
    counts = _first_token_dist(p, q, n, verify_sampling, seed=seed)
    stat = chisquare(counts.numpy(), (p[0] * n).numpy())
    assert stat.pvalue > 1e-3, (counts / n, p[0])
    broken = _first_token_dist(p, q, n, broken_rule, seed=seed)
    assert chisquare(broken.numpy(), (p[0] * n).numpy()).pvalue < 1e-6  # the test has power


def test_second_token_distribution_after_acceptance():
    """Conditioned on the first draft being accepted, the second emitted token follows p[1]."""
    p, q = _dists(3)
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(V)
    n = 0
    while n < 15000:
        drafted = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
        v = verify_sampling(p, q, drafted, g)
        if v.accepted >= 1:
            counts[drafted[1] if v.accepted >= 2 else v.target_id] += 1
            n += 1
    assert chisquare(counts.numpy(), (p[1] * n).numpy()).pvalue > 1e-3


def test_point_mass_drafts_ngram_preserve_distribution():
    """n-gram drafts are deterministic (q = point mass): accept with p(d), else sample p without d."""
    p, _ = _dists(4)
    g = torch.Generator().manual_seed(4)
    counts = torch.zeros(V)
    n = 20000
    for _ in range(n):
        v = verify_sampling(p, None, [2, 3], g)
        counts[2 if v.accepted >= 1 else v.target_id] += 1
    assert chisquare(counts.numpy(), (p[0] * n).numpy()).pvalue > 1e-3
