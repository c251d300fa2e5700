"""The ledger in an embedded SQLite file (the default): one file, no server.

Writers serialise on SQLite's database lock: every write transaction starts with
``BEGIN IMMEDIATE``, so a reservation's read-check-insert cannot interleave with
another's. Keep the file on a local disk (SQLite locking over NFS is unreliable);
use PostgreSQL when runs on several hosts share a ledger.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from dpsub_dist.ledger.core import GRANT_SELECT, Ledger, LedgerError, translate_errors

SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 120.0


def connect_sqlite(
    path: str, create: bool, meta_table: str, kind: str, missing: str, role: str
) -> tuple[sqlite3.Connection, bool]:
    """Open a dpsub SQLite file whose schema has ``meta_table``; (connection, needs_schema).

    ``missing`` is the error when the file is absent (unless ``create``). Refuses a file
    that is not SQLite, and a database without ``meta_table`` unless it is new and empty
    (then ``needs_schema``); ``kind`` names what was expected and ``role`` which file to
    pass instead. The connection is in autocommit mode: callers open transactions
    explicitly (:func:`sqlite_transaction`).
    """
    file = Path(path).expanduser()
    if not file.exists() and not create:
        raise LedgerError(missing)
    if file.is_dir():
        raise LedgerError(f"{path} is a folder, not a file: {role}")
    if not file.parent.is_dir():
        raise LedgerError(f"parent folder of {path} does not exist: create it first")
    if file.exists() and file.stat().st_size > 0:
        with open(file, "rb") as handle:
            if handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                raise LedgerError(f"{path} is not a SQLite database: {role}")
    if not file.exists():
        private_file(file)
    conn = sqlite3.connect(str(file), timeout=BUSY_TIMEOUT_S, isolation_level=None)
    with translate_errors(path, sqlite3.DatabaseError):
        listing = conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        tables = {row[0] for row in listing}
    if (tables and meta_table not in tables) or (not tables and not create):
        conn.close()
        raise LedgerError(f"{path} is a SQLite database but not {kind}: {role}")
    private_file(file)  # ours: narrow a ledger made before files were created 0600
    return conn, meta_table not in tables


def private_file(file: Path) -> None:
    """Create ``file`` with mode 0600, or narrow an existing one we own to 0600.

    The ledger holds each run's private noise seed. SQLite creates its -journal and -wal
    files with the database file's mode, so they are owner-only too.
    """
    try:
        os.close(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        info = file.stat()
        if info.st_uid == os.getuid() and info.st_mode & 0o077:
            os.chmod(file, 0o600)


@contextlib.contextmanager
def sqlite_transaction(conn: sqlite3.Connection, location: str, write: bool) -> Iterator:
    """One transaction yielding ``execute(sql, params) -> rows``; writers lock up front."""
    with translate_errors(location, sqlite3.DatabaseError):
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")

        def execute(sql: str, params: tuple = ()) -> list[tuple]:
            return conn.execute(sql, params).fetchall()

        try:
            yield execute
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


class SQLiteLedger(Ledger):
    """Ledger in a SQLite file at ``path``; ``create`` makes a new one (budget init)."""

    def __init__(self, path: str, create: bool = False) -> None:
        super().__init__(path)
        self._conn, new = connect_sqlite(
            path,
            create,
            meta_table="dpsub_ledger_meta",
            kind="a dpsub ledger",
            missing=(
                f"no ledger at {path}: create it and grant the dataset with "
                "dpsub budget init --ledger PATH --dataset URI --epsilon E --delta D"
            ),
            role="point --ledger at the file made by dpsub budget init (or a postgresql:// URL)",
        )
        with translate_errors(path, sqlite3.DatabaseError):
            self._conn.execute("PRAGMA foreign_keys = ON")
            if new:
                self.create_schema()
            else:
                meta = self._conn.execute("SELECT key, value FROM dpsub_ledger_meta")
                self._open_existing(dict(meta))

    def _transaction(self, write: bool) -> contextlib.AbstractContextManager:
        return sqlite_transaction(self._conn, self.location, write)

    def _lock_dataset(self, execute, dataset: str) -> tuple | None:
        # BEGIN IMMEDIATE already holds the database's write lock.
        rows = execute(f"{GRANT_SELECT} WHERE dataset = ?", (dataset,))
        return rows[0] if rows else None
