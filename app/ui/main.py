"""`python -m app gui`: start the SpecDeck window.

python -m app gui [RUNFILE [--beside RUNFILE2]] [--replay SPEED] [--preset NAME] [--target ENGINE] [--setup SPEC ...] [--prompt TEXT]
                  [--max-new-tokens N] [--mode interleaved|paced|sequential] [--dark] [--present]
                  [--autorun] [--screenshot PATH] [--export PATH] [--quit-after-run]
                  [--size WxH] [--settings PATH]

With RUNFILE (a run saved by File ▸ Save run or `bench --record`), the window shows that run as it finished — or
replays it at SPEED times its recorded pace — with no worker and no model. A run file that cannot be shown is one
message (on stderr, and in a dialog when the window would have been on a screen); no window is left half-drawn.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

__all__ = ["main", "build_parser", "gui_app", "check_paths", "export_report", "ICON", "DESKTOP_ID", "collect_garbage_in_the_event_loop",
           "collect_due_garbage"]

#: the app's icon (the window's, the launcher's: app.commands.desktop installs it in the icon theme)
ICON = Path(__file__).resolve().parents[2] / "resources" / "icons" / "specdeck.svg"
#: the desktop entry's id (specdeck.desktop): the window says it, so task bars match it to the launcher
DESKTOP_ID = "specdeck"


def build_parser() -> argparse.ArgumentParser:
    from app.worker.messages import MODES

    p = argparse.ArgumentParser(prog="specdeck gui", description="Compare decoding setups side by side.")
    p.add_argument("runfile", nargs="?", metavar="RUNFILE",
                   help="a run file (.specdeck, from File ▸ Save run or `bench --record`) to show as it finished")
    p.add_argument("--beside", metavar="RUNFILE2", help="put a second run file beside RUNFILE (e.g. a GPU run beside a laptop run)")
    p.add_argument("--replay", type=float, metavar="SPEED",
                   help="replay RUNFILE at SPEED times its recorded pace (1, 2, 4…) instead of showing it as it finished")
    p.add_argument("--preset", help="start from a preset ('PyTorch and llama.cpp side by side', 'Baseline vs draft model vs n-gram', "
                   "'SmolLM2 quick'; aliases qwen, qwen-torch, smollm2)")
    p.add_argument("--target", help="target engine name or model folder")
    p.add_argument("--setup", action="append", default=None, help="a lane's setup string (repeatable, 1–4)")
    p.add_argument("--prompt", help="prompt text")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--dark", action="store_true", help="dark palette")
    p.add_argument("--present", action="store_true", help="start in presentation mode (full screen, large text; F11 leaves it)")
    p.add_argument("--autorun", action="store_true", help="start a run immediately")
    p.add_argument("--screenshot", metavar="PATH", help="save a PNG of the window when the run ends (or at once without --autorun)")
    p.add_argument("--export", metavar="PATH",
                   help="write the run's JSON report (the bench schema + telemetry + gui) to PATH when the run ends")
    p.add_argument("--quit-after-run", action="store_true", help="quit when the run ends (exit code 0 when every lane finished)")
    p.add_argument("--size", default="1560x980", help="window size WxH (default 1560x980)")
    p.add_argument("--settings", metavar="PATH", help="keep settings in this .ini file instead of the user's (automation, tests)")
    return p


def gui_app():
    """The QApplication as the GUI runs it (benchmarks that drive the real window start it this way too): Qt's
    painting kept on the window's own threads on a few-core machine (before Qt paints anything), workers started
    from a thread kept at normal priority, and the window's own threads then yielding the CPU to them (on 2 cores the
    GUI's wake-ups slowed the lanes it measures: app.ui.priority).

    Returns:
        (the QApplication, what :func:`app.ui.priority.yield_to_worker` said: "" when the threads were lowered).
    """
    from PySide6.QtWidgets import QApplication

    from app.ui.priority import serial_painting, yield_to_worker
    from app.worker.client import spawn_from_a_steady_thread

    serial_painting()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    collect_garbage_in_the_event_loop()
    return app, yield_to_worker(keep={spawn_from_a_steady_thread()})


_COLLECTOR = None


def collect_garbage_in_the_event_loop(interval_s: float = 1.0) -> None:
    """Python's cycle collector off, run instead from a timer of the event loop (once per process).

    Left automatic, a collection can start inside a Qt destructor that calls back into Python (a pyqtgraph item's
    size hint while it is being unparented) and free another Qt object there: Qt then waits on a mutex its own
    thread holds and the window hangs (seen once in the test suite, in QObject::~QObject under a QGraphicsWidget
    destructor). From the timer, collections happen only between events, where no destructor is running.
    """
    global _COLLECTOR
    if _COLLECTOR is None:
        from pyqtgraph.util.garbage_collector import GarbageCollector

        _COLLECTOR = GarbageCollector(interval=interval_s)


def collect_due_garbage() -> None:
    """Collect the generations whose thresholds are passed, as the automatic collector would, at a point the caller
    knows to be safe (no Qt destructor on the stack): the tests call it between tests."""
    import gc

    t0, t1, t2 = gc.get_threshold()
    c0, c1, c2 = gc.get_count()
    if c0 > t0:
        gc.collect(2 if c1 > t1 and c2 > t2 else 1 if c1 > t1 else 0)


def check_paths(args) -> None:
    """Refuse, before any window or worker exists, output paths that cannot be written and a settings path that is
    a folder: a run of minutes must not end with nowhere to put its report.

    Raises:
        SetupError: naming the option, the path and the fix.
    """
    import os

    from app.core.errors import SetupError
    from app.core.report import check_writable

    if args.export:
        check_writable(args.export, "--export")
    if args.screenshot:
        check_writable(args.screenshot, "--screenshot")
    if args.settings:
        if os.path.isdir(args.settings):
            raise SetupError(f"--settings {args.settings}: is a folder; settings are kept in one .ini file",
                             fix=f"give a file name, e.g. --settings {os.path.join(args.settings, 'specdeck.ini')}")
        check_writable(args.settings, "--settings")


def _session_from_args(win, session, args):
    """The window's session with the command line's overrides (None when there are none)."""
    overrides = (args.target, args.setup, args.prompt, args.mode, args.max_new_tokens)
    if all(x is None for x in overrides):
        return None
    s = session if session is not None else win.session()
    if args.target:
        s = s.with_(target=args.target)
    if args.setup:
        s = s.with_(setups=tuple(args.setup[:4]))
    if args.prompt:
        s = s.with_(prompt=args.prompt, prompt_id="custom")
    if args.mode:
        s = s.with_(mode=args.mode)
    if args.max_new_tokens is not None:
        s = s.with_(sampling=replace(s.sampling, max_new_tokens=args.max_new_tokens))
    return s


def export_report(win, path: str) -> str | None:
    """Write the run's report to `path`; when that fails, beside it in the current or temp folder. Returns where it
    went (None: nowhere), saying so on stderr."""
    from app.core.errors import SpecDeckError
    from app.core.report import write_json

    try:
        win.export_json(path)
        return path
    except OSError as e:
        try:
            where = write_json(win.report(), path + ".unwritable")  # write_json falls back to the cwd / temp folder
        except SpecDeckError as e2:
            print(f"error: could not write {path}: {e}; {e2.message}", file=sys.stderr)
            return None
        print(f"error: could not write {path} ({e.strerror or e}); the report was saved to {where}", file=sys.stderr)
        return where


def main(argv: list[str] | None = None) -> int:
    """Run the GUI; returns the process exit code."""
    args = build_parser().parse_args(argv)
    from app.core.errors import SpecDeckError

    try:
        check_paths(args)
    except SpecDeckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    record = None
    if args.runfile:
        from app.worker.runfile import load

        try:
            if args.replay is not None and not (0 < args.replay <= 64):
                raise SpecDeckError(f"--replay {args.replay:g}: a speed is a number of times the recorded pace, from 0.1 to 64",
                                    fix="e.g. --replay 1 (as recorded) or --replay 4; leave it out to show the run as it finished")
            record = load(args.runfile)
            if args.beside:
                from app.worker.runfile import beside

                record = beside(record, load(args.beside))
        except SpecDeckError as e:
            print(f"error: {e}", file=sys.stderr)
            _error_dialog(str(e))
            return 2
    elif args.replay is not None or args.beside:
        print(f"error: {'--replay' if args.replay is not None else '--beside'} needs a run file: specdeck gui RUNFILE "
              f"{'--replay 1' if args.replay is not None else '--beside RUNFILE2'}", file=sys.stderr)
        return 2
    from PySide6.QtCore import QSettings

    from app.ui.main_window import MainWindow
    from app.ui.session import preset
    from app.ui.theme import DARK

    app, said = gui_app()
    if said and sys.platform.startswith("linux") and "SPECDECK_GUI_PRIORITY=normal" not in said:
        print(f"warning: the window's threads were {said}; on a machine with few cores it may slow the lanes it "
              "measures", file=sys.stderr)
    app.setOrganizationName("SpecDeck")
    app.setApplicationName("SpecDeck")
    set_identity(app)
    try:
        session = preset(args.preset) if args.preset else None
    except SpecDeckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    settings = QSettings(args.settings, QSettings.Format.IniFormat) if args.settings else None
    win = MainWindow(settings=settings, session=session)
    s = _session_from_args(win, session, args)
    if s is not None:
        try:
            win.apply_session(s)  # all or nothing: validated first
        except SpecDeckError as e:
            print(f"error: {e.message}\n  fix: check the --target/--setup/--prompt/--mode/--max-new-tokens options", file=sys.stderr)
            win.shutdown()
            import shiboken6

            shiboken6.delete(win)
            return 2
    if args.dark:
        win.apply_theme(DARK)
    try:
        w, h = (int(x) for x in args.size.lower().split("x"))
        win.resize(w, h)
    except ValueError:
        pass
    win.show()
    if args.present:
        win.present(True)
    return _run_window(app, win, args, record)


def set_identity(app) -> None:
    """The window's icon and desktop file name (Wayland and task bars match the window to the launcher by it)."""
    from PySide6.QtGui import QIcon

    app.setWindowIcon(QIcon(str(ICON)))
    app.setDesktopFileName(DESKTOP_ID)


