"""Private noise seeds never enter a Dask task graph (exact and gibbs), on a real cluster.

The scheduler sees every task's key and run spec (the dashboard shows them, a failed
task's repr is logged): a private seed there is as public as a log line. We run each
method with a planted private seed and grep everything the scheduler was given for it,
in decimal and hex (the recorder is the one tests/privacy/test_secrets.py uses).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_secrets import TaskRecorder

from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import ClusterConfig, EstimateConfig, run_cluster, run_estimate

PRIVATE_SEED = 0x7E57_5EED_0F_DEAD_BEEF_1DEA_5EC2
"""A planted private noise seed, distinctive in decimal and hex."""


@pytest.fixture()
def recorder(dask_cluster):
    seen = TaskRecorder()
    dask_cluster.scheduler.add_plugin(seen, name=seen.name)
    yield seen
    dask_cluster.scheduler.remove_plugin(name=seen.name)


def _assert_seed_absent(texts: list[str]) -> None:
    assert texts, "the scheduler plugin saw no tasks"
    joined = "\n".join(texts)
    for form in (str(PRIVATE_SEED), f"{PRIVATE_SEED:x}", f"{PRIVATE_SEED:X}"):
        assert form not in joined, "the private seed is in a task spec"


def test_exact_seed_stays_off_the_graph(dask_client, recorder):
    rng = np.random.default_rng(1)
    basis = np.linalg.qr(rng.standard_normal((6, 2)))[0]
    rows = rng.standard_normal((30, 2)) @ basis.T
    config = EstimateConfig(rank=2, epsilon=2.0, delta=1e-6, method="exact")
    result = run_estimate(
        config, lambda client: array_dataset(rows), dask_client, noise_seed=PRIVATE_SEED
    )
    assert result.manifest["release"]["noise_scale"] > 0
    _assert_seed_absent(recorder.texts)


def test_gibbs_seed_stays_off_the_graph(dask_client, recorder):
    rows = np.random.default_rng(2).standard_normal((200, 4))
    config = ClusterConfig(clusters=2, rank=1, epsilon=5.0, delta=1e-6, method="gibbs", sweeps=2)
    result = run_cluster(
        config, lambda client: array_dataset(rows), dask_client, noise_seed=PRIVATE_SEED
    )
    assert result.basis.shape == (2, 4, 1)
    _assert_seed_absent(recorder.texts)
