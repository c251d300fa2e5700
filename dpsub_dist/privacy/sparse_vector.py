"""Sparse vector (AboveThreshold) over a public geometric grid (ALGORITHMS.md §4).

Used to choose the friendly-core radius ``r`` or the histogram cell side ``ℓ``
privately: the queries are evaluated lazily, in grid order, and the first index
whose noisy value clears the noisy threshold is released. ε-DP in total,
whatever the grid length (Dwork & Roth 2014, Thm 3.23).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dpsub_dist.privacy.noise import laplace


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
    sensitivity: float,
    epsilon: float,
    rng: np.random.Generator,
) -> int | None:
    """Index of the first query whose noisy value reaches the noisy threshold, or None.

    T̂ = T + Lap(2Δ/ε); stop at the first j with q_j + Lap(4Δ/ε) ≥ T̂. Each q_j
    must have sensitivity ≤ Δ for the neighbour relation of the caller.
    """
    if not (epsilon > 0 and sensitivity > 0):
        raise ValueError("epsilon and sensitivity must be > 0")
    noisy_threshold = threshold + laplace(rng, 2 * sensitivity / epsilon)
    for j in range(n_queries):
        if query(j) + laplace(rng, 4 * sensitivity / epsilon) >= noisy_threshold:
            return j
    return None
