"""A private row-norm bound for the covariance methods (gauss, gap-perturb) at row level.

When no public ``--row-norm`` is given, the bound ``B`` that every row is clipped to is chosen
from the data under DP: the smallest value of a public grid at which the (noisy) number of rows
with norm ≤ ``B`` reaches a quantile ``q`` of the public row count ``n``; runs take ``q`` from
:func:`noise_matched_quantile` (public n, D, ε, δ only).

Public grid: :data:`GRID` = 2^-10·√2^j, j = 0 … 100 (2^-10 to 2^40), fixed in advance and
independent of the data. Local half (workers, :func:`norm_counts`): each row adds 1 to the bin
of the first grid value ≥ its norm (one overflow bin past 2^40), so the driver receives 102
integer counts, never rows; they are operator-only and never published.

Mechanism (:func:`private_norm_bound`): sparse vector (AboveThreshold, Dwork & Roth 2014
Thm 3.23; :func:`sparse_vector.above_threshold`) over the cumulative counts
``q_j = #{rows: ‖x‖ ≤ grid_j}`` with the threshold ``T = q·n``.

Privacy (replace one row, n public): the replaced row leaves one bin and enters another, so
every ``q_j`` moves by at most 1 (Δ = 1); AboveThreshold releases the first index j whose
noisy ``q_j`` reaches the noisy threshold with noise Lap(4Δ/ε) on the queries and Lap(2Δ′/ε)
on the threshold (on the noise grid): ε-DP whatever the grid's length. ``T`` depends only on
public values (``n``, and ``q`` from n, D and the grants). If no index passes (output ⊥), the
top of the grid is used: post-processing of the released ⊥. Cost: ε (charged as the step
``norm_bound``; a zCDP grant runs it with ε = √(2ρ), pure ε-DP being ε²/2-zCDP), no δ. The
chosen ``B`` is published; everything after it (the clipped Gram matrix, the mean) is
calibrated for rows scaled by 1/B as with a public B, so the whole run composes basically:
ε_norm + the rest.

User level (:func:`private_user_norm_bound`): one user's rows move every row count by up to
their number and n is private, so the same search runs over users instead (one norm
``√Σ‖x‖²`` per user, Δ = 1 under add/remove) with the threshold ``q·ñ`` from a noisy user
count paid from the same step.

Low-side margin (:func:`margined_quantile`, every covariance run): the threshold is also kept
≥ :data:`LOW_MARGIN`/ε, so the many empty low bins (count 0) do not pass it by noise alone;
where that and the top margin cannot both hold (n or ñ below :func:`min_count`), no bound is
released: exit 2 before any read at row level, ⊥ after the count at user level.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpsub_dist.linalg import row_norms
from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import Budget, laplace_epsilon
from dpsub_dist.privacy.sparse_vector import above_threshold

GRID = 2.0 ** (np.arange(-20, 81) / 2)
"""Public grid of candidate bounds: 2^-10·√2^j, j = 0 … 100, up to 2^40 (data-independent; the
even j are exact powers of two, so a published bound reads e.g. 8.0)."""

NORM_QUANTILE = 0.99
"""The fixed quantile of earlier releases, still the default of :func:`private_norm_bound`;
runs target :func:`noise_matched_quantile` instead (measured: docs/covariance.md)."""

SV_MARGIN = 20.0
"""At least ``SV_MARGIN/ε_norm`` rows must lie above the threshold ``q·n``: the sparse vector's
count error over this grid (Lap(4/ε_norm) per query, ~100 queries) is ~20/ε_norm rows, and a
threshold closer to ``n`` than that fires late or never (⊥: the top of the grid)."""

NOISE_WEIGHT = 8.0
"""Measured weight of the noise bound against the clipping-bias bound (docs/covariance.md:
1, 2, 4, 8, 16 tried on flights and heavy-tailed rows at ε = 1, 3, 10; 8–16 best). Both are
upper bounds and the bias one is the looser: a trace where the subspace sees only the removed
mass's off-diagonal block (tail rows mostly lie along the top directions)."""

