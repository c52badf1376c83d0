"""Is TensorRT-LLM usable on this machine? Fast, and never imports ``tensorrt_llm`` (importing it needs a CUDA
driver, and takes seconds).

`capability()` is what `specdeck engines`, the GUI's engine list (app.engines.status) and the engine's loader ask
before anything else.
"""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import importlib.util
import platform
import sys

__all__ = ["INSTALL_HINT", "capability"]

INSTALL_HINT = "pip install '.[trtllm]' --extra-index-url https://pypi.nvidia.com   (Linux, CUDA driver, Python 3.10 or 3.12)"
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


def _load_cuda_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def capability() -> tuple[bool, str]:
    """(usable, reason) for TensorRT-LLM on this machine, quickly and without importing it.

    Checks, in order: the package is installed (`importlib.util.find_spec`), its version (>= 1.2, from the
    distribution metadata), the Python version (wheels exist for 3.10 and 3.12), Linux, and that the CUDA
    driver library loads (`ctypes` on libcuda.so.1; `import tensorrt_llm` fails without it).

    Returns:
        (True, "") when usable, else (False, reason) where reason names the problem and the fix.
    """
    py = _python_version()
    py_s = f"{py[0]}.{py[1]}"
    if _find_spec("tensorrt_llm") is None:
        extra = "" if py in _PY_OK else f"; this is Python {py_s}"
        return False, f"not installed (pip install .[trtllm] on Linux with CUDA; wheels for Python 3.10/3.12{extra})"
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
    if not _load_cuda_driver():
        return False, "no CUDA driver (libcuda.so.1 not found)"
    return True, ""
