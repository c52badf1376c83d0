"""Run files: one run as it happened — its plan, every event with the time it was received, the telemetry samples,
the results, the engines and the machine — in one file (``.specdeck``: gzip-compressed JSON), read back to show the
run without a worker or a model, or to replay it at its recorded pace.

    rec = RunRecorder(plan, machine=machine_info(label="laptop"))
    rec.event(ev, t_recv)            # every event the displays get, with its monotonic receive time
    rec.finish(report, telemetry, stopped=False)
    save(rec.record(), "run.specdeck")
    r = load("run.specdeck")         # RunRecord: plan, events [(t, ev)], telemetry [(t, sample)], report, machine

Times in the file are seconds since the run started (its first command); events keep their order. Events are the
frozen dataclasses of :mod:`app.core.events` and :mod:`app.worker.messages` (plus any class a display registers
with :func:`register`), written field by field with their type's name; tuples come back as tuples.

Contract: :func:`load` returns a complete :class:`RunRecord` or raises :class:`RunFileError` with one message naming
what is wrong (not a run file, made by a newer SpecDeck, damaged: which part) — never a half-read record. A 4-lane,
500-token run is about 50 kB.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import platform
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from app.core import costs as costs_module
from app.core import events as events_module
from app.core.errors import SpecDeckError
from app.core.metrics import LaneStats
from app.core.prompts import Prompt
from app.core.setups import Sampling
from app.worker import messages as messages_module
from app.worker.plan import RunPlan

__all__ = ["FORMAT", "VERSION", "SUFFIX", "MIME_TYPE", "MAX_BESIDE_LANES", "RunFileError", "RunRecord", "RunRecorder", "register",
           "encode", "decode", "save", "load", "machine_info", "beside"]

#: the most lanes runs put beside each other may have together
MAX_BESIDE_LANES = 8

FORMAT = "specdeck-run"
#: the run-file version this SpecDeck writes and the newest it reads
VERSION = 1
SUFFIX = ".specdeck"
MIME_TYPE = "application/x-specdeck-run"


class RunFileError(SpecDeckError):
    """A run file that cannot be shown: not one, from a newer SpecDeck, or damaged (the message says which)."""


_TYPES: dict[str, type] = {}


def register(cls: type) -> type:
    """Let run files hold instances of dataclass `cls` (by its class name); usable as a decorator."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    _TYPES[cls.__name__] = cls
    return cls


for _mod in (events_module, messages_module, costs_module):
    for _name in dir(_mod):
        _obj = getattr(_mod, _name)
        if isinstance(_obj, type) and dataclasses.is_dataclass(_obj) and _obj.__module__ == _mod.__name__:
            register(_obj)
for _cls in (LaneStats, Prompt, Sampling, RunPlan):
    register(_cls)


