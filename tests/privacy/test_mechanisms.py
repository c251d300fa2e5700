"""Noise calibration of the core mechanisms against the formulas of ALGORITHMS.md §2–§4.

Every sampler call is recorded (:func:`privacy.noise.draw_log`), so the tests check the
scale actually drawn, not a helper's return value.
"""

from __future__ import annotations

import math
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest
from test_friendly_core_test import core_release

from dpsub_dist.privacy import friendly_core as friendly
from dpsub_dist.privacy import histogram_cells as histogram
from dpsub_dist.privacy import mechanism, noise, sparse_vector
from dpsub_dist.privacy.accountant import ZCDP, ApproxDP
from dpsub_dist.privacy.calibration import gaussian_delta, gaussian_sigma_approx_dp
from dpsub_dist.privacy.noise import Draw

# -- §2 histogram ------------------------------------------------------------------


def _histogram(points, side, offset, grant, rng) -> histogram.HistogramRelease:
    """The stability histogram with the mechanism and δ of ``grant``."""
    counts = histogram.histogram_mechanism(grant)
    delta = histogram.stability_delta(grant)
    return histogram.shifted_grid_histogram(points, side, offset, counts, delta, rng)


@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-6), (1.0, 1e-3), (3.0, 1e-9)])
def test_histogram_counts_get_laplace_two_over_epsilon_and_threshold(epsilon, delta) -> None:
    points = np.array([[0.1], [0.2], [1.5], [2.5], [2.6], [2.7]])
    with noise.draw_log() as draws:
        release = _histogram(points, 1.0, 0.0, ApproxDP(epsilon, delta), np.random.default_rng(0))
    # one draw per non-empty cell (3 cells), L1 sensitivity 2 of the count vector
    assert draws == [Draw("laplace", 2 / epsilon, 2.0, 3)]
    assert release.threshold == pytest.approx(1 + (2 / epsilon) * math.log(1 / delta), rel=1e-6)
    # the exact discrete tail: P(noise ≥ τ − 1) ≤ δ/2, with τ − 1 on the noise grid
    tail = noise.laplace_tail(2 / epsilon, 2.0, delta / 2, coordinates_changed=2)
    assert release.threshold - 1 == tail


def test_histogram_zcdp_grant_runs_at_epsilon_sqrt_two_rho() -> None:
    with noise.draw_log() as draws:
        release = _histogram(
            np.zeros((5, 2)), 1.0, 0.3, ZCDP(0.125, 1e-5), np.random.default_rng(0)
        )
    assert draws[0].scale == pytest.approx(2 / 0.5)  # ε = √(2·0.125) = 0.5
    assert release.threshold == pytest.approx(1 + 4 * math.log(1e5), rel=1e-6)


def test_histogram_releases_the_centre_of_a_dominant_cell() -> None:
    # 500 points in cell ⌊(y − 0.25·2)/2⌋ = (1, −1): centre (1 + 0.25 + 0.5)·2 = 3.5 and
    # (−1 + 0.75)·2 = −0.5; noisy count 500 ± small ≫ τ ≈ 14.8.
    points = np.tile([[2.6, -1.4]], (500, 1))
    release = _histogram(points, 2.0, 0.25, ApproxDP(1.0, 1e-3), np.random.default_rng(1))
    assert release.point is not None
    np.testing.assert_allclose(release.point, [3.5, -0.5])


def test_histogram_returns_bottom_when_every_cell_is_small() -> None:
    points = np.arange(40.0)[:, None]  # 40 cells of one point each, τ ≈ 28.6 at ε = 1, δ = 1e-6
    release = _histogram(points, 1.0, 0.5, ApproxDP(1.0, 1e-6), np.random.default_rng(2))
    assert release.point is None and release.noisy_count is None


def test_histogram_rejects_pure_dp_grant() -> None:
    with pytest.raises(ValueError, match="delta"):
        _histogram(np.zeros((3, 1)), 1.0, 0.0, ApproxDP(1.0), np.random.default_rng(0))


