"""Running engine graphs: in-process or on a cluster, with only the outputs gathered.

:class:`Executor` is the one place that tells the two apart (tests/engine/test_executor_only.py
fails on a ``client is None`` branch anywhere else). The lowest layer of the engine:
:mod:`dpsub_dist.engine.gram`, :mod:`dpsub_dist.engine.subsets` and the subset routes
import it, and it imports none of them (no import cycle by construction).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
from dask.callbacks import Callback
from dask.system import CPU_COUNT
from dask.threaded import get as threaded_get

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


def fold_per_thread(
    parts: Sequence[Any],
    fold: Callable[[Any, Any], Any],
    add: Callable[[Any, Any], Any],
    executor: Executor,
    built: list,
) -> Any:
    """Σ over ``parts`` with one accumulator per thread that runs tasks: each thread's chain
    ``acc = fold(acc, part)`` (``acc`` None at its head) folds its share of the partitions in
    one after the other, its tasks placed on that thread's worker (:func:`placed_on`), then
    the chains' accumulators are added in a tree of ``add``. Returns the root; every node is
    appended to ``built``.

    A worker then holds one accumulator per thread (plus, at a tree node, the one it receives),
    whatever the number of partitions: a tree over the partitions' own summaries held every
    summary that waited for its partner (about seven 800 MB Grams a worker at D = 10⁴).
    Partitions held on a worker (:mod:`~dpsub_dist.engine.row_cache`) go to that worker's
    chains, the others in consecutive runs. ``fold`` and ``add`` may update their first
    argument in place: each accumulator is the input of exactly one task.
    """
    slots = executor.threads
    chains: list[list[int]] = [[] for _ in slots]
    unheld = []
    for index, holder in enumerate(executor.holders(parts)):
        mine = [i for i, slot in enumerate(slots) if slot is not None and slot == holder]
        if mine:
            shortest = min(mine, key=lambda i: len(chains[i]))
            chains[shortest].append(index)
        else:
            unheld.append(index)
    for slot, run in enumerate(np.array_split(np.array(unheld, dtype=int), len(slots))):
        chains[slot].extend(run.tolist())
    heads = []
    for slot, chain in zip(slots, chains, strict=True):
        if not chain:
            continue
        with placed_on(slot):
            acc = None
            for index in chain:
                acc = fold(acc, parts[index])
                built.append(acc)
        heads.append(acc)
    return tree_sum(heads, add, built)


def placed_on(address: str | None) -> AbstractContextManager:
    """Tasks built inside run on the worker at ``address`` while it lives, anywhere once it
    is gone (Dask's loose restriction: a lost worker's chain is recomputed elsewhere, never
    left waiting); nothing in process (``address`` None)."""
    if address is None:
        return nullcontext()
    return dask.annotate(workers=[address], allow_other_workers=True)


def gather_summaries(
    executor: Executor,
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

    executor.run(tasks, outputs, label, progress, on_output=place, rows=rows)
    assert table is not None, "every subset has a summary"
    return table


@dataclass(frozen=True)
class Executor:
    """Where a run's tasks execute: Dask's threads in this process (``client`` None) or the
    cluster of a ``distributed.Client``. Every engine function takes one; the edges (CLI,
    Python API, job files) hand the user's optional client to the runner, which wraps it.

    Progress counts finished tasks either way (:class:`_CountTasks` in process).
    """

    client: Any | None = None

    @classmethod
    def of(cls, where: Executor | Any | None) -> Executor:
        """``where`` itself if it is an Executor, else the Executor of that client (None:
        in process). Only for :func:`~dpsub_dist.engine.sources.parquet_dataset`, which scripts,
        benchmarks and tests call with a bare client or None."""
        return where if isinstance(where, Executor) else cls(where)

    @property
    def workers(self) -> int:
        """How many workers share the tasks (1 in process): the cluster's size, public."""
        return 1 if self.client is None else len(self.client.scheduler_info()["workers"])

    @property
    def threads(self) -> list[str | None]:
        """One entry per thread that runs tasks: its worker's address on a cluster, None for
        each thread of Dask's pool in process (public: the cluster's configuration)."""
        if self.client is None:
            return [None] * int(dask.config.get("num_workers", None) or CPU_COUNT)
        workers = self.client.scheduler_info()["workers"]
        return [address for address, info in workers.items() for _ in range(info["nthreads"])]

    def holders(self, parts: Sequence[Any]) -> list[str | None]:
        """The worker that holds each of ``parts`` (persisted by :meth:`persist`; waits until
        they are), None for a part that is not held there (or in process)."""
        if self.client is None:
            return [None] * len(parts)
        from distributed import futures_of, wait

        futures = [futures_of(part) for part in parts]
        held = [found[0] for found in futures if len(found) == 1]
        if not held:
            return [None] * len(parts)
        wait(held)
        where = self.client.who_has(held)
        return [
            next(iter(where.get(f[0].key) or ()), None) if len(f) == 1 else None for f in futures
        ]

    @property
    def shuffle_method(self) -> str:
        """Dask's shuffle for a DataFrame: P2P needs the distributed scheduler."""
        return "tasks" if self.client is None else "p2p"

    @property
    def memory_limit(self) -> int | None:
        """The workers' memory limits summed, in bytes: a fact of the cluster's configuration,
        public. None in process; 0 where a worker has no limit (nothing known to be free)."""
        if self.client is None:
            return None
        limits = [w.get("memory_limit") for w in self.client.scheduler_info()["workers"].values()]
        return int(sum(limits)) if limits and all(limits) else 0

    def persist(self, tasks: Sequence[Any]) -> list:
        """``tasks`` computed and held where they ran (the workers' memory on a cluster, this
        process otherwise), as delayed values that later graphs take as inputs: nothing
        reaches the driver. Dropping the returned list frees them."""
        if self.client is None:
            return list(compute_in_process(*tasks, how=dask.persist))
        return list(self.client.persist(list(tasks)))

    def place(self, blocks: list[Any]) -> list:
        """In-memory ``blocks`` where the tasks run: scattered to the workers once on a
        cluster (each pass's graph then names them instead of carrying the rows through the
        scheduler again; random keys, no hash of the data), as they are in process."""
        if self.client is None or not blocks:
            return blocks
        return self.client.scatter(blocks, hash=False)

    def map(self, function: Callable[..., Any], items: Sequence[Any], **kwargs: Any) -> list:
        """``[function(item, **kwargs) for item in items]``: one task per item on a cluster, on
        up to :data:`MAP_THREADS` threads in process (it maps reads: footers, first rows)."""
        if self.client is None:
            if len(items) <= 1:
                return [function(item, **kwargs) for item in items]
            with ThreadPoolExecutor(max_workers=min(MAP_THREADS, len(items))) as pool:
                return list(pool.map(lambda item: function(item, **kwargs), items))
        return self.client.gather(self.client.map(function, items, **kwargs))

    def run(
        self,
        tasks: Sequence[Any],
        outputs: Sequence[Any],
        label: str,
        progress: bool,
        on_output: Callable[[Any], None] | None = None,
        rows: int | None = None,
    ) -> list:
        """Compute the delayed ``outputs`` and bring only them to the driver (``tasks``: the
        graph's other nodes, which progress counts); with ``on_output`` each is handed to it
        (:func:`compute_on_cluster`) and the list returned is empty."""
        if self.client is not None:
            return compute_on_cluster(self.client, tasks, outputs, label, progress, on_output, rows)
        with _CountTasks(label, rows) if progress else nullcontext():
            results = list(compute_in_process(*outputs))
        if on_output is None:
            return results
        for result in results:
            on_output(result)
        return []

    def gather(self, tasks: Sequence[Any], label: str) -> list:
        """Compute the delayed ``tasks`` and bring their results to the driver."""
        return self.run([], tasks, label, False)

    def compute(self, root: Any, tasks: Sequence[Any], label: str, progress: bool) -> Any:
        """The value of the delayed ``root`` (the root of a reduction over ``tasks``): only
        it reaches the driver."""
        others = [t for t in tasks if t is not root]
        return self.run(others, [root], label, progress)[0]


