"""Typed, immutable, picklable messages between a client (GUI, CLI) and the worker process.

Commands go client → worker; events (these plus app.core.events) go worker → client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from app.core.events import Event, LaneDone, LaneStarted, LogEvent, Progress, RunError, StepEvent
from app.core.setups import Sampling

__all__ = [
    "LaneSpec",
    "LoadEngines",
    "RunLanes",
    "Cancel",
    "Shutdown",
    "Ping",
    "Command",
    "WorkerReady",
    "EnginesLoaded",
    "LoadedEngine",
    "RunFinished",
    "Pong",
    "Heartbeat",
    "HEARTBEAT_S",
    "WorkerDied",
    "WorkerEvent",
    "Mode",
    "MODES",
]

Mode = Literal["sequential", "interleaved", "paced"]  # app.worker.scheduler.schedule
#: every Mode, for choices and checks (bench, gui, sessions, the scheduler)
MODES: tuple[str, ...] = get_args(Mode)


@dataclass(frozen=True)
class LaneSpec:
    """One lane: a setup string on one prompt (text, or ids when already tokenized)."""

    lane_id: str
    setup: str
    prompt_id: str
    prompt: str
    repeat: int = 0
    group: str = ""  # lanes of one group are interleaved together; groups run one after another
    category: str = ""  # the prompt's category (a suite's, a prompts file's): k=auto learns what drafting saves, and its acceptance, per category


@dataclass(frozen=True)
class LoadEngines:
    """Load (and convert if needed) the target and drafts into the worker's pool; answers EnginesLoaded."""

    request_id: str
    target: str
    drafts: tuple[str | tuple[str, str | None], ...] = ()  # names, or (name, draft dtype)
    device: str | None = None
    dtype: str | None = None
    others: tuple[tuple[str, tuple[tuple[str, str | None], ...]], ...] = ()  # other targets (`…@<target>` lanes) and their drafts
    profile: bool = False  # also get each engine's cost profile (cached, or measured now): sent as ProfileReady events
    force_profile: bool = False  # measure the profiles again even when cached (`profile --force`)


@dataclass(frozen=True)
class RunLanes:
    run_id: str
    target: str
    lanes: tuple[LaneSpec, ...]
    sampling: Sampling
    mode: Mode = "sequential"
    chat: bool = True
    device: str | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class Cancel:
    """Cancel a run (all its lanes) or, with lane_id, one lane; takes effect between steps."""

    run_id: str
    lane_id: str | None = None


@dataclass(frozen=True)
class Ping:
    request_id: str


@dataclass(frozen=True)
class Shutdown:
    pass


Command = LoadEngines | RunLanes | Cancel | Ping | Shutdown


@dataclass(frozen=True)
class WorkerReady:
    pid: int
    startup_s: float  # spawn → ready, measured in the worker from its own start
    torch_version: str
    device_info: str


@dataclass(frozen=True)
class LoadedEngine:
    """One engine a LoadEngines loaded (or found loaded): what it runs on and how long its load took."""

    name: str
    device: str
    dtype: str
    load_s: float


@dataclass(frozen=True)
class EnginesLoaded:
    request_id: str
    engines: tuple[LoadedEngine, ...]  # the target first, in load order


@dataclass(frozen=True)
class RunFinished:
    """Every lane of a run has ended (done, cancelled or failed)."""

    run_id: str
    cancelled: bool = False


@dataclass(frozen=True)
class Pong:
    request_id: str
    t_sent: float


@dataclass(frozen=True)
class Heartbeat:
    """Sent by the worker every HEARTBEAT_S seconds from a thread of its own, even during a long forward or load:
    a client that hears nothing at all for many periods knows the worker is stopped or hung, not busy."""

    t: float


HEARTBEAT_S = 1.0


@dataclass(frozen=True)
class WorkerDied:
    """Produced by the client (not the worker) when the worker process ends unexpectedly."""

    exitcode: int | None
    message: str


WorkerEvent = Event | WorkerReady | EnginesLoaded | RunFinished | Pong | Heartbeat | WorkerDied
# re-exported for convenience
_ = (LaneStarted, LogEvent, Progress, LaneDone, RunError, StepEvent)
