"""`python -m app train-drafter`: train a ReDrafter head for a target on this machine's CPU, within a time budget,
resumably (app.speculative.redrafter_training does the work; lanes use it as `redrafter:<name>`)."""

from __future__ import annotations

import sys
import time

from app.core.errors import SetupError

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    t = sub.add_parser("train-drafter", help="train a ReDrafter head for a target on this machine (CPU, minutes)")
    t.add_argument("--target", required=True, help="the target engine the head drafts for (hf backend)")
    t.add_argument("--kind", default="redrafter", choices=["redrafter"], help="the drafter to train")
    t.add_argument("--name", help="the head's name (default: <target>-redrafter); lanes use redrafter:<name>")
    t.add_argument("--minutes", type=float, default=10.0, help="time budget of this run: data, then training (default 10)")
    t.add_argument("--corpus", action="append", default=[], metavar="PATH", help="more training text: a file or a folder (repeatable)")
    t.add_argument("--vocab", type=int, default=16384, help="rows of the head's output layer (the most frequent target tokens)")
    t.add_argument("--depth", type=int, default=4, help="tokens ahead the head is trained to draft")
    t.add_argument("--data-share", type=float, default=0.5, help="the most of a fresh run's budget spent gathering data (0.1–0.9)")
    t.add_argument("--min-steps", type=int, default=0, help="train at least this many steps in this run, past --minutes if the "
                   "machine is slow (default 0: the budget alone)")
    t.add_argument("--fresh", action="store_true", help="discard the data and checkpoint of an earlier run")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    t.set_defaults(func=run)


def _check_args(args, target_backend_hidden: bool) -> None:
    """Every option refused before anything loads: finite, in range, a plain head name, a writable heads folder.

    Raises:
        SetupError: naming the option and a value that works.
    """
    import math

    if not target_backend_hidden:
        raise SetupError(f"{args.target} is not a PyTorch (hf) engine: ReDrafter heads learn from the target's hidden states",
                         fix="pick the hf engine of the same model (python -m app engines)")
    if not (math.isfinite(args.minutes) and 0 < args.minutes <= 24 * 60):
        raise SetupError(f"--minutes must be a number of minutes in (0, 1440], got {args.minutes}", fix="e.g. --minutes 10")
    if not (math.isfinite(args.data_share) and 0.1 <= args.data_share <= 0.9):
        raise SetupError(f"--data-share must be in [0.1, 0.9], got {args.data_share}", fix="e.g. --data-share 0.5")
    if not 16 <= args.vocab <= 1 << 20:
        raise SetupError(f"--vocab must be in [16, 1048576] (rows of the head's output layer), got {args.vocab}", fix="e.g. --vocab 16384")
    if args.min_steps < 0:
        raise SetupError(f"--min-steps must be >= 0, got {args.min_steps}", fix="e.g. --min-steps 200, or leave it out")
    if not 1 <= args.depth <= 16:
        raise SetupError(f"--depth must be in [1, 16] (tokens ahead the head drafts), got {args.depth}", fix="e.g. --depth 4")


def _check_writable(folder) -> None:
    """The heads folder exists (or can be made) and takes files: checked before the model loads."""
    import os
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as e:
        raise SetupError(f"cannot write the trained head to {folder}: {e.strerror or e}",
                         fix="point SPECDECK_HEADS (or XDG_CACHE_HOME) at a folder you can write to") from None
    if not os.access(folder, os.W_OK):  # pragma: no cover - root bypasses mode bits; the write above decides
        raise SetupError(f"cannot write the trained head to {folder}", fix="point SPECDECK_HEADS at a folder you can write to")


def run(args) -> int:
    from app.engines.backends import backend
    from app.engines.registry import open_engine, resolve
    from app.speculative.redrafter import head_folder
    from app.speculative.redrafter_training import train

    m = resolve(args.target)
    _check_args(args, backend(m.backend).hidden)
    name = args.name if args.name is not None else f"{m.name}-redrafter"
    folder = head_folder(name)
    _check_writable(folder.parent)
    engine = open_engine(m)
    t0 = time.monotonic()
    try:
        s = train(engine, name, args.minutes, args.corpus, args.vocab, args.depth, args.data_share, args.fresh, args.seed, args.quiet,
                  min_steps=args.min_steps)
    except KeyboardInterrupt:
        print(f"interrupted: what was gathered and trained so far is kept in {folder}; run the same command again to continue",
              file=sys.stderr)
        return 130
    acc = s.get("heldout_acceptance") or {}
    print(f"head {name} for {engine.name}: {s['parameters'] / 1e6:.1f} M parameters, {s['steps']} steps (kept: step {s['best_step']}, "
          f"the lowest validation loss), "
          f"{s['minutes_trained']:.1f} min trained on {s['train_positions']:,} positions ({time.monotonic() - t0:.0f} s this run)")
    if acc:
        print(f"held-out acceptance by depth over {acc['positions']} positions: chain {' '.join(f'{x:.2f}' for x in acc['chain'])}; "
              f"{acc['beams']}-beam tree {' '.join(f'{x:.2f}' for x in acc['tree'])}")
    print(f"use it: --setup redrafter:{name}")
    return 0
