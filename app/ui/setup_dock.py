"""The setup dock's content: the lanes (1–4 setup editors with duplicate/remove), sampling and the prompt."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import SpecDeckError
from app.core.prompts import list_suites, load_suite
from app.core.setups import Sampling
from app.ui.session import MAX_SETUPS, SAMPLING_RANGES
from app.ui.setup_editor import SetupEditor
from app.ui.theme import LANE_COLORS

__all__ = ["SetupPanel", "LaneRow", "MAX_LANES", "WARMUP_TOKENS"]

MAX_LANES = MAX_SETUPS
WARMUP_TOKENS = 4


class LaneRow(QFrame):
    """A lane's row: colour swatch, setup editor, duplicate and remove buttons."""

    def __init__(self, setup: str) -> None:
        super().__init__()
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.swatch = QLabel()
        self.swatch.setFixedWidth(16)
        self.swatch.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignHCenter)
        self.editor = SetupEditor(setup)
        self.dup = QToolButton()
        self.dup.setText("dup")
        self.dup.setToolTip("duplicate this lane")
        self.remove = QToolButton()
        self.remove.setText("✕")
        self.remove.setToolTip("remove this lane")
        btns = QVBoxLayout()
        btns.setSpacing(2)
        btns.addWidget(self.dup)
        btns.addWidget(self.remove)
        btns.addStretch(1)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.swatch)
        lay.addWidget(self.editor, 1)
        lay.addLayout(btns)

    def set_index(self, i: int) -> None:
        self.swatch.setText(f"<span style='color:{LANE_COLORS[i % len(LANE_COLORS)]}; font-size:16px'>■</span><br><b>{i + 1}</b>")