MAX_CLIPPED = 0.5
"""The rule never targets a quantile below 0.5 (tiny n or ε: the margin alone would)."""

LOW_FIRE = 0.01
"""Chance, at most, that some bin of count 0 passes the threshold (:data:`LOW_MARGIN`)."""

LOW_MARGIN = 4.0 * math.log(2.0 * len(GRID) / (3.0 * LOW_FIRE))
"""The threshold must be ≥ ``LOW_MARGIN/ε`` (≈ 35.3/ε): then a bin of count 0 fires w.p. ≤
LOW_FIRE over the whole grid.

Derivation: a query's noise is Z ~ Lap(b), b = 4/ε (Δ = 1), the threshold's Z_T ~ Lap(b/2)
(:func:`mechanism.above_threshold`; the noise grids widen both scales by a relative 2^-30).
For a count of 0 against the threshold T ≥ 0, P(Z − Z_T ≥ T) = (2/3)e^{−T/b} − (1/6)e^{−2T/b}
≤ (2/3)e^{−T/b} (tail of a difference of Laplaces of scales b and b/2). A union over the
grid's L = len(GRID) = 101 queries gives P(some empty bin fires) ≤ (2L/3)·e^{−Tε/4} ≤ β for
T ≥ (4/ε)·ln(2L/(3β)); β = LOW_FIRE. Public: L is the public grid's length."""

COUNT_SENSITIVITY = 1.0
"""Replacing one row moves each cumulative count ``#{‖x‖ ≤ grid_j}`` by at most 1."""


@dataclass(frozen=True)
class NormBound:
    """The released bound, its grid index (None: nothing passed, top of the grid used)."""

    bound: float
    index: int | None
    quantile: float
    users: float | None = None
    """User level: the noisy user count the threshold used (released; None at row level)."""


def norm_counts(rows: np.ndarray, grid: np.ndarray = GRID) -> np.ndarray:
    """Per-bin row counts: bin j holds norms in (grid_{j-1}, grid_j]; bin len(grid) overflows."""
    return norm_histogram(row_norms(rows), grid)


def norm_histogram(norms: np.ndarray, grid: np.ndarray = GRID) -> np.ndarray:
    """Counts of ``norms`` per bin of the grid (as :func:`norm_counts`; user level: one norm
    ``√Σ‖x‖²`` per user)."""
    bins = np.searchsorted(grid, np.asarray(norms, dtype=np.float64), side="left")
    return np.bincount(bins, minlength=len(grid) + 1).astype(np.int64)


def noise_matched_quantile(
    n_rows: int,
    dim: int,
    noise_sigma: float,
    norm_epsilon: float,
    max_clipped: float = MAX_CLIPPED,
) -> float:
    """The quantile ``q`` a run targets, from public facts only (n at row level, D, the noise σ
    of the release that follows and ε_norm): ``1 − q = clip(NOISE_WEIGHT·2σ√D/n,
    SV_MARGIN/(ε_norm·n), MAX_CLIPPED)`` = clip(16σ√D/n, 20/(ε_norm·n), 0.5).

    Derivation. After clipping to B and scaling by 1/B, the release adds symmetric Gaussian
    noise of std σ per entry to the Gram matrix; its operator norm is ≈ 2σ√D (semicircle law), so
    on the second moment ``AᵀA/n`` in input units the noise costs ``c·B²`` with ``c = 2σ√D/n``.
    Clipping a row x to B removes a positive semidefinite ``(1 − B²/‖x‖²)xxᵀ`` of trace
    ``‖x‖² − B²``, so the bias has operator norm ≤ ``Σ(‖x‖² − B²)₊/n``. The sum of the two bounds,
    ``f(B) = Σ(‖x‖² − B²)₊/n + c·B²``, is convex in B² with derivative ``−P(‖x‖ > B) + c``:
    it is smallest where the fraction of clipped rows equals ``c``; the rule uses
    ``NOISE_WEIGHT·c`` (measured, :data:`NOISE_WEIGHT`). Less noise (larger ε or n,
    smaller D) therefore clips fewer rows. The floor keeps the threshold where the sparse vector
    can find it (:data:`SV_MARGIN`). ``q`` is a function of public values, so the threshold
    ``q·n`` is public and the sparse vector's argument is unchanged. ``max_clipped`` caps the
    clipped share (default :data:`MAX_CLIPPED`; the power method allows more:
    :data:`dpsub_dist.methods.power.MAX_CLIPPED`).
    """
    if n_rows < 1:
        raise ValueError(f"the rule needs the public row count n ≥ 1, got {n_rows}")
    noise_level = NOISE_WEIGHT * 2.0 * noise_sigma * math.sqrt(dim) / n_rows
    floor = SV_MARGIN / (norm_epsilon * n_rows)
    return 1.0 - min(max(noise_level, floor), max_clipped)


