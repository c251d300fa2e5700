"""The privacy-budget ledger, on a real SQLite file and a real PostgreSQL server.

Each test runs against both back ends (``ledger`` fixture): budget exhaustion, concurrent
reservations racing for the last budget in separate processes, idempotent re-runs,
resumption after a failure between noise and publish, corrupt or mismatched ledgers.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pg import postgres_server, postgres_url  # noqa: F401  (fixtures)

from dpsub_dist import jobfile
from dpsub_dist.cli import INSPECT_NEXT, main
from dpsub_dist.errors import BudgetRefused, InputError, RunAborted
from dpsub_dist.io.output import read_run
from dpsub_dist.jobfile import load_job, run_job
from dpsub_dist.ledger import LedgerError, RunRequest, dataset_key, open_ledger
from dpsub_dist.ledger.core import Ledger
from dpsub_dist.privacy.accountant import ZCDP, ApproxDP

DELTA = 1e-6


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request, tmp_path) -> str:
    """A ledger location: a SQLite file path, or a fresh PostgreSQL database URL."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return request.getfixturevalue("postgres_url")


def request_for(run_id: str, epsilon: float = 1.0, dataset: str = "/data/events") -> RunRequest:
    return RunRequest(dataset, "row", run_id, ApproxDP(epsilon, DELTA), "job-a", None, "/out")


def spent(location: str, dataset: str = "/data/events") -> tuple[float, float]:
    with open_ledger(location) as book:
        status = book.status(dataset)[0]
    charged = status.published.epsilon + status.reserved.epsilon + status.failed.epsilon
    assert charged == pytest.approx(status.grant.total.epsilon - status.remaining.epsilon)
    return charged, status.remaining.epsilon


# --------------------------------------------------------------------------- ledger level


def test_grant_reserve_refuse_with_remaining(ledger):
    with open_ledger(ledger, create=True) as book:
        book.grant("/data/events", "row", ApproxDP(2.5, 1e-5))
        assert book.reserve(request_for("a")).kind == "new"
        assert book.reserve(request_for("b")).kind == "new"
        with pytest.raises(BudgetRefused, match=r"only epsilon=0\.5, delta=8e-06 remains") as err:
            book.reserve(request_for("c"))
        assert err.value.exit_code == 4
        assert book.reserve(request_for("d", epsilon=0.5)).remaining.epsilon == pytest.approx(0)
        assert [r.run_id for r in book.history()] == ["a", "b", "d"]
    assert spent(ledger) == pytest.approx((2.5, 0.0))


def test_zcdp_grant_composes_rho_and_delta0(ledger):
    with open_ledger(ledger, create=True) as book:
        book.grant("/data/z", "row", ZCDP(0.3, 5e-7))
        ask = RunRequest("/data/z", "row", "r1", ZCDP(0.1, 1e-7), "job", None, "/o")
        book.reserve(ask)
        book.reserve(RunRequest("/data/z", "row", "r2", ZCDP(0.2, 1e-7), "job", None, "/o"))
        status = book.status("/data/z")[0]
        assert status.remaining.rho == pytest.approx(0.0, abs=1e-12)
        assert status.remaining.delta0 == pytest.approx(3e-7)
        assert status.report["total_as_approx_dp"]["delta"] == pytest.approx(1e-6)
        with pytest.raises(BudgetRefused):
            book.reserve(RunRequest("/data/z", "row", "r3", ZCDP(1e-3, 0), "job", None, "/o"))
        with pytest.raises(LedgerError, match="granted in zcdp but the job's budget is approx_dp"):
            book.reserve(request_for("r4", dataset="/data/z"))


