"""Per-lane setup editor, built from the setup-type registry (app.core.setups).

The method combo lists the registered kinds; each kind's engine argument and parameters become controls built
from their declarations (int → spin box with the declared range, float → decimal spin box, choices → combo,
optional → a special "unset" value showing `Param.unset`; tooltips from the help text). The fields compose the
setup's canonical label in an editable line; typing in the line parses it and updates the fields. A bad string
shows the parser's message and the grammar inline and makes :attr:`SetupEditor.valid` false.

Values are kept as parsed, so a parameter the controls cannot show exactly (a float with more decimals than
the spin box) survives edits of the other fields unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QGridLayout, QLabel, QLineEdit, QSpinBox, QVBoxLayout, QWidget

from app.core.errors import SpecDeckError
from app.core.setups import Param, SetupKind, grammar, kind_of, kinds, parse_setup

__all__ = ["SetupEditor", "KindFields", "fill_engine_combo", "engine_name", "PARAM_COLUMNS"]

#: parameter controls per row of the editor
PARAM_COLUMNS = 3
_INT_MAX = 2**31 - 1
_FLOAT_DECIMALS = 3


def engine_name(text: str) -> str:
    """The engine name in an engine combo's text (without the "  (unavailable)" suffix)."""
    return text.split("  (")[0].strip()


def fill_engine_combo(combo: QComboBox, statuses, keep: str | None = None, problems=()) -> None:
    """Fill an (editable) engine combo: usable engines selectable, the others greyed with their reason, and each
    broken manifest (app.engines.registry.ManifestProblem) greyed as "name  (broken manifest)" with its error."""
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
    for pr in problems:
        item = QStandardItem(f"{pr.name}  (broken manifest)")
        item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled & ~Qt.ItemFlag.ItemIsSelectable)
        item.setData(pr.name, Qt.ItemDataRole.UserRole)
        item.setToolTip(pr.message)
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


def offered_engines(kind: SetupKind, statuses, target_status) -> list:
    """The engines a kind's engine argument offers: role "draft" → compatible with the target; role "lane" →
    engines whose backend the argument accepts."""
    from app.engines.status import compatible

    arg = kind.engine
    if arg is None:
        return []
    if arg.role == "draft":
        return [s for s in statuses if target_status is not None and compatible(target_status, s)]
    if arg.role == "head":  # a trained head, not an engine: typed (or picked from the grammar's example)
        return []
    return [s for s in statuses if arg.backends is None or s.backend in arg.backends]


def _first_usable(combo: QComboBox | None) -> str:
    """The first enabled engine of an engine combo ("" when none)."""
    model = combo.model() if combo is not None else None
    for r in range(model.rowCount() if model is not None else 0):
        item = model.item(r) if isinstance(model, QStandardItemModel) else None
        if item is not None and item.isEnabled():
            return str(item.data(Qt.ItemDataRole.UserRole) or item.text())
    return ""


def _tip(p: Param) -> str:
    tip = f"{p.name}: {p.help}" if p.help else p.name
    if p.optional and p.unset:
        tip += f"\nunset: {p.unset}"
    if p.auto:
        tip += f"\nauto (the lowest value): {p.auto}"
    return tip


def _param_control(p: Param) -> QWidget:
    """A control for one declared parameter (value set separately)."""
    label = p.gui or p.name
    w: QWidget
    if p.choices:
        w = QComboBox()
        if p.optional:
            w.addItem(f"{label}: {p.unset or 'unset'}", None)
        for c in p.choices:
            w.addItem(f"{label}={c}", c)
    elif p.type is int:
        w = QSpinBox()
        lo = int(p.min) if p.min is not None else -_INT_MAX
        hi = int(p.max) - (1 if p.max_exclusive else 0) if p.max is not None else _INT_MAX
        w.setRange(lo - 1 if p.optional or p.auto else lo, hi)
        w.setPrefix(f"{label}=")
        if p.optional:
            w.setSpecialValueText(f"{label}: {p.unset or 'unset'}")
        elif p.auto:  # the value below the range reads `auto` (k=auto)
            w.setSpecialValueText(f"{label}=auto")
    elif p.type is float:
        w = QDoubleSpinBox()
        w.setDecimals(_FLOAT_DECIMALS)
        step = 10.0**-_FLOAT_DECIMALS
        lo = float(p.min) if p.min is not None else -1e9
        hi = float(p.max) - (step if p.max_exclusive else 0.0) if p.max is not None else 1e9
        w.setRange(lo - step if p.optional else lo, hi)
        w.setSingleStep(0.05 if hi - lo <= 1.0 else 1.0)
        w.setPrefix(f"{label}=")
        if p.optional:
            w.setSpecialValueText(f"{label}: {p.unset or 'unset'}")
    else:
        w = QLineEdit()
        w.setPlaceholderText(f"{label}: {p.unset or 'unset'}" if p.optional else label)
    w.setToolTip(_tip(p))
    w.setObjectName(f"param_{p.name}")
    return w


