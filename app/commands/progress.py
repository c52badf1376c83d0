"""Progress of the commands' long tasks (conversion, loading, profiling, benchmarks) on stderr.

On a terminal each task is a tqdm bar. Anywhere else (a log file, a pipe, CI) a bar would print hundreds of
carriage-return frames per line, so each task prints a line when it starts, one per 10 % (once it has run for a
second: a task that ends sooner prints only its start and end) and one when it ends. Sizes reported in MiB are shown
in whole MiB in both modes.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["ProgressBars", "STEP"]

#: a task in a log prints a line each time it crosses another STEP of its total
STEP = 0.10


@dataclass
class _Line:
    total: float
    started: float = field(default_factory=time.monotonic)
    printed_step: int = -1
    printed_t: float = 0.0


class ProgressBars:
    """Callable as `progress(task, done, total, unit="", note="")`; `close()` ends every open task.

    Args:
        quiet: print nothing.
        stream: where to print (default sys.stderr).
        tty: bars (True) or lines (False); default: whether `stream` is a terminal.
        settle_s: in line mode, no percentage line before a task has run this long.
    """

    def __init__(self, quiet: bool = False, stream: TextIO | None = None, tty: bool | None = None, settle_s: float = 1.0) -> None:
        self.quiet = quiet
        self.settle_s = settle_s
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.bars: dict[str, Any] = {}
        self.lines: dict[str, _Line] = {}

    def __call__(self, task: str, done: float, total: float, unit: str = "", note: str = "") -> None:
        if self.quiet:
            return
        if unit == "MiB":  # whole MiB; a finished task stays finished after rounding
            done, total = (round(total) if total and done >= total else int(done)), round(total)
        if self.tty:
            self._bar(task, done, total, unit, note)
        else:
            self._line(task, done, total, unit, note)

    def _bar(self, task: str, done: float, total: float, unit: str, note: str) -> None:
        from tqdm import tqdm

        bar = self.bars.get(task)
        if bar is None:
            bar = self.bars[task] = tqdm(total=total or None, desc=task, unit=unit or "it", leave=False, file=self.stream, dynamic_ncols=True)
        if total and bar.total != total:
            bar.total = total
        bar.n = done
        if note:
            bar.set_postfix_str(note, refresh=False)
        bar.refresh()
        if total and done >= total:
            bar.close()
            self.bars.pop(task, None)

    def _line(self, task: str, done: float, total: float, unit: str, note: str) -> None:
        st = self.lines.get(task)
        if st is None:
            st = self.lines[task] = _Line(total)
            if not total or done < total:
                self._print(f"{task}…" + (f" ({_amount(total, unit)})" if total else ""))
        st.total = total or st.total
        if not st.total:
            return
        if done >= st.total:
            self._print(f"{task}: done, {_amount(st.total, unit)} in {time.monotonic() - st.started:.1f} s" + (f" — {note}" if note else ""))
            del self.lines[task]
            return
        step = int(done / st.total / STEP)
        if step > st.printed_step and step > 0 and time.monotonic() - st.started >= self.settle_s:
            st.printed_step = step
            self._print(f"{task}: {step * STEP:.0%} ({_amount(done, unit, of=st.total)})" + (f" — {note}" if note else ""))

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """End every task still open (a bar is removed; a line-mode task says how far it got)."""
        for b in self.bars.values():
            b.close()
        self.bars.clear()
        for task, st in self.lines.items():
            took = time.monotonic() - st.started
            self._print(f"{task}: done in {took:.1f} s" if not st.total else f"{task}: stopped at {max(st.printed_step, 0) * STEP:.0%} after {took:.1f} s")
        self.lines.clear()


def _amount(x: float, unit: str, of: float | None = None) -> str:
    def num(v: float) -> str:
        return f"{v:,.0f}" if float(v).is_integer() or unit == "MiB" else f"{v:,.1f}"

    u = f" {unit}" if unit else ""
    return f"{num(x)} of {num(of)}{u}" if of is not None else f"{num(x)}{u}"
