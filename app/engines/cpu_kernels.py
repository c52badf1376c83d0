"""Faster fp32 linear layers on CPU: oneDNN with pre-packed weights instead of the default BLAS call.

Why: on torch's default CPU path a forward over a few tokens costs several times a one-token forward, and that
ratio (V(n)) decides whether verifying k drafts in one pass pays off on a CPU; oneDNN's packed GEMM keeps a few
rows close to the cost of one. The figures and how to measure them (`python -m app profile ENGINE`, with and
without `SPECDECK_CPU_GEMM=default`): resources/bench/README.md, "The GEMM". Every lane of a run (baseline, ours,
transformers' own lanes) uses the same patched model, so comparisons stay fair.

The ops are PyTorch's own (`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`, which inductor uses for
CPU linears); they are private, so `pack_linears` checks each patched layer against the original on a random input
and keeps the default path for any layer (and every one after it) that differs or fails. `SPECDECK_CPU_GEMM=default`
turns it off.

Memory: transformers maps the safetensors file and hands out views of it, so an fp32 weight costs RSS only once its
pages are read. Packing, quantizing or converting a layer reads them; `release_file_pages` then drops them from this
process (the file stays in the page cache; a later read maps them again), so an fp32 original is never resident next
to its packed, int8 or converted copy. Weights are converted, and a large one (an output layer) quantized, a block of
rows at a time, and the C heap is trimmed of the load's scratch (`trim_heap`). A load thus peaks at about the
bytes the model keeps plus one layer; an embedding left in fp32 stays mapped, its rows resident as tokens use them.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import sys
from typing import Any

import torch

__all__ = [
    "PackedLinear",
    "pack_linears",
    "available",
    "int8_available",
    "quantize_linears_int8",
    "int8_linear",
    "TOKEN_SCALED_ROWS",
    "copy_released",
    "CHUNK_BYTES",
    "LARGE_BYTES",
    "release_file_pages",
    "trim_heap",
    "weight_bytes",
]

log = logging.getLogger(__name__)


def available() -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        os.environ.get("SPECDECK_CPU_GEMM", "onednn") != "default"
        and torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


_MADV_DONTNEED = 4  # Linux
_WEIGHT_FILES = (".safetensors",)
_libc: ctypes.CDLL | bool | None = None


def _c_library() -> ctypes.CDLL | None:
    """The C library's symbols (madvise, malloc_trim), or None where ctypes cannot load them."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            _libc = False
    return _libc if isinstance(_libc, ctypes.CDLL) else None


def _file_mapping(start: int, end: int) -> tuple[int, int] | None:
    """The mapping of a weights file (read from /proc/self/maps now) that holds [start, end), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)  # address perms offset dev inode path (a path may hold spaces)
                if len(parts) < 6:
                    continue
                path = parts[5].rstrip("\n").removesuffix(" (deleted)")
                if not path.endswith(_WEIGHT_FILES):
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= start and end <= hi:
                    return lo, hi
    except OSError:
        pass
    return None


def release_file_pages(t: torch.Tensor) -> int:
    """Drop from this process's RSS the pages of a weights file (safetensors) under `t` (its bytes when contiguous,
    else its whole storage), once `t` has been copied, packed or quantized; returns the bytes released (0 when `t`
    is not a view of such a file, or not on Linux). Only file mappings are touched, never anonymous memory: their
    pages are the file's, unmodified, so a later read of `t` (a tied embedding, a layer put back to fp32) maps them
    again from the page cache.
    """
    if not sys.platform.startswith("linux") or t.device.type != "cpu" or t.is_mkldnn:
        return 0
    if t.is_contiguous():
        start, n = t.data_ptr(), t.numel() * t.element_size()
    else:
        start, n = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
    if not start or not n:
        return 0
    # t keeps its storage, hence the mapping, alive: what /proc/self/maps says now holds until madvise returns
    found = _file_mapping(start, start + n)
    if found is None:
        return 0
    page = mmap.PAGESIZE
    lo = max(found[0], start // page * page)
    hi = min(found[1], -(-(start + n) // page) * page)
    libc = _c_library()
    if libc is None:
        return 0
    if libc.madvise(lo, hi - lo, _MADV_DONTNEED) != 0:
        log.debug("madvise(DONTNEED) failed: errno %d", ctypes.get_errno())
        return 0
    return hi - lo


def trim_heap() -> None:
    """Hand the C heap's free memory back to the OS (glibc's malloc_trim; a no-op elsewhere). A load's transient
    buffers (activations of the int8 check, quantization scratch) are freed into the heap, where glibc keeps them —
    in RSS — for reuse, tens to hundreds of MiB across threads' arenas."""
    trim = getattr(_c_library(), "malloc_trim", None)
    if trim is not None:
        trim(ctypes.c_size_t(0))


