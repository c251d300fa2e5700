"""Dask's P2P shuffle as the row route's engine (issue 16): the same summaries as the
bucket shuffle, on a real multi-process cluster, empty subsets included."""

from __future__ import annotations

import numpy as np

from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.p2p import compute_subset_summaries_p2p
from dpsub_dist.engine.subsets import SubsetPlan, compute_subset_summaries
from dpsub_dist.methods._sample_aggregate import ProjectedReferenceStep


def test_p2p_shuffle_gives_the_bucket_shuffles_summaries(dask_client):
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((1_000, 12)).astype(np.float32).astype(np.float64)
    parts = [rows[i : i + 300] for i in range(0, 1_000, 300)]
    offsets = list(range(0, 1_000, 300))
    plan = SubsetPlan(subsets=240, n_rows=1_000, seed=2, buckets=3)  # some subsets empty
    step = ProjectedReferenceStep(rank=2, dim=12, ref_points=3, seed=2)
    args = (parts, offsets, lambda block: (block, None), plan, step)
    expected = compute_subset_summaries(*args)
    counts = np.bincount(plan.subset_of(np.arange(1_000), None), minlength=240)
    assert (counts == 0).any() and (counts >= 2).any()
    on_cluster = compute_subset_summaries_p2p(*args, Executor(dask_client))
    np.testing.assert_array_equal(on_cluster, expected)
    np.testing.assert_array_equal(compute_subset_summaries_p2p(*args), expected)  # in process
