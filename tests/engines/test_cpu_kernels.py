from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
import torch

from app.engines import cpu_kernels
from app.engines.cpu_kernels import PackedLinear, copy_released, int8_available, int8_linear, pack_linears, release_file_pages

needs_onednn = pytest.mark.skipif(not cpu_kernels.available(), reason="oneDNN packed linear ops unavailable in this torch build")


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32, bias=False))


@needs_onednn
def test_packed_model_matches_the_original_for_1_to_8_rows():
    m = model()
    x = [torch.randn(1, n, 64) for n in (1, 2, 5, 8)]
    with torch.inference_mode():
        ref = [m(t) for t in x]
        assert pack_linears(m) == 2
        assert all(isinstance(mod, PackedLinear) for mod in (m[0], m[2]))
        for t, r in zip(x, ref, strict=False):
            assert torch.allclose(m(t), r, atol=1e-5, rtol=1e-4)


@needs_onednn
def test_opt_out_and_non_fp32_layers_are_left_alone(monkeypatch):
    m = model()
    monkeypatch.setenv("SPECDECK_CPU_GEMM", "default")
    assert pack_linears(m) == 0 and type(m[0]) is torch.nn.Linear
    monkeypatch.delenv("SPECDECK_CPU_GEMM")
    assert pack_linears(model().to(torch.bfloat16)) == 0


@needs_onednn
def test_a_failing_self_check_keeps_the_default_path(monkeypatch):
    m = model()
    monkeypatch.setattr(PackedLinear, "forward", lambda self, x: torch.zeros(*x.shape[:-1], self.out_features))
    assert pack_linears(m) == 0 and type(m[0]) is torch.nn.Linear


@needs_onednn
def test_a_later_failing_check_keeps_the_layers_already_checked(monkeypatch):
    """Layers go one at a time (largest first): those before the failing one stay packed, it and the rest do not."""
    m = model()
    real = PackedLinear.forward
    monkeypatch.setattr(PackedLinear, "forward", lambda self, x: real(self, x) if self.out_features != 32 else torch.zeros(*x.shape[:-1], 32))
    assert pack_linears(m) == 1 and isinstance(m[0], PackedLinear) and type(m[2]) is torch.nn.Linear


@needs_onednn
def test_packing_drops_each_original():
    """Nothing keeps an fp32 original beside its packed copy once the layer is swapped."""
    import weakref

    m = model()
    originals = [weakref.ref(m[0]), weakref.ref(m[2])]
    assert pack_linears(m) == 2
    assert all(r() is None for r in originals)


def _rss_file_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc are Linux's")
def test_release_file_pages_drops_a_mapped_weight_and_nothing_else(tmp_path):
    """A view of a mapped safetensors file loses its resident pages and still reads the same values (mapped again
    from the file); an ordinary tensor is left alone."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    save_file({"w": torch.randn(2048, 2048)}, tmp_path / "w.safetensors")  # 16 MiB
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        w = f.get_tensor("w")
    total = float(w.sum())
    before = _rss_file_mib()
    assert release_file_pages(w) >= w.numel() * 4
    assert _rss_file_mib() < before - 12
    assert float(w.sum()) == total
    plain = torch.randn(1024, 1024)
    copy = plain.clone()
    assert release_file_pages(plain) == 0 and torch.equal(plain, copy)


def test_copy_released_equals_to():
    t = torch.randn(3000, 70)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        out = copy_released(t, dtype)
        assert out.dtype == dtype and torch.equal(out, t.to(dtype)) and out.data_ptr() != t.data_ptr()
    assert torch.equal(copy_released(torch.arange(5), torch.bfloat16), torch.arange(5))  # integers keep their dtype
    assert copy_released(torch.tensor(2.5), torch.bfloat16).item() == 2.5


@pytest.mark.skipif(not int8_available(), reason="no int8 CPU kernels in this torch build")
@pytest.mark.parametrize("chunk_bytes", [None, 4096, 10_000])
def test_int8_linear_in_blocks_equals_from_float(chunk_bytes):
    """Quantizing a block of rows at a time gives from_float's int8 weights, scales, zero points and outputs."""
    import warnings

    import torch.ao.nn.quantized.dynamic as nnqd
    from torch.ao.quantization import per_channel_dynamic_qconfig

    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 301)
    x = torch.randn(5, 48)
    seen = []
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        lin.qconfig = per_channel_dynamic_qconfig
        ref = nnqd.Linear.from_float(lin)
        del lin.qconfig
        q = int8_linear(lin, chunk_bytes, on_block=(lambda rows, w: seen.append(w.shape[0])) if chunk_bytes else None)
        (wr, br), (wq, bq) = ref._packed_params._weight_bias(), q._packed_params._weight_bias()
        assert torch.equal(wr.int_repr(), wq.int_repr()) and torch.equal(br, bq)
        assert torch.equal(wr.q_per_channel_scales(), wq.q_per_channel_scales())
        assert torch.equal(wr.q_per_channel_zero_points(), wq.q_per_channel_zero_points())
        assert torch.equal(ref(x), q(x)) and (q.in_features, q.out_features) == (48, 301)
    if chunk_bytes:
        assert len(seen) > 1 and sum(seen) == 301  # the blocks cover every row once


