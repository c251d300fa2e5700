"""Privacy budgets as values, their composition, and conversion to (ε, δ)-DP.

Two budget modes (ALGORITHMS.md §0):

- :class:`ApproxDP` — (ε, δ)-DP; ``delta == 0`` is pure ε-DP.
- :class:`ZCDP` — δ₀-approximate ρ-zCDP (Bun & Steinke, TCC 2016, Def. 8.1):
  ρ-zCDP except with failure probability δ₀ (e.g. the failure event of a
  propose-test-release step).

Composition is basic: ε's and δ's add (Dwork & Roth 2014, Thm 3.16); ρ's and
δ₀'s add (Bun & Steinke 2016, Lemma 2.3 and §8). A zCDP budget is reported as
(ε, δ₀ + δ′)-DP with ε from the Canonne–Kamath–Steinke (NeurIPS 2020)
conversion at δ′ (:func:`zcdp_epsilon`).

:class:`Accountant` holds one run's total grant, splits it into per-step
grants before any data is read (the method's budget plan), and refuses
(:class:`BudgetExceeded`) any charge that would overspend the total or, once a
plan is split, that does not match it: a step outside the plan, a step charged
twice, or a mechanism whose stated cost (its privacy map, :mod:`mechanism`) is above the
step's grant; a planned step charged without a mechanism is refused too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsub_dist.errors import BudgetRefused, InputError
from dpsub_dist.privacy import calibration

__all__ = [
    "Accountant",
    "ApproxDP",
    "Budget",
    "BudgetExceeded",
    "InvalidBudget",
    "UnstatedCost",
    "ZCDP",
    "after_test",
    "gaussian_sigma",
    "laplace_epsilon",
    "parse_budget",
    "split_step_delta",
    "to_approx_dp",
    "zcdp_delta",
    "zcdp_epsilon",
]

#: Relative slack allowed when comparing spent against total (float rounding of splits).
REL_TOL = 1e-9

#: Name of the zCDP → (ε, δ) conversion, as written in reports.
CONVERSION_NAME = "Canonne-Kamath-Steinke 2020"


class InvalidBudget(InputError, ValueError):
    """A privacy parameter is missing or out of range (a ValueError; CLI exit code 2)."""


class BudgetExceeded(BudgetRefused):
    """A charge would exceed the run's total budget; nothing was charged (CLI exit code 4)."""


class UnstatedCost(TypeError):
    """A planned step was charged without a mechanism stating its cost (an internal error)."""


def _finite_nonneg(name: str, value: float, *, positive: bool = False) -> float:
    """``value`` as float if finite and ≥ 0 (> 0 if ``positive``); else raise InvalidBudget."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidBudget(f"{name} must be a finite number (got {value!r})") from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        rng = "(0, inf)" if positive else "[0, inf)"
        raise InvalidBudget(f"{name} must be a finite number in {rng} (got {x})")
    return x


def _probability(name: str, value: float, *, allow_zero: bool = True) -> float:
    """``value`` as float if in [0, 1) ((0, 1) unless ``allow_zero``); else InvalidBudget."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidBudget(f"{name} must be a number in [0, 1) (got {value!r})") from None
    lo_ok = x >= 0 if allow_zero else x > 0
    if not (lo_ok and x < 1):
        rng = "[0, 1)" if allow_zero else "(0, 1)"
        raise InvalidBudget(f"{name} must be in {rng} (got {x})")
    return x


@dataclass(frozen=True)
class ApproxDP:
    """(ε, δ)-differential privacy (Dwork, McSherry, Nissim & Smith 2006); δ = 0 is pure DP."""

    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _finite_nonneg("epsilon", self.epsilon))
        object.__setattr__(self, "delta", _probability("delta", self.delta))


@dataclass(frozen=True)
class ZCDP:
    """δ₀-approximate ρ-zero-concentrated DP (Bun & Steinke 2016, Def. 1.1 and Def. 8.1)."""

    rho: float
    delta0: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _finite_nonneg("rho", self.rho))
        object.__setattr__(self, "delta0", _probability("delta0", self.delta0))


Budget = ApproxDP | ZCDP


