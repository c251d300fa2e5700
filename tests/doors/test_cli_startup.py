"""A CLI that answers at once (issue #38): ``dpsub --version``, ``dpsub --help`` and ``dpsub
estimate --help`` import no NumPy, SciPy, pandas, Dask or method code; the parser is built
from the light tables (:mod:`dpsub_dist.params`, :mod:`dpsub_dist.methods.tables`) and each
method's code is imported when a run calls it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dpsub_dist.methods import MODIFIERS, REGISTRY
from dpsub_dist.methods.spec import Later

HEAVY = ("numpy", "scipy", "pandas", "dask", "distributed", "pyarrow", "sklearn", "fsspec")
LIGHT_METHOD_MODULES = {"dpsub_dist.methods.spec", "dpsub_dist.methods.tables"}

PROBE = """
import json, sys
from dpsub_dist.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def imported_by(*argv: str) -> set[str]:
    """The modules loaded by the entry point for ``dpsub ARGV`` in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ("--version",),
        ("--help",),
        ("estimate", "--help"),
        ("cluster", "--help"),
        ("inspect", "--help"),
        ("transform", "--help"),
        ("stream",),
    ],
)
def test_the_parser_imports_nothing_heavy(argv) -> None:
    modules = imported_by(*argv)
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"dpsub {' '.join(argv)} imported {heavy[:5]}"
    code = sorted(
        m for m in modules if m.startswith("dpsub_dist.methods.") and m not in LIGHT_METHOD_MODULES
    )
    assert not code, f"dpsub {' '.join(argv)} imported method code {code}"


def test_a_run_imports_its_method_when_it_needs_it(tmp_path) -> None:
    """The probe sees heavy imports (else the test above could pass on a blind probe): a run
    that fails on a missing input still validated its method's options, which loads its code."""
    missing = str(tmp_path / "nothing.parquet")
    argv = ["estimate", missing, "--rank", "2", "--epsilon", "1", "--delta", "1e-6"]
    modules = imported_by(*argv, "--method", "friendly", "--out", str(tmp_path / "out"))
    assert {"numpy", "dpsub_dist.methods._sample_aggregate"} <= modules  # its checks ran


def _named(value) -> list[Later]:
    """The lazily imported callables of a declaration (through :func:`~.spec.from_options`)."""
    while hasattr(value, "__wrapped__"):
        value = value.__wrapped__
    return [value] if isinstance(value, Later) else []


@pytest.mark.parametrize("command", sorted(REGISTRY))
def test_every_declared_runner_plan_and_check_exists(command) -> None:
    """A declaration names its code by module and name: a typo would fail only when a run
    calls it, so each name is resolved here."""
    declared = [*REGISTRY[command].values(), *MODIFIERS[command]]
    names = [
        later
        for method in declared
        for attr in ("run", "plan", "check", "choose")
        for later in _named(getattr(method, attr, None))
    ]
    assert names
    for later in names:
        assert callable(later.resolve()), later
