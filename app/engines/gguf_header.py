"""Reading a GGUF's header without its tensor data: the file may be split into parts read as one stream.

Read by hand because ``gguf.GGUFReader`` memory-maps one whole file (SpecDeck's Qwen GGUFs are raw parts, read
before they are joined) and decodes every field, tokenizer included, before it answers. The format's constants
(magic, value types and their widths, file types) are the ``gguf`` package's own; a test compares what is read
here with ``GGUFReader`` on a single file.

One walker (:func:`_walk`) reads the metadata key/values and the tensor table; :func:`gguf_file_type` stops at
`general.file_type`, :func:`gguf_fp32_bytes` sums the tensors' elements (what dequantising to fp32 will need).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
from gguf import GGUF_MAGIC, GGUFReader, GGUFValueType, LlamaFileType

__all__ = ["FILE_TYPES", "gguf_file_type", "gguf_fp32_bytes"]

# GGUF scalar value types → numpy dtype: GGUFReader's own table (gguf calls it an internal helper; gguf is pinned and
# tests/engines/test_gguf_header.py compares every value type with GGUFReader). Strings and arrays are walked below.
_SCALARS: dict[int, np.dtype] = {int(t): np.dtype(s) for t, s in GGUFReader.gguf_scalar_to_np.items()}

#: general.file_type → llama.cpp's name for the quantisation (llama_ftype), e.g. 15 → "Q4_K_M".
FILE_TYPES: dict[int, str] = {int(ft): ft.name.split("_", 1)[1] for ft in LlamaFileType if ft is not LlamaFileType.GUESSED}


class _Chain:
    """Sequential reads across files joined end to end (a GGUF split into parts), without joining them."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = list(paths)
        self.i = 0
        self.f: BinaryIO | None = None

    def read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            if self.f is None:
                if self.i >= len(self.paths):
                    raise EOFError("GGUF header runs past the end of the file")
                self.f = open(self.paths[self.i], "rb")  # noqa: SIM115 - closed in read/close
                self.i += 1
            chunk = self.f.read(n - len(out))
            if not chunk:
                self.f.close()
                self.f = None
            out += chunk
        return out

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


class _Found(Exception):
    def __init__(self, value) -> None:
        self.value = value


def _walk(paths: list[Path], key: bytes | None = None) -> tuple[int, int] | None:
    """Read the header: (Σ tensor elements, header bytes), or None when the file is not a GGUF we can read.

    With `key`, stop at that scalar metadata key and raise _Found with its value (tensors are not read)."""
    r = _Chain(paths)
    try:
        if struct.unpack("<I", r.read(4))[0] != GGUF_MAGIC:
            return None
        e: Literal["<", ">"] = "<" if struct.unpack("<I", r.read(4))[0] < 0x10000 else ">"  # big-endian: a swapped version
        u32, u64 = struct.Struct(e + "I"), struct.Struct(e + "Q")
        n_tensors, n_kv = struct.unpack(e + "QQ", r.read(16))
        read = 24

        def value(t: int) -> tuple[object, int]:
            """(value for scalars else None, bytes read)."""
            if t in _SCALARS:
                dt = _SCALARS[t].newbyteorder(e)
                return np.frombuffer(r.read(dt.itemsize), dt)[0].item(), dt.itemsize
            if t == GGUFValueType.STRING:
                (n,) = u64.unpack(r.read(8))
                r.read(n)
                return None, 8 + n
            if t == GGUFValueType.ARRAY:
                (et,) = u32.unpack(r.read(4))
                (count,) = u64.unpack(r.read(8))
                if et in _SCALARS:
                    size = count * _SCALARS[et].itemsize
                    r.read(size)
                    return None, 12 + size
                return None, 12 + sum(value(et)[1] for _ in range(count))
            raise ValueError(f"unknown GGUF value type {t}")

        for _ in range(n_kv):
            (klen,) = u64.unpack(r.read(8))
            name = r.read(klen)
            (t,) = u32.unpack(r.read(4))
            v, size = value(t)
            if key is not None and name == key and v is not None:
                raise _Found(v)
            read += 12 + klen + size
        if key is not None:
            return None
        elements = 0
        for _ in range(n_tensors):
            (nlen,) = u64.unpack(r.read(8))
            r.read(nlen)
            (n_dims,) = u32.unpack(r.read(4))
            dims = struct.unpack(e + "Q" * n_dims, r.read(8 * n_dims))
            r.read(12)  # ggml type (u32) + data offset (u64)
            read += 8 + nlen + 4 + 8 * n_dims + 12
            count = 1
            for d in dims:
                count *= d
            elements += count
        return elements, read
    except (EOFError, ValueError, struct.error, OSError, MemoryError):
        return None
    finally:
        r.close()


def gguf_file_type(paths: list[Path]) -> str | None:
    """The quantisation a GGUF declares (`general.file_type`, e.g. "Q4_K_M"), read from its header; None when
    unreadable or absent."""
    try:
        _walk(paths, key=b"general.file_type")
    except _Found as f:
        ft = int(f.value)
        return FILE_TYPES.get(ft, f"ftype {ft}")
    return None


def gguf_fp32_bytes(paths: list[Path]) -> tuple[int, int] | None:
    """Size of a GGUF's weights once dequantised to fp32, read from its header (no tensor data is read).

    Args:
        paths: the GGUF file, or its parts in order (they are read as one stream).

    Returns:
        (fp32_bytes, header_bytes): 4 bytes × Σ elements over all tensors, and the size of the header (metadata
        and tensor table, which holds the tokenizer). None when the file is not a GGUF we can read (the
        conversion then reports it).
    """
    walked = _walk(paths)
    return None if walked is None else (4 * walked[0], walked[1])
