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
        ("draft:x,k=0", "k must be in [1, 256]"),
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
    assert ed.method.currentData() == "draft" and ed.control("k").value() == 6 and ed.control("schedule").currentData() == "heuristic"
    assert ed.control("engine").currentText() == "qwen2.5-coder-0.5b-instruct"


def test_method_combo_lists_the_registry_and_fields_compose_the_label(qtbot):
    from app.core.setups import kinds, parse_setup
    from app.ui.setup_editor import SetupEditor

    ed = SetupEditor("baseline")
    qtbot.addWidget(ed)
    assert [ed.method.itemText(i) for i in range(ed.method.count())] == [k.title for k in kinds()]
    ed.method.setCurrentIndex(ed.method.findData("ngram"))
    assert ed.setup() == "ngram:n=3,k=8" and ed.valid
    ed.control("n").setValue(4)
    ed.control("k").setValue(5)
    assert parse_setup(ed.setup()).label == ed.setup() == "ngram:n=4,k=5"
    ed.method.setCurrentIndex(ed.method.findData("hf-lookup"))
    assert ed.setup() == "hf-lookup:k=10"
    ed.method.setCurrentIndex(ed.method.findData("baseline"))
    assert ed.setup() == "baseline" and ed.fields.isHidden() and ed.control("n") is None


def test_every_parameter_of_every_kind_round_trips(qtbot):
    """For each registered kind and each of its parameters: a non-default value set in its control reaches the
    label, parses back, and set_setup(label) shows it again."""
    from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox

    from app.core.setups import kinds, parse_setup
    from app.ui.setup_editor import SetupEditor

    ed = SetupEditor("baseline")
    qtbot.addWidget(ed)
    texts = {"shape": "3x2x1"}  # free-text parameters with a syntax of their own

    def change(p) -> None:
        w = ed.control(p.name)
        if isinstance(w, QComboBox):
            w.setCurrentIndex(w.count() - 1)
        elif isinstance(w, QSpinBox):
            w.setValue(min(w.maximum(), int(p.default or 0) + 3))
        elif isinstance(w, QDoubleSpinBox):
            w.setValue(0.25)
        else:
            assert isinstance(w, QLineEdit)
            w.setText(texts.get(p.name, "x"))
            w.textEdited.emit(w.text())

    for kind in kinds():
        plain = f"{kind.prefix}:eng" if kind.engine is not None else kind.prefix
        ed.set_setup(plain)
        assert ed.valid and ed.kind is kind, ed.error_text
        assert (ed.control("engine") is not None) == (kind.engine is not None)
        for p in kind.params:
            change(p)
            if not ed.valid:  # exclusive with one set before (a tree's shape vs its dynamic nodes/depth/branch)
                assert "shape" in ed.error_text, ed.error_text
                ed.set_setup(plain)
                change(p)
            s = parse_setup(ed.setup())
            assert ed.valid and getattr(s, p.name) != p.default and s.label == ed.setup(), (kind.prefix, p.name, ed.setup())
        label = ed.setup()
        ed.set_setup("baseline")
        ed.set_setup(label)
        assert ed.setup() == label
        assert all(ed.control(p.name).isVisibleTo(ed) for p in kind.params)


