"""--exclude-columns (names or fnmatch patterns) beside --columns, for estimate, cluster and
job files: decided from the schema alone (public), refused with exit 2 before any data is
read when a pattern matches no column or nothing would be left."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsub_dist.cli import main

COLUMNS = ["a", "b", "c", "user_id", "z_score", "label"]


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(rng.standard_normal((2000, 3)), columns=["a", "b", "c"])
    frame["user_id"] = np.arange(2000, dtype=np.int64)
    frame["z_score"] = rng.standard_normal(2000)
    frame["label"] = "x"  # text: never a feature
    path = tmp_path / "t.parquet"
    frame[frame["a"] > -5].to_parquet(path)  # a filtered frame: __index_level_0__ stored
    return path


def estimate(table: Path, out: Path, scheduler: str, *extra: str) -> int:
    return main(
        ["estimate", str(table), "--out", str(out), "--rank", "2", "--method", "gauss"]
        + ["--row-norm", "4", "--epsilon", "1", "--delta", "1e-6", "--quiet"]
        + ["--scheduler", scheduler, *extra]
    )


def used(out: Path) -> list[str]:
    return json.loads((out / "manifest.json").read_text())["columns"]


def test_names_and_patterns_are_excluded(table, tmp_path, scheduler_address, capsys):
    out = tmp_path / "run"
    assert estimate(table, out, scheduler_address, "--exclude-columns", "user_id,z_*") == 0
    assert used(out) == ["a", "b", "c"]
    captured = capsys.readouterr()
    assert "from 3 columns: a, b, c" in captured.out
    assert "look like identifiers" not in captured.err  # user_id was excluded


def test_exclusion_applies_to_explicit_columns(table, tmp_path, scheduler_address):
    out = tmp_path / "run"
    code = estimate(
        table, out, scheduler_address, "--columns", "a,b,c,z_score", "--exclude-columns", "c"
    )
    assert code == 0
    assert used(out) == ["a", "b", "z_score"]


@pytest.mark.parametrize(
    ("excluded", "message"),
    [
        ("a,nosuch*", "--exclude-columns pattern 'nosuch*' matches no column"),
        ("a,b,c,user_id,z_score", "--exclude-columns leaves no feature column"),
    ],
)
def test_refusals_exit_2_and_write_nothing(
    table, tmp_path, scheduler_address, capsys, excluded, message
):
    out = tmp_path / "run"
    assert estimate(table, out, scheduler_address, "--exclude-columns", excluded) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_cluster_excludes_too(table, tmp_path, scheduler_address):
    out = tmp_path / "clu"
    code = main(
        ["cluster", str(table), "--out", str(out), "--clusters", "2", "--rank", "1"]
        + ["--method", "sulq", "--iterations", "2", "--epsilon", "1", "--delta", "1e-6"]
        + ["--exclude-columns", "user_id,z_score", "--quiet", "--scheduler", scheduler_address]
    )
    assert code in (0, 3)
    assert used(out) == ["a", "b", "c"]


def test_job_file_key(table, tmp_path, scheduler_address):
    ledger = str(tmp_path / "ledger.db")
    init = ["budget", "init", "--ledger", ledger, "--dataset", str(table), "--epsilon", "2"]
    assert main([*init, "--delta", "1e-5"]) == 0
    job = tmp_path / "job.yaml"
    job.write_text(
        f"dataset: {table}\nrank: 2\nmethod: gauss\nparameters: {{row_norm: 4}}\n"
        "exclude_columns: [user_id, 'z_*']\n"
        f"budget: {{epsilon: 1.0, delta: 1.0e-6}}\noutput: {tmp_path}/out/{{run_id}}\n"
        f"ledger: {ledger}\nscheduler: {scheduler_address}\n"
    )
    (tmp_path / "out").mkdir()
    assert main(["run", str(job), "--run-id", "r1", "--quiet"]) == 0
    assert used(tmp_path / "out" / "r1") == ["a", "b", "c"]
