"""The ledger in a PostgreSQL database, for runs on several hosts (``postgresql://`` URL).

Needs ``psycopg`` (``pip install 'dpsub_dist[postgres]'``). Tables are prefixed
``dpsub_`` so the ledger can share a database. A reservation locks its dataset with
a transaction-level advisory lock (which also covers a grant not yet inserted) and
``SELECT … FOR UPDATE`` on the grant row, so concurrent runs on the same dataset
serialise; runs on different datasets do not wait for each other.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from dpsub_dist.ledger.core import GRANT_SELECT, Ledger, LedgerError, LedgerUnavailable

SCHEMA_LOCK_KEY = 0x44505355  # advisory lock held while creating the tables
CONNECT_TIMEOUT_S = 15


def redact(url: str) -> str:
    """The URL without its password."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


class PostgresLedger(Ledger):
    """Ledger in the PostgreSQL database at ``url``; ``create`` makes the tables (budget init)."""

    blob_type = "BYTEA"

    def __init__(self, url: str, create: bool = False) -> None:
        super().__init__(redact(url))
        try:
            import psycopg
        except ImportError:
            raise LedgerError(
                "a postgresql:// ledger needs psycopg: pip install 'dpsub_dist[postgres]'"
            ) from None
        self._psycopg = psycopg
        try:
            self._conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as err:
            raise LedgerUnavailable(
                f"cannot connect to the ledger at {self.location} ({_first_line(err)}): check the "
                "server, the URL and the credentials, then retry"
            ) from None
        except psycopg.ProgrammingError as err:
            raise LedgerError(f"invalid ledger URL {self.location}: {_first_line(err)}") from None
        if create:
            self.create_schema()
            return
        try:
            with self._transaction(write=False) as execute:
                meta = dict(execute("SELECT key, value FROM dpsub_ledger_meta", ()))
        except LedgerError:
            self.close()
            raise LedgerError(
                f"no dpsub ledger in {self.location}: create it and grant the dataset with "
                "dpsub budget init --ledger URL --dataset URI --epsilon E --delta D"
            ) from None
        self._open_existing(meta)

    @contextlib.contextmanager
    def _transaction(self, write: bool) -> Iterator:
        psycopg = self._psycopg
        try:
            with self._conn.transaction(), self._conn.cursor() as cursor:

                def execute(sql: str, params: tuple) -> list[tuple]:
                    cursor.execute(sql.replace("?", "%s"), params)
                    return cursor.fetchall() if cursor.description else []

                if write and not self._has_schema(execute):
                    execute(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY})", ())
                yield execute
        except psycopg.OperationalError as err:
            raise LedgerUnavailable(
                f"lost the ledger at {self.location} ({_first_line(err)}): retry the run; "
                "a reserved run resumes under the same run id"
            ) from None
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as err:
            raise LedgerError(
                f"ledger {self.location} lacks the dpsub tables ({_first_line(err)}): "
                "create them with dpsub budget init"
            ) from None

    @staticmethod
    def _has_schema(execute) -> bool:
        return bool(execute("SELECT to_regclass('dpsub_ledger_meta') IS NOT NULL", ())[0][0])

    def _lock_dataset(self, execute, dataset: str) -> tuple | None:
        execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (dataset,))
        rows = execute(f"{GRANT_SELECT} WHERE dataset = ? FOR UPDATE", (dataset,))
        return rows[0] if rows else None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__
