"""Job files: the issue's minimal example is accepted as is; every error names its field and
is raised before the ledger is opened or any data is read."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from dpsub_dist.cli import main
from dpsub_dist.errors import InputError
from dpsub_dist.jobfile import load_job, parse_job
from dpsub_dist.privacy.accountant import ZCDP, ApproxDP

MINIMAL = """\
dataset: /data/events/          # local path or s3:// URI
rank: 3
method: friendly
budget: {epsilon: 1.0, delta: 1.0e-6}
output: /results/events-basis/
ledger: /state/ledger.db        # or a postgresql:// URL
"""

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_minimal_example_from_the_issue_is_accepted_as_is(tmp_path):
    job = load_job(write(tmp_path, MINIMAL))
    assert (job.dataset, job.rank, job.method) == ("/data/events/", 3, "friendly")
    assert job.budget == ApproxDP(1.0, 1e-6)
    assert (job.output, job.ledger, job.name) == (
        "/results/events-basis/",
        "/state/ledger.db",
        "job",
    )
    assert job.dataset_key == "/data/events"
    assert job.unit == "row" and job.parameters == {} and not job.overwrite


def test_shipped_job_files_validate():
    files = sorted(PIPELINES.glob("*.yaml"))
    assert files
    for path in files:
        job = load_job(path)
        assert job.rank >= 1 and job.ledger


def test_every_field(tmp_path):
    job = load_job(
        write(
            tmp_path,
            "name: daily-events\n"
            "dataset: s3://bucket/events/\n"
            "columns: x0, x1,x2\n"
            "unit_column: user_id\n"
            "rank: 2\n"
            "method: histogram\n"
            "parameters: {subsets: 400, ref_points: 4, cell_side: 0.5, seed: 7}\n"
            "budget: {rho: 0.5, delta: 1e-6}\n"  # PyYAML reads 1e-6 as a string: accepted
            "output: s3://bucket/out/{run_id}/\n"
            "overwrite: true\n"
            "storage_options: {endpoint_url: 'http://127.0.0.1:9000'}\n"
            "scheduler: tcp://127.0.0.1:8786\n"
            "workers: 4\n",
        )
    )
    assert job.columns == ["x0", "x1", "x2"]
    assert job.parameters == {"subsets": 400, "ref_points": 4, "scale": 0.5, "seed": 7}
    assert job.budget == ZCDP(0.5, 5e-7)
    assert job.unit == "user:user_id" and job.dataset_key == "s3://bucket/events"
    assert job.output_for("2024-06-01") == "s3://bucket/out/2024-06-01/"
    config = job.config(public_seed=99)
    assert (config.seed, config.scale, config.unit_column) == (7, 0.5, "user_id")


B = "budget: {epsilon: 1.0, delta: 1.0e-6}"
R = "rank: 3"
ERRORS = [
    (B, "budget: {epsilon: -1, delta: 1.0e-6}", "budget.epsilon must be > 0 and finite (got -1.0)"),
    (B, "budget: {epsilon: 1.0}", "budget.delta is required"),
    (B, "budget: {epsilon: 1.0, delta: 2}", "budget.delta must be in (0, 1)"),
    (B, "budget: {epsilon: 1, rho: 1, delta: 1.0e-6}", "pass exactly one of budget.epsilon"),
    (B, "budget: {epsilon: lots, delta: 1.0e-6}", "budget.epsilon must be a number (got 'lots')"),
    (B, "budget: {eps: 1.0, delta: 1.0e-6}", "budget.eps is unknown"),
    (B, "budget: 1.0", "budget must be a mapping"),
    (R, "rank: 0", "rank must be a positive integer (got 0)"),
    (R, "rank: three", "rank must be a positive integer (got 'three')"),
    (R, "rank: 3\nrnak: 2", "unknown field 'rnak'"),
    ("dataset: /data/events/", "dataset:", "dataset is required"),
    ("method: friendly", "method: magic", "method 'magic' is unknown"),
    (R, "rank: 3\nparameters: {subsetz: 3}", "parameters.subsetz is unknown"),
    (R, "rank: 3\nparameters: {subsets: 1}", "parameters.subsets must be between"),
    (R, "rank: 3\nparameters: {radius: -2}", "parameters.radius must be > 0"),
    (R, "rank: 3\noverwrite: yes please", "overwrite must be true or false"),
    (R, "rank: 3\ncolumns: []", "columns must be a list of column names"),
    (R, "rank: 3\nworkers: -1", "workers must be a positive integer"),
    ("/results/events-basis/", "/results/{date}/", "output may only use the placeholder {run_id}"),
    (R, "rank: 3\nname: has space", "job name 'has space'"),
]


@pytest.mark.parametrize(("old", "new", "message"), ERRORS)
def test_errors_name_the_field(tmp_path, monkeypatch, old, new, message):
    assert old in MINIMAL
    monkeypatch.chdir(tmp_path)
    Path("job.yaml").write_text(MINIMAL.replace(old, new))
    with pytest.raises(InputError) as err:
        load_job("job.yaml")
    assert str(err.value).startswith(f"job.yaml: {message}"), str(err.value)
    assert err.value.exit_code == 2


def test_not_yaml_or_not_a_mapping(tmp_path):
    with pytest.raises(InputError, match=r"job.yaml: not valid YAML at line \d+ \(expected"):
        load_job(write(tmp_path, "rank: 3\nbudget: {epsilon: 1\n"))
    with pytest.raises(InputError, match="must be a YAML mapping"):
        load_job(write(tmp_path, "- dataset\n- rank\n"))
    with pytest.raises(InputError, match="job file not found"):
        load_job(tmp_path / "missing.yaml")
    with pytest.raises(InputError, match="job: unknown field"):
        parse_job({"dataset": "/d", "colour": "red"})


def test_validated_before_the_ledger_or_the_data(tmp_path, capsys):
    """A bad field fails first although neither the data nor the ledger exist (exit 2)."""
    ledger = tmp_path / "ledger.db"
    text = MINIMAL.replace("/state/ledger.db", str(ledger)).replace("rank: 3", "rank: -3")
    assert main(["run", str(write(tmp_path, text)), "--run-id", "r1"]) == 2
    assert "job.yaml: rank must be a positive integer" in capsys.readouterr().err
    assert not ledger.exists()
    good = write(tmp_path, MINIMAL.replace("/state/ledger.db", str(ledger)), "good.yaml")
    assert main(["run", str(good), "--check"]) == 2  # valid, but the ledger does not exist
    assert "valid" in capsys.readouterr().out and not ledger.exists()
    assert main(["run", str(good), "--run-id", "bad/id"]) == 2
    assert "invalid run id 'bad/id'" in capsys.readouterr().err
    assert main(["run", str(good), "--run-id", "r1"]) == 2  # the ledger does not exist
    assert "no ledger at" in capsys.readouterr().err and not ledger.exists()


def test_default_run_id_and_fingerprint(tmp_path):
    job = load_job(write(tmp_path, MINIMAL, "events.yaml"))
    day = datetime(2024, 6, 1, 23, 59, tzinfo=UTC)
    run_id = job.default_run_id(day)
    assert run_id == f"events-2024-06-01-{job.fingerprint()[:8]}"
    assert job.default_run_id(day) == run_id  # the same job the same day: the same run
    moved = load_job(write(tmp_path, MINIMAL.replace("/results/events-basis/", "/x/"), "b.yaml"))
    assert moved.fingerprint() == job.fingerprint()  # where it is written is not the job
    richer = load_job(write(tmp_path, MINIMAL.replace("epsilon: 1.0", "epsilon: 2.0"), "c.yaml"))
    assert richer.fingerprint() != job.fingerprint()


def test_a_bad_storage_options_mapping_is_refused_without_repeating_it(tmp_path):
    """The run-level table checks storage_options at every door; its values hold
    credentials, so the refusal names the field and never repeats them."""
    from dpsub_dist import PrivateSubspace

    job = tmp_path / "job.yaml"
    job.write_text(
        "dataset: /data/events/\nrank: 2\nbudget: {epsilon: 1.0, delta: 1.0e-6}\n"
        "output: /out/{run_id}\nstorage_options: [secret-key-123]\n"
    )
    with pytest.raises(InputError, match="storage_options must be a mapping") as refused:
        load_job(job)
    assert "secret-key-123" not in str(refused.value)
    estimator = PrivateSubspace(storage_options={"key": "secret-key-123", 1: "x"})
    with pytest.raises(ValueError, match="storage_options must be a mapping") as refused:
        estimator.fit(np.random.default_rng(0).standard_normal((50, 3)))
    assert "secret-key-123" not in str(refused.value)


def test_every_run_level_parameter_is_a_job_file_key():
    """The job file's keys come from the run-level table: each parameter is a top-level key
    (with the table's help), a ``budget.`` key or ``parameters.seed``."""
    from dpsub_dist.jobfile import BUDGET_NAMES, JOB_FIELDS, TOP_LEVEL
    from dpsub_dist.params import RUN_PARAMS, SEED

    keys = {p.name for p in TOP_LEVEL} | set(BUDGET_NAMES) | {SEED.name}
    assert keys == {p.name for p in RUN_PARAMS["estimate"]}
    assert all(JOB_FIELDS[p.name] == p.help for p in TOP_LEVEL)
