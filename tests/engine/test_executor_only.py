"""In process or on a cluster is decided in one place (issue #15): the Executor in
:mod:`dpsub_dist.engine.compute`. A ``client is None`` branch (or ``if client:``, ``not
client``, ``client or ...``) anywhere else in the package fails here. Read from the source
with ``ast``, in the style of tests/test_import_graph.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dpsub_dist

ROOT = Path(dpsub_dist.__file__).parent

EXECUTOR_MODULE = "engine/compute.py"
"""Where the Executor lives: the one module allowed to look at its client."""

NOT_YET_PORTED: dict[str, str] = {}
"""Files that still branch on a bare client, and who removes each entry (and how): none left
(power.py and online.py were ported on merge)."""

BARE_CLIENT_ENTRIES = {"engine/sources.py": ["parquet_dataset"]}
"""The engine functions that still accept a bare client (``Executor.of``): parquet_dataset,
which scripts, benchmarks and tests open with a bare client or None."""

EDGES = {
    "api.py": "resolves the estimator's optional client= (Dask's default client for lazy input)",
    "jobfile.py": "uses the caller's client, or opens a cluster for the job",
}
"""Where a user's optional client is chosen, before any Executor exists: which client to use,
not how tasks run. Permanent."""


def _is_client(node: ast.AST) -> bool:
    """``client`` or ``<anything>.client``."""
    return (isinstance(node, ast.Name) and node.id == "client") or (
        isinstance(node, ast.Attribute) and node.attr == "client"
    )


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def client_branches(source: str) -> list[int]:
    """Line numbers of every test of a client against None or of its truth value."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and len(node.comparators) == 1:
            left, right = node.left, node.comparators[0]
            if (_is_client(left) and _is_none(right)) or (_is_none(left) and _is_client(right)):
                found.append(node.lineno)
        tested: list[ast.AST] = []
        if isinstance(node, ast.If | ast.IfExp | ast.While | ast.Assert):
            tested.append(node.test)
        elif isinstance(node, ast.BoolOp):
            tested.extend(node.values)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            tested.append(node.operand)
        found.extend(t.lineno for t in tested if _is_client(t))
    return sorted(set(found))


def package_branches() -> dict[str, list[int]]:
    """Each package file (relative to the package) with client branches, and their lines."""
    branches = {}
    for path in sorted(ROOT.rglob("*.py")):
        lines = client_branches(path.read_text())
        if lines:
            branches[path.relative_to(ROOT).as_posix()] = lines
    return branches


def test_only_the_executor_tells_in_process_from_cluster() -> None:
    allowed = {EXECUTOR_MODULE, *NOT_YET_PORTED, *EDGES}
    stray = {f: lines for f, lines in package_branches().items() if f not in allowed}
    assert not stray, (
        f"client branches outside {EXECUTOR_MODULE} (file: lines): {stray}; take an Executor "
        "and call its methods (workers, map, run, gather, compute, shuffle_method) instead"
    )


@pytest.mark.parametrize("path", [*NOT_YET_PORTED, *EDGES, EXECUTOR_MODULE])
def test_every_allowed_file_still_needs_its_entry(path: str) -> None:
    """A ported file must leave the allow-list, so that the list only ever shrinks."""
    assert client_branches((ROOT / path).read_text()), f"{path} has no client branch left"


@pytest.mark.parametrize(
    "source",
    [
        "if client is None:\n    pass",
        "x = 1 if self.client is not None else 2",
        "if None is client:\n    pass",
        "if client:\n    pass",
        "ok = not client",
        "where = client or default()",
        "while self.client:\n    pass",
    ],
)
def test_the_check_sees_each_form_of_branch(source: str) -> None:
    assert client_branches(source) == [1]


@pytest.mark.parametrize(
    "source",
    [
        "executor.run([], tasks, label, False)",
        "if executor.workers > 1:\n    pass",
        "if clients is None:\n    pass",
        "client = Client(address)",
        "if dataset is None:\n    pass",
    ],
)
def test_the_check_leaves_other_code_alone(source: str) -> None:
    assert client_branches(source) == []


def executor_of_callers() -> dict[str, list[str]]:
    """The functions of each package file that call ``Executor.of``."""
    callers: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "of"
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "Executor"
                ):
                    callers.setdefault(path.relative_to(ROOT).as_posix(), []).append(function.name)
                    break
    return {f: sorted(set(names)) for f, names in callers.items()}


def test_a_bare_client_is_taken_only_where_the_unported_files_need_it() -> None:
    assert executor_of_callers() == BARE_CLIENT_ENTRIES
