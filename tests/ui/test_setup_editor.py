"""Setup editor validation, engine pickers, sessions and presets (no worker)."""

from __future__ import annotations

import json

import pytest


def test_editor_rejects_bad_values_inline(qtbot):
    from app.ui.setup_editor import SetupEditor

    ed = SetupEditor("baseline")
    qtbot.addWidget(ed)
    assert ed.valid and ed.error.isHidden()
    for bad, why in (
        ("draft:x,k=0", "k must be > 0"),
        ("ngram:n=abc", "n must be an integer"),
        ("warp-drive", "unknown method"),
        ("draft:,k=4", "needs an engine"),
        ("", "empty"),
    ):
        with qtbot.waitSignal(ed.changed, timeout=1000):
            ed.line.setText(bad)
            ed.line.textEdited.emit(bad)
        assert not ed.valid, bad
        assert why in ed.error_text and "setup grammar" in ed.error_text
        assert not ed.error.isHidden()
    ed.set_setup("draft:qwen2.5-coder-0.5b-instruct,k=6,schedule=heuristic")
    assert ed.valid and ed.error.isHidden()
    assert ed.method.currentData() == "draft" and ed.k.value() == 6 and ed.schedule.currentText() == "heuristic"
    assert ed.engine.currentText() == "qwen2.5-coder-0.5b-instruct"


def test_fields_compose_the_string(qtbot):
    from app.core.setups import parse_setup
    from app.ui.setup_editor import SetupEditor

    ed = SetupEditor("baseline")
    qtbot.addWidget(ed)
    ed.method.setCurrentIndex(ed.method.findData("ngram"))
    assert ed.setup().startswith("ngram:") and ed.valid
    ed.n.setValue(4)
    ed.k.setValue(5)
    assert parse_setup(ed.setup()).label == "ngram:n=4,k=5"
    ed.method.setCurrentIndex(ed.method.findData("hf-lookup"))
    assert ed.setup().startswith("hf-lookup:k=")
    ed.method.setCurrentIndex(ed.method.findData("baseline"))
    assert ed.setup() == "baseline" and ed.n.isHidden()



def test_field_edits_keep_stop_and_set_the_draft_precision(qtbot):
    """Typed-only parameters (stop) survive a field edit; the precision combo writes dtype=."""
    from app.core.setups import parse_setup
    from app.ui.setup_editor import SetupEditor

    ed = SetupEditor("draft:small,k=6,stop=0.3,cstop=0.5,dtype=int8")
    qtbot.addWidget(ed)
    assert ed.precision.currentData() == "int8" and not ed.precision.isHidden()
    ed.k.setValue(9)
    s = parse_setup(ed.setup())
    assert (s.k, s.stop, s.cstop, s.dtype) == (9, 0.3, 0.5, "int8")
    ed.precision.setCurrentIndex(ed.precision.findData("bfloat16"))
    assert parse_setup(ed.setup()).dtype == "bfloat16"
    ed.precision.setCurrentIndex(ed.precision.findData(""))
    assert "dtype" not in ed.setup() and "stop=0.3" in ed.setup()
    ed.method.setCurrentIndex(ed.method.findData("ngram"))
    assert ed.precision.isHidden()


def _status(name, tok, usable=True, reason=""):
    from app.engines.status import EngineStatus

    return EngineStatus(name, "hf", name, "float32", "cpu", 1, usable, usable, usable, reason, tok, "")


def test_draft_picker_lists_only_compatible_engines_and_greys_unusable(qtbot):
    from PySide6.QtCore import Qt

    from app.ui.setup_editor import SetupEditor

    st = [
        _status("big", "qwen"),
        _status("small", "qwen"),
        _status("broken", "qwen", usable=False, reason="weights missing"),
        _status("other", "llama"),
    ]
    ed = SetupEditor("draft:small,k=4")
    qtbot.addWidget(ed)
    ed.set_engines(st, st[0])
    names = [ed.engine.itemData(i, Qt.ItemDataRole.UserRole) for i in range(ed.engine.count())]
    assert names == ["small", "broken"]  # not the target itself, not the other tokenizer
    broken = ed.engine.model().item(1)
    assert not broken.isEnabled() and "weights missing" in broken.toolTip()
    assert ed.engine.currentText() == "small"


