"""Sparse vector (AboveThreshold) over a public geometric grid (ALGORITHMS.md §4).

Used to choose the friendly-core radius ``r`` or the histogram cell side ``ℓ``
privately: the queries are evaluated lazily, in grid order, and the first index
whose noisy value clears the noisy threshold is released. ε-DP in total,
whatever the grid length (Dwork & Roth 2014, Thm 3.23).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dpsub_dist.privacy import mechanism, noise


def geometric_grid(r_min: float, r_max: float, step: float = 2**0.5) -> np.ndarray:
    """Public grid r_j = r_min · step^j up to the first value ≥ r_max."""
    if not (0 < r_min < r_max) or step <= 1:
        raise ValueError(f"need 0 < r_min < r_max and step > 1, got {r_min}, {r_max}, {step}")
    count = int(np.ceil(np.log(r_max / r_min) / np.log(step))) + 1
    return r_min * step ** np.arange(count)


def above_threshold(
    query: Callable[[int], float],
    n_queries: int,
    threshold: float,
    mech: mechanism.AboveThreshold,
    rng: np.random.Generator,
) -> int | None:
    """Index of the first query whose noisy value reaches the noisy threshold, or None: the
    noise of ``mech`` (:func:`mechanism.above_threshold`, calibrated and charged by the caller;
    its cost ``mech.cost()`` = ε).

    T̂ = T + Lap(2Δ′/ε); stop at the first j with q̃_j ≥ T̂, q̃_j = q_j + Lap(4Δ/ε) on the grid
    ``g`` of scale 4Δ/ε (:func:`noise.add_laplace`: ``g·(round(q_j/g) + K)``, its scale widened
    for the rounding). Each q_j must have sensitivity ≤ Δ for the caller's neighbour relation.

    Discrete form of Dwork & Roth (2014) Thm 3.23: the rounded queries move by ≤ Δ′ = Δ + g,
    in multiples of ``g``; the proof shifts the threshold noise by such a multiple (≤ Δ′) and
    the j-th query noise by ≤ 2Δ′. Both noises are discrete Laplace on grids dividing ``g``
    (the threshold's grid, of scale 2Δ′/ε < 4Δ/ε, is a power of two ≤ g), with pmf ratios
    ≤ e^{Δ′/(2Δ′/ε)} = e^{ε/2} and ≤ e^{2Δ′/(4Δ′/ε)} = e^{ε/2}: ε-DP for the index in total.
    """
    query_scale, threshold_scale = mech.query_scale, mech.threshold_scale
    if noise.grid_step(threshold_scale) > noise.grid_step(query_scale):
        epsilon = mech.cost().epsilon  # type: ignore[union-attr]
        raise ValueError(f"epsilon {epsilon:.6g} is too small for the sparse-vector grid")
    noisy_threshold = threshold + noise.laplace_noise(
        rng, threshold_scale, sensitivity=mech.threshold_sensitivity
    )
    for j in range(n_queries):
        if noise.add_laplace(rng, query(j), query_scale, mech.sensitivity) >= noisy_threshold:
            return j
    return None
