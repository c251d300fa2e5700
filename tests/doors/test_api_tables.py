"""The Python API on the tables people load: Dask DataFrames from ``read_parquet`` (with and
without ``columns=``, a column selection after it), ``from_pandas``, persisted frames, Dask
arrays of unknown chunk sizes, pandas; and a mixed-type table, whose columns the API and the
CLI choose by the same rule and refuse in the same words."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from dpsub_dist import PrivateSubspace
from dpsub_dist.cli import main

ROWS, FEATURES = 3_000, ["a", "b", "c", "d"]
BUDGET = {"epsilon": 50.0, "delta": 1e-6}


def numbers(rows: int = ROWS) -> pd.DataFrame:
    rng = np.random.default_rng(4)
    scales = np.array([5.0, 3.0, 1.0, 0.5])
    return pd.DataFrame(rng.standard_normal((rows, 4)) * scales + 10.0, columns=FEATURES)


def estimator(**kwargs) -> PrivateSubspace:
    return PrivateSubspace(2, method="gauss", row_norm=40.0, seed=1, **BUDGET, **kwargs)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Three Parquet files written by Dask, with more columns than the features: small
    files, so read_parquet fuses them when it reads a few columns (dask/dask#12411)."""
    path = tmp_path_factory.mktemp("tables") / "dask"
    extra = {f"other_{j}": np.full(ROWS, float(j)) for j in range(6)}
    frame = numbers().assign(label="x", **extra)
    dd.from_pandas(frame, npartitions=3).to_parquet(path, write_index=False)
    return path


FRAMES = {
    "read_parquet": lambda p: dd.read_parquet(p).drop(columns=[f"other_{j}" for j in range(6)]),
    "read_parquet-columns": lambda p: dd.read_parquet(p, columns=FEATURES),
    "read_parquet-columns-subset": lambda p: dd.read_parquet(p, columns=FEATURES[:3] + ["label"]),
    "selection-after-read_parquet": lambda p: dd.read_parquet(p)[["c", "a", "d"]],
    "read_parquet-persisted": lambda p: dd.read_parquet(p).persist()[FEATURES],
    "from_pandas": lambda p: dd.from_pandas(numbers(), npartitions=4),
    "persisted-from_pandas": lambda p: dd.from_pandas(numbers(), npartitions=4).persist(),
    "dask-array-unknown-chunks": lambda p: dd.read_parquet(p, columns=FEATURES).to_dask_array(),
    "dask-array-values": lambda p: dd.read_parquet(p, columns=FEATURES).values,
    "pandas": lambda p: numbers(),
}