# -- §3 friendly core ------------------------------------------------------------------


def test_core_weights_formula_by_hand() -> None:
    # t = 10, r = 1: six points at 0 (7 friends: the six and the point at 0.9), the point
    # at 0.9 (7 friends), three far points (3 friends each, not within r of anything else).
    points = np.array([0, 0, 0, 0, 0, 0, 0.9, 10, 10.5, 11])[:, None]
    weights = friendly.core_weights(friendly.pairwise_sq_distances(points), 1.0)
    # w = clamp((c − (t/2 + 1)) / (t/2)) = (7 − 6)/5 = 0.2; far points: c = 2 or 3 → 0
    np.testing.assert_allclose(weights, [0.2] * 7 + [0.0] * 3)


def _friendly_release(ptr, gauss, points, radius=1.0, seed=0):
    with noise.draw_log() as draws:
        release = core_release(points, radius, ptr, gauss, np.random.default_rng(seed))
    laplace_calls = [d for d in draws if d.kind == "laplace"]
    return release, laplace_calls, [d for d in draws if d.kind == "gaussian"]


@pytest.mark.parametrize(
    "eps1,delta1,eps2,delta2", [(0.5, 1e-6, 0.5, 1e-6), (1.0, 1e-3, 2.0, 1e-5)]
)
def test_friendly_approx_dp_calibration(eps1, delta1, eps2, delta2) -> None:
    t, radius = 400, 0.7
    points = np.random.default_rng(3).normal(0, 0.01, (t, 3))  # one tight core: W = t − 2
    release, laplace_calls, gauss_calls = _friendly_release(
        ApproxDP(eps1, delta1), ApproxDP(eps2, delta2), points, radius
    )
    assert laplace_calls == [Draw("laplace", 4 / eps1, 4.0, 1)]
    lower = release.noisy_weight - (4 / eps1) * math.log(1 / (2 * delta1)) - 4
    assert release.weight_lower_bound == pytest.approx(lower, rel=1e-6)
    # exact: released weight minus a grid tail bound (P(noise ≥ x) ≤ δ₁) minus 4, no rounding
    tail = noise.laplace_tail(4 / eps1, 4.0, delta1)
    assert release.weight_lower_bound == release.noisy_weight - tail - 4
    lower = release.weight_lower_bound
    assert release.point is not None
    sensitivity = 16 * radius / lower
    delta_gauss = delta2 * math.exp(-eps1)  # so that δ₁ + e^{ε₁}·δ_gauss = δ₁ + δ₂ is charged
    expected = gaussian_sigma_approx_dp(sensitivity, eps2, delta_gauss)
    assert release.sigma == pytest.approx(expected, rel=1e-12)
    assert gauss_calls == [Draw("gaussian", release.sigma, sensitivity, 3)]
    # independent checks: never more noise than the classic formula, and the exact δ holds
    if eps2 < 1:  # the classic formula (16r/L)·√(2 ln(1.25/δ))/ε₂ is valid and never beaten
        classic = sensitivity * math.sqrt(2 * math.log(1.25 / delta_gauss)) / eps2
        assert release.sigma <= classic * (1 + 1e-12)
    assert gaussian_delta(sensitivity, release.sigma, eps2) <= delta_gauss * (1 + 1e-6)


def test_friendly_zcdp_calibration() -> None:
    t, radius = 400, 0.5
    points = np.zeros((t, 2))
    release, laplace_calls, _ = _friendly_release(ZCDP(0.5, 1e-6), ZCDP(0.08, 0.0), points, radius)
    eps1 = math.sqrt(2 * 0.5)
    assert laplace_calls[0].scale == pytest.approx(4 / eps1)
    lower = release.noisy_weight - (4 / eps1) * math.log(1 / (2 * 1e-6)) - 4
    assert release.weight_lower_bound == pytest.approx(lower, rel=1e-6)
    lower = release.weight_lower_bound
    assert release.sigma == pytest.approx((16 * radius / lower) / math.sqrt(2 * 0.08))


