"""Rows read once and held where they were read, for the passes that follow (issue #16).

The covariance family's default run reads every row up to four times: the raw rows' norm
counts, their clipped sum (the mean), the centred rows' norm counts, then the Gram. When the
rows fit, :func:`cache_rows` reads each partition once (Parquet decode, float64 conversion) and
keeps its float64 rows in the workers' memory (this process's, without a cluster); every later
pass takes them from there, as the same arrays the loader would have returned, so every sum,
count and release is bit for bit what re-reading would give. Rows never leave the worker that
read them: later tasks are scheduled where their partition is held, and only the passes'
summaries reach the driver, as before.

The rows fit when ``n·D·8`` bytes are at most :data:`CACHE_FRACTION` of the workers' memory
limits summed (:data:`IN_PROCESS_CACHE_BYTES` without a cluster). The decision reads public
facts only (n and D from the footers, public at row level; the cluster's configuration) and
changes time and memory, never a published value. At user level n is private, so rows are
never cached there (the decision would follow it). Where they do not fit, every pass reads the
files again and worker memory stays one partition per task, flat in n.

:func:`hold_parts` holds some partitions only: gauss's sampled-centre route
(:func:`dpsub_dist.methods.gauss.centre_sample`) holds its public sample's partitions, which
its two sample passes and then its one full pass read, so every partition is read once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import dask
import numpy as np

from dpsub_dist.engine.sources import owns_rows

if TYPE_CHECKING:
    from dpsub_dist.engine.compute import Executor
    from dpsub_dist.engine.sources import Dataset

CACHE_FRACTION = 0.25
"""Cache the rows on the workers when they take at most this share of their memory limits."""

IN_PROCESS_CACHE_BYTES = 2**30
"""Without a cluster, cache the rows in this process up to this many bytes."""


def rows_fit(n_rows: int, dim: int, executor: Executor) -> bool:
    """Whether ``n_rows × dim`` float64 rows fit the cache (public facts only)."""
    need = n_rows * dim * 8
    limit = executor.memory_limit  # None: in process
    return need <= (IN_PROCESS_CACHE_BYTES if limit is None else CACHE_FRACTION * limit)


def held_rows(part: tuple[Any, Any]) -> tuple[Any, Any]:
    """The loader of a cached dataset: a held partition is already its ``(rows, units)``."""
    return part


def is_held(dataset: Dataset) -> bool:
    """Whether ``dataset``'s rows are held (:func:`cache_rows`): a pass costs no read."""
    return dataset.loader is held_rows


def cache_rows(dataset: Dataset, executor: Executor, user_level: bool) -> Dataset:
    """``dataset`` with each partition read once and held (module docstring), or ``dataset``
    itself where the rows do not fit, at user level, or without rows."""
    if user_level or not dataset.parts or not rows_fit(dataset.n_rows, dataset.dim, executor):
        return dataset
    load = dask.delayed(dataset.loader, pure=True)
    held = executor.persist([load(part) for part in dataset.parts])
    return dataclasses.replace(dataset, parts=held, loader=held_rows)


class HeldRows(NamedTuple):
    """A partition held by :func:`hold_parts`: its loader's ``(rows, units)``."""

    rows: np.ndarray
    units: Any


def _hold(loader: Any, part: Any) -> HeldRows:
    return HeldRows(*loader(part))


@dataclasses.dataclass(frozen=True)
class PartlyHeld:
    """The loader of a dataset some of whose partitions are held (:func:`hold_parts`): a held
    partition gives its rows (a new copy where ``loader`` owns its rows, so that the caller
    may still modify them in place), any other is read by ``loader``. The same values either
    way."""

    loader: Any

    @property
    def OWNS_ROWS(self) -> bool:  # noqa: N802 - the attribute owns_rows reads
        return owns_rows(self.loader)

    def __call__(self, part: Any) -> tuple[np.ndarray, Any]:
        if not isinstance(part, HeldRows):
            return self.loader(part)
        return (np.array(part.rows) if self.OWNS_ROWS else part.rows), part.units


def hold_parts(dataset: Dataset, positions: Sequence[int], executor: Executor) -> Dataset:
    """``dataset`` with the partitions at ``positions`` read once and held where they were read
    (their rows must fit: :func:`rows_fit` of their public row count), the others read by each
    pass as before; ``dataset`` itself where they do not fit. Row level only (the caller's)."""
    sizes = np.diff([*dataset.offsets, dataset.n_rows])
    rows = int(sum(sizes[i] for i in positions))
    if not positions or not rows_fit(rows, dataset.dim, executor):
        return dataset
    hold = dask.delayed(_hold, pure=True)
    held = executor.persist([hold(dataset.loader, dataset.parts[i]) for i in positions])
    parts = list(dataset.parts)
    for i, part in zip(positions, held, strict=True):
        parts[i] = part
    return dataclasses.replace(dataset, parts=parts, loader=PartlyHeld(dataset.loader))
