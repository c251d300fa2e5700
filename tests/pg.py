"""A throwaway PostgreSQL cluster on 127.0.0.1 for the ledger tests (initdb + pg_ctl).

The server binaries come from the system (``.ci/setup-postgres.sh`` installs Debian's
``postgresql`` package). PostgreSQL refuses to run as root, so as root the cluster is
created and run as the ``postgres`` user (``runuser``). The cluster lives in a temporary
folder, listens on a free loopback port with trust authentication, and is stopped and
deleted when the session ends. When no server can be started the tests skip with the
reason, and that skip fails the session (tests/conftest.py ALLOWED_SKIPS does not list it).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

SUPERUSER = "dpsub"


def find_bin_dir() -> Path | None:
    """Folder holding initdb and pg_ctl (PATH first, then Debian's versioned folders)."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(os.path.realpath(initdb)).parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """initdb + pg_ctl start in a temp folder; ``url(db)`` for psycopg; ``stop()``."""

    def __init__(self) -> None:
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise RuntimeError("no initdb/pg_ctl found: run .ci/setup-postgres.sh (needs apt)")
        self.bin_dir = bin_dir
        self.run_as: list[str] = []
        self.root = Path(tempfile.mkdtemp(prefix="dpsub-pg-"))
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root and there is no postgres user") from None
            if shutil.which("runuser") is None:
                raise RuntimeError("running as root without runuser to drop to postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.run_as = ["runuser", "-u", "postgres", "--"]
        self.data = self.root / "data"
        self.port = free_port()
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "--no-sync")
        options = f"-k {self.root} -h 127.0.0.1 -p {self.port} -F -c max_connections=60"
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w",
            "-t", "60", "start",
        )  # fmt: skip

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self.run_as, str(self.bin_dir / tool), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.root / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{tool} failed: {done.stderr.strip()[-2000:]} {tail}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """A running PostgreSQL server for the session, or a skip with the reason."""
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[dev]')")
    try:
        server = PostgresServer()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        pytest.skip(f"cannot start a PostgreSQL server on 127.0.0.1: {err}")
    yield server
    server.stop()


@pytest.fixture()
def postgres_url(postgres_server) -> str:
    """URL of a fresh database on the session's server."""
    return postgres_server.new_database()
