"""The Gram pass holds one accumulator per worker thread, not one D × D matrix per partition
(engine/gram.py: compute_gram; engine/compute.py: fold_per_thread; issue #32).

A worker plugin counts, at every task transition, the distinct D × D arrays held in the
worker's memory; the peak over a pass of many partitions must be at most two per worker (its
own accumulator and, at a node of the tree, the one it receives), whatever the number of
partitions. A tree over the partitions' own Grams held every Gram that waited for its partner:
at D = 10⁴ (800 MB each) that killed 4.5 GiB workers. The count is structural (no memory
figure, no timing); the Gram itself must still be the rows' clipped Gram. Where the rows are
held on the workers (engine/row_cache.py), each is added on the worker that holds it: no
partition of rows moves.
"""

from __future__ import annotations

from typing import Any

import dask
import numpy as np
import pytest
from distributed.diagnostics.plugin import WorkerPlugin

from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.gram import GramSummary, compute_gram
from dpsub_dist.engine.row_cache import held_rows
from dpsub_dist.methods._clustering import PartitionGrams, sum_over_partitions

DIM = 64
ROWS = 40  # a partition's rows (20 KB) are smaller than a D × D matrix (32 KB)
BOUND = 6.0


class _Rows:
    """Partition ``part``'s rows, drawn from its own seed on the worker."""

    def __call__(self, part: int) -> tuple[np.ndarray, Any]:
        return np.random.default_rng(part).standard_normal((ROWS, DIM)), None


class _CountMatrices(WorkerPlugin):
    """Peak number of distinct arrays of ``shape`` in a worker's memory, sampled at every
    transition."""

    name = "count-d-by-d"

    def __init__(self, shape: tuple[int, ...] = (DIM, DIM)) -> None:
        self.shape = shape

    def setup(self, worker: Any) -> None:
        self.worker, self.peak = worker, 0

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        held = getattr(self.worker.data, "fast", self.worker.data)
        arrays = {
            id(array)
            for value in list(held.values())
            for array in _arrays(value)
            if array.shape == self.shape
        }
        self.peak = max(self.peak, len(arrays))


def _arrays(value: Any) -> list[np.ndarray]:
    if isinstance(value, GramSummary):
        return [value.gram]
    return [value] if isinstance(value, np.ndarray) else []


def _peaks(dask_worker: Any) -> int:
    return dask_worker.plugins[_CountMatrices.name].peak


def _received(dask_worker: Any) -> list[str]:
    return [str(key) for event in dask_worker.transfer_incoming_log for key in event["keys"]]


@pytest.mark.parametrize("center", [False, True])
@pytest.mark.parametrize("held", [False, True])
def test_a_worker_holds_at_most_two_grams_whatever_the_partition_count(
    dask_client, center, held
) -> None:
    parts: list = list(range(48))
    loader: Any = _Rows()
    executor = Executor(dask_client)
    if held:  # as engine/row_cache.py holds them: each partition's (rows, units) on a worker
        parts = executor.persist([dask.delayed(loader, pure=True)(part) for part in parts])
        loader = held_rows
    dask_client.register_plugin(_CountMatrices())
    try:
        summary = compute_gram(parts, loader, BOUND, center, executor=executor)
        peaks = dask_client.run(_peaks)
        received = dask_client.run(_received)
    finally:
        dask_client.unregister_worker_plugin(_CountMatrices.name)
    assert len(peaks) == 2 and max(peaks.values()) <= 2, peaks
    if held:
        held_keys = {str(part.key) for part in parts}
        assert not held_keys & {key for keys in received.values() for key in keys}
    rows = np.concatenate([_Rows()(part)[0] for part in range(48)])
    clipped = rows / np.maximum(np.linalg.norm(rows, axis=1), BOUND)[:, None]
    expected = clipped.T @ clipped
    assert np.abs(summary.gram - expected).max() <= 1e-12 * np.abs(expected).max()
    np.testing.assert_array_equal(summary.gram, summary.gram.T)
    if center:
        np.testing.assert_allclose(summary.row_sum, clipped.sum(axis=0), rtol=1e-12, atol=1e-12)


def test_sulq_cluster_grams_are_summed_in_one_accumulator_per_worker(dask_client) -> None:
    """``cluster --method sulq``'s per-cluster Grams (K × d × d a partition) are summed the
    same way: at most two such arrays a worker."""
    clusters, parts = 3, list(range(48))
    bases = np.linalg.qr(np.random.default_rng(1).standard_normal((clusters, DIM, 2)))[0]
    task = PartitionGrams(_Rows(), BOUND)
    dask_client.register_plugin(_CountMatrices((clusters, DIM, DIM)))
    try:
        grams = sum_over_partitions(task, parts, bases, Executor(dask_client))
        peaks = dask_client.run(_peaks)
    finally:
        dask_client.unregister_worker_plugin(_CountMatrices.name)
    assert len(peaks) == 2 and max(peaks.values()) <= 2, peaks
    expected = sum(task(part, bases) for part in parts)
    assert np.abs(grams - expected).max() <= 1e-12 * np.abs(expected).max()
