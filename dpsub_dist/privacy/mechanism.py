"""Mechanisms that state their own cost: the noise they add and its privacy map, in one object.

A private step is a :class:`Mechanism`: it holds its calibration (the kind of noise, its
scale, the sensitivity it is calibrated for), draws that noise (through :mod:`noise`), and
computes its cost from the calibration alone (:meth:`Mechanism.cost`, its *privacy map*, in
the spirit of OpenDP's measurements and dp_accounting's DpEvents). The accountant charges a
planned step only with a mechanism (:meth:`accountant.Accountant.charge`), and refuses one
whose stated cost exceeds the step's grant: an under-calibrated noise scale cannot be
charged, because the cost is computed from that very scale.

Constructors calibrate a mechanism to a grant (:func:`laplace`, :func:`gaussian`,
:func:`above_threshold`, :func:`truncated_laplace`); the noise is drawn with the scale the
mechanism holds, so the scale that is charged and the scale that is drawn are one value.
Privacy maps (cost of each kind, for the sensitivity Δ its caller certifies):

- Laplace, scale b: ε = Δ/b, pure DP (Dwork & Roth 2014, Thm 3.6).
- Gaussian, σ: under zCDP ρ = Δ²/(2σ²) (Bun & Steinke 2016, Prop 1.6); under (ε, δ)-DP at the
  grant's ε, δ = δ_G(ε; Δ/σ), the exact δ of the Gaussian mechanism (Balle & Wang 2018, Thm
  8). A release gated by an ε₁-DP propose-test-release test enters the composition with
  its δ multiplied by e^{ε₁} (:func:`accountant.after_test`).
- Truncated Laplace (scale λ, bound A): ε = Δ/λ, δ = (e^ε − 1)/(2(e^{A/λ} − 1)) (Geng et al.
  2020; SS21 §3).
- AboveThreshold (threshold scale b_T for shift Δ′, query scale b_Q for Δ):
  ε = Δ′/b_T + 2Δ/b_Q (Dwork & Roth 2014, Thm 3.23, in the discrete form of
  :func:`sparse_vector.above_threshold`).
- Composed parts: basic composition (ε's and δ's add).
- Parallel parts (disjoint units): parallel composition (the largest ε, the largest δ).

The grid widening of :mod:`noise` (rounding the value to the grid) is covered inside the
samplers: a scale calibrated for Δ stays valid for the rounded value, so these maps are
stated for the caller's Δ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsub_dist.privacy import calibration, noise
from dpsub_dist.privacy.accountant import (
    ZCDP,
    ApproxDP,
    Budget,
    after_test,
    gaussian_sigma,
    laplace_epsilon,
)

__all__ = [
    "AboveThreshold",
    "Composed",
    "Gaussian",
    "Laplace",
    "Mechanism",
    "Parallel",
    "Snap",
    "TruncatedLaplace",
    "above_threshold",
    "gaussian",
    "laplace",
    "truncated_laplace",
]


class Mechanism:
    """A calibrated private step: :meth:`cost` is its privacy map at its calibration."""

    def cost(self) -> Budget:
        """What this mechanism costs, computed from its noise parameters alone."""
        raise NotImplementedError


@dataclass(frozen=True)
class Laplace(Mechanism):
    """Laplace noise of ``scale`` on a value of L1 sensitivity ``sensitivity``: ε = Δ/scale."""

    sensitivity: float
    scale: float

    def cost(self) -> Budget:
        return ApproxDP(self.sensitivity / self.scale, 0.0)

    def release(self, rng: np.random.Generator, value, *, coordinates_changed: int | None = None):
        """``value`` plus this noise, on the grid (:func:`noise.add_laplace`)."""
        return noise.add_laplace(
            rng, value, self.scale, self.sensitivity, coordinates_changed=coordinates_changed
        )


@dataclass(frozen=True)
class Gaussian(Mechanism):
    """Gaussian noise σ on a value of L2 sensitivity Δ.

    ``epsilon`` is None for a zCDP calibration (cost ρ = Δ²/(2σ²)), else the ε at which the
    (ε, δ) cost is read off the exact curve δ_G(ε; Δ/σ); ``gate_epsilon`` is the ε₁ of a
    propose-test-release test the release runs behind (its δ counts e^{ε₁} times).
    """

    sensitivity: float
    sigma: float
    epsilon: float | None = None
    gate_epsilon: float = 0.0

    def cost(self) -> Budget:
        if self.epsilon is None:
            return ZCDP(self.sensitivity**2 / (2.0 * self.sigma**2), 0.0)
        delta = calibration.gaussian_delta(self.sensitivity, self.sigma, self.epsilon)
        return ApproxDP(self.epsilon, min(delta * math.exp(self.gate_epsilon), 1.0 - 1e-16))

    def release(self, rng: np.random.Generator, value, *, coordinates_changed: int | None = None):
        """``value`` plus this noise, on the grid (:func:`noise.add_gaussian`)."""
        return noise.add_gaussian(
            rng, value, self.sigma, self.sensitivity, coordinates_changed=coordinates_changed
        )

    def release_symmetric(self, rng: np.random.Generator, matrix: np.ndarray) -> np.ndarray:
        """Symmetric matrix noise (:func:`noise.add_symmetric_gaussian`), same privacy map."""
        return noise.add_symmetric_gaussian(rng, matrix, self.sigma, self.sensitivity)


@dataclass(frozen=True)
class TruncatedLaplace(Mechanism):
    """Laplace of ``scale`` truncated to ±``bound`` (SS21 TLap): (Δ/λ, (e^ε−1)/(2(e^{A/λ}−1)))."""

    sensitivity: float
    scale: float
    bound: float

    def cost(self) -> Budget:
        epsilon = self.sensitivity / self.scale
        return ApproxDP(epsilon, math.expm1(epsilon) / (2.0 * math.expm1(self.bound / self.scale)))

    def release(self, rng: np.random.Generator, value: float) -> float:
        """``value`` plus this noise, on the grid (:func:`noise.add_truncated_laplace`)."""
        return noise.add_truncated_laplace(rng, value, self.scale, self.bound, self.sensitivity)


@dataclass(frozen=True)
class AboveThreshold(Mechanism):
    """Sparse vector: threshold noise ``threshold_scale`` (shift ≤ ``threshold_sensitivity``),
    query noise ``query_scale`` (queries of sensitivity ``sensitivity``); ε = Δ′/b_T + 2Δ/b_Q."""

    sensitivity: float
    query_scale: float
    threshold_sensitivity: float
    threshold_scale: float

    def cost(self) -> Budget:
        return ApproxDP(
            self.threshold_sensitivity / self.threshold_scale
            + 2.0 * self.sensitivity / self.query_scale,
            0.0,
        )


@dataclass(frozen=True)
class Snap(Mechanism):
    """Randomised rounding of ``entries`` values that move by ≤ ``shift`` (L2) to a grid of
    ``side`` with a private uniform offset: neighbours' outputs differ w.p. ≤ √D·Δ/w, so
    (0, √D·Δ/w) (SS21 Alg. 1 step 6)."""

    entries: int
    shift: float
    side: float

    def cost(self) -> Budget:
        return ApproxDP(0.0, math.sqrt(self.entries) * self.shift / self.side)


@dataclass(frozen=True)
class Composed(Mechanism):
    """Parts run on the same data: basic composition (Dwork & Roth 2014, Thm 3.16)."""

    parts: tuple[Mechanism, ...]

    def cost(self) -> Budget:
        costs = [p.cost() for p in self.parts]
        if all(isinstance(c, ApproxDP) for c in costs):
            return ApproxDP(
                math.fsum(c.epsilon for c in costs),  # type: ignore[union-attr]
                math.fsum(c.delta for c in costs),  # type: ignore[union-attr]
            )
        if all(isinstance(c, ZCDP) for c in costs):
            return ZCDP(
                math.fsum(c.rho for c in costs),  # type: ignore[union-attr]
                math.fsum(c.delta0 for c in costs),  # type: ignore[union-attr]
            )
        raise TypeError("compose parts of one mode only")


@dataclass(frozen=True)
class Parallel(Mechanism):
    """Parts run on disjoint units, so one unit reaches one part only: parallel composition
    (McSherry 2009), the largest ε and the largest δ (ρ and δ₀ under zCDP) over the parts."""

    parts: tuple[Mechanism, ...]

    def cost(self) -> Budget:
        costs = [p.cost() for p in self.parts]
        if all(isinstance(c, ApproxDP) for c in costs):
            return ApproxDP(
                max(c.epsilon for c in costs),  # type: ignore[union-attr]
                max(c.delta for c in costs),  # type: ignore[union-attr]
            )
        if all(isinstance(c, ZCDP) for c in costs):
            return ZCDP(
                max(c.rho for c in costs),  # type: ignore[union-attr]
                max(c.delta0 for c in costs),  # type: ignore[union-attr]
            )
        raise TypeError("compose parts of one mode only")


# --------------------------------------------------------------------------- calibration


def laplace(grant: Budget, sensitivity: float) -> Laplace:
    """Laplace calibrated to ``grant``: scale Δ/ε, ε = :func:`laplace_epsilon` (√(2ρ) for zCDP)."""
    return Laplace(sensitivity, sensitivity / laplace_epsilon(grant))


def gaussian(grant: Budget, sensitivity: float, gate: Budget | None = None) -> Gaussian:
    """Gaussian calibrated to ``grant`` (:func:`accountant.gaussian_sigma`); behind a PTR
    test of grant ``gate``, calibrated for :func:`accountant.after_test` (both compose to
    the two grants)."""
    target = grant if gate is None else after_test(grant, gate)
    sigma = gaussian_sigma(target, sensitivity)
    if isinstance(grant, ZCDP):
        return Gaussian(sensitivity, sigma)
    gate_epsilon = 0.0 if gate is None else laplace_epsilon(gate)
    return Gaussian(sensitivity, sigma, grant.epsilon, gate_epsilon)


def truncated_laplace(sensitivity: float, epsilon: float, delta: float) -> TruncatedLaplace:
    """TLap(Δ, ε, δ) (:func:`noise.truncated_laplace_calibration`)."""
    scale, bound = noise.truncated_laplace_calibration(sensitivity, epsilon, delta)
    return TruncatedLaplace(sensitivity, scale, bound)


def above_threshold(sensitivity: float, epsilon: float) -> AboveThreshold:
    """AboveThreshold at ε: queries Lap(4Δ/ε) on their grid g, threshold Lap(2Δ′/ε), Δ′ = Δ + g."""
    if not (epsilon > 0 and sensitivity > 0):
        raise ValueError("epsilon and sensitivity must be > 0")
    query_scale = 4 * sensitivity / epsilon
    shifted = sensitivity + noise.grid_step(query_scale)
    return AboveThreshold(sensitivity, query_scale, shifted, 2 * shifted / epsilon)
