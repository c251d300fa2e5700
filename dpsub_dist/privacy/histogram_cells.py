"""Shifted-grid stability histogram (SS21 Alg. 2; ALGORITHMS.md §2) and its private cell side (§4).

Input domain: ``t`` points in R^D. Neighbour relation: replace one point.
Privacy map: Laplace(2/ε) on each non-empty cell's count (discrete, on the power-of-two
grid of :func:`noise.add_laplace`; counts are integers, so lie on it), release the best cell
only if its noisy count exceeds ``τ = 1 + x`` with P(noise ≥ x) ≤ δ/2
(:func:`noise.laplace_tail`, ≈ (2/ε) ln(1/δ)): ``(ε, δ)``-DP (SS21 Lemma A.15, Vadhan 2017
Thm 3.5). Replacing a point moves two counts by one (two coordinates change: the rounding
widening is for c = 2); a cell present in only one neighbour has count 1 and passes with
probability at most δ/2. For a zCDP grant the step runs with ε = √(2ρ), δ = δ₀. The
released count is a noise output itself (on the grid).

Cells are keyed by the exact bytes of their integer coordinates, so only
non-empty cells exist and no two cells can collide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpsub_dist.privacy import mechanism, noise
from dpsub_dist.privacy.accountant import ApproxDP, Budget, laplace_epsilon
from dpsub_dist.privacy.sparse_vector import above_threshold

MAX_COUNT_SENSITIVITY = 1.0
"""Replacing one point lowers one cell count by 1 and raises another by 1, so the
largest count moves by at most 1. (ALGORITHMS.md §4 quotes 2, the L1 sensitivity
of the whole count vector; 1 is the sensitivity of the max, which is what §4 queries.)"""

COUNT_VECTOR_SENSITIVITY = 2.0
"""L1 change of the cell-count vector when one point is replaced (two counts move by 1)."""


@dataclass(frozen=True)
class HistogramRelease:
    """Outcome of the stability histogram; ``point`` is None for ⊥."""

    point: np.ndarray | None
    noisy_count: float | None
    threshold: float


def grid_cells(points: np.ndarray, side: float, offset: float) -> tuple[np.ndarray, np.ndarray]:
    """Label of each point's cell ⌊(y − λℓ)/ℓ⌋ and the integer cells, one row per label."""
    cells = np.floor((points - offset * side) / side).astype(np.int64)
    index: dict[bytes, int] = {}
    labels = np.array([index.setdefault(row.tobytes(), len(index)) for row in cells])
    first = np.unique(labels, return_index=True)[1]
    return labels, cells[first]


def max_cell_count(points: np.ndarray, side: float, offset: float) -> int:
    """Largest number of points sharing a grid cell."""
    labels, _ = grid_cells(points, side, offset)
    return int(np.bincount(labels).max())


def stability_delta(grant: Budget) -> float:
    """δ of the histogram's grant: the chance a cell of one point clears the threshold."""
    delta = grant.delta if isinstance(grant, ApproxDP) else grant.delta0
    if not 0 < delta < 1:
        raise ValueError("the stability histogram needs a delta in (0, 1)")
    return delta


def shifted_grid_histogram(
    points: np.ndarray,
    side: float,
    offset: float,
    counts: mechanism.Laplace,
    delta: float,
    rng: np.random.Generator,
    output: Literal["center", "uniform"] = "center",
) -> HistogramRelease:
    """Step ``histogram`` (SS21 Alg. 2, §2): a point of the most popular grid cell, or ⊥; the
    cell counts drawn with ``counts`` (:func:`histogram_mechanism`), the threshold for
    ``delta`` (:func:`stability_delta`)."""
    labels, cells = grid_cells(points, side, offset)
    noisy = counts.release(rng, np.bincount(labels).astype(np.float64), coordinates_changed=2)
    threshold = 1 + noise.laplace_tail(
        counts.scale, COUNT_VECTOR_SENSITIVITY, delta / 2, coordinates_changed=2
    )
    best = int(np.argmax(noisy))
    if noisy[best] <= threshold:
        return HistogramRelease(None, None, threshold)
    inside = rng.uniform(0.0, 1.0, cells.shape[1]) if output == "uniform" else 0.5
    return HistogramRelease((cells[best] + offset + inside) * side, float(noisy[best]), threshold)


def histogram_mechanism(grant: Budget) -> mechanism.Laplace:
    """Step ``histogram``: the cell counts + Lap(2/ε) (two counts move by 1; §2)."""
    return mechanism.laplace(grant, COUNT_VECTOR_SENSITIVITY)


def cell_search_mechanism(grant: Budget) -> mechanism.AboveThreshold:
    """Step ``cell_search``: sparse vector over the largest cell count (sensitivity 1)."""
    return mechanism.above_threshold(MAX_COUNT_SENSITIVITY, laplace_epsilon(grant))


def choose_cell_side(
    points: np.ndarray,
    offset: float,
    grid: np.ndarray,
    search: mechanism.AboveThreshold,
    rng: np.random.Generator,
    threshold_fraction: float = 0.8,
) -> float | None:
    """Step ``cell_search`` (§4): the smallest grid side whose largest cell privately holds a
    fraction of t points, with ``search``'s noise (:func:`cell_search_mechanism`)."""
    index = above_threshold(
        lambda j: max_cell_count(points, grid[j], offset),
        len(grid),
        threshold_fraction * points.shape[0],
        search,
        rng,
    )
    return None if index is None else float(grid[index])