class TooFewForBound(ValueError):
    """Too few rows (or users) for a reliable private bound at this ε (:func:`min_count`)."""


def min_count(norm_epsilon: float) -> float:
    """The smallest count n (or ñ) with a threshold in ``[LOW_MARGIN/ε, n − SV_MARGIN/ε]``."""
    return (LOW_MARGIN + SV_MARGIN) / norm_epsilon


FIX = "pass --row-norm B, a larger ε"
"""The fix :func:`margined_quantile` names by default (a bound the caller's ``--row-norm``
replaces); the message ends "or more rows" (or users)."""


def margined_quantile(
    quantile: float,
    count: float,
    norm_epsilon: float,
    unit: str,
    bound: str = "a private norm bound",
    fix: str = FIX,
) -> float:
    """The quantile whose threshold ``q·n`` is ``clip(quantile·n, LOW_MARGIN/ε,
    n − SV_MARGIN/ε)``; raises :class:`TooFewForBound` where that interval is empty.

    ``count``: the public n (``unit="rows"``) or the released ñ (``unit="users"``);
    ``norm_epsilon``: the sparse vector's ε; ``bound`` and ``fix`` name the bound and the
    options that avoid it in the message. A function of public or released values only, so
    the threshold, the failure and its message are too. Below the interval the empty low bins
    fire w.p. > LOW_FIRE (a bound far below the data, :data:`LOW_MARGIN`); above it the search
    fires late or never (:data:`SV_MARGIN`). The top side is the floor of
    :func:`noise_matched_quantile` at n, so it binds for a run's quantile only where n is
    replaced by a smaller count (a public sample's n_S: the sampled centre), and for a
    caller's fixed quantile (the mean's 0.99) at small n: there the search used to fire late,
    a bound up to 32× the data's (measured at n = 2·10⁴, ε = 1: 6 of 100 runs,
    tests/methods/test_auto.py).
    """
    low, high = LOW_MARGIN / norm_epsilon, count - SV_MARGIN / norm_epsilon
    if low > high:
        what = f"{count:.0f} rows are" if unit == "rows" else f"the noisy user count {count:.0f} is"
        raise TooFewForBound(
            f"{what} too few for {bound} at ε_norm = {norm_epsilon:.3g} (needs "
            f"≥ {math.ceil(min_count(norm_epsilon))}): {fix} or more {unit}"
        )
    return min(max(quantile, low / count), high / count)


def private_norm_bound(
    counts: np.ndarray,
    n_rows: float,
    mech: mechanism.AboveThreshold,
    rng: np.random.Generator,
    quantile: float = NORM_QUANTILE,
    grid: np.ndarray = GRID,
) -> NormBound:
    """The smallest grid value whose noisy row count reaches ``quantile·n`` (module docstring).

    ``counts`` are :func:`norm_counts` summed over all rows; ``n_rows`` is the public n.
    Noise: the sparse vector ``mech`` (:func:`norm_bound_mechanism`, the step's whole cost;
    queries Lap(4·COUNT_SENSITIVITY/ε), threshold Lap(2Δ′/ε)), drawn by :mod:`noise`.
    """
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    if mech.sensitivity != COUNT_SENSITIVITY:
        raise ValueError(f"the norm counts need a sparse vector for Δ = {COUNT_SENSITIVITY}")
    cumulative = np.cumsum(np.asarray(counts, dtype=np.int64))
    index = above_threshold(lambda j: float(cumulative[j]), len(grid), quantile * n_rows, mech, rng)
    return NormBound(float(grid[-1] if index is None else grid[index]), index, quantile)