def test_mismatched_unit_and_regrant_are_refused(ledger):
    with open_ledger(ledger, create=True) as book:
        book.grant("/data/events", "row", ApproxDP(1.0, 1e-5))
        assert book.grant("/data/events", "row", ApproxDP(1.0, 1e-5))[1] is False  # idempotent
        with pytest.raises(LedgerError, match="already granted"):
            book.grant("/data/events", "row", ApproxDP(5.0, 1e-5))
        with pytest.raises(LedgerError, match="granted for privacy unit row but the job uses"):
            book.reserve(
                RunRequest("/data/events", "user:uid", "u", ApproxDP(0.1, DELTA), "j", None, "/o")
            )
        with pytest.raises(LedgerError, match="no budget in ledger"):
            book.reserve(request_for("x", dataset="/data/other"))
        book.reserve(request_for("same-id", epsilon=0.1))
        other_job = RunRequest(
            "/data/events", "row", "same-id", ApproxDP(0.1, DELTA), "job-b", None, "/o"
        )
        with pytest.raises(LedgerError, match="used for a different job"):
            book.reserve(other_job)
    assert spent(ledger) == pytest.approx((0.1, 0.9))


CONTENDER = """
import sys, time
from pathlib import Path
from dpsub_dist.errors import BudgetRefused
from dpsub_dist.ledger import RunRequest, open_ledger
from dpsub_dist.privacy.accountant import ApproxDP

location, run_id, signals = sys.argv[1], sys.argv[2], Path(sys.argv[3])
with open_ledger(location) as book:
    (signals / run_id).touch()  # connected: ready
    while not (signals / "go").exists():
        time.sleep(0.005)
    ask = RunRequest("/data/events", "row", run_id, ApproxDP(0.6, 1e-6), "job-a", None, "/o")
    try:
        book.reserve(ask)
        print("won")
    except BudgetRefused:
        print("refused")
"""


def test_concurrent_processes_race_for_the_last_budget(ledger, tmp_path):
    with open_ledger(ledger, create=True) as book:
        book.grant("/data/events", "row", ApproxDP(1.0, 1e-5))
    signals = tmp_path / "signals"
    signals.mkdir()
    contenders = 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, ledger, f"run-{i}", str(signals)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(contenders)
    ]
    deadline = time.monotonic() + 120
    while len(list(signals.iterdir())) < contenders and time.monotonic() < deadline:
        time.sleep(0.01)
    (signals / "go").touch()  # all connected: release them at once
    outcomes = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert outcomes == ["refused"] * (contenders - 1) + ["won"]
    assert spent(ledger) == pytest.approx((0.6, 0.4))


def test_bad_input_on_first_attempt_returns_the_reservation(ledger):
    with open_ledger(ledger, create=True) as book:
        book.grant("/data/events", "row", ApproxDP(1.0, 1e-5))
        lease = book.reserve(request_for("bad")).lease
        assert not book.return_reservation("/data/events", "bad", "not-the-lease")
        assert book.return_reservation("/data/events", "bad", lease)
        assert book.lookup("/data/events", "bad").state == "returned"
        assert book.reserve(request_for("bad")).kind == "new"  # may be reserved again
    assert spent(ledger) == pytest.approx((1.0, 0.0))


# ------------------------------------------------------------------ corrupt and mismatched


