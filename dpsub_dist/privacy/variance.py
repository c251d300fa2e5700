"""Private explained variance of a released basis (row level): a Gaussian on k + 1 sums.

Given a basis ``V = (v_1 … v_k)`` that is already released (public for this step), a public
centre ``μ̂`` (a released mean, or 0) and a clipping bound ``C`` (released by a private
norm-bound step), every row contributes the vector

    u(x) = ((v_1ᵀz)², …, (v_kᵀz)², ‖z‖²),   z = clip(x − μ̂, C) / C   (‖z‖ ≤ 1),

and the step releases ``Σ_rows u(x)`` with Gaussian noise, scaled to input units by ``C²/n``.

Sensitivity (replace one row, n public): write ``u(a) = (a_1 … a_k, L_a)`` with ``a_i = (v_iᵀz)²
≥ 0`` and ``L_a = ‖z‖² ∈ [0, 1]``; V is orthonormal, so ``Σ_i a_i ≤ L_a`` and ``Σ_i a_i² ≤
L_a²``. Replacing row a by row b moves the sum by ``u(a) − u(b)`` with ``Σ_i (a_i − b_i)² ≤ Σ_i
a_i² + Σ_i b_i² ≤ L_a² + L_b²`` (non-negative entries), so ``‖u(a) − u(b)‖² ≤ L_a² + L_b² + (L_a
− L_b)² = 2L_a² + 2L_b² − 2L_aL_b ≤ 2`` (convex in each of L_a, L_b ∈ [0, 1]: the maximum is at
a corner, 2 at (1, 1) and (1, 0)). Hence ``Δ = √2`` in L2, reached by a = v_1, b = 0. The
Gaussian mechanism at σ = :func:`accountant.gaussian_sigma` for Δ (analytic Gaussian for (ε, δ),
Δ/√(2ρ) for zCDP) is then exactly as private as the grant charged for it, for every fixed (V,
μ̂, C): by composition with the steps that released them, the run stays within its budget. The
sums are scaled by the public ``C²/n`` before the draw (Δ and σ scaled alike) and drawn by
:func:`noise.add_gaussian`, so the published values lie on its power-of-two grid; everything
derived from them (clipping at 0, ratios, the order of the components) is post-processing.

User level is not offered: one user's rows move the sums by up to their row count, and n is
private there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsub_dist.privacy import noise
from dpsub_dist.privacy.accountant import Budget, gaussian_sigma

SENSITIVITY = math.sqrt(2.0)
"""L2 sensitivity of Σ u(x) under replace-one (module docstring)."""


def projected_sums(rows: np.ndarray, basis: np.ndarray, bound: float) -> np.ndarray:
    """``Σ u(x)`` of these rows (already centred): k squared projections and the squared norm,
    of the rows clipped to norm ≤ ``bound`` and scaled by 1/bound (runs on a worker)."""
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    scaled = rows * (1.0 / np.maximum(norms, bound))[:, None]
    projected = scaled @ basis
    return np.append((projected**2).sum(axis=0), float(np.einsum("ij,ij->", scaled, scaled)))


@dataclass(frozen=True)
class VarianceRelease:
    """Noisy per-component variances and total variance, input units (divided by n)."""

    values: np.ndarray
    total: float
    sigma: float
    sensitivity: float


def private_variances(
    sums: np.ndarray, n_rows: int, bound: float, grant: Budget, rng: np.random.Generator
) -> VarianceRelease:
    """Gaussian mechanism on :func:`projected_sums` totals, released as ``C²/n``·(sums + noise).

    ``sigma`` is reported for the unscaled sums (Δ = :data:`SENSITIVITY`); the draw is at
    ``sigma·C²/n`` for ``Δ·C²/n`` (module docstring).
    """
    if n_rows < 1:
        raise ValueError(f"n_rows must be ≥ 1 (got {n_rows})")
    factor = bound**2 / n_rows
    sigma = gaussian_sigma(grant, SENSITIVITY)
    noisy = noise.add_gaussian(
        rng, np.asarray(sums, dtype=np.float64) * factor, sigma * factor, SENSITIVITY * factor
    )
    return VarianceRelease(noisy[:-1], float(noisy[-1]), sigma, SENSITIVITY)
