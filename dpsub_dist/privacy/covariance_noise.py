"""Covariance perturbation (DTTZ14; ALGORITHMS.md §7): Analyze Gauss, subspace perturbation, mean.

Input domain: the Gram matrix ``G = AᵀA`` (d×d) of rows clipped to a public norm bound ``B`` and
scaled by ``1/B``, so every row has norm ≤ 1 (at user level every user's rows are further scaled
so that their squared norms sum to ≤ 1), and, for centring, the sum of those rows.

Neighbour relations (ALGORITHMS.md §0) and what one unit can change (:data:`SENSITIVITY`):

- ``"replace"`` (row level, ``n`` public): ``G′ = G + aaᵀ − bbᵀ`` with ``‖a‖, ‖b‖ ≤ 1``.
  ``‖aaᵀ − bbᵀ‖_F² = ‖a‖⁴ + ‖b‖⁴ − 2(a·b)² ≤ 2``; the noise is added to the upper triangle
  (with diagonal), whose L2 norm is at most the Frobenius norm, so Δ = √2. The row sum moves by
  ``a − b``: Δ = 2.
- ``"add_remove"`` (user level): ``G′ = G ± E`` with ``E`` positive semidefinite of trace ≤ 1,
  so ``‖E‖_F ≤ 1``: Δ = 1 (DTTZ14's setting). The row sum is not bounded by the per-user
  rescaling, so centring is not offered at user level.

Subspace perturbation (DTTZ14 Alg. 2) needs two more facts. (i) Every eigenvalue moves by at
most ``‖E‖_op ≤ 1`` (Weyl), so the gap ``λ_k − λ_{k+1}`` moves by at most 2 under either
relation. (ii) The top-k projector ``P`` moves, in Frobenius norm, by at most
``c/(gap − s)`` when ``gap > s``: from the Davis–Kahan sinΘ theorem,
``‖(I−P)P′‖_F ≤ ‖(I−P)EP′‖_F/(gap − 1)``, and for a rank-one term ``xxᵀ`` of ``E``,
``‖(I−P)x‖·‖P′x‖ ≤ ‖(I−P)x‖(‖Px‖ + ‖P′−P‖‖x‖) ≤ ‖x‖²(1/2 + ‖(I−P)P′‖_F)``. Solving gives
``‖P − P′‖_F = √2‖(I−P)P′‖_F ≤ 1/(√2(gap − 2))`` for add/remove (within DTTZ14's
``1/(gap − 2)``, which we use) and ``√2/(gap − 3)`` for replace-one (two rank-one terms).
The gap itself is only known through a private lower bound, which is what the noise is
calibrated with (propose–test–release).

Pure NumPy/SciPy; DP noise only from :mod:`dpsub_dist.privacy.noise` (on its grid).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpsub_dist.linalg import top_eigenvectors
from dpsub_dist.privacy import mechanism, noise
from dpsub_dist.privacy.accountant import ZCDP, ApproxDP, Budget

Neighbours = Literal["replace", "add_remove"]


@dataclass(frozen=True)
class CovarianceSensitivity:
    """What one unit can change, for one neighbour relation (module docstring)."""

    gram: float
    """L2 sensitivity of the upper triangle (with diagonal) of AᵀA."""
    gap: float
    """Largest change of λ_k − λ_{k+1}."""
    projector_scale: float
    projector_shift: float
    """‖P − P′‖_F ≤ projector_scale / (gap − projector_shift) whenever gap > projector_shift."""
    row_sum: float | None
    """L2 sensitivity of the sum of the scaled rows (None: centring not available)."""

    def projector(self, gap_lower_bound: float) -> float | None:
        """Sensitivity of the top-k projector given a lower bound on the gap, or None (⊥)."""
        room = gap_lower_bound - self.projector_shift
        if not (math.isfinite(room) and room > 0):
            return None
        return self.projector_scale / room


SENSITIVITY: dict[str, CovarianceSensitivity] = {
    "replace": CovarianceSensitivity(
        gram=math.sqrt(2.0),
        gap=2.0,
        projector_scale=math.sqrt(2.0),
        projector_shift=3.0,
        row_sum=2.0,
    ),
    "add_remove": CovarianceSensitivity(
        gram=1.0, gap=2.0, projector_scale=1.0, projector_shift=2.0, row_sum=None
    ),
}


@dataclass(frozen=True)
class GaussRelease:
    """Analyze Gauss output: the noisy Gram matrix and the noise it got."""

    matrix: np.ndarray
    sigma: float
    sensitivity: float


def analyze_gauss(
    gram: np.ndarray, gaussian: mechanism.Gaussian, rng: np.random.Generator
) -> GaussRelease:
    """DTTZ14 Alg. 1 (Analyze Gauss): ``AᵀA + E``, E symmetric, upper triangle i.i.d. N(0, σ²)
    with σ the ``gaussian`` mechanism's (step ``gram_noise``).

    The mechanism is calibrated by :func:`mechanism.gaussian` for the Gram's L2 sensitivity
    (√2 replace-one, 1 add/remove; :data:`SENSITIVITY`): analytic Gaussian (Balle & Wang
    2018) or the classic ``Δ√(2 ln(1.25/δ))/ε``, whichever is smaller, for (ε, δ); ``Δ/√(2ρ)``
    for ρ-zCDP. The caller takes the top-k eigenvectors (post-processing).
    """
    noisy = gaussian.release_symmetric(rng, _square(gram))
    return GaussRelease(noisy, gaussian.sigma, gaussian.sensitivity)


@dataclass(frozen=True)
class GapRelease:
    """Subspace perturbation output; ``basis`` and ``noisy_projector`` are None for ⊥."""

    basis: np.ndarray | None
    noisy_projector: np.ndarray | None
    noisy_gap: float
    gap_lower_bound: float
    gap_noise: str
    gap_noise_scale: float
    projector_sensitivity: float | None
    sigma: float | None


def noisy_gap_lower_bound(
    gap: float,
    test: mechanism.Laplace | mechanism.Gaussian,
    failure: float,
    rng: np.random.Generator,
) -> tuple[float, float, str, float]:
    """Private eigengap and a lower bound on the true gap that fails with probability
    ≤ ``failure`` (:func:`gap_failure`), drawn with the ``test`` mechanism
    (:func:`gap_test_mechanism`).

    Laplace (an (ε, δ) grant, DTTZ14 Alg. 2 step 1–2): ``d̂ = gap + Lap(Δ/ε)`` on the noise
    grid (:func:`noise.add_laplace`), bound ``d̂ − x`` with ``x`` the grid point that the noise
    exceeds with probability ≤ δ/2 (:func:`noise.laplace_tail`; ≈ (Δ/ε) ln(1/δ)).
    Gaussian (a ρ-zCDP grant, T24 §3.8.4): ``d̂ = gap + N_Z(0, σ²)``, ``σ = Δ/√(2ρ)``
    (:func:`noise.add_gaussian`), bound ``d̂ − x`` with P(noise ≥ x) ≤ δ₀
    (:func:`noise.gaussian_tail`, subgaussian tail). Both ``d̂`` and ``x`` lie on the same
    power-of-two grid, so the bound is exact: it is a function of released values only.
    Returns ``(d̂, lower bound, noise name, noise scale)``.
    """
    noisy = test.release(rng, gap)
    if isinstance(test, mechanism.Gaussian):
        tail = noise.gaussian_tail(test.sigma, test.sensitivity, failure)
        return noisy, noisy - tail, "gaussian", test.sigma
    tail = noise.laplace_tail(test.scale, test.sensitivity, failure)
    return noisy, noisy - tail, "laplace", test.scale


def gap_failure(grant: Budget) -> float:
    """The probability that the gap test's lower bound exceeds the true gap: δ₀ of a zCDP
    grant, δ/2 of an (ε, δ) grant (the Gaussian release behind it takes the other half)."""
    return grant.delta0 if isinstance(grant, ZCDP) else grant.delta / 2  # type: ignore[union-attr]


def gap_test_mechanism(grant: Budget, sensitivity: float) -> mechanism.Laplace | mechanism.Gaussian:
    """Step ``gap_test``: the eigengap + Lap(Δ/ε) for an (ε, δ) grant, + N_Z(0, Δ²/(2ρ)) for
    a zCDP grant (T24 §3.8.4); the grant's δ is the failure probability of the lower bound."""
    if isinstance(grant, ZCDP):
        if not 0 < grant.delta0 < 1:
            raise ValueError("the gap test needs delta0 in (0, 1): give it a delta share")
        return mechanism.gaussian(grant, sensitivity)
    if not isinstance(grant, ApproxDP) or not 0 < grant.delta < 1:
        raise ValueError("the gap test needs an (epsilon, delta) grant with delta in (0, 1)")
    return mechanism.laplace(grant, sensitivity)