# --- the codec ---------------------------------------------------------------------------------------------
def encode(obj):
    """`obj` as JSON-ready data: a registered dataclass becomes {"$t": its name, field: value…}, tuples lists."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"$f": repr(obj)}  # JSON has no NaN / inf
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = type(obj).__name__
        if _TYPES.get(name) is not type(obj):
            raise TypeError(f"{name} is not registered for run files (app.worker.runfile.register)")
        return {"$t": name, **{f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}}
    if isinstance(obj, tuple | list):
        return [encode(x) for x in obj]
    if isinstance(obj, dict):
        return {"$d": [[encode(k), encode(v)] for k, v in obj.items()]} if any(not isinstance(k, str) for k in obj) else \
            {k: encode(v) for k, v in obj.items()}
    raise TypeError(f"cannot write a {type(obj).__name__} to a run file")


def _tuples(x):
    return tuple(_tuples(y) for y in x) if isinstance(x, list) else x


def decode(data):
    """Inverse of :func:`encode`.

    Raises:
        RunFileError: an unknown record type or a field its type does not have.
    """
    if isinstance(data, list):
        return [decode(x) for x in data]
    if not isinstance(data, dict):
        return data
    if "$f" in data:
        return float(data["$f"])
    if "$d" in data:
        return {_tuples(decode(k)): decode(v) for k, v in data["$d"]}
    if "$t" not in data:
        return {k: decode(v) for k, v in data.items()}
    name = data["$t"]
    cls = _TYPES.get(name)
    if cls is None:
        raise RunFileError(f"it holds a record of type {name!r}, which this SpecDeck does not know")
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kw = {}
    for k, v in data.items():
        if k == "$t":
            continue
        f = known.get(k)
        if f is None:
            raise RunFileError(f"its {name} records have a field {k!r}, which this SpecDeck's {name} does not have")
        v = decode(v)
        if isinstance(v, list) and "tuple" in str(f.type):
            v = _tuples(v)
        kw[k] = v
    try:
        return cls(**kw)
    except SpecDeckError as e:
        raise RunFileError(f"a {name} record cannot be rebuilt here ({e.message})") from None
    except (TypeError, ValueError) as e:
        raise RunFileError(f"a {name} record cannot be rebuilt ({e})") from None


# --- the machine ---------------------------------------------------------------------------------------------
def machine_info(label: str = "", gpus: tuple[str, ...] = ()) -> dict:
    """What the run ran on: `label` (how views name it; default: the first GPU's name, else the host name), the CPU
    summary every figure is quoted with, the GPUs, the OS and Python."""
    host = platform.node()
    short = (gpus[0].replace("NVIDIA ", "") if gpus else "") or host or "this machine"
    return {"label": label or short, "cpu": costs_module.machine_summary(), "gpus": list(gpus), "host": host,
            "platform": platform.platform(terse=True), "python": platform.python_version()}


# --- records ------------------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """A run read from (or about to go to) a run file.

    Attributes:
        plan: the run's plan (built without this machine's engines: `recorded=True`).
        events: (seconds since the run started, event) in the order they were received.
        telemetry: (seconds since the run started, TelemetrySample as saved by ``to_json``) — plain dicts, so that
            this module needs no telemetry import; displays rebuild samples from them.
        duration_s: from the run's start to its end.
        stopped: the run was stopped by the user (or its worker died).
        report: the run's JSON report (the bench schema, with the GUI's additions) as it was saved.
        machine: :func:`machine_info` of the machine it ran on.
        saved: when it was saved (ISO 8601), app_version: the SpecDeck that saved it.
    """

    plan: RunPlan
    events: list[tuple[float, object]]
    telemetry: list[tuple[float, dict]] = field(default_factory=list)
    duration_s: float = 0.0
    stopped: bool = False
    report: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    saved: str = ""
    app_version: str = ""

    @property
    def label(self) -> str:
        """How views name the machine (e.g. "H200", "laptop")."""
        return str(self.machine.get("label") or "recorded")


class RunRecorder:
    """Collects a run as it happens (events with their monotonic receive times), then makes its :class:`RunRecord`.

    Args:
        plan: the run's plan; its engines' tokenizer tags are pinned now (a replay elsewhere compares lanes as here).
        t0: monotonic time of the run's start (default: now).
    """

    def __init__(self, plan: RunPlan, machine: dict | None = None, t0: float | None = None) -> None:
        self.plan = plan.pinned()
        self.t0 = time.monotonic() if t0 is None else t0
        self.machine = machine if machine is not None else machine_info()
        self.events: list[tuple[float, object]] = []
        self.t_end: float | None = None
        self.stopped = False
        self.report: dict = {}
        self.telemetry: list[tuple[float, dict]] = []

    def event(self, ev: object, t_recv: float) -> None:
        """An event as the displays got it. Events keep the order they were shown in; a time earlier than the
        previous event's (a step that waited for a display frame while a lane's end went out at once) is read as
        the previous one's, so a replay shows them in the same order."""
        if _TYPES.get(type(ev).__name__) is not type(ev):
            return  # not a run's event (nothing a display draws from): a run file keeps what replays
        t = max(0.0, t_recv - self.t0, self.events[-1][0] if self.events else 0.0)
        self.events.append((t, ev))

    def worker_event(self, ev: object, t_recv: float) -> None:
        """Anything a worker sent: what the window would have shown is kept (heartbeats and the worker's own state
        are not part of a run)."""
        if not isinstance(ev, messages_module.Heartbeat | messages_module.WorkerReady | messages_module.WorkerDied | messages_module.RunFinished):
            self.event(ev, t_recv)

    def finish(self, report: dict, telemetry=(), stopped: bool = False, t_end: float | None = None) -> None:
        """The run ended: its report, its telemetry samples (TelemetrySample objects, those from the run's start on
        are kept) and whether it was stopped."""
        self.t_end = time.monotonic() if t_end is None else t_end
        self.stopped, self.report = stopped, report
        self.telemetry = [(s.t_mono - self.t0, s.to_json()) for s in telemetry if s.t_mono >= self.t0 - 1.0]

    def record(self) -> RunRecord:
        from app import __version__

        end = self.t_end if self.t_end is not None else time.monotonic()
        return RunRecord(self.plan, list(self.events), list(self.telemetry), max(0.0, end - self.t0), self.stopped,
                         self.report, self.machine, time.strftime("%Y-%m-%dT%H:%M:%S%z"), __version__)


