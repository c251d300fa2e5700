"""The workers' half of the private row-norm bound: counts per bin of the public norm grid,
summed on the workers (:mod:`dpsub_dist.privacy.norm_bound` is the driver's half). Only the
grid's 102 integer counts reach the driver (operator-only, never published)."""

from __future__ import annotations

from typing import Any

import dask
import numpy as np

from dpsub_dist.engine.compute import Executor, tree_sum
from dpsub_dist.engine.gram import add_user_norms, sum_on_workers, user_squared_norms
from dpsub_dist.engine.sources import Loader
from dpsub_dist.privacy.norm_bound import norm_counts, norm_histogram

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
