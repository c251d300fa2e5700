"""The package's import graph has no cycles (issue #15): the runner → methods → estimators →
{privacy, engine}; nothing points back. Read from the source with ``ast`` (imports at any
depth, function-level ones included; ``if TYPE_CHECKING:`` blocks are annotations only).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import dpsub_dist

ROOT = Path(dpsub_dist.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports (``from pkg import mod`` names the module)."""
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if _type_checking(node):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs or ({node.module} & modules)
    return found


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    edges = {name: imports(path, set(paths)) - {name} for name, path in paths.items()}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycles() -> None:
    found = cycles(graph())
    assert not found, f"import cycles: {found}"


def test_layers_point_one_way() -> None:
    """Estimators, privacy and engine never import the runner, the methods or the CLI."""
    edges = graph()
    upper = ("dpsub_dist.job", "dpsub_dist.jobfile", "dpsub_dist.cli", "dpsub_dist.methods")
    for module, targets in edges.items():
        if module.startswith(("dpsub_dist.estimators", "dpsub_dist.privacy", "dpsub_dist.engine")):
            back = sorted(t for t in targets if t.startswith(upper) or t == "dpsub_dist")
            assert not back, f"{module} imports {back}"


@pytest.mark.parametrize("module", ["dpsub_dist.job", "dpsub_dist.methods.exact"])
def test_a_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