def test_friendly_returns_bottom_below_a_quarter_core() -> None:
    # every point alone: W = 0, so L < 0 < t/4 whatever the noise (4/ε·ln(1/2δ) ≫ |Lap|)
    points = np.arange(50.0)[:, None] * 10
    release, _, gauss_calls = _friendly_release(ApproxDP(1.0, 1e-9), ApproxDP(1.0, 1e-6), points)
    assert release.point is None and release.sigma is None and gauss_calls == []


def test_friendly_sensitivity_facts_hold_on_random_neighbours() -> None:
    """ALGORITHMS.md §3 facts (b), (c): |W − W′| ≤ 4 and ‖μ − μ′‖ ≤ 16r/(min W − 4)."""
    rng = np.random.default_rng(4)
    radius = 1.0
    for _ in range(300):
        t = int(rng.integers(8, 40))
        points = rng.normal(0, rng.uniform(0.1, 1.0), (t, 2))
        other = points.copy()
        other[rng.integers(t)] = rng.normal(0, 2.0, 2)
        w = friendly.core_weights(friendly.pairwise_sq_distances(points), radius)
        w2 = friendly.core_weights(friendly.pairwise_sq_distances(other), radius)
        assert abs(w.sum() - w2.sum()) <= 4 + 1e-12
        assert np.abs(w - w2).sum() <= 4 + 1e-12
        if min(w.sum(), w2.sum()) > 4:
            shift = np.linalg.norm(w @ points / w.sum() - w2 @ other / w2.sum())
            assert shift <= 16 * radius / (min(w.sum(), w2.sum()) - 4) + 1e-12


# -- §4 sparse vector ----------------------------------------------------------------


@pytest.mark.parametrize("sensitivity,epsilon", [(1.0, 1.0), (4.0, 0.3)])
def test_above_threshold_noise_scales(sensitivity, epsilon) -> None:
    asked: list[int] = []

    def query(j: int) -> float:
        asked.append(j)
        return 1e9 if j == 2 else -1e9  # query 2 is far above any noise

    with noise.draw_log() as draws:
        index = sparse_vector.above_threshold(
            query, 6, 0.0, mechanism.above_threshold(sensitivity, epsilon), np.random.default_rng(0)
        )
    assert index == 2 and asked == [0, 1, 2]  # lazy: stops at the first hit
    assert [d.kind for d in draws] == ["laplace"] * 4
    # the threshold's scale is 2Δ′/ε with Δ′ = Δ + g (the rounding of the queries on grid g)
    shifted = sensitivity + noise.grid_step(4 * sensitivity / epsilon)
    assert draws[0] == Draw("laplace", 2 * shifted / epsilon, shifted, 1)
    assert draws[0].scale == pytest.approx(2 * sensitivity / epsilon, rel=1e-8)
    assert draws[1:] == [Draw("laplace", 4 * sensitivity / epsilon, sensitivity, 1)] * 3


def test_above_threshold_none_when_nothing_clears() -> None:
    index = sparse_vector.above_threshold(
        lambda j: -1e9, 5, 0.0, mechanism.above_threshold(1.0, 1.0), np.random.default_rng(0)
    )
    assert index is None


@pytest.mark.parametrize("noised", ["threshold", "queries"])
def test_above_threshold_compares_the_noisy_query_with_the_noisy_threshold(noised) -> None:
    """The released index depends on the data only through the noisy values: queries above
    the exact threshold stay below it once the noise (here forced, 10⁶) says so."""
    threshold = mock.patch.object(noise, "laplace_noise", return_value=1e6)
    queries = mock.patch.object(noise, "add_laplace", side_effect=lambda rng, v, *a: v - 1e6)
    with threshold if noised == "threshold" else queries:
        index = sparse_vector.above_threshold(
            lambda j: 1e3, 5, 0.0, mechanism.above_threshold(1.0, 1.0), np.random.default_rng(0)
        )
    assert index is None


