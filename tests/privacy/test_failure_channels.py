"""What a run publishes beside its release: errors, warnings, file names and file times
(privacy review 4, issue #41).

Each test runs ``dpsub`` in a fresh process as a user does and compares what an observer
of the published streams sees: an unexpected error after the rows were read is the generic
"failed" line and exit 6, charged; a warning only some data raises never reaches stderr;
re-appending a stream batch does not compare the files' bytes; diagnostics files carry no
time and a ledger run's files are dated at its published ``reserved_at``.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dpsub_shim import failing_dpsub, write_job  # noqa: E402

from dpsub_dist.cli import INSPECT_NEXT  # noqa: E402

BUDGET = ["--epsilon", "4", "--delta", "1e-6"]
FAILED = re.compile(
    r"dpsub (estimate|cluster|run|stream): error: the run failed after reading its data "
    rf"\({re.escape(INSPECT_NEXT)}\); details for the operator in (\S+)"
)


def _dpsub(tmp: Path, *args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """``dpsub ARGS`` in a fresh process (``prefix``: another dpsub, e.g. a failing one)."""
    command = [*(prefix or [sys.executable, "-m", "dpsub_dist.cli"]), *args]
    env = {**os.environ, "DPSUB_DIAGNOSTICS_DIR": str(tmp / "diagnostics")}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp, env=env)


def _table(path: Path, rows: np.ndarray, users: np.ndarray | None = None) -> Path:
    frame = pd.DataFrame(rows, columns=[f"x{i}" for i in range(rows.shape[1])])
    if users is not None:
        frame["user"] = users
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False)
    return path


def _rows(seed: int, n: int = 3_000, dim: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 2)) @ rng.standard_normal((2, dim)) + 0.1 * rng.standard_normal(
        (n, dim)
    )


# --------------------------------------------------------------- an error after the first read


def _ledger_charged(ledger: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(ledger) as db:
        return db.execute("SELECT run_id, state FROM dpsub_runs").fetchall()


def _stream_step(tmp: Path, state: Path) -> dict:
    shown = _dpsub(tmp, "stream", "show", str(state), "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


@pytest.mark.parametrize("command", ["estimate", "cluster", "run", "stream append"])
def test_an_error_after_the_first_read_is_published_as_failed_and_charged(
    command: str, tmp_path: Path
) -> None:
    """A bug that only some data hits, raised after the rows were read, publishes one
    generic line and exit 6 (no traceback, no step, no value); the detail is in the
    operator's diagnostics file, named by a random token (no time); a ledger run is
    'failed' and a stream takes the step, both charged."""
    data = _table(tmp_path / "data" / "part-0.parquet", _rows(1))
    out = tmp_path / "out"
    if command == "run":
        ledger = tmp_path / "ledger.db"
        grant = ["budget", "init", "--ledger", str(ledger), "--dataset", str(data.parent)]
        assert _dpsub(tmp_path, *grant, "--epsilon", "10", "--delta", "1e-5").returncode == 0
        job = write_job(tmp_path / "job.yaml", data.parent, ledger, tmp_path / "results")
        run = ["run", str(job), "--run-id", "r1", "--quiet"]
        done = _dpsub(tmp_path, *run, prefix=failing_dpsub())
    elif command == "stream append":
        state = tmp_path / "s.stream"
        init = ["stream", "init", str(state), "--horizon", "2", "--rank", "2", "--rho", "1"]
        assert _dpsub(tmp_path, *init, "--delta", "1e-6", "--clip-norm", "5").returncode == 0
        append = ["stream", "append", str(state), str(data), "--quiet"]
        done = _dpsub(tmp_path, *append, prefix=failing_dpsub())
    else:
        extra = ["--clusters", "2"] if command == "cluster" else []
        args = [command, str(data.parent), "--rank", "2", *BUDGET, *extra, "--out", str(out)]
        done = _dpsub(tmp_path, *args, "--quiet", prefix=failing_dpsub())
    assert done.returncode == 6, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and FAILED.fullmatch(lines[0]), done.stderr
    detail = Path(FAILED.fullmatch(lines[0]).group(2))
    assert re.fullmatch(r"[a-z]+-[0-9a-f]{16}\.txt", detail.name), detail.name
    assert "Traceback" in detail.read_text() and "planted bug at step" in detail.read_text()
    assert not out.exists()
    if command == "run":
        assert _ledger_charged(ledger) == [("r1", "failed")]
    if command == "stream append":
        status = _stream_step(tmp_path, state)
        assert status["step"] == 1 and status["budget"]["spent"]["rho"] > 0, status


# ------------------------------------------------------------------ a warning is one bit


def _neighbours(tmp: Path, users: bool, entries: float | None) -> tuple[Path, Path]:
    """Two tables that differ in one row (one user's at user level): a huge row (norm 1e200,
    whose square overflows float64, or every entry ``entries``), and that row replaced by
    an ordinary one (n equal: public at row level)."""
    rows = _rows(2)
    ids = np.repeat(np.arange(len(rows) // 3), 3) if users else None
    huge = rows.copy()
    huge[5] = entries if entries else 1e200 / np.sqrt(rows.shape[1])
    return (
        _table(tmp / "plain" / "part-0.parquet", rows, ids).parent,
        _table(tmp / "huge" / "part-0.parquet", huge, ids).parent,
    )


RUN_INDEPENDENT = re.compile(r"dashboard \S+|details for the operator in \S+")
"""Text of stderr that changes from run to run whatever the data (a port, a token)."""


@pytest.mark.parametrize(
    ("flags", "where", "entries"),
    [
        (["--row-norm", "5"], ["--scheduler", "in-process"], None),
        ([], ["--scheduler", "local-cluster", "--workers", "1"], None),  # the private bound
        (["--unit-column", "user"], ["--workers", "1"], None),  # user level: a local cluster
        ([], ["--scheduler", "in-process"], 1e308),  # norm inf: XV overflowed, then NaN
    ],
    ids=["row-norm in process", "private bound on a local cluster", "user level", "1e308"],
)
def test_a_huge_row_changes_nothing_on_stderr(flags, where, entries, tmp_path) -> None:
    """power on neighbours with and without a huge row: the same exit code and the same
    stderr (less ports and tokens), in process and on the local cluster's workers; any
    warning is in the operator's diagnostics file instead. (Rows of entries 1e308 made
    power fail: exit 6 against its neighbour's 0.)"""
    seen = []
    for data in _neighbours(tmp_path, "--unit-column" in flags, entries):
        out = tmp_path / f"out-{data.name}"
        args = ["estimate", str(data), "--rank", "2", *BUDGET, "--method", "power", *flags]
        done = _dpsub(tmp_path, *args, *where, "--quiet", "--out", str(out))
        seen.append((done.returncode, RUN_INDEPENDENT.sub("…", done.stderr)))
    assert seen[0] == seen[1], seen
    assert "Warning" not in seen[1][1]


