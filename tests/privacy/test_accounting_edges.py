"""Accounting and calibration edges that mutation testing (tests/mutation.sh) showed unpinned:
each test here kills a surviving mutant that would change a charge, a grant or a noise scale
(docs/testing.md lists them)."""

from __future__ import annotations

import math

import mpmath
import pytest

from dpsub_dist.privacy.accountant import (
    ZCDP,
    Accountant,
    ApproxDP,
    InvalidBudget,
    gaussian_sigma,
    parse_budget,
    zcdp_delta,
)
from dpsub_dist.privacy.calibration import analytic_gaussian_sigma, gaussian_delta

mpmath.mp.dps = 50


@pytest.mark.parametrize(
    "total, field", [(ApproxDP(1.0, 1e-6), "delta"), (ZCDP(1.0, 1e-6), "delta0")]
)
def test_split_gives_each_step_its_delta_share_when_shares_sum_to_one(total, field) -> None:
    """The budget plans' δ shares sum to exactly 1 (e.g. 0.5 + 0.5): each step gets its part."""
    grants = Accountant(total).split({"test": (0.25, 0.5), "noise": (0.75, 0.5)})
    assert [getattr(g, field) for g in grants.values()] == [5e-7, 5e-7]
    grants = Accountant(total).split({"only": (1.0, 1.0)})
    assert getattr(grants["only"], field) == 1e-6


def test_zero_rho_total_is_refused() -> None:
    with pytest.raises(InvalidBudget, match="rho must be > 0"):
        parse_budget(None, 1e-6, 0.0)


def test_zcdp_delta_edges() -> None:
    assert zcdp_delta(0.0, 1.0) == 0.0  # no privacy loss: no failure probability
    assert zcdp_delta(50.0, 0.0) == 1.0  # capped: a probability


def test_gaussian_needs_a_positive_delta() -> None:
    with pytest.raises(InvalidBudget, match="needs delta > 0"):
        gaussian_sigma(ApproxDP(1.0, 0.0), 1.0)


def test_zcdp_report_names_its_conversion_delta() -> None:
    acc = Accountant(ZCDP(0.5, 5e-7), conversion_delta=2e-7)
    assert acc.report()["conversion_delta"] == 2e-7


def _exact_delta(sensitivity: float, sigma: float, epsilon: float) -> float:
    """Balle & Wang 2018 Thm 8 in 50-digit arithmetic."""
    s, g, e = mpmath.mpf(sensitivity), mpmath.mpf(sigma), mpmath.mpf(epsilon)
    a = s / (2 * g) - e * g / s
    b = -s / (2 * g) - e * g / s
    return float(mpmath.ncdf(a) - mpmath.exp(e) * mpmath.ncdf(b))


@pytest.mark.parametrize(
    "sensitivity, sigma, epsilon",
    [(1.0, 0.5, 0.1), (1.0, 1.0, 1.0), (1.0, 3.0, 0.5), (2.0, 1.0, 4.0), (1.0, 0.2, 10.0)],
)
def test_gaussian_delta_is_exact(sensitivity: float, sigma: float, epsilon: float) -> None:
    assert gaussian_delta(sensitivity, sigma, epsilon) == pytest.approx(
        _exact_delta(sensitivity, sigma, epsilon), rel=1e-9
    )


@pytest.mark.parametrize("epsilon, delta", [(0.1, 1e-6), (1.0, 1e-6), (4.0, 1e-9), (10.0, 1e-5)])
def test_analytic_sigma_is_the_smallest_private_sigma(epsilon: float, delta: float) -> None:
    """δ(σ) ≤ δ at the returned σ, and δ(σ·(1 − 10⁻⁹)) > δ: no more noise than needed."""
    sigma = analytic_gaussian_sigma(1.0, epsilon, delta)
    assert _exact_delta(1.0, sigma, epsilon) <= delta * (1 + 1e-12)
    assert _exact_delta(1.0, sigma * (1 - 1e-9), epsilon) > delta
    assert math.isfinite(sigma)


@pytest.mark.parametrize("total", [ApproxDP(1.0), ZCDP(1.0)])
def test_a_delta_free_total_can_be_spent_exactly(total) -> None:
    """δ = 0 (δ₀ = 0) totals: a charge of exactly the total, with δ = 0, fits."""
    acc = Accountant(total, conversion_delta=1e-6 if isinstance(total, ZCDP) else None)
    acc.charge("all", total)
    assert acc.spent == total