def test_geometric_grid_is_public_and_covers_the_range() -> None:
    grid = sparse_vector.geometric_grid(1e-3, 10.0)
    np.testing.assert_allclose(grid[1:] / grid[:-1], math.sqrt(2))
    assert grid[0] == 1e-3 and grid[-1] >= 10.0 > grid[-2]


def _searched(module, call):
    seen = {}

    def fake(query, n_queries, threshold, mech, rng):
        epsilon = mech.cost().epsilon
        seen.update(n=n_queries, threshold=threshold, sensitivity=mech.sensitivity, epsilon=epsilon)
        seen["answers"] = [query(j) for j in range(n_queries)]
        return 1

    with mock.patch.object(module, "above_threshold", fake):
        chosen = call()
    return chosen, seen


def test_choose_radius_queries_core_weight_with_sensitivity_four() -> None:
    points = np.zeros((20, 1))
    grid = np.array([0.5, 1.0, 2.0])
    sq = friendly.pairwise_sq_distances(points)
    chosen, seen = _searched(
        friendly,
        lambda: friendly.choose_radius(
            sq, grid, friendly.radius_search_mechanism(ZCDP(0.02)), np.random.default_rng(0)
        ),
    )
    assert chosen == 1.0
    assert seen["sensitivity"] == friendly.WEIGHT_SENSITIVITY == 4.0
    assert seen["epsilon"] == pytest.approx(0.2)  # √(2ρ)
    assert seen["threshold"] == pytest.approx(0.8 * 20)
    assert seen["answers"] == pytest.approx([18.0] * 3)  # 20 · (1 − 2/20)


def test_choose_cell_side_queries_largest_count_with_sensitivity_one() -> None:
    points = np.array([[0.1], [0.2], [0.3], [5.0]])
    grid = np.array([1.0, 10.0])
    chosen, seen = _searched(
        histogram,
        lambda: histogram.choose_cell_side(
            points,
            0.0,
            grid,
            histogram.cell_search_mechanism(ApproxDP(0.7)),
            np.random.default_rng(0),
        ),
    )
    assert chosen == 10.0
    assert seen["sensitivity"] == histogram.MAX_COUNT_SENSITIVITY == 1.0
    assert seen["epsilon"] == 0.7
    assert seen["threshold"] == pytest.approx(0.8 * 4)
    assert seen["answers"] == [3, 4]


def test_histogram_cell_search_stops_at_the_documented_fraction() -> None:
    """The aggregator's cell-side search uses HISTOGRAM_SEARCH_FRACTION of t (finding 12)."""
    from dpsub_dist.context import RunContext
    from dpsub_dist.methods import _sample_aggregate as sa
    from dpsub_dist.params import EstimateConfig

    config = EstimateConfig(rank=1, epsilon=1.0, delta=1e-6, method="histogram")
    ctx = RunContext(config, None, None, False, 0)  # type: ignore[arg-type]
    ctx.plan(sa.aggregator_shares("histogram", False))
    summaries = np.random.default_rng(5).standard_normal((60, 4))
    _, seen = _searched(histogram, lambda: sa.aggregate(ctx, summaries, "histogram", 1, 2, 2))
    assert seen["threshold"] == pytest.approx(sa.HISTOGRAM_SEARCH_FRACTION * 60)


