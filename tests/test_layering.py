"""Checked architecture rules (DESIGN.md): who may import whom, no import cycles (imports inside functions count),
no private name taken from another module, and the commands' start-up light (no torch, no Qt)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"
ROOT = APP.parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in APP.rglob("*.py"):
        parts = list(p.with_suffix("").relative_to(ROOT).parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imported(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every import in the file, at any depth (functions included); name "" for `import x`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mod = ".".join(path.with_suffix("").relative_to(ROOT).parts)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            out += [(base, a.name) for a in node.names]
    return out


def imports(path: Path) -> set[str]:
    """Top-level package names a file imports."""
    return {m.split(".")[0] for m, _ in _imported(path) if m}


def _target(module: str, name: str) -> str | None:
    """The app module an import refers to (the longest app module prefix), or None outside app."""
    for cand in (f"{module}.{name}" if name else None, module):
        while cand:
            if cand in MODULES:
                return cand
            cand = cand.rpartition(".")[0]
    return None


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, p in MODULES.items():
        for mod, name in _imported(p):
            t = _target(mod, name)
            if t and t != m and not m.startswith(t + ".") and t != "app":  # a package's own __init__ is not an edge back
                g[m].add(t)
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    for v in g:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_even_through_imports_inside_functions():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_name_is_imported_from_another_module():
    bad = []
    for m, p in MODULES.items():
        for mod, name in _imported(p):
            t = _target(mod, "")
            if t and t != m and name.startswith("_") and not name.startswith("__") and f"{mod}.{name}" not in MODULES:
                bad.append(f"{m} imports {mod}.{name}")
    tests = ROOT / "tests"
    for p in tests.rglob("*.py"):
        for mod, name in _imported(p):
            if mod.startswith("app") and name.startswith("_") and not name.startswith("__") and f"{mod}.{name}" not in MODULES:
                bad.append(f"{p.relative_to(ROOT)} imports {mod}.{name}")
    assert bad == []


def test_qt_is_imported_only_under_app_ui():
    bad = [str(p.relative_to(ROOT)) for p in APP.rglob("*.py") if "ui" not in p.relative_to(APP).parts[:1] and imports(p) & {"PySide6", "pyqtgraph", "PyQt5", "PyQt6"}]
    assert bad == []


def test_core_is_stdlib_only():
    std = set(sys.stdlib_module_names) | {"app"}
    bad = {str(p.relative_to(ROOT)): imports(p) - std for p in (APP / "core").rglob("*.py") if imports(p) - std}
    assert bad == {}


def test_no_torch_in_core_or_ui():
    bad = [str(p.relative_to(ROOT)) for pkg in ("core", "ui") for p in (APP / pkg).rglob("*.py") if "torch" in imports(p)]
    assert bad == []


def test_each_layer_imports_only_the_layers_below_it():
    """engines never import the loop, runners, lanes, worker, commands or ui; the loop and runners never import
    lanes, worker, commands or ui; nothing but the commands and ui imports the commands."""
    g = _graph()
    forbidden = {
        "app.core": ("app.engines", "app.speculative", "app.runners", "app.lanes", "app.worker", "app.commands", "app.ui", "app.telemetry"),
        "app.engines": ("app.speculative", "app.runners", "app.lanes", "app.worker", "app.commands", "app.ui"),
        "app.speculative": ("app.runners", "app.lanes", "app.worker", "app.commands", "app.ui"),
        "app.runners": ("app.lanes", "app.worker", "app.commands", "app.ui"),
        "app.lanes": ("app.worker", "app.commands", "app.ui"),
        "app.worker": ("app.commands", "app.ui"),
        "app.telemetry": ("app.speculative", "app.runners", "app.lanes", "app.worker", "app.commands", "app.ui"),
    }
    bad = [f"{m} -> {t}" for m, ts in g.items() for t in ts for layer, no in forbidden.items()
           if (m == layer or m.startswith(layer + ".")) and any(t == n or t.startswith(n + ".") for n in no)]
    assert bad == []


def test_help_engines_and_setups_load_no_torch_and_no_qt():
    code = ("import sys, runpy\n"
            "for argv in (['--help'], ['setups'], ['engines', '--json'], ['bench', '--help']):\n"
            "    sys.argv = ['app', *argv]\n"
            "    try:\n"
            "        runpy.run_module('app', run_name='__main__')\n"
            "    except SystemExit:\n"
            "        pass\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'PySide6', 'pyqtgraph', 'llama_cpp') if m in sys.modules)\n"
            "print('HEAVY', heavy, file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in r.stderr, r.stderr[-2000:]
