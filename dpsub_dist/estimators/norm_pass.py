"""The workers' half of the private row-norm bound: row counts per bin of the public norm grid,
summed on the workers (:mod:`dpsub_dist.privacy.norm_bound` is the driver's half)."""

from __future__ import annotations

from typing import Any

import dask
import numpy as np

from dpsub_dist.engine.gram import Loader, sum_on_workers
from dpsub_dist.privacy.norm_bound import NORM_QUANTILE, norm_counts

NORM_SOURCE = (
    f"private (step norm_bound): the smallest value 2^-10·√2^j (j = 0…100) at which the noisy "
    f"count of rows with norm ≤ it reaches {NORM_QUANTILE}·n (sparse vector)"
)


def compute_norm_counts(
    parts: list[Any], loader: Loader, client: Any | None, progress: bool
) -> np.ndarray:
    """Row counts per bin of the public norm grid (:func:`norm_counts`), summed on the workers.

    Only the grid's 102 integer counts reach the driver (operator-only, never published).
    """
    count = dask.delayed(_partition_norm_counts, pure=True)
    tasks = [count(loader, part) for part in parts]
    return sum_on_workers(tasks, client, f"{len(parts)} partitions → row-norm counts", progress)


def _partition_norm_counts(loader: Loader, part: Any) -> np.ndarray:
    return norm_counts(loader(part)[0])
