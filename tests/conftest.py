"""Shared fixtures: one real multi-process Dask cluster and small synthetic datasets."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DASK_DISTRIBUTED__WORKER__DAEMON", "False")


@pytest.fixture(scope="session")
def dask_cluster():
    """A LocalCluster with 2 worker *processes* on 127.0.0.1, shared by the session."""
    from distributed import LocalCluster

    cluster = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        memory_limit="4GiB",
    )
    yield cluster
    cluster.close()


@pytest.fixture()
def dask_client(dask_cluster):
    """A Client on the shared cluster."""
    from distributed import Client

    with Client(dask_cluster) as client:
        yield client


@pytest.fixture(scope="session")
def scheduler_address(dask_cluster) -> str:
    """tcp:// address of the shared cluster, for ``dpsub ... --scheduler``."""
    return dask_cluster.scheduler_address


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """20,000 × 10 float32 rows near a rank-2 subspace (γ = 0.01), 4 files, truth saved."""
    from dpsub_dist.synth import generate

    out = tmp_path_factory.mktemp("data") / "small"
    return generate(out, rows=20_000, dim=10, rank=2, gamma=0.01, partitions=4, seed=7)