def test_typed_values_survive_field_edits_and_optional_params_unset(qtbot):
    """stop/cstop with more decimals than the spin box shows stay exact when another field changes; the
    precision combo's first entry means "unset" (no dtype= in the label)."""
    from app.core.setups import parse_setup
    from app.ui.setup_editor import SetupEditor

    ed = SetupEditor("draft:small,k=6,stop=0.3125,cstop=0.5,dtype=int8")
    qtbot.addWidget(ed)
    assert ed.control("dtype").currentData() == "int8"
    ed.control("k").setValue(9)
    s = parse_setup(ed.setup())
    assert (s.k, s.stop, s.cstop, s.dtype) == (9, 0.3125, 0.5, "int8")
    ed.control("dtype").setCurrentIndex(ed.control("dtype").findData("bfloat16"))
    assert parse_setup(ed.setup()).dtype == "bfloat16"
    ed.control("dtype").setCurrentIndex(0)
    assert "dtype" not in ed.setup() and "stop=0.3125" in ed.setup()
    assert "target's dtype" in ed.control("dtype").currentText()
    ed.control("cstop").setValue(0.0)
    assert "cstop" not in ed.setup()
    # hf-assisted's k is optional: its spin box's lowest value reads "unset"
    ed.set_setup("hf-assisted:small")
    k = ed.control("k")
    assert k.value() == k.minimum() and "transformers' default" in k.specialValueText()
    k.setValue(5)
    assert ed.setup() == "hf-assisted:small,k=5"
    k.setValue(k.minimum())
    assert ed.setup() == "hf-assisted:small"
    # switching method keeps the engine name when both kinds take one
    ed.method.setCurrentIndex(ed.method.findData("draft"))
    assert ed.setup() == "draft:small,k=4"


def _status(name, tok, usable=True, reason="", backend="hf"):
    from app.engines.status import EngineStatus

    return EngineStatus(name, backend, name, "float32", "cpu", 1, usable, usable, usable, reason, tok, "",
                        steps=backend in ("hf", "llamacpp"))  # as app.engines.backends declares them


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
    engine = ed.control("engine")
    names = [engine.itemData(i, Qt.ItemDataRole.UserRole) for i in range(engine.count())]
    assert names == ["small", "broken"]  # not the target itself, not the other tokenizer
    broken = engine.model().item(1)
    assert not broken.isEnabled() and "weights missing" in broken.toolTip()
    assert engine.currentText() == "small"
    # a "lane" engine argument (trtllm:) offers the engines of its backends instead
    trt = _status("eagle", "", backend="trtllm")
    ed.set_engines([*st, trt], st[0])
    ed.method.setCurrentIndex(ed.method.findData("trtllm"))
    engine = ed.control("engine")
    assert [engine.itemData(i, Qt.ItemDataRole.UserRole) for i in range(engine.count())] == ["eagle"]
    assert ed.setup() == "trtllm:eagle" and ed.valid


def test_session_roundtrip_and_presets(tmp_path):
    from app.core.errors import SpecDeckError
    from app.core.setups import parse_setup
    from app.ui.session import PRESETS, QWEN_PRESET, QWEN_TORCH_PRESET, SMOL_PRESET, Session, default_preset_name, preset

    s = PRESETS[SMOL_PRESET]
    p = tmp_path / "s.json"
    s.save(p)
    assert Session.load(p) == s
    assert json.loads(p.read_text())["setups"] == ["baseline", "ngram", "draft:smollm2-135m-instruct,k=4"]
    assert default_preset_name({"qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"}) == QWEN_TORCH_PRESET
    both = {"qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "llamacpp-qwen2.5-coder-1.5b-instruct", "llamacpp-qwen2.5-coder-0.5b-instruct"}
    assert default_preset_name(both) == QWEN_PRESET
    side = PRESETS[QWEN_PRESET].setups  # PyTorch baseline + draft lane, llama.cpp baseline + draft lane, each valid
    assert [parse_setup(x).target for x in side] == [None, None, "llamacpp-qwen2.5-coder-1.5b-instruct", "llamacpp-qwen2.5-coder-1.5b-instruct"]
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
    assert len(w.lane_rows) == 4 and not w.setup_panel.add_lane_btn.isEnabled() and w.add_lane("ngram") is None
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


def test_main_entry_point_takes_cli_options_and_saves_a_screenshot(tmp_path):
    """`ui.main` runs the app (exec/quit, a global palette, the organisation name): in its own process, so the
    tests' shared QApplication stays as it was; exit code 0 (no crash at exit) when every lane finished."""
    import os
    import subprocess
    import sys

    from PySide6.QtCore import QSettings

    from app.ui.session import Session

    png = tmp_path / "win.png"
    args = ["--preset", "smollm2", "--setup", "baseline", "--setup", "ngram:n=2,k=5", "--max-new-tokens", "7", "--prompt", "hi there",
            "--screenshot", str(png), "--quit-after-run", "--settings", str(tmp_path / "s.ini")]
    code = f"import sys\nfrom app.ui.main import main\nsys.exit(main({args!r}))\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert png.stat().st_size > 10_000
    s = Session.from_json(json.loads(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat).value("session/last")))
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