IN_PROCESS = Executor()
"""Dask's threads in this process: the engine's default."""

MAP_THREADS = 16
"""Reads :meth:`Executor.map` runs at once in process (object stores answer each request
slowly but in parallel)."""


class _CountTasks(Callback):
    """Progress of an in-process compute: Dask's local scheduler reports each finished task
    (its callbacks run in the calling thread), counted as on a cluster."""

    def __init__(self, label: str, rows: int | None) -> None:
        self.label, self.rows = label, rows
        self.bar: Progress | None = None

    def _start_state(self, dsk: Any, state: dict) -> None:
        total = sum(len(state[k]) for k in ("ready", "waiting", "running", "finished"))
        self.bar = Progress(total, self.label, self.rows).__enter__()

    def _posttask(self, key: Any, result: Any, dsk: Any, state: dict, worker_id: Any) -> None:
        if self.bar is not None:
            self.bar.update(len(state["finished"]))

    def _finish(self, dsk: Any, state: dict, failed: bool) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def compute_in_process(*tasks: Any, how: Callable[..., tuple] = dask.compute) -> tuple:
    """Dask's thread pool with one BLAS thread per task, as on a worker: many small
    factorisations run far slower when each also starts a BLAS thread pool. ``how``:
    ``dask.compute`` (the values) or ``dask.persist`` (held, as delayed values)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return how(*tasks, scheduler=threaded_get)


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
