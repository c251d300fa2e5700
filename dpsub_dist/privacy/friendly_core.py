"""Friendly-core average (T24 with FriendlyCore; ALGORITHMS.md §3) and its private radius (§4).

Input domain: ``t`` points in R^D. Neighbour relation: replace one of the ``t``
points (sample and aggregate turns "change one unit" into exactly this).

Privacy map (ALGORITHMS.md §3): with deterministic weights
``w_i = clamp((c_i − (t/2 + 1)) / (t/2), 0, 1)`` the total weight ``W`` has
sensitivity 4 and the weighted mean has sensitivity ``16r/(W − 4)``. The
release is propose–test–release on ``W`` (Laplace, ``(ε₁, δ₁)``) followed by
the Gaussian mechanism with sensitivity ``16r/L``; in total
``(ε₁ + ε₂, δ₁ + e^{ε₁} δ₂)``-DP, or ``δ₁``-approximate ``(ε₁²/2 + ρ₂)``-zCDP.
:func:`core_noise_mechanism` calibrates the Gaussian for its grant's δ divided by
``e^{ε₁}`` (its stated cost multiplies it back), so that the charge matches the composition
above. Each step's function takes the mechanism its caller charged and draws with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsub_dist.privacy import mechanism, noise
from dpsub_dist.privacy.accountant import ApproxDP, Budget, laplace_epsilon
from dpsub_dist.privacy.sparse_vector import above_threshold

WEIGHT_SENSITIVITY = 4.0
"""L1 change of the weights (hence of W) when one point is replaced (§3 fact b)."""


@dataclass(frozen=True)
class CoreTest:
    """The released core test (§3 step 2): the noisy core weight Ŵ and the lower bound L on
    W − 4 read from it, with the deterministic weights it tested (operator side: the core
    average behind the test uses them)."""

    weights: np.ndarray
    noisy_weight: float
    lower_bound: float

    @property
    def passed(self) -> bool:
        """L ≥ t/4: only then does the Gaussian sensitivity 16r/L hold for the average."""
        return self.lower_bound >= self.weights.size / 4


UNIT_ROUNDOFF = 2.0**-53
"""Unit roundoff u of float64 arithmetic."""

FRIEND_MARGIN = 2.0**-48
"""Relative margin on the distance bound: covers rounding of the bound itself and of r·r."""


def _gamma(terms: int) -> float:
    """γ_n = n·u/(1 − n·u): the error factor of any n-term float64 sum (Higham 2002, §3.1)."""
    return terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)


def pairwise_sq_distances(points: np.ndarray) -> np.ndarray:
    """t×t upper bounds on the squared Euclidean distances, never below the true ones.

    Computed from one Gram matrix, ``(‖a‖² + ‖b‖²) − 2⟨a, b⟩`` clipped at 0, in place (one t×t
    temporary besides the result: 128 MB each at t = 4000). That expression cancels catastrophically
    when the distance is small against the norms: its error is at most
    ``γ_{D+2}(‖a‖² + ‖b‖² + 2‖a‖‖b‖) ≤ 2γ_{D+2}(‖a‖² + ‖b‖²)`` for any summation order (Higham
    2002, §3.1; the computed norms are within γ_D of the true ones), so each entry is raised by
    twice that bound, ``4γ_{D+2}(n̂_a + n̂_b)``, and by the relative margin FRIEND_MARGIN.
    The diagonal is exactly 0. A pair counts as friends (``bound ≤ r·r``) only if its true
    distance is ≤ r: the mean's sensitivity 16r/(W − 4) holds; the entry depends on the pair
    alone, so the weight sensitivity 4 holds too. Radii near the error (``r² ≲ 2^10·bound``)
    lose friends: see :func:`radius_floor`.
    """
    points = np.asarray(points, dtype=np.float64)
    gram = points @ points.T
    sq_norms = np.diag(gram).copy()
    norm_sums = np.add(sq_norms[:, None], sq_norms[None, :])
    gram *= -2.0  # exact; then (n̂_a + n̂_b) − 2⟨a, b⟩ in place, clipped at 0
    gram += norm_sums
    np.maximum(gram, 0.0, out=gram)
    norm_sums *= 4 * _gamma(points.shape[1] + 2)  # the error bound 4γ(n̂_a + n̂_b)
    gram += norm_sums
    gram *= 1 + FRIEND_MARGIN
    np.fill_diagonal(gram, 0.0)
    return gram


def radius_floor(dim: int, norm_bound: float) -> float:
    """Smallest radius the friend test resolves for points of norm ≤ ``norm_bound`` in R^dim.

    At ``r² = 2^10 · 8γ_{D+2}·B²`` (the largest error term of :func:`pairwise_sq_distances`
    times 1024) a pair is counted as friends once its true distance is below ≈ 0.999·r; below
    that radius rounding, not distance, decides. Public: it depends on D and a public norm bound.
    """
    return math.sqrt(2.0**10 * 8 * _gamma(dim + 2)) * norm_bound


def core_weights(sq_dists: np.ndarray, radius: float) -> np.ndarray:
    """Deterministic FriendlyCore weights for friend radius ``radius`` (§3)."""
    friends = np.count_nonzero(sq_dists <= radius * radius, axis=1)
    return _weights(friends, sq_dists.shape[0])


def _weights(friends: np.ndarray, t: int) -> np.ndarray:
    """w_i = clamp((c_i − (t/2 + 1)) / (t/2), 0, 1) from each point's friend count c_i."""
    return np.clip((friends - (t / 2 + 1)) / (t / 2), 0.0, 1.0)