# --- a setup type declared here alone: the editor must show it from its declaration ------------------------


def _toy_kind():
    from dataclasses import dataclass

    from app.core.setups import SetupBase, SetupKind, engine_arg, param

    @dataclass(frozen=True)
    class Toy(SetupBase):
        prefix = "toy"

        engine: str = engine_arg("lane", backends=("toyb",), example="toy-engine", help="a toy engine")
        depth: int = param(2, min=1, max=9, always=True, help="how deep the toy drafts")
        heat: float = param(0.5, min=0.0, max=1.0, max_exclusive=True, help="toy heat")
        flavour: str = param("plain", choices=("plain", "spicy", "sweet", "sour"), help="toy flavour")
        budget: int | None = param(None, min=1, max=100, unset="no budget", help="toy budget")

    return SetupKind(Toy, "toy method", "a toy setup type (tests)", build=lambda setup, env: None)


@pytest.fixture
def toy_kind():
    from app.core.setups import kinds, register, unregister

    kinds()  # the built-ins first
    kind = register(_toy_kind())
    yield kind
    unregister("toy")


def test_a_toy_setup_type_gets_its_declared_controls_and_round_trips(qtbot, toy_kind):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QSpinBox

    from app.core.setups import grammar, parse_setup
    from app.ui.setup_editor import SetupEditor

    ed = SetupEditor("baseline")
    qtbot.addWidget(ed)
    i = ed.method.findData("toy")
    assert i >= 0 and ed.method.itemText(i) == "toy method"
    assert ed.method.itemData(i, Qt.ItemDataRole.ToolTipRole) == "a toy setup type (tests)"
    ed.set_engines([_status("a-toy", "", backend="toyb"), _status("an-hf", "qwen")], None)
    ed.method.setCurrentIndex(i)
    assert ed.setup() == "toy:a-toy,depth=2" and ed.valid  # defaults; the engine of a matching backend
    engine = ed.control("engine")
    assert [engine.itemData(j, Qt.ItemDataRole.UserRole) for j in range(engine.count())] == ["a-toy"]
    depth, heat, flavour, budget = (ed.control(n) for n in ("depth", "heat", "flavour", "budget"))
    assert isinstance(depth, QSpinBox) and (depth.minimum(), depth.maximum()) == (1, 9) and "how deep" in depth.toolTip()
    assert isinstance(heat, QDoubleSpinBox) and heat.minimum() == 0.0 and 0.99 <= heat.maximum() < 1.0  # max exclusive
    assert isinstance(flavour, QComboBox) and [flavour.itemData(j) for j in range(flavour.count())] == ["plain", "spicy", "sweet", "sour"]
    assert isinstance(budget, QSpinBox) and budget.value() == budget.minimum() and "no budget" in budget.specialValueText()
    assert "no budget" in budget.toolTip()
    depth.setValue(5)
    heat.setValue(0.25)
    flavour.setCurrentIndex(flavour.findData("spicy"))
    budget.setValue(7)
    label = ed.setup()
    assert label == "toy:a-toy,depth=5,heat=0.25,flavour=spicy,budget=7"
    assert parse_setup(label).label == label
    ed.set_setup("baseline")
    ed.set_setup(label)
    assert (depth.value(), heat.value(), flavour.currentData(), budget.value()) == (5, 0.25, "spicy", 7)
    assert ed.setup() == label
    for bad, why in (("toy:a-toy,depth=10", "depth must be in [1, 9]"), ("toy:a-toy,flavour=salty", "flavour must be one of")):
        ed.line.setText(bad)
        ed.line.textEdited.emit(bad)
        assert not ed.valid and why in ed.error_text and "toy:<engine>" in ed.error_text
    assert "toy:<engine>" in grammar()