def test_session_roundtrip_and_presets(tmp_path):
    from app.core.errors import SpecDeckError
    from app.ui.session import PRESETS, QWEN_PRESET, SMOL_PRESET, Session, default_preset_name, preset

    s = PRESETS[SMOL_PRESET]
    p = tmp_path / "s.json"
    s.save(p)
    assert Session.load(p) == s
    assert json.loads(p.read_text())["setups"] == ["baseline", "ngram", "draft:smollm2-135m-instruct,k=4"]
    assert default_preset_name({"qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"}) == QWEN_PRESET
    assert default_preset_name({"smollm2-135m-instruct"}) == SMOL_PRESET
    assert preset("smollm2") is s
    with pytest.raises(SpecDeckError):
        preset("nope")
    p.write_text('{"setups": []}')
    with pytest.raises(SpecDeckError):
        Session.load(p)


def test_window_refuses_invalid_setup_and_remembers_settings(qtbot, settings, tmp_path):
    from app.ui.main_window import MainWindow
    from app.ui.session import PRESETS, SMOL_PRESET

    w = MainWindow(settings=settings, session=PRESETS[SMOL_PRESET], telemetry=False)
    qtbot.addWidget(w)
    assert len(w.lane_views) == 3 and w.setups()[0] == "baseline"
    ed = w.lane_rows[1].editor
    ed.line.setText("ngram:k=0")
    ed.line.textEdited.emit("ngram:k=0")
    assert not w.run_btn.isEnabled()
    assert w.run() is None and "lane 2" in w.status_label.text()
    ed.set_setup("ngram:k=3")
    assert w.run_btn.isEnabled()
    # add / duplicate / remove keep 1..4 lanes
    w.add_lane("baseline")
    assert len(w.lane_rows) == 4 and not w.add_lane_btn.isEnabled() and w.add_lane("ngram") is None
    w.remove_lane(3)
    w.lane_rows[0].dup.click()
    assert w.setups()[:2] == ["baseline", "baseline"]
    for _ in range(5):
        w.remove_lane(0)
    assert len(w.lane_rows) == 1
    # session file round trip through the window
    path = w.save_session(str(tmp_path / "sess.json"))
    w.set_setups(["ngram", "baseline"])
    assert w.open_session(path) and len(w.lane_rows) == 1
    w.save_settings()
    w2 = MainWindow(settings=settings, telemetry=False)
    qtbot.addWidget(w2)
    assert w2.setups() == w.setups() and w2.target() == w.target()
    w.shutdown()
    w2.shutdown()


def test_main_entry_point_takes_cli_options_and_saves_a_screenshot(qapp, tmp_path):
    from app.ui.main import main

    png = tmp_path / "win.png"
    rc = main(
        [
            "--preset",
            "smollm2",
            "--setup",
            "baseline",
            "--setup",
            "ngram:n=2,k=5",
            "--max-new-tokens",
            "7",
            "--prompt",
            "hi there",
            "--screenshot",
            str(png),
            "--quit-after-run",
            "--settings",
            str(tmp_path / "s.ini"),
        ]
    )
    assert rc == 0 and png.stat().st_size > 10_000
    from PySide6.QtCore import QSettings

    from app.ui.session import Session

    s = Session.from_json(__import__("json").loads(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat).value("session/last")))
    assert s.setups == ("baseline", "ngram:n=2,k=5") and s.sampling.max_new_tokens == 7 and s.prompt == "hi there"


def test_gui_process_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "from app.ui.main_window import MainWindow\n"
        "w = MainWindow(settings=__import__('PySide6.QtCore', fromlist=['QSettings']).QSettings('/dev/null', __import__('PySide6.QtCore', fromlist=['QSettings']).QSettings.Format.IniFormat), telemetry=True)\n"
        "w.sampler and w.sampler.close()\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
