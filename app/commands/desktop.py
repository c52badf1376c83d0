"""`python -m app install-desktop [--uninstall] [--data-home DIR]`: put SpecDeck in the desktop's menu (a launcher, its
icon, and a MIME type so that a double-clicked run file opens in SpecDeck), or take it out again. What is installed
where: app.ui.desktop_entry."""

from __future__ import annotations

from pathlib import Path

from app.core.errors import SetupError

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    d = sub.add_parser("install-desktop", help="add SpecDeck to the desktop's menu (launcher, icon, run-file type); --uninstall removes it")
    d.add_argument("--uninstall", action="store_true", help="remove what install-desktop installed (only that)")
    d.add_argument("--data-home", metavar="DIR", help="install under DIR instead of $XDG_DATA_HOME (~/.local/share)")
    d.set_defaults(func=run)


def run(args) -> int:
    from app.ui.desktop_entry import data_home, install, uninstall

    root = Path(args.data_home).expanduser().resolve() if args.data_home else data_home()
    try:
        files, ran = (uninstall if args.uninstall else install)(root)
    except OSError as e:
        raise SetupError(f"cannot write under {root}: {e.strerror or e}",
                         fix="check the folder's permissions, or pass --data-home DIR (a folder you can write)") from None
    refreshed = f"; refreshed: {', '.join(ran)}" if ran else ""
    if args.uninstall:
        print(f"removed {len(files)} file(s) from {root}{refreshed}" if files else f"nothing of SpecDeck's was installed under {root}")
        return 0
    print(f"SpecDeck is in the desktop's menu: {files[0]}")
    print(f"  icon: {root / 'icons' / 'hicolor'} (scalable and {len(files) - 4} sizes); run files (*.specdeck) open in SpecDeck"
          f"{refreshed}")
    print("  it runs this checkout's interpreter; after moving the checkout, run install-desktop again "
          "(python -m app install-desktop --uninstall takes it out)")
    return 0
