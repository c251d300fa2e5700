"""The Gram pass's task (engine/gram.py: partition_gram): rows clipped, scaled, summed and
added to the Gram a cache-sized block at a time, in place only where the loader owns them.

Known answer: the whole partition clipped by ``clip_rows`` and summed by ``gram_of``, across
block edges (the block size patched to 7 rows), with rows far outside the bound, a zero row,
and user-level scaling; a loader that hands out the caller's array leaves it untouched.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest

from dpsub_dist.engine import gram
from dpsub_dist.engine.assign import canonical_unit_ids


def _rows() -> np.ndarray:
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((53, 5)) * np.exp(2 * rng.standard_normal((53, 1)))
    rows[3] = 0.0
    rows[10] *= 1e12
    return rows


class _Borrowed:
    """Hands out the caller's own array (an in-memory source): must not be modified."""

    def __init__(self, rows: np.ndarray, units: Any = None) -> None:
        self.rows, self.units = rows, units

    def __call__(self, part: Any) -> tuple[np.ndarray, Any]:
        return self.rows, self.units


class _Owned(_Borrowed):
    """Hands out a new array each call, which the task may modify."""

    OWNS_ROWS: ClassVar[bool] = True

    def __call__(self, part: Any) -> tuple[np.ndarray, Any]:
        return self.rows.copy(), self.units


@pytest.mark.parametrize("loader_type", [_Borrowed, _Owned])
def test_blocks_give_the_whole_partitions_clipped_gram_and_sum(monkeypatch, loader_type) -> None:
    monkeypatch.setattr(gram, "GRAM_BLOCK_BYTES", 8 * 5 * 7)  # 7 rows a block: 8 blocks
    rows = _rows()
    kept = rows.copy()
    bound = float(np.median(np.linalg.norm(rows, axis=1)))
    summary = gram.partition_gram(loader_type(rows), bound, True, None)
    clipped = gram.clip_rows(kept, bound)
    expected = gram.gram_of(clipped)
    assert np.abs(summary.gram - expected).max() <= 1e-13 * np.abs(expected).max()
    np.testing.assert_array_equal(summary.gram, summary.gram.T)
    np.testing.assert_allclose(summary.row_sum, clipped.sum(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(rows, kept)  # the caller's array, or a copy: untouched
    assert gram.partition_gram(loader_type(rows), bound, False, None).row_sum is None


def test_user_level_rows_are_scaled_by_their_users_totals(monkeypatch) -> None:
    monkeypatch.setattr(gram, "GRAM_BLOCK_BYTES", 8 * 5 * 7)
    rows = _rows()
    ids = np.arange(len(rows)) % 6
    _, units = canonical_unit_ids(pa.array(ids))
    bound = 1.0
    norms = gram.user_squared_norms(_Borrowed(rows, units), bound, None)
    summary = gram.partition_gram(_Owned(rows, units), bound, False, None, norms)
    clipped = gram.clip_rows(rows, bound)
    totals = np.bincount(ids, weights=np.einsum("ij,ij->i", clipped, clipped))
    scaled = clipped / np.sqrt(np.maximum(totals[ids], 1.0))[:, None]
    expected = gram.gram_of(scaled)
    assert np.abs(summary.gram - expected).max() <= 1e-13 * np.abs(expected).max()
    for user in range(6):  # each user's scaled rows: squared norms sum to ≤ 1
        assert np.einsum("ij,ij->", scaled[ids == user], scaled[ids == user]) <= 1 + 1e-12
