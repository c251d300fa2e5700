"""``dpsub transform`` and ``PrivateSubspace.from_run`` where users meet them: the CLI in a
subprocess, the API in a fresh interpreter. Every projection is checked against NumPy on the
run's published basis and manifest (centred, standardised, uncentred); the input order holds
across files and row groups; a column mismatch is one line and exit 2 with nothing written;
and a transform charges nothing (the ledger is byte for byte unchanged)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dpsub_shim import dpsub

ROWS, DIM = 4_000, 5
NAMES = [f"f{j}" for j in range(DIM)]


def rows(count: int, seed: int) -> np.ndarray:
    """Columns in mixed units around a non-zero mean, near a plane."""
    rng = np.random.default_rng(seed)
    plane = rng.standard_normal((count, 2)) @ rng.standard_normal((2, DIM))
    noise = 0.1 * rng.standard_normal((count, DIM))
    return (plane + noise) * [1.0, 10.0, 0.5, 3.0, 100.0] + [5.0, -20.0, 0.0, 1.0, 300.0]


def write_table(folder: Path, values: np.ndarray, files: int = 3, group: int = 500) -> Path:
    """``values`` as ``files`` Parquet files of row groups of ``group`` rows, with an id column
    (the row's position), a timestamp and a text column (not features: left out)."""
    folder.mkdir(parents=True)
    start = 0
    for i, block in enumerate(np.array_split(values, files)):
        position = np.arange(start, start + len(block))
        start += len(block)
        table = pa.table(
            {
                "row_id": pa.array(position, pa.int64()),
                "ts": pa.array(position * 1_000_000, pa.timestamp("us")),
                "label": pa.array([f"r{p}" for p in position]),
                **{name: pa.array(block[:, j], pa.float32()) for j, name in enumerate(NAMES)},
            }
        )
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=group)
    return folder


def published(run: Path) -> tuple[np.ndarray, dict]:
    return np.load(run / "basis.npy"), json.loads((run / "manifest.json").read_text())


def features(folder: Path) -> np.ndarray:
    """The feature columns as the run read them: float32 values as float64."""
    return pd.read_parquet(folder, columns=NAMES).to_numpy(dtype=np.float64)


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("transform")
    return {
        "train": write_table(root / "train", rows(ROWS, 0)),
        "new": write_table(root / "new", rows(2_500, 1), files=3, group=300),
        "root": root,
    }


