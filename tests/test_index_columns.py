"""Stored pandas/Dask index columns are row labels, not features: skipped by default."""

from __future__ import annotations

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from dpsub_dist.engine.sources import parquet_dataset
from dpsub_dist.io.parquet import is_index_column


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
