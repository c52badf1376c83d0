"""Is TensorRT-LLM usable on this machine? Fast, and never imports ``tensorrt_llm`` (importing it needs a CUDA
driver, and takes seconds).

`capability()` is what `specdeck engines`, the GUI's engine list (app.engines.status) and the engine's loader ask
before anything else.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata as md
import importlib.util
import platform
import sys

__all__ = ["INSTALL_HINT", "capability"]

INSTALL_HINT = (
    "TensorRT-LLM lives in its own environment: `make trtllm-env` (Linux, CUDA 13 driver, python3.12, libopenmpi-dev) "
    "creates .venv-trtllm, used by trtllm engines; or point $SPECDECK_TRTLLM_PYTHON / a manifest's python at yours"
)
# Packages TensorRT-LLM imports at start-up whose versions it pins (requirements of tensorrt_llm 1.2.0: torch
# >=2.9.1,<=2.10.0a0, transformers ==4.57.3, tensorrt ~=10.14.1): a mismatch fails at import or, worse, later.
_PINNED = ("torch", "transformers", "tensorrt")
_MIN_VERSION = (1, 2)
_PY_OK = ((3, 10), (3, 12))


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part else ""
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def _find_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _python_version() -> tuple[int, int]:
    return sys.version_info[0], sys.version_info[1]


def _system() -> str:
    return platform.system()


def _load_mpi() -> bool:
    """libmpi loads (mpi4py, which `import tensorrt_llm` needs, links it; the install docs: apt install libopenmpi-dev)."""
    names = [n for n in (ctypes.util.find_library("mpi"), "libmpi.so.40", "libmpi.so.12", "libmpi.so") if n]
    for n in names:
        try:
            ctypes.CDLL(n)
        except OSError:
            continue
        return True
    return False


def _requirement_mismatch() -> str | None:
    """The first pinned dependency of the installed tensorrt_llm that is missing or at a version it excludes."""
    try:
        reqs = md.requires("tensorrt_llm") or []
    except md.PackageNotFoundError:
        return None
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging comes with pip's environments
        return None
    for line in reqs:
        try:
            req = Requirement(line)
        except Exception:
            continue
        if req.name.lower() not in _PINNED or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        have = _dist_version(req.name)
        if have is None:
            return f"{req.name} is not installed (tensorrt_llm needs {req})"
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            return f"{req.name} {have} is installed but tensorrt_llm needs {req}"
    return None


def _load_cuda_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def capability() -> tuple[bool, str]:
    """(usable, reason) for TensorRT-LLM on this machine, quickly and without importing it.

    Checks, in order: the package is installed (`importlib.util.find_spec`), its version (>= 1.2, from the
    distribution metadata), the Python version (wheels exist for 3.10 and 3.12), Linux, the versions of the
    packages it pins (torch, transformers, tensorrt: from its own requirements), that an MPI library loads
    (mpi4py needs it at import), and that the CUDA driver library loads (`ctypes` on libcuda.so.1).

    Returns:
        (True, "") when usable, else (False, reason) where reason names the problem and the fix.
    """
    py = _python_version()
    py_s = f"{py[0]}.{py[1]}"
    if _find_spec("tensorrt_llm") is None:
        extra = "" if py in _PY_OK else f"; this is Python {py_s}"
        return False, f"not installed in {sys.prefix} (wheels for Python 3.10/3.12{extra}; `make trtllm-env` makes its own environment)"
    ver = _dist_version("tensorrt_llm")
    if ver is not None:
        vt = _version_tuple(ver)
        if vt and vt < _MIN_VERSION:
            return False, f"tensorrt_llm {ver} is too old (need >= 1.2: {INSTALL_HINT})"
    if py not in _PY_OK:
        return False, f"wrong Python {py_s} (TensorRT-LLM wheels exist for 3.10 and 3.12)"
    system = _system()
    if system != "Linux":
        return False, f"TensorRT-LLM needs Linux (this is {system})"
    mismatch = _requirement_mismatch()
    if mismatch:
        return False, f"{mismatch}: install TensorRT-LLM in an environment of its own (`make trtllm-env`)"
    if not _load_mpi():
        return False, "no MPI library (libmpi.so not found; `import tensorrt_llm` needs it): apt-get install libopenmpi-dev"
    if not _load_cuda_driver():
        return False, "no CUDA driver (libcuda.so.1 not found)"
    return True, ""
