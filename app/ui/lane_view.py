"""One lane on screen: a live header (tokens/s, α, τ, steps, elapsed, badge) over coloured token text.

StepEvents are folded into a pending list when they arrive (cheap) and rendered by :meth:`LaneView.flush`,
which the window calls once per display frame while a run is going (app.ui.run_controller.frame_ms):
consecutive tokens of one kind go into the document with a single ``insertText``; the header's figures are
refreshed at most ``header_hz`` times a second, and on a machine with few cores the scroll bar is held still
(:meth:`LaneView.hold_scrollbar`). The document keeps at most ``max_tokens`` tokens (older text is trimmed in
chunks), so a very long run neither grows memory without bound nor slows every repaint.
"""

from __future__ import annotations

import bisect
import html
import math
import time
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QColor, QFont, QFontInfo, QPalette, QTextBlockFormat, QTextCursor, QTextFormat, QTextOption
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QSizePolicy, QToolTip, QVBoxLayout, QWidget

from app.core.events import StepEvent, TreeStep
from app.core.metrics import LaneAccumulator
from app.ui.theme import KIND_LABELS, KIND_PROPERTY, KINDS, LIGHT, Theme, token_format

__all__ = ["LaneView", "Token", "tokens_of_step", "utf16_len"]

_K = {k: i for i, k in enumerate(KINDS)}
#: longest paragraph (UTF-16 units) before a display-only break at the next word boundary
SOFT_BREAK_CHARS = 1200
SOFT_BREAK_PROPERTY = QTextFormat.UserProperty + 2
#: a held scroll bar (LaneView.hold_scrollbar) is still repainted this often, so its thumb stays roughly true
SCROLLBAR_REFRESH_S = 1.0
#: …and held again once this long has passed since it was released (a frame has painted it)
SCROLLBAR_PAINTED_S = 0.1
_TARGET_KIND = {"correction": "correction", "bonus": "bonus", "baseline": "plain", "library": "plain"}


def utf16_len(s: str) -> int:
    """Length of `s` in QTextDocument positions (UTF-16 code units)."""
    n = len(s)
    return n + sum(1 for ch in s if ord(ch) > 0xFFFF) if not s.isascii() else n


@dataclass(frozen=True, slots=True)
class Token:
    """One displayed token: text, kind index (KINDS), step, draft prob q and target prob p (NaN = unknown)."""

    text: str
    kind: int
    step: int
    q: float
    p: float


def _clean(piece: str, rejected: bool) -> str:
    piece = piece.replace("\r\n", "\n").replace("\r", "\n")
    if rejected:  # a struck-through newline would be invisible: show a return sign instead
        piece = piece.replace("\n", "↵")
    return piece


def tokens_of_step(ev: StepEvent) -> list[Token]:
    """The tokens a step puts on screen, in order: accepted drafts, rejected drafts, then the target token."""
    nan = math.nan
    a = ev.accepted_count
    k = ev.k  # known even when a backend reports counts only (rejected ids unavailable)
    q = ev.draft_probs or ()
    p = ev.target_probs or ()
    has_target = ev.target_id is not None
    out: list[Token] = []
    n_acc = min(a, len(ev.pieces))
    for i in range(n_acc):
        out.append(Token(_clean(ev.pieces[i], False), _K["accepted"], ev.step, q[i] if i < len(q) else nan, p[i] if i < len(p) else nan))
    # p holds the accepted drafts, then the first rejected draft (when one was), then the target token
    p_first_rejected = p[a] if a < k and len(p) > a + (1 if has_target else 0) else nan
    for j, piece in enumerate(ev.rejected_pieces):
        i = a + j
        out.append(Token(_clean(piece, True), _K["rejected"], ev.step, q[i] if i < len(q) else nan, p_first_rejected if j == 0 else nan))
    if has_target and len(ev.pieces) > n_acc:
        kind = "plain" if k == 0 else _TARGET_KIND.get(ev.target_kind, "plain")
        # a library step's chunk (tokens only, drafting unknown): its tokens before the last, plain; the last stands
        # for the target token (app.core.accounting). Other steps have no piece between the accepted and the target.
        for piece in ev.pieces[n_acc:-1]:
            out.append(Token(_clean(piece, False), _K["plain"], ev.step, nan, nan))
        out.append(Token(_clean(ev.pieces[-1], False), _K[kind], ev.step, nan, p[-1] if p else nan))
    return out


