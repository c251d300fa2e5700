"""Operator-only diagnostics: the detail of a failure that depends on private data.

When the data fails validation after it was read (NaN/inf, nulls, ragged lists), what
is *published* (exit code, stderr, ledger record) says only that it failed. The detail
(file, column, counts, row positions) is written here, to a new file readable by its
owner only (mode 0600, in a folder created 0700), and the CLI prints its path. The name
holds the command and a random token: nothing taken from the data, and no time (with the
published ``reserved_at`` a failure's time would give the run's duration).

From the first private read on, a command runs in :func:`private_phase`: an unexpected
exception becomes :class:`~dpsub_dist.errors.RunFailed` (its traceback is the operator's
detail, the CLI publishes the generic "failed" line, exit 6), and every warning (NumPy's
"overflow encountered", a library's) goes to a diagnostics file instead of stderr: whether
a warning appears, and its text, can depend on the data. The local Dask clusters dpsub
starts route their workers' warnings the same way (:func:`route_warnings`).

A finished run's step timings (also data-dependent) are kept here too, in
``run-<hash of the run's location>.json``, for ``dpsub report RUN --operator``.

Folder: ``$DPSUB_DIAGNOSTICS_DIR``, else ``~/.dpsub/diagnostics``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    """Write ``text`` to a new owner-only (0600) file in :func:`diagnostics_dir`; its path.
    The name is the command and a random token (no time: see the module's docstring)."""
    name = f"{command.replace(' ', '-')}-{secrets.token_hex(8)}{suffix}"
    return _write_owner_only(name, text)


def _write_owner_only(name: str, text: str, folder: Path | None = None) -> Path:
    """Create ``name`` (0600) in the diagnostics folder (made 0700) and write ``text``."""
    folder = diagnostics_dir() if folder is None else folder
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / name
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def _run_file_name(run: str) -> str:
    """``run-<hash>.json``: named by the run's location (absolute path or URL), not its data."""
    from dpsub_dist.io.storage import is_local

    where = run.rstrip("/")
    if is_local(run):
        where = str(Path(run.removeprefix("file://")).expanduser().resolve())
    return f"run-{hashlib.sha256(where.encode()).hexdigest()[:16]}.json"


def _plain(value: Any) -> Any:
    """A numpy value as a Python one (anything else as text), for JSON."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


def _manifest_digest(manifest: Mapping[str, Any]) -> str:
    """Which release the diagnostics belong to: its manifest less the written files' checksums."""
    released = {key: value for key, value in manifest.items() if key != "outputs"}
    text = json.dumps(released, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()


def write_run_diagnostics(
    run: str, manifest: Mapping[str, Any], timings: Mapping[str, Any]
) -> Path:
    """Keep a run's timings, replacing those of an earlier run at ``run`` (OSError if it cannot)."""
    record = {"manifest_sha256": _manifest_digest(manifest), "timings": timings}
    text = json.dumps(record, indent=2, default=_plain)
    name = _run_file_name(run)
    written = _write_owner_only(f".{name}.tmp-{secrets.token_hex(4)}", text)
    return written.replace(written.with_name(name))


def keep_run_timings(run: str, manifest: Mapping[str, Any], timings: Mapping[str, Any]) -> None:
    """:func:`write_run_diagnostics` once the release is written: a diagnostics folder that
    cannot be written costs the operator the timings, not the run (a line on stderr)."""
    try:
        write_run_diagnostics(run, manifest, timings)
    except OSError as err:
        print(
            f"timings not kept: the diagnostics folder cannot be written ({type(err).__name__}); "
            f"set {DIAGNOSTICS_ENV} to a writable folder",
            file=sys.stderr,
        )


def read_run_diagnostics(run: str, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The timings kept for the release ``manifest`` at ``run``; None if none were kept for it."""
    try:
        record = json.loads((diagnostics_dir() / _run_file_name(run)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    same_release = record.get("manifest_sha256") == _manifest_digest(manifest)
    return record.get("timings") if same_release else None


class _WarningsFile:
    """Warnings shown while installed go to one owner-only diagnostics file, opened at the
    first, never to stderr (``warnings.showwarning`` for this process, every thread)."""

    def __init__(self, command: str, folder: Path | None = None) -> None:
        self.command, self.folder = command, folder
        self.path: Path | None = None
        self._lock = threading.Lock()

    def show(self, message, category, filename, lineno, file=None, line=None) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line)
        with self._lock:
            try:
                if self.path is None:
                    name = f"{self.command}-warnings-{secrets.token_hex(8)}.txt"
                    self.path = _write_owner_only(name, text, self.folder)
                else:
                    with self.path.open("a", encoding="utf-8") as handle:
                        handle.write(text)
            except OSError:
                pass  # never to stderr: the detail is lost, not published

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        shown = warnings.showwarning
        warnings.showwarning = self.show
        try:
            yield
        finally:
            warnings.showwarning = shown


@contextlib.contextmanager
def private_phase(command: str) -> Iterator[None]:
    """The block reads private rows: its warnings go to a diagnostics file, and an exception
    that is not a :class:`~dpsub_dist.errors.DpsubError` (a bug, an overflow, a library's
    error) is raised as :class:`~dpsub_dist.errors.RunFailed` carrying its traceback, which
    callers charge as a data failure and the CLI publishes as "failed" (exit 6)."""
    from dpsub_dist.errors import DpsubError, RunFailed

    with _WarningsFile(command).installed():
        try:
            yield
        except DpsubError:
            raise
        except Exception as err:
            raise RunFailed(traceback.format_exc()) from err


def route_warnings(command: str) -> None:
    """From now on, this process's warnings go to a diagnostics file (a Dask worker of a
    local cluster dpsub started: :mod:`dpsub_dist.engine.worker_setup`)."""
    warnings.showwarning = _WarningsFile(command).show
