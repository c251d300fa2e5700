"""The private bound's quantile rule (privacy/norm_bound.py, noise_matched_quantile): the
clipped fraction follows the release's noise level, so a run at a large ε clips no rows that
carry a principal direction, where the fixed 0.99 quantile left a clipping floor."""

from __future__ import annotations

import numpy as np
import pytest

from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error


def spiked_rows(n: int = 200_000, dim: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Known answer: the top direction e₀ lives in 0.5% of the rows (±20, variance 2), the second
    is N(0, 1.5), the rest N(0, 0.3²). Truth span(e₀, e₁). Clipping at the 0.99 quantile of the
    norms (≈ 3) cuts e₀'s variance to ≈ 0.05: the estimate loses it (error ≈ 1)."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n, dim)) * 0.3
    rows[:, 1] = rng.normal(0.0, np.sqrt(1.5), n)
    rows[:, 0] = np.where(rng.random(n) < 0.005, rng.choice([-20.0, 20.0], n), 0.0)
    return rows, np.eye(dim)[:, :2]


def test_large_epsilon_bound_covers_the_rare_rows_of_a_principal_direction() -> None:
    rows, truth = spiked_rows()
    config = EstimateConfig(2, epsilon=10.0, delta=1e-6, method="gauss")  # no row_norm
    result = run_estimate(config, lambda client: array_dataset(rows), None)
    error, parameters = subspace_error(result.basis, truth), result.manifest["parameters"]
    assert parameters["row_norm"] >= 20.0, parameters["row_norm"]  # the spikes are not clipped
    assert error < 0.1, error  # the fixed 0.99 quantile: B = 4, error ≈ 1
    assert "q = 0.99" in parameters["row_norm_source"]  # the public quantile is published


@pytest.mark.parametrize("dim", [8, 64])
def test_quantile_rises_with_epsilon_and_n_from_public_values_only(dim) -> None:
    from dpsub_dist.privacy.norm_bound import noise_matched_quantile

    qs = [noise_matched_quantile(10**5, dim, 8.0 / e, 0.1 * e) for e in (1.0, 3.0, 10.0)]
    assert qs[0] < qs[1] < qs[2] < 1.0, qs
    assert noise_matched_quantile(10**6, dim, 8.0, 0.1) > qs[0]
    assert noise_matched_quantile(100, dim, 8.0, 0.1) == 0.5  # tiny n: never below the median
