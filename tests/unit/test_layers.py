"""The layers of PRODUCT.md hold in the imports (lazy ones included, those for type annotations only left out),
and no two modules import each other."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import stallscope

SRC = Path(stallscope.__file__).parent.parent

#: package -> the packages it must never import (the ones above it, or beside it on the hot path)
FORBIDDEN = {
    "recorder": {"analysis", "render", "cli", "tuning", "history", "health", "api"},
    "analysis": {"recorder", "render", "cli", "tuning", "history", "api", "launcher"},
    "tuning": {"render", "cli"},
    "render": {"cli"},
    "data": {"analysis", "render", "cli", "tuning", "history"},
}


def _imports() -> dict[str, set[str]]:
    modules = {".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (SRC / "stallscope").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        tree = ast.parse(path.read_text())
        for block in ast.walk(tree):  # imports for type annotations only are no dependency at run time
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
                block.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("stallscope"):
                module = node.module or ""
                found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("stallscope")}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_module_imports_a_layer_above_it() -> None:
    upward = [f"{m} -> {o}" for m, outs in _imports().items() for o in outs
              if _package(o) in FORBIDDEN.get(_package(m), set())]
    assert not upward, upward


def test_no_import_cycle_between_modules() -> None:
    try:
        tuple(TopologicalSorter(_imports()).static_order())
    except CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None
