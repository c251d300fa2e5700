"""The Python API refuses bad in-memory input as the CLI does: one actionable line
(:class:`dpsub_dist.errors.InputError`), no raw NumPy/LinAlg error, nothing fitted."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpsub_dist import PrivateSubspace
from dpsub_dist.errors import InputError


def _rows(bad: float) -> np.ndarray:
    rows = np.random.default_rng(0).standard_normal((4_000, 5))
    rows[[10, 2_000], 3] = bad
    return rows


@pytest.mark.parametrize("method", ["friendly", "gauss"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_array_is_refused_in_one_line(method: str, bad: float) -> None:
    extra = {"row_norm": 5.0} if method == "gauss" else {"subsets": 40}
    est = PrivateSubspace(2, epsilon=1.0, delta=1e-6, method=method, seed=1, **extra)
    with pytest.raises(InputError) as info:
        est.fit(_rows(bad))
    message = str(info.value)
    assert message.startswith("input array: column x3 has 2 NaN or infinite values"), message
    assert "\n" not in message
    assert not hasattr(est, "components_") and not hasattr(est, "manifest_")


def test_non_finite_dataframe_names_the_column() -> None:
    frame = pd.DataFrame(_rows(np.nan), columns=["a", "b", "c", "d", "e"])
    est = PrivateSubspace(2, epsilon=1.0, delta=1e-6, subsets=40, seed=1)
    with pytest.raises(InputError, match=r"^input array: column d has 2 NaN or infinite values"):
        est.fit(frame)


def test_dask_frame_with_a_stored_index_says_what_to_do(tmp_path) -> None:
    """``dd.read_parquet(path, columns=...)`` of a pandas file with a named RangeIndex: Dask
    fails to read it (``KeyError: '[nan] not in index'``); the fit says what to do."""
    import dask.dataframe as dd

    frame = pd.DataFrame(np.random.default_rng(0).standard_normal((2_000, 4)), columns=list("abcd"))
    frame.index.name = "row"
    frame.to_parquet(tmp_path / "t.parquet")
    lazy = dd.read_parquet(tmp_path / "t.parquet", columns=["a", "b", "c"])
    est = PrivateSubspace(1, epsilon=1.0, delta=1e-6, seed=1)
    with pytest.raises(InputError) as info:
        est.fit(lazy)
    message = str(info.value)
    assert "pass the Parquet path to fit instead" in message and "index=False" in message
    assert isinstance(info.value, ValueError) and "\n" not in message
    assert not hasattr(est, "manifest_")
    est.fit(dd.read_parquet(tmp_path / "t.parquet", columns=["a", "b", "c"], index=False))
    assert est.components_.shape == (1, 3)  # the fix it names works
