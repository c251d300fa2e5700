"""The local cluster's worker processes: glibc heap settings that keep arrays off fresh mmaps."""

from __future__ import annotations

import os

import dask
import distributed  # noqa: F401  (loads Dask's distributed config)
import pytest

from dpsub_dist.engine import cluster


def _worker_environ(client) -> dict[str, str | None]:
    seen = client.run(lambda: {name: os.environ.get(name) for name in cluster.WORKER_MALLOC})
    (environ,) = seen.values()
    return environ


def test_local_workers_start_with_the_heap_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dask's own MALLOC_TRIM_THRESHOLD_=65536 (which also fixes glibc's mmap threshold at
    128 KiB) is replaced in the workers' environment, and Dask's config is left as it was."""
    for name in cluster.WORKER_MALLOC:  # a nanny started earlier in this process sets them
        monkeypatch.delenv(name, raising=False)
    before = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    with cluster.dask_client(quiet=True, workers=1, memory_limit="1GiB") as client:
        environ = _worker_environ(client)
    assert environ == {name: str(value) for name, value in cluster.WORKER_MALLOC.items()}
    assert dask.config.get("distributed.nanny.pre-spawn-environ") == before


def test_an_operators_own_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    with cluster.dask_client(quiet=True, workers=1, memory_limit="1GiB") as client:
        environ = _worker_environ(client)
    assert environ["MALLOC_TRIM_THRESHOLD_"] == "65536"
    assert environ["MALLOC_MMAP_THRESHOLD_"] == str(cluster.WORKER_MALLOC["MALLOC_MMAP_THRESHOLD_"])
