"""The privacy-audit table of docs/privacy.md: claimed ε and measured lower bounds.

Runs every audit case (honest mechanism and planted under-noised twin) with more runs
than the test suite and prints a markdown table. Cases come from test modules that
define ``AUDIT_CASES``: a list of objects with ``name``, ``claimed_epsilon``, ``delta``,
``runs``, ``planted_note`` and ``run(runs, planted) -> AuditResult`` (see
``tests/privacy/test_audit_core.py::AuditCase``).

    python -m bench.privacy_audit_table --runs-factor 5
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"

AUDIT_MODULES: list[str] = [
    "privacy/test_audit_core",  # histogram, friendly core, sparse-vector searches (§2–§4)
    # Add a module here when it defines AUDIT_CASES (covariance, GAP-MAX, stream, clustering).
]
"""Test modules (folder/name under tests/) whose ``AUDIT_CASES`` make up the table."""


def collect(modules: list[str]) -> list:
    """Every AUDIT_CASES entry of the listed test modules."""
    sys.path.insert(0, str(TESTS))  # the tests' shared helpers
    cases = []
    for name in modules:
        folder, module = name.rsplit("/", 1)
        sys.path.insert(0, str(TESTS / folder))
        cases += list(importlib.import_module(module).AUDIT_CASES)
    return cases


def table(cases: list, runs_factor: float) -> str:
    """Run every case honest and planted; one markdown row each."""
    rows = [
        "| mechanism | claimed ε | δ | runs per input | measured ε lower bound | "
        "planted twin | twin's lower bound | twin caught |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        runs = int(case.runs * runs_factor)
        started = time.monotonic()
        honest = case.run(runs)
        twin = case.run(runs, planted=True)
        caught = "yes" if twin.epsilon_lower > case.claimed_epsilon else "**no**"
        rows.append(
            f"| {case.name} | {case.claimed_epsilon:.3g} | {case.delta:.3g} | {runs:,} | "
            f"{honest.epsilon_lower:.3f} | {case.planted_note} | {twin.epsilon_lower:.3f} | "
            f"{caught} |"
        )
        print(f"{case.name}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs-factor", type=float, default=5.0, help="runs = factor × each case's test runs"
    )
    parser.add_argument("--modules", nargs="*", default=AUDIT_MODULES)
    args = parser.parse_args(argv)
    print(table(collect(args.modules), args.runs_factor))


if __name__ == "__main__":
    main()
