"""The friendly core test releases ⊥ whenever its private lower bound L on the core weight
is below t/4 (ALGORITHMS.md §3 step 2), not only when L ≤ 0: with L ≥ t/4 the Gaussian
sensitivity 16r/L is what the privacy argument assumes; a smaller positive L would be
accepted with too little noise for the weights that pass.

One tight cluster of m points among t, the rest far apart: each core point has m friends,
weight (m − (t/2 + 1))/(t/2), so W = m·(m − t/2 − 1)/(t/2). With ε₁ = 50 the Laplace
noise on W is below 1 with probability 1 − e^{−600}, so L = W − 4/ε₁·ln(1/2δ) − 4 ± 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpsub_dist.privacy.accountant import ApproxDP
from dpsub_dist.privacy.friendly import friendly_core_average

T, DIM, DELTA = 400, 3, 1e-6


def _points(cluster: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    far = rng.standard_normal((T - cluster, DIM)) * 1e3 + np.arange(T - cluster)[:, None] * 1e4
    return np.vstack([np.zeros((cluster, DIM)), far])


def _release(cluster: int):
    return friendly_core_average(
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