class KindFields(QWidget):
    """The controls of one setup kind: its engine combo (when it has an engine argument) and one control per
    parameter, in declaration order.

    Signals:
        edited(str): the name of the field the user changed ("engine" or a parameter name).
    """

    edited = Signal(str)

    def __init__(self, kind: SetupKind, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.kind = kind
        self._loading = False
        self.engine: QComboBox | None = None
        self.controls: dict[str, QWidget] = {}
        g = QGridLayout(self)
        g.setContentsMargins(0, 0, 0, 0)
        g.setHorizontalSpacing(4)
        g.setVerticalSpacing(3)
        if kind.engine is not None:
            self.engine = QComboBox()
            self.engine.setEditable(True)
            self.engine.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            self.engine.setMinimumContentsLength(12)
            what = "engines sharing the target's tokenizer" if kind.engine.role == "draft" else "engines of a matching backend"
            self.engine.setToolTip(f"{kind.engine.help or 'engine'}\n(only {what} are listed; a folder path works too)")
            self.engine.lineEdit().setPlaceholderText(kind.engine.example)
            self.engine.setObjectName("engine")
            self.engine.currentTextChanged.connect(lambda _t: self._user_edit("engine"))
        for i, p in enumerate(kind.params):
            w = _param_control(p)
            self.controls[p.name] = w
            g.addWidget(w, i // PARAM_COLUMNS, i % PARAM_COLUMNS)
            self._connect(p.name, w)
        for c in range(PARAM_COLUMNS):
            g.setColumnStretch(c, 1)

    def _connect(self, name: str, w: QWidget) -> None:
        if isinstance(w, QComboBox):
            w.currentIndexChanged.connect(lambda _i: self._user_edit(name))
        elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
            w.valueChanged.connect(lambda _v: self._user_edit(name))
        elif isinstance(w, QLineEdit):
            w.textEdited.connect(lambda _t: self._user_edit(name))

    def _user_edit(self, name: str) -> None:
        if not self._loading:
            self.edited.emit(name)

    # --- values ------------------------------------------------------------------------------------
    def load(self, setup: Any) -> None:
        """Show a setup's values (no `edited` signals)."""
        self._loading = True
        try:
            if self.engine is not None:
                self.engine.setEditText(setup.engine)
            for p in self.kind.params:
                self._show(p, getattr(setup, p.name))
        finally:
            self._loading = False

    def _show(self, p: Param, v: Any) -> None:
        w = self.controls[p.name]
        if isinstance(w, QComboBox):
            w.setCurrentIndex(max(0, w.findData(v)))
        elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
            w.setValue(w.minimum() if v is None or (p.auto and v == "auto") else v)
        elif isinstance(w, QLineEdit):
            w.setText("" if v is None else str(v))

    def value(self, name: str) -> Any:
        """The value a control shows (None: unset)."""
        if name == "engine":
            return engine_name(self.engine.currentText()) if self.engine is not None else None
        p = next(p for p in self.kind.params if p.name == name)
        w = self.controls[name]
        if isinstance(w, QComboBox):
            return w.currentData()
        if isinstance(w, (QSpinBox, QDoubleSpinBox)):
            if p.optional and w.value() == w.minimum():
                return None
            if p.auto and w.value() == w.minimum():
                return "auto"
            return int(w.value()) if p.type is int else round(float(w.value()), _FLOAT_DECIMALS)
        text = w.text().strip() if isinstance(w, QLineEdit) else ""
        return text or (None if p.optional else "")

    def set_engines(self, statuses, target_status) -> None:
        """Offer the engines the kind's engine argument accepts (keeps the current text)."""
        if self.engine is None:
            return
        self._loading = True
        try:
            fill_engine_combo(self.engine, offered_engines(self.kind, statuses, target_status), keep=self.engine.currentText())
        finally:
            self._loading = False


class SetupEditor(QWidget):
    """Edits one setup string.

    Signals:
        changed(str): the setup string after any edit (valid or not; see `valid`).
    """

    changed = Signal(str)

    def __init__(self, setup: str = "baseline", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._statuses: list = []
        self._target_status = None
        self._pages: dict[str, KindFields] = {}
        self._values: dict[str, Any] = {}  # the current kind's field values, as parsed or edited
        self._values_kind: SetupKind | None = None
        self._updating = False
        self.valid = True
        self.error_text = ""

        self.method = QComboBox()
        self.method.setToolTip("the setup type (method) of this lane")
        for k in kinds():
            self.method.addItem(k.title, k.prefix)
            self.method.setItemData(self.method.count() - 1, k.summary, Qt.ItemDataRole.ToolTipRole)
        self.target = QComboBox()
        self.target.setObjectName("laneTarget")
        self.target.setToolTip("the target engine this lane runs on (…@<engine>): the run's target, or another one — e.g. the "
                               "same model on llama.cpp; its speedup is measured against that target's own baseline")
        self.target.addItem("on the run's target", None)
        self.fields = QWidget()
        self._fields_layout = QVBoxLayout(self.fields)
        self._fields_layout.setContentsMargins(0, 0, 0, 0)
        self.line = QLineEdit()
        self.line.setObjectName("setupLine")
        self.line.setToolTip(grammar())
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
        self._engine_slot = QVBoxLayout()
        self._engine_slot.setContentsMargins(0, 0, 0, 0)
        g.addLayout(self._engine_slot, 0, 1)
        g.addWidget(self.target, 1, 0, 1, 2)
        g.addWidget(self.fields, 2, 0, 1, 2)
        g.addWidget(self.line, 3, 0, 1, 2)
        g.addWidget(self.error, 4, 0, 1, 2)
        g.setColumnStretch(1, 1)

        self.method.currentIndexChanged.connect(self._method_chosen)
        self.target.currentIndexChanged.connect(self._target_chosen)
        self.line.textEdited.connect(self._line_edited)
        self.set_setup(setup)

    # --- kinds and their pages ---------------------------------------------------------------------
    @property
    def kind(self) -> SetupKind | None:
        """The kind the method combo shows."""
        prefix = self.method.currentData()
        return next((k for k in kinds() if k.prefix == prefix), None)

    def page(self, prefix: str | None = None) -> KindFields | None:
        """The fields of a kind (default: the current one), built on first use."""
        kind = self.kind if prefix is None else next((k for k in kinds() if k.prefix == prefix), None)
        if kind is None:
            return None
        pg = self._pages.get(kind.prefix)
        if pg is None or pg.kind is not kind:  # first use, or the kind was registered again
            if pg is not None:
                for w in (pg.engine, pg):
                    if w is not None:
                        w.hide()
                        w.deleteLater()
            pg = KindFields(kind)
            pg.set_engines(self._statuses, self._lane_target_status())
            pg.edited.connect(self._field_edited)
            if pg.engine is not None:
                self._engine_slot.addWidget(pg.engine)
            self._fields_layout.addWidget(pg)
            self._pages[kind.prefix] = pg
        return pg

    def control(self, name: str) -> QWidget | None:
        """The current kind's control for a parameter, or its engine combo for "engine" (tests, screenshots)."""
        pg = self.page()
        if pg is None:
            return None
        return pg.engine if name == "engine" else pg.controls.get(name)

    def _show_page(self, prefix: str) -> None:
        for key, pg in self._pages.items():
            on = key == prefix
            pg.setVisible(on and bool(pg.controls))
            if pg.engine is not None:
                pg.engine.setVisible(on)
        self.fields.setVisible(bool(self._pages.get(prefix) and self._pages[prefix].controls))

    # --- engines -----------------------------------------------------------------------------------
    def set_engines(self, statuses, target_status) -> None:
        """Offer engines for every kind's engine argument: drafts compatible with `target_status` (None:
        unknown target, none offered) and lane engines of the accepted backends."""
        self._statuses = list(statuses)
        self._target_status = target_status
        self._updating = True
        try:
            current = self.target.currentData()
            self.target.clear()
            self.target.addItem("on the run's target", None)
            for st in self._statuses:
                if st.steps and st.usable:
                    self.target.addItem(f"on {st.name} ({st.backend}, {st.dtype})", st.name)
            self._select_target(current)
            for pg in self._pages.values():
                pg.set_engines(self._statuses, self._lane_target_status())
        finally:
            self._updating = False

    def _lane_target_status(self):
        """The status of the engine this lane runs on (its own target, else the run's): drafts must match it."""
        name = self._values.get("target")
        return next((st for st in self._statuses if st.name == name), self._target_status) if name else self._target_status

    def _select_target(self, name: str | None) -> None:
        i = self.target.findData(name)
        if i < 0 and name:
            self.target.addItem(f"on {name}", name)
            i = self.target.count() - 1
        self.target.setCurrentIndex(max(0, i))

    def _target_chosen(self, _i: int) -> None:
        if self._updating:
            return
        self._values["target"] = self.target.currentData()
        pg = self.page()
        if pg is not None:
            self._updating = True
            try:
                pg.set_engines(self._statuses, self._lane_target_status())
            finally:
                self._updating = False
        self._compose()

    # --- value -------------------------------------------------------------------------------------
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
        kind = kind_of(s)
        self._updating = True
        try:
            self.method.setCurrentIndex(self.method.findData(kind.prefix))
            pg = self.page(kind.prefix)
            assert pg is not None
            pg.load(s)
            self._values = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
            self._values_kind = kind
            self._show_page(kind.prefix)
            self._select_target(s.target)
            self.target.setEnabled(kind.takes_target)
        finally:
            self._updating = False
        self._set_error(None)
        self.changed.emit(text)

    def _method_chosen(self, _i: int) -> None:
        """A new method: its defaults, keeping the engine name when both kinds take the same kind of engine,
        else the first usable engine offered."""
        if self._updating:
            return
        kind, pg, prev = self.kind, self.page(), self._values_kind
        if kind is None or pg is None:
            return
        values = {f.name: f.default for f in dataclasses.fields(kind.setup_cls) if f.default is not dataclasses.MISSING}
        values["target"] = self._values.get("target") if kind.takes_target else None
        self.target.setEnabled(kind.takes_target)
        pg.set_engines(self._statuses, self._lane_target_status())
        if kind.engine is not None:
            same = prev is not None and prev.engine is not None and (prev.engine.role, prev.engine.backends) == (kind.engine.role, kind.engine.backends)
            values["engine"] = (self._values.get("engine") if same else "") or _first_usable(pg.engine)
        self._values, self._values_kind = values, kind
        self._updating = True
        try:
            pg.load(kind.setup_cls(**values))
            self._show_page(kind.prefix)
        finally:
            self._updating = False
        self._compose()

    def _field_edited(self, name: str) -> None:
        if self._updating:
            return
        pg = self.page()
        if pg is None:
            return
        self._values[name] = pg.value(name)
        self._compose()

    def _compose(self) -> None:
        kind = self.kind
        assert kind is not None
        text = kind.label(kind.setup_cls(**self._values))
        self.line.setText(text)
        try:
            parse_setup(text)
            self._set_error(None)
        except SpecDeckError as e:
            self._set_error(e)
        self.changed.emit(text)

    def resizeEvent(self, ev) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(ev)
        self._fit_error()

    def _fit_error(self) -> None:
        """A wrapped label inside nested layouts gets too little height (its first and last lines were cut):
        ask for what the text needs at the editor's width."""
        if not self.error.isHidden():
            self.error.setMinimumHeight(self.error.heightForWidth(max(120, self.width())))

    def _set_error(self, e: Exception | None) -> None:
        self.valid = e is None
        if e is None:
            self.error_text = ""
            self.error.hide()
            self.line.setStyleSheet("")
            return
        msg = getattr(e, "message", str(e))
        self.error_text = f"{msg}\n{grammar()}"
        self.error.setText(self.error_text)
        self.error.show()
        self._fit_error()
        self.line.setStyleSheet("QLineEdit { border: 1px solid #cf222e }")
