"""Where a run's tasks execute: in this process, on a local multi-process Dask cluster sized to
the machine, or on a running cluster (``--scheduler``); chosen from public facts when not given.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from dpsub_dist.errors import DpsubError, InputError, RunAborted, did_you_mean

if TYPE_CHECKING:
    from distributed import Client

    from dpsub_dist.engine.compute import Executor
    from dpsub_dist.engine.sources import Dataset, Footers

IN_PROCESS_NAME = "in-process"
"""``--scheduler in-process``: Dask's threads in this process, no cluster."""
LOCAL_CLUSTER_NAME = "local-cluster"
"""``--scheduler local-cluster``: a new multi-process cluster on this machine."""
IN_PROCESS_BYTES = 64 * 2**20
"""The largest table (rows × features × 8 bytes, from the footers and the schema) run in this
process when no scheduler is named: a local cluster takes seconds to start, more than the
whole fit of such a table in process (docs/scale.md, "Small tables")."""
SCHEDULER_HELP = (
    f"where the tasks run: tcp://host:port of a running Dask scheduler, {LOCAL_CLUSTER_NAME} "
    f"(start one on this machine) or {IN_PROCESS_NAME} (Dask's threads in this process)"
)
"""The ``--scheduler`` help of every command that runs tasks, before its default."""
CHOSEN_DEFAULT = (
    f"default: in-process for a table of at most {IN_PROCESS_BYTES // 2**20} MiB as float64 "
    "(the footers' rows × the features × 8 bytes) at row level, else a local cluster"
)
"""The default of the commands that choose (:func:`run_place`, :func:`batch_place`)."""


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 2**30


def _limit_bytes(text: str) -> int:
    """Bytes of a ``--memory-limit`` such as ``1GiB``; InputError (exit 2) if not a size."""
    from dask.utils import parse_bytes

    try:
        value = parse_bytes(text)
    except (ValueError, TypeError):
        value = 0
    if value <= 0:
        raise InputError(
            f"--memory-limit must be a positive size (got {text!r}): pass e.g. 1GiB or 500MB"
        )
    return value


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """Silence ``logger`` for the block: a lost scheduler is reported once, as RunAborted."""
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


NO_WORKERS_TIMEOUT = "120s"
"""How long a local cluster's tasks wait with no worker running before they fail (Dask's
``distributed.scheduler.no-workers-timeout``). Its nannies restart a killed worker within
seconds; a worker that cannot unpickle a task (a module it cannot import) shuts down with its
nanny, and the run then ends instead of waiting forever. Not set for a ``--scheduler``
address: a cluster that scales from zero workers is the operator's to time out."""


@contextlib.contextmanager
def _workers_lost() -> Iterator[None]:
    """A task whose workers kept dying (Dask's ``KilledWorker``: the OOM killer, a crash), or
    that waited :data:`NO_WORKERS_TIMEOUT` with no worker at all (``NoWorkerError``), ends the
    run as RunAborted (exit 5), nothing written; under the ledger it stays reserved and its
    run id resumes. One lost worker is not this: Dask reruns its tasks on the others."""
    from distributed import KilledWorker
    from distributed.scheduler import NoWorkerError

    try:
        yield
    except KilledWorker:
        raise RunAborted(
            "Dask workers died running the same task (killed: out of memory?): nothing was "
            "written or released; give the workers more memory (--memory-limit, or dask "
            "worker --memory-limit) or smaller partitions, and re-run"
        ) from None
    except NoWorkerError as err:
        raise RunAborted(
            f"the Dask cluster has had no worker running for {err.timeout:.0f} s (they died or "
            "shut down and none came back: out of memory, or a worker that cannot import a "
            "task's modules?): nothing was written or released; check the workers' memory "
            "(--memory-limit) and environment, and re-run"
        ) from None


WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": 128 * 2**20, "MALLOC_MMAP_THRESHOLD_": 128 * 2**20}
"""glibc settings for the local cluster's worker processes (Dask's pre-spawn environment; an
operator's own environment variables win). Dask sets ``MALLOC_TRIM_THRESHOLD_=65536``, and
setting it turns off glibc's adaptive mmap threshold: every array over 128 KiB becomes a
fresh ``mmap`` that page-faults anew, a quarter of a default full-pass task's time at D = 32
(docs/history.md, "Where the time goes"). Here arrays up to 128 MiB come from the heap and up
to 128 MiB of freed heap stays with each worker."""


WORKER_SETUP = "dpsub_dist.engine.worker_setup"
"""Preloaded by each worker of a local cluster: its warnings go to the operator's diagnostics
file, not to the stderr it shares with the driver (published), and it ignores Ctrl-C, which
the driver handles."""


MATCHED_PACKAGES = ("dpsub_dist", "dask", "distributed")
"""What the client, the scheduler and every worker must run at one version: a task pickled
by one version and run by another fails in ways that name neither (deploy/README.md)."""


