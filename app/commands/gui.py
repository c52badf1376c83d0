"""`python -m app gui` (also `python -m app` alone, or with gui options first): the desktop app (app.ui.main parses
its own options; the only command that imports Qt)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["add_parser", "main"]


def add_parser(sub) -> None:
    sub.add_parser("gui", help="open the desktop app (default)", add_help=False)


def main(argv: Sequence[str]) -> int:
    from app.ui.main import main as gui_main

    return gui_main(list(argv))
