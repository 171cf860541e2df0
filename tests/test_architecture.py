"""The house's shape (ARCHITECTURE.md): layers import only downwards, no module imports itself
back through others, and no function is too long to read at once.

The layer contracts live in pyproject.toml (``[tool.importlinter]``) and are checked here with
import-linter; the cycle check reads the same import graph (grimp, function-local imports
included) and fails on any strongly connected group of two or more modules.
"""

from __future__ import annotations

import ast
import contextlib
import io
from pathlib import Path

import grimp
import networkx as nx
from importlinter import configuration
from importlinter.application.use_cases import lint_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulator", "planner")
MAX_FUNCTION_LINES = 120


def test_layer_contracts_hold():
    configuration.configure()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        kept = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_logo=True,
                            cache_dir=None)
    assert kept, out.getvalue()


def _import_graph() -> nx.DiGraph:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    g = nx.DiGraph()
    for m in graph.modules:
        g.add_node(m)
        for t in graph.find_modules_directly_imported_by(m):
            g.add_edge(m, t)
    return g


def test_no_import_cycles():
    g = _import_graph()
    assert len(g) > 100                      # the graph really holds the project
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not cycles, "modules that import each other: " + "; ".join(
        ", ".join(c) for c in cycles)


def test_simulator_imports_no_planner_even_lazily():
    g = _import_graph()
    bad = [(m, t) for m, t in g.edges if m.startswith("simulator") and t.startswith("planner")]
    assert not bad, bad


def test_no_function_is_too_long_to_read():
    long = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                                    f"({lines} lines)")
    assert not long, "functions over 120 lines: " + "; ".join(long)
