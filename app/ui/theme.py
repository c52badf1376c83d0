"""Colours and palettes: token kinds (DESIGN.md), lane colours, light and dark Qt palettes.

Token kinds carry a second cue besides colour (colour-blind safe): rejected drafts are struck through,
corrections get a wavy underline, bonus tokens a dotted underline, accepted drafts a faint green wash.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor, QFont, QPalette, QTextCharFormat, QTextFormat

__all__ = [
    "KINDS",
    "KIND_LABELS",
    "KIND_PROPERTY",
    "LANE_COLORS",
    "Theme",
    "LIGHT",
    "DARK",
    "token_format",
    "apply_palette",
]

#: token kinds shown in a lane; "plain" = baseline tokens and the prompt (default text)
KINDS = ("plain", "accepted", "rejected", "correction", "bonus")
KIND_LABELS = {
    "plain": "baseline / target token",
    "accepted": "accepted draft",
    "rejected": "rejected draft",
    "correction": "correction",
    "bonus": "bonus",
}
#: QTextFormat user property holding the kind index in KINDS (tests and tooltips read it back)
KIND_PROPERTY = QTextFormat.UserProperty + 1

#: lane colours (Okabe–Ito, colour-blind safe), used for plots and lane swatches
LANE_COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#882255", "#117733")  # 5–8: runs beside each other


@dataclass(frozen=True)
class Theme:
    name: str
    dark: bool
    window: str
    base: str
    text: str
    muted: str
    accepted: str
    accepted_bg: str
    rejected: str
    correction: str
    bonus: str
    error_bg: str
    good_bg: str
    warn_bg: str
    plot_bg: str
    plot_fg: str

    def kind_color(self, kind: str) -> str:
        return {
            "plain": self.text,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "correction": self.correction,
            "bonus": self.bonus,
        }[kind]


LIGHT = Theme(
    name="light",
    dark=False,
    window="#f3f4f6",
    base="#ffffff",
    text="#1f2328",
    muted="#59636e",
    accepted="#1a7f37",
    accepted_bg="#e6f4ea",
    rejected="#cf222e",
    correction="#9a6700",
    bonus="#0a58ca",
    error_bg="#ffebe9",
    good_bg="#dafbe1",
    warn_bg="#fff8c5",
    plot_bg="#ffffff",
    plot_fg="#1f2328",
)

DARK = Theme(
    name="dark",
    dark=True,
    window="#1e2227",
    base="#15181c",
    text="#e6edf3",
    muted="#9198a1",
    accepted="#56d364",
    accepted_bg="#12301c",
    rejected="#ff7b72",
    correction="#e3b341",
    bonus="#79c0ff",
    error_bg="#4a1c1c",
    good_bg="#12301c",
    warn_bg="#3b2e05",
    plot_bg="#15181c",
    plot_fg="#e6edf3",
)


def token_format(theme: Theme, kind: str) -> QTextCharFormat:
    """The character format of one token kind (colour + second cue + KIND_PROPERTY)."""
    f = QTextCharFormat()
    f.setProperty(KIND_PROPERTY, KINDS.index(kind))
    if kind == "plain":
        return f
    f.setForeground(QColor(theme.kind_color(kind)))
    if kind == "accepted":
        f.setBackground(QColor(theme.accepted_bg))
    elif kind == "rejected":
        f.setFontStrikeOut(True)
    elif kind == "correction":
        f.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
        f.setUnderlineColor(QColor(theme.correction))
        f.setFontWeight(QFont.Weight.DemiBold)
    elif kind == "bonus":
        f.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DotLine)
        f.setUnderlineColor(QColor(theme.bonus))
        f.setFontWeight(QFont.Weight.DemiBold)
    return f


def apply_palette(app, theme: Theme) -> None:
    """Fusion style with the theme's palette on the whole application."""
    app.setStyle("Fusion")
    p = QPalette()
    win, base, text = QColor(theme.window), QColor(theme.base), QColor(theme.text)
    p.setColor(QPalette.ColorRole.Window, win)
    p.setColor(QPalette.ColorRole.WindowText, text)
    p.setColor(QPalette.ColorRole.Base, base)
    p.setColor(QPalette.ColorRole.AlternateBase, win)
    p.setColor(QPalette.ColorRole.Text, text)
    p.setColor(QPalette.ColorRole.Button, win.lighter(104) if not theme.dark else win.lighter(130))
    p.setColor(QPalette.ColorRole.ButtonText, text)
    p.setColor(QPalette.ColorRole.ToolTipBase, base)
    p.setColor(QPalette.ColorRole.ToolTipText, text)
    p.setColor(QPalette.ColorRole.PlaceholderText, QColor(theme.muted))
    p.setColor(QPalette.ColorRole.Highlight, QColor("#0969da" if not theme.dark else "#1f6feb"))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.Link, QColor(theme.bonus))
    dis = QColor(theme.muted)
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, dis)
    app.setPalette(p)
