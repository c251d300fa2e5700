"""``dpsub run JOB --check``: one test per condition a scheduled run needs.

Each failing condition gives the exit code the real run would give (2 bad job, ledger,
dataset or output; 4 budget refused), names the fix, and writes nothing: no output
folder, no ledger, no reservation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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
    plan = next(line for line in out.splitlines() if line.split()[:2] == ["ok", "plan"])
    steps = dict(step.split(": ", 1) for step in plan.split(None, 2)[2].split("; "))
    assert list(steps) == ["norm_bound", "mean", "centred_norm_bound", "gram_noise"], plan
    assert steps["gram_noise"].startswith("epsilon=0.7"), plan  # the run's own shares
    assert list((tmp_path / "results").iterdir()) == []  # no output folder made
    assert ledger_runs(tmp_path, capsys) == "[]"  # nothing reserved


def test_each_footer_is_read_once(tmp_path, data, capsys, monkeypatch):
    """The dataset and plan checks share one read of the footers (a round trip per file on
    object storage), where each used to list the files and read every footer again."""
    from dpsub_dist import preflight
    from dpsub_dist.engine import sources
    from dpsub_dist.io import parquet

    read: list[str] = []
    inspect_file = parquet.inspect_file

    def counted(path, *args, **kwargs):
        read.append(path)
        return inspect_file(path, *args, **kwargs)

    for module in (parquet, sources, preflight):  # wherever a reader could be bound
        monkeypatch.setattr(module, "inspect_file", counted, raising=False)
    grant(tmp_path, data)
    code, out = check(job_file(tmp_path, data), capsys)
    assert code == 0, out
    assert "ok  plan" in out
    assert len(read) == 4 and len(set(read)) == 4, read  # 4 files, one read each


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


def test_exclude_columns_are_applied_as_the_run_applies_them(tmp_path, data, capsys):
    """Today's bug: --check counted the features without the job's exclude_columns."""
    (tmp_path / "results").mkdir()
    grant(tmp_path, data)
    code, out = check(job_file(tmp_path, data, exclude_columns="[x0, 'x1*']"), capsys)
    assert code == 0, out
    assert "footers readable, 8 features\n" in out  # x0 and x1 were named: not "left out"
    code, out = check(job_file(tmp_path, data, exclude_columns="[nosuch]"), capsys)
    assert code == 2, out
    assert "pattern 'nosuch' matches no column" in failed(out, "dataset")


def test_check_names_the_columns_the_run_leaves_out(tmp_path, capsys):
    """The identifiers and stored index a run leaves out, named before it runs (schema)."""
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame(np.random.default_rng(0).standard_normal((500, 3)), columns=list("abc"))
    frame["user_id"] = np.arange(500)
    table = tmp_path / "ids.parquet"
    frame[frame["a"] > 0].to_parquet(table)  # a filtered frame: stores __index_level_0__
    (tmp_path / "results").mkdir()
    grant(tmp_path, table)
    code, out = check(job_file(tmp_path, table), capsys)
    assert code == 0, out
    assert "3 features (left out: user_id (identifier), __index_level_0__ (index))" in out


def test_missing_output_parent_passes_the_check_and_the_run_creates_it(
    tmp_path, data, capsys, scheduler_address
):
    """The job-file pattern ``output: results/{run_id}`` with no results/ yet: --check and
    the run agree (on main the check and the run both refused it)."""
    grant(tmp_path, data)
    job = job_file(tmp_path, data)
    code, out = check(job, capsys)
    assert code == 0, out
    assert not (tmp_path / "results").exists()  # --check creates nothing
    run = ["run", str(job), "--run-id", RUN, "--scheduler", scheduler_address, "--quiet"]
    assert main(run) == 0
    assert (tmp_path / "results" / RUN / "manifest.json").is_file()


def test_output_under_a_file_is_refused_by_the_check_and_the_run(tmp_path, data, capsys):
    (tmp_path / "results").write_text("not a folder")
    grant(tmp_path, data)
    job = job_file(tmp_path, data, output=str(tmp_path / "results" / "daily" / "{run_id}"))
    code, out = check(job, capsys)
    assert code == 2, out
    assert f"{tmp_path / 'results'} is a file" in failed(out, "output")
    assert main(["run", str(job), "--run-id", RUN, "--quiet"]) == 2
    assert ledger_runs(tmp_path, capsys) == "[]"  # refused before anything was reserved


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


def test_reserved_run_id_needs_no_more_budget_but_still_its_output_parent(tmp_path, data, capsys):
    """A run id reserved by an interrupted run resumes without a new charge."""
    grant(tmp_path, data, "1")  # exactly one run's budget, all of it reserved below
    (tmp_path / "results").write_text("a file where the output's parent should be")
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
    assert code == 2, out  # the output's parent is a file: the resume would fail too
    assert f"run {RUN} is reserved: a re-run resumes it and charges nothing more" in out
    assert "is a file" in failed(out, "output")
    (tmp_path / "results").unlink()
    assert check(job, capsys)[0] == 0
    assert check(job, capsys, "--run-id", "events-2024-06-02")[0] == 4  # a new id: no budget


def test_budget_init_help_describes_the_total_grant(capsys):
    with pytest.raises(SystemExit):
        main(["budget", "init", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "for the whole run" not in text
    assert "the dataset's total grant" in text


def list_folder(root: Path, first_row: list[float] | None, file: int = 1) -> Path:
    """Two files of a variable list column x (4 values a row) and a scalar column y; the
    first row of file ``file`` is ``first_row``: the one private row a probe would read."""
    rng = np.random.default_rng(5)
    root.mkdir(parents=True)
    for i in range(2):
        rows: list = [list(row) for row in rng.normal(size=(50, 4))]
        if i == file:
            rows[0] = first_row
        x = pa.array(rows, pa.list_(pa.float64()))
        pq.write_table(pa.table({"x": x, "y": rng.normal(size=50)}), root / f"part-{i}.parquet")
    return root


@pytest.mark.parametrize("method", ["gauss", "auto"])
def test_check_reads_no_row_of_a_variable_list(tmp_path, capsys, method):
    """A variable list's width is in its rows: --check (free, repeatable, its output
    forwarded) must print and exit the same whatever one row holds, so it reads none."""
    outputs = {}
    for name, first in (("same", [0.5] * 4), ("longer", [0.5] * 9), ("null", None)):
        root = tmp_path / name
        data = list_folder(root / "data", first)
        (root / "results").mkdir()
        grant(root, data)
        code, out = check(job_file(root, data, method=method), capsys)
        outputs[name] = (code, out.replace(str(root), "ROOT"))
    assert outputs["longer"] == outputs["same"] == outputs["null"], outputs
    code, out = outputs["same"]
    if method == "auto":  # auto chooses from D, which the schema does not hold: refused
        assert code == 2, out
        assert "list column(s) x have their width in their rows only" in failed(out, "dataset")
    else:
        assert code == 0, out
        assert "1 features and list column(s) x, whose width the run reads from" in out


def test_a_rank_checked_against_a_row_width_fails_as_data_and_charges(
    tmp_path, capsys, monkeypatch
):
    """Under the ledger the rank is checked against a variable list's width once a row gave
    it: rank 4 on width 4 (valid rows), and the neighbour whose first row has 9 values,
    publish the same thing (exit 6, one generic line, the run failed and charged), not a
    refund naming the width for one and a charge for the other."""
    monkeypatch.setenv("DPSUB_DIAGNOSTICS_DIR", str(tmp_path / "diagnostics"))
    published = {}
    for name, first in (("valid", [0.5] * 4), ("longer", [0.5] * 9)):
        root = tmp_path / name
        data = list_folder(root / "data", first, file=0)
        (root / "results").mkdir()
        grant(root, data)
        job = job_file(
            root, data, method="gauss", columns="[x]", rank="4", parameters="{row_norm: 1.0}"
        )
        capsys.readouterr()
        code = main(["run", str(job), "--run-id", RUN, "--quiet"])
        captured = capsys.readouterr()
        line = captured.err.strip().rsplit(" ", 1)[0]  # without the diagnostics file's path
        history = json.loads(ledger_runs(root, capsys))
        published[name] = (code, captured.out, line, [r["state"] for r in history])
    assert published["valid"] == published["longer"], published
    code, out, line, states = published["valid"]
    assert code == 6 and states == ["failed"], published
    assert line == (
        "dpsub run: error: the run failed after reading its data (next: dpsub inspect INPUT "
        "shows each column's missing and non-finite values); details for the operator in"
    )
