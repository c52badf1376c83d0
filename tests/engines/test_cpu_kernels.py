from __future__ import annotations

import pytest
import torch

from app.engines import cpu_kernels
from app.engines.cpu_kernels import PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="oneDNN packed linear ops unavailable in this torch build")


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32, bias=False))


def test_packed_model_matches_the_original_for_1_to_8_rows():
    m = model()
    x = [torch.randn(1, n, 64) for n in (1, 2, 5, 8)]
    with torch.inference_mode():
        ref = [m(t) for t in x]
        assert pack_linears(m) == 2
        assert all(isinstance(mod, PackedLinear) for mod in (m[0], m[2]))
        for t, r in zip(x, ref, strict=False):
            assert torch.allclose(m(t), r, atol=1e-5, rtol=1e-4)


def test_opt_out_and_non_fp32_layers_are_left_alone(monkeypatch):
    m = model()
    monkeypatch.setenv("SPECDECK_CPU_GEMM", "default")
    assert pack_linears(m) == 0 and type(m[0]) is torch.nn.Linear
    monkeypatch.delenv("SPECDECK_CPU_GEMM")
    assert pack_linears(model().to(torch.bfloat16)) == 0


def test_a_failing_self_check_keeps_the_default_path(monkeypatch):
    m = model()
    monkeypatch.setattr(PackedLinear, "forward", lambda self, x: torch.zeros(*x.shape[:-1], self.out_features))
    assert pack_linears(m) == 0 and type(m[0]) is torch.nn.Linear
