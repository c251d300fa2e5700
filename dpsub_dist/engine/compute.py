"""Running engine graphs: in-process or on a cluster, with only the outputs gathered.

The lowest layer of the engine: :mod:`dpsub_dist.engine.gram`,
:mod:`dpsub_dist.engine.subsets` and the subset routes import it, and it imports none
of them (no import cycle by construction).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dask
import numpy as np

from dpsub_dist.engine.progress import Progress


def tree_sum(nodes: Sequence[Any], combine: Callable[[Any, Any], Any], built: list | None = None):
    """Binary tree of ``combine`` over ``nodes`` (depth ⌈log₂ n⌉); returns the root.

    Every node it creates is appended to ``built`` (to track progress), if given.
    """
    level = list(nodes)
    if not level:
        raise ValueError("nothing to reduce")
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if built is not None:
            built.extend(paired)
        level = paired + level[len(paired) * 2 :]
    return level[0]


def gather_summaries(
    client: Any | None,
    tasks: Sequence[Any],
    outputs: Sequence[Any],
    subsets: int,
    label: str,
    progress: bool,
    rows: int | None = None,
) -> np.ndarray:
    """Compute ``outputs`` (each an ``(ids, block)`` of summaries) into one t×out_dim array.

    On a cluster each output is placed as it arrives and then dropped, so the driver holds
    the summaries once (4 GB at t = 676, q = 8, d = 10⁵), not a list of blocks plus a table.
    """
    table: np.ndarray | None = None

    def place(result: tuple[np.ndarray, np.ndarray]) -> None:
        nonlocal table
        ids, block = result
        if len(ids):
            if table is None:
                table = np.empty((subsets, block.shape[1]))
            table[ids] = block

    if client is None:
        for result in compute_in_process(*outputs):
            place(result)
    else:
        compute_on_cluster(client, tasks, outputs, label, progress, on_output=place, rows=rows)
    assert table is not None, "every subset has a summary"
    return table


def compute_in_process(*tasks: Any) -> tuple:
    """Dask's thread pool with one BLAS thread per task, as on a worker: many small
    factorisations run far slower when each also starts a BLAS thread pool."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return dask.compute(*tasks, scheduler="threads")


def compute_on_cluster(
    client: Any,
    tasks: Sequence[Any],
    outputs: Sequence[Any],
    label: str,
    progress: bool,
    on_output: Callable[[Any], None] | None = None,
    rows: int | None = None,
) -> list:
    """Run ``tasks`` and ``outputs`` on the cluster and gather only ``outputs``.

    Progress (:class:`~dpsub_dist.engine.progress.Progress`) counts finished tasks, with
    an estimated rows/s when ``rows`` (public n) is given. Finished futures are dropped as
    they complete, so the workers free each intermediate result once its dependents have
    run. A worker's error is re-raised here with its own message. With ``on_output``, each
    output is handed to it as it arrives (then dropped) and the list returned is empty.
    """
    from contextlib import nullcontext

    from distributed import as_completed

    futures = client.compute([*tasks, *outputs])
    output_futures = futures[len(tasks) :]
    output_keys = {f.key for f in output_futures}
    if on_output is not None:
        output_futures = []
    total = len(futures)
    pending = as_completed(futures)
    del futures
    with Progress(total, label, rows) if progress else nullcontext() as bar:
        for done, future in enumerate(pending, start=1):
            if future.status == "error":
                future.result()
            if on_output is not None and future.key in output_keys:
                on_output(future.result())
            if bar is not None:
                bar.update(done)
            del future
    return client.gather(output_futures)