# ------------------------------------------------------------ re-appending a stream batch


def test_re_appending_a_batch_id_does_not_compare_the_files_bytes(tmp_path: Path) -> None:
    """A batch id appended again from the same path: the same published outcome whether the
    file there is the one appended or a guess (other rows); from another path, refused."""
    state = tmp_path / "s.stream"
    init = ["stream", "init", str(state), "--horizon", "3", "--rank", "2", "--rho", "1"]
    assert _dpsub(tmp_path, *init, "--delta", "1e-6", "--clip-norm", "5").returncode == 0
    batch = _table(tmp_path / "batch.parquet", _rows(3))
    append = ["stream", "append", str(state), str(batch), "--batch-id", "b1"]
    assert _dpsub(tmp_path, *append).returncode == 0
    right = _dpsub(tmp_path, *append)
    _table(batch, _rows(4))  # a wrong guess, at the same path
    wrong = _dpsub(tmp_path, *append)
    published = [(d.returncode, d.stdout, d.stderr) for d in (right, wrong)]
    assert published[0] == published[1], published
    assert right.returncode == 0 and "already appended; re-released" in right.stdout
    other = _table(tmp_path / "other.parquet", _rows(3))
    moved = _dpsub(tmp_path, "stream", "append", str(state), str(other), "--batch-id", "b1")
    assert moved.returncode == 2 and "from other files" in moved.stderr, moved.stderr
    assert _stream_step(tmp_path, state)["step"] == 1


# ----------------------------------------------------------------------- times of outputs


def test_a_ledger_runs_files_are_dated_at_its_reserved_at(tmp_path: Path) -> None:
    """A published run's folder and files carry its ``reserved_at`` as their times, not the
    time it finished (with ``reserved_at``, that would publish the run's duration)."""
    data = _table(tmp_path / "data" / "part-0.parquet", _rows(5))
    ledger = tmp_path / "ledger.db"
    grant = ["budget", "init", "--ledger", str(ledger), "--dataset", str(data.parent)]
    assert _dpsub(tmp_path, *grant, "--epsilon", "10", "--delta", "1e-5").returncode == 0
    job = write_job(tmp_path / "job.yaml", data.parent, ledger, tmp_path / "results")
    done = _dpsub(tmp_path, "run", str(job), "--run-id", "r1")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "results" / "r1"
    manifest = json.loads((out / "manifest.json").read_text())
    reserved = datetime.fromisoformat(manifest["ledger"]["reserved_at"]).timestamp()
    for path in [out, *out.iterdir()]:
        assert path.stat().st_mtime == reserved, path


# ------------------------------------------------------ the local cluster: warnings, address

WARN_ON_A_WORKER = """
import warnings
from dpsub_dist.diagnostics import private_phase
from dpsub_dist.engine.cluster import dask_client

def task():
    warnings.warn("row 17 held 3.25", RuntimeWarning)
    return 1

with private_phase("estimate"), dask_client(None, quiet=True, workers=1) as client:
    assert client.submit(task, pure=False).result() == 1
    warnings.warn("the driver saw row 18", RuntimeWarning)
    print(client.scheduler.address, client.dashboard_link)
    print(*client.scheduler_info()["workers"])
"""


def test_the_local_cluster_listens_on_localhost_and_routes_warnings(tmp_path: Path) -> None:
    """The scheduler, dashboard and workers dpsub starts bind 127.0.0.1 (they have no
    authentication: docs/privacy.md), and a warning raised on a worker or the driver after
    the first read goes to the diagnostics file, not to the stderr they share."""
    done = _dpsub(tmp_path, prefix=[sys.executable, "-c", WARN_ON_A_WORKER])
    assert done.returncode == 0, done.stderr
    assert "row 1" not in done.stderr and "Warning" not in done.stderr, done.stderr
    addresses = done.stdout.split()
    assert addresses and all(re.match(r"(tcp|http)://127\.0\.0\.1:", a) for a in addresses)
    kept = "".join(p.read_text() for p in (tmp_path / "diagnostics").glob("*warnings-*.txt"))
    assert "row 17 held 3.25" in kept and "the driver saw row 18" in kept, kept
