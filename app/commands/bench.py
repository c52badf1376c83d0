"""`python -m app bench`: the headless comparison of setups against the baseline, in a worker process.

Exit codes: 0 all lanes finished; 2 a user error or a failed lane; 130 interrupted (Ctrl-C, SIGTERM). Whatever finished is
printed and saved in every case (the report's `errors` and `incomplete` say what did not).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

from app.commands.intervals import against_fastest, speedup_intervals
from app.commands.worker_run import Stuck, WorkerRun, stop_signals
from app.core.errors import SetupError, WorkerDiedError
from app.core.report import check_writable, draft_of, draft_parting, write_json
from app.core.report_text import cpu_wait_warnings, render_summary, stall_warnings

__all__ = ["add_parser", "run", "plan_of", "prompts_of", "error_lines"]


def add_parser(sub) -> None:
    from app.core.prompts import list_suites
    from app.core.setups import kinds
    from app.worker.messages import MODES

    b = sub.add_parser("bench", help="headless comparison of setups against the baseline")
    b.add_argument("--target", required=True, help="engine name (see `engines`), .gguf file or HF folder")
    b.add_argument("--setup", action="append", help="setup string, repeatable; the baseline always runs. Kinds: "
                   + ", ".join(k.prefix for k in kinds()) + " (`python -m app setups` explains each)")
    b.add_argument("--prompt", action="append", help="prompt text (repeatable)")
    b.add_argument("--prompts", help="JSONL file with id, prompt[, category]")
    b.add_argument("--suite", help="built-in suite (resources/suites): " + ", ".join(list_suites()))
    b.add_argument("--max-new-tokens", type=int, default=96)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--top-p", type=float, default=1.0)
    b.add_argument("--top-k", type=int, default=0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--warmup", type=int, default=8, help="tokens per setup in an unrecorded warm-up run (0 = none)")
    b.add_argument("--mode", choices=MODES, default="sequential",
                   help="sequential: one lane after another; interleaved: a prompt's lanes one step each in turn (the race); "
                   "paced: the lane with the fewest tokens steps next, so a prompt's lanes share one stretch of time and a "
                   "machine that slows for a while slows them alike (for speedups on a busy or noisy machine)")
    b.add_argument("--reference", metavar="SETUP", help="the lane every output is compared with (first divergence); default: the "
                   "baseline when lanes run on several targets (SETUP@ENGINE)")
    b.add_argument("--device", default=None, help="cpu | cuda (default: the manifest's)")
    b.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default: the manifest's")
    b.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    b.add_argument("--json", metavar="PATH", help="write the JSON report to PATH, or - for stdout (then no table)")
    b.add_argument("--record", metavar="PATH", help="save the run as a run file (.specdeck): every event with its time, to show "
                   "or replay in the window with no worker and no model (`specdeck gui PATH`)")
    b.add_argument("--label", metavar="NAME", help="the machine's name in the run file (default: its GPU, else its host name), "
                   "e.g. \"laptop\" or \"H200\": runs put beside each other are labelled with it")
    b.add_argument("--quiet", action="store_true", help="no progress")
    b.set_defaults(func=run)


def prompts_of(args):
    """The prompts of exactly one of --prompt, --prompts or --suite (shared with `tune`)."""
    from app.core.prompts import Prompt, load_jsonl, load_suite

    given = sum(bool(x) for x in (args.prompt, args.prompts, args.suite))
    if given != 1:
        raise SetupError("give exactly one of --prompt TEXT, --prompts FILE.jsonl or --suite NAME", fix="e.g. --suite specbench-mini")
    if args.prompt:
        return [Prompt(f"p{i}" if len(args.prompt) > 1 else "prompt", t) for i, t in enumerate(args.prompt)]
    if args.prompts:
        return load_jsonl(args.prompts)
    return load_suite(args.suite)


def plan_of(args):
    """The run asked for on the command line (baseline first, then the setups as given), checked before any work."""
    from app.core.setups import Sampling, parse_setup
    from app.engines.registry import resolve
    from app.worker.plan import RunPlan

    sampling = Sampling(args.temperature, args.top_p, args.top_k, args.seed, args.max_new_tokens).validated()
    if args.json and args.json != "-":
        check_writable(args.json)
    if args.record:
        check_writable(args.record, "--record")
    resolve(args.target)  # an unknown target is said before a worker starts (with the known names)
    labels = list(dict.fromkeys(parse_setup(s).label for s in ["baseline", *(args.setup or [])]))
    # every target a lane is moved to (`…@<target>`) gets its own baseline, the one its speedups are measured against
    with_bases: list[str] = []
    for s in labels:
        t = parse_setup(s).target
        if t is not None and f"baseline@{t}" not in labels and f"baseline@{t}" not in with_bases:
            with_bases.append(f"baseline@{t}")
        with_bases.append(s)
    return RunPlan(args.target, tuple(with_bases), tuple(prompts_of(args)), sampling, mode=args.mode, chat=not args.no_chat,
                   repeats=args.repeats, device=args.device, dtype=args.dtype, warmup_tokens=max(0, args.warmup), run_id="bench",
                   reference=args.reference)


class _Bench:
    """One `bench`: load → warm-up → run, collecting results as they come."""

    def __init__(self, plan, quiet: bool, record: bool = False) -> None:
        from app.worker.plan import RunResults
        from app.worker.runfile import RunRecorder

        self.plan = plan
        self.recorder = RunRecorder(plan) if record else None  # every event the window would have shown, timed
        self.w = WorkerRun(quiet, tap=self.recorder.worker_event if self.recorder is not None else None)
        self.sampler = _recording_sampler(self.w, plan) if record else None  # the run file's CPU, memory and GPU plots
        self.results = RunResults(plan)
        self.failed_setups: set[int] = set()
        self.steps: dict[str, list] = {}  # a draft-model lane's steps, by lane id (where lanes of one draft part)
        self.label = ""  # the machine's name in a run file (--label)
        self.device, self.dtype = plan.device or "auto", plan.dtype or "auto"

    def load(self) -> None:
        ev, profiles = self.w.load(self.plan.load_command())
        self.device, self.dtype = ev.engines[0].device, ev.engines[0].dtype
        for p in profiles:
            self.results.profiles[p.key] = p

    def warmup(self) -> list:
        """The unrecorded warm-up run; returns its errors. A setup whose warm-up lane failed fails its recorded lanes
        with that error (they are not run); the other setups run as planned."""
        from app.core.events import RunError

        warm = self.plan.warmup_command()
        errors: list = []
        if warm is not None:
            self.w.run(warm, lambda ev: errors.append(ev) if isinstance(ev, RunError) else None)
        for e in errors:
            i = self.plan.setup_index(e.lane_id) if e.lane_id else None
            if i is not None:
                self.failed_setups.add(i)
                for spec in self.plan.lanes:
                    if self.plan.setup_index(spec.lane_id) == i:
                        failed = RunError(spec.lane_id, f"in the warm-up: {e.message}", kind=e.kind)
                        self.results.on_event(failed)
                        if self.recorder is not None:
                            self.recorder.event(failed, time.monotonic())
        return errors

    def run(self) -> None:
        from app.core.events import LaneDone, RunError, StepEvent

        plan, results, bar = self.plan, self.results, self.w.bar
        finished = [0]
        # greedy draft-model lanes' steps, for where lanes of one draft part (sampled lanes draw apart anyway)
        drafting = {spec.lane_id for spec in plan.lanes if draft_of(spec.setup) is not None} if not plan.sampling.temperature else set()

        def on_event(ev) -> None:
            results.on_event(ev)
            if isinstance(ev, StepEvent) and ev.lane_id in drafting:
                self.steps.setdefault(ev.lane_id, []).append(ev)
            if isinstance(ev, LaneDone) and not plan.is_warmup(ev.lane_id):
                st: Any = ev.stats
                finished[0] += 1
                bar("bench", finished[0], results.total, "lanes", note=f"{st.setup} {st.prompt_id}: {st.tokens_per_s:.1f} tok/s")
            elif isinstance(ev, RunError) and not plan.is_warmup(ev.lane_id):
                finished[0] += 1
                bar("bench", finished[0], results.total, "lanes", note=f"lane {ev.lane_id} failed")
            elif getattr(ev, "emitted_ids", None) and bar.tty:
                bar("bench", finished[0], results.total, "lanes", note=f"{results.tokens} tokens")

        cmd = plan.command(skip=self.failed_setups)
        finished[0] = results.total - len(cmd.lanes)
        bar("bench", finished[0], results.total, "lanes")
        if cmd.lanes:
            self.w.run(cmd, on_event)


def run(args) -> int:
    b = _Bench(plan_of(args), args.quiet, record=bool(args.record))
    b.label = args.label or ""
    failure: str | None = None
    rc = 0
    stuck = False
    try:
        with stop_signals(b.w, signal.SIGINT, signal.SIGTERM):
            try:
                b.load()
                errors = b.warmup()
                if any(e.lane_id is None or b.plan.setup_index(e.lane_id) is None for e in errors):  # the run as a whole failed
                    for e in errors:
                        print(f"error: {e.message}", file=sys.stderr)
                    return 2
                b.run()
            except KeyboardInterrupt:
                failure, rc = f"interrupted ({b.w.stopped_by()})", 130
            except WorkerDiedError as e:
                failure, rc = str(e), 2
            except Stuck as e:
                failure, rc, stuck = f"{e.message}; it was stopped (kill -STOP?) or is hung. Stopped it.", 2, True
    finally:
        b.w.close(kill=stuck)
        if b.sampler is not None:
            b.sampler.close()  # keeps its samples for the run file
    return _report(args, b, failure, rc)


#: telemetry samples a second while `bench --record` runs: the window's rate on few cores (app.ui.load), where each
#: read (psutil for the worker and the host, NVML where there are GPUs) comes out of the lanes' cores
RECORD_TELEMETRY_HZ = 2.0


def _recording_sampler(w: WorkerRun, plan):
    """A started sampler of the worker's CPU and memory, the host's CPU and any GPUs (NVML here, the DCGM exporters of
    served lanes' manifests) for the run file, as the window records its own runs; None where telemetry cannot start
    (the run file then has no samples: nothing else changes)."""
    try:
        from app.telemetry.sampler import TelemetrySampler
        from app.ui.load import prepare_sampler  # Qt-free: the window's own start of a run's telemetry

        def pids() -> dict[str, int]:
            pid = getattr(w.client, "pid", None)  # None until the worker starts
            return {"worker": pid} if pid else {}

        sampler = TelemetrySampler(rate_hz=RECORD_TELEMETRY_HZ, pids=pids)
        sampler.start()
    except Exception as e:
        print(f"warning: the run file will have no telemetry ({e})", file=sys.stderr)
        return None
    if warning := prepare_sampler(sampler, plan.target, plan.setups):  # served lanes' GPUs (DCGM); never raises
        print(f"warning: {warning}", file=sys.stderr)
    return sampler


def _report(args, b: _Bench, failure: str | None, rc: int) -> int:
    """Print and save what completed (also after an interrupt or a dead worker), with every error and warning."""
    results = b.results
    for line in error_lines(list(results.errors.values())):
        print(line, file=sys.stderr)
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
    doc["speedup_intervals"] = speedup_intervals(doc)  # here, not in the window's reports: scipy takes a second to import
    doc["against_fastest"] = against_fastest(doc)
    if not b.plan.sampling.temperature:  # greedy: where lanes of one draft model drafted other tokens (sampled lanes draw apart)
        ended = results.by_lane()
        doc["draft_parting"] = draft_parting([(spec.setup, spec.prompt_id, spec.repeat, b.steps[spec.lane_id]) for spec in b.plan.lanes
                                              if spec.lane_id in b.steps and spec.lane_id in ended])
    if args.record and b.recorder is not None:
        rc = _save_record(b, doc, args.record, stopped=bool(failure)) or rc
    if args.json == "-":
        print(json.dumps(doc, indent=1, ensure_ascii=False))
    else:
        print(render_summary(doc))
        if args.json:
            where = write_json(doc, args.json)
            if where != args.json:
                print(f"error: could not write {args.json}; the report was saved to {where}", file=sys.stderr)
                rc = rc or 2
    return rc or (2 if results.errors else 0)


def _save_record(b: _Bench, doc: dict, path: str, stopped: bool) -> int:
    """Write the run file; when `path` cannot be written, beside it in the current or temp folder (the run is not
    thrown away). Returns 2 when it did not go to `path`."""
    from app.worker.runfile import machine_info, save

    assert b.recorder is not None
    dev = getattr(b.w.ready, "device_info", "") or ""
    b.recorder.machine = machine_info(b.label, gpus=(dev.removeprefix("cuda: "),) if dev.startswith("cuda: ") else ())
    b.recorder.finish(doc, b.sampler.samples() if b.sampler is not None else (), stopped=stopped)
    record = b.recorder.record()
    try:
        save(record, path)
        print(f"run saved to {path} (show it: specdeck gui {path})", file=sys.stderr)
        return 0
    except OSError as e:
        for folder in (os.getcwd(), tempfile.gettempdir()):
            alt = os.path.join(folder, os.path.basename(path) or "bench.specdeck")
            try:
                save(record, alt)
            except OSError:
                continue
            print(f"error: could not write {path} ({e.strerror or e}); the run file was saved to {alt}", file=sys.stderr)
            return 2
        print(f"error: could not write {path} ({e.strerror or e}), nor in the current or temp folder", file=sys.stderr)
        return 2


def error_lines(errors: list) -> list[str]:
    """One line per distinct failure: lanes that failed with the same message (a server that went away, a setup
    that failed in the warm-up) are named together instead of repeating it for each."""
    by: dict[str, list[str]] = {}
    for e in errors:
        by.setdefault(e.message, []).append(e.lane_id or "")
    out = []
    for message, lanes in by.items():
        named = [x for x in lanes if x]
        if not named:
            out.append(f"error: {message}")
        elif len(named) == 1:
            out.append(f"error in lane {named[0]}: {message}")
        else:
            shown = ", ".join(named[:4]) + (f" and {len(named) - 4} more" if len(named) > 4 else "")
            out.append(f"error in {len(named)} lanes ({shown}): {message}")
    return out
