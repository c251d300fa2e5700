"""Gaussian noise calibration: closed forms, exactness of the analytic σ, validation."""

from __future__ import annotations

import itertools
import math

import pytest
from scipy.stats import norm

from dpsub_dist.privacy.calibration import (
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
    gaussian_delta,
    gaussian_sigma_approx_dp,
    gaussian_sigma_zcdp,
)

EPSILONS = [0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0]
DELTAS = [1e-10, 1e-6, 1e-3]
SENSITIVITIES = [0.5, 1.0, 3.0]
GRID = list(itertools.product(EPSILONS, DELTAS, SENSITIVITIES))


def test_classic_formula_hand_computed() -> None:
    # Δ=1, ε=0.5, δ=1e-5: ln(125000) = 11.73607; √(23.47214)/0.5 = 2·4.844805 = 9.689611
    assert classic_gaussian_sigma(1.0, 0.5, 1e-5) == pytest.approx(9.689611, rel=1e-6)
    # Δ=2, ε=0.1, δ=1.25e-4: ln(1e4) = 9.210340; √(18.42068) = 4.291932; ·2/0.1 = 85.83864
    assert classic_gaussian_sigma(2.0, 0.1, 1.25e-4) == pytest.approx(
        2.0 * math.sqrt(2.0 * math.log(1e4)) / 0.1, rel=1e-12
    )
    assert classic_gaussian_sigma(2.0, 0.1, 1.25e-4) == pytest.approx(85.83864, rel=1e-6)
    # linear in Δ, inverse in ε
    assert classic_gaussian_sigma(3.0, 0.25, 1e-6) == pytest.approx(
        3.0 * 2.0 * classic_gaussian_sigma(1.0, 0.5, 1e-6), rel=1e-12
    )


def test_classic_rejects_epsilon_at_least_one() -> None:
    with pytest.raises(ValueError, match="epsilon.*analytic"):
        classic_gaussian_sigma(1.0, 1.0, 1e-6)


def test_gaussian_delta_matches_linear_formula() -> None:
    # The log-space evaluation agrees with the textbook Φ formula where the latter is accurate.
    for eps, sigma, sens in [(0.5, 4.0, 1.0), (1.0, 2.0, 1.0), (2.0, 3.0, 2.5), (0.1, 20.0, 1.0)]:
        a = sens / (2 * sigma) - eps * sigma / sens
        b = -sens / (2 * sigma) - eps * sigma / sens
        expected = norm.cdf(a) - math.exp(eps) * norm.cdf(b)
        assert gaussian_delta(sens, sigma, eps) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("eps,delta,sens", [g for g in GRID if g[0] < 1.0])
def test_analytic_not_larger_than_classic(eps: float, delta: float, sens: float) -> None:
    analytic = analytic_gaussian_sigma(sens, eps, delta)
    classic = classic_gaussian_sigma(sens, eps, delta)
    assert analytic <= classic
    # and the classic σ is itself private per the exact formula
    assert gaussian_delta(sens, classic, eps) <= delta


@pytest.mark.parametrize("eps,delta,sens", GRID)
def test_analytic_sigma_is_private_and_tight(eps: float, delta: float, sens: float) -> None:
    sigma = analytic_gaussian_sigma(sens, eps, delta)
    # achieved privacy never weaker than the target
    assert gaussian_delta(sens, sigma, eps) <= delta * (1 + 1e-6)
    # ... and the calibration is tight: 1% less noise violates it
    assert gaussian_delta(sens, 0.99 * sigma, eps) > delta
    # σ scales linearly with the sensitivity
    assert sigma / sens == pytest.approx(analytic_gaussian_sigma(1.0, eps, delta), rel=1e-9)


def test_analytic_sigma_matches_dp_accounting() -> None:
    """Cross-check against dp_accounting's independent exact Gaussian privacy loss."""
    pytest.importorskip("dp_accounting")
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    for eps, delta, sens in GRID[::4]:
        sigma = analytic_gaussian_sigma(sens, eps, delta)
        theirs = GaussianPrivacyLoss(sigma, sensitivity=sens).get_delta_for_epsilon(eps)
        assert theirs == pytest.approx(delta, rel=1e-6)
        assert theirs <= delta * (1 + 1e-6)