# ---------------------------------------------------------------------------
# zCDP → (ε, δ)-DP (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for
# Differential Privacy", Prop. 12 / Cor. 13 in arXiv:2004.00010v4):
#   ρ-zCDP ⇒ (ε, δ)-DP with δ = inf_{α>1} exp((α−1)(αρ − ε))/(α−1) · (1 − 1/α)^α.
# For a fixed α this δ_α(ε) is decreasing in ε and solves in closed form:
#   ε_α(δ) = αρ + log(1 − 1/α) − (log δ + log α)/(α − 1),
# so the smallest ε with δ(ε) ≤ δ is inf_{α>1} ε_α(δ). We minimise over
# u = log(α − 1) (coarse grid, then bounded Brent around the best grid point).
# Every α gives a valid bound, so an imperfect minimisation is only looser,
# never unsound.
# ---------------------------------------------------------------------------

_U_GRID = np.linspace(-20.0, 30.0, 501)  # α − 1 ∈ [2e-9, 1e13]


def _cks_epsilon_at(u: np.ndarray | float, rho: float, log_delta: float) -> np.ndarray | float:
    """ε_α(δ) of the CKS bound at α = 1 + e^u (vectorised)."""
    am1 = np.exp(u)
    log_a = np.log1p(am1)
    return (1.0 + am1) * rho + (u - log_a) - (log_delta + log_a) / am1


def _cks_log_delta_at(u: np.ndarray | float, rho: float, epsilon: float) -> np.ndarray | float:
    """log δ_α(ε) of the CKS bound at α = 1 + e^u (vectorised)."""
    am1 = np.exp(u)
    a = 1.0 + am1
    log_a = np.log1p(am1)
    return am1 * (a * rho - epsilon) - u + a * (u - log_a)


