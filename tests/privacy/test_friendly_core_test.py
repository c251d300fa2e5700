"""The friendly core test releases ⊥ whenever its private lower bound L on the core weight
is below t/4 (ALGORITHMS.md §3 step 2), not only when L ≤ 0: with L ≥ t/4 the Gaussian
sensitivity 16r/L is what the privacy argument assumes; a smaller positive L would be
accepted with too little noise for the weights that pass.

One tight cluster of m points among t, the rest far apart: each core point has m friends,
weight (m − (t/2 + 1))/(t/2), so W = m·(m − t/2 − 1)/(t/2). With ε₁ = 50 the Laplace
noise on W is below 1 with probability 1 − e^{−600}, so L = W − 4/ε₁·ln(1/2δ) − 4 ± 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from dpsub_dist.privacy import friendly_core as friendly
from dpsub_dist.privacy.accountant import ApproxDP, Budget

T, DIM, DELTA = 400, 3, 1e-6


@dataclass(frozen=True)
class CoreRelease:
    """What the friendly core publishes: the mean (None for ⊥), Ŵ, L and the mean's σ."""

    point: np.ndarray | None
    noisy_weight: float
    weight_lower_bound: float
    sigma: float | None


def core_release(
    points: np.ndarray,
    radius: float,
    ptr_grant: Budget,
    gaussian_grant: Budget,
    rng: np.random.Generator,
    sq_dists: np.ndarray | None = None,
) -> CoreRelease:
    """The two friendly-core steps as the aggregator releases them (for tests and audits of
    the privacy functions): the core test, then, if it passed, the mean with the Gaussian
    calibrated for the test's L."""
    sq = friendly.pairwise_sq_distances(points) if sq_dists is None else sq_dists
    test = friendly.core_test_mechanism(ptr_grant)
    core = friendly.core_test(sq, radius, test, friendly.ptr_delta(ptr_grant), rng)
    if not core.passed:
        return CoreRelease(None, core.noisy_weight, core.lower_bound, None)
    noise = friendly.core_noise_mechanism(gaussian_grant, ptr_grant, radius, core.lower_bound)
    point = friendly.core_average(points, core, noise, rng)
    return CoreRelease(point, core.noisy_weight, core.lower_bound, noise.sigma)


def _points(cluster: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    far = rng.standard_normal((T - cluster, DIM)) * 1e3 + np.arange(T - cluster)[:, None] * 1e4
    return np.vstack([np.zeros((cluster, DIM)), far])


def _release(cluster: int):
    return core_release(
        _points(cluster),
        radius=1.0,
        ptr_grant=ApproxDP(50.0, DELTA),
        gaussian_grant=ApproxDP(1.0, DELTA),
        rng=np.random.default_rng(),
    )


@pytest.mark.parametrize("cluster", [262, 272])  # L ≈ 75 and 92: 0 < L < t/4 = 100
def test_positive_lower_bound_below_a_quarter_of_t_is_refused(cluster: int) -> None:
    release = _release(cluster)
    assert 0 < release.weight_lower_bound < T / 4
    assert release.point is None and release.sigma is None


@pytest.mark.parametrize("cluster", [280, 320])  # L ≈ 105 and 185: ≥ t/4
def test_lower_bound_above_a_quarter_of_t_releases(cluster: int) -> None:
    release = _release(cluster)
    assert release.weight_lower_bound >= T / 4
    assert release.point is not None and release.point.shape == (DIM,)
