"""The package's import graph has no cycles (issues #15, #28): the runner →
methods → context → {privacy, engine} → the configs (:mod:`dpsub_dist.params`); nothing
points back.
Read from the source with ``ast``: imports at any depth, function-level ones and the
annotation-only ones of ``if TYPE_CHECKING:`` blocks included (a type checker follows them, and
a reader does too).
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


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports (``from pkg import mod`` names the module)."""
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
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


def test_annotation_imports_count(tmp_path) -> None:
    """An import under ``if TYPE_CHECKING:`` is an edge of the graph (issue #28: the configs'
    annotations closed 91 cycles that the old check skipped)."""
    path = tmp_path / "annotated.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dpsub_dist.job import x\n"
    )
    assert imports(path, {"dpsub_dist.job"}) == {"dpsub_dist.job"}


def test_the_configs_sit_at_the_bottom() -> None:
    """The parameter tables and configs import only the errors and the budget."""
    edges = graph()
    assert edges["dpsub_dist.params"] <= {"dpsub_dist.errors", "dpsub_dist.privacy.accountant"}


def test_layers_point_one_way() -> None:
    """Privacy and engine never import the runner, the methods or the CLI."""
    edges = graph()
    upper = ("dpsub_dist.job", "dpsub_dist.jobfile", "dpsub_dist.cli", "dpsub_dist.methods")
    for module, targets in edges.items():
        if module.startswith(("dpsub_dist.privacy", "dpsub_dist.engine", "dpsub_dist.context")):
            back = sorted(t for t in targets if t.startswith(upper) or t == "dpsub_dist")
            assert not back, f"{module} imports {back}"


@pytest.mark.parametrize(
    "module", ["dpsub_dist.job", "dpsub_dist.methods.exact", "dpsub_dist.params"]
)
def test_a_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
