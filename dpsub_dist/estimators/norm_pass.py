"""The workers' half of the private row-norm bound: counts per bin of the public norm grid,
summed on the workers (:mod:`dpsub_dist.privacy.norm_bound` is the driver's half). Only the
grid's 102 integer counts reach the driver (operator-only, never published).

:class:`LevelSums` fuses the bound of a mean with the mean's clipped sum (one read of the rows
instead of two): the same counts, and per bin the rows' sum and their sum scaled to unit norm,
from which the clipped sum at any grid value follows. They stay on the workers; the driver
receives the counts, then the one clipped sum at the bound it released.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
from scipy import sparse

from dpsub_dist.engine.compute import Executor, tree_sum
from dpsub_dist.engine.gram import add_user_norms, sum_on_workers, user_squared_norms
from dpsub_dist.engine.sources import Loader
from dpsub_dist.linalg import row_norms
from dpsub_dist.privacy.norm_bound import GRID, norm_counts, norm_histogram

NORM_SOURCE = (
    "private (step {step}): the smallest value 2^-10·√2^j (j = 0…100) at which the noisy "
    "count of rows with norm ≤ it reaches q·n (sparse vector), q = {q:.6g} from public n, D, "
    "ε, δ (1 − q = clip(16σ√D/n, 20/(ε_norm·n), 0.5); 0.99 for a mean's bound)"
)

USER_NORM_SOURCE = (
    "private at user level (step norm_bound): a noisy user count ñ (half of the step), then "
    "the smallest value 2^-10·√2^j (j = 0…100) at which the noisy count of users with "
    "√Σ‖x‖² ≤ it reaches q·ñ (sparse vector, the other half), q = {q:.6g} from ñ, D, ε, δ"
)


def compute_norm_counts(
    parts: list[Any], loader: Loader, executor: Executor, progress: bool
) -> np.ndarray:
    """Row counts per bin of the public norm grid (:func:`norm_counts`), summed on the workers."""
    count = dask.delayed(_partition_norm_counts, pure=True)
    tasks = [count(loader, part) for part in parts]
    return sum_on_workers(tasks, executor, f"{len(parts)} partitions → row-norm counts", progress)


def _partition_norm_counts(loader: Loader, part: Any) -> np.ndarray:
    return norm_counts(loader(part)[0])


def compute_user_norm_counts(
    parts: list[Any], loader: Loader, executor: Executor, progress: bool
) -> np.ndarray:
    """Counts of users per bin of the public grid by ``√Σ‖x‖²`` over their rows: the per-user
    tables are summed in a tree on the workers and binned there."""
    squares = dask.delayed(user_squared_norms, pure=True)
    tasks = [squares(loader, None, part) for part in parts]
    total = tree_sum(tasks, dask.delayed(add_user_norms, pure=True), tasks)
    root = dask.delayed(_user_histogram, pure=True)(total)
    label = f"{len(parts)} partitions → per-user norm counts"
    return executor.compute(root, tasks, label, progress)


def _user_histogram(totals: Any) -> np.ndarray:
    return norm_histogram(np.sqrt(np.asarray(totals, dtype=np.float64)))


LEVEL_SUMS_BYTES = 16 * 2**20
"""Fuse a bound with its clipped sum only while a partition's :class:`LevelSums` (2 × 102 × D
floats) take at most this many bytes: up to D ≈ 10,000 (public: D only)."""


@dataclass(frozen=True)
class LevelSums:
    """Per bin of the public norm grid (bins as :func:`norm_counts`): the row count, ``Σ x``
    and ``Σ x/‖x‖`` over the bin's rows. Held on the workers: a bin may hold a single row."""

    counts: np.ndarray
    rows: np.ndarray
    unit_rows: np.ndarray

    def __add__(self, other: LevelSums) -> LevelSums:
        return LevelSums(
            self.counts + other.counts, self.rows + other.rows, self.unit_rows + other.unit_rows
        )

    def clipped_sum(self, bound: float) -> np.ndarray:
        """``Σ x/max(‖x‖, bound)`` (:func:`clip_rows`, summed) for ``bound`` in the grid: rows
        with norm ≤ bound (bins ≤ its index) are scaled by 1/bound, the others by 1/‖x‖.
        Equal to the separate pass up to float rounding (the sums are grouped by bin)."""
        index = int(np.searchsorted(GRID, bound))
        if index >= len(GRID) or GRID[index] != bound:
            raise ValueError(f"{bound} is not a value of the norm grid")
        inside = self.rows[: index + 1].sum(axis=0) * (1.0 / bound)
        return inside + self.unit_rows[index + 1 :].sum(axis=0)


def fuse_level_sums(dim: int) -> bool:
    """Whether a mean's bound and its sum take one read (:data:`LEVEL_SUMS_BYTES`)."""
    return 2 * (len(GRID) + 1) * dim * 8 <= LEVEL_SUMS_BYTES


def partition_level_sums(loader: Loader, part: Any) -> LevelSums:
    """One partition's :class:`LevelSums` (runs on a worker)."""
    rows = np.asarray(loader(part)[0], dtype=np.float64)
    norms = row_norms(rows)
    bins = np.searchsorted(GRID, norms, side="left")
    shape, where = (len(GRID) + 1, len(rows)), (bins, np.arange(len(rows)))
    unit = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return LevelSums(
        norm_histogram(norms),
        sparse.csr_matrix((np.ones(len(rows)), where), shape=shape) @ rows,
        sparse.csr_matrix((unit, where), shape=shape) @ rows,
    )


def compute_level_sums(
    parts: list[Any], loader: Loader, executor: Executor, progress: bool
) -> tuple[np.ndarray, Any]:
    """The norm counts (to the driver) and the held :class:`LevelSums` of all rows (a
    delayed value on the workers, for :func:`gather_clipped_sum`)."""
    level_sums = dask.delayed(partition_level_sums, pure=True)
    tasks = [level_sums(loader, part) for part in parts]
    root = tree_sum(tasks, dask.delayed(LevelSums.__add__, pure=True), tasks)
    (held,) = executor.persist([root])  # runs the pass; progress counts its one output
    counts = dask.delayed(_counts, pure=True)(held)
    label = f"{len(parts)} partitions → row-norm counts and clipped sums"
    return executor.compute(counts, [], label, progress), held


def gather_clipped_sum(held: Any, bound: float, executor: Executor) -> np.ndarray:
    """The clipped sum at the released ``bound``, computed where the level sums are held."""
    total = dask.delayed(LevelSums.clipped_sum, pure=True)(held, bound)
    return executor.compute(total, [], "clipped row sum", False)


def _counts(sums: LevelSums) -> np.ndarray:
    return sums.counts
