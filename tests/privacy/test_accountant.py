"""Privacy accountant: zCDP conversion (cross-checked with dp_accounting), composition, budgets."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from stated_cost import Stated

from dpsub_dist.errors import BudgetRefused, InputError
from dpsub_dist.privacy.accountant import (
    ZCDP,
    Accountant,
    ApproxDP,
    BudgetExceeded,
    gaussian_sigma,
    laplace_epsilon,
    parse_budget,
    to_approx_dp,
    zcdp_delta,
    zcdp_epsilon,
)
from dpsub_dist.privacy.calibration import analytic_gaussian_sigma, gaussian_delta

RHOS = [1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0, 5.0, 20.0]
DELTAS = [1e-10, 1e-6, 1e-3]
GRID = list(itertools.product(RHOS, DELTAS))


def _rdp_epsilon(
    noise_multipliers: list[float], delta: float, orders: list[float] | None = None
) -> float:
    """ε from dp_accounting's RDP accountant for composed Gaussian events."""
    dp_accounting = pytest.importorskip("dp_accounting")
    acc = dp_accounting.rdp.RdpAccountant(orders=orders)
    for z in noise_multipliers:
        acc.compose(dp_accounting.GaussianDpEvent(z))
    return acc.get_epsilon(delta)


def _noise_multiplier(rho: float) -> float:
    """σ/Δ of the Gaussian that is exactly ρ-zCDP: ρ = Δ²/(2σ²)."""
    return math.sqrt(1.0 / (2.0 * rho))


# --- zCDP → (ε, δ) -----------------------------------------------------------


@pytest.mark.parametrize("delta", DELTAS)
def test_zcdp_epsilon_monotone_and_below_bun_steinke(delta: float) -> None:
    eps = [zcdp_epsilon(r, delta) for r in RHOS]
    assert all(b > a for a, b in itertools.pairwise(eps))
    for r, e in zip(RHOS, eps, strict=True):
        assert e <= r + 2.0 * math.sqrt(r * math.log(1.0 / delta))
        # CKS is strictly tighter than Bun–Steinke here
        assert e < r + 2.0 * math.sqrt(r * math.log(1.0 / delta)) * 0.99


def test_zcdp_epsilon_decreasing_in_delta() -> None:
    for r in RHOS:
        eps = [zcdp_epsilon(r, d) for d in DELTAS]  # δ increasing
        assert all(b < a for a, b in itertools.pairwise(eps))


def test_zcdp_epsilon_edge_cases() -> None:
    assert zcdp_epsilon(0.0, 1e-6) == 0.0
    assert zcdp_epsilon(1e-12, 0.5) == 0.0  # tiny ρ, huge δ: ε = 0 suffices
    with pytest.raises(ValueError, match="delta"):
        zcdp_epsilon(1.0, 0.0)
    with pytest.raises(ValueError, match="rho"):
        zcdp_epsilon(-1.0, 1e-6)


@pytest.mark.parametrize("rho,delta", GRID)
def test_zcdp_delta_inverts_epsilon(rho: float, delta: float) -> None:
    eps = zcdp_epsilon(rho, delta)
    assert zcdp_delta(rho, eps) == pytest.approx(delta, rel=1e-6)
    # slightly smaller ε needs a larger δ
    assert zcdp_delta(rho, eps * 0.99) > delta


@pytest.mark.parametrize("rho,delta", GRID)
def test_zcdp_epsilon_against_dp_accounting_rdp(rho: float, delta: float) -> None:
    """dp_accounting's RDP accountant uses the same CKS bound (its compute_epsilon cites
    arXiv:2004.00010 Prop. 12) but minimises over a fixed grid of orders α, so its ε is
    an upper bound on ours; the grid is fine enough that both agree within a few %."""
    theirs = _rdp_epsilon([_noise_multiplier(rho)], delta)
    ours = zcdp_epsilon(rho, delta)
    assert ours <= theirs * (1 + 1e-6)
    assert ours >= theirs / 1.10


# 1 + α-grid dense enough (8001 log-spaced orders in (1.001, 1e5]) for the discrete minimum
# to approach the continuous one.
DENSE_ORDERS = [1.0 + 10.0 ** (-3.0 + 8.0 * i / 8000) for i in range(8001)]