def norm_bound_mechanism(grant: Budget) -> mechanism.AboveThreshold:
    """Step ``norm_bound``: sparse vector over the norm counts (sensitivity 1) at ε of ``grant``."""
    return mechanism.above_threshold(COUNT_SENSITIVITY, laplace_epsilon(grant))


USER_COUNT_SHARE = 0.5
"""User level: share of ε_norm spent on the noisy user count (the rest on the sparse vector)."""


@dataclass(frozen=True)
class UserNormBoundMechanism(mechanism.Composed):
    """Step ``norm_bound`` at user level: ``parts`` = (the user count's Laplace, the sparse
    vector); ``search_epsilon`` is the sparse vector's ε₂, which its margins use."""

    search_epsilon: float


def private_user_norm_bound(
    counts: np.ndarray,
    mech: UserNormBoundMechanism,
    rng: np.random.Generator,
    quantile_for: Callable[[float, float], float],
    grid: np.ndarray = GRID,
) -> NormBound:
    """User level (add/remove one user, n private): the smallest grid value B whose noisy count
    of users with ``√Σ‖x‖² ≤ B`` (sum over the user's rows) reaches ``q·ñ``.

    ``counts`` are :func:`norm_histogram` of the per-user norms (operator-only). Two pure-DP
    steps, the parts of ``mech`` (:func:`user_norm_bound_mechanism`; basic composition):

    1. ñ = #users + Lap(1/ε₁) on the noise grid, ε₁ = USER_COUNT_SHARE·ε: adding or removing
       a user moves the count by 1. ñ is clamped to ≥ 1 (post-processing).
    2. AboveThreshold at ε₂ = ε − ε₁ over the cumulative counts ``#{users: √Σ‖x‖² ≤ grid_j}``:
       a user sits in one bin, so adding or removing one moves every cumulative count by ≤ 1
       (Δ = 1); the threshold ``q·ñ`` with ``q = quantile_for(ñ, ε₂)`` is a function of the
       released ñ and public values, fixed before step 2 (adaptive composition), with the
       margins of :func:`margined_quantile`; where ñ is below :func:`min_count` of ε₂, raises
       :class:`TooFewForBound` (a function of ñ) instead of searching.

    A user with ``√Σ‖x‖² ≤ B`` has every row within B and ``Σ‖x/B‖² ≤ 1``: the user-level Gram
    pass leaves them untouched; the others are clipped and rescaled as with a public bound.
    """
    count, search = mech.parts
    assert isinstance(count, mechanism.Laplace) and isinstance(search, mechanism.AboveThreshold)
    counts = np.asarray(counts, dtype=np.int64)
    users = max(float(count.release(rng, float(counts.sum()))), 1.0)
    epsilon = mech.search_epsilon
    quantile = margined_quantile(quantile_for(users, epsilon), users, epsilon, "users")
    released = private_norm_bound(counts, users, search, rng, quantile=quantile, grid=grid)
    return NormBound(released.bound, released.index, quantile, users)


def user_norm_bound_mechanism(grant: Budget) -> UserNormBoundMechanism:
    """Step ``norm_bound`` at user level: the user count's Laplace (Δ = 1, USER_COUNT_SHARE of
    ε) then the sparse vector at the rest (Δ = 1); basic composition, ε of ``grant`` in all."""
    epsilon = laplace_epsilon(grant)
    count_epsilon = USER_COUNT_SHARE * epsilon
    count = mechanism.Laplace(COUNT_SENSITIVITY, COUNT_SENSITIVITY / count_epsilon)
    search_epsilon = epsilon - count.cost().epsilon  # type: ignore[union-attr]
    search = mechanism.above_threshold(COUNT_SENSITIVITY, search_epsilon)
    return UserNormBoundMechanism((count, search), search_epsilon)