def estimate(tables: dict[str, Path], name: str, *flags: str) -> Path:
    out = tables["root"] / name
    if not out.exists():
        done = dpsub(
            "estimate", str(tables["train"]), "--rank", "2", "--epsilon", "2", "--delta", "1e-6",
            "--method", "gauss", "--out", str(out), "--quiet", *flags,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize(
    ("flags", "centring"),
    [((), "mean"), (("--standardize",), "standardize"), (("--no-center",), "none")],
    ids=["centred", "standardized", "uncentred"],
)
def test_transform_is_the_runs_published_map(tables, tmp_path, flags, centring):
    """The output is ((x − centre) / scale) V with the manifest's released centre and scale
    (each where the run took it) and the published basis, row for row, in input order."""
    run = estimate(tables, f"run-{centring}", *flags)
    basis, manifest = published(run)
    release = manifest["release"]
    out = tmp_path / "projected"
    done = dpsub("transform", str(run), str(tables["new"]), "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    # one file per input partition: 3 files of 3 row groups, each its own partition (at least
    # io.parquet.PROGRESS_PARTS where the row groups allow, so a pass's progress moves)
    assert done.stdout.startswith(f"wrote {out}: 2,500 rows × pc1…pc2 in 9 Parquet file(s)")
    x = features(tables["new"])
    if centring == "standardize":
        assert "mean" not in release
        expected = (x - release["location"]) / np.asarray(release["scale"]) @ basis
    elif centring == "mean":
        assert "location" not in release
        expected = (x - np.asarray(release["mean"])) @ basis
    else:
        assert "mean" not in release and "location" not in release
        expected = x @ basis
    got = pd.read_parquet(out)  # _transform.json is skipped: the folder reads as one table
    assert list(got.columns) == ["pc1", "pc2"] and len(got) == 2_500
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-12, atol=1e-9)
    record = json.loads((out / "_transform.json").read_text())
    assert record["kind"] == "transform" and record["columns"] == NAMES
    assert record["n_rows"] == 2_500 and [f["name"] for f in record["files"]] == sorted(
        p.name for p in out.glob("*.parquet")
    )


def test_keep_columns_carry_through_untouched_in_input_order(tables, tmp_path):
    """Three files of 300-row groups: parts are read on the workers in any order, the output
    is in the input's, with the kept columns' values and Arrow types as they were."""
    run = estimate(tables, "run-mean")
    out = tmp_path / "kept"
    done = dpsub(
        "transform", str(run), str(tables["new"]), "--out", str(out), "--quiet",
        "--keep-columns", "row_id,ts,label", "--scheduler", "local-cluster", "--workers", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = pq.read_table(out)
    source = pq.read_table(tables["new"])
    assert got.column_names == ["row_id", "ts", "label", "pc1", "pc2"]
    for name in ("row_id", "ts", "label"):
        assert got.column(name).type == source.column(name).type
        assert got.column(name).to_pylist() == source.column(name).to_pylist()
    assert got.column("row_id").to_pylist() == list(range(2_500))
    basis, manifest = published(run)
    expected = (features(tables["new"]) - manifest["release"]["mean"]) @ basis
    np.testing.assert_allclose(
        np.column_stack([got.column("pc1"), got.column("pc2")]), expected, rtol=1e-12, atol=1e-9
    )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda t: t.drop_columns(["f3"]), "lacks the run's column(s) ['f3']"),
        (
            lambda t: t.set_column(3, "f0", pa.array([str(v) for v in t.column("f0").to_pylist()])),
            "column f0 of",
        ),
        (
            lambda t: t.set_column(
                4, "f1", pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(2 * t.num_rows)), 2)
            ),
            "is a list (fixed_size_list<element: double>[2]) but a scalar column in the run",
        ),
    ],
    ids=["missing", "text", "list"],
)
def test_an_input_without_the_runs_columns_is_one_line_exit_2(tables, tmp_path, change, says):
    run = estimate(tables, "run-mean")
    bad = tmp_path / "bad.parquet"
    pq.write_table(change(pq.read_table(tables["new"] / "part-0.parquet")), bad)
    out = tmp_path / "never"
    done = dpsub("transform", str(run), str(bad), "--out", str(out), "--quiet")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith("dpsub transform: error:")
    assert not out.exists() and not list(tmp_path.glob(".never*"))