def test_sqlite_ledger_that_is_not_sqlite_or_not_a_ledger(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database\n" * 10)
    with pytest.raises(LedgerError, match="not a SQLite database") as err:
        open_ledger(str(junk))
    assert err.value.exit_code == 2
    assert junk.read_bytes() == b"this is not a database\n" * 10
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(LedgerError, match="not a dpsub ledger"):
        open_ledger(str(other), create=True)
    with pytest.raises(LedgerError, match="no ledger at"):
        open_ledger(str(tmp_path / "missing.db"))
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(LedgerError, match="unsupported ledger scheme"):
        open_ledger("mysql://host/db")


def test_truncated_sqlite_ledger_is_refused(tmp_path):
    path = tmp_path / "ledger.db"
    with open_ledger(str(path), create=True) as book:
        book.grant("/data/events", "row", ApproxDP(1.0, 1e-5))
    blob = path.read_bytes()
    path.write_bytes(blob[:100] + b"\0" * 50 + blob[150:])
    with pytest.raises(LedgerError) as err:
        with open_ledger(str(path)) as book:
            book.reserve(request_for("r"))
    assert err.value.exit_code == 2


def _set_schema_version(location: str, version: str) -> None:
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute(
                "UPDATE dpsub_ledger_meta SET value = %s WHERE key = 'schema_version'", (version,)
            )
    else:
        with sqlite3.connect(location) as conn:
            conn.execute(
                "UPDATE dpsub_ledger_meta SET value = ? WHERE key = 'schema_version'", (version,)
            )


def test_wrong_schema_version_is_refused_and_nothing_spent(ledger, tmp_path, small_dataset):
    grant(ledger, small_dataset.path, 3.0)
    _set_schema_version(ledger, "99")
    job = write_job(tmp_path, small_dataset.path, ledger)
    code = main(["run", str(job), "--run-id", "r1", "--quiet"])
    assert code == 2
    assert not (tmp_path / "out" / "r1").exists()
    with pytest.raises(LedgerError, match="schema version '99'"):
        open_ledger(ledger)
    _set_schema_version(ledger, "1")
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((0.0, 3.0))


def test_postgres_database_without_ledger_tables(postgres_url):  # noqa: F811
    # The test server trusts loopback, so a password in the URL is accepted and ignored:
    # the error that names the database must show the URL with the password redacted.
    with_password = postgres_url.replace("@127.0.0.1", ":hunter2@127.0.0.1", 1)
    assert "hunter2" in with_password
    with pytest.raises(LedgerError, match="no dpsub ledger in") as err:
        open_ledger(with_password)
    assert err.value.exit_code == 2
    assert "hunter2" not in str(err.value) and ":***@127.0.0.1" in str(err.value)


def test_unreachable_postgres_is_a_retryable_failure():
    from dpsub_dist.ledger import LedgerUnavailable

    pytest.importorskip("psycopg")
    from pg import free_port

    with pytest.raises(LedgerUnavailable, match="cannot connect") as err:
        open_ledger(f"postgresql://u:secret@127.0.0.1:{free_port()}/x")
    assert err.value.exit_code == 1
    assert "secret" not in str(err.value)


# ---------------------------------------------------------------------- dpsub run, end to end


def write_job(tmp_path: Path, dataset: Path, ledger: str, epsilon: float = 1.0) -> Path:
    (tmp_path / "out").mkdir(exist_ok=True)
    job = tmp_path / "job.yaml"
    job.write_text(
        f"dataset: {dataset}/\n"
        "rank: 2\n"
        "method: friendly\n"
        f"budget: {{epsilon: {epsilon}, delta: 1.0e-6}}\n"
        f"output: {tmp_path}/out/{{run_id}}\n"
        f"ledger: {ledger}\n"
    )
    return job


def grant(ledger: str, dataset: Path, epsilon: float) -> None:
    code = main(
        ["budget", "init", "--ledger", ledger, "--dataset", str(dataset), "--epsilon", str(epsilon)]
        + ["--delta", "1e-5"]
    )
    assert code == 0


def test_exhaustion_idempotent_rerun_and_restore(
    ledger, tmp_path, small_dataset, dask_client, capsys
):
    grant(ledger, small_dataset.path, 2.5)
    job = load_job(write_job(tmp_path, small_dataset.path, ledger))
    first = run_job(job, "day-1", client=dask_client)
    assert (first.status, first.outcome) == ("published", "ok")
    basis_1, manifest = read_run(first.output)
    assert manifest["ledger"]["run_id"] == "day-1"
    with open_ledger(ledger) as book:
        seed = str(book.lookup(str(small_dataset.path), "day-1").noise_seed)
    assert main(["budget", "history", "--ledger", ledger, "--json"]) == 0
    assert main(["budget", "show", "--ledger", ledger]) == 0
    shown = capsys.readouterr().out
    assert "day-1" in shown and "remaining" in shown
    for text in (json.dumps(manifest), shown, Path(first.output, "manifest.json").read_text()):
        assert "noise_seed" not in text and seed not in text  # the private seed stays private
    again = run_job(job, "day-1", client=dask_client)
    assert again.status == "already_published"
    assert np.array_equal(read_run(again.output)[0], basis_1)
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((1.0, 1.5))
    run_job(job, "day-2", client=dask_client)
    with pytest.raises(BudgetRefused, match=r"only epsilon=0\.5, delta=8e-06 remains"):
        run_job(job, "day-3", client=dask_client)
    assert not (tmp_path / "out" / "day-3").exists()
    # the CLI says the same with exit code 4
    assert main(["run", job.path, "--run-id", "day-3", "--quiet"]) == 4
    assert "remains" in capsys.readouterr().err
    # a deleted output of a published run is restored from the ledger, byte for byte
    blob = (Path(first.output) / "basis.npy").read_bytes()
    for item in Path(first.output).iterdir():
        item.unlink()
    Path(first.output).rmdir()
    restored = run_job(job, "day-1", client=dask_client)
    assert restored.restored and (Path(first.output) / "basis.npy").read_bytes() == blob
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((2.0, 0.5))


def test_resume_after_failure_between_noise_and_publish(
    ledger, tmp_path, small_dataset, dask_client, monkeypatch
):
    grant(ledger, small_dataset.path, 1.5)
    job = load_job(write_job(tmp_path, small_dataset.path, ledger))
    captured = {}

    def crash(out, basis, manifest, overwrite, *rest):
        captured["basis"] = basis
        raise OSError("disk full (injected)")

    monkeypatch.setattr(jobfile, "write_run", crash)
    with pytest.raises(OSError, match="injected"):
        run_job(job, "day-1", client=dask_client)
    with open_ledger(ledger) as book:
        assert book.lookup(str(small_dataset.path), "day-1").state == "publishing"
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((1.0, 0.5))
    monkeypatch.undo()
    resumed = run_job(job, "day-1", client=dask_client)
    assert resumed.status == "resumed"
    assert np.array_equal(read_run(resumed.output)[0], captured["basis"])
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((1.0, 0.5))


def test_resume_adopts_output_written_before_a_failed_publish(
    ledger, tmp_path, small_dataset, dask_client, monkeypatch
):
    grant(ledger, small_dataset.path, 1.0)
    job = load_job(write_job(tmp_path, small_dataset.path, ledger))

    def lost(self, *args, **kwargs):
        raise ConnectionError("ledger went away (injected)")

    monkeypatch.setattr(Ledger, "publish", lost)
    with pytest.raises(ConnectionError):
        run_job(job, "day-1", client=dask_client)
    written = read_run(str(tmp_path / "out" / "day-1"))[0]
    monkeypatch.undo()
    resumed = run_job(job, "day-1", client=dask_client)
    assert resumed.status == "resumed"
    assert np.array_equal(read_run(resumed.output)[0], written)
    with open_ledger(ledger) as book:
        assert book.lookup(str(small_dataset.path), "day-1").state == "published"


def test_bad_input_after_reservation_spends_nothing(ledger, tmp_path, small_dataset, dask_client):
    grant(ledger, small_dataset.path, 1.0)
    path = write_job(tmp_path, small_dataset.path, ledger)
    path.write_text(path.read_text() + "columns: [x0, not_a_column]\n")
    with pytest.raises(InputError, match="not_a_column"):
        run_job(load_job(path), "day-1", client=dask_client)
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((0.0, 1.0))
    assert not (tmp_path / "out" / "day-1").exists()


def test_concurrent_cli_runs_exactly_one_wins(tmp_path, small_dataset, scheduler_address):
    """Two ``dpsub run`` processes on one SQLite ledger (PostgreSQL: the ledger-level race)."""
    ledger = str(tmp_path / "ledger.db")
    grant(ledger, small_dataset.path, 1.5)
    job = write_job(tmp_path, small_dataset.path, ledger)
    cmd = [sys.executable, "-m", "dpsub_dist.cli", "run", str(job), "--quiet"]
    cmd += ["--scheduler", scheduler_address]
    procs = [
        subprocess.Popen([*cmd, "--run-id", f"host-{i}"], stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    codes = sorted(p.wait(timeout=300) for p in procs)
    errors = [p.stderr.read() for p in procs]
    assert codes == [0, 4], errors
    assert any("budget refused" in e for e in errors)
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((1.0, 0.5))


# ------------------------------------------- data-dependent failures, privacy of the ledger


def nan_dataset(root: Path) -> Path:
    """Two files of 2,000 × 4 rows; column x3 of the second holds NaN in rows 5 and 77."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / "nan-data"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(2):
        data = rng.normal(size=(2000, 4))
        if i == 1:
            data[[5, 77], 3] = np.nan
        pq.write_table(pa.table({f"x{j}": data[:, j] for j in range(4)}), folder / f"p{i}.parquet")
    return folder


def ledger_text(location: str) -> bytes:
    """Everything the ledger stores: the SQLite file's bytes (with its journals), or every
    row of every dpsub table on PostgreSQL."""
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location) as conn:
            tables = ["dpsub_datasets", "dpsub_runs", "dpsub_leases", "dpsub_ledger_meta"]
            rows = [conn.execute(f"SELECT * FROM {t}").fetchall() for t in tables]
        return repr(rows).encode()
    return b"".join(p.read_bytes() for p in Path(location).parent.glob(Path(location).name + "*"))


def test_data_failure_charges_and_publishes_only_that_it_failed(
    ledger, tmp_path, scheduler_address, monkeypatch, capsys
):
    """Findings 7 and 11: NaN in the data after the reservation: exit 6, charged, and no
    count, column or position in what is published; the detail is in a 0600 file."""
    monkeypatch.setenv("DPSUB_DIAGNOSTICS_DIR", str(tmp_path / "diag"))
    data = nan_dataset(tmp_path)
    grant(ledger, data, 2.0)
    job = str(write_job(tmp_path, data, ledger))
    run = ["run", job, "--run-id", "day-1", "--quiet", "--scheduler", scheduler_address]
    capsys.readouterr()
    assert main(run) == 6
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"dpsub run: error: the run failed after reading its data ({INSPECT_NEXT}); "
    )
    path = Path(err.rsplit(" ", 1)[1])
    assert path.parent == tmp_path / "diag"
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "diag").stat().st_mode & 0o777 == 0o700
    assert "column x3 has 2 NaN or infinite values" in path.read_text()
    assert "x3" not in err and "NaN" not in err and " 2 " not in err
    assert not (tmp_path / "out" / "day-1").exists()
    assert spent(ledger, str(data)) == pytest.approx((1.0, 1.0))  # charged, not returned
    with open_ledger(ledger) as book:
        assert book.lookup(str(data), "day-1").state == "failed"
    # running the id again says the same and charges nothing more
    assert main(run) == 6
    assert "the run failed after reading its data" in capsys.readouterr().err
    assert spent(ledger, str(data)) == pytest.approx((1.0, 1.0))
    for form in ([], ["--json"]):
        assert main(["budget", "history", "--ledger", ledger, *form]) == 0
        shown = capsys.readouterr().out
        assert "failed: the run failed after reading its data" in shown
        assert "NaN" not in shown and "x3" not in shown and "has 2" not in shown
    stored = ledger_text(ledger)
    assert b"NaN" not in stored and b"x3" not in stored and b"has 2" not in stored


def test_crash_after_reservation_charges_and_publishes_only_failed(
    ledger, tmp_path, small_dataset, scheduler_address, monkeypatch, capsys
):
    """Issue 26: an unexpected error while the run computed (there: rich missing on a
    terminal) left the run 'reserved'. The data may have been read, so it is 'failed',
    charged, and what is published says only that; the traceback is the operator's."""
    monkeypatch.setenv("DPSUB_DIAGNOSTICS_DIR", str(tmp_path / "diag"))
    grant(ledger, small_dataset.path, 2.0)
    job = str(write_job(tmp_path, small_dataset.path, ledger))

    def crash(config, open_dataset, client, *rest):
        open_dataset(client)  # the data was opened: the failure may depend on it
        raise RuntimeError("private value 0.123456789 (injected)")

    monkeypatch.setattr(jobfile, "run_estimate", crash)
    run = ["run", job, "--run-id", "day-1", "--quiet", "--scheduler", scheduler_address]
    capsys.readouterr()
    assert main(run) == 6
    err = capsys.readouterr().err.strip()
    # the same words as a data error's: which of the two it was may depend on the data
    assert err.startswith(
        "dpsub run: error: the run failed after reading its data (next: dpsub inspect INPUT "
        "shows each column's missing and non-finite values); details for the operator in "
    )
    assert "0.123456789" in Path(err.rsplit(" ", 1)[1]).read_text()  # the traceback
    assert "0.123456789" not in err and "RuntimeError" not in err
    assert not (tmp_path / "out" / "day-1").exists()
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((1.0, 1.0))
    with open_ledger(ledger) as book:
        record = book.lookup(str(small_dataset.path), "day-1")
    assert record.state == "failed"
    assert record.outcome == "failed: the run failed after reading its data"
    monkeypatch.undo()  # fixed: the same id still reports the failure and charges nothing
    monkeypatch.setenv("DPSUB_DIAGNOSTICS_DIR", str(tmp_path / "diag"))
    assert main(run) == 6
    assert "error: the run failed after reading its data (" in capsys.readouterr().err
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((1.0, 1.0))
    assert main(["budget", "history", "--ledger", ledger]) == 0
    shown = capsys.readouterr().out
    assert "failed" in shown and "0.123456789" not in shown
    assert b"0.123456789" not in ledger_text(ledger)


def test_history_never_shows_error_text_of_older_ledgers(ledger):
    """Finding 11: a refund recorded with error text (as older versions did) prints a category."""
    with open_ledger(ledger, create=True) as book:
        book.grant("/data/events", "row", ApproxDP(1.0, 1e-5))
        book.return_reservation("/data/events", "r", book.reserve(request_for("r")).lease)
        book.reserve(request_for("s"))
    _set_outcome(ledger, "r", "bad input: column x0 has 3 missing values")
    with open_ledger(ledger) as book:
        views = [r.public_view() for r in book.history()]
    assert [v["outcome"] for v in views] == ["bad input: public", None]


def _set_outcome(location: str, run_id: str, outcome: str) -> None:
    sql = "UPDATE dpsub_runs SET outcome = ? WHERE run_id = ?"
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute(sql.replace("?", "%s"), (outcome, run_id))
    else:
        with sqlite3.connect(location) as conn:
            conn.execute(sql, (outcome, run_id))


def test_resumed_run_is_never_refunded(ledger):
    """A public bad-input failure refunds only a first attempt that still holds its lease."""
    with open_ledger(ledger, create=True) as book:
        book.grant("/data/events", "row", ApproxDP(1.0, 1e-5))
        first = book.reserve(request_for("r")).lease
        second = book.reserve(request_for("r"))
        assert second.kind == "resume" and second.lease != first
        assert not book.return_reservation("/data/events", "r", first)  # lease lost
        assert not book.return_reservation("/data/events", "r", second.lease)  # resumed
        assert book.lookup("/data/events", "r").state == "reserved"
    assert spent(ledger) == pytest.approx((1.0, 0.0))


def test_bad_input_on_a_resumed_run_does_not_refund(
    ledger, tmp_path, small_dataset, dask_client, monkeypatch
):
    grant(ledger, small_dataset.path, 1.5)
    job = load_job(write_job(tmp_path, small_dataset.path, ledger))

    def lost_cluster(*args, **kwargs):
        raise RunAborted("lost the Dask scheduler mid-run (injected)")

    monkeypatch.setattr(jobfile, "run_estimate", lost_cluster)
    with pytest.raises(RunAborted):
        run_job(job, "day-1", client=dask_client)

    def bad_input(*args, **kwargs):
        raise InputError("public bad input (injected)")

    monkeypatch.setattr(jobfile, "run_estimate", bad_input)
    with pytest.raises(InputError, match="injected"):
        run_job(job, "day-1", client=dask_client)
    with open_ledger(ledger) as book:
        assert book.lookup(str(small_dataset.path), "day-1").state == "reserved"
    assert spent(ledger, str(small_dataset.path)) == pytest.approx((1.0, 0.5))


def test_resume_with_input_rewritten_in_place_is_refused(
    ledger, tmp_path, small_dataset, dask_client, monkeypatch
):
    """Finding 12: same size and mtime, other content: resuming would reuse the noise seed."""
    import os
    import shutil

    data = tmp_path / "data"
    shutil.copytree(small_dataset.path, data)
    grant(ledger, data, 1.5)
    job = load_job(write_job(tmp_path, data, ledger))

    def crash(*args, **kwargs):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(jobfile, "write_run", crash)
    with pytest.raises(OSError, match="injected"):
        run_job(job, "day-1", client=dask_client)
    monkeypatch.undo()
    victim = sorted(data.glob("*.parquet"))[0]
    before = victim.stat()
    blob = bytearray(victim.read_bytes())
    blob[200:216] = bytes(reversed(blob[200:216]))  # same size, footer untouched
    victim.write_bytes(bytes(blob))
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (victim.stat().st_size, victim.stat().st_mtime_ns) == (
        before.st_size,
        before.st_mtime_ns,
    )
    with pytest.raises(LedgerError, match="changed since it first started") as err:
        run_job(job, "day-1", client=dask_client)
    assert err.value.exit_code == 2
    assert not (tmp_path / "out" / "day-1").exists()
    assert spent(ledger, str(data)) == pytest.approx((1.0, 0.5))  # the reservation stays


def test_sqlite_ledger_and_its_journals_are_private(tmp_path):
    """Finding 8: the ledger holds private noise seeds: created 0600, journals too."""
    import os

    previous = os.umask(0o022)  # a usual umask: files would be 0644
    try:
        path = tmp_path / "ledger.db"
        init = ["budget", "init", "--ledger", str(path), "--dataset", "/d", "--epsilon", "1"]
        assert main([*init, "--delta", "1e-5"]) == 0
        assert path.stat().st_mode & 0o777 == 0o600
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
        with open_ledger(str(path)) as book:
            book.reserve(request_for("r", dataset="/d"))
            wal = Path(f"{path}-wal")
            assert wal.exists() and wal.stat().st_mode & 0o777 == 0o600
        old = tmp_path / "old.db"
        with open_ledger(str(old), create=True):
            pass
        old.chmod(0o644)  # a ledger made by an older version
        open_ledger(str(old)).close()
        assert old.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(previous)


def test_aliases_of_one_dataset_share_one_grant(tmp_path, capsys, monkeypatch):
    """Finding 12: a symlink, a glob, a relative path or a file inside name the same budget."""
    data = tmp_path / "events"
    data.mkdir()
    (data / "part-0.parquet").write_bytes(b"")
    alias = tmp_path / "alias"
    alias.symlink_to(data)
    ledger = str(tmp_path / "ledger.db")
    init = ["budget", "init", "--ledger", ledger, "--epsilon", "1", "--delta", "1e-5"]
    assert main([*init, "--dataset", f"{data}/"]) == 0
    assert capsys.readouterr().out.startswith(f"granted {data} ")
    monkeypatch.chdir(tmp_path)
    for same in (str(alias), f"{data}/*.parquet", "events", f"file://{data}"):
        assert main([*init, "--dataset", same]) == 0
        assert capsys.readouterr().out.startswith(f"already granted {data} "), same
    assert main([*init, "--dataset", str(data / "part-0.parquet")]) == 2
    assert "overlaps the granted dataset" in capsys.readouterr().err
    with open_ledger(ledger) as book:
        assert book.covering_grant(dataset_key(str(alias / "part-0.parquet"))) == str(data)
        assert len(book.grants()) == 1
    assert dataset_key("s3a://bucket//events/") == "s3://bucket/events"
    assert dataset_key("S3://bucket/events/*.parquet") == "s3://bucket/events"