def _minimise_over_alpha(f: Callable[[Any], Any]) -> float:
    """min over u = log(α − 1) of a (unimodal) function: grid search, then bounded Brent."""
    values = f(_U_GRID)
    i = int(np.nanargmin(values))
    best = float(values[i])
    lo = _U_GRID[max(i - 1, 0)]
    hi = _U_GRID[min(i + 1, len(_U_GRID) - 1)]
    from scipy.optimize import minimize_scalar  # imported when a conversion needs it

    res = minimize_scalar(
        lambda u: float(f(u)), bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}
    )
    if res.success and float(res.fun) < best:
        best = float(res.fun)
    return best


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Smallest ε such that ρ-zCDP implies (ε, δ)-DP (Canonne, Kamath & Steinke 2020, Prop. 12).

    ε = inf_{α>1} [αρ + log(1 − 1/α) − (log δ + log α)/(α − 1)], the exact inverse of
    δ(ε) = inf_{α>1} exp((α−1)(αρ−ε))/(α−1)·(1−1/α)^α; never larger than the
    Bun–Steinke bound ρ + 2√(ρ ln(1/δ)).
    """
    rho = _finite_nonneg("rho", rho)
    delta = _probability("delta", delta, allow_zero=False)
    if rho == 0.0:
        return 0.0
    log_delta = math.log(delta)
    eps = _minimise_over_alpha(lambda u: _cks_epsilon_at(u, rho, log_delta))
    # Bun & Steinke 2016, Prop 1.3 is always valid too; CKS is tighter, keep the min.
    eps = min(eps, rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)))
    return max(0.0, eps)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """Smallest δ such that ρ-zCDP implies (ε, δ)-DP (Canonne, Kamath & Steinke 2020, Prop. 12).

    δ = inf_{α>1} exp((α−1)(αρ−ε))/(α−1)·(1−1/α)^α, capped at 1.
    """
    rho = _finite_nonneg("rho", rho)
    epsilon = _finite_nonneg("epsilon", epsilon)
    if rho == 0.0:
        return 0.0
    log_delta = _minimise_over_alpha(lambda u: _cks_log_delta_at(u, rho, epsilon))
    return min(1.0, math.exp(log_delta))


def to_approx_dp(b: Budget, conversion_delta: float | None = None) -> ApproxDP:
    """Express a budget as (ε, δ)-DP.

    ApproxDP is returned unchanged. δ₀-approximate ρ-zCDP becomes
    (zcdp_epsilon(ρ, δ′), δ₀ + δ′)-DP (Bun & Steinke 2016, §8; Canonne–Kamath–Steinke
    2020), with δ′ = ``conversion_delta``, defaulting to δ₀.
    """
    if isinstance(b, ApproxDP):
        return b
    if not isinstance(b, ZCDP):
        raise TypeError(f"expected ApproxDP or ZCDP, got {type(b).__name__}")
    if conversion_delta is None:
        if b.delta0 == 0.0:
            raise InvalidBudget(
                "conversion_delta is required to express a zCDP budget with delta0 = 0 as "
                "(epsilon, delta)-DP: pass a value in (0, 1), e.g. 1e-6"
            )
        conversion_delta = b.delta0
    conversion_delta = _probability("conversion_delta", conversion_delta, allow_zero=False)
    delta = b.delta0 + conversion_delta
    if delta >= 1.0:
        raise InvalidBudget(
            f"delta0 + conversion_delta must be < 1 (got {b.delta0} + {conversion_delta})"
        )
    return ApproxDP(zcdp_epsilon(b.rho, conversion_delta), delta)


def laplace_epsilon(grant: Budget) -> float:
    """ε for a pure-DP step (Laplace, sparse vector) given this grant.

    ApproxDP → ε. ZCDP → √(2ρ): pure ε-DP implies ε²/2-zCDP (Bun & Steinke 2016, Prop 1.4).
    """
    if isinstance(grant, ApproxDP):
        return grant.epsilon
    if isinstance(grant, ZCDP):
        return math.sqrt(2.0 * grant.rho)
    raise TypeError(f"expected ApproxDP or ZCDP, got {type(grant).__name__}")


def after_test(release: Budget, test: Budget) -> Budget:
    """The grant a release gated by a propose-test-release test is calibrated to, so that
    test and release compose to the two grants the accountant charges (T24, FriendlyCore §3
    step 3). Under (ε, δ)-DP a release that runs only when the ε₁-DP test passes enters the
    composition with its δ multiplied by e^{ε₁}, so it is calibrated for δ·e^{−ε₁}; under
    δ-approximate zCDP the grants add as they are."""
    if isinstance(release, ApproxDP):
        return ApproxDP(release.epsilon, release.delta * math.exp(-laplace_epsilon(test)))
    return release


def split_step_delta(delta: float, second_share: float) -> tuple[float, float]:
    """One step's δ split between two failure events of its mechanism (e.g. GAP-MAX's
    truncated-Laplace decision and its snapped release): they add up to ``delta`` exactly
    (basic composition), so the step is charged its grant and no more."""
    second = delta * second_share
    return delta - second, second


def planned_grants(total: Budget, shares: dict[str, tuple[float, float]]) -> dict[str, Budget]:
    """Each step's grant: shares[step] = (privacy_share, delta_share), each column normalised
    to 1.

    ApproxDP → ApproxDP(ε·p, δ·q); ZCDP → ZCDP(ρ·p, δ₀·q). Every privacy share
    must be > 0; a delta share of 0 gives the step δ = 0 (δ₀ = 0). Planned
    grants compose (basic composition) to at most the total.
    """
    if not shares:
        raise InvalidBudget("shares is empty: give at least one step a privacy share")
    ps: dict[str, float] = {}
    qs: dict[str, float] = {}
    for step, pair in shares.items():
        try:
            p, q = pair
        except (TypeError, ValueError):
            raise InvalidBudget(
                f"shares['{step}'] must be a pair (privacy_share, delta_share) (got {pair!r})"
            ) from None
        ps[step] = _finite_nonneg(f"privacy share of step '{step}'", p, positive=True)
        qs[step] = _finite_nonneg(f"delta share of step '{step}'", q)
    p_sum = math.fsum(ps.values())
    q_sum = math.fsum(qs.values())
    grants: dict[str, Budget] = {}
    for step in shares:
        p = ps[step] / p_sum
        q = qs[step] / q_sum if q_sum > 0 else 0.0
        if isinstance(total, ApproxDP):
            grants[step] = ApproxDP(total.epsilon * p, total.delta * q)
        else:
            grants[step] = ZCDP(total.rho * p, total.delta0 * q)
    return grants


def gaussian_sigma(grant: Budget, sensitivity: float) -> float:
    """Gaussian noise std for this grant and L2 sensitivity.

    ApproxDP → :func:`calibration.gaussian_sigma_approx_dp` (Dwork–Roth Thm A.1 / Balle–Wang
    2018); ZCDP → Δ/√(2ρ) (Bun & Steinke 2016, Prop 1.6; δ₀ is not used by the Gaussian).
    """
    if isinstance(grant, ApproxDP):
        if grant.delta == 0.0:
            raise InvalidBudget(
                "the Gaussian mechanism needs delta > 0: give this step a positive delta share"
            )
        return calibration.gaussian_sigma_approx_dp(sensitivity, grant.epsilon, grant.delta)
    if isinstance(grant, ZCDP):
        return calibration.gaussian_sigma_zcdp(sensitivity, grant.rho)
    raise TypeError(f"expected ApproxDP or ZCDP, got {type(grant).__name__}")


FLAGS = {"epsilon": "--epsilon", "delta": "--delta", "rho": "--rho"}
"""How the CLI names the budget's values (a job file names them ``budget.epsilon``, …)."""