def tree_html(tree: TreeStep, theme: Theme, max_nodes: int = 40) -> str:
    """A step's token tree for a tooltip: one node per line, indented by depth, the accepted path in the accepted
    colour and bold, the rest struck through in the rejected colour."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        kids.setdefault(p, []).append(i)
    on_path = set(tree.path)
    rows: list[str] = []
    stack = [(c, 1) for c in reversed(kids.get(-1, []))]
    while stack and len(rows) < max_nodes:
        node, depth = stack.pop()
        text = tree.pieces[node] if node < len(tree.pieces) else f"#{tree.ids[node]}"
        shown = _html(text.replace("\n", "↵").replace(" ", "␣")) or "∅"
        if node in on_path:
            cell = f"<b style='color:{theme.accepted}'>{shown} ✓</b>"
        else:
            cell = f"<s style='color:{theme.rejected}'>{shown}</s>"
        rows.append("&nbsp;" * (2 * (depth - 1)) + "└&nbsp;" + cell)
        stack.extend((c, depth + 1) for c in reversed(kids.get(node, [])))
    more = len(tree.ids) - len(rows)
    head = f"token tree: {len(tree.ids)} nodes, depth {tree.depth}, accepted {len(tree.path)}"
    tail = f"<br>… {more} more nodes" if more > 0 else ""
    return f"{head}<br><code>{'<br>'.join(rows)}</code>{tail}"


def _fmt_num(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


class _TokenText(QPlainTextEdit):
    """Read-only text with per-token tooltips (step, kind, q, p)."""

    def __init__(self, lane: LaneView) -> None:
        super().__init__()
        self._lane = lane
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.viewport().installEventFilter(self)
        f = QFont("DejaVu Sans Mono")
        f.setStyleHint(QFont.StyleHint.Monospace)
        f.setPointSizeF(10.5)
        self.document().setDefaultFont(f)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def eventFilter(self, obj, ev) -> bool:
        if obj is self.viewport() and ev.type() == QEvent.Type.ToolTip:
            text = self._lane.tooltip_at(ev.pos())
            if text:
                QToolTip.showText(ev.globalPos(), text, self)
            else:
                QToolTip.hideText()
            return True
        return super().eventFilter(obj, ev)


class LaneView(QFrame):
    """A lane's header and coloured text.

    Args:
        index: 0-based lane number (title and colour).
        color: lane colour (swatch; same as its plot series).
        max_tokens: tokens kept in the document; the oldest quarter is trimmed when exceeded.
    """

    def __init__(self, index: int, color: str, theme: Theme = LIGHT, max_tokens: int = 20000, header_hz: float = 4.0,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.header_s = 1.0 / header_hz
        self._header_t = 0.0
        self.index = index
        self.color = color
        self.theme = theme
        self.max_tokens = max_tokens
        self.machine = ""  # the machine the lane ran on, when runs of several machines are beside each other
        self.show_rejected = True
        self._fmts: dict = {}  # kind index → QTextCharFormat, for _fmts_theme
        self._fmts_theme: Theme | None = None
        self._hold_scrollbar = False  # see hold_scrollbar
        self._hover = False
        self._sb_released = 0.0  # when the held scroll bar was last let paint
        self.setObjectName("LaneView")
        # opaque: a header label's new text repaints this lane only, not the lanes area and the window beneath it
        self.setAutoFillBackground(True)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setMinimumWidth(220)

        self.title = QLabel()
        self.title.setAutoFillBackground(True)
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.title.setWordWrap(True)
        self.status = QLabel("idle")
        self.status.setObjectName("laneStatus")
        self.stats_label = QLabel("")
        self.stats_label.setObjectName("laneStats")
        self.stats_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.stats_label.setMinimumWidth(40)
        self.stats_label.setWordWrap(True)  # a narrow lane wraps between the figures instead of clipping them
        sf = QFont("DejaVu Sans Mono")
        sf.setStyleHint(QFont.StyleHint.Monospace)
        sf.setPixelSize(11)
        self.stats_label.setFont(sf)
        self.stats_label.setAutoFillBackground(True)
        self.badge = QLabel("")
        self.badge.setObjectName("laneBadge")
        self.badge.hide()
        self.error = QLabel("")
        self.error.setObjectName("laneError")
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.hide()
        self.notice = QLabel("")  # a passing warning (a silent worker); unlike `error` it does not end the lane
        self.notice.setObjectName("laneNotice")
        self.notice.setWordWrap(True)
        self.notice.hide()
        self.text = _TokenText(self)

        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.title, 1)
        top.addWidget(self.status, 0, Qt.AlignmentFlag.AlignTop)
        row2 = QHBoxLayout()
        row2.setContentsMargins(0, 0, 0, 0)
        row2.addWidget(self.stats_label, 1)
        row3 = QHBoxLayout()
        row3.setContentsMargins(0, 0, 0, 0)
        row3.addWidget(self.badge)
        row3.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 6, 8, 6)
        lay.setSpacing(4)
        lay.addLayout(top)
        lay.addLayout(row2)
        lay.addLayout(row3)
        lay.addWidget(self.error)
        lay.addWidget(self.notice)
        lay.addWidget(self.text, 1)
        self.set_setup("", "")
        self.reset()
        self._restyle()

    # --- state -----------------------------------------------------------------------------------
    def reset(self) -> None:
        """Clear for a new run."""
        self.acc = LaneAccumulator()
        self.t_s = 0.0
        self.output_ids: list[int] = []
        self.events_seen = 0
        self.stats = None  # LaneStats at the end
        self.state = "idle"
        self._tokens: list[Token] = []  # kept tokens (bounded by max_tokens)
        self._why: dict[int, str] = {}  # step -> why the drafter drafted what it did (k=auto)
        self._trees: dict[int, TreeStep] = {}  # step -> the token tree it verified (tree lanes)
        self._tree_nodes = 0  # nodes over every tree step (the header's mean)
        self._pending: list[tuple[list[Token], float]] = []  # (tokens, receipt time) not yet rendered
        self._starts: list[int] = []  # document position of each rendered token
        self._rendered: list[int] = []  # index into _tokens of each rendered token
        self._doc_end = 0
        self._block_len = 0
        self._last_ws = False
        self.trimmed_tokens = 0
        self.latency_max_s = 0.0
        self.latency_sum_s = 0.0
        self.latency_n = 0
        self.text.clear()
        self.error.hide()
        self.notice.hide()
        self.badge.hide()
        self.status.setText("idle")
        self._dirty_header = True
        self.update_header()

    def set_setup(self, setup: str, subtitle: str = "", machine: str | None = None) -> None:
        """The header: lane number, the machine it ran on (runs beside each other), setup and what runs it."""
        self.setup = setup
        if machine is not None:
            self.machine = machine
        sw = f"<span style='color:{self.color}; font-size:15px'>■</span>"
        sub = f" <span style='color:{self.theme.muted}'>{subtitle}</span>" if subtitle else ""
        on = f" · {html.escape(self.machine)}" if self.machine else ""
        self.title.setText(f"{sw} <b>Lane {self.index + 1}{on}</b> &nbsp;<code>{setup or '—'}</code>{sub}")

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.set_setup(self.setup)
        self._restyle()
        self.rerender()

    def set_state(self, state: str, text: str | None = None) -> None:
        """idle | waiting | starting | loading | running | done | cancelled | error."""
        self.state = state
        self.status.setText(text or state)
        self._restyle()

    def _restyle(self) -> None:
        t = self.theme
        chip = {
            "running": (t.accepted_bg, t.accepted),
            "done": (t.good_bg, t.accepted),
            "error": (t.error_bg, t.rejected),
            "cancelled": (t.warn_bg, t.correction),
        }.get(getattr(self, "state", "idle"), (t.window, t.muted))
        self.status.setStyleSheet(
            f"QLabel {{ background:{chip[0]}; color:{chip[1]}; border-radius:8px; padding:1px 8px; font-weight:600 }}"
        )
        # the figures change every second during a run: palette and font, not a style sheet, and an opaque label,
        # so that a new text repaints the label alone (a styled label is see-through: the lane was repainted too)
        sp = self.stats_label.palette()
        sp.setColor(QPalette.ColorRole.WindowText, QColor(t.text))
        self.stats_label.setPalette(sp)
        self.error.setStyleSheet(f"QLabel {{ background:{t.error_bg}; color:{t.rejected}; border-radius:4px; padding:4px 6px }}")
        self.notice.setStyleSheet(f"QLabel {{ background:{t.warn_bg}; color:{t.correction}; border-radius:4px; padding:4px 6px }}")
        # colours through the palette, not a style sheet: a styled text area's viewport is not opaque, so every
        # frame of new text repainted the lane, the lanes area and the whole window beneath it
        pal = self.text.palette()
        pal.setColor(QPalette.ColorRole.Base, QColor(t.base))
        pal.setColor(QPalette.ColorRole.Text, QColor(t.text))
        self.text.setPalette(pal)

    def show_error(self, message: str) -> None:
        self.error.setText("⚠ " + message.strip())
        self.error.setToolTip(message)
        self.error.show()
        self.set_state("error")

    def set_notice(self, text: str) -> None:
        """Show a warning over the text ("" hides it); the lane's state is unchanged."""
        self.notice.setText("⚠ " + text if text else "")
        self.notice.setVisible(bool(text))

    def set_badge(self, text: str, good: bool | None) -> None:
        t = self.theme
        bg, fg = (t.good_bg, t.accepted) if good else ((t.warn_bg, t.correction) if good is False else (t.window, t.muted))
        self.badge.setText(text)
        self.badge.setStyleSheet(
            f"QLabel {{ background:{bg}; color:{fg}; border:1px solid {fg}; border-radius:8px; padding:0px 8px; font-weight:600 }}"
        )
        self.badge.show()

    # --- presentation ----------------------------------------------------------------------------
    def set_text_px(self, px: int | None) -> None:
        """Lane text at `px` pixels (presentation mode), the header and figures in proportion; None: the usual sizes."""
        f = self.text.document().defaultFont()
        if px is None:
            f.setPointSizeF(10.5)
        else:
            f.setPixelSize(int(px))
        self.text.document().setDefaultFont(f)
        sf = self.stats_label.font()
        sf.setPixelSize(11 if px is None else max(11, round(px * 0.6)))
        self.stats_label.setFont(sf)
        tf = self.title.font()
        if px is None:
            tf.setPointSizeF(QFont().pointSizeF())
        else:
            tf.setPixelSize(max(12, round(px * 0.7)))
        for w in (self.title, self.status, self.badge, self.error, self.notice):
            w.setFont(tf)

    def text_px(self) -> int:
        """The lane text's size in pixels as drawn."""
        return QFontInfo(self.text.document().defaultFont()).pixelSize()

    # --- events ----------------------------------------------------------------------------------
    def add_step(self, ev: StepEvent, t_recv: float | None = None) -> None:
        """Fold one StepEvent in (no rendering here; see flush)."""
        self.acc.add(ev)
        self.t_s = ev.t_s
        self.events_seen += 1
        self.output_ids.extend(ev.emitted_ids)
        if ev.why:
            self._why[ev.step] = ev.why
        if ev.tree is not None:
            self._trees[ev.step] = ev.tree
            self._tree_nodes += len(ev.tree.ids)
        self._pending.append((tokens_of_step(ev), time.monotonic() if t_recv is None else t_recv))
        self._dirty_header = True
        if self.state != "error" and (self.state != "running" or self.status.text() != "running"):
            self.set_state("running")

    def finish(self, stats, cancelled: bool = False) -> None:
        self.hold_scrollbar(False)  # an ended lane gets no more text: its bar shows where it is
        self.stats = stats
        if stats is not None:
            self.output_ids = list(stats.output_ids)
            self.t_s = stats.wall_s
        self.set_state("cancelled" if cancelled else "done")
        self.update_header()  # the final figures at once

    # --- rendering -------------------------------------------------------------------------------
    def flush(self, header: bool = False) -> int:
        """Render pending tokens in one batch, and the header when it changed and is due (or `header`); returns how
        many tokens were rendered."""
        if self._dirty_header and (header or time.monotonic() - self._header_t >= self.header_s):
            self.update_header()
        if not self._pending:
            return 0
        pending, self._pending = self._pending, []
        now = time.monotonic()
        new: list[Token] = []
        for toks, t in pending:
            lat = now - t
            self.latency_max_s = max(self.latency_max_s, lat)
            self.latency_sum_s += lat
            self.latency_n += 1
            new.extend(toks)
        base = len(self._tokens)
        self._tokens.extend(new)
        sb = self.text.verticalScrollBar()
        if self._hold_scrollbar and sb.isVisible() and not self._hover:
            now = time.monotonic()
            if sb.updatesEnabled():
                if now - self._sb_released >= SCROLLBAR_PAINTED_S:
                    sb.setUpdatesEnabled(False)  # shown and painted after an earlier frame: hold it
            elif now - self._sb_released >= SCROLLBAR_REFRESH_S:
                sb.setUpdatesEnabled(True)  # paints once with this frame (its thumb moved meanwhile)
                self._sb_released = now
        at_bottom = sb.value() >= sb.maximum() - 4
        self._insert(new, base)
        if len(self._tokens) > self.max_tokens:
            self._trim()
        if at_bottom:
            sb.setValue(sb.maximum())
        return len(new)

    def hold_scrollbar(self, hold: bool) -> None:
        """While held (a run on a machine with few cores), the text's scroll bar is not repainted as lines arrive:
        every new line moved its thumb, and the bar's tall groove was filled again each frame, on the lanes' cores.
        It is held from the first frame after it appeared and still painted every :data:`SCROLLBAR_REFRESH_S`; the
        mouse over the lane, or releasing, paints it at once."""
        self._hold_scrollbar = hold
        if not hold:
            self.text.verticalScrollBar().setUpdatesEnabled(True)

    def enterEvent(self, ev) -> None:  # noqa: N802 (Qt's name)
        self._hover = True
        self.text.verticalScrollBar().setUpdatesEnabled(True)
        super().enterEvent(ev)

    def leaveEvent(self, ev) -> None:  # noqa: N802
        self._hover = False
        super().leaveEvent(ev)

    def _insert(self, toks: list[Token], base: int) -> None:
        cur = QTextCursor(self.text.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        cur.beginEditBlock()
        if self._fmts_theme is not self.theme:  # made once per theme, not per frame
            self._fmts = {i: token_format(self.theme, k) for i, k in enumerate(KINDS)}
            self._fmts_theme = self.theme
        fmts = self._fmts
        run: list[str] = []
        run_kind = -1
        pos = self._doc_end
        for j, tok in enumerate(toks):
            if tok.kind == _K["rejected"] and not self.show_rejected:
                continue
            if not tok.text:
                continue
            if self._block_len >= SOFT_BREAK_CHARS and (tok.text[0] == " " or self._last_ws or self._block_len >= 2 * SOFT_BREAK_CHARS):
                # A paragraph is laid out as a whole on every append: cap its length with a display-only
                # break (marked, so document_runs skips it) to keep each repaint cheap on long outputs.
                if run:
                    cur.insertText("".join(run), fmts[run_kind])
                    run = []
                bf = QTextBlockFormat()
                bf.setProperty(SOFT_BREAK_PROPERTY, True)
                cur.insertBlock(bf, fmts[0])
                pos += 1
                self._block_len = 0
            if tok.kind != run_kind and run:
                cur.insertText("".join(run), fmts[run_kind])
                run = []
            run_kind = tok.kind
            run.append(tok.text)
            self._starts.append(pos)
            self._rendered.append(base + j)
            n = utf16_len(tok.text)
            pos += n
            nl = tok.text.rfind("\n")
            self._block_len = self._block_len + n if nl < 0 else n - nl - 1
            self._last_ws = tok.text[-1].isspace()
        if run:
            cur.insertText("".join(run), fmts[run_kind])
        cur.endEditBlock()
        self._doc_end = pos

    def _trim(self) -> None:
        """Drop the oldest quarter of the kept tokens from the document and the index."""
        cut = len(self._tokens) // 4
        self._tokens = self._tokens[cut:]
        self.trimmed_tokens += cut
        # the first rendered token we keep
        r = bisect.bisect_left(self._rendered, cut)
        doc_cut = self._starts[r] if r < len(self._starts) else self._doc_end
        cur = QTextCursor(self.text.document())
        cur.setPosition(0)
        cur.setPosition(doc_cut, QTextCursor.MoveMode.KeepAnchor)
        cur.removeSelectedText()
        self._starts = [s - doc_cut for s in self._starts[r:]]
        self._rendered = [i - cut for i in self._rendered[r:]]
        self._doc_end -= doc_cut

    def rerender(self) -> None:
        """Render all kept tokens again (theme change, rejected drafts shown/hidden)."""
        self.flush()
        self.text.clear()
        self._starts, self._rendered, self._doc_end, self._block_len = [], [], 0, 0
        self._insert(self._tokens, 0)
        sb = self.text.verticalScrollBar()
        sb.setValue(sb.maximum())

    def set_show_rejected(self, show: bool) -> None:
        if show != self.show_rejected:
            self.show_rejected = show
            self.rerender()

    def update_header(self) -> None:
        self._dirty_header = False
        self._header_t = time.monotonic()
        a = self.acc
        tps = a.new_tokens / self.t_s if self.t_s > 0 else None
        if self.stats is not None:
            tps = self.stats.tokens_per_s
        if self._trees:  # α per node means little for a tree: its nodes and how deep the accepted paths reach
            trees = len(self._trees)
            rates = [acc / n for acc, n in zip(a.per_position_accepted, a.per_position_drafted, strict=False) if n][:6]
            depth = " ".join(f"{x:.2f}".lstrip("0") for x in rates)
            drafting = [f"tree {self._tree_nodes / trees:.0f} nodes", f"by depth {depth}"]
        else:
            drafting = [f"α {_fmt_num(a.acceptance_rate)}"]
        parts = [
            f"{_fmt_num(tps, '.1f')} tok/s",
            *drafting,
            f"τ {_fmt_num(a.mean_accepted_len)}",
            f"{a.new_tokens} tok / {a.steps} steps",
            f"{self.t_s:.1f} s",
        ]
        self.stats_label.setText(" · ".join(x.replace(" ", "\u00a0") for x in parts))

    # --- inspection (tooltips, tests) ------------------------------------------------------------
    def token_at(self, doc_pos: int) -> Token | None:
        i = bisect.bisect_right(self._starts, doc_pos) - 1
        if i < 0:
            return None
        tok = self._tokens[self._rendered[i]]
        if doc_pos >= self._starts[i] + utf16_len(tok.text):
            return None
        return tok

    def tooltip_at(self, pos: QPoint) -> str:
        cur = self.text.cursorForPosition(pos)
        p = cur.position()
        if self.text.cursorRect(cur).x() > pos.x() and p > 0:  # the mouse is over the character before
            p -= 1
        tok = self.token_at(p)
        if tok is None:
            return ""
        kind = KINDS[tok.kind]
        color = self.theme.kind_color(kind)
        shown = tok.text.replace("\n", "↵").replace(" ", "␣")
        lines = [f"<b style='color:{color}'>{KIND_LABELS[kind]}</b> <code>{_html(shown)}</code>", f"step {tok.step}"]
        if not math.isnan(tok.q):
            lines.append(f"draft prob q = {tok.q:.3f}")
        if not math.isnan(tok.p):
            lines.append(f"target prob p = {tok.p:.3f}")
        why = self._why.get(tok.step)
        if why:
            lines.append(f"<i>{_html(why)}</i>")
        tree = self._trees.get(tok.step)
        if tree is not None:
            lines.append(tree_html(tree, self.theme))
        return "<br>".join(lines)

    def document_runs(self) -> list[tuple[str, str]]:
        """(text, kind) for every format run in the document, in order (tests; exports)."""
        out: list[tuple[str, str]] = []
        cur = QTextCursor(self.text.document())

        def add(text: str, fmt) -> None:
            v = fmt.property(KIND_PROPERTY)
            kind = KINDS[int(v)] if v is not None else "plain"
            if out and out[-1][1] == kind:
                out[-1] = (out[-1][0] + text, kind)
            else:
                out.append((text, kind))

        block = self.text.document().begin()
        first = True
        while block.isValid():
            if not first and not block.blockFormat().property(SOFT_BREAK_PROPERTY):
                # the block separator (a newline) carries the format it was inserted with
                cur.setPosition(block.position())
                add("\n", cur.charFormat())
            first = False
            it = block.begin()
            while not it.atEnd():
                frag = it.fragment()
                if frag.isValid():
                    add(frag.text(), frag.charFormat())
                it += 1
            block = block.next()
        return out

    @property
    def latency_mean_s(self) -> float:
        return self.latency_sum_s / self.latency_n if self.latency_n else float("nan")

    @property
    def rendered_tokens(self) -> int:
        return len(self._rendered)

    @property
    def kept_tokens(self) -> int:
        return len(self._tokens)


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