def check_versions(client: Client, scheduler: str) -> None:
    """InputError (exit 2) naming each package of :data:`MATCHED_PACKAGES` whose version on
    the scheduler or a worker differs from this process's; workers that join later are not
    checked."""
    versions = client.get_versions(packages=["dpsub_dist"])
    here = versions["client"]["packages"]
    remote = {"scheduler": versions["scheduler"]}
    remote |= {f"worker {address}": info for address, info in versions["workers"].items()}
    mismatches = []
    for package in MATCHED_PACKAGES:
        for where, info in remote.items():
            theirs = info.get("packages", {}).get(package) if isinstance(info, dict) else None
            if theirs != here[package]:
                mismatches.append(f"{package} {theirs or 'missing'} on the {where}")
    if mismatches:
        mine = ", ".join(f"{p} {here[p]}" for p in MATCHED_PACKAGES)
        raise InputError(
            f"version mismatch with the Dask cluster at {scheduler}: this client runs {mine} "
            f"but found {'; '.join(mismatches)}: run the client, scheduler and workers from "
            "one image or environment (deploy/README.md)"
        )


DASHBOARD_HINT = "no dashboard (pip install 'dpsub_dist[dashboard]' for one)"
"""What the banner says where Dask serves no dashboard: its page would only ask for bokeh."""


def _dashboard(client) -> str:
    """``dashboard <link>`` where Dask serves one, else :data:`DASHBOARD_HINT`. The test is
    Dask's own (its scheduler falls back to a "needs bokeh" page when this import fails)."""
    try:
        import distributed.dashboard.scheduler  # noqa: F401  (needs bokeh>=3.1)
    except ImportError:
        return DASHBOARD_HINT
    return f"dashboard {client.dashboard_link}"


@contextlib.contextmanager
def run_place(
    scheduler: str | None,
    open_dataset: Callable[[Executor], Dataset],
    n_public: bool,
    quiet: bool = False,
    workers: int | None = None,
    memory_limit: str | None = None,
) -> Iterator[tuple[Any | None, Callable[[Executor], Dataset]]]:
    """The client of :func:`dask_client` (None: in process) and how to open the dataset there.

    With no ``scheduler`` named (and no ``workers`` or ``memory_limit``, which size a local
    cluster) and ``n_public`` (row level: the footers' row count is public), the dataset is
    opened here (its footers, and a variable list column's first row as a run reads it)
    and its size chooses: in process up to
    :data:`IN_PROCESS_BYTES`, else a local cluster, which is handed the dataset already
    opened. At user level the row count is private and the cluster is started as before:
    the choice, printed, would publish a function of it.
    """
    if scheduler or workers or memory_limit or not n_public:
        with dask_client(scheduler, quiet, workers, memory_limit) as client:
            yield client, open_dataset
        return
    from dpsub_dist.engine.compute import IN_PROCESS

    dataset = open_dataset(IN_PROCESS)
    scheduler, why = chosen_scheduler(dataset)
    with dask_client(scheduler, quiet, why=why) as client:
        yield client, lambda _executor: dataset


@contextlib.contextmanager
def batch_place(
    scheduler: str | None,
    uri: str,
    columns: list[str] | None,
    storage_options: Any,
    quiet: bool = False,
    workers: int | None = None,
) -> Iterator[tuple[Any | None, Footers | None]]:
    """:func:`run_place` for a stream's batch (row level): the client, and the footers it
    was chosen from (None: not read here), to hand to the append so it reads them once.

    The choice reads the footers only: the first row of a list column is read inside the
    append, where a failure is charged. A footer that cannot be read leaves the choice to a
    local cluster, as before, and the append raises the error in its own order of checks.
    """
    if scheduler or workers:
        with dask_client(scheduler, quiet, workers) as client:
            yield client, None
        return
    from dpsub_dist.engine.compute import IN_PROCESS
    from dpsub_dist.engine.sources import read_footers

    footers: Footers | None
    why: str | None
    try:
        footers = read_footers(uri, storage_options, IN_PROCESS)
        scheduler, why = footers_choice(footers, columns)
    except DpsubError:
        footers, why = None, None
    with dask_client(scheduler, quiet, why=why) as client:
        yield client, footers


def check_scheduler(scheduler: str | None) -> None:
    """InputError (exit 2) for a ``--scheduler`` that is neither a name nor an address."""
    names = (IN_PROCESS_NAME, LOCAL_CLUSTER_NAME)
    if scheduler and scheduler not in names and ":" not in scheduler:
        raise InputError(
            f"--scheduler {scheduler!r} is not an address or a name{did_you_mean(scheduler, names)}"
            f": pass tcp://host:port, {LOCAL_CLUSTER_NAME} or {IN_PROCESS_NAME}"
        )


def chosen_scheduler(dataset: Dataset) -> tuple[str, str]:
    """:data:`IN_PROCESS_NAME` or :data:`LOCAL_CLUSTER_NAME` for ``dataset`` and why, from
    public facts only: the footers' row count (row level) and the schema's width. A width
    read from a row (a variable list column) is not public: a local cluster."""
    if dataset.widths_from_rows:
        return LOCAL_CLUSTER_NAME, LIST_WIDTH_REASON
    return size_choice(dataset.n_rows, dataset.dim)


