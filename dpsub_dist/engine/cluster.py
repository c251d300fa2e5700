"""Start a local multi-process Dask cluster sized to the machine, or connect to one."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dpsub_dist.errors import DpsubError, InputError, RunAborted

if TYPE_CHECKING:
    from distributed import Client


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


@contextlib.contextmanager
def _workers_lost() -> Iterator[None]:
    """A task whose workers kept dying (Dask's ``KilledWorker``: the OOM killer, a crash) ends
    the run as RunAborted (exit 5), nothing written; under the ledger it stays reserved and
    its run id resumes. One lost worker is not this: Dask reruns its tasks on the others."""
    from distributed import KilledWorker

    try:
        yield
    except KilledWorker:
        raise RunAborted(
            "Dask workers died running the same task (killed: out of memory?): nothing was "
            "written or released; give the workers more memory (--memory-limit, or dask "
            "worker --memory-limit) or smaller partitions, and re-run"
        ) from None


WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": 128 * 2**20, "MALLOC_MMAP_THRESHOLD_": 128 * 2**20}
"""glibc settings for the local cluster's worker processes (Dask's pre-spawn environment; an
operator's own environment variables win). Dask sets ``MALLOC_TRIM_THRESHOLD_=65536``, and
setting it turns off glibc's adaptive mmap threshold: every array over 128 KiB becomes a
fresh ``mmap`` that page-faults anew, a quarter of a default full-pass task's time at D = 32
(docs/history.md, "Where the time goes"). Here arrays up to 128 MiB come from the heap and up
to 128 MiB of freed heap stays with each worker."""


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
def dask_client(
    scheduler: str | None = None,
    quiet: bool = False,
    workers: int | None = None,
    memory_limit: str | None = None,
) -> Iterator:
    """A distributed Client: to ``scheduler`` if given, else to a new local process cluster.

    ``memory_limit`` (a size per worker, Dask's notation: ``1GiB``, ``500MB``) sizes the
    local cluster's workers; default 80 % of the machine's memory shared among them. It has
    no meaning for a running cluster.
    """
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
                f"cannot reach the Dask scheduler at {scheduler} ({err}): "
                "check the address or omit --scheduler to start a local cluster"
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
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):  # read by each nanny
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
        )
    try:
        with Client(cluster) as client:
            if not quiet:
                print(
                    f"local Dask cluster: {n_workers} workers, {_dashboard(client)}",
                    file=sys.stderr,
                )
            with _workers_lost():
                yield client
    finally:
        cluster.close()


__all__ = ["dask_client", "DpsubError"]
