"""Rows moved to their subsets by Dask's disk-backed P2P shuffle (the row route's engine).

Each partition is loaded on a worker into a frame of its rows (float32 when exact, as
:func:`~dpsub_dist.engine.subsets.shipping_rows`), each row's subset and global position;
``DataFrame.shuffle(on="_subset", shuffle_method="p2p")`` moves the rows so that each
output partition holds whole subsets: Dask's P2P extension streams them through worker
disk, so the cluster's memory bounds neither n nor the shuffled bytes. Each output
partition then runs the local step on each subset it holds (rows in position order,
float64: the same blocks as the bucket shuffle). Subsets without rows are summarised as
an empty block (a public constant). Only the t summaries reach the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask
import numpy as np
import pandas as pd

from dpsub_dist.engine.compute import IN_PROCESS, Executor
from dpsub_dist.engine.sources import Loader
from dpsub_dist.engine.subsets import LocalStep, SubsetPlan, shipping_rows

SUBSET, POSITION = "_subset", "_position"


def partition_frame(plan: SubsetPlan, loader: Loader, part: Any, offset: int) -> pd.DataFrame:
    """One partition's rows as a frame: one column per feature, subset and position."""
    rows, units = loader(part)
    positions = offset + np.arange(rows.shape[0], dtype=np.int64)
    frame = pd.DataFrame(shipping_rows(rows), columns=[str(j) for j in range(rows.shape[1])])
    frame[SUBSET] = plan.subset_of(positions, units)
    frame[POSITION] = positions
    return frame


def frame_summaries(frame: pd.DataFrame, local_step: LocalStep) -> tuple[np.ndarray, np.ndarray]:
    """The local step on each subset this shuffled partition holds (position order), each
    block widened to float64 on its own, so the task holds its rows as shipped plus one
    subset's block."""
    subsets, positions = frame[SUBSET].to_numpy(), frame[POSITION].to_numpy()
    rows = frame.drop(columns=[SUBSET, POSITION]).to_numpy()
    order = np.lexsort((positions, subsets))
    ids, starts = np.unique(subsets[order], return_index=True)
    ends = [*starts[1:], len(order)]
    summaries = [
        local_step(rows[order[a:b]].astype(np.float64), int(j))
        for j, a, b in zip(ids, starts, ends, strict=True)
    ]
    return ids, np.stack(summaries) if summaries else np.empty((0, 0))


def compute_subset_summaries_p2p(
    parts: Sequence[Any],
    offsets: Sequence[int],
    loader: Loader,
    plan: SubsetPlan,
    local_step: LocalStep,
    executor: Executor = IN_PROCESS,
    progress: bool = False,
) -> np.ndarray:
    """Summaries of all ``t`` subsets, rows moved by Dask's P2P shuffle (module docstring)."""
    import dask.dataframe as dd

    dim = local_step.dim
    meta = partition_frame(plan, lambda _: (np.empty((0, dim)), None), None, 0)
    frame = dd.from_delayed(
        [
            dask.delayed(partition_frame, pure=True)(plan, loader, part, offset)
            for part, offset in zip(parts, offsets, strict=True)
        ],
        meta=meta,
        verify_meta=False,
    )
    method = executor.shuffle_method
    shuffled = frame.shuffle(on=SUBSET, npartitions=plan.buckets, shuffle_method=method)
    summarise = dask.delayed(frame_summaries, pure=True)
    outputs = [summarise(piece, local_step) for piece in shuffled.to_delayed()]
    table = np.full((plan.subsets, local_step(np.empty((0, dim)), 0).size), np.nan)
    seen = np.zeros(plan.subsets, dtype=bool)

    def place(result: tuple[np.ndarray, np.ndarray]) -> None:
        ids, block = result
        table[ids], seen[ids] = block, True

    label = f"{len(parts)} partitions → P2P shuffle → {plan.buckets} partitions"
    executor.run([], outputs, label, progress, place, plan.public_rows)
    for j in np.flatnonzero(~seen):  # no rows: the summary of an empty block
        table[j] = local_step(np.empty((0, dim)), int(j))
    return table
