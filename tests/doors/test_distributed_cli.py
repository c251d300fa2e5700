"""``dpsub estimate --scheduler`` against a real cluster started from the command line:
``dask scheduler`` + two ``dask worker`` processes on 127.0.0.1, checked against the known
answer; also from S3, where the workers hold read credentials and the driver may list the
bucket and write its run but cannot open one data object (so it never reads data)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from daskprocs import command_line_cluster
from s3server import s3_server, upload

from dpsub_dist.io.output import read_run
from dpsub_dist.linalg import subspace_error

DPSUB = [sys.executable, "-m", "dpsub_dist.cli"]
MAX_ERROR = 0.1  # measured ≈ 0.005 on this data (n = 100,000, d = 10, k = 2, γ = 0.01)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with s3_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, s3):
    from dpsub_dist.synth import generate

    local = tmp_path_factory.mktemp("synth") / "gauss"
    result = generate(local, rows=100_000, dim=10, rank=2, gamma=0.01, partitions=4, seed=5)
    upload(s3, local, "s3://data/gauss")
    return result


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3):
    """Scheduler + 2 workers; the workers get S3 credentials from their environment."""
    with command_line_cluster(tmp_path_factory.mktemp("dask"), env=s3.env("reader")) as running:
        yield running


def estimate(source: str, out: str, scheduler: str, env=None) -> subprocess.CompletedProcess:
    args = ["estimate", source, "--rank", "2", "--epsilon", "1", "--delta", "1e-6"]
    return subprocess.run(
        [*DPSUB, *args, "--out", out, "--scheduler", scheduler, "--seed", "1", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def task_prefixes(address: str) -> set[str]:
    """Names of the task kinds the scheduler has seen."""
    from distributed import Client

    with Client(address) as client:
        return set(
            client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes))
        )


def test_estimate_on_command_line_cluster(cluster, dataset, tmp_path):
    out = tmp_path / "run"
    run = estimate(str(dataset.path), str(out), cluster.address)
    assert run.returncode == 0, run.stderr
    basis, manifest = read_run(str(out))
    assert subspace_error(basis, dataset.load_basis()) <= MAX_ERROR
    assert manifest["files"] == 4 and manifest["n_rows"] == 100_000
    assert "inspect_file" in task_prefixes(cluster.address)  # footers were read on its workers
    assert "local Dask cluster" not in run.stderr  # it used the scheduler, not its own cluster


def test_estimate_from_s3_driver_cannot_read_data(cluster, dataset, s3, tmp_path):
    assert cluster.workers and all(p.poll() is None for p in cluster.workers)
    with pytest.raises(PermissionError):  # the driver's own credentials cannot open data …
        s3.fs("driver").cat_file("data/gauss/part-00000.parquet")
    out = "s3://data/runs/distributed/"
    run = estimate("s3://data/gauss/", out, cluster.address, env=s3.env("driver"))
    assert run.returncode == 0, run.stderr  # … so every footer and row was read on a worker
    basis, manifest = read_run(out, s3.storage_options("admin"))
    assert subspace_error(basis, dataset.load_basis()) <= MAX_ERROR
    assert manifest["input"] == "s3://data/gauss/" and manifest["n_rows"] == 100_000
    stored = s3.fs().cat_file("data/runs/distributed/manifest.json").decode()
    assert json.loads(stored)["outputs"]["basis.npy"]["bytes"] > 0
    for creds in s3.users.values():
        assert creds.secret not in run.stdout + run.stderr + stored + cluster.logs()