@pytest.mark.parametrize("make", FRAMES.values(), ids=FRAMES.keys())
def test_fit_and_transform_on_the_frames_people_load(folder: Path, make) -> None:
    data = make(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a left-out text column is named
        est = estimator().fit(data)
    assert est.manifest_["n_rows"] == ROWS  # counted on the partitions that were read
    names = [str(c) for c in data.columns] if hasattr(data, "columns") else None
    used = [n for n in names if n != "label"] if names else FEATURES
    assert est.manifest_["columns"] == (used if names else ["x0", "x1", "x2", "x3"])
    rows = numbers()[used].to_numpy()
    assert np.abs(est.mean_ - rows.mean(axis=0)).max() < 0.1  # n·ε large: close to the mean
    projected = est.transform(make(folder))
    projected = projected.compute() if hasattr(projected, "compute") else projected
    np.testing.assert_allclose(projected, (rows - est.mean_) @ est.basis_, atol=1e-9)


def test_a_persisted_frame_is_read_or_refused_in_one_line_where_dask_lost_partitions(
    folder: Path,
) -> None:
    """Dask 2026.8 loses partitions of a persisted read_parquet frame whose columns= makes it
    fuse the files (its own compute() fails): refused, naming the fix. Where Dask keeps them
    (a later release), the fit reads the frame."""
    frame = dd.read_parquet(folder, columns=["a", "b"]).persist()
    try:
        dask_reads_it = len(frame.compute()) == ROWS
    except (TypeError, ValueError):
        dask_reads_it = False
    if dask_reads_it:
        assert estimator().fit(frame).manifest_["n_rows"] == ROWS
    else:
        with pytest.raises(ValueError, match=r"pass the frame before \.persist\(\), or the Parq"):
            estimator().fit(frame)


def test_dask_arrays_of_unknown_chunks_count_their_rows() -> None:
    X = numbers().to_numpy()
    blocks = da.from_array(X, chunks=(700, 2))
    lazy = blocks[blocks[:, 0] > -np.inf]  # a boolean mask: row chunks unknown
    assert np.isnan(lazy.shape[0])
    est = estimator().fit(lazy)
    assert est.manifest_["n_rows"] == ROWS and est.n_features_in_ == 4


# --------------------------------------------------------------------- mixed types


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """Numbers beside a date, text, a flag, an identifier and a stored named index."""
    frame = numbers()
    frame["when"] = pd.date_range("2024-01-01", periods=ROWS, freq="min")
    frame["city"] = np.where(frame["a"] > 10, "Oslo", "Lima")
    frame["flag"] = frame["b"] > 10
    frame["customer_id"] = np.arange(ROWS, dtype=np.int64)
    frame["event_no"] = np.random.default_rng(1).permutation(ROWS)
    path = tmp_path_factory.mktemp("mixed") / "mixed.parquet"
    frame.set_index("event_no").to_parquet(path)
    return path


def cli(path: Path, out: Path, scheduler: str, *extra: str) -> int:
    return main(
        ["estimate", str(path), "--out", str(out), "--rank", "2", "--method", "gauss"]
        + ["--row-norm", "40", "--epsilon", "50", "--delta", "1e-6", "--quiet", "--seed", "1"]
        + ["--scheduler", scheduler, *extra]
    )


def test_cli_and_api_choose_the_same_columns_of_a_mixed_table(
    mixed: Path, tmp_path: Path, scheduler_address: str, capsys
) -> None:
    assert cli(mixed, tmp_path / "run", scheduler_address) == 0
    success = capsys.readouterr().out
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["columns"] == FEATURES
    left_out = {
        "when": "not numeric",
        "city": "not numeric",
        "flag": "not numeric",
        "customer_id": "identifier",
        "event_no": "index",
    }
    assert manifest["columns_left_out"] == left_out
    assert "left out: when (not numeric), city (not numeric), flag (not numeric), " in success
    for data in (mixed, pd.read_parquet(mixed), dd.read_parquet(mixed)):
        with pytest.warns(UserWarning, match=r"left out the columns when \(not numeric\), city"):
            est = estimator().fit(data)
        assert est.manifest_["columns"] == FEATURES
        assert list(est.feature_names_in_) == FEATURES
        in_columns = {k: v for k, v in left_out.items() if k in est.columns_left_out_}
        assert est.columns_left_out_ == in_columns  # the frames hold event_no as their index
        projected = est.transform(data)  # the same choice at transform
        assert projected.shape[1] == 2


@pytest.mark.parametrize(
    ("columns", "refusal"),
    [
        (["a", "when"], r"non-numeric columns requested: \['when \("),
        (["a", "nope"], r"columns not found: \['nope'\]: available columns are"),
    ],
    ids=["date", "missing"],
)
def test_cli_and_api_refuse_a_bad_column_choice_alike(
    mixed: Path, tmp_path: Path, scheduler_address: str, capsys, columns, refusal
) -> None:
    out = tmp_path / "run"
    assert cli(mixed, out, scheduler_address, "--columns", ",".join(columns)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(refusal, err), err
    assert not out.exists()
    for data in (mixed, pd.read_parquet(mixed), dd.read_parquet(mixed)):
        with pytest.raises(ValueError, match=refusal):
            estimator(columns=columns).fit(data)


def test_an_identifier_named_in_columns_is_used_at_both_doors(
    mixed: Path, tmp_path: Path, scheduler_address: str
) -> None:
    chosen = ["a", "b", "customer_id"]
    assert cli(mixed, tmp_path / "run", scheduler_address, "--columns", ",".join(chosen)) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["columns"] == chosen
    for data in (mixed, pd.read_parquet(mixed)):
        assert estimator(columns=chosen).fit(data).manifest_["columns"] == chosen


def test_a_frame_with_no_numeric_feature_is_refused_naming_the_parameter() -> None:
    frame = pd.DataFrame({"user_id": np.arange(50), "when": pd.date_range("2024", periods=50)})
    with pytest.raises(
        ValueError, match=r"look like identifiers; name the ones to use in columns="
    ):
        estimator().fit(frame)


def test_exclude_columns_applies_to_a_dataframe_as_to_a_path(mixed: Path) -> None:
    for data in (mixed, pd.read_parquet(mixed)):
        with pytest.warns(UserWarning, match="left out the columns"):
            est = estimator(exclude_columns=["d*"]).fit(data)
        assert est.manifest_["columns"] == ["a", "b", "c"]
        assert est.transform(data).shape[1] == 2
    with pytest.raises(ValueError, match=r"exclude_columns= pattern 'z\*' matches no column"):
        estimator(exclude_columns=["z*"]).fit(pd.read_parquet(mixed))


def test_columns_may_be_a_pandas_index_and_a_bare_string_is_refused() -> None:
    """``columns=`` is checked by the run-level table (a list of names): a DataFrame's own
    ``columns[:k]`` is such a list; a bare string is refused with the parameter's name."""
    frame = pd.DataFrame(
        np.random.default_rng(0).standard_normal((3_000, 4)), columns=["a", "b", "c", "d"]
    )
    fitted = PrivateSubspace(2, columns=frame.columns[:3], method="gauss", row_norm=5.0)
    assert list(fitted.fit(frame).feature_names_in_) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="columns must be a list of column names"):
        PrivateSubspace(2, columns="a", method="gauss", row_norm=5.0).fit(frame)


def test_an_in_memory_array_is_sent_to_the_cluster_once(dask_client) -> None:
    """Fitting a NumPy array on a cluster scatters its blocks once: each pass's graph names
    them, where every pass used to carry the rows through the scheduler again (Dask warns of
    graphs above 10 MB; these 16 MB of rows made each pass's graph one)."""
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((250_000, 8)) @ np.diag([5, 3, 1, 1, 1, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Sending large graph")
        est = PrivateSubspace(2, epsilon=1.0, delta=1e-6, client=dask_client).fit(rows)
    top = np.eye(8)[:, :2]
    assert np.linalg.norm(est.components_ @ top @ top.T - est.components_) < 0.2
