"""`python -m app convert ENGINE`: prepare an hf engine's weights ahead of time (GGUF → the safetensors cache)."""

from __future__ import annotations

import time

from app.commands.progress import ProgressBars
from app.core.errors import SpecDeckError

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    c = sub.add_parser("convert", help="prepare an engine's weights (GGUF -> safetensors cache)")
    c.add_argument("engine")
    c.add_argument("--force", action="store_true", help="convert again even if cached")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(func=run)


def run(args) -> int:
    from app.engines.backends import backend
    from app.engines.cache import prepare
    from app.engines.registry import resolve

    m = resolve(args.engine)
    if not backend(m.backend).converts:
        raise SpecDeckError(f"engine {m.name} uses backend {m.backend}, which runs its weights as they are: nothing to convert",
                            fix="convert the hf engine of the same model (python -m app engines)")
    bar = ProgressBars(args.quiet)
    t0 = time.perf_counter()
    try:
        path = prepare(m, bar, force=args.force)
    finally:
        bar.close()
    print(f"{m.name}: ready in {path} ({time.perf_counter() - t0:.1f} s)")
    return 0
