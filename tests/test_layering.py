"""Checked architecture rules (DESIGN.md): Qt only under app/ui; app/core is stdlib only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_qt_is_imported_only_under_app_ui():
    bad = [str(p.relative_to(APP.parent)) for p in APP.rglob("*.py") if "ui" not in p.relative_to(APP).parts[:1] and imports(p) & {"PySide6", "pyqtgraph", "PyQt5", "PyQt6"}]
    assert bad == []


def test_core_is_stdlib_only():
    std = set(sys.stdlib_module_names) | {"app"}
    bad = {str(p.relative_to(APP.parent)): imports(p) - std for p in (APP / "core").rglob("*.py") if imports(p) - std}
    assert bad == {}


def test_telemetry_and_worker_do_not_import_the_ui():
    for pkg in ("core", "speculative", "engines", "worker", "telemetry"):
        for p in (APP / pkg).rglob("*.py"):
            src = p.read_text(encoding="utf-8")
            assert "app.ui" not in src, p
