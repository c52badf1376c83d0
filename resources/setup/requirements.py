"""Print pyproject.toml's pinned dependencies (and extras) one per line, for `pip install -r`, leaving out some.

    python resources/setup/requirements.py --extra test --without llama-cpp-python

The Makefile installs the Python packages while llama.cpp compiles, and llama-cpp-python itself afterwards against
that build; this keeps pyproject.toml the only list of pins. Standard library only (runs before anything is installed).
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str], without: list[str]) -> list[str]:
    """The dependency lines of `pyproject` plus those of `extras`, minus the projects named in `without`."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    lines = list(project.get("dependencies", []))
    for e in extras:
        lines += project.get("optional-dependencies", {})[e]
    drop = {re.sub(r"[-_.]+", "-", w).lower() for w in without}
    return [r for r in lines if re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]).lower() not in drop]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pyproject", type=Path, default=Path(__file__).resolve().parents[2] / "pyproject.toml")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--without", action="append", default=[])
    args = ap.parse_args()
    print("\n".join(requirements(args.pyproject, args.extra, args.without)))


if __name__ == "__main__":
    main()