def _error_dialog(message: str) -> None:
    """Say `message` in a dialog when a window would be on a screen (launched from a file manager, nobody reads stderr)."""
    if os.environ.get("QT_QPA_PLATFORM", "") in ("offscreen", "minimal") or not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return
    from PySide6.QtWidgets import QApplication, QMessageBox

    app = QApplication.instance() or QApplication(sys.argv[:1])
    set_identity(app)
    QMessageBox.critical(None, "SpecDeck", message)


def _run_window(app, win, args, record=None) -> int:
    """The event loop, with what --autorun, --export, --screenshot and --quit-after-run ask of it; the exit code."""
    from PySide6.QtCore import QTimer

    code = {"rc": 0}

    def quit_app() -> None:
        win.close()
        app.quit()

    def after_run(_run_id: str) -> None:
        if args.export:
            said = win.status_label.text()
            where = export_report(win, args.export)
            if where == args.export:
                win.status.show_message(f"{said} · results written to {args.export}")
            else:
                code["rc"] = 2
        if args.screenshot:
            QTimer.singleShot(300, lambda: win.save_window_png(args.screenshot))
        if args.quit_after_run:
            results = win.controller.results
            code["rc"] = code["rc"] or (0 if results is not None and results.all_completed else 1)
            QTimer.singleShot(600, quit_app)

    win.runEnded.connect(after_run)
    if record is not None:
        QTimer.singleShot(0, lambda: win.show_record(record, args.runfile, args.replay or 0.0))
    elif args.autorun:

        def start() -> None:
            if win.run() is None:
                print(f"error: {win.status_label.text()}", file=sys.stderr)
                code["rc"] = 2
                if args.quit_after_run:
                    quit_app()

        QTimer.singleShot(0, start)
    if record is None and not args.autorun and args.screenshot:
        QTimer.singleShot(500, lambda: (win.save_window_png(args.screenshot), args.quit_after_run and quit_app()))
    rc = app.exec()
    import shiboken6

    shiboken6.delete(win)  # before the interpreter tears Qt down: left to it, PySide 6.11 + pyqtgraph segfault at exit
    return code["rc"] or rc


if __name__ == "__main__":
    sys.exit(main())
