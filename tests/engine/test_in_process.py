"""Where a run's tasks go (``--scheduler``): a small table in process, chosen from public facts.

With no ``--scheduler`` the footers' row count × the schema's width × 8 bytes chooses: in
process up to :data:`IN_PROCESS_BYTES`, else a local cluster; at user level (the row count is
private) always the cluster. The choice is printed. The releases do not depend on it
(tests/privacy/test_release_checksums.py runs its cases on both).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import dpsub_shim as shim
import numpy as np
import pandas as pd
import pytest

from dpsub_dist.engine import cluster
from dpsub_dist.engine.cluster import IN_PROCESS_BYTES, chosen_scheduler
from dpsub_dist.engine.compute import IN_PROCESS, Executor
from dpsub_dist.engine.sources import Dataset, parquet_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.synth import generate

BUDGET = ["--epsilon", "1", "--delta", "1e-6"]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """2,000 rows × 6 columns in one file (94 KiB as float64)."""
    root = tmp_path_factory.mktemp("small")
    return generate(root / "data", rows=2_000, dim=6, rank=2, partitions=1, seed=1).path


def dpsub(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``dpsub ARGS`` in a fresh process, its diagnostics files under ``cwd``."""
    diagnostics = {"DPSUB_DIAGNOSTICS_DIR": str(cwd / "diagnostics")}
    return shim.dpsub(*args, cwd=cwd, env=diagnostics, timeout=600)


def test_a_small_table_runs_in_process_and_says_why(small: Path, tmp_path: Path) -> None:
    done = dpsub("estimate", str(small), "--rank", "2", *BUDGET, "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        "in process, no cluster (2,000 rows × 6 features = 93.75 kiB as float64 ≤ 64.00 MiB; "
        "--scheduler local-cluster starts one)"
    ) in done.stderr.splitlines()
    assert "local Dask cluster" not in done.stderr
    assert np.load(tmp_path / "out" / "basis.npy").shape == (6, 2)


def test_in_process_shows_progress(small: Path, tmp_path: Path) -> None:
    """Forced in process, the passes are counted as on a cluster (a log gets plain lines)."""
    args = ["--rank", "2", *BUDGET, "--out", "out", "--scheduler", "in-process"]
    done = dpsub("estimate", str(small), *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "in process, no cluster (--scheduler in-process)" in done.stderr
    finished = [line for line in done.stderr.splitlines() if "tasks (100%)" in line]
    assert finished and all(line.startswith("pass ") for line in finished), done.stderr


def test_local_cluster_is_forced_by_name(small: Path, tmp_path: Path) -> None:
    args = ["--rank", "2", *BUDGET, "--out", "out", "--scheduler", "local-cluster"]
    done = dpsub("estimate", str(small), *args, "--workers", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "local Dask cluster: 1 workers," in done.stderr
    assert "in process" not in done.stderr


def test_user_level_never_chooses_from_the_private_row_count(tmp_path: Path) -> None:
    """At user level n is private: the choice (printed, so published) must not depend on it,
    and a small table starts the cluster as a large one does."""
    rows = np.random.default_rng(3).standard_normal((600, 4))
    table = pd.DataFrame(rows, columns=[f"x{i}" for i in range(4)])
    table["user"] = np.repeat(np.arange(200), 3)
    table.to_parquet(tmp_path / "users.parquet", index=False)
    args = ["--rank", "1", *BUDGET, "--out", "out", "--unit-column", "user", "--method", "gauss"]
    args += ["--row-norm", "5"]
    done = dpsub("estimate", "users.parquet", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "local Dask cluster:" in done.stderr
    assert "in process" not in done.stderr


def test_a_stream_append_of_a_small_batch_runs_in_process(small: Path, tmp_path: Path) -> None:
    """A stream is row level: its batch's footers choose, as an estimate's do."""
    init = ["stream", "init", "s.stream", "--rank", "2", "--horizon", "4", "--rho", "0.5"]
    assert dpsub(*init, "--delta", "1e-6", cwd=tmp_path).returncode == 0
    done = dpsub("stream", "append", "s.stream", str(small), "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "in process, no cluster (2,000 rows × 6 features = 93.75 kiB" in done.stderr
    assert "local Dask cluster" not in done.stderr
    assert "appended step 1/4" in done.stdout
    assert np.load(tmp_path / "out" / "basis.npy").shape == (6, 2)


def test_a_batch_is_chosen_from_its_footers_alone(tmp_path: Path) -> None:
    """The stream's columns set the width; a list column's width is in its rows, which the
    choice never reads (a failure there is charged, inside the append): the cluster."""
    from dpsub_dist.engine.sources import read_footers

    rows = IN_PROCESS_BYTES // (8 * 4)
    table = pd.DataFrame(np.zeros((rows, 8)), columns=[f"x{i}" for i in range(8)])
    table.to_parquet(tmp_path / "wide.parquet", index=False)
    footers = read_footers(str(tmp_path / "wide.parquet"), None, IN_PROCESS)
    assert cluster.footers_choice(footers, None)[0] == "local-cluster"  # 8 columns
    assert cluster.footers_choice(footers, ["x0", "x1", "x2", "x3"])[0] == "in-process"
    lists = pd.DataFrame({"v": [np.zeros(3), np.zeros(3)]})
    lists.to_parquet(tmp_path / "lists.parquet", index=False)
    footers = read_footers(str(tmp_path / "lists.parquet"), None, IN_PROCESS)
    assert cluster.footers_choice(footers, None) == ("local-cluster", cluster.LIST_WIDTH_REASON)


def _dataset(n_rows: int, dim: int, from_rows: tuple[str, ...] = ()) -> Dataset:
    return Dataset(
        [], [], None, [f"x{i}" for i in range(dim)], n_rows, "t", widths_from_rows=from_rows
    )


def test_the_choice_is_the_size_from_footers_and_schema() -> None:
    """In process up to :data:`IN_PROCESS_BYTES` inclusive, a cluster one row above; a width
    read from a row (a variable list column) is not public: the cluster."""
    rows = IN_PROCESS_BYTES // (8 * 16)
    assert chosen_scheduler(_dataset(rows, 16))[0] == "in-process"
    assert chosen_scheduler(_dataset(rows + 1, 16))[0] == "local-cluster"
    assert chosen_scheduler(_dataset(10, 16, ("x0",)))[0] == "local-cluster"


def test_above_the_limit_a_cluster_runs_the_dataset_opened_here(
    small: Path, monkeypatch, capsys
) -> None:
    """The footers are read once, in process, to choose; the cluster then runs that dataset."""
    monkeypatch.setattr(cluster, "IN_PROCESS_BYTES", 1024)
    executors: list[Executor] = []

    def open_dataset(executor: Executor) -> Dataset:
        executors.append(executor)
        return parquet_dataset(str(small), None, None, None, executor)

    config = EstimateConfig(rank=2, epsilon=1.0, delta=1e-6)
    with cluster.run_place(None, open_dataset, True) as (client, opened):
        result = run_estimate(config, opened, client)
        assert Executor(client).workers >= 1
    assert executors == [IN_PROCESS]
    assert result.outcome == "ok"
    banner = "workers (2,000 rows × 6 features = 93.75 kiB as float64 > 1.00 kiB), "
    assert banner in capsys.readouterr().err