def ptr_delta(ptr_grant: Budget) -> float:
    """δ₁ of the core test's grant: the probability its lower bound L may fail."""
    delta = ptr_grant.delta if isinstance(ptr_grant, ApproxDP) else ptr_grant.delta0
    if not 0 < delta < 1:
        raise ValueError("the propose-test-release step needs a delta in (0, 1)")
    return delta


def core_test(
    sq_dists: np.ndarray,
    radius: float,
    test: mechanism.Laplace,
    delta: float,
    rng: np.random.Generator,
) -> CoreTest:
    """Step ``core_test`` (§3 steps 1–2): the core weight W at friend radius ``radius`` plus
    ``test``'s noise (:func:`core_test_mechanism`), and L, its lower bound failing w.p. ≤
    ``delta`` (:func:`ptr_delta`)."""
    weights = core_weights(sq_dists, radius)
    noisy_total = test.release(rng, float(weights.sum()))
    return CoreTest(weights, noisy_total, ptr_lower_bound(noisy_total, test.scale, delta))


def core_average(
    points: np.ndarray, core: CoreTest, gaussian: mechanism.Gaussian, rng: np.random.Generator
) -> np.ndarray:
    """Step ``core_noise`` (§3 step 3): the core's weighted mean plus ``gaussian``, the noise
    of :func:`core_noise_mechanism` for this test's L (run only behind a passed test)."""
    if not core.passed:
        raise ValueError("the core average runs only behind a passed core test")
    mean = core.weights @ points / float(core.weights.sum())
    return gaussian.release(rng, mean)


def core_test_mechanism(ptr_grant: Budget) -> mechanism.Laplace:
    """Step ``core_test``: the core weight W + Lap(4/ε₁) (W moves by ≤ 4; §3 step 2)."""
    return mechanism.laplace(ptr_grant, WEIGHT_SENSITIVITY)


def core_noise_mechanism(
    gaussian_grant: Budget, ptr_grant: Budget, radius: float, lower_bound: float
) -> mechanism.Gaussian:
    """Step ``core_noise``: the Gaussian release behind the PTR test of ``ptr_grant``, at the
    mean's sensitivity 16r/L (it holds once the test passed with lower bound L ≥ t/4)."""
    return mechanism.gaussian(gaussian_grant, 16 * radius / lower_bound, gate=ptr_grant)


def radius_search_mechanism(grant: Budget) -> mechanism.AboveThreshold:
    """Step ``radius_search``: sparse vector over W(r) (sensitivity 4) at ε of ``grant``."""
    return mechanism.above_threshold(WEIGHT_SENSITIVITY, laplace_epsilon(grant))


def ptr_lower_bound(noisy_weight: float, scale: float, delta: float) -> float:
    """``Ŵ − x − 4`` with P(noise ≥ x) ≤ δ: a lower bound on W − 4 that fails w.p. ≤ δ.

    ``Ŵ`` is the released grid value of :func:`noise.add_laplace` and ``x`` a point of the
    same power-of-two grid (:func:`noise.laplace_tail`); 4 is a multiple of that grid
    whenever ε ≥ 2^-28, so the difference is exact in floating point: it cannot round up.
    """
    bound = noisy_weight - noise.laplace_tail(scale, WEIGHT_SENSITIVITY, delta)
    if (bound - WEIGHT_SENSITIVITY) + WEIGHT_SENSITIVITY != bound:
        raise ValueError("the core-test lower bound would be rounded: epsilon is too small")
    return bound - WEIGHT_SENSITIVITY


def grid_core_weights(sq_dists: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Total core weight W(r) for every radius of an increasing grid, in one pass.

    Each distance is binned once by the first grid radius it is within (the comparison
    ``d² ≤ r·r`` of :func:`core_weights`), so the friend counts per point and radius are
    cumulative bin counts: the same W(r) as ``core_weights(sq_dists, r).sum()``, without
    one pass over the t×t matrix per grid step. Rows are binned in chunks of ~4M values.
    """
    t, steps = sq_dists.shape[0], len(grid)
    bounds = grid * grid
    friends = np.empty((t, steps), dtype=np.int64)
    chunk = max(1, 2**22 // max(t, 1))
    for start in range(0, t, chunk):
        block = sq_dists[start : start + chunk]
        bins = np.searchsorted(bounds, block, side="left")  # steps: beyond the grid
        bins += np.arange(len(block), dtype=np.int64)[:, None] * (steps + 1)
        counts = np.bincount(bins.ravel(), minlength=len(block) * (steps + 1))
        friends[start : start + chunk] = np.cumsum(counts.reshape(-1, steps + 1), axis=1)[:, :steps]
    per_radius = np.ascontiguousarray(friends.T)  # steps × t: each row as core_weights sees it
    return np.array([_weights(row, t).sum() for row in per_radius])


def choose_radius(
    sq_dists: np.ndarray,
    grid: np.ndarray,
    search: mechanism.AboveThreshold,
    rng: np.random.Generator,
    threshold_fraction: float = 0.8,
) -> float | None:
    """Step ``radius_search`` (§4): the smallest grid radius whose core weight W(r) privately
    clears a fraction of t, with ``search``'s noise (:func:`radius_search_mechanism`)."""
    t = sq_dists.shape[0]
    weights = grid_core_weights(sq_dists, grid)
    index = above_threshold(
        lambda j: float(weights[j]), len(grid), threshold_fraction * t, search, rng
    )
    return None if index is None else float(grid[index])
