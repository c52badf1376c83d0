"""Fixtures for GUI tests: throw-away QSettings, a window without telemetry, synthetic step events."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")


@pytest.fixture
def settings(tmp_path):
    from PySide6.QtCore import QSettings

    return QSettings(str(tmp_path / "specdeck.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def step_factory():
    from .helpers import make_step

    return make_step