LIST_WIDTH_REASON = "the width of a list column is read from its rows"


def footers_choice(footers: Footers, columns: list[str] | None) -> tuple[str, str]:
    """:func:`chosen_scheduler` from the footers alone (no row read): for a stream's batch,
    whose first row is read inside the append, where a failure is charged."""
    chosen = footers.columns(columns)
    if chosen.from_rows:
        return LOCAL_CLUSTER_NAME, LIST_WIDTH_REASON
    return size_choice(footers.n_rows, chosen.fixed_features)


def size_choice(n_rows: int, dim: int) -> tuple[str, str]:
    """In process up to :data:`IN_PROCESS_BYTES` of float64 rows, else a local cluster, and
    why (printed: ``n_rows`` must be public, as the footers' count is at row level)."""
    from dask.utils import format_bytes

    size = n_rows * dim * 8
    shown = f"{n_rows:,} rows × {dim} features = {format_bytes(size)} as float64"
    if size <= IN_PROCESS_BYTES:
        return IN_PROCESS_NAME, f"{shown} ≤ {format_bytes(IN_PROCESS_BYTES)}"
    return LOCAL_CLUSTER_NAME, f"{shown} > {format_bytes(IN_PROCESS_BYTES)}"


@contextlib.contextmanager
def dask_client(
    scheduler: str | None = None,
    quiet: bool = False,
    workers: int | None = None,
    memory_limit: str | None = None,
    why: str | None = None,
) -> Iterator[Any | None]:
    """A distributed Client: to ``scheduler`` if an address, else to a new local process
    cluster (``local-cluster`` or None); None for ``in-process``. ``why`` (the automatic
    choice's reason, :func:`chosen_scheduler`) goes into the banner.

    ``memory_limit`` (a size per worker, Dask's notation: ``1GiB``, ``500MB``) sizes the
    local cluster's workers; default 80 % of the machine's memory shared among them. It has
    no meaning for a running cluster, nor does ``workers`` in process.
    """
    check_scheduler(scheduler)
    if scheduler == IN_PROCESS_NAME:
        if workers or memory_limit:
            raise InputError(
                "--workers and --memory-limit size a local cluster: omit them with "
                f"--scheduler {IN_PROCESS_NAME}, or pass --scheduler {LOCAL_CLUSTER_NAME}"
            )
        if not quiet:
            chosen = f"{why}; --scheduler {LOCAL_CLUSTER_NAME} starts one" if why else ""
            print(f"in process, no cluster ({chosen or '--scheduler in-process'})", file=sys.stderr)
        yield None
        return
    if scheduler == LOCAL_CLUSTER_NAME:
        scheduler = None
    import dask
    from distributed import Client, LocalCluster

    if scheduler and memory_limit:
        raise InputError(
            "--memory-limit sizes the workers of a local cluster: set it on the workers of "
            f"the cluster at {scheduler} (dask worker --memory-limit) or omit --scheduler"
        )
    limit = _limit_bytes(memory_limit) if memory_limit is not None else None
    if scheduler:
        try:
            client = Client(scheduler, timeout="15s")
        except (OSError, TimeoutError) as err:
            raise InputError(
                f"cannot reach the Dask scheduler at {scheduler} ({err}): check the address, "
                f"or pass --scheduler {LOCAL_CLUSTER_NAME} to start a local cluster"
            ) from None
        with _quiet(logging.getLogger("distributed.client")), client:
            check_versions(client, scheduler)
            try:
                with _workers_lost():
                    yield client
            except Exception as err:
                if isinstance(err, DpsubError) or client.status == "running":
                    raise
                raise RunAborted(
                    f"lost the Dask scheduler at {scheduler} mid-run ({type(err).__name__}): "
                    "nothing was written or released; check the cluster and re-run"
                ) from None
        return
    n_workers = workers or max(1, os.cpu_count() or 1)
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ"), **WORKER_MALLOC}
    settings = {
        "distributed.nanny.pre-spawn-environ": environ,  # read by each nanny
        "distributed.scheduler.no-workers-timeout": NO_WORKERS_TIMEOUT,  # by the scheduler
    }
    worker_preloads = list(dask.config.get("distributed.worker.preload", None) or [])
    with dask.config.set(settings):
        cluster = LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=limit or int(_memory_bytes() * 0.8 / n_workers),
            dashboard_address="127.0.0.1:0",
            host="127.0.0.1",
            # A failed task's error reaches the user once, as the CLI's one-line message;
            # the workers' own "Compute Failed" log lines (with tracebacks) would repeat it.
            silence_logs=logging.CRITICAL,
            # Warnings to the diagnostics file; Ctrl-C ignored (the driver handles it).
            preload=[*worker_preloads, WORKER_SETUP],
        )
    try:
        with Client(cluster) as client:
            if not quiet:
                reason = f" ({why})" if why else ""
                print(
                    f"local Dask cluster: {n_workers} workers{reason}, {_dashboard(client)}",
                    file=sys.stderr,
                )
            with _workers_lost():
                yield client
    finally:
        cluster.close()


__all__ = ["dask_client", "run_place", "DpsubError"]
