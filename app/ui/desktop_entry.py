"""SpecDeck in the desktop's menu: a freedesktop launcher, its icon in the hicolor theme, and a MIME type for run files
(opening one from the file manager shows that run).

Installed under a data folder (``$XDG_DATA_HOME``, default ``~/.local/share``), following the Desktop Entry, Icon
Theme and Shared MIME-info specifications:

    applications/specdeck.desktop                 Exec=<this interpreter> -m app gui %f, Icon=specdeck, MimeType=…
    icons/hicolor/scalable/apps/specdeck.svg      the icon (resources/icons/specdeck.svg)
    icons/hicolor/<n>x<n>/apps/specdeck.png       the icon drawn at 16, 24, 32, 48, 64, 128 and 256 pixels
    mime/packages/specdeck.xml                    application/x-specdeck-run: *.specdeck
    icons/hicolor/scalable/mimetypes/application-x-specdeck-run.svg   the run files' icon

Contract: :func:`install` writes exactly :func:`installed_files` (and refreshes the desktop's caches when their tools
are on PATH); :func:`uninstall` removes exactly those files, and nothing else, then refreshes the caches.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from app.ui.main import DESKTOP_ID, ICON
from app.worker.runfile import MIME_TYPE, SUFFIX

__all__ = ["PNG_SIZES", "data_home", "installed_files", "desktop_entry", "mime_xml", "install", "uninstall"]

PNG_SIZES = (16, 24, 32, 48, 64, 128, 256)
CHECKOUT = Path(__file__).resolve().parents[2]


def data_home() -> Path:
    """$XDG_DATA_HOME, or ~/.local/share when it is unset or not absolute (the specification's rule)."""
    d = os.environ.get("XDG_DATA_HOME", "")
    return Path(d) if d and os.path.isabs(d) else Path.home() / ".local" / "share"


def installed_files(root: Path) -> list[Path]:
    """Every file :func:`install` writes under data folder `root`."""
    icons = root / "icons" / "hicolor"
    return [root / "applications" / f"{DESKTOP_ID}.desktop", icons / "scalable" / "apps" / f"{DESKTOP_ID}.svg",
            *(icons / f"{n}x{n}" / "apps" / f"{DESKTOP_ID}.png" for n in PNG_SIZES),
            icons / "scalable" / "mimetypes" / f"{MIME_TYPE.replace('/', '-')}.svg",
            root / "mime" / "packages" / f"{DESKTOP_ID}.xml"]


def _quote(arg: str) -> str:
    """An Exec argument quoted as the Desktop Entry specification asks (only when it needs it)."""
    if arg and not any(c in arg for c in ' \t\n"\'\\><~|&;$*?#()`%'):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$").replace("%", "%%") + '"'


def desktop_entry(python: str, checkout: Path = CHECKOUT) -> str:
    """The launcher: this checkout's interpreter running the GUI, a run file given as %f."""
    exec_line = " ".join(_quote(a) for a in (python, "-m", "app", "gui")) + " %f"
    return "\n".join([
        "[Desktop Entry]",
        "Type=Application",
        "Version=1.4",
        "Name=SpecDeck",
        "GenericName=LLM decoding comparison",
        "Comment=Compare LLM decoding setups side by side: speculative decoding you can see",
        f"TryExec={python}",
        f"Exec={exec_line}",
        f"Path={checkout}",
        f"Icon={DESKTOP_ID}",
        "Terminal=false",
        "Categories=Development;Profiling;",
        f"MimeType={MIME_TYPE};",
        "Keywords=LLM;speculative decoding;benchmark;llama.cpp;vLLM;TensorRT-LLM;",
        f"StartupWMClass={DESKTOP_ID}",
        "StartupNotify=true",
        "",
    ])


def mime_xml() -> str:
    """The run files' MIME type (gzip-compressed JSON, told apart by their suffix)."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<mime-info xmlns="http://www.freedesktop.org/standards/shared-mime-info">
  <mime-type type="{MIME_TYPE}">
    <comment>SpecDeck run</comment>
    <sub-class-of type="application/gzip"/>
    <generic-icon name="{MIME_TYPE.replace('/', '-')}"/>
    <glob pattern="*{SUFFIX}" weight="60"/>
  </mime-type>
</mime-info>
"""


def _render_png(svg: Path, size: int, out: Path) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    img = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    img.fill(Qt.GlobalColor.transparent)
    painter = QPainter(img)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    QSvgRenderer(str(svg)).render(painter)
    painter.end()
    if not img.save(str(out), "PNG"):
        raise OSError(f"could not write {out}")


def _refresh(root: Path) -> list[str]:
    """Refresh the desktop's caches under `root` with the tools that are installed; returns what ran."""
    ran = []
    for tool, arg in (("update-mime-database", root / "mime"), ("update-desktop-database", root / "applications"),
                      ("gtk-update-icon-cache", root / "icons" / "hicolor")):
        exe = shutil.which(tool)
        if exe and arg.is_dir():
            extra = ["-f", "-t", "-q"] if tool == "gtk-update-icon-cache" else (["-q"] if tool == "update-desktop-database" else [])
            r = subprocess.run([exe, *extra, str(arg)], capture_output=True, text=True, timeout=60)
            ran.append(tool if r.returncode == 0 else f"{tool} (failed: {r.stderr.strip()[:200]})")
    return ran


def install(root: Path | None = None, python: str | None = None) -> tuple[list[Path], list[str]]:
    """Install the launcher, icons and MIME type under `root` (default :func:`data_home`) for interpreter `python`
    (default this one). Returns (files written, cache tools run).

    Raises:
        OSError: a folder cannot be written.
    """
    from PySide6.QtGui import QGuiApplication

    root = root or data_home()
    python = python or sys.executable
    if QGuiApplication.instance() is None:  # QImage and QPainter need one; no window is shown
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        app = QGuiApplication(sys.argv[:1])  # noqa: F841 (kept alive while drawing)
    files = installed_files(root)
    desktop, svg, *pngs = files[: 2 + len(PNG_SIZES)]
    mime_icon, mime = files[2 + len(PNG_SIZES):]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
    desktop.write_text(desktop_entry(python), encoding="utf-8")
    shutil.copyfile(ICON, svg)
    shutil.copyfile(ICON, mime_icon)
    for n, out in zip(PNG_SIZES, pngs, strict=True):
        _render_png(ICON, n, out)
    mime.write_text(mime_xml(), encoding="utf-8")
    return files, _refresh(root)


def uninstall(root: Path | None = None) -> tuple[list[Path], list[str]]:
    """Remove what :func:`install` wrote under `root` (and nothing else). Returns (files removed, cache tools run)."""
    root = root or data_home()
    removed = []
    for f in installed_files(root):
        if f.is_file() or f.is_symlink():
            f.unlink()
            removed.append(f)
    return removed, _refresh(root) if removed else []
