"""`python -m app telemetry`: what the GUI's GPU/CPU plots would show, printed (app.telemetry.cli parses its own
options)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["add_parser", "main"]


def add_parser(sub) -> None:
    sub.add_parser("telemetry", help="print GPU/CPU telemetry samples (NVML, psutil)", add_help=False)


def main(argv: Sequence[str]) -> int:
    from app.telemetry.cli import main as telemetry_main

    return telemetry_main(list(argv))