def parse_budget(
    epsilon: float | None,
    delta: float | None,
    rho: float | None,
    names: dict[str, str] = FLAGS,
) -> Budget:
    """Build a run's total budget from CLI/job/API values (ALGORITHMS.md §0): the one check
    of a budget, whatever door it came through (``names``: how that door names the values).

    (ε, δ) → ApproxDP(ε, δ). (ρ, δ) → ZCDP(ρ, δ₀ = δ/2): half of δ is the failure
    probability available to steps such as propose-test-release, the other half
    is the δ′ of the reported (ε, δ)-DP conversion (so the reported δ is δ).
    """
    e_name, d_name, r_name = names["epsilon"], names["delta"], names["rho"]
    if epsilon is not None and rho is not None:
        raise InvalidBudget(
            f"pass exactly one of {e_name} (for (epsilon, delta)-DP) or {r_name} (for zCDP), "
            "not both"
        )
    if epsilon is None and rho is None:
        raise InvalidBudget(
            f"no privacy budget given: pass {e_name} with a positive number "
            f"(or {r_name} for a zCDP budget), together with {d_name}"
        )
    if delta is None:
        raise InvalidBudget(
            f"{d_name} is required: pass {d_name} with a number in (0, 1), e.g. 1e-6"
        )
    d = _parse_number(delta, d_name)
    if not (0.0 < d < 1.0):
        raise InvalidBudget(
            f"{d_name} must be in (0, 1) (got {d}): pass {d_name} with a number such as 1e-6"
        )
    if epsilon is not None:
        e = _parse_number(epsilon, e_name)
        if not (math.isfinite(e) and e > 0):
            raise InvalidBudget(
                f"{e_name} must be > 0 and finite (got {e}): pass {e_name} with a positive number"
            )
        return ApproxDP(e, d)
    r = _parse_number(rho, r_name)
    if not (math.isfinite(r) and r > 0):
        raise InvalidBudget(
            f"{r_name} must be > 0 and finite (got {r}): pass {r_name} with a positive number"
        )
    return ZCDP(r, d / 2.0)


def _parse_number(value: object, flag: str) -> float:
    """float(value) for parse_budget, with an actionable error for non-numbers (YAML reads
    1e-6 as a string: numeric strings are numbers)."""
    if isinstance(value, bool):
        raise InvalidBudget(f"{flag} must be a number (got {value!r}): pass {flag} with a number")
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidBudget(
            f"{flag} must be a number (got {value!r}): pass {flag} with a number"
        ) from None
    if math.isnan(x):
        raise InvalidBudget(f"{flag} must be a number (got nan): pass {flag} with a number")
    return x


def _budget_dict(b: Budget) -> dict[str, float]:
    """JSON-ready fields of a budget."""
    if isinstance(b, ApproxDP):
        return {"epsilon": b.epsilon, "delta": b.delta}
    return {"rho": b.rho, "delta0": b.delta0}


