"""Drive the real app through a full run and save PNGs (for the README and `make screenshots`).

    python -m app.ui.screenshots OUTDIR [--preset NAME] [--max-new-tokens N] [--size 1560x980] [--beside RUNFILE]

Works offscreen (QT_QPA_PLATFORM=offscreen, the default here when no display is set) or under Xvfb.
Writes 01-ready.png, 02-running.png (mid-run), 03-finished.png, 04-results.png, 05-plots.png,
06-dark.png, 07-costs.png (the window on its Costs tab), 10-present.png (presentation mode), run.json (the run
report) and run.specdeck (the run file); with --beside, 11-beside.png: a recorded run (e.g. one from another
machine) beside the live one. Exits 0 when every lane finished.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _window(args, out: Path):
    """The window on the chosen preset, with a private settings file (screenshots never change the user's
    remembered session)."""
    from dataclasses import replace

    from PySide6.QtCore import QSettings

    from app.ui.main_window import MainWindow, engine_statuses
    from app.ui.session import PRESETS, default_preset_name, preset
    from app.ui.theme import LIGHT

    statuses = engine_statuses()
    name = args.preset or default_preset_name({s.name for s in statuses if s.usable})
    session = preset(name) if args.preset else PRESETS[name]
    if args.max_new_tokens:
        session = session.with_(sampling=replace(session.sampling, max_new_tokens=args.max_new_tokens))
    settings = QSettings(str(out / ".specdeck-screenshots.ini"), QSettings.Format.IniFormat)
    win = MainWindow(settings=settings, session=session, statuses=statuses)
    win.apply_theme(LIGHT)
    w, h = (int(x) for x in args.size.lower().split("x"))
    win.resize(w, h)
    win.show()
    return win


class _Shooter:
    """Takes the shots as the run goes: ready, mid-run (45 % of the tokens), finished, results, plots, dark."""

    def __init__(self, app, win, out: Path, timeout: float, beside: str | None = None) -> None:
        self.app, self.win, self.out, self.timeout, self.beside = app, win, out, timeout, beside
        self.expected = len(win.lane_rows) * win.setup_panel.max_tok_spin.value()
        self.mid = False
        self.rc = 1
        self.t0 = time.monotonic()
        self.saved: list[str] = []

    def shot(self, fname: str, widget=None) -> None:
        self.app.processEvents()
        p = str(self.out / fname)
        (widget or self.win).grab().save(p)
        self.saved.append(p)

    def watch(self) -> None:
        win = self.win
        if time.monotonic() - self.t0 > self.timeout:
            print("screenshots: timed out", file=sys.stderr)
            self.app.quit()
            return
        if not self.mid and win.running and sum(v.acc.new_tokens for v in win.lane_views) >= 0.45 * self.expected:
            self.mid = True
            win.plots.redraw(force=True)
            self.shot("02-running.png")

    def start(self) -> None:
        self.shot("01-ready.png")
        if self.win.run() is None:
            print(f"screenshots: cannot run: {self.win.status_label.text()}", file=sys.stderr)
            self.app.quit()

    def finished(self) -> None:
        from app.ui.theme import DARK

        win = self.win
        win.tabs.setCurrentWidget(win.results)
        self.shot("03-finished.png")
        self.shot("04-results.png", win.results)
        win.tabs.setCurrentWidget(win.plots)
        win.plots.redraw(force=True)
        self.app.processEvents()
        win.plots.save_png(str(self.out / "05-plots.png"))
        self.saved.append(str(self.out / "05-plots.png"))
        win.tabs.setCurrentWidget(win.costs)
        self.shot("07-costs.png")
        win.apply_theme(DARK)
        win.tabs.setCurrentWidget(win.results)
        self.shot("06-dark.png")
        win.export_json(str(self.out / "run.json"))
        win.save_run(str(self.out / "run.specdeck"))
        from app.ui.theme import LIGHT

        win.apply_theme(LIGHT)
        size = win.size()
        win.present(True)
        win.tabs.setCurrentWidget(win.plots)
        win.plots.redraw(force=True)
        self.shot("10-present.png")
        win.present(False)
        win.resize(size)
        if self.beside:
            if win.open_run_beside(self.beside):
                win.tabs.setCurrentWidget(win.results)
                self.shot("11-beside.png")
            else:
                print(f"screenshots: {win.status_label.text()}", file=sys.stderr)
        results = win.controller.results
        self.rc = 0 if results is not None and results.all_completed else 1
        win.close()
        self.app.quit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.ui.screenshots", description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--preset", default=None, help="preset name (default: the app's default for this machine)")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--size", default="1560x980")
    ap.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    ap.add_argument("--beside", metavar="RUNFILE", help="a run file to put beside the live run (11-beside.png)")
    args = ap.parse_args(argv)
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import shiboken6
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    win = _window(args, out)
    shooter = _Shooter(app, win, out, args.timeout, args.beside)
    win.runEnded.connect(lambda _rid: QTimer.singleShot(400, shooter.finished))
    timer = QTimer()
    timer.setInterval(50)
    timer.timeout.connect(shooter.watch)
    timer.start()
    QTimer.singleShot(300, shooter.start)
    app.exec()
    win.close()
    shiboken6.delete(win)  # before the interpreter tears Qt down (PySide 6.11 + pyqtgraph segfault at exit otherwise)
    for p in shooter.saved:
        print(p)
    return shooter.rc


if __name__ == "__main__":
    sys.exit(main())