class SetupPanel(QWidget):
    """Lanes, sampling and prompt.

    Signals:
        lanesChanged(): a lane was added, removed or edited (see :meth:`invalid_lane`).
    """

    lanesChanged = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[LaneRow] = []
        self.prompt_id = "custom"
        self._statuses: list = []
        self._target_status = None
        self._prompt_programmatic = False
        dl = QVBoxLayout(self)
        dl.setContentsMargins(6, 6, 6, 6)
        self.lanes_box = QGroupBox(f"Lanes (1–{MAX_LANES})")
        self.lanes_layout = QVBoxLayout(self.lanes_box)
        self.lanes_layout.setSpacing(4)
        self.add_lane_btn = QPushButton("+ Add lane")
        self.add_lane_btn.clicked.connect(lambda: self.add_lane("ngram"))
        self.lanes_layout.addWidget(self.add_lane_btn)
        dl.addWidget(self.lanes_box)
        dl.addWidget(self._sampling_box())
        dl.addWidget(self._prompt_box(), 1)
        self._fill_prompt_combo(self.suite_combo.currentText())

    def _sampling_box(self) -> QGroupBox:
        samp = QGroupBox("Sampling")
        fl = QFormLayout(samp)
        r = SAMPLING_RANGES
        self.temp_spin = QDoubleSpinBox()
        self.temp_spin.setRange(*r["temperature"])
        self.temp_spin.setSingleStep(0.1)
        self.temp_spin.setDecimals(2)
        self.temp_spin.setToolTip("0 = greedy (speculative lanes must then match the baseline exactly)")
        self.top_p_spin = QDoubleSpinBox()
        self.top_p_spin.setRange(*r["top_p"])
        self.top_p_spin.setSingleStep(0.05)
        self.top_k_spin = QSpinBox()
        self.top_k_spin.setRange(*r["top_k"])
        self.top_k_spin.setSpecialValueText("off")
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(*r["seed"])
        self.max_tok_spin = QSpinBox()
        self.max_tok_spin.setRange(*r["max_new_tokens"])
        for label, w in (("temperature", self.temp_spin), ("top-p", self.top_p_spin), ("top-k", self.top_k_spin),
                         ("seed", self.seed_spin), ("max new tokens", self.max_tok_spin)):
            fl.addRow(label, w)
        return samp

    def _prompt_box(self) -> QGroupBox:
        pr = QGroupBox("Prompt")
        pl = QVBoxLayout(pr)
        row = QHBoxLayout()
        self.suite_combo = QComboBox()
        self.suite_combo.addItems(list_suites())
        self.suite_combo.currentTextChanged.connect(self._fill_prompt_combo)
        self.prompt_combo = QComboBox()
        self.prompt_combo.setToolTip("built-in prompts, by category")
        self.prompt_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.prompt_combo.setMinimumContentsLength(12)
        if self.suite_combo.findText("specbench-mini") >= 0:
            self.suite_combo.setCurrentText("specbench-mini")
        self.prompt_combo.activated.connect(self._prompt_chosen)
        row.addWidget(self.suite_combo)
        row.addWidget(self.prompt_combo, 1)
        pl.addLayout(row)
        self.prompt_edit = QPlainTextEdit()
        self.prompt_edit.setPlaceholderText("Type a prompt, or pick one above")
        self.prompt_edit.setMinimumHeight(90)
        self.prompt_edit.textChanged.connect(self._prompt_edited)
        pl.addWidget(self.prompt_edit, 1)
        self.chat_check = QCheckBox("apply the chat template")
        self.chat_check.setChecked(True)
        pl.addWidget(self.chat_check)
        self.warmup_check = QCheckBox(f"warm up first ({WARMUP_TOKENS} tokens per lane, not recorded)")
        self.warmup_check.setToolTip(
            "an unrecorded short run first, so the first lane does not pay for one-time start-up costs\n(the CLI's bench does the same)"
        )
        self.warmup_check.setChecked(True)
        pl.addWidget(self.warmup_check)
        return pr

    # --- lanes ---------------------------------------------------------------------------------------
    def add_lane(self, setup: str = "baseline", after: int | None = None) -> LaneRow | None:
        if len(self.rows) >= MAX_LANES:
            return None
        row = LaneRow(setup)
        row.editor.set_engines(self._statuses, self._target_status)
        row.editor.changed.connect(lambda _s: self.lanesChanged.emit())
        row.dup.clicked.connect(lambda: self.add_lane(row.editor.setup(), after=self.rows.index(row)))
        row.remove.clicked.connect(lambda: self.remove_lane(self.rows.index(row)))
        pos = len(self.rows) if after is None else after + 1
        self.rows.insert(pos, row)
        self.lanes_layout.insertWidget(pos, row)
        self._renumber()
        return row

    def remove_lane(self, i: int) -> None:
        if len(self.rows) <= 1 or not 0 <= i < len(self.rows):
            return
        row = self.rows.pop(i)
        self.lanes_layout.removeWidget(row)
        row.deleteLater()
        self._renumber()

    def set_setups(self, setups) -> None:
        setups = list(setups)[:MAX_LANES] or ["baseline"]
        while len(self.rows) > len(setups):
            row = self.rows.pop()
            self.lanes_layout.removeWidget(row)
            row.deleteLater()
        for i, s in enumerate(setups):
            if i < len(self.rows):
                self.rows[i].editor.set_setup(s)
            else:
                self.add_lane(s)
        self._renumber()

    def setups(self) -> list[str]:
        return [r.editor.setup() for r in self.rows]

    def invalid_lane(self) -> tuple[int, SetupEditor] | None:
        """(index, editor) of the first lane whose setup string does not parse, or None."""
        return next(((i, r.editor) for i, r in enumerate(self.rows) if not r.editor.valid), None)

    def _renumber(self) -> None:
        for i, r in enumerate(self.rows):
            r.set_index(i)
            r.remove.setEnabled(len(self.rows) > 1)
            r.dup.setEnabled(len(self.rows) < MAX_LANES)
        self.add_lane_btn.setEnabled(len(self.rows) < MAX_LANES)
        self.lanesChanged.emit()

    def set_engines(self, statuses, target_status) -> None:
        self._statuses, self._target_status = list(statuses), target_status
        for r in self.rows:
            r.editor.set_engines(self._statuses, target_status)

    # --- sampling ------------------------------------------------------------------------------------
    def sampling(self) -> Sampling:
        return Sampling(
            temperature=float(self.temp_spin.value()),
            top_p=float(self.top_p_spin.value()),
            top_k=int(self.top_k_spin.value()),
            seed=int(self.seed_spin.value()),
            max_new_tokens=int(self.max_tok_spin.value()),
        )

    def set_sampling(self, sp: Sampling) -> None:
        self.temp_spin.setValue(sp.temperature)
        self.top_p_spin.setValue(sp.top_p)
        self.top_k_spin.setValue(sp.top_k)
        self.seed_spin.setValue(sp.seed)
        self.max_tok_spin.setValue(sp.max_new_tokens)

    # --- prompt --------------------------------------------------------------------------------------
    def prompt(self) -> str:
        return self.prompt_edit.toPlainText()

    def _fill_prompt_combo(self, suite: str) -> None:
        self.prompt_combo.clear()
        self.prompt_combo.addItem("— built-in prompts —", None)
        try:
            prompts = load_suite(suite) if suite else []
        except SpecDeckError:
            prompts = []
        by_cat: dict[str, list] = {}
        for p in prompts:
            by_cat.setdefault(p.category or "other", []).append(p)
        for cat, ps in by_cat.items():
            self.prompt_combo.addItem(f"[{cat}]", None)
            self.prompt_combo.model().item(self.prompt_combo.count() - 1).setEnabled(False)
            for p in ps:
                first = p.prompt.strip().splitlines()[0] if p.prompt.strip() else ""
                self.prompt_combo.addItem(f"   {p.id}: {first[:48]}", (p.id, p.prompt))
                self.prompt_combo.setItemData(self.prompt_combo.count() - 1, p.prompt, Qt.ItemDataRole.ToolTipRole)

    def _prompt_chosen(self, i: int) -> None:
        d = self.prompt_combo.itemData(i)
        if d:
            self.set_prompt(d[1], d[0])

    def set_prompt(self, text: str, prompt_id: str = "custom") -> None:
        self._prompt_programmatic = True
        try:
            self.prompt_edit.setPlainText(text)
        finally:
            self._prompt_programmatic = False
        self.prompt_id = prompt_id

    def _prompt_edited(self) -> None:
        if not self._prompt_programmatic:
            self.prompt_id = "custom"