@pytest.mark.parametrize("rho,delta", GRID)
def test_zcdp_epsilon_against_dp_accounting_dense_orders(rho: float, delta: float) -> None:
    """With a dense order grid dp_accounting's ε converges to the continuous CKS infimum:
    ours must not be above it (we minimise over all α) nor more than 1e-5 below it (a
    too-optimistic conversion, e.g. 0.97·ε, fails here)."""
    theirs = _rdp_epsilon([_noise_multiplier(rho)], delta, orders=DENSE_ORDERS)
    ours = zcdp_epsilon(rho, delta)
    assert theirs * (1 - 1e-5) <= ours <= theirs * (1 + 1e-9)


@pytest.mark.parametrize("rho,delta", GRID)
def test_zcdp_epsilon_not_below_exact_gaussian(rho: float, delta: float) -> None:
    """The ρ-zCDP Gaussian is one ρ-zCDP mechanism, so any valid conversion's ε is at least
    the Gaussian's exact ε(δ) (Balle–Wang); a too-optimistic conversion fails here."""
    eps = zcdp_epsilon(rho, delta)
    sigma = _noise_multiplier(rho)
    assert gaussian_delta(1.0, sigma, eps) <= delta * (1 + 1e-9)
    # the exact Gaussian needs strictly less than the generic bound
    assert analytic_gaussian_sigma(1.0, eps, delta) < sigma


def test_composition_of_gaussians_is_rho_sum() -> None:
    rho1, rho2, delta = 0.05, 0.2, 1e-6
    z1, z2 = _noise_multiplier(rho1), _noise_multiplier(rho2)
    composed = _rdp_epsilon([z1, z2], delta)
    single = _rdp_epsilon([_noise_multiplier(rho1 + rho2)], delta)
    assert composed == pytest.approx(single, rel=1e-9)  # RDP/zCDP compose additively

    acc = Accountant(ZCDP(0.5, delta), conversion_delta=delta)
    acc.charge("first", ZCDP(rho1))
    acc.charge("second", ZCDP(rho2))
    assert acc.spent.rho == pytest.approx(rho1 + rho2)
    eps = acc.spent_as_approx_dp().epsilon
    assert eps == pytest.approx(zcdp_epsilon(rho1 + rho2, delta), rel=1e-12)
    assert composed / 1.10 <= eps <= composed * (1 + 1e-6)


# --- budget values -----------------------------------------------------------


def test_budget_values_validate() -> None:
    assert ApproxDP(1.0) == ApproxDP(1.0, 0.0)
    for bad in [(-1.0, 0.0), (float("inf"), 0.0), (1.0, 1.0), (1.0, -1e-9)]:
        with pytest.raises(ValueError):
            ApproxDP(*bad)
    for bad in [(-1.0, 0.0), (float("nan"), 0.0), (1.0, 1.5)]:
        with pytest.raises(ValueError):
            ZCDP(*bad)


def test_to_approx_dp() -> None:
    b = ApproxDP(1.0, 1e-6)
    assert to_approx_dp(b) is b
    z = ZCDP(0.5, 1e-7)
    a = to_approx_dp(z)  # conversion δ defaults to δ₀
    assert a.delta == pytest.approx(2e-7)
    assert a.epsilon == pytest.approx(zcdp_epsilon(0.5, 1e-7))
    a = to_approx_dp(z, conversion_delta=1e-6)
    assert a.delta == pytest.approx(1.1e-6)
    assert a.epsilon == pytest.approx(zcdp_epsilon(0.5, 1e-6))
    with pytest.raises(ValueError, match="conversion_delta"):
        to_approx_dp(ZCDP(0.5))


def test_laplace_epsilon_and_gaussian_sigma() -> None:
    assert laplace_epsilon(ApproxDP(0.3, 1e-6)) == 0.3
    assert laplace_epsilon(ZCDP(0.125)) == pytest.approx(0.5)  # ε²/2 = ρ
    assert gaussian_sigma(ZCDP(0.5, 1e-6), 2.0) == pytest.approx(2.0)
    assert gaussian_sigma(ApproxDP(1.0, 1e-6), 1.0) == pytest.approx(
        analytic_gaussian_sigma(1.0, 1.0, 1e-6)
    )
    with pytest.raises(ValueError, match="delta"):
        gaussian_sigma(ApproxDP(1.0), 1.0)


# --- parse_budget ------------------------------------------------------------