def test_grid_core_weights_equal_one_pass_per_radius() -> None:
    """The radius search's one-pass W(r) is bit for bit core_weights(r).sum(), ties too."""
    rng = np.random.default_rng(3)
    for t, dim in [(1, 2), (9, 1), (37, 3), (701, 5)]:
        points = rng.standard_normal((t, dim))
        points[: t // 3] = points[0]  # repeated points: zero distances
        sq = friendly.pairwise_sq_distances(points)
        exact = np.sqrt(np.unique(sq)[:4])  # radii exactly at some distances
        grid = np.sort(np.concatenate([sparse_vector.geometric_grid(1e-3, 20.0), exact[exact > 0]]))
        expected = [friendly.core_weights(sq, r).sum() for r in grid]
        np.testing.assert_array_equal(friendly.grid_core_weights(sq, grid), expected)


def _exact_sq_distances(points: np.ndarray) -> np.ndarray:
    """High-precision reference: squared distances of the float64 points in exact rationals."""
    rows = [[Fraction(float(x)) for x in row] for row in points]
    t = len(rows)
    out = np.zeros((t, t))
    for i in range(t):
        for j in range(i + 1, t):
            exact = sum((a - b) ** 2 for a, b in zip(rows[i], rows[j], strict=True))
            out[i, j] = out[j, i] = float(exact)
    return out


def _far_apart_points(t: int = 200) -> np.ndarray:
    """Points of norm ≈ 80 whose pairwise distances are ≈ 1.1e-7 ≫ a radius of 1e-10."""
    rng = np.random.default_rng(0)
    return rng.standard_normal(64) * 10 + rng.standard_normal((t, 64)) * 1e-8


def test_far_apart_points_are_not_friends_at_a_tiny_radius() -> None:
    """Finding 6: ‖a‖² + ‖b‖² − 2⟨a, b⟩ cancels; at r = 1e-10 far pairs must not be friends."""
    points = _far_apart_points()
    sq = friendly.pairwise_sq_distances(points)
    off_diagonal = ~np.eye(len(points), dtype=bool)
    assert not np.any(sq[off_diagonal] <= 1e-10 * 1e-10)
    assert friendly.core_weights(sq, 1e-10).sum() == 0.0
    exact = _exact_sq_distances(points[:40])
    assert exact[off_diagonal[:40, :40]].min() > 1e-15  # truly far apart at this radius


def test_private_radius_grid_sees_no_friends_below_the_true_distances() -> None:
    points = _far_apart_points()
    sq = friendly.pairwise_sq_distances(points)
    grid = sparse_vector.geometric_grid(1e-12, 1e-8)
    assert not np.any(friendly.grid_core_weights(sq, grid))
    search = friendly.radius_search_mechanism(ApproxDP(50.0))
    assert friendly.choose_radius(sq, grid, search, np.random.default_rng(0)) is None


@pytest.mark.parametrize("spread", [1e-9, 1e-4, 1.0])
def test_pairwise_sq_distances_bound_the_exact_distances(spread: float) -> None:
    """Every entry is ≥ the exact squared distance, and close to it when it is not tiny."""
    rng = np.random.default_rng(4)
    points = rng.standard_normal(7) * 1e3 + rng.standard_normal((30, 7)) * spread * 1e3
    points[3] = points[5]  # a repeated point: exact distance 0
    sq = friendly.pairwise_sq_distances(points)
    exact = _exact_sq_distances(points)
    assert np.all(sq >= exact)
    assert np.all(np.diag(sq) == 0.0)
    sq_norms = np.sum(points**2, axis=1)
    error = 16 * 9 * 2.0**-53 * np.add.outer(sq_norms, sq_norms)  # 16·γ_{D+2}·(‖a‖² + ‖b‖²)
    assert np.all(sq <= exact * (1 + 2.0**-40) + error)


def test_radius_floor_is_where_rounding_stops_deciding() -> None:
    floor = friendly.radius_floor(64, 80.0)
    points = _far_apart_points()
    sq = friendly.pairwise_sq_distances(points)
    assert floor**2 >= 2**10 * sq[0, 1] / 2  # the error term is ≤ r²/1024 at the floor
    assert friendly.radius_floor(4 * 64, 80.0) > floor  # longer vectors: larger floor