CHUNK_BYTES = 8 << 20  # rows of a weight are converted, or of a large one quantized, this many bytes at a time
LARGE_BYTES = 64 << 20  # a weight quantized in blocks: an output layer (Qwen2.5-0.5B's: 544 MB), not an MLP's


def _large(w: torch.Tensor) -> bool:
    return w.numel() * w.element_size() > LARGE_BYTES


def _row_blocks(t: torch.Tensor, chunk_bytes: int | None = None) -> list[slice]:
    """Slices of t's first dimension, each about chunk_bytes (one slice when t is small or 0-d). Past 1024 rows, a
    multiple of 1024 rows: a linear layer computed a block of output rows at a time then gives, with MKL here, the
    same bits as in one call (not with an odd split)."""
    if t.dim() == 0 or t.shape[0] == 0:
        return [slice(None)]
    rows = max(1, (chunk_bytes or CHUNK_BYTES) // max(1, t[0].numel() * t.element_size()))
    if rows > 1024:
        rows -= rows % 1024
    return [slice(a, a + rows) for a in range(0, t.shape[0], rows)]


def copy_released(t: torch.Tensor, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """`t.to(device, dtype)` as a new tensor, copied a block of rows at a time, each block's weights-file pages
    released once copied (`release_file_pages`): converting a mapped fp32 weight never has all of it resident
    beside its copy. Elementwise, so the result equals `t.to(device, dtype)` exactly."""
    dtype = dtype if dtype is not None and t.is_floating_point() else t.dtype
    out = torch.empty(t.shape, dtype=dtype, device=device if device is not None else t.device)
    with torch.no_grad():
        if t.dim() == 0:
            out.copy_(t)
            release_file_pages(t)
            return out
        for rows in _row_blocks(t):
            out[rows].copy_(t[rows])
            release_file_pages(t[rows])
    return out


class PackedLinear(torch.nn.Module):
    """Inference-only replacement of an fp32 nn.Linear on CPU, weights packed once for oneDNN."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.out_features, self.in_features = linear.weight.shape
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.packed, self.bias, "none", [None], "")
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn packed"


def pack_linears(model: torch.nn.Module) -> int:
    """Replace the fp32 CPU nn.Linear layers of `model` by PackedLinear ones, one at a time: pack, check the packed
    layer against the original on a random input, swap, release the original (its file pages when it is a view of
    the weights file; its memory once nothing else refers to it). Returns how many were replaced: 0 when the ops
    are unavailable; at the first layer whose check fails (or whose ops raise), that layer and the rest keep the
    default path — every packed layer matched its original."""
    if not available():
        return 0
    # (parent, name) only: holding the children themselves would keep every original alive until the end. Largest
    # first: a layer's original and its packed copy are both resident for a moment, before the others pile up.
    found = [
        (child.weight.numel(), mod, cname)
        for mod in model.modules()
        for cname, child in mod.named_children()
        if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu"
    ]
    todo = [(mod, cname) for _, mod, cname in sorted(found, key=lambda r: -r[0])]
    g = torch.Generator().manual_seed(0)
    n = 0
    with torch.inference_mode():
        for mod, cname in todo:
            child = getattr(mod, cname)
            try:
                p = PackedLinear(child)
                x = torch.randn(3, child.in_features, generator=g)
                ref = torch.nn.functional.linear(x, child.weight, child.bias)
                if not torch.allclose(p(x), ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max()) + 1e-5):
                    raise RuntimeError(f"oneDNN linear differs from nn.Linear on {cname}")
            except Exception as e:  # private ops changed or misbehave: keep the default path from here on
                log.warning("not using oneDNN packed linears%s: %s", f" beyond {n} layers" if n else "", e)
                break
            setattr(mod, cname, p)
            release_file_pages(child.weight)
            del child, p
            n += 1
    trim_heap()
    return n


def int8_available() -> bool:
    """Whether this torch build can run dynamically quantized int8 linears on this CPU (fbgemm / x86)."""
    engines = set(torch.backends.quantized.supported_engines)
    try:  # torch.ao.quantization's eager API is deprecated (torchao replaces it): a future torch may drop it
        import importlib

        importlib.import_module("torch.ao.nn.quantized.dynamic")
        importlib.import_module("torch.ao.quantization").per_channel_dynamic_qconfig  # noqa: B018
    except (ImportError, AttributeError):
        return False
    return bool(engines & {"fbgemm", "x86"})


#: a forward over more than this many tokens scales each token's activations to the same range before fbgemm quantizes
#: them per tensor (Int8Linear); fewer keep fbgemm's per-tensor quantization as it is
TOKEN_SCALED_ROWS = 8


@functools.cache
def _int8_linear_class() -> Any:
    """The class of the int8 layers int8_linear makes (Int8Linear), made on first use: a torch without the eager
    quantization API (int8_available() is False) can still import this module."""
    import torch.ao.nn.quantized.dynamic as nnqd

    class Int8Linear(nnqd.Linear):
        """A dynamically quantized int8 Linear (fbgemm: weights int8 per output channel, activations quantized per call)
        whose forwards over many tokens quantize each token's activations on its own scale.

        fbgemm quantizes a call's activations with one scale for the whole tensor, so in a forward over many tokens
        one token with large activations sets the resolution of all of them: a draft's reading of its prompt, whose
        first tokens carry activations tens of times the others' (the attention sink), quantized every other token
        of the prompt coarsely, and the draft's cache of the prompt with it. Over more than TOKEN_SCALED_ROWS tokens
        each token is divided by its largest activation first and the output row multiplied back, which makes
        fbgemm's per-tensor quantization a per-token one at the cost of a few elementwise passes; a forward over
        fewer tokens (a draft's steps) is fbgemm's call as it is. Measured (the 0.5B Qwen draft at int8, all 24
        Spec-Bench prompts, the target's greedy answers read as a draft reads them): the draft's next token matched
        the target's at 84.9 % of positions with per-tensor quantization, 86.1 % so, 86.7 % at fp32, and every int8
        lane of a paced run ran 5–8 % faster (resources/bench/README.md, "The int8 draft's prompt reading").
        SPECDECK_INT8_ACTIVATIONS=tensor keeps fbgemm's per-tensor quantization for every forward (as before; read
        when the layer is made)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._per_token = os.environ.get("SPECDECK_INT8_ACTIVATIONS", "token").strip().lower() != "tensor"
            # the bias as a plain tensor (bias() unpacks the weight, each call); None while it is the placeholder's
            # zeros
            self._bias_f: torch.Tensor | None = None
            self.register_load_state_dict_post_hook(_sync_int8_bias)  # after the packed params (a child) have loaded

        def set_weight_bias(self, w: torch.Tensor, b: torch.Tensor | None) -> None:
            super().set_weight_bias(w, b)
            self._bias_f = None if b is None else b.detach().float()  # the tensor fbgemm packed a reference to

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not self._per_token or x.numel() <= TOKEN_SCALED_ROWS * self.in_features or x.dtype != torch.float32:
                return super().forward(x)
            scale = x.abs().amax(-1, keepdim=True).clamp_min_(1e-30)  # [..., 1]: each token's largest activation
            y = super().forward(x / scale)
            if self._bias_f is not None:  # fbgemm added the bias to the scaled rows: scale the rows alone
                y.sub_(self._bias_f)
                return y.mul_(scale).add_(self._bias_f)
            return y.mul_(scale)

    Int8Linear.__qualname__ = "Int8Linear"
    Int8Linear.__module__ = __name__
    return Int8Linear


def _sync_int8_bias(module: Any, _incompatible_keys: Any) -> None:
    """Int8Linear's plain bias, after load_state_dict packed another one (a module-level function: a layer pickles)."""
    b = module.bias()
    module._bias_f = None if b is None else b.detach().float()


def __getattr__(name: str) -> Any:
    if name == "Int8Linear":  # pickle finds the class by this name
        return _int8_linear_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def int8_linear(linear: torch.nn.Linear, chunk_bytes: int | None = None, on_block=None) -> torch.nn.Module:
    """An Int8Linear from `linear` (`torch.ao.nn.quantized.dynamic.Linear.from_float`) with per-channel int8
    weights (`per_channel_dynamic_qconfig`), releasing the fp32 weight's file pages as it goes. A weight over
    LARGE_BYTES (any weight, given `chunk_bytes`) is observed and quantized a block of rows at a time — per-channel
    quantization treats each output row on its own, so the int8 weights, scales and zero points are the same as
    from_float's — and only the int8 rows pile up; `on_block(rows, weight_rows)` then sees each block before its
    pages are released (the int8 check computes the layer's fp32 output there)."""
    import warnings

    with warnings.catch_warnings():
        # torch 2.13 deprecates its quantized tensor constructors (torchao replaces them; not a dependency here): the
        # warning would reach a user's terminal once per process, whichever int8 layer is made first
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel", category=UserWarning)
        return _int8_linear(linear, chunk_bytes, on_block)


def _int8_linear(linear: torch.nn.Linear, chunk_bytes: int | None, on_block) -> torch.nn.Module:
    from torch.ao.nn.quantized.modules.utils import _quantize_weight
    from torch.ao.quantization import per_channel_dynamic_qconfig

    w = linear.weight
    blocks = _row_blocks(w, chunk_bytes) if chunk_bytes or _large(w) else [slice(None)]
    if len(blocks) == 1 and on_block is None:
        linear.qconfig = per_channel_dynamic_qconfig
        try:
            q = _int8_linear_class().from_float(linear)
        finally:
            del linear.qconfig
        release_file_pages(w)
        return q
    ints = torch.empty(w.shape, dtype=torch.int8)
    scales, zero_points = [], []
    with torch.no_grad():
        for rows in blocks:
            if on_block is not None:
                on_block(rows, w[rows])
            observer = per_channel_dynamic_qconfig.weight()
            observer(w[rows])
            qw = _quantize_weight(w[rows].float(), observer)
            ints[rows] = qw.int_repr()
            scales.append(qw.q_per_channel_scales())
            zero_points.append(qw.q_per_channel_zero_points())
            del qw
            release_file_pages(w[rows])
            trim_heap()
        qweight = torch._make_per_channel_quantized_tensor(ints, torch.cat(scales), torch.cat(zero_points), 0)
    del ints
    trim_heap()
    # built 1x1 then given the weights: Int8Linear(in, out) would first pack an empty [out, in] int8 placeholder
    q = _int8_linear_class()(1, 1, dtype=torch.qint8)
    q.in_features, q.out_features = linear.in_features, linear.out_features
    q.set_weight_bias(qweight, linear.bias)
    return q


def quantize_linears_int8(model: torch.nn.Module, probe_ids: list[int], max_tv: float = 0.2) -> tuple[int, int, float]:
    """Replace the nn.Linear layers of a CPU fp32 model by dynamically quantized int8 ones (weights int8 per output
    channel, activations quantized per call by fbgemm, per token in a forward over more than TOKEN_SCALED_ROWS
    tokens: Int8Linear), keeping in fp32 the fewest layers needed for the next-token distributions on `probe_ids` to
    stay within total variation `max_tv` of fp32's (mean over positions). That distance bounds what int8 can cost in
    acceptance: a sampled draft is accepted with probability 1 − TV(p, q). Returns (int8 layers, fp32 layers kept,
    TV).

    For draft models only: a draft's precision never changes what the target emits (the verifier decides), only how
    often drafts are accepted, while its forward gets cheaper than the packed fp32 one (`python -m app profile
    TARGET --draft D:int8 --draft D` prints both drafts' T(1); figures: resources/bench/README.md, "Draft
    precision").

    Activations are quantized per token in the probe's forward (Int8Linear), so a layer whose input has outlier
    channels (typically the MLP's down projection) loses resolution on every token, and how much that matters end to
    end depends on the model (one all-int8 draft stays close to fp32 where another does not:
    resources/bench/README.md, "Draft precision"). So each layer's own error on the inputs it sees for the probe ranks
    the layers, and the worst go back to fp32, an eighth of the remaining ones at a time, until the distributions
    pass.

    Memory: each layer is quantized as soon as the fp32 reference forward has run through it (a forward hook), and
    its fp32 pages released (`release_file_pages`); a weight over LARGE_BYTES (the output layer) computes its part of
    the reference forward and is quantized a block of rows at a time instead. So the fp32 model is never resident
    beside the int8 one. The fp32 originals stay what they are, views of the weights file, for the layers put back
    to fp32 (the caller packs those). An fp32 model built in memory has no file to fall back on: its originals stay
    until this returns.
    """
    linears = [(parent, cname, child) for parent in model.modules() for cname, child in parent.named_children() if type(child) is torch.nn.Linear]
    if not linears:
        return 0, 0, 1.0
    x_ids = torch.tensor([probe_ids], dtype=torch.long)
    q = _ProbeQuantizer()
    p_ref = q.reference_forward(model, [child for _, _, child in linears], x_ids)  # [n, V]: the fp32 reference
    ranked = [(*q.quantized[id(child)], parent, cname, child) for parent, cname, child in linears]  # (error, int8, …)
    q.quantized.clear()
    ranked.sort(key=lambda r: -r[0])
    for _, int8, parent, cname, _ in ranked:
        setattr(parent, cname, int8)

    def distance() -> float:
        with torch.inference_mode():
            p = model(input_ids=x_ids).logits[0].float().softmax(-1)
            return float(0.5 * p.sub_(p_ref).abs_().sum(-1).mean())

    kept = 0
    tv = distance()
    while not tv <= max_tv and kept < len(ranked):  # the worst layers back to fp32, an eighth of the rest at a time
        step = max(1, (len(ranked) - kept) // 8)
        for _, _, parent, cname, child in ranked[kept : kept + step]:
            setattr(parent, cname, child)
        kept += step
        tv = distance() if kept < len(ranked) else 0.0
    n_int8 = len(ranked) - kept
    ranked.clear()  # the int8 copies of the layers put back to fp32
    trim_heap()
    return n_int8, kept, tv


class _ProbeQuantizer:
    """quantize_linears_int8's reference forward: each nn.Linear quantized as soon as the fp32 forward has run through
    it, ranked by its own error on the input it saw (`quantized`: id(fp32 layer) -> (RMS error per row, int8 layer))."""

    def __init__(self) -> None:
        self.quantized: dict[int, tuple[float, torch.nn.Module]] = {}

    def quantize(self, child: torch.nn.Linear, x: torch.Tensor | None) -> torch.Tensor | None:
        """Quantize `child` and rank it by its error on its input x (None: the probe never reached it); returns its
        fp32 output on x."""
        if x is None:
            self.quantized[id(child)] = (float("inf"), int8_linear(child))
            return None
        x2 = x.detach().reshape(-1, child.in_features)  # [n, in]
        if _large(child.weight):
            # a large weight (the output layer): its fp32 output a block of rows at a time, each block quantized and
            # its pages released before the next, so the whole fp32 weight is never resident
            y = torch.empty(x2.shape[0], child.out_features, dtype=x2.dtype)  # [n, out]
            b = child.bias

            def on_block(rows: slice, w_rows: torch.Tensor) -> None:
                y[:, rows] = torch.nn.functional.linear(x2, w_rows, b[rows] if b is not None else None)

            q = int8_linear(child, on_block=on_block)
        else:  # the layer's own fp32 output, while its weight is resident
            y = torch.nn.functional.linear(x2, child.weight, child.bias)
            q = int8_linear(child)
        err = float(q(x2).sub_(y).norm() / x2.shape[0] ** 0.5)  # RMS error per row; in place: vocabulary-wide rows
        self.quantized[id(child)] = (err if err == err else float("inf"), q)
        trim_heap()
        return y

    def _blockwise(self, mod: torch.nn.Linear):
        """A large layer's forward during the reference pass: quantized a block of rows at a time."""

        def forward(x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
            if id(mod) in self.quantized:
                return torch.nn.functional.linear(x, mod.weight, mod.bias)
            y = self.quantize(mod, x)
            assert y is not None
            return y.reshape(*x.shape[:-1], mod.out_features)

        return forward

    def reference_forward(self, model: torch.nn.Module, linears: list[torch.nn.Linear], x_ids: torch.Tensor) -> torch.Tensor:
        """The fp32 next-token distributions on the probe [n, V], every linear layer quantized on the way."""
        import warnings

        def on_forward(mod, args, out):  # small layers: after their own forward
            if id(mod) not in self.quantized:  # a layer called twice in one forward is quantized once
                self.quantize(mod, args[0])

        with warnings.catch_warnings(), torch.inference_mode():
            # torch.ao.quantization's eager API is deprecated in favour of torchao, which is not a dependency here
            warnings.simplefilter("ignore")
            hooks = []
            for child in linears:
                if _large(child.weight):
                    child.forward = self._blockwise(child)
                else:
                    hooks.append(child.register_forward_hook(on_forward))
            try:
                p_ref = model(input_ids=x_ids).logits[0].float().softmax(-1)
            finally:
                for h in hooks:
                    h.remove()
                for child in linears:
                    child.__dict__.pop("forward", None)
            for child in linears:  # layers the probe never reached
                if id(child) not in self.quantized:
                    self.quantize(child, None)
        return p_ref


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights `model` holds, each tensor once: parameters and buffers (a tied weight counts once; a
    tensor still mapped from its file counts too, resident or not), oneDNN-packed copies, and int8 layers' packed
    weights with their per-channel scales, zero points and column offsets. In bytes."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.device.type == "meta":
            continue
        key = t.untyped_storage().data_ptr() if not t.is_mkldnn else id(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes() if not t.is_mkldnn else t.numel() * t.element_size()
    for m in model.modules():
        if isinstance(m, PackedLinear):
            total += m.packed.numel() * m.packed.element_size()
        elif hasattr(m, "_packed_params") and hasattr(m._packed_params, "_weight_bias"):  # dynamic int8 Linear
            w, b = m._packed_params._weight_bias()
            total += w.numel() * w.element_size() + w.shape[0] * 12 + (b.numel() * b.element_size() if b is not None else 0)
    return total