def test_extra_and_reordered_columns_are_matched_by_name(tables, tmp_path):
    """The basis reads the run's columns by name, in the run's order, from any input that has
    them; the others are ignored."""
    run = estimate(tables, "run-mean")
    table = pq.read_table(tables["new"])
    shuffled = table.select(["label", "f4", "f2", "f0", "f3", "f1", "row_id"])
    pq.write_table(
        shuffled.append_column("extra", pa.array(np.ones(table.num_rows))), tmp_path / "s.parquet"
    )
    out = tmp_path / "o"
    done = dpsub("transform", str(run), str(tmp_path / "s.parquet"), "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    basis, manifest = published(run)
    expected = (features(tables["new"]) - manifest["release"]["mean"]) @ basis
    np.testing.assert_allclose(pd.read_parquet(out).to_numpy(), expected, rtol=1e-12, atol=1e-9)


def test_overwrite_replaces_a_previous_transform_only_when_asked(tables, tmp_path):
    run = estimate(tables, "run-mean")
    out = tmp_path / "o"
    args = ("transform", str(run), str(tables["new"]), "--out", str(out), "--quiet")
    assert dpsub(*args).returncode == 0
    (out / "part-00000.parquet").write_bytes(b"stale")  # a previous output's file
    again = dpsub(*args)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert (out / "part-00000.parquet").read_bytes() == b"stale"
    assert dpsub(*args, "--overwrite").returncode == 0
    assert len(pd.read_parquet(out)) == 2_500  # the stale file was replaced
    into_input = dpsub("transform", str(run), str(tables["new"]), "--out", str(tables["new"]),
                       "--overwrite", "--quiet")  # fmt: skip
    assert into_input.returncode == 2 and "is the input" in into_input.stderr
    assert len(pd.read_parquet(tables["new"])) == 2_500
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    over_mine = dpsub("transform", str(run), str(tables["new"]), "--out", str(mine),
                      "--overwrite", "--quiet")  # fmt: skip
    assert over_mine.returncode == 2
    assert "is not a previous dpsub transform output" in over_mine.stderr
    assert (mine / "notes.txt").read_text() == "keep me"


def test_data_that_fails_validation_writes_nothing(tables, tmp_path):
    """A NaN in the new rows: the operator's detail goes to the diagnostics file (stderr may
    be forwarded), exit 6, no output; with --overwrite the previous output stays as it was,
    byte for byte, and no temporary folder is left."""
    run = estimate(tables, "run-mean")
    table = pq.read_table(tables["new"] / "part-1.parquet")
    values = table.column("f2").to_numpy().copy()
    values[7] = np.nan
    nan = tmp_path / "nan.parquet"
    pq.write_table(table.set_column(5, "f2", pa.array(values)), nan)
    out = tmp_path / "o"
    done = dpsub("transform", str(run), str(nan), "--out", str(out), "--quiet")
    assert done.returncode == 6 and "details for the operator" in done.stderr
    assert "f2" not in done.stderr
    assert not out.exists() and not list(tmp_path.glob(".o.*"))
    good = dpsub("transform", str(run), str(tables["new"]), "--out", str(out), "--quiet")
    assert good.returncode == 0, good.stderr
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    done = dpsub("transform", str(run), str(nan), "--out", str(out), "--quiet", "--overwrite")
    assert done.returncode == 6
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert not list(tmp_path.glob(".o.*"))


def test_from_run_in_a_fresh_interpreter_matches_the_cli(tables, tmp_path):
    """``PrivateSubspace.from_run`` is fitted with the run's published values: its transform
    of the Parquet path and of a DataFrame equals the CLI's output, inverse_transform maps
    back, and fitting it again is refused."""
    run = estimate(tables, "run-standardize", "--standardize")
    out = tmp_path / "cli"
    assert (
        dpsub("transform", str(run), str(tables["new"]), "--out", str(out), "--quiet").returncode
        == 0
    )
    code = f"""
import json, sys
import numpy as np, pandas as pd
from dpsub_dist import PrivateSubspace
est = PrivateSubspace.from_run({str(run)!r})
cli = pd.read_parquet({str(out)!r}).to_numpy()
frame = pd.read_parquet({str(tables["new"])!r})
manifest = json.load(open({str(run / "manifest.json")!r}))
assert est.n_components_ == 2 and est.n_features_in_ == 5, est
assert list(est.feature_names_in_) == {NAMES!r}
assert np.array_equal(est.components_, np.load({str(run / "basis.npy")!r}).T)
assert np.array_equal(est.mean_, manifest["release"]["location"])
assert np.array_equal(est.scale_, manifest["release"]["scale"])
ratio = manifest["release"]["explained_variance_ratio"]
assert np.array_equal(est.explained_variance_ratio_, ratio)
close = dict(rtol=1e-12, atol=1e-9)
np.testing.assert_allclose(est.transform(frame), cli, **close)
np.testing.assert_allclose(est.transform({str(tables["new"])!r}).compute(), cli, **close)
back = est.inverse_transform(cli)
assert np.allclose(est.transform(back), cli)
try:
    est.fit(frame)
except ValueError as err:
    assert "cannot be fitted again" in str(err), err
else:
    sys.exit("fit was not refused")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_transform_charges_nothing_under_a_ledger(tables, tmp_path):
    """A run published under the ledger (``dpsub run``), then transforms of it: the ledger
    file, its history and its balance are unchanged byte for byte."""
    ledger = tmp_path / "ledger.db"
    dataset = tables["train"]
    init = dpsub("budget", "init", "--ledger", str(ledger), "--dataset", str(dataset),
                 "--epsilon", "4", "--delta", "1e-5")  # fmt: skip
    assert init.returncode == 0, init.stderr
    job = tmp_path / "job.yaml"
    job.write_text(
        f"dataset: {dataset}/\nrank: 2\nmethod: gauss\nbudget: {{epsilon: 2, delta: 1.0e-6}}\n"
        f"output: {tmp_path}/runs/{{run_id}}\nledger: {ledger}\n"
    )
    assert dpsub("run", str(job), "--run-id", "day-1", "--quiet").returncode == 0

    def state() -> tuple[str, str, str]:
        history = dpsub("budget", "history", "--ledger", str(ledger), "--json").stdout
        show = dpsub("budget", "show", "--ledger", str(ledger), "--json").stdout
        return history, show, hashlib.sha256(ledger.read_bytes()).hexdigest()

    before = state()
    for name in ("a", "b"):
        out = tmp_path / name
        done = dpsub("transform", str(tmp_path / "runs" / "day-1"), str(tables["new"]),
                     "--out", str(out), "--quiet")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "no budget spent" in done.stdout
        assert json.loads((out / "_transform.json").read_text())["run_id"] == "day-1"
    assert state() == before


def test_a_vector_column_is_matched_as_the_run_saw_it(tmp_path):
    """A run over a fixed_size_list column: transform flattens it as the run did, and a list
    of another width is one line, exit 2, before any row is read."""
    width = 6
    values = rows(3_000, 2)[:, [0, 1, 2, 3, 4, 0]] + np.arange(width)
    column = pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), width)
    data = tmp_path / "vec"
    data.mkdir()
    pq.write_table(pa.table({"emb": column}), data / "part-0.parquet", row_group_size=1_000)
    run = tmp_path / "run"
    made = dpsub("estimate", str(data), "--rank", "2", "--epsilon", "2", "--delta", "1e-6",
                 "--method", "gauss", "--out", str(run), "--quiet")  # fmt: skip
    assert made.returncode == 0, made.stderr
    basis, manifest = published(run)
    assert manifest["vector_columns"] == {"emb": width}
    done = dpsub("transform", str(run), str(data), "--out", str(tmp_path / "o"), "--quiet")
    assert done.returncode == 0, done.stderr
    expected = (values - manifest["release"]["mean"]) @ basis
    got = pd.read_parquet(tmp_path / "o").to_numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-9)
    narrow = pa.FixedSizeListArray.from_arrays(pa.array(values[:, :5].ravel()), 5)
    pq.write_table(pa.table({"emb": narrow}), tmp_path / "narrow.parquet")
    done = dpsub("transform", str(run), str(tmp_path / "narrow.parquet"), "--out",
                 str(tmp_path / "never"), "--quiet")  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "has 5 values per row but the run's had 6" in done.stderr
    assert not (tmp_path / "never").exists()


def test_standardised_rows_are_clipped_as_the_run_read_them():
    """A standardised run read ``clip((x − location)/scale, ±BOUND)``: a new row far out (or
    huge, 1e308) maps to the clip, finite, as the run would have read it."""
    from dpsub_dist.privacy.column_scales import BOUND
    from dpsub_dist.transform import prepared

    rows = np.array([[1e308, 0.5], [-3.0, 0.02]])
    out = prepared(rows, np.array([0.0, 0.0]), np.array([0.01, 0.01]))
    np.testing.assert_allclose(out, [[BOUND, BOUND], [-BOUND, 2.0]])
