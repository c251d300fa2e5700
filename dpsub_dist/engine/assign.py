"""Subset assignment (ALGORITHMS.md §1 step 1): independent of row values by construction.

- row level, ``random``: keyed hash of (public seed, global row position) mod t, so a
  row whose values are replaced stays in its subset (replace-one neighbours);
- row level, ``contiguous`` (SS21): the j-th block of consecutive rows;
- user level: keyed hash of (public seed, user id) mod t, so adding or removing a
  user touches exactly one subset (add/remove neighbours).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijective mixing of 64-bit integers."""
    z = values.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _seed_key(seed: int) -> np.uint64:
    return _mix64(np.array([seed & int(_MASK64)], dtype=np.uint64))[0]


def random_row_subsets(positions: np.ndarray, seed: int, subsets: int) -> np.ndarray:
    """Subset of each global row position: keyed hash (seed, position) mod t."""
    keyed = positions.astype(np.uint64) ^ _seed_key(seed)
    return (_mix64(_mix64(keyed)) % np.uint64(subsets)).astype(np.int64)


def contiguous_row_subsets(positions: np.ndarray, n_rows: int, subsets: int) -> np.ndarray:
    """Subset j holds rows [j·n/t, (j+1)·n/t): consecutive blocks in file/row order (SS21)."""
    return (positions.astype(np.int64) * subsets) // n_rows


def unit_subsets(units: np.ndarray | pd.Series, seed: int, subsets: int) -> np.ndarray:
    """Subset of each row's unit (user id): keyed SipHash of (seed, id) mod t."""
    key = f"{int(_seed_key(seed)):016x}"
    hashed = pd.util.hash_pandas_object(pd.Series(units), index=False, hash_key=key)
    return (hashed.to_numpy(dtype=np.uint64) % np.uint64(subsets)).astype(np.int64)
