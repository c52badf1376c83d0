"""The `python -m app` (`specdeck`) commands: one module per subcommand, each with `add_parser(sub)` and either
`run(args)` (set as the parser's `func`) or `main(argv)` (commands that parse their own options: `gui`,
`telemetry`). The parser is built from :data:`COMMANDS`; building it, `--help`, `engines` and `setups` import no torch
and no Qt: a command imports what it needs when it runs.

    python -m app bench --target smollm2-135m-instruct --setup ngram --prompt "..." --json -
    python -m app engines
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from app.core.errors import SpecDeckError

__all__ = ["COMMANDS", "build_parser", "main"]

#: the subcommands, in the order `--help` lists them: (name on the command line, module under app.commands)
COMMANDS = (
    ("bench", "bench"),
    ("tune", "tune"),
    ("engines", "engines"),
    ("convert", "convert"),
    ("setups", "setups"),
    ("profile", "profile"),
    ("train-drafter", "train_drafter"),
    ("worker-stats", "worker_stats"),
    ("telemetry", "telemetry"),
    ("gpu-check", "gpu_check"),
    ("gui", "gui"),
    ("install-desktop", "desktop"),
)


def _module(name: str):
    return importlib.import_module(f"app.commands.{dict(COMMANDS)[name]}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdeck", description="Compare LLM decoding setups side by side (speculative decoding you can see).")
    p.add_argument("--version", action="store_true", help="print the version")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    for name, _ in COMMANDS:
        _module(name).add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (2 for a user error, printed as `error: …` with its fix)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not argv or (argv[0].startswith("--") and argv[0] not in ("--help", "--version")) or argv[0].endswith(".specdeck"):
        argv = ["gui", *argv]  # the desktop app is the default command; gui options or a run file may come first
    if argv[0] == "--version":
        from app import __version__

        print(f"specdeck {__version__}")
        return 0
    try:
        if argv[0] in dict(COMMANDS) and hasattr(_module(argv[0]), "main"):
            return _module(argv[0]).main(argv[1:])
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return args.func(args)
    except SpecDeckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `python -m app engines | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit would fail again
        return 0
