"""``python -m app telemetry`` / ``python -m app.telemetry``: readable lines or JSON lines, real host numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.telemetry.cli import main
from app.telemetry.nvml import NO_GPU_STATE, NvmlReader
from app.telemetry.samples import GPU_OK

ROOT = Path(__file__).resolve().parents[2]


def _expected_state() -> str:
    r = NvmlReader()
    try:
        return GPU_OK if r.available else NO_GPU_STATE
    finally:
        r.close()


STATE = _expected_state()


def test_once_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--once", "--json", "--rate", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    d = json.loads(lines[0])
    assert d["gpu_state"] == STATE
    assert [(p["role"], p["pid"]) for p in d["host"]["procs"]] == [("self", os.getpid())]
    assert d["host"]["procs"][0]["rss_mib"] > 0


def test_once_readable_with_pids(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--once", "--rate", "20", "--pid", f"gui={os.getpid()}", "--pid", "worker=999999999"]) == 0
    line = capsys.readouterr().out.strip()
    assert f"gui[{os.getpid()}]" in line and "worker[999999999] cpu n/a% rss n/a MiB" in line
    if STATE != GPU_OK:
        assert NO_GPU_STATE in line


def test_stream_for_a_duration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", "--rate", "20", "--duration", "0.3"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(rows) >= 2
    assert all(b["t_mono"] > a["t_mono"] for a, b in zip(rows, rows[1:], strict=False))


@pytest.mark.parametrize("argv", [["--pid", "nope"], ["--rate", "0"], ["--duration", "-1"]])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import runpy, sys; sys.argv = ['x', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module(sys.argv.pop(1), run_name='__main__')\n"
        "finally:\n    bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'torch'))\n"
        "    assert not bad, bad\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_python_m_app_telemetry_once_without_qt_or_torch() -> None:
    p = _run("app.telemetry", "--once", "--json", "--rate", "20")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["gpu_state"] == STATE


def test_python_m_app_dispatches_telemetry() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "app", "telemetry", "--once", "--json", "--rate", "20"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["gpu_state"] == STATE
