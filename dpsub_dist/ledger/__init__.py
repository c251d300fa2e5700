"""The privacy-budget ledger: SQLite file by default, PostgreSQL by ``postgresql://`` URL.

See :mod:`dpsub_dist.ledger.core` for the run states and the rules that keep
repeated and concurrent runs within a dataset's total budget.
"""

from __future__ import annotations

from dpsub_dist.ledger.core import (
    DatasetStatus,
    Grant,
    Ledger,
    LedgerError,
    LedgerUnavailable,
    Reservation,
    RunRecord,
    RunRequest,
    canonical_dataset,
    check_run_id,
    dataset_key,
    unit_name,
)

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str) -> bool:
    """Whether ``location`` names a PostgreSQL ledger."""
    return location.lower().startswith(POSTGRES_SCHEMES)


def open_ledger(location: str, create: bool = False) -> Ledger:
    """The ledger at a file path (or ``sqlite:///path``) or a ``postgresql://`` URL."""
    if not location or not str(location).strip():
        raise LedgerError("no ledger given: set ledger in the job file or pass --ledger")
    location = str(location).strip()
    if is_postgres(location):
        from dpsub_dist.ledger.postgres import PostgresLedger

        return PostgresLedger(location, create=create)
    if location.lower().startswith("sqlite://"):
        location = location[len("sqlite://") :]
    elif "://" in location:
        scheme = location.split("://", 1)[0]
        raise LedgerError(
            f"unsupported ledger scheme {scheme}://: use a local file path or a postgresql:// URL"
        )
    from dpsub_dist.ledger.sqlite import SQLiteLedger

    return SQLiteLedger(location, create=create)


__all__ = [
    "DatasetStatus",
    "Grant",
    "Ledger",
    "LedgerError",
    "LedgerUnavailable",
    "Reservation",
    "RunRecord",
    "RunRequest",
    "canonical_dataset",
    "check_run_id",
    "dataset_key",
    "is_postgres",
    "open_ledger",
    "unit_name",
]
