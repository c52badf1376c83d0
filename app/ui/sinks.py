"""Run sinks: every panel that shows a run (lane views, plots, results, status bar) implements one protocol,
and the run controller fans each event out to the sinks it was given, in one list.

The controller folds every event into the run's :class:`~app.worker.plan.RunResults` *before* a sink sees it,
so a sink may read the accounting (finished lanes, baseline comparisons) from ``on_event``. Sinks receive
every event of the run, warm-up lanes included (``RunPlan.is_warmup(ev.lane_id)``), plus the worker's
``WorkerReady`` and the controller's own :class:`WorkerSilence`; they ignore what they do not show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from app.ui.theme import Theme
    from app.worker.plan import RunPlan, RunResults

__all__ = ["RunSink", "WorkerSilence"]


@runtime_checkable
class RunSink(Protocol):
    """A display of runs."""

    def start_run(self, plan: RunPlan, results: RunResults) -> None:
        """A run begins: clear, and prepare one place per lane of `plan`; `results` fills as events arrive."""

    def on_event(self, ev: object, t_recv: float) -> None:
        """One worker event, received at `t_recv` (monotonic seconds), already folded into the results."""

    def finish(self, results: RunResults) -> None:
        """The run ended (every lane done, stopped, or the worker died); `results.stopped` tells which."""

    def set_theme(self, theme: Theme) -> None:
        """Restyle for a light or dark theme."""

    # Optional: ``on_frame() -> None``, called once per display frame while a run is going, after the frame's
    # events were delivered (app.ui.run_controller.frame_ms): the place to draw what accumulated.


@dataclass(frozen=True)
class WorkerSilence:
    """Made by the controller (not the worker) and fanned out to the sinks like an event: the worker has sent
    nothing for `silent_s` seconds while a run is going (stopped with SIGSTOP, or hung); 0.0 when it answered
    again after such a notice."""

    silent_s: float

    @property
    def message(self) -> str:
        return f"the worker has not answered for {self.silent_s:.0f} s: stopped or hung? Stop kills it"
