"""Operator-only diagnostics: the detail of a failure that depends on private data.

When the data fails validation after it was read (NaN/inf, nulls, ragged lists), what
is *published* (exit code, stderr, ledger record) says only that it failed. The detail
(file, column, counts, row positions) is written here, to a new file readable by its
owner only (mode 0600, in a folder created 0700), and the CLI prints its path. The path
holds a time stamp and a random token, nothing taken from the data.

Folder: ``$DPSUB_DIAGNOSTICS_DIR``, else ``~/.dpsub/diagnostics``.
"""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime
from pathlib import Path

DIAGNOSTICS_ENV = "DPSUB_DIAGNOSTICS_DIR"


def diagnostics_dir() -> Path:
    """Where diagnostics files go ($DPSUB_DIAGNOSTICS_DIR or ~/.dpsub/diagnostics)."""
    configured = os.environ.get(DIAGNOSTICS_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".dpsub" / "diagnostics"


def write_diagnostics(command: str, detail: str, run_id: str | None = None) -> Path:
    """Write ``detail`` to a new owner-only file and return its path (OSError if it cannot)."""
    header = f"time: {datetime.now(UTC).isoformat()}\ncommand: dpsub {command}\n"
    if run_id:
        header += f"run id: {run_id}\n"
    return write_diagnostics_file(command, f"{header}detail: {detail}\n")


def write_diagnostics_file(command: str, text: str, suffix: str = ".txt") -> Path:
    """Write ``text`` to a new owner-only (0600) file in :func:`diagnostics_dir`; its path."""
    folder = diagnostics_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = folder / f"{stamp}-{command}-{secrets.token_hex(4)}{suffix}"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
