"""Fixtures for GUI tests: throw-away QSettings, a window without telemetry, synthetic step events."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")


@pytest.fixture(autouse=True)
def _collect_in_the_event_loop(qapp):
    """As the app does: collections from a timer of the event loop while a test waits on it."""
    from app.ui.main import collect_garbage_in_the_event_loop

    collect_garbage_in_the_event_loop()


@pytest.fixture
def settings(tmp_path):
    from PySide6.QtCore import QSettings

    return QSettings(str(tmp_path / "specdeck.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def step_factory():
    from .helpers import make_step

    return make_step


@pytest.fixture
def fake_window(qtbot, settings):
    """make(max_new_tokens) → a shown MainWindow on a throw-away settings file, no telemetry, whose worker is the
    FakeClient of tests/ui/helpers.py (lanes = helpers.SETUPS, target "tiny-target"); shut down after the test."""
    from app.core.setups import Sampling
    from app.ui.main_window import MainWindow
    from app.ui.session import Session

    from .helpers import SETUPS, FakeClient

    made = []

    def make(max_new_tokens: int = 4):
        s = Session(target="tiny-target", setups=SETUPS, prompt="Write a poem.", sampling=Sampling(max_new_tokens=max_new_tokens))
        w = MainWindow(settings=settings, session=s, statuses=[], telemetry=False, client_factory=FakeClient)
        qtbot.addWidget(w)
        w.resize(1400, 900)
        w.show()
        made.append(w)
        return w

    yield make
    for w in made:
        w.shutdown()
