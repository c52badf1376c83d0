"""`install-desktop` as a user runs it: a launcher that desktop-file-validate accepts, running this interpreter on a run
file, the icon at every size the hicolor theme asks for, a MIME type for *.specdeck; `--uninstall` removes exactly
that and nothing else. desktop-file-validate comes from Debian's desktop-file-utils, which `make test` installs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


def _app(*args, home):
    env = {**os.environ, "XDG_DATA_HOME": str(home), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=120, env=env)


def test_install_validate_and_uninstall_exactly_what_was_installed(tmp_path):
    from PySide6.QtGui import QImage

    from app.ui.desktop_entry import PNG_SIZES, installed_files

    home = tmp_path / "share"
    (home / "applications").mkdir(parents=True)
    theirs = home / "applications" / "someone-else.desktop"
    theirs.write_text("[Desktop Entry]\nType=Application\nName=X\nExec=x\n")
    r = _app("install-desktop", home=home)
    assert r.returncode == 0, r.stderr
    files = installed_files(home)
    assert all(f.is_file() for f in files) and str(files[0]) in r.stdout
    validate = shutil.which("desktop-file-validate")
    assert validate, "desktop-file-validate is missing: install Debian's desktop-file-utils (make test does, as root)"
    v = subprocess.run([validate, str(files[0])], capture_output=True, text=True)
    assert v.returncode == 0 and not v.stdout.strip(), v.stdout + v.stderr
    entry = dict(line.split("=", 1) for line in files[0].read_text().splitlines() if "=" in line)
    assert entry["Exec"] == f"{sys.executable} -m app gui %f" and entry["Icon"] == "specdeck"
    assert entry["MimeType"] == "application/x-specdeck-run;" and entry["StartupWMClass"] == "specdeck"
    for n in PNG_SIZES:
        img = QImage(str(home / "icons" / "hicolor" / f"{n}x{n}" / "apps" / "specdeck.png"))
        assert (img.width(), img.height()) == (n, n) and img.hasAlphaChannel()
    assert '<glob pattern="*.specdeck"' in (home / "mime" / "packages" / "specdeck.xml").read_text()
    if shutil.which("update-mime-database"):  # the desktop's cache then knows the type
        assert "application/x-specdeck-run:*.specdeck" in (home / "mime" / "globs2").read_text()

    r = _app("install-desktop", "--uninstall", home=home)
    assert r.returncode == 0 and f"removed {len(files)} file(s)" in r.stdout, r.stdout + r.stderr
    assert not any(f.exists() for f in files) and theirs.read_text().startswith("[Desktop Entry]")
    r = _app("install-desktop", "--uninstall", home=home)
    assert r.returncode == 0 and "nothing of SpecDeck's was installed" in r.stdout


def test_an_unwritable_data_folder_is_one_error(tmp_path):
    r = _app("install-desktop", "--data-home", "/proc/specdeck-share", home=tmp_path)
    assert r.returncode == 2 and "cannot write under /proc/specdeck-share" in r.stderr and "--data-home" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("path", ["/opt/my env/bin/python", '/x/"q"/python'])
def test_exec_quotes_an_interpreter_path_as_the_specification_asks(path):
    from app.ui.desktop_entry import desktop_entry

    exec_line = next(x for x in desktop_entry(path).splitlines() if x.startswith("Exec="))
    assert exec_line.startswith('Exec="') and exec_line.endswith(' -m app gui %f')


def test_the_installed_launcher_starts_the_app_on_a_run_file(tmp_path):
    """The Exec line of the installed entry, run as a desktop runs it (%f = a run file) under Xvfb with a temporary
    XDG_DATA_HOME: the window comes up showing that run (its screenshot saved, exit 0). Xvfb comes from `make test`."""
    import shlex

    from app.ui.desktop_entry import installed_files
    from app.worker.runfile import save

    from .test_replay import _record

    xvfb = shutil.which("xvfb-run")
    assert xvfb, "xvfb-run is missing: install Debian's xvfb and xauth (make test does, as root)"
    home = tmp_path / "share"
    assert _app("install-desktop", home=home).returncode == 0
    entry = dict(line.split("=", 1) for line in installed_files(home)[0].read_text().splitlines() if "=" in line)
    run = save(_record(duration=0.5)[0], tmp_path / "demo.specdeck")
    shot = tmp_path / "shot.png"
    argv = [str(run) if a == "%f" else a for a in shlex.split(entry["Exec"])]
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")}
    env.update(XDG_DATA_HOME=str(home), HOME=str(tmp_path))
    r = subprocess.run([xvfb, "-a", "-s", "-screen 0 1600x1000x24", *argv, "--screenshot", str(shot), "--quit-after-run",
                        "--settings", str(tmp_path / "s.ini")], cwd=entry["Path"], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    from PySide6.QtGui import QImage

    img = QImage(str(shot))
    assert img.width() >= 1000 and img.height() >= 600