def test_parse_budget_modes() -> None:
    assert parse_budget(1.0, 1e-6, None) == ApproxDP(1.0, 1e-6)
    assert parse_budget(None, 1e-6, 0.5) == ZCDP(0.5, 5e-7)
    assert parse_budget("2", "1e-5", None) == ApproxDP(2.0, 1e-5)


@pytest.mark.parametrize(
    "args,match",
    [
        ((-1.0, 1e-6, None), r"epsilon must be > 0 .*got -1.*--epsilon"),
        ((0.0, 1e-6, None), "epsilon must be > 0"),
        ((float("inf"), 1e-6, None), "epsilon must be > 0 and finite"),
        ((float("nan"), 1e-6, None), "epsilon must be a number"),
        (("abc", 1e-6, None), "epsilon must be a number"),
        ((1.0, None, None), "delta is required.*--delta"),
        ((1.0, 0.0, None), r"delta must be in \(0, 1\)"),
        ((1.0, 1.0, None), r"delta must be in \(0, 1\)"),
        ((None, 1e-6, -0.5), "rho must be > 0.*--rho"),
        ((None, 1e-6, float("inf")), "rho must be > 0 and finite"),
        ((1.0, 1e-6, 0.5), "exactly one of --epsilon.*--rho"),
        ((None, 1e-6, None), "--epsilon"),
        ((True, 1e-6, None), "epsilon must be a number"),
    ],
)
def test_parse_budget_errors(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        parse_budget(*args)
    assert isinstance(info.value, InputError)  # the CLI maps it to exit code 2


# --- Accountant --------------------------------------------------------------


def test_split_approx_dp() -> None:
    acc = Accountant(ApproxDP(2.0, 1e-6))
    grants = acc.split({"scale": (1, 0), "ptr": (1, 1), "gauss": (2, 3)})
    assert grants["scale"] == ApproxDP(0.5, 0.0)
    assert grants["ptr"].epsilon == pytest.approx(0.5)
    assert grants["ptr"].delta == pytest.approx(0.25e-6)
    assert grants["gauss"].epsilon == pytest.approx(1.0)
    assert grants["gauss"].delta == pytest.approx(0.75e-6)
    assert acc.can_afford(grants)
    for step, g in grants.items():
        acc.charge(step, Stated(g))  # a planned step is charged with a mechanism
    assert acc.spent.epsilon == pytest.approx(2.0)
    assert acc.remaining.epsilon == pytest.approx(0.0, abs=1e-12)


def test_split_zcdp_and_pure_shares() -> None:
    acc = Accountant(ZCDP(1.0, 1e-6))
    grants = acc.split({"a": (0.2, 0.0), "b": (0.8, 0.0)})
    assert grants == {"a": ZCDP(0.2, 0.0), "b": ZCDP(0.8, 0.0)}
    with pytest.raises(ValueError, match="privacy share"):
        acc.split({"a": (0.0, 1.0)})
    with pytest.raises(ValueError, match="delta share"):
        acc.split({"a": (1.0, -1.0)})
    with pytest.raises(ValueError):
        acc.split({})


def test_many_equal_splits_fit_despite_rounding() -> None:
    acc = Accountant(ApproxDP(0.7, 3e-7))
    grants = acc.split({f"s{i}": (1.0, 1.0) for i in range(7)})
    for step, g in grants.items():
        acc.charge(step, Stated(g))  # a planned step is charged with a mechanism
    assert acc.spent.epsilon == pytest.approx(0.7)


def test_charge_refusal_charges_nothing() -> None:
    acc = Accountant(ApproxDP(1.0, 1e-6))
    acc.charge("a", ApproxDP(0.6, 5e-7))
    before = acc.report()
    with pytest.raises(BudgetExceeded) as info:
        acc.charge("b", ApproxDP(0.5, 1e-7))
    msg = str(info.value)
    assert "spent" in msg and "asks" in msg and "leaving" in msg and "'b'" in msg
    assert isinstance(info.value, BudgetRefused)
    assert acc.report() == before
    with pytest.raises(BudgetExceeded):  # δ alone over budget
        acc.charge("c", ApproxDP(0.1, 6e-7))
    assert acc.report() == before
    acc.charge("d", ApproxDP(0.4, 5e-7))  # exactly the rest is fine
    assert acc.remaining.epsilon == pytest.approx(0.0, abs=1e-12)
    assert not acc.can_afford({"e": ApproxDP(1e-6)})


def test_tolerance_is_relative_and_tiny() -> None:
    acc = Accountant(ApproxDP(1.0, 1e-6))
    acc.charge("a", ApproxDP(1.0 + 1e-12, 1e-6))
    acc2 = Accountant(ApproxDP(1.0, 1e-6))
    with pytest.raises(BudgetExceeded):
        acc2.charge("a", ApproxDP(1.0 + 1e-7))


def test_pure_dp_total_refuses_any_delta() -> None:
    acc = Accountant(ApproxDP(1.0))
    with pytest.raises(BudgetExceeded):
        acc.charge("a", ApproxDP(0.1, 1e-12))
    with pytest.raises(ValueError, match="conversion_delta"):
        Accountant(ApproxDP(1.0), conversion_delta=1e-6)


def test_approx_dp_cost_against_zcdp_total() -> None:
    acc = Accountant(ZCDP(1.0, 1e-6))
    acc.charge("ptr", ApproxDP(0.5, 4e-7))  # counts as ZCDP(0.125, 4e-7)
    assert acc.spent == ZCDP(0.125, 4e-7)
    assert acc.can_afford({"rest": ZCDP(0.875, 6e-7)})
    assert not acc.can_afford({"rest": ZCDP(0.875, 6e-7), "more": ApproxDP(0.01)})
    with pytest.raises(BudgetExceeded):
        acc.charge("too_much", ApproxDP(math.sqrt(2 * 0.9)))
    with pytest.raises(TypeError):
        Accountant(ApproxDP(1.0, 1e-6)).charge("x", ZCDP(0.1))
    with pytest.raises(TypeError):
        Accountant(ApproxDP(1.0, 1e-6)).can_afford({"x": ZCDP(0.1)})


def test_zcdp_total_needs_a_conversion_delta() -> None:
    with pytest.raises(ValueError, match="conversion_delta"):
        Accountant(ZCDP(1.0))
    acc = Accountant(ZCDP(1.0), conversion_delta=1e-6)
    assert acc.report()["total_as_approx_dp"]["delta"] == pytest.approx(1e-6)


def test_report_approx_dp() -> None:
    acc = Accountant(ApproxDP(1.0, 1e-6))
    acc.charge("scale", ApproxDP(0.25))
    acc.charge("aggregate", ApproxDP(0.5, 1e-6))
    rep = json.loads(json.dumps(acc.report()))
    assert rep["mode"] == "approx_dp"
    assert rep["total_granted"] == {"epsilon": 1.0, "delta": 1e-6}
    assert rep["steps"] == [
        {"step": "scale", "epsilon": 0.25, "delta": 0.0},
        {"step": "aggregate", "epsilon": 0.5, "delta": 1e-6},
    ]
    assert rep["spent"] == {"epsilon": 0.75, "delta": 1e-6}
    assert rep["spent_as_approx_dp"] == {"epsilon": 0.75, "delta": 1e-6}
    assert "conversion" not in rep


def test_report_zcdp() -> None:
    total = parse_budget(None, 1e-6, 0.5)  # ZCDP(0.5, 5e-7); conversion δ′ = 5e-7
    acc = Accountant(total)
    acc.charge("ptr", ApproxDP(0.2, 5e-7))
    acc.charge("gauss", ZCDP(0.3))
    rep = json.loads(json.dumps(acc.report()))
    assert rep["mode"] == "zcdp"
    assert rep["conversion"] == "Canonne-Kamath-Steinke 2020"
    assert rep["total_granted"] == {"rho": 0.5, "delta0": 5e-7}
    assert [s["step"] for s in rep["steps"]] == ["ptr", "gauss"]
    assert rep["steps"][0]["rho"] == pytest.approx(0.02)
    assert rep["spent"]["rho"] == pytest.approx(0.32)
    assert rep["spent"]["delta0"] == pytest.approx(5e-7)
    assert rep["spent_as_approx_dp"]["epsilon"] == pytest.approx(zcdp_epsilon(0.32, 5e-7))
    assert rep["spent_as_approx_dp"]["delta"] == pytest.approx(1e-6)
    # the whole grant, reported as (ε, δ), has exactly the δ the user asked for
    assert rep["total_as_approx_dp"]["delta"] == pytest.approx(1e-6)
    assert rep["total_as_approx_dp"]["epsilon"] == pytest.approx(zcdp_epsilon(0.5, 5e-7))