# --- files --------------------------------------------------------------------------------------------------
def _rounded(t: float) -> float:
    return round(t, 4)  # 0.1 ms: below any receive time's meaning, and it keeps the file small


def save(record: RunRecord, path: str | os.PathLike) -> Path:
    """Write `record` to `path` (gzip-compressed JSON; written beside and renamed, so a failed save leaves no
    half-written file). Returns the path.

    Raises:
        OSError: the folder cannot be written.
    """
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "app": record.app_version,
        "saved": record.saved,
        "machine": record.machine,
        "plan": encode(record.plan),
        "duration_s": _rounded(record.duration_s),
        "stopped": record.stopped,
        "events": [[_rounded(t), encode(ev)] for t, ev in record.events],
        "telemetry": [[_rounded(t), s] for t, s in record.telemetry],
        "report": record.report,
    }
    raw = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    try:
        with gzip.open(tmp, "wb", compresslevel=6) as f:
            f.write(raw)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load(path: str | os.PathLike) -> RunRecord:
    """Read a run file.

    Raises:
        RunFileError: unreadable, not a SpecDeck run file, from a newer SpecDeck, or damaged — one message naming the
            file and what to do.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        if isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError):
            raise RunFileError(f"cannot read run file {path}: {e.strerror}", fix="check the path") from None
        raise RunFileError(f"{path} is not a SpecDeck run file (not gzip-compressed: {e})",
                           fix="open a file saved by File ▸ Save run or `bench --record`") from None
    except (EOFError, zlib.error) as e:
        raise RunFileError(f"{path} is a damaged run file (cut short or corrupt: {e})", fix="save the run again") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RunFileError(f"{path} is a damaged run file (its JSON does not parse: {e})", fix="save the run again") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RunFileError(f"{path} is not a SpecDeck run file", fix="open a file saved by File ▸ Save run or `bench --record`")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise RunFileError(f"{path} is a damaged run file (version {version!r})", fix="save the run again")
    if version > VERSION:
        from app import __version__

        raise RunFileError(f"{path} was saved by a newer SpecDeck ({doc.get('app') or '?'}, run file version {version}); this is "
                           f"SpecDeck {__version__}, which reads version {VERSION}", fix="update SpecDeck to open it")
    try:
        return _record(doc)
    except RunFileError as e:
        raise RunFileError(f"{path} is a damaged run file: {e.message}", fix="save the run again") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise RunFileError(f"{path} is a damaged run file ({type(e).__name__}: {e})", fix="save the run again") from None


def _record(doc: dict) -> RunRecord:
    plan = decode({**doc["plan"], "recorded": True})
    if not isinstance(plan, RunPlan):
        raise RunFileError("its plan is not a run plan")
    events = []
    last = 0.0
    for t, ev in doc["events"]:
        t = float(t)
        if not math.isfinite(t) or t < last - 1e-6:
            raise RunFileError(f"its event times go backwards or are not numbers (at {t!r})")
        last = t
        events.append((t, decode(ev)))
    telemetry = [(float(t), s) for t, s in doc.get("telemetry", [])]
    if not all(isinstance(s, dict) for _, s in telemetry):
        raise RunFileError("its telemetry samples are not records")
    report = doc.get("report", {})
    machine = doc.get("machine", {})
    if not isinstance(report, dict) or not isinstance(machine, dict):
        raise RunFileError("its report or machine is not a record")
    return RunRecord(plan, events, telemetry, float(doc.get("duration_s", last)), bool(doc.get("stopped", False)), report,
                     machine, str(doc.get("saved", "")), str(doc.get("app", "")))


# --- runs beside each other ------------------------------------------------------------------------------------
def _moved(ev: object, offset: int, prefix: str) -> object:
    """`ev` of the second run: its lanes numbered after the first run's, its stats on a prompt of its own (so each
    lane is compared with its own run's baseline)."""
    lane = getattr(ev, "lane_id", None)
    if not isinstance(lane, str):
        return ev
    head, sep, tail = lane.rpartition("L")
    if not tail.isdigit():
        return ev
    moved = dataclasses.replace(ev, lane_id=f"{head}{sep}{int(tail) + offset}")  # type: ignore[type-var]
    stats = getattr(moved, "stats", None)
    if isinstance(stats, LaneStats):
        moved = dataclasses.replace(moved, stats=dataclasses.replace(stats, prompt_id=f"{prefix}/{stats.prompt_id}"))  # type: ignore[type-var]
    return moved


