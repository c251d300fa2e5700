"""Empirical privacy audits of the covariance mechanisms (ALGORITHMS.md §7, §10).

Each audit runs the real mechanism on the most distinguishable replace-one neighbours we know
for it, bounds ε from below with Clopper–Pearson intervals (tests/privacy_audit.py), and checks
(a) the bound stays below the claimed ε and (b) a twin with half the noise — the same code with
one factor changed through monkeypatch — is caught (bound above the claimed ε). Event thresholds
are placed where the twin is most exposed; runs are chosen so that the twin's expected bound
clears the claim with margin (planned with the exact Gaussian/Laplace tail probabilities).

The analytic σ is cached during the audits (``gaussian_sigma`` is a pure function of the grant
and the sensitivity); that only saves the root-finding on every one of ~10⁵ calls.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from contexts import planned
from privacy_audit import audit, scale_samplers

from dpsub_dist.methods.gauss import perturb_subspace
from dpsub_dist.privacy import covariance_noise as cov
from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import ApproxDP, gaussian_sigma

RUNS = 30_000
EPSILON, DELTA = 2.0, 1e-5
"""Claimed budget of the Gaussian audits: at ε = 2 a halved σ shows in ~10⁴ runs."""


@pytest.fixture()
def cached_sigma(monkeypatch):
    """The real calibration, memoised; returns a setter for the twin's noise factor.

    σ is linear in the sensitivity for a fixed grant (δ(ε) depends on Δ/σ only), so one
    root-finding per grant serves every sensitivity the noisy gap produces.
    """
    real = functools.lru_cache(maxsize=None)(gaussian_sigma)
    factor = {"value": 1.0}
    # the Gaussian steps' calibration seam: mechanism.gaussian (privacy/mechanism.py)
    monkeypatch.setattr(
        mechanism, "gaussian_sigma", lambda g, s: factor["value"] * s * real(g, 1.0)
    )

    def set_factor(value: float) -> None:
        factor["value"] = value

    return set_factor


def _assert_audit(run, claimed: float) -> None:
    honest, twin = run(1.0), run(0.5)
    assert honest.epsilon_lower < claimed, honest
    assert twin.epsilon_lower > claimed, twin


def test_analyze_gauss_audit_catches_half_noise(cached_sigma) -> None:
    """Replace row e₂ by e₁: AᵀA moves by diag(1, −1) (upper-triangle norm √2 = Δ)."""
    grant = ApproxDP(EPSILON, DELTA)
    sens = cov.SENSITIVITY["replace"].gram
    before, after = np.diag([0.0, 1.0]), np.diag([1.0, 0.0])
    twin_spread = math.sqrt(2) * gaussian_sigma(grant, sens) / 2  # std of C₁₁ − C₂₂, twin

    def run(factor: float):
        cached_sigma(factor)
        return audit(
            lambda gram, rng: cov.analyze_gauss(gram, mechanism.gaussian(grant, sens), rng).matrix,
            after,
            before,
            lambda m: m[0, 0] - m[1, 1] > -1.0 + 3.0 * twin_spread,
            RUNS,
            DELTA,
        )

    _assert_audit(run, EPSILON)


def _seed(rng: np.random.Generator) -> int:
    """A run's private seed from the audit's generator (one context per run)."""
    return int(rng.integers(2**63))


def test_gap_perturbation_projector_audit_catches_half_noise(cached_sigma, monkeypatch) -> None:
    """Top eigenvector (e₁+e₂)/√2 with a huge gap g; replacing e₂ by e₁ turns it by ≈ 1/g.

    The projector moves along diag(1, −1): its upper triangle has the full Frobenius norm
    √2/g, within 0.1% of the √2/(L − 3) bound the noise is calibrated for. The twin's noise
    is halved below the accountant (which refuses an under-calibrated projector mechanism,
    the one it charges being the one that draws).
    """
    set_factor = scale_samplers(monkeypatch, "add_symmetric_gaussian")
    noise_grant = ApproxDP(EPSILON, DELTA / 2)
    claimed = 0.01 + EPSILON
    g = 1e6
    u = np.array([1.0, 1.0]) / math.sqrt(2)
    before = g * np.outer(u, u) + np.diag([0.0, 1.0])
    after = g * np.outer(u, u) + np.diag([1.0, 0.0])
    lower = g - 2 / 0.01 * math.log(2 / DELTA)
    sigma = gaussian_sigma(noise_grant, math.sqrt(2) / (lower - 3))
    twin_spread = math.sqrt(2) * sigma / 2
    top = np.linalg.eigh(after)[1][:, -1]
    shift = top[0] ** 2 - top[1] ** 2  # E[W₁₁ − W₂₂]: +shift after, −shift before

    shares = {"gap_test": (0.01, 0.5), "projector_noise": (EPSILON, 0.5)}

    def mechanism(gram, rng):
        ctx = planned(shares, _seed(rng), epsilon=claimed, delta=DELTA)
        return perturb_subspace(ctx, gram, 1, "replace")

    def event(release) -> bool:
        w = release.noisy_projector
        return w is not None and w[0, 0] - w[1, 1] > -shift + 3.0 * twin_spread

    def run(factor: float):
        set_factor(factor)
        return audit(mechanism, after, before, event, 50_000, DELTA)

    assert mechanism(after, np.random.default_rng(0)).basis is not None
    _assert_audit(run, claimed)


def test_gap_perturbation_gap_test_audit_catches_half_laplace(cached_sigma, monkeypatch) -> None:
    """Replace e₂ by e₁ in diag(g, 1): the gap moves from g − 1 to g + 1 (Δ = 2)."""
    shares = {"gap_test": (1.0, 0.5), "projector_noise": (0.2, 0.5)}
    claimed = 1.2
    g = 50.0
    before, after = np.diag([g, 1.0]), np.diag([g + 1.0, 0.0])
    set_factor = scale_samplers(monkeypatch, "add_laplace")

    def run(value: float):
        set_factor(value)
        return audit(
            lambda gram, rng: perturb_subspace(
                planned(shares, _seed(rng), epsilon=claimed, delta=DELTA), gram, 1, "replace"
            ),
            after,
            before,
            lambda release: release.noisy_gap > g + 1.0 + 2.0,
            20_000,
            DELTA,
        )

    _assert_audit(run, claimed)


def test_gaussian_mean_audit_catches_half_noise(cached_sigma) -> None:
    """One row −e₁ replaced by +e₁: the sum moves by 2 = Δ."""
    grant = ApproxDP(EPSILON, DELTA)
    twin_spread = gaussian_sigma(grant, 2.0) / 2

    def run(factor: float):
        cached_sigma(factor)
        return audit(
            lambda row_sum, rng: cov.gaussian_mean(
                row_sum, 1, mechanism.gaussian(grant, 2.0), rng
            ).mean[0],
            np.array([1.0]),
            np.array([-1.0]),
            lambda mean: mean > -1.0 + 3.0 * twin_spread,
            RUNS,
            DELTA,
        )

    _assert_audit(run, EPSILON)
