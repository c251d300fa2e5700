"""Stored pandas/Dask index columns are row labels, not features: skipped by default, whether
the writer named them ``__index_level_0__`` or the index's own name (``event_no``), which the
file's pandas metadata (``index_columns``, schema only) names as the index."""

from __future__ import annotations

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from dpsub_dist import PrivateSubspace
from dpsub_dist.engine.sources import parquet_dataset
from dpsub_dist.io.parquet import is_index_column, stored_index_columns


def frame(rows: int = 50) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(rng.standard_normal((rows, 3)), columns=["a", "b", "c"])


def test_pandas_index_of_a_filtered_frame_is_not_a_feature(tmp_path):
    data = frame()
    data[data["a"] > 0].to_parquet(tmp_path / "x.parquet")  # stores __index_level_0__
    dataset = parquet_dataset(str(tmp_path / "x.parquet"), None, None, None, None)
    assert dataset.columns == ["a", "b", "c"]


def test_dask_null_index_is_not_a_feature(tmp_path):
    dd.from_pandas(frame().reset_index(drop=True), npartitions=2).to_parquet(
        tmp_path / "d", write_index=True
    )
    dataset = parquet_dataset(str(tmp_path / "d"), None, None, None, None)
    assert dataset.columns == ["a", "b", "c"]


def test_an_index_column_named_explicitly_is_used(tmp_path):
    data = frame()
    data[data["a"] > 0].to_parquet(tmp_path / "x.parquet")
    dataset = parquet_dataset(
        str(tmp_path / "x.parquet"), ["a", "__index_level_0__"], None, None, None
    )
    assert dataset.columns == ["a", "__index_level_0__"]


def with_event_no(rows: int = 50) -> pd.DataFrame:
    """A frame indexed by a named, non-range index (stored as a column, not as a range)."""
    data = frame(rows)
    data["event_no"] = np.random.default_rng(1).permutation(rows) * 7
    return data.set_index("event_no")


def test_a_named_pandas_index_is_not_a_feature(tmp_path):
    with_event_no().to_parquet(tmp_path / "x.parquet")
    dataset = parquet_dataset(str(tmp_path / "x.parquet"), None, None, None, None)
    assert dataset.columns == ["a", "b", "c"]
    assert dataset.left_out == {"event_no": "index"}
    named = parquet_dataset(str(tmp_path / "x.parquet"), ["a", "event_no"], None, None, None)
    assert named.columns == ["a", "event_no"]


def test_a_named_dask_index_is_not_a_feature(tmp_path):
    dd.from_pandas(with_event_no(), npartitions=2).to_parquet(tmp_path / "d")
    dataset = parquet_dataset(str(tmp_path / "d"), None, None, None, None)
    assert dataset.columns == ["a", "b", "c"]


def test_the_api_leaves_a_named_index_out_of_files_and_frames(tmp_path):
    data = with_event_no(2_000)
    data.to_parquet(tmp_path / "x.parquet")
    fit = {"method": "gauss", "row_norm": 10.0, "epsilon": 10.0, "delta": 1e-6}
    for table in (tmp_path / "x.parquet", data, pd.read_parquet(tmp_path / "x.parquet")):
        estimator = PrivateSubspace(2, **fit).fit(table)
        assert list(estimator.feature_names_in_) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("metadata", "index"),
    [
        (None, ()),
        ({b"pandas": b'{"index_columns": ["event_no", {"kind": "range"}]}'}, ("event_no",)),
        ({b"pandas": b"not json"}, ()),
        ({b"pandas": b"[1, 2]"}, ()),
    ],
)
def test_stored_index_columns_from_the_metadata(metadata, index):
    assert stored_index_columns(metadata) == index


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("__index_level_0__", True),
        ("__index_level_12__", True),
        ("__null_dask_index__", True),
        ("index", False),
        ("x__index_level_0__", False),
        ("__index_level__", False),
    ],
)
def test_index_column_names(name, index):
    assert is_index_column(name) is index