def test_analytic_large_epsilon_is_finite_and_decreasing() -> None:
    sigmas = [analytic_gaussian_sigma(1.0, e, 1e-6) for e in (10.0, 20.0, 50.0, 100.0)]
    assert all(math.isfinite(s) and s > 0 for s in sigmas)
    assert sigmas == sorted(sigmas, reverse=True)
    for e, s in zip((10.0, 20.0, 50.0, 100.0), sigmas, strict=True):
        assert gaussian_delta(1.0, s, e) <= 1e-6 * (1 + 1e-6)


def test_approx_dp_picks_smaller() -> None:
    for eps, delta, sens in GRID:
        s = gaussian_sigma_approx_dp(sens, eps, delta)
        assert s == pytest.approx(analytic_gaussian_sigma(sens, eps, delta), rel=1e-12)
        if eps < 1:
            assert s <= classic_gaussian_sigma(sens, eps, delta)


def test_zcdp_sigma() -> None:
    assert gaussian_sigma_zcdp(1.0, 0.5) == pytest.approx(1.0)
    assert gaussian_sigma_zcdp(2.0, 0.125) == pytest.approx(4.0)
    sigma = gaussian_sigma_zcdp(3.0, 0.7)
    assert 3.0**2 / (2 * sigma**2) == pytest.approx(0.7)


