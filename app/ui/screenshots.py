"""Drive the real app through a full run and save PNGs (for the README and `make screenshots`).

    python -m app.ui.screenshots OUTDIR [--preset NAME] [--max-new-tokens N] [--size 1560x980]

Works offscreen (QT_QPA_PLATFORM=offscreen, the default here when no display is set) or under Xvfb.
Writes 01-ready.png, 02-running.png (mid-run), 03-finished.png, 04-results.png, 05-plots.png,
06-dark.png and run.json (the run report); exits 0 when every lane finished.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.ui.screenshots", description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--preset", default=None, help="preset name (default: the app's default for this machine)")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--size", default="1560x980")
    ap.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    args = ap.parse_args(argv)
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.ui.main_window import MainWindow, _engine_statuses
    from app.ui.session import PRESETS, default_preset_name, preset
    from app.ui.theme import DARK, LIGHT

    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    statuses = _engine_statuses()
    name = args.preset or default_preset_name({s.name for s in statuses if s.usable})
    session = preset(name) if args.preset else PRESETS[name]
    if args.max_new_tokens:
        session = session.with_(sampling=session.sampling.__class__(**{**session.sampling.__dict__, "max_new_tokens": args.max_new_tokens}))
    # a private settings file: screenshots never change the user's remembered session
    settings = QSettings(str(out / ".specdeck-screenshots.ini"), QSettings.Format.IniFormat)
    win = MainWindow(settings=settings, session=session, statuses=statuses)
    win.apply_theme(LIGHT)
    w, h = (int(x) for x in args.size.lower().split("x"))
    win.resize(w, h)
    win.show()
    expected = len(win.lane_rows) * session.sampling.max_new_tokens
    state = {"mid": False, "rc": 1, "t0": time.monotonic()}
    saved: list[str] = []

    def shot(fname: str, widget=None) -> None:
        app.processEvents()
        p = str(out / fname)
        (widget or win).grab().save(p)
        saved.append(p)

    def watch() -> None:
        if time.monotonic() - state["t0"] > args.timeout:
            print("screenshots: timed out", file=sys.stderr)
            app.quit()
            return
        if not state["mid"] and win.running:
            done = sum(v.acc.new_tokens for v in win.lane_views)
            if done >= 0.45 * expected:
                state["mid"] = True
                win.plots.redraw(force=True)
                shot("02-running.png")

    def finished(_rid: str) -> None:
        def later() -> None:
            win.tabs.setCurrentWidget(win.results)
            shot("03-finished.png")
            shot("04-results.png", win.results)
            win.tabs.setCurrentWidget(win.plots)
            win.plots.redraw(force=True)
            app.processEvents()
            win.plots.save_png(str(out / "05-plots.png"))
            saved.append(str(out / "05-plots.png"))
            win.apply_theme(DARK)
            win.tabs.setCurrentWidget(win.results)
            shot("06-dark.png")
            win.export_json(str(out / "run.json"))
            state["rc"] = 0 if win.done_stats and not win.lane_errors else 1
            win.close()
            app.quit()

        QTimer.singleShot(400, later)

    win.runEnded.connect(finished)
    timer = QTimer()
    timer.setInterval(50)
    timer.timeout.connect(watch)
    timer.start()

    def start() -> None:
        shot("01-ready.png")
        if win.run() is None:
            print(f"screenshots: cannot run: {win.status_label.text()}", file=sys.stderr)
            app.quit()

    QTimer.singleShot(300, start)
    app.exec()
    for p in saved:
        print(p)
    return state["rc"]


if __name__ == "__main__":
    sys.exit(main())