def projector_mechanism(noise_grant: Budget, sensitivity: float = 1.0) -> mechanism.Gaussian:
    """Step ``projector_noise``: V_kV_kᵀ + symmetric Gaussian for sensitivity c/(L − s), known
    once the gap test released L (at Δ = 1: the same privacy map, which depends on σ/Δ only;
    what a ⊥ forgoes)."""
    return mechanism.gaussian(noise_grant, sensitivity)


def eigengap(gram: np.ndarray, k: int) -> tuple[float, np.ndarray]:
    """``λ_k − λ_{k+1}`` of ``gram`` and its top-k eigenvectors V_k (the private input of
    DTTZ14 Alg. 2; nothing here is released)."""
    gram = _square(gram)
    dim = gram.shape[0]
    if not 1 <= k < dim:
        raise ValueError(f"k must be in [1, {dim - 1}] for a {dim}×{dim} matrix (got {k})")
    values, vectors = top_eigenvectors(gram, k + 1)
    return float(values[k - 1] - values[k]), vectors[:, :k]


def perturb_projector(
    top: np.ndarray, projector: mechanism.Gaussian, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """DTTZ14 Alg. 2 step 3: ``Ŵ = V_kV_kᵀ + E``, E symmetric Gaussian of the ``projector``
    mechanism (:func:`projector_mechanism` at c/(L − s)); returns the top-k eigenvectors of
    Ŵ and Ŵ.

    Privacy: with probability ≥ 1 − δ₁ the released L ≤ d, and then ‖P − P′‖_F ≤ c/(L − s)
    (module docstring), so this step is the projector grant's private given d̂; with the gap
    test: (ε₁ + ε₂, δ₁ + δ₂)-DP for (ε, δ) grants (the failure mass is added once, the
    Gaussian δ₂ is integrated against d̂'s density), or δ₁-approximate (ρ₁ + ρ₂)-zCDP."""
    noisy = projector.release_symmetric(rng, top @ top.T)
    return top_eigenvectors(noisy, top.shape[1])[1], noisy


@dataclass(frozen=True)
class MeanRelease:
    """Gaussian-mechanism mean of the scaled rows."""

    mean: np.ndarray
    sigma: float
    sensitivity: float


def gaussian_mean(
    row_sum: np.ndarray,
    n_rows: int,
    mech: mechanism.Gaussian,
    rng: np.random.Generator,
    unit: float = 1.0,
) -> MeanRelease:
    """The Gaussian ``mech`` on the mean of norm-≤1 rows, in units of ``unit`` (the row-norm
    bound).

    ``mech`` is calibrated (:func:`mechanism.gaussian`) for the sum's L2 sensitivity
    (2 replace-one: ``a − b``; :data:`SENSITIVITY`); the sum is scaled by ``unit/n`` first
    (``n`` is public under replace-one neighbours), so the released mean
    ``unit·Σ x_i/n + N_Z(0, (unit·σ/n)²)`` is the same mechanism with Δ and σ both scaled by
    ``unit/n``, drawn by :func:`noise.add_gaussian`: the published mean lies on its
    power-of-two grid. Used to centre the covariance
    (ALGORITHMS.md §7); ``sigma`` and ``sensitivity`` are reported for the sum.
    """
    if n_rows < 1:
        raise ValueError(f"n_rows must be ≥ 1 (got {n_rows})")
    factor = unit / n_rows
    row_sum = np.asarray(row_sum, dtype=np.float64)
    scaled = dataclasses.replace(  # same σ/Δ, so the same privacy map
        mech, sensitivity=mech.sensitivity * factor, sigma=mech.sigma * factor
    )
    return MeanRelease(scaled.release(rng, row_sum * factor), mech.sigma, mech.sensitivity)


def _square(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"expected a square d×d matrix, got shape {matrix.shape}")
    return matrix
