"""Per-lane setup editor: method, draft engine (tokenizer-compatible only), k, schedule, n, draft precision.

The fields compose a setup string (DESIGN.md grammar) shown in an editable line; typing in the line updates
the fields. Every change is validated with :func:`app.core.setups.parse_setup`; a bad string shows the
parser's message and the grammar inline and makes :attr:`SetupEditor.valid` false.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QComboBox, QGridLayout, QLabel, QLineEdit, QSpinBox, QWidget

from app.core.errors import SpecDeckError
from app.core.setups import DRAFT_DTYPES, GRAMMAR, Baseline, DraftModel, HFAssisted, HFLookup, NGram, parse_setup

__all__ = ["SetupEditor", "METHODS", "fill_engine_combo"]

METHODS = (
    ("baseline", "baseline"),
    ("draft", "draft model"),
    ("ngram", "n-gram"),
    ("hf-assisted", "hf-assisted"),
    ("hf-lookup", "hf-lookup"),
)


def fill_engine_combo(combo: QComboBox, statuses, keep: str | None = None) -> None:
    """Fill an (editable) engine combo: usable engines selectable, the others greyed with their reason."""
    keep = combo.currentText() if keep is None else keep
    model = QStandardItemModel(combo)
    for st in statuses:
        item = QStandardItem(st.name)
        tip = st.description or st.name
        if not st.usable:
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled & ~Qt.ItemFlag.ItemIsSelectable)
            tip += f"\nnot usable here: {st.reason}"
            item.setText(f"{st.name}  (unavailable)")
        item.setData(st.name, Qt.ItemDataRole.UserRole)
        item.setToolTip(tip)
        model.appendRow(item)
    combo.blockSignals(True)
    combo.setModel(model)
    combo.setEditText(keep or "")
    if not keep:
        for r in range(model.rowCount()):
            if model.item(r).isEnabled():
                combo.setCurrentIndex(r)
                break
    combo.blockSignals(False)


class SetupEditor(QWidget):
    """Edits one setup string.

    Signals:
        changed(str): the setup string after any edit (valid or not; see `valid`).
    """

    changed = Signal(str)

    def __init__(self, setup: str = "baseline", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._updating = False
        self._stops = ""  # ",stop=…,cstop=…" kept from the typed string: the fields do not edit them
        self._target_status = None
        self._statuses: list = []
        self.valid = True
        self.error_text = ""

        self.method = QComboBox()
        for key, label in METHODS:
            self.method.addItem(label, key)
        self.engine = QComboBox()
        self.engine.setEditable(True)
        self.engine.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.engine.setMinimumContentsLength(12)
        self.engine.setToolTip("draft engine: only engines sharing the target's tokenizer are listed (a folder path works too)")
        self.engine.lineEdit().setPlaceholderText("draft engine")
        self.k = QSpinBox()
        self.k.setRange(0, 64)
        self.k.setPrefix("k=")
        self.k.setToolTip("draft tokens per step")
        self.schedule = QComboBox()
        self.schedule.addItems(["constant", "heuristic"])
        self.schedule.setToolTip("k schedule: constant, or heuristic (grow k after full acceptance, shrink after a rejection)")
        self.precision = QComboBox()
        self.precision.addItem("draft: target's dtype", "")
        for d in DRAFT_DTYPES:
            self.precision.addItem(f"draft: {d}", d)
        self.precision.setToolTip(
            "the draft model's precision: it changes how often drafts are accepted and what they cost, never what the "
            "target emits (int8 is CPU-only, about 2x cheaper than float32 there)"
        )
        self.n = QSpinBox()
        self.n.setRange(1, 16)
        self.n.setPrefix("n=")
        self.n.setToolTip("n-gram length matched against prompt + output")
        self.line = QLineEdit()
        self.line.setObjectName("setupLine")
        self.line.setToolTip(GRAMMAR)
        self.line.setPlaceholderText("setup string, e.g. draft:qwen2.5-coder-0.5b-instruct,k=4")
        self.error = QLabel()
        self.error.setObjectName("setupError")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("QLabel { color:#cf222e; font-size:11px }")
        self.error.hide()

        g = QGridLayout(self)
        g.setContentsMargins(0, 0, 0, 0)
        g.setHorizontalSpacing(4)
        g.setVerticalSpacing(3)
        g.addWidget(self.method, 0, 0)
        g.addWidget(self.engine, 0, 1, 1, 3)
        g.addWidget(self.k, 1, 0)
        g.addWidget(self.n, 1, 1)
        g.addWidget(self.schedule, 1, 2)
        g.addWidget(self.precision, 1, 3)
        g.addWidget(self.line, 2, 0, 1, 4)
        g.addWidget(self.error, 3, 0, 1, 4)
        g.setColumnStretch(1, 1)

        self.method.currentIndexChanged.connect(self._fields_changed)
        self.engine.currentTextChanged.connect(self._fields_changed)
        self.k.valueChanged.connect(self._fields_changed)
        self.n.valueChanged.connect(self._fields_changed)
        self.schedule.currentIndexChanged.connect(self._fields_changed)
        self.precision.currentIndexChanged.connect(self._fields_changed)
        self.line.textEdited.connect(self._line_edited)
        self.set_setup(setup)

    # --- engines ---------------------------------------------------------------------------------
    def set_engines(self, statuses, target_status) -> None:
        """Offer the drafts compatible with `target_status` (None: unknown target, nothing offered)."""
        from app.engines.status import compatible

        self._statuses = list(statuses)
        self._target_status = target_status
        drafts = [s for s in self._statuses if target_status is not None and compatible(target_status, s)]
        keep = self.engine.currentText()
        self._updating = True
        try:
            fill_engine_combo(self.engine, drafts, keep=keep)
        finally:
            self._updating = False

    # --- value -----------------------------------------------------------------------------------
    def setup(self) -> str:
        """The current setup string (may be invalid; check `valid`)."""
        return self.line.text().strip()

    def set_setup(self, text: str) -> None:
        self.line.setText(text)
        self._line_edited(text)

    def _line_edited(self, text: str) -> None:
        try:
            s = parse_setup(text)
        except SpecDeckError as e:
            self._set_error(e)
            self.changed.emit(text)
            return
        self._updating = True
        try:
            key = {Baseline: "baseline", DraftModel: "draft", NGram: "ngram", HFAssisted: "hf-assisted", HFLookup: "hf-lookup"}.get(type(s))
            if key is not None:
                self.method.setCurrentIndex(self.method.findData(key))
            if isinstance(s, (DraftModel, HFAssisted)):
                self.engine.setEditText(s.engine)
                self.precision.setCurrentIndex(max(0, self.precision.findData(s.dtype or "")))
            if isinstance(s, DraftModel):
                self.k.setValue(s.k)
                self.schedule.setCurrentText(s.schedule)
                self._stops = (f",stop={s.stop:g}" if s.stop else "") + (f",cstop={s.cstop:g}" if s.cstop else "")
            elif isinstance(s, HFAssisted):
                self.k.setValue(s.k or 0)
            elif isinstance(s, NGram):
                self.n.setValue(s.n)
                self.k.setValue(s.k)
            elif isinstance(s, HFLookup):
                self.k.setValue(s.k)
            self._show_fields()
        finally:
            self._updating = False
        self._set_error(None)
        self.changed.emit(text)

    def _compose(self) -> str:
        m = self.method.currentData()
        eng = self.engine.currentText().split("  (")[0].strip()
        k = self.k.value()
        prec = self.precision.currentData()
        dtype = f",dtype={prec}" if prec else ""
        if m == "baseline":
            return "baseline"
        if m == "draft":
            s = f"draft:{eng},k={k}"
            s += ",schedule=heuristic" if self.schedule.currentText() == "heuristic" else ""
            return s + self._stops + dtype
        if m == "ngram":
            return f"ngram:n={self.n.value()},k={k}"
        if m == "hf-assisted":
            return f"hf-assisted:{eng}" + (f",k={k}" if k > 0 else "") + dtype
        return f"hf-lookup:k={k}"

    def _fields_changed(self, *_a) -> None:
        if self._updating:
            return
        m = self.method.currentData()
        self._updating = True
        try:
            # sensible defaults when switching method
            if m in ("draft",) and self.k.value() == 0:
                self.k.setValue(4)
            if m == "ngram" and self.k.value() == 0:
                self.k.setValue(8)
            if m == "hf-lookup" and self.k.value() == 0:
                self.k.setValue(10)
            if m in ("draft", "hf-assisted") and not self.engine.currentText().strip() and self.engine.count():
                self.engine.setCurrentIndex(0)
            self._show_fields()
        finally:
            self._updating = False
        text = self._compose()
        self.line.setText(text)
        try:
            parse_setup(text)
            self._set_error(None)
        except SpecDeckError as e:
            self._set_error(e)
        self.changed.emit(text)

    def _show_fields(self) -> None:
        m = self.method.currentData()
        self.engine.setVisible(m in ("draft", "hf-assisted"))
        self.k.setVisible(m != "baseline")
        self.k.setMinimum(0 if m == "hf-assisted" else 1)
        self.k.setSpecialValueText("k=auto" if m == "hf-assisted" else "")
        self.schedule.setVisible(m == "draft")
        self.precision.setVisible(m in ("draft", "hf-assisted"))
        self.n.setVisible(m == "ngram")

    def _set_error(self, e: Exception | None) -> None:
        self.valid = e is None
        if e is None:
            self.error_text = ""
            self.error.hide()
            self.line.setStyleSheet("")
            return
        msg = getattr(e, "message", str(e))
        self.error_text = f"{msg}\n{GRAMMAR}"
        self.error.setText(f"{msg}\n{GRAMMAR}")
        self.error.show()
        self.line.setStyleSheet("QLineEdit { border: 1px solid #cf222e }")
