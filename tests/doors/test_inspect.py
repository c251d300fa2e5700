"""``dpsub inspect INPUT`` (issue #38): the operator's look at a table before spending budget on
it, in a subprocess as the operator runs it. Each column's role comes from the run's own
column rule, so a run on the same options uses exactly the columns inspect calls features."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dpsub_shim import dpsub

ROWS = 600


def write_table(path: Path, nulls: bool) -> Path:
    """A first real table: an id, a text column, a category, a list column, two numeric
    columns on very different scales, and (``nulls``) 7 missing values in ``gaps``."""
    rng = np.random.default_rng(3)
    gaps = rng.normal(size=ROWS)
    table = pa.table(
        {
            "user_id": pa.array(np.arange(ROWS) % 40, pa.int64()),
            "x": rng.normal(size=ROWS),
            "income": rng.normal(size=ROWS) * 2_000 + 60_000,
            "gaps": pa.array([None if nulls and i % 90 == 0 else v for i, v in enumerate(gaps)]),
            "name": pa.array([f"n{i}" for i in range(ROWS)]),
            "city": pa.array(["a", "b", "c"] * (ROWS // 3)).dictionary_encode(),
            "emb": pa.array(rng.normal(size=(ROWS, 3)).tolist(), pa.list_(pa.float64())),
        }
    )
    pq.write_table(table, path, row_group_size=200)
    return path


def block(out: str, column: str) -> str:
    """The lines inspect printed for ``column`` (its heading and indented details)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{column}  ["))
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), len(lines)
    )
    return "\n".join(lines[start:end])


def test_inspect_names_each_column_s_role_type_and_problems(tmp_path):
    data = write_table(tmp_path / "t.parquet", nulls=True)
    done = dpsub("inspect", str(data), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "NOT a private release" in out.splitlines()[0]
    assert "Never forward or publish" in out.splitlines()[0]
    assert block(out, "user_id").startswith("user_id  [int64]  left out: identifier")
    assert block(out, "name").startswith("name  [text]  left out: not numeric")
    city = block(out, "city")
    assert city.startswith("city  [categorical (dictionary of text)]  left out: not numeric")
    assert block(out, "emb").startswith("emb  [list of float64 (variable length)]  feature")
    assert "list lengths 3" in block(out, "emb") and "ragged" not in block(out, "emb")
    gaps = block(out, "gaps")
    assert gaps.startswith("gaps  [float64]  feature") and "nulls 7 " in gaps
    assert "nulls 0 " in block(out, "x")
    advice = out.split("what a run would do")[1]
    assert "gaps: missing values" in advice and "--exclude-columns gaps" in advice
    assert "x:" not in advice  # complete and finite, near the origin
    assert "--unit-column user_id" in advice
    assert "mixed units" in advice and "--standardize" in advice  # income vs x
    assert "income: far from the origin" in advice


def test_inspect_respects_the_column_options_as_a_run_does(tmp_path):
    """--exclude-columns and --unit-column change the roles; a run with the same options
    uses exactly the columns inspect calls features (the run's manifest lists them)."""
    data = write_table(tmp_path / "t.parquet", nulls=False)
    options = ["--exclude-columns", "emb,inc*", "--unit-column", "user_id"]
    done = dpsub("inspect", str(data), *options, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    features = [
        line.split("  [")[0]
        for line in done.stdout.splitlines()
        if line.endswith("]  feature") or line.endswith("  feature")
    ]
    assert features == ["x", "gaps"]
    assert "income  [float64]  left out: matches --exclude-columns" in done.stdout
    assert block(done.stdout, "user_id").startswith("user_id  [int64]  the user id")
    budget = ["--epsilon", "1", "--delta", "1e-6", "--rank", "1", "--method", "gauss"]
    run = dpsub(
        "estimate", str(data), *options, *budget, "--row-norm", "5", "--out", "run", "--quiet",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["columns"] == features


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--columns", "x,nope"], "columns not found: ['nope']"),
        (["--exclude-columns", "zz*"], "--exclude-columns pattern 'zz*' matches no column"),
    ],
)
def test_inspect_refuses_bad_column_options_as_estimate_does(tmp_path, argv, words):
    data = write_table(tmp_path / "t.parquet", nulls=False)
    done = dpsub("inspect", str(data), *argv, cwd=tmp_path)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not done.stdout


def test_a_run_that_fails_on_its_data_names_inspect_as_the_next_step(tmp_path):
    data = write_table(tmp_path / "t.parquet", nulls=True)
    budget = ["--epsilon", "1", "--delta", "1e-6", "--rank", "1", "--method", "gauss"]
    run = dpsub("estimate", str(data), *budget, "--row-norm", "5", "--out", "run", cwd=tmp_path)
    assert run.returncode == 6, run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert "the run failed after reading its data" in line
    assert "next: dpsub inspect INPUT shows each column's missing" in line
    assert "gaps" not in run.stderr  # the column's name stays in the operator's file