def beside(first: RunRecord, second: RunRecord) -> RunRecord:
    """Two recorded runs as one, racing from the same start: the second's lanes after the first's, every lane
    labelled with its machine, each compared with its own run's baseline. The telemetry is the first run's.

    Raises:
        RunFileError: a run of several prompts or repeats (bench --suite), or more than :data:`MAX_BESIDE_LANES` lanes.
    """
    for r in (first, second):
        if not r.plan.single:
            raise RunFileError(f"the run recorded on {r.label} has {len(r.plan.prompts)} prompts × {r.plan.repeats} repeats; runs are "
                               "put beside each other one prompt at a time", fix="record one prompt (the window, or bench --prompt)")
    n, m = len(first.plan.setups), len(second.plan.setups)
    if n + m > MAX_BESIDE_LANES:
        raise RunFileError(f"{n} + {m} lanes: at most {MAX_BESIDE_LANES} lanes fit beside each other",
                           fix="open a run with fewer lanes beside this one")
    la, lb = first.label, second.label
    if lb == la:
        lb = f"{lb} (2)"
    a_machines = first.plan.machines or (la,) * n
    plan = dataclasses.replace(first.plan, setups=first.plan.setups + second.plan.setups, machines=a_machines + (lb,) * m,
                               tokenizer_tags=tuple(sorted(set(first.plan.tokenizer_tags) | set(second.plan.tokenizer_tags))),
                               reference=None, recorded=True, run_id=f"{first.plan.run_id}+{second.plan.run_id}")
    events = sorted([*first.events, *((t, _moved(ev, n, lb)) for t, ev in second.events)], key=lambda x: x[0])
    report = {"beside": [{"machine": first.machine, "report": first.report}, {"machine": {**second.machine, "label": lb},
                                                                             "report": second.report}]}
    return RunRecord(plan, events, list(first.telemetry), max(first.duration_s, second.duration_s), first.stopped or second.stopped,
                     report, {**first.machine, "label": f"{la} + {lb}"}, first.saved, first.app_version)
