"""`python -m app gui`'s command line: paths refused before any window or worker exists; a report that cannot be
written where asked is saved elsewhere, and said."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _gui(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run([sys.executable, "-m", "app", "gui", *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)


def test_an_export_into_a_missing_folder_is_refused_before_the_run(tmp_path):
    r = _gui("--autorun", "--quit-after-run", "--export", str(tmp_path / "missing" / "x.json"), "--settings", str(tmp_path / "s.ini"))
    assert r.returncode == 2
    assert f"--export {tmp_path / 'missing' / 'x.json'}: the folder {tmp_path / 'missing'} does not exist" in r.stderr
    assert f"mkdir -p {tmp_path / 'missing'}" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2  # one error, one fix


def test_settings_pointing_at_a_folder_is_refused(tmp_path):
    r = _gui("--settings", str(tmp_path))
    assert r.returncode == 2 and f"--settings {tmp_path}: is a folder" in r.stderr and "specdeck.ini" in r.stderr


def test_a_report_that_cannot_be_written_is_saved_beside_and_said(tmp_path, monkeypatch, capsys):
    from app.ui.main import export_report

    class Window:
        def export_json(self, path):
            raise PermissionError(13, "Permission denied")

        def report(self):
            return {"runs": [], "summary": []}

    monkeypatch.chdir(tmp_path)
    where = export_report(Window(), "/proc/x.json")
    assert where is not None and Path(where).is_file() and Path(where).parent in (tmp_path, Path("/proc"), Path(os.environ.get("TMPDIR", "/tmp")))
    err = capsys.readouterr().err
    assert "could not write /proc/x.json (Permission denied); the report was saved to" in err and where in err
