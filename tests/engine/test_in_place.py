"""The in-place route for contiguous subsets: same summaries as the shuffle, no row shuffle."""

from __future__ import annotations

import numpy as np
import pytest

from dpsub_dist.engine.in_place import compute_subset_summaries_in_place, subset_starts
from dpsub_dist.engine.sources import Dataset, array_dataset
from dpsub_dist.engine.subsets import SubsetPlan, compute_subset_summaries
from dpsub_dist.methods._sample_aggregate import ProjectedReferenceStep


def _split(data: np.ndarray, sizes: list[int]) -> Dataset:
    """The array as partitions of the given sizes (zeros allowed)."""
    dataset = array_dataset(data)
    cuts = np.cumsum([0, *sizes])
    dataset.parts = [data[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    dataset.offsets = [int(c) for c in cuts[:-1]]
    return dataset


def test_subset_starts_match_the_contiguous_assignment():
    from dpsub_dist.engine.assign import contiguous_row_subsets

    for n, t in [(10, 3), (1000, 7), (12, 12), (100_003, 676)]:
        starts = subset_starts(n, t)
        subset = contiguous_row_subsets(np.arange(n), n, t)
        assert starts[0] == 0 and starts[-1] == n
        np.testing.assert_array_equal(np.searchsorted(subset, np.arange(t + 1)), starts)


@pytest.mark.parametrize(
    "sizes",
    [
        [2_000],  # one partition holds every subset
        [700, 0, 1_300],  # an empty partition between two
        [37] * 54 + [2],  # partitions smaller than a subset: most subsets cross several
        [1_999, 1],
    ],
)
def test_in_place_equals_row_shuffle_exactly(sizes):
    rng = np.random.default_rng(3)
    basis = np.linalg.qr(rng.standard_normal((11, 3)))[0]
    data = rng.standard_normal((2_000, 3)) @ basis.T + 0.05 * rng.standard_normal((2_000, 11))
    dataset = _split(data, sizes)
    plan = SubsetPlan(subsets=23, n_rows=2_000, seed=5, assign="contiguous", buckets=4)
    step = ProjectedReferenceStep(rank=3, dim=11, ref_points=5, seed=5)
    args = (dataset.parts, dataset.offsets, dataset.loader, plan, step)
    in_place = compute_subset_summaries_in_place(*args)
    shuffled = compute_subset_summaries(*args)
    assert in_place.shape == (23, 55) and np.abs(in_place).sum(axis=1).min() > 0
    np.testing.assert_array_equal(in_place, shuffled)


def test_in_place_refuses_hashed_subsets():
    dataset = array_dataset(np.ones((10, 3)))
    step = ProjectedReferenceStep(rank=1, dim=3, ref_points=2, seed=0)
    for plan in (
        SubsetPlan(subsets=2, n_rows=10, seed=0),
        SubsetPlan(subsets=2, n_rows=10, seed=0, assign="contiguous", user_level=True),
    ):
        with pytest.raises(ValueError, match="contiguous"):
            compute_subset_summaries_in_place(
                dataset.parts, dataset.offsets, dataset.loader, plan, step
            )


def test_contiguous_estimate_runs_in_place_on_the_cluster(small_dataset, dask_client):
    """End to end on the multi-process cluster: the route is recorded and the basis is good."""
    from dpsub_dist.api import PrivateSubspace
    from dpsub_dist.linalg import subspace_error
    from dpsub_dist.synth import read_truth

    est = PrivateSubspace(
        2, epsilon=1.0, delta=1e-6, seed=3, assign="contiguous", client=dask_client
    ).fit(str(small_dataset.path))
    assert est.manifest_["parameters"]["local_route"] == "subsets in place"
    assert est.manifest_["parameters"]["shuffle_buckets"] is None
    truth, _ = read_truth(small_dataset.path)
    assert subspace_error(est.basis_, truth) < 0.2
