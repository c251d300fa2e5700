"""Contiguous subsets summarised where their rows lie: no shuffle, worker memory flat in n.

With ``assign="contiguous"`` (SS21) subset j is the block of rows [⌈jn/t⌉, ⌈(j+1)n/t⌉),
so almost every subset lies inside one partition. One task per partition loads it once
and runs the local step on each subset it holds whole; a subset that crosses partition
boundaries gets one small task that joins its pieces (the partitions' edge rows, in
position order). Nothing else moves between workers, and only the ``t`` summaries reach
the driver. Same rows in the same order as the other routes, so the same summaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask
import numpy as np

from dpsub_dist.engine.compute import IN_PROCESS, Executor, gather_summaries
from dpsub_dist.engine.sources import Loader
from dpsub_dist.engine.subsets import LocalStep, SubsetPlan


def subset_starts(n_rows: int, subsets: int) -> np.ndarray:
    """First position of every contiguous subset, and n: subset j is [s[j], s[j+1])."""
    j = np.arange(subsets + 1, dtype=np.int64)
    return -(-j * n_rows // subsets)


def summarise_partition(
    local_step: LocalStep,
    loader: Loader,
    part: Any,
    offset: int,
    starts: np.ndarray,
    whole: np.ndarray,
    crossing: np.ndarray,
) -> tuple[tuple[np.ndarray, np.ndarray], dict[int, np.ndarray]]:
    """Summaries of the subsets this partition holds whole, and its rows of the others."""
    rows, _ = loader(part)
    summaries = [
        local_step(rows[starts[j] - offset : starts[j + 1] - offset], int(j)) for j in whole
    ]
    stacked = np.stack(summaries) if summaries else np.empty((0, 0))
    end = offset + rows.shape[0]
    edges = {  # copies: a view would keep the whole partition alive until the joins run
        int(j): rows[max(starts[j], offset) - offset : min(starts[j + 1], end) - offset].copy()
        for j in crossing
    }
    return (whole, stacked), edges


def summarise_crossing(
    local_step: LocalStep, subset: int, *pieces: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Summary of one subset whose rows are split across partitions (pieces in order)."""
    return np.array([subset]), local_step(np.concatenate(pieces), subset)[None, :]


def compute_subset_summaries_in_place(
    parts: Sequence[Any],
    offsets: Sequence[int],
    loader: Loader,
    plan: SubsetPlan,
    local_step: LocalStep,
    executor: Executor = IN_PROCESS,
    progress: bool = False,
) -> np.ndarray:
    """Summaries of all ``t`` contiguous subsets as a t×out_dim array, without a shuffle."""
    if plan.assign != "contiguous" or plan.user_level:
        raise ValueError("the in-place route needs row-level contiguous subsets")
    starts = subset_starts(plan.n_rows, plan.subsets)
    bounds = np.append(np.asarray(offsets, dtype=np.int64), plan.n_rows)
    # Partitions holding each subset's first and last row (empty subsets: one, no rows).
    first = np.searchsorted(bounds, starts[:-1], side="right") - 1
    last = np.searchsorted(bounds, np.maximum(starts[1:] - 1, starts[:-1]), side="right") - 1
    first, last = np.minimum(first, len(parts) - 1), np.minimum(last, len(parts) - 1)
    is_whole = first == last
    split = dask.delayed(summarise_partition, pure=True, nout=2)
    tasks = []
    for p, (part, offset) in enumerate(zip(parts, offsets, strict=True)):
        whole = np.flatnonzero(is_whole & (first == p))
        crossing = np.flatnonzero(~is_whole & (first <= p) & (last >= p))
        tasks.append(split(local_step, loader, part, int(offset), starts, whole, crossing))
    join = dask.delayed(summarise_crossing, pure=True)
    crossers = [
        join(local_step, int(j), *[tasks[p][1][int(j)] for p in range(first[j], last[j] + 1)])
        for j in np.flatnonzero(~is_whole)
    ]
    outputs = [t[0] for t in tasks] + crossers
    label = f"{len(parts)} partitions → {plan.subsets} contiguous subsets in place"
    return gather_summaries(executor, [], outputs, plan.subsets, label, progress, plan.public_rows)
