"""Errors a user can act on, each with the exit code the CLI returns for it."""

import difflib
from collections.abc import Iterable


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


class DataError(InputError):
    """The data failed validation after it was read (NaN/inf, nulls, ragged lists): exit 6.

    ``str(err)`` is the operator's detail (file, column, counts, row positions). What is
    *published* (CLI exit code and message, ledger record, manifest) is only
    :attr:`public_message`, because the detail depends on private values; the CLI writes
    the detail to an operator-only diagnostics file (:mod:`dpsub_dist.diagnostics`).
    Under the ledger the run's reservation is charged, not returned.
    """

    exit_code = 6
    public_message = "the run failed after reading its data"
    """The one published failure: the same words for data that failed validation and for
    any other error after a row was read (:class:`RunFailed`), since which of the two it was
    can depend on the data."""


class RunFailed(DataError):
    """An unexpected error while a ledger run read and computed (a bug, a missing module):
    the data may have been read, so the run is 'failed' and stays charged, as for
    :class:`DataError`. ``str(err)`` (a traceback, which may hold private values) is the
    operator's detail; only :attr:`public_message`, the same as a data error's, is
    published."""


class StorageFailure(InputError):
    """Storage or network failed (denied, missing, unreachable): exit 2 before the budget is
    reserved; after it is reserved the run stays reserved (resumable), never refunded."""


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``known`` to a misspelt ``word`` (or "")."""
    close = difflib.get_close_matches(word, [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
