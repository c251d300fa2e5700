"""``dpsub run JOB --check``: one test per condition a scheduled run needs.

Each failing condition gives the exit code the real run would give (2 bad job, ledger,
dataset or output; 4 budget refused), names the fix, and writes nothing: no output
folder, no ledger, no reservation.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsub_dist.cli import main
from dpsub_dist.jobfile import load_job
from dpsub_dist.ledger import RunRequest, open_ledger
from dpsub_dist.synth import generate

RUN = "events-2024-06-01"


@pytest.fixture()
def data(small_dataset) -> Path:
    """20,000 rows × 10 features in 4 files (conftest): enough to publish a basis."""
    return Path(small_dataset.path)


def job_file(tmp_path: Path, data: Path, **fields: str) -> Path:
    """A job on ``data`` with a ledger and an output folder under ``tmp_path``."""
    values = {
        "dataset": str(data),
        "rank": "2",
        "budget": "{epsilon: 1.0, delta: 1.0e-6}",
        "output": str(tmp_path / "results" / "{run_id}"),
        "ledger": str(tmp_path / "ledger.db"),
        "workers": "1",
    }
    values.update(fields)
    path = tmp_path / "events.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    return path


def grant(tmp_path: Path, data: Path, epsilon: str = "3", *extra: str) -> None:
    ledger = str(tmp_path / "ledger.db")
    args = ["--ledger", ledger, "--dataset", str(data), "--epsilon", epsilon, "--delta", "1e-5"]
    assert main(["budget", "init", *args, *extra]) == 0


def check(job: Path, capsys, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["run", str(job), "--check", "--run-id", RUN, *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def failed(output: str, name: str) -> str:
    """The line of the failed check ``name``."""
    lines = [line for line in output.splitlines() if line.split()[:2] == ["FAILED", name]]
    assert len(lines) == 1, output
    return lines[0]


def ledger_runs(tmp_path: Path, capsys) -> str:
    capsys.readouterr()
    assert main(["budget", "history", "--ledger", str(tmp_path / "ledger.db"), "--json"]) == 0
    return capsys.readouterr().out.strip()


def test_ready_job_reports_budget_and_writes_nothing(tmp_path, data, capsys):
    (tmp_path / "results").mkdir()
    grant(tmp_path, data)
    code, out = check(job_file(tmp_path, data), capsys)
    assert code == 0, out
    assert "FAILED" not in out
    assert "epsilon=3, delta=1e-05 remaining" in out  # what is left of the grant
    assert "the run charges epsilon=1, delta=1e-06" in out
    assert "4 Parquet files, footers readable, 10 features" in out
    assert list((tmp_path / "results").iterdir()) == []  # no output folder made
    assert ledger_runs(tmp_path, capsys) == "[]"  # nothing reserved


def test_invalid_job_file_is_exit_2(tmp_path, data, capsys):
    code, out = check(job_file(tmp_path, data, rank="-1"), capsys)
    assert code == 2 and "rank must be a positive integer" in out


def test_missing_ledger_is_refused(tmp_path, data, capsys):
    (tmp_path / "results").mkdir()
    code, out = check(job_file(tmp_path, data), capsys)
    assert code == 2, out
    assert "no ledger at" in failed(out, "ledger")
    assert not (tmp_path / "ledger.db").exists()  # --check does not create it


def test_unreachable_ledger_server_is_exit_1_without_its_password(tmp_path, data, capsys):
    (tmp_path / "results").mkdir()
    server = "postgresql://dpsub:s3cret-pw@127.0.0.1:1/ledger"  # nothing listens on port 1
    code, out = check(job_file(tmp_path, data), capsys, "--ledger", server)
    assert code == 1, out  # transient: a scheduler retries
    assert "cannot connect to the ledger" in failed(out, "ledger")
    assert "s3cret-pw" not in out


def test_dataset_not_granted_is_refused(tmp_path, data, capsys):
    (tmp_path / "results").mkdir()
    grant(tmp_path, data)
    other = tmp_path / "other"
    generate(other, rows=500, dim=10, rank=2, partitions=1, seed=4)
    code, out = check(job_file(tmp_path, data, dataset=str(other)), capsys)
    assert code == 2, out
    assert "has no grant" in failed(out, "ledger")


def test_grant_for_another_unit_is_refused(tmp_path, data, capsys):
    (tmp_path / "results").mkdir()
    grant(tmp_path, data, "3", "--unit-column", "user_id")
    code, out = check(job_file(tmp_path, data), capsys)
    assert code == 2, out
    assert "granted for privacy unit" in failed(out, "ledger")


def test_budget_that_cannot_cover_the_run_is_exit_4(tmp_path, data, capsys):
    (tmp_path / "results").mkdir()
    grant(tmp_path, data, "0.5")
    code, out = check(job_file(tmp_path, data), capsys)
    assert code == 4, out
    line = failed(out, "budget")
    assert "would be refused" in line and "epsilon=0.5, delta=1e-05 remains" in line


def test_missing_dataset_path_is_refused(tmp_path, data, capsys):
    (tmp_path / "results").mkdir()
    gone = tmp_path / "gone"
    grant(tmp_path, gone)
    code, out = check(job_file(tmp_path, gone), capsys)
    assert code == 2, out
    assert "input path not found" in failed(out, "dataset")


def test_unreadable_footer_is_refused(tmp_path, data, capsys):
    (tmp_path / "results").mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    pq.write_table(pa.table({f"x{i}": [1.0, 2.0] for i in range(10)}), broken / "a.parquet")
    (broken / "b.parquet").write_bytes(b"PAR1 not a footer")
    grant(tmp_path, broken)
    code, out = check(job_file(tmp_path, broken), capsys)
    assert code == 2, out
    assert "b.parquet: not a readable Parquet file" in failed(out, "dataset")


def test_missing_column_is_refused(tmp_path, data, capsys):
    (tmp_path / "results").mkdir()
    grant(tmp_path, data)
    code, out = check(job_file(tmp_path, data, columns="[x0, x1, nope]"), capsys)
    assert code == 2, out
    assert "columns not found: ['nope']" in failed(out, "dataset")


def test_output_parent_missing_is_refused_and_not_created(tmp_path, data, capsys):
    """Today's bug: --check said valid, and the real run failed on the missing parent."""
    grant(tmp_path, data)
    code, out = check(job_file(tmp_path, data), capsys)
    assert code == 2, out
    line = failed(out, "output")
    assert "does not exist" in line and f"mkdir -p {tmp_path / 'results'}" in line
    assert not (tmp_path / "results").exists()
    assert main(["run", str(job_file(tmp_path, data)), "--run-id", RUN, "--quiet"]) == 2
    (tmp_path / "results").mkdir()  # the fix the message names makes both pass
    assert check(job_file(tmp_path, data), capsys)[0] == 0


