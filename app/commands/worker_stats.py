"""`python -m app worker-stats`: the worker's start-up time, event latency and cancel latency on this machine."""

from __future__ import annotations

from app.core.report_text import format_table

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    w = sub.add_parser("worker-stats", help="measure worker start-up, event latency and cancel latency")
    w.add_argument("--target", default="smollm2-135m-instruct")
    w.add_argument("--pings", type=int, default=500)
    w.set_defaults(func=run)


def run(args) -> int:
    from app.worker.probe import measure

    figures = measure(args.target, args.pings)
    print(format_table(["measure", "value"], [[k, str(v)] for k, v in figures.items()]))
    return 0
