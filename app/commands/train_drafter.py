"""`python -m app train-drafter`: train a ReDrafter head for a target on this machine's CPU, within a time budget,
resumably (app.speculative.redrafter_training does the work; lanes use it as `redrafter:<name>`)."""

from __future__ import annotations

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
    t.add_argument("--fresh", action="store_true", help="discard the data and checkpoint of an earlier run")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    t.set_defaults(func=run)


def run(args) -> int:
    from app.engines.hf import HFEngine
    from app.engines.registry import resolve
    from app.speculative.redrafter_training import train

    m = resolve(args.target)
    if m.backend != "hf":
        raise SetupError(f"{args.target} is a {m.backend} engine: ReDrafter heads are trained on hf (PyTorch) targets",
                         fix="pick the hf engine of the same model (python -m app engines)")
    if not 0.1 <= args.data_share <= 0.9:
        raise SetupError(f"--data-share must be in [0.1, 0.9], got {args.data_share}", fix="e.g. --data-share 0.5")
    if args.minutes <= 0:
        raise SetupError(f"--minutes must be > 0, got {args.minutes}", fix="e.g. --minutes 10")
    name = args.name or f"{m.name}-redrafter"
    engine = HFEngine(m)
    t0 = time.monotonic()
    s = train(engine, name, args.minutes, args.corpus, args.vocab, args.depth, args.data_share, args.fresh, args.seed, args.quiet)
    acc = s.get("heldout_acceptance") or {}
    print(f"head {name} for {engine.name}: {s['parameters'] / 1e6:.1f} M parameters, {s['steps']} steps (kept: step {s['best_step']}, "
          f"the lowest validation loss), "
          f"{s['minutes_trained']:.1f} min trained on {s['train_positions']:,} positions ({time.monotonic() - t0:.0f} s this run)")
    if acc:
        print(f"held-out acceptance by depth over {acc['positions']} positions: chain {' '.join(f'{x:.2f}' for x in acc['chain'])}; "
              f"{acc['beams']}-beam tree {' '.join(f'{x:.2f}' for x in acc['tree'])}")
    print(f"use it: --setup redrafter:{name}")
    return 0