def test_existing_output_is_refused_but_a_published_run_id_is_ready(tmp_path, data, capsys):
    (tmp_path / "results" / RUN).mkdir(parents=True)
    grant(tmp_path, data)
    job = job_file(tmp_path, data)
    code, out = check(job, capsys)
    assert code == 2 and "output folder already exists" in failed(out, "output")
    (tmp_path / "results" / RUN).rmdir()
    assert main(["run", str(job), "--run-id", RUN, "--quiet"]) == 0
    code, out = check(job, capsys)
    assert code == 0, out
    assert f"run {RUN} is already published: a re-run charges nothing" in out


def test_reserved_run_id_needs_no_more_budget_but_still_its_output_parent(
    tmp_path, data, capsys
):
    """A run id reserved by an interrupted run resumes without a new charge."""
    grant(tmp_path, data, "1")  # exactly one run's budget, all of it reserved below
    job = job_file(tmp_path, data)
    loaded = load_job(job)
    request = RunRequest(
        loaded.dataset_key,
        loaded.unit,
        RUN,
        loaded.config().budget(),
        loaded.fingerprint(),
        None,
        loaded.output_for(RUN),
    )
    with open_ledger(str(tmp_path / "ledger.db")) as book:
        assert book.reserve(request).kind == "new"
    code, out = check(job, capsys)
    assert code == 2, out  # the output parent is missing: the resume would fail too
    assert f"run {RUN} is reserved: a re-run resumes it and charges nothing more" in out
    assert "does not exist" in failed(out, "output")
    (tmp_path / "results").mkdir()
    assert check(job, capsys)[0] == 0
    assert check(job, capsys, "--run-id", "events-2024-06-02")[0] == 4  # a new id: no budget


def test_budget_init_help_describes_the_total_grant(capsys):
    with pytest.raises(SystemExit):
        main(["budget", "init", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "for the whole run" not in text
    assert "the dataset's total grant" in text
