"""Noise scales for the Gaussian mechanism under (ε, δ)-DP and ρ-zCDP.

Pure functions (NumPy/SciPy only). ``sensitivity`` is always the L2
sensitivity Δ of the released quantity under the neighbour relation the
caller is calibrating for (ALGORITHMS.md §0).

- :func:`classic_gaussian_sigma` — Dwork & Roth (2014), Thm A.1 (ε < 1 only).
- :func:`analytic_gaussian_sigma` — Balle & Wang (ICML 2018), "Improving the
  Gaussian mechanism for differential privacy", Thm 8 / Algorithm 1: the
  smallest σ for which the Gaussian mechanism is (ε, δ)-DP, any ε > 0.
- :func:`gaussian_delta` — the exact δ(ε) of the Gaussian mechanism
  (Balle & Wang 2018, Thm 8), used to verify the calibration.
- :func:`gaussian_sigma_zcdp` — Bun & Steinke (TCC 2016), Prop 1.6.
"""

from __future__ import annotations

import math

from scipy.special import log_ndtr

__all__ = [
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
    "gaussian_delta",
    "gaussian_sigma_approx_dp",
    "gaussian_sigma_zcdp",
]


def _check_positive(name: str, value: float) -> float:
    """Return ``value`` as float if it is a positive finite number, else raise ValueError."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive finite number (got {value!r})") from None
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a positive finite number, i.e. in (0, inf) (got {x})")
    return x


def _check_delta(value: float, name: str = "delta") -> float:
    """Return ``value`` as float if 0 < value < 1, else raise ValueError."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1) (got {value!r})") from None
    if not (0.0 < x < 1.0):
        raise ValueError(f"{name} must be in the open interval (0, 1) (got {x})")
    return x


def classic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = Δ·√(2 ln(1.25/δ))/ε (Dwork & Roth 2014, Thm A.1); valid only for 0 < ε < 1."""
    sensitivity = _check_positive("sensitivity", sensitivity)
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
    if epsilon >= 1.0:
        raise ValueError(
            f"epsilon must be in (0, 1) for the classic Gaussian calibration (got {epsilon}); "
            "use analytic_gaussian_sigma, which is valid for any epsilon > 0"
        )
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def _log1mexp(x: float) -> float:
    """log(1 − eˣ) for x ≤ 0, accurate on both sides of −ln 2 (Mächler 2012)."""
    if x >= 0.0:
        return -math.inf
    if x > -math.log(2.0):
        return math.log(-math.expm1(x))
    return math.log1p(-math.exp(x))


def _log_gaussian_delta(sensitivity: float, sigma: float, epsilon: float) -> float:
    """log δ for the Gaussian mechanism N(0, σ²) with L2 sensitivity Δ (Balle & Wang 2018, Thm 8).

    δ = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ), evaluated in log space with
    ``log_ndtr`` so that it stays accurate when both terms are tiny (large ε).
    """
    a = sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    b = -sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    log_pa = float(log_ndtr(a))
    log_pb = float(log_ndtr(b))
    if log_pa == -math.inf:
        return -math.inf
    return log_pa + _log1mexp(epsilon + log_pb - log_pa)


def gaussian_delta(sensitivity: float, sigma: float, epsilon: float) -> float:
    """Exact δ for which N(0, σ²) noise, L2 sensitivity Δ, is (ε, δ)-DP (Balle & Wang 2018, Thm 8).

    δ(ε) = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ); this is tight: no smaller δ holds.
    """
    sensitivity = _check_positive("sensitivity", sensitivity)
    sigma = _check_positive("sigma", sigma)
    epsilon = _check_positive("epsilon", epsilon)
    return math.exp(_log_gaussian_delta(sensitivity, sigma, epsilon))


def analytic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ making N(0, σ²) noise (ε, δ)-DP for L2 sensitivity Δ, any ε > 0.

    Balle & Wang (ICML 2018), Algorithm 1 ("analytic Gaussian mechanism"): solve
    Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) = δ for σ. δ(σ) decreases
    monotonically from 1 (σ → 0) to 0 (σ → ∞), so we bracket the root in log σ
    and use Brent's method on log δ(σ) − log δ. The returned σ is nudged up if
    needed so that ``gaussian_delta(Δ, σ, ε) <= δ`` holds in floating point.
    """
    sensitivity = _check_positive("sensitivity", sensitivity)
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
    log_target = math.log(delta)

    def excess(log_sigma: float) -> float:
        return _log_gaussian_delta(sensitivity, math.exp(log_sigma), epsilon) - log_target

    # Start from the scale of the classic formula (a good guess for any ε) and expand.
    guess = math.log(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)
    lo, hi = guess - 1.0, guess + 1.0
    for _ in range(200):
        if excess(lo) > 0:
            break
        lo -= 2.0
    else:  # pragma: no cover - δ(σ) → 1 as σ → 0, so this cannot happen
        raise RuntimeError("could not bracket the analytic Gaussian sigma from below")
    for _ in range(200):
        if excess(hi) <= 0:
            break
        hi += 2.0
    else:  # pragma: no cover - δ(σ) → 0 as σ → ∞
        raise RuntimeError("could not bracket the analytic Gaussian sigma from above")

    from scipy.optimize import brentq  # 0.3 CPU s to import: only where a σ is calibrated

    log_sigma = brentq(excess, lo, hi, xtol=1e-15, rtol=4 * 2.0**-52, maxiter=500)
    sigma = math.exp(log_sigma)
    # Err on the private side: never return a σ whose achieved δ exceeds the target.
    while _log_gaussian_delta(sensitivity, sigma, epsilon) > log_target:
        sigma *= 1.0 + 1e-12
    return sigma


def gaussian_sigma_approx_dp(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ for (ε, δ)-DP: min(classic, analytic) when ε < 1 (Dwork–Roth Thm A.1), else analytic."""
    analytic = analytic_gaussian_sigma(sensitivity, epsilon, delta)
    if epsilon < 1.0:
        return min(classic_gaussian_sigma(sensitivity, epsilon, delta), analytic)
    return analytic


def gaussian_sigma_zcdp(sensitivity: float, rho: float) -> float:
    """σ = Δ/√(2ρ): N(0, σ²) with L2 sensitivity Δ is Δ²/(2σ²)-zCDP (Bun–Steinke 2016, Prop 1.6)."""
    sensitivity = _check_positive("sensitivity", sensitivity)
    rho = _check_positive("rho", rho)
    return sensitivity / math.sqrt(2.0 * rho)