class Accountant:
    """One run's privacy budget: plan per-step grants, charge costs, refuse overspending.

    Composition is basic (ε and δ add; ρ and δ₀ add: Dwork & Roth 2014 Thm 3.16,
    Bun & Steinke 2016 Lemma 2.3). For a ZCDP total, the reported (ε, δ)-DP
    guarantee uses the Canonne–Kamath–Steinke conversion at δ′ =
    ``conversion_delta`` (default: the total's δ₀, so the reported δ is 2·δ₀).
    """

    def __init__(self, total: Budget, conversion_delta: float | None = None) -> None:
        if not isinstance(total, ApproxDP | ZCDP):
            raise TypeError(f"total must be ApproxDP or ZCDP, got {type(total).__name__}")
        self.total: Budget = total
        self._steps: list[tuple[str, Budget]] = []
        self._plan: dict[str, Budget] | None = None
        self.stated: dict[str, Budget] = {}
        """Each planned step's cost as its mechanism stated it (in the total's mode)."""
        self.conversion_delta: float | None = None
        if isinstance(total, ZCDP):
            if conversion_delta is None:
                conversion_delta = total.delta0
            if conversion_delta == 0.0:
                raise InvalidBudget(
                    "a zCDP total with delta0 = 0 needs conversion_delta in (0, 1) to be "
                    "reported as (epsilon, delta)-DP: pass e.g. conversion_delta=1e-6"
                )
            self.conversion_delta = _probability(
                "conversion_delta", conversion_delta, allow_zero=False
            )
            to_approx_dp(total, self.conversion_delta)  # validates δ₀ + δ′ < 1
        elif conversion_delta is not None:
            raise InvalidBudget("conversion_delta applies only to a zCDP total (rho); drop it")

    # -- planning ---------------------------------------------------------

    def split(self, shares: dict[str, tuple[float, float]]) -> dict[str, Budget]:
        """The plan's grants (:func:`planned_grants` of the total); they become the plan that
        :meth:`charge` holds every later charge to."""
        grants = planned_grants(self.total, shares)
        self._plan = dict(grants)
        return grants

    def _as_total_mode(self, cost: Budget) -> Budget:
        """A cost in the total's mode.

        An ApproxDP(ε, δ) cost charged to a ZCDP total counts as ZCDP(ε²/2, δ). This is
        sound for pure-DP steps (δ = 0; Bun & Steinke 2016, Prop 1.4) and for steps whose
        δ is the failure probability of the mechanism's own randomness — i.e. steps that
        are δ-approximately ε²/2-zCDP (Bun & Steinke 2016, Def. 8.1), such as the Laplace
        test of propose-test-release. It is NOT a general (ε, δ)-DP → zCDP conversion.
        A ZCDP cost charged to an ApproxDP total raises TypeError (convert it first with
        :func:`to_approx_dp` and charge the result, if that is what is meant).
        """
        if isinstance(self.total, ApproxDP):
            if isinstance(cost, ZCDP):
                raise TypeError(
                    "cannot charge a zCDP cost to an (epsilon, delta)-DP total: convert it with "
                    "to_approx_dp(cost, conversion_delta) first"
                )
            if not isinstance(cost, ApproxDP):
                raise TypeError(f"cost must be ApproxDP or ZCDP, got {type(cost).__name__}")
            return cost
        if isinstance(cost, ApproxDP):
            return ZCDP(cost.epsilon**2 / 2.0, cost.delta)
        if not isinstance(cost, ZCDP):
            raise TypeError(f"cost must be ApproxDP or ZCDP, got {type(cost).__name__}")
        return cost

    def _sum(self, costs: list[Budget]) -> tuple[float, float]:
        """(Σ privacy parameter, Σ δ) of costs already in the total's mode."""
        if isinstance(self.total, ApproxDP):
            return (
                math.fsum(c.epsilon for c in costs),  # type: ignore[union-attr]
                math.fsum(c.delta for c in costs),  # type: ignore[union-attr]
            )
        return (
            math.fsum(c.rho for c in costs),  # type: ignore[union-attr]
            math.fsum(c.delta0 for c in costs),  # type: ignore[union-attr]
        )

    def _limits(self) -> tuple[float, float]:
        if isinstance(self.total, ApproxDP):
            return self.total.epsilon, self.total.delta
        return self.total.rho, self.total.delta0

    def _fits(self, extra: list[Budget]) -> bool:
        spent_p, spent_d = self._sum([c for _, c in self._steps] + extra)
        lim_p, lim_d = self._limits()
        return spent_p <= lim_p * (1.0 + REL_TOL) and spent_d <= lim_d * (1.0 + REL_TOL)

    def can_afford(self, costs: dict[str, Budget]) -> bool:
        """Whether all these costs together fit in what remains (check a plan before any read)."""
        return self._fits([self._as_total_mode(c) for c in costs.values()])

    def charge(self, step: str, cost: Budget | Any) -> None:
        """Charge a step what its mechanism says it costs; raise BudgetExceeded (charging
        nothing) if that exceeds the step's grant or would overspend the total.

        ``cost`` is a :class:`mechanism.Mechanism` (anything with ``cost() -> Budget``: its
        privacy map at its calibration) or, only while no plan is split (a ledger's runs, a
        stream's batches), a bare budget. Once a plan is split, a step charged by name
        without a mechanism is refused (:class:`UnstatedCost`): its cost must come from the
        noise it adds. The mechanism's stated cost must fit the step's grant; the step is
        then charged its grant (what the plan reserved for it, ≥ the stated cost), so the
        published plan and charges stay one table. :attr:`stated` keeps the stated costs.
        See :meth:`_as_total_mode` for how ApproxDP costs count against a ZCDP total.
        """
        stated = cost.cost() if callable(getattr(cost, "cost", None)) else None
        if stated is None and self._plan is not None:
            raise UnstatedCost(
                f"step '{step}' is charged by name without a mechanism: charge the "
                "Mechanism that adds its noise, so its cost is computed from that noise"
            )
        converted = self._as_total_mode(cost if stated is None else stated)
        self._check_plan(step, converted)
        if stated is not None and self._plan is not None:
            self.stated[step] = converted
            converted = self._as_total_mode(self._plan[step])
        if not self._fits([converted]):
            raise BudgetExceeded(
                f"step '{step}' asks for {_fmt(converted)} but the run has spent "
                f"{_fmt(self.spent)} of {_fmt(self.total)}, leaving {_fmt(self.remaining)}: "
                "lower this step's share or raise the total budget"
            )
        self._steps.append((step, converted))

    def _check_plan(self, step: str, cost: Budget) -> None:
        """Once a plan is split, a charge must be one of its steps, once, within its grant."""
        if self._plan is None:
            return
        if step not in self._plan:
            raise BudgetExceeded(
                f"step '{step}' is not in the budget plan {list(map(str, self._plan))}"
            )
        if any(name == step for name, _ in self._steps):
            raise BudgetExceeded(f"step '{step}' was already charged: each step is charged once")
        planned = self._as_total_mode(self._plan[step])
        (p, d), (lim_p, lim_d) = self._sum([cost]), self._sum([planned])
        if p > lim_p * (1.0 + REL_TOL) or d > lim_d * (1.0 + REL_TOL):
            raise BudgetExceeded(
                f"step '{step}' asks for {_fmt(cost)} but its plan grants {_fmt(planned)}"
            )

    # -- state ------------------------------------------------------------

    @property
    def spent(self) -> Budget:
        """Basic composition of everything charged so far, in the total's mode."""
        p, d = self._sum([c for _, c in self._steps])
        if isinstance(self.total, ApproxDP):
            return ApproxDP(p, d)
        return ZCDP(p, d)

    @property
    def remaining(self) -> Budget:
        """Total minus spent, per component, floored at 0."""
        p, d = self._sum([c for _, c in self._steps])
        lim_p, lim_d = self._limits()
        if isinstance(self.total, ApproxDP):
            return ApproxDP(max(0.0, lim_p - p), max(0.0, lim_d - d))
        return ZCDP(max(0.0, lim_p - p), max(0.0, lim_d - d))

    def spent_as_approx_dp(self) -> ApproxDP:
        """The (ε, δ)-DP guarantee of everything spent so far (CKS conversion for zCDP)."""
        return to_approx_dp(self.spent, self.conversion_delta)

    def report(self) -> dict:
        """JSON-ready summary: mode, total granted, each charge, spent, and spent as (ε, δ)-DP."""
        mode = "approx_dp" if isinstance(self.total, ApproxDP) else "zcdp"
        spent_adp = self.spent_as_approx_dp()
        out: dict = {
            "mode": mode,
            "total_granted": _budget_dict(self.total),
            "steps": [{"step": name, **_budget_dict(c)} for name, c in self._steps],
            "spent": _budget_dict(self.spent),
            "spent_as_approx_dp": {"epsilon": spent_adp.epsilon, "delta": spent_adp.delta},
        }
        if mode == "zcdp":
            total_adp = to_approx_dp(self.total, self.conversion_delta)
            out["total_as_approx_dp"] = {"epsilon": total_adp.epsilon, "delta": total_adp.delta}
            out["conversion"] = CONVERSION_NAME
            out["conversion_delta"] = self.conversion_delta
        return out


def _fmt(b: Budget) -> str:
    """Short human-readable budget, for error messages."""
    if isinstance(b, ApproxDP):
        return f"(epsilon={b.epsilon:.6g}, delta={b.delta:.3g})"
    return f"(rho={b.rho:.6g}, delta0={b.delta0:.3g})"