def test_the_gui_knows_a_kind_only_from_the_registry(qtbot, toy_kind):
    """A kind registered here alone is offered and edited by the setup editor and kept by a saved session; once
    unregistered, it is gone from both: no part of the GUI that handles setups keeps a list of kinds of its own."""
    from app.core.errors import SpecDeckError
    from app.core.setups import register, unregister
    from app.ui.session import Session
    from app.ui.setup_editor import SetupEditor

    session = Session.from_json({"target": "t", "setups": ["baseline", "toy:a-toy,depth=3"], "prompt": "p"})
    assert Session.from_json(session.to_json()) == session
    ed = SetupEditor("toy:a-toy,depth=3")
    qtbot.addWidget(ed)
    assert ed.valid and ed.method.currentData() == "toy" and ed.control("depth").value() == 3
    unregister("toy")
    try:
        gone = SetupEditor("baseline")
        qtbot.addWidget(gone)
        assert gone.method.findData("toy") == -1
        with pytest.raises(SpecDeckError, match="setup 2"):
            Session.from_json(session.to_json())
    finally:
        register(toy_kind)  # the fixture unregisters it at teardown


def test_a_lane_can_run_on_its_own_target(qtbot):
    """The target picker moves a lane to another target engine (`…@<engine>`): hf and llama.cpp engines are
    offered, the string round-trips, drafts are offered for the lane's own target, and kinds that run their own
    engine (trtllm) cannot be moved."""
    from app.ui.setup_editor import SetupEditor

    st = [_status("qwen-big", "qwen"), _status("lc-qwen-big", "qwen", backend="llamacpp"), _status("lc-qwen-small", "qwen", backend="llamacpp"),
          _status("smol", "smollm2"), _status("trt", "", backend="trtllm")]
    ed = SetupEditor("ngram")
    qtbot.addWidget(ed)
    ed.set_engines(st, st[3])  # the run's target: smol
    offered = [ed.target.itemData(i) for i in range(ed.target.count())]
    assert offered == [None, "qwen-big", "lc-qwen-big", "lc-qwen-small", "smol"]  # no trtllm engine
    ed.target.setCurrentIndex(ed.target.findData("lc-qwen-big"))
    assert ed.setup() == "ngram:n=3,k=8@lc-qwen-big" and ed.valid
    ed.method.setCurrentIndex(ed.method.findData("draft"))
    combo = ed.control("engine")
    drafts = [combo.itemData(i) for i in range(combo.count()) if combo.itemData(i)]
    assert "lc-qwen-small" in drafts and "smol" not in drafts  # compatible with the lane's target, not the run's
    assert ed.setup().endswith("@lc-qwen-big")
    ed.set_setup("baseline@qwen-big")
    assert ed.target.currentData() == "qwen-big" and ed.target.isEnabled()
    ed.set_setup("trtllm:trt")
    assert not ed.target.isEnabled() and ed.target.currentData() is None


def test_k_auto_is_the_spin_boxs_lowest_value(qtbot):
    """`k=auto` (draft:, ngram) shows as the k spin box's value below 1, and choosing it writes k=auto."""
    from app.ui.setup_editor import SetupEditor

    ed = SetupEditor("draft:small,k=auto,dtype=int8")
    qtbot.addWidget(ed)
    k = ed.control("k")
    assert k.value() == k.minimum() == 0 and k.text() == "k=auto" and "cost-aware" in k.toolTip()
    k.setValue(6)
    assert ed.setup() == "draft:small,k=6,dtype=int8"
    k.setValue(k.minimum())
    assert ed.setup() == "draft:small,k=auto,dtype=int8"
    ed.set_setup("ngram:k=auto")
    assert ed.control("k").text() == "k=auto"
    ed.control("n").setValue(4)
    assert ed.setup() == "ngram:n=4,k=auto"
