"""A private row-norm bound for the covariance methods (gauss, gap-perturb) at row level.

When no public ``--row-norm`` is given, the bound ``B`` that every row is clipped to is chosen
from the data under DP: the smallest value of a public grid at which the (noisy) number of rows
with norm ≤ ``B`` reaches :data:`NORM_QUANTILE` of the public row count ``n``.

Public grid: :data:`GRID` = 2^-10·√2^j, j = 0 … 100 (2^-10 to 2^40), fixed in advance and
independent of the data. Local half (workers, :func:`norm_counts`): each row adds 1 to the bin
of the first grid value ≥ its norm (one overflow bin past 2^40), so the driver receives 102
integer counts, never rows; they are operator-only and never published.

Mechanism (:func:`private_norm_bound`): sparse vector (AboveThreshold, Dwork & Roth 2014
Thm 3.23; :func:`sparse_vector.above_threshold`) over the cumulative counts
``q_j = #{rows: ‖x‖ ≤ grid_j}`` with the threshold ``T = NORM_QUANTILE·n``.

Privacy (replace one row, n public): the replaced row leaves one bin and enters another, so
every ``q_j`` moves by at most 1 (Δ = 1); AboveThreshold releases the first index j whose
noisy ``q_j`` reaches the noisy threshold with noise Lap(4Δ/ε) on the queries and Lap(2Δ′/ε)
on the threshold (on the noise grid): ε-DP whatever the grid's length. ``T`` depends only on
the public ``n``. If no index passes (output ⊥), the top of the grid is used: post-processing
of the released ⊥. Cost: ε (charged as the step ``norm_bound``; a zCDP grant runs it with
ε = √(2ρ), pure ε-DP being ε²/2-zCDP), no δ. The chosen ``B`` is published; everything after it
(the clipped Gram matrix, the mean) is calibrated for rows scaled by 1/B as with a public B, so
the whole run composes basically: ε_norm + the rest.

User level is not offered: one user's rows move every ``q_j`` by up to their row count, and
``n`` (the threshold) is private there; pass a public ``--row-norm``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import Budget, laplace_epsilon
from dpsub_dist.privacy.sparse_vector import above_threshold

GRID = 2.0 ** (np.arange(-20, 81) / 2)
"""Public grid of candidate bounds: 2^-10·√2^j, j = 0 … 100, up to 2^40 (data-independent; the
even j are exact powers of two, so a published bound reads e.g. 8.0)."""

NORM_QUANTILE = 0.99
"""Fraction of the rows the private bound must cover (measured: docs/covariance.md)."""

COUNT_SENSITIVITY = 1.0
"""Replacing one row moves each cumulative count ``#{‖x‖ ≤ grid_j}`` by at most 1."""


@dataclass(frozen=True)
class NormBound:
    """The released bound, its grid index (None: nothing passed, top of the grid used)."""

    bound: float
    index: int | None
    quantile: float


def norm_counts(rows: np.ndarray, grid: np.ndarray = GRID) -> np.ndarray:
    """Per-bin row counts: bin j holds norms in (grid_{j-1}, grid_j]; bin len(grid) overflows."""
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    bins = np.searchsorted(grid, norms, side="left")
    return np.bincount(bins, minlength=len(grid) + 1).astype(np.int64)


def private_norm_bound(
    counts: np.ndarray,
    n_rows: int,
    grant: Budget,
    rng: np.random.Generator,
    quantile: float = NORM_QUANTILE,
    grid: np.ndarray = GRID,
) -> NormBound:
    """The smallest grid value whose noisy row count reaches ``quantile·n`` (module docstring).

    ``counts`` are :func:`norm_counts` summed over all rows; ``n_rows`` is the public n.
    Noise: sparse vector at ε = :func:`laplace_epsilon` of ``grant`` (the step's whole cost),
    queries Lap(4·COUNT_SENSITIVITY/ε), threshold Lap(2Δ′/ε), drawn by :mod:`noise`.
    """
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    cumulative = np.cumsum(np.asarray(counts, dtype=np.int64))
    index = above_threshold(
        lambda j: float(cumulative[j]),
        len(grid),
        quantile * n_rows,
        COUNT_SENSITIVITY,
        laplace_epsilon(grant),
        rng,
    )
    return NormBound(float(grid[-1] if index is None else grid[index]), index, quantile)


def norm_bound_mechanism(grant: Budget) -> mechanism.AboveThreshold:
    """Step ``norm_bound``: sparse vector over the norm counts (sensitivity 1) at ε of ``grant``."""
    return mechanism.above_threshold(COUNT_SENSITIVITY, laplace_epsilon(grant))
