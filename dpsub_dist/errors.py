"""Errors a user can act on, each with the exit code the CLI returns for it."""


class DpsubError(Exception):
    """Base class: a one-line message naming the problem and the fix."""

    exit_code = 1


class InputError(DpsubError):
    """Bad input or parameters, found before any budget is spent (exit 2)."""

    exit_code = 2


class NoStableSubspace(DpsubError):
    """The private aggregator returned ⊥: a normal, reported outcome (exit 3)."""

    exit_code = 3


class BudgetRefused(DpsubError):
    """The run would exceed the privacy budget left for this dataset (exit 4)."""

    exit_code = 4


class RunAborted(DpsubError):
    """The cluster or the output storage failed mid-run: nothing written or released (exit 5)."""

    exit_code = 5
