"""How many CPU threads each process's engines use: `SPECDECK_THREADS`, or one per core when unset.

Both CPU engines spin their thread pools between parallel regions (torch's OpenMP pool, llama.cpp's threadpool), so
two processes that each start one thread per core on the same cores waste most of the machine waiting for one
another: `make test` runs two tests at a time on a 2-core machine, and with a thread per core in each its suite took
15 min against 7 min with one thread each (resources/bench/README.md, "The test suite"). SPECDECK_THREADS=N gives
every engine N threads — torch's intra-op pool (through OMP_NUM_THREADS, set by `import app`, so the worker processes
inherit it) and llama.cpp's default `n_threads` (a manifest's own `n_threads` still wins). Use it to run SpecDeck
beside other work, or several runs at once. Stdlib only.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ENV", "cpu_threads", "apply"]

ENV = "SPECDECK_THREADS"


def cpu_threads() -> int | None:
    """SPECDECK_THREADS as a positive whole number, None when unset or empty; anything else is a ValueError that says
    what to set."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV}={raw!r}: set it to a whole number of CPU threads per engine, at least 1 (or unset it: one per core)")
    return n


def apply() -> None:
    """Give torch SPECDECK_THREADS intra-op threads: through OMP_NUM_THREADS for torch not yet imported here and for
    every process started from here, and directly when torch is already imported. A bad value exits with its error."""
    try:
        n = cpu_threads()
    except ValueError as e:
        sys.exit(f"specdeck: {e}")
    if n is None:
        return
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(n)