@pytest.mark.skipif(not int8_available(), reason="no int8 CPU kernels in this torch build")
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_quantizes_each_token_of_a_long_forward_on_its_own_scale(monkeypatch, bias):
    """A forward over more than TOKEN_SCALED_ROWS tokens quantizes each token's activations on its own scale: one token
    with activations 50 times the others' (a prompt's attention sink) no longer sets the others' resolution — their
    error is what it is when each token is its own forward, where fbgemm's per-tensor quantization of the whole
    forward makes it tens of times larger. A forward over fewer tokens is fbgemm's call as it is, bit for bit; a layer
    given another's state (load_state_dict) or pickled computes as that one; and SPECDECK_INT8_ACTIVATIONS=tensor keeps
    fbgemm's call for every forward."""
    import warnings

    import torch.ao.nn.quantized.dynamic as nnqd

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 40, bias=bias)
    n = cpu_kernels.TOKEN_SCALED_ROWS + 4
    x = torch.randn(n, 64)
    x[0] *= 50.0

    def err(y: torch.Tensor) -> float:  # relative error over the ordinary tokens
        ref = lin(x).detach()
        return float((y - ref)[1:].norm() / ref[1:].norm())

    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        q = int8_linear(lin)
        assert isinstance(q, nnqd.Linear) and type(q).__name__ == "Int8Linear"
        per_tensor = nnqd.Linear.forward(q, x)  # fbgemm's own call over the whole forward
        alone = torch.cat([q(x[r : r + 1]) for r in range(n)])  # each token its own forward
        assert err(alone) < 0.03 and err(per_tensor) > 10 * err(alone)
        assert err(q(x)) < 1.5 * err(alone)
        assert torch.allclose(q(x)[0], lin(x)[0], rtol=0.05, atol=0.05 * float(lin(x)[0].abs().max()))  # the big one too
        short = x[: cpu_kernels.TOKEN_SCALED_ROWS]
        assert torch.equal(q(short), nnqd.Linear.forward(q, short))
        assert torch.equal(q(x.reshape(2, n // 2, 64)), q(x).reshape(2, n // 2, 40))  # leading dimensions kept
        other = torch.nn.Linear(64, 40, bias=bias)
        loaded = int8_linear(other)
        loaded.load_state_dict(q.state_dict())  # the bias the long path adds back is the loaded one
        assert torch.equal(loaded(x), q(x))
        assert torch.equal(pickle.loads(pickle.dumps(q))(x), q(x))
        monkeypatch.setenv("SPECDECK_INT8_ACTIVATIONS", "tensor")
        old = int8_linear(lin)
        assert torch.equal(old(x), per_tensor)


@pytest.mark.skipif(not int8_available(), reason="no int8 CPU kernels in this torch build")
def test_int8_linear_keeps_torchs_deprecation_warning_from_the_terminal():
    """torch 2.13 warns once per process (in C++) that its quantized tensors are deprecated: making int8 layers must
    not print it (a fresh process, warnings as errors; in this one it may already have been shown)."""
    import subprocess

    code = ("import torch; from app.engines.cpu_kernels import int8_linear; "
            "int8_linear(torch.nn.Linear(48, 301)); int8_linear(torch.nn.Linear(48, 301), 4096)")
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and "deprecated" not in r.stderr, r.stderr
