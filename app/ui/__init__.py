"""SpecDeck's desktop GUI (PySide6 + pyqtgraph). The only package that imports Qt.

Entry point: :func:`app.ui.main.main` (``python -m app gui``).
"""