@pytest.mark.parametrize(
    "fn,args,match",
    [
        (classic_gaussian_sigma, (0.0, 0.5, 1e-6), "sensitivity"),
        (classic_gaussian_sigma, (1.0, -0.5, 1e-6), "epsilon"),
        (classic_gaussian_sigma, (1.0, 0.5, 0.0), r"delta.*\(0, 1\)"),
        (analytic_gaussian_sigma, (float("inf"), 1.0, 1e-6), "sensitivity"),
        (analytic_gaussian_sigma, (1.0, float("nan"), 1e-6), "epsilon"),
        (analytic_gaussian_sigma, (1.0, 0.0, 1e-6), "epsilon"),
        (analytic_gaussian_sigma, (1.0, 1.0, 1.0), "delta"),
        (analytic_gaussian_sigma, (1.0, 1.0, -1e-6), "delta"),
        (analytic_gaussian_sigma, (1.0, 1.0, "x"), "delta"),
        (gaussian_sigma_approx_dp, (-1.0, 1.0, 1e-6), "sensitivity"),
        (gaussian_sigma_zcdp, (1.0, 0.0), "rho"),
        (gaussian_sigma_zcdp, (-2.0, 1.0), "sensitivity"),
        (gaussian_delta, (1.0, 0.0, 1.0), "sigma"),
    ],
)
def test_validation(fn, args, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fn(*args)


# -- each mechanism draws the noise its formula gives (privacy.noise.draw_log) ----------


def _textbook_analytic_sigma(sens: float, eps: float, delta: float) -> float:
    """Balle & Wang (2018) Thm 8 solved with the plain Φ formula (independent of calibration.py)."""
    from scipy.optimize import brentq

    def excess(sigma: float) -> float:
        a, b = sens / (2 * sigma) - eps * sigma / sens, -sens / (2 * sigma) - eps * sigma / sens
        return norm.cdf(a) - math.exp(eps) * norm.cdf(b) - delta

    return brentq(excess, 1e-3 * sens, 1e3 * sens, xtol=1e-14)


def test_analyze_gauss_and_mean_draw_the_formula_sigma() -> None:
    import numpy as np

    from dpsub_dist.privacy import covariance_noise as cov
    from dpsub_dist.privacy import mechanism, noise
    from dpsub_dist.privacy.accountant import ZCDP, ApproxDP

    rng = np.random.default_rng(0)
    with noise.draw_log() as draws:
        cov.analyze_gauss(np.eye(3), mechanism.gaussian(ApproxDP(2.0, 1e-6), math.sqrt(2)), rng)
        cov.analyze_gauss(np.eye(3), mechanism.gaussian(ZCDP(0.125), 1.0), rng)
        mean_mechanism = mechanism.gaussian(ApproxDP(0.5, 1e-5), 2.0)
        cov.gaussian_mean(np.ones(4), 100, mean_mechanism, rng, unit=3.0)
    gauss, zcdp, mean = draws
    assert (gauss.kind, gauss.size, gauss.sensitivity) == ("symmetric_gaussian", 6, math.sqrt(2))
    assert gauss.scale == pytest.approx(_textbook_analytic_sigma(math.sqrt(2), 2.0, 1e-6), rel=1e-8)
    assert zcdp.scale == pytest.approx(2.0)  # Δ/√(2ρ) = 1/0.5
    # ε = 0.5 < 1: the classic σ = 2·√(2 ln(1.25e5))/0.5 = 19.37922 is the smaller one
    classic = 2.0 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5
    assert classic == pytest.approx(19.379222, rel=1e-6)
    expected = min(classic, _textbook_analytic_sigma(2.0, 0.5, 1e-5))
    # the mean is released in input units: Δ and σ of the sum, both scaled by unit/n = 0.03
    assert mean.kind == "gaussian" and mean.size == 4
    assert mean.sensitivity == pytest.approx(2.0 * 0.03)
    assert mean.scale == pytest.approx(expected * 0.03, rel=1e-8)


def test_gap_test_and_projector_draw_the_formula_scales() -> None:
    import numpy as np
    from contexts import planned

    from dpsub_dist.methods.gauss import perturb_subspace
    from dpsub_dist.privacy import noise

    gram = np.diag([1000.0, 10.0, 1.0])
    approx = planned(  # gap test ApproxDP(0.2, 1e-6), projector ApproxDP(1.0, 1e-6)
        {"gap_test": (0.2, 0.5), "projector_noise": (1.0, 0.5)}, 1, epsilon=1.2, delta=2e-6
    )
    zcdp = planned(  # gap test ZCDP(0.02, δ₀ = 1e-6), projector ZCDP(0.5)
        {"gap_test": (0.02, 1.0), "projector_noise": (0.5, 0.0)}, 2, rho=0.52, delta=2e-6
    )
    with noise.draw_log() as draws:
        release = perturb_subspace(approx, gram, 1, "replace")
        zc = perturb_subspace(zcdp, gram, 1, "add_remove")
    gap, projector, zgap, zprojector = draws
    assert (gap.kind, gap.scale, gap.sensitivity) == ("laplace", 2.0 / 0.2, 2.0)  # Δ/ε
    assert release.gap_lower_bound == pytest.approx(release.noisy_gap - 10 * math.log(1e6), 1e-6)
    assert projector.sensitivity == pytest.approx(math.sqrt(2) / (release.gap_lower_bound - 3))
    assert projector.scale == pytest.approx(
        _textbook_analytic_sigma(projector.sensitivity, 1.0, 1e-6), rel=1e-8
    )
    assert (zgap.kind, zgap.scale) == ("gaussian", pytest.approx(2.0 / 0.2))  # Δ/√(2ρ)
    assert zprojector.sensitivity == pytest.approx(1.0 / (zc.gap_lower_bound - 2))
    assert zprojector.scale == pytest.approx(zprojector.sensitivity)  # Δ/√(2·0.5)


def test_sulq_grams_draw_sigma_with_sensitivity_two() -> None:
    import numpy as np

    from dpsub_dist.privacy import noise
    from dpsub_dist.privacy import subspace_clustering as clustering
    from dpsub_dist.privacy.accountant import ApproxDP

    iteration = clustering.iteration_mechanism(ApproxDP(1.0, 1e-6))
    sigma = iteration.sigma
    assert sigma == pytest.approx(_textbook_analytic_sigma(2.0, 1.0, 1e-6), rel=1e-8)
    with noise.draw_log() as draws:
        noisy = clustering.release_cluster_grams(
            np.zeros((3, 4, 4)), iteration, np.random.default_rng(0)
        )
    assert draws == [noise.Draw("symmetric_gaussian", sigma, 2.0, 30)]  # 3 × 10 entries
    assert np.array_equal(noisy, np.swapaxes(noisy, 1, 2))
