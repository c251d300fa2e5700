"""Private explained variance of a released basis (row level): a Gaussian on a k×k matrix.

Given a basis ``V = (v_1 … v_k)`` that is already released (public for this step), a public
centre ``μ̂`` (a released mean, or 0) and a clipping bound ``C`` (released by a private
norm-bound step), every row contributes

    u(x) = (upper triangle of P_z, ‖z‖²),   P_z = (Vᵀz)(Vᵀz)ᵀ,   z = clip(x − μ̂, C) / C,

and the step releases ``Σ_rows u(x)`` with Gaussian noise, scaled to input units by ``C²/n``:
a noisy k×k covariance of the rows projected on V, and a noisy total variance. Its eigenvectors
rotate V to the principal axes *within* the released subspace and its eigenvalues are the
explained variances (post-processing): a basis from sample and aggregate or gap-perturb is any
orthonormal basis of the subspace, so per-column variances alone would not order it.

Sensitivity (replace one row, n public): ``P_z`` is positive semidefinite of rank one with
``‖P_z‖_F = ‖Vᵀz‖² ≤ ‖z‖² = L_z ≤ 1`` (V orthonormal). Replacing row a by row b moves the sum
by ``u(a) − u(b)``; the upper triangle's L2 norm is at most the Frobenius norm, and
``‖P_a − P_b‖_F² = ‖P_a‖_F² + ‖P_b‖_F² − 2 tr(P_a P_b) ≤ L_a² + L_b²`` (tr(P_a P_b) ≥ 0 for
PSD matrices), so ``‖u(a) − u(b)‖² ≤ L_a² + L_b² + (L_a − L_b)² = 2L_a² + 2L_b² − 2L_aL_b ≤ 2``
(convex on [0, 1]², largest at a corner: 2 at (1, 1) and (1, 0)). Hence ``Δ = √2`` in L2,
reached by a = v_1, b = 0. The Gaussian mechanism at σ = :func:`accountant.gaussian_sigma` for
Δ (analytic Gaussian for (ε, δ), Δ/√(2ρ) for zCDP) is as private as the grant charged for it,
for every fixed (V, μ̂, C): by composition with the steps that released them, the run stays
within its budget. The sums are scaled by the public ``C²/n`` before the draw (Δ and σ scaled
alike) and drawn by :func:`noise.add_gaussian`, so the published values lie on its
power-of-two grid.

User level is not offered: one user's rows move the sums by up to their row count, and n is
private there.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import Budget
from dpsub_dist.privacy.covariance_noise import Neighbours

SENSITIVITY = math.sqrt(2.0)
"""L2 sensitivity of Σ u(x) under replace-one (module docstring)."""


def projected_sums(rows: np.ndarray, basis: np.ndarray, bound: float) -> np.ndarray:
    """``Σ u(x)`` of these rows (already centred), clipped to norm ≤ ``bound`` and scaled by
    1/bound: the upper triangle (row-major, with diagonal) of ``Σ (Vᵀz)(Vᵀz)ᵀ``, then ``Σ ‖z‖²``
    (runs on a worker)."""
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    scaled = rows * (1.0 / np.maximum(norms, bound))[:, None]
    projected = scaled @ basis
    upper = np.triu_indices(basis.shape[1])
    gram = projected.T @ projected
    return np.append(gram[upper], float(np.einsum("ij,ij->", scaled, scaled)))


@dataclass(frozen=True)
class VarianceRelease:
    """The noisy projected covariance (k×k, symmetric) and total variance, input units (÷ n)."""

    matrix: np.ndarray
    total: float
    sigma: float
    sensitivity: float


def variance_mechanism(grant: Budget) -> mechanism.Gaussian:
    """Step ``explained_variance``: the Gaussian on the unscaled sums (Δ = :data:`SENSITIVITY`)
    calibrated to ``grant``."""
    return mechanism.gaussian(grant, SENSITIVITY)


def private_variances(
    sums: np.ndarray,
    n_rows: int,
    bound: float,
    mech: mechanism.Gaussian,
    rng: np.random.Generator,
) -> VarianceRelease:
    """The Gaussian ``mech`` (:func:`variance_mechanism`) on :func:`projected_sums` totals,
    released as ``C²/n``·(sums + noise).

    ``sigma`` is reported for the unscaled sums (Δ = :data:`SENSITIVITY`); the draw is at
    ``sigma·C²/n`` for ``Δ·C²/n`` (module docstring).
    """
    if n_rows < 1:
        raise ValueError(f"n_rows must be ≥ 1 (got {n_rows})")
    sums = np.asarray(sums, dtype=np.float64)
    rank = int(round((math.sqrt(8 * (sums.size - 1) + 1) - 1) / 2))
    factor = bound**2 / n_rows
    scaled = dataclasses.replace(  # same σ/Δ, so the same privacy map
        mech, sensitivity=mech.sensitivity * factor, sigma=mech.sigma * factor
    )
    noisy = scaled.release(rng, sums * factor)
    matrix = np.zeros((rank, rank))
    rows, cols = np.triu_indices(rank)
    matrix[rows, cols] = noisy[:-1]
    matrix[cols, rows] = noisy[:-1]
    return VarianceRelease(matrix, float(noisy[-1]), mech.sigma, mech.sensitivity)


def psd_total(matrix: np.ndarray) -> float:
    """The total variance of a released noisy symmetric matrix: the sum of its eigenvalues
    clipped at 0 (the trace of its nearest positive semidefinite matrix).

    Its plain trace can be smaller than the sum of its top k eigenvalues (the noise adds
    negative eigenvalues), and a ratio to that would call pure noise all of the variance
    (an all-constant table gave ``explained_variance_ratio = [1.0]`` at k = 1). Clipping
    every eigenvalue at 0, as the top k already are, gives ratios that sum to 1 over all D
    components, so k < D of them reach 1 only if the released matrix has rank ≤ k.
    Post-processing of the released matrix: no privacy cost.
    """
    return float(np.maximum(scipy.linalg.eigvalsh(matrix), 0.0).sum())


def released_variance(
    top_values: np.ndarray,
    total: float,
    row_norm: float,
    n_rows: int,
    relation: Neighbours,
) -> dict[str, Any]:
    """Explained variance of the released components, from the released noisy matrix only.

    Post-processing of Analyze Gauss's output (no privacy cost): ``top_values`` are the top-k
    eigenvalues of the released ``AᵀA + E`` (minus ``n·μ̂μ̂ᵀ`` from the released mean when
    centring) and ``total`` its :func:`psd_total` (or, for a projected release, its noisy
    total); the exact Gram never enters. Negative noisy eigenvalues are clipped to 0 and the
    total is at least the sum of the top k, so the ratios are non-negative, sorted descending
    (the components' order) and sum to ≤ 1. Variances are in
    input units, ``row_norm²·λ/n`` (rows as clipped to ``row_norm``; divided by n, not n − 1):
    ``row_norm`` and, at row level, ``n`` are public. At user level n is private, so only the
    ratio (which does not need it) is released.
    """
    top = np.maximum(np.asarray(top_values, dtype=np.float64), 0.0)
    total = max(float(total), float(top.sum()))
    ratio = top / total if total > 0 else np.zeros_like(top)
    while ratio.sum() > 1.0:  # rounding: step the total up by ulps until Σ ratio ≤ 1 exactly
        total = float(np.nextafter(total, np.inf))
        ratio = top / total
    variance = None
    if relation == "replace" and n_rows > 0:
        variance = (top * (row_norm**2 / n_rows)).tolist()
    return {
        "explained_variance": variance,
        "explained_variance_ratio": ratio.tolist(),
        "explained_variance_note": EXPLAINED_VARIANCE_NOTE[relation],
    }


EXPLAINED_VARIANCE_NOTE = {
    "replace": "eigenvalues of the released noisy matrix × row_norm²/n (rows clipped to "
    "row_norm), clipped at 0; ratio to the sum of all its eigenvalues clipped at 0: "
    "post-processing, no privacy cost",
    "add_remove": "ratio only (top eigenvalues of the released noisy matrix to the sum of all "
    "its eigenvalues clipped at 0): the variance itself needs the row count, private at "
    "user level",
    "gap-perturb": "not released: no basis (⊥); a released basis gets a private explained "
    "variance (steps variance_norm_bound, explained_variance: its projector has no variances)",
}
