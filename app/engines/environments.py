"""Which Python environment runs an engine's worker.

Most engines run in SpecDeck's own environment. Some backends cannot live there: TensorRT-LLM 1.2 pins
`torch<=2.9.0` and `transformers==4.57.1` and ships wheels for Python 3.10/3.12, while SpecDeck pins torch 2.13
and transformers 5.x. Such an engine's lanes run in a second worker process started from the interpreter of the
engine's own environment (app.worker.client.WorkerClient(python=...)); the GUI, the other lanes and the reports
stay in SpecDeck's. The worker imports SpecDeck from this checkout (PYTHONPATH), so that environment needs only
what the worker needs: the backend's library and its own dependencies (see `make trtllm-env`).

Where the interpreter comes from, first match wins:

1. the manifest's top-level `python = "<path to the interpreter>"` (relative to the manifest's folder; `~` and
   `$VARS` expanded);
2. for `backend = "trtllm"`: `$SPECDECK_TRTLLM_PYTHON`, else `<checkout>/.venv-trtllm/bin/python` when it exists
   (what `make trtllm-env` creates);
3. SpecDeck's own interpreter.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

from app.core.errors import EngineError
from app.engines.backends import backend
from app.engines.manifest import EngineManifest

__all__ = ["ROOT", "worker_python", "same_python", "foreign_call", "worker_env"]

ROOT = Path(__file__).resolve().parents[2]


def same_python(python: str | os.PathLike | None) -> bool:
    """True for None and for SpecDeck's own interpreter path. Paths are compared unresolved: a venv's
    bin/python is a link to the base interpreter, and two venvs linking the same binary are different environments."""
    if python is None:
        return True
    return Path(os.path.abspath(python)) == Path(os.path.abspath(sys.executable))


def worker_python(manifest: EngineManifest) -> str | None:
    """The interpreter whose environment runs `manifest`'s engine, or None for SpecDeck's own.

    Raises:
        EngineError: the manifest (or $SPECDECK_TRTLLM_PYTHON) names an interpreter that does not exist.
    """
    raw = manifest.extra.get("python")
    origin = f"python in {manifest.where}"
    b = backend(manifest.backend)
    if raw is None and b.python_env:
        raw, origin = os.environ.get(b.python_env) or None, f"${b.python_env}"
        if raw is None and b.python_venv:
            default = ROOT / b.python_venv / "bin" / "python"
            raw = str(default) if default.exists() else None
            origin = f"{default} (made by `make {b.name}-env`)"
    if raw is None:
        return None
    p = Path(os.path.expandvars(str(raw))).expanduser()
    if not p.is_absolute():
        base = manifest.path.parent if manifest.path is not None else Path.cwd()
        p = base / p
    if not p.exists():
        raise EngineError(
            f"engine {manifest.name}: its worker's interpreter {p} does not exist ({origin})",
            fix="create that environment (on a CUDA machine: `make trtllm-env`) or correct the path",
        )
    return None if same_python(p) else str(p)


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a worker started from another interpreter gets: this checkout first on PYTHONPATH (the
    worker imports SpecDeck from here, never from that environment's site-packages)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


@functools.lru_cache(maxsize=32)
def foreign_call(python: str, module: str, function: str, timeout_s: float = 60.0) -> object:
    """Call `module.function()` (no arguments, JSON-serialisable result) under another interpreter with this
    checkout on its path; cached per (python, module, function).

    Raises:
        EngineError: the interpreter could not run it (its last error line is quoted).
    """
    code = f"import importlib, json; m = importlib.import_module({module!r}); print(json.dumps(m.{function}()))"
    try:
        out = subprocess.run([python, "-c", code], env=worker_env(), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineError(f"cannot run {python}: {e}", fix="check that the interpreter works: `<python> -c 'print(1)'`") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EngineError(f"{python} could not import SpecDeck's {module}: {last}",
                          fix="that environment needs Python >= 3.11 (tomllib) and SpecDeck's worker dependencies; see `make trtllm-env`")
    return json.loads(out.stdout.strip().splitlines()[-1])
