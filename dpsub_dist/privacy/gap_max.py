"""GAP-MAX over spans of data points (SS21 Alg. 1, "DP exact subspace estimator"; ALGORITHMS.md §6).

Input domain: ``n`` points in R^d (rows) and a rank ``k < d``. Neighbour relation:
replace one point (``n`` is public). Privacy map: (ε, δ)-DP, or δ-approximately
ε²/2-zCDP, by truncated Laplace noise TLap(2, ε, δ) (:mod:`dpsub_dist.privacy.noise`).

The steps of SS21 Algorithm 1 as implemented here:

1. **Candidates** ``Q``: every k-dimensional subspace of R^d, plus a NULL candidate.
   Membership "x ∈ s" is numerical: ``‖x − Π_s x‖ ≤ τ·‖x‖`` with the relative tolerance
   ``τ`` (:data:`DEFAULT_TOLERANCE`); it is monotone (x ∈ t ⊆ s ⇒ x ∈ s) and zero rows
   belong to every subspace.
2. **Score** ``u(X, s) = |X ∩ s| − max_{t ⊊ s} |X ∩ t|``. Replacing one point changes
   ``u(·, s)`` by at most 1 for every ``s``: removing x lowers both terms, each by at
   most [x ∈ s]; adding x′ raises both, each by at most [x′ ∈ s]. ``u(X, s) > 0`` exactly
   when s is spanned by data points (otherwise ``t = span(X ∩ s)`` is a proper subspace
   with the same count), so only the spans of linearly independent k-subsets of X
   need scoring: every other subspace scores 0. Equal spans (same member set) are
   scored once. ``max_{t ⊊ s}`` is attained by a (k−1)-dimensional span of members.
3. **NULL** scores ``ℓ + 4 ln(1/δ)/ε + 1`` (a constant, sensitivity 0): unless a span
   beats it by a clear margin, the answer is ⊥. It tolerates ``ℓ`` outliers.
4. **Gap**: ``s₁``, ``s₂`` are the best and second-best candidates (the infinitely many
   zero-score subspaces included), ``g = max(0, u(s₁) − u(s₂) − 1)``. For every ``s``
   the statistic ``f_s(X) = max(0, u(X, s) − max_{s′≠s} u(X, s′) − 1)`` has sensitivity
   2, and is positive for at most one ``s``; if ``f_s(X) > 0`` then ``f_{s′}(X′) = 0``
   for every ``s′ ≠ s`` on a neighbour X′ (that is what the −1 buys). So both
   neighbours release a post-processing of ``f_s + ξ`` for one common ``s``.
5. **Release**: ``ξ ~ TLap(2, ε, δ)`` with bound ``A``; output ``s₁`` if ``g + ξ > A``
   and ``s₁`` is not NULL, else ⊥. The threshold must be ``A``: then ``f_s = 0``
   never releases ``s`` whatever ξ, which is what makes the map a post-processing
   of the one-dimensional TLap mechanism. The noisy gap ``g + ξ`` may be reported.

Numerical caveats (documented, not proven away). The proof is for exact membership;
with ``τ > 0`` a span whose members are decided differently by two generating subsets
can appear twice, which only lowers the gap (more ⊥). The released basis is computed
from the winning span's members, so its last bits could depend on which rows were used;
the projection is rounded to :data:`RELEASE_DECIMALS` decimals before taking its
eigenvectors, which removes that channel except at rounding boundaries (compare the
floating-point caveat in :mod:`dpsub_dist.privacy.noise`). Cost: C(n, k) candidate spans,
each tested against all n points — a reference for small inputs only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpsub_dist.linalg import top_eigenvectors
from dpsub_dist.privacy import noise
from dpsub_dist.privacy.accountant import ApproxDP, Budget, laplace_epsilon

GAP_SENSITIVITY = 2.0
"""Sensitivity of the gap statistic f_s (each score moves by ≤ 1 under replace-one)."""

DEFAULT_TOLERANCE = 1e-5
"""Relative membership tolerance τ: x ∈ s iff ‖x − Π_s x‖ ≤ τ‖x‖ (covers float32 rounding)."""

RELEASE_DECIMALS = 10
"""Decimals kept of the released projection matrix before its eigenvectors are taken."""

_BATCH_FLOATS = 2**22  # floats per residual block (32 MiB)
_BATCH_SUBSETS = 1024
_REFINE_ROUNDS = 3


@dataclass(frozen=True)
class SpanScores:
    """Scores of the distinct candidate spans (descending) and the best span's basis."""

    scores: np.ndarray
    top_basis: np.ndarray | None
    subsets_scored: int


@dataclass(frozen=True)
class GapMaxRelease:
    """GAP-MAX outcome: the basis (d×k) or None for ⊥, and what may be reported."""

    basis: np.ndarray | None
    noisy_gap: float
    threshold: float
    null_score: float
    noise_scale: float
    reason: Literal["released", "null", "gap"]


def null_score(outliers: int, epsilon: float, delta: float) -> float:
    """Score of the NULL candidate: ℓ + 4 ln(1/δ)/ε + 1 (SS21 Alg. 1)."""
    return outliers + 4 * math.log(1 / delta) / epsilon + 1


def gap_max_parameters(grant: Budget) -> tuple[float, float]:
    """(ε, δ) for GAP-MAX from a grant: ApproxDP as is; zCDP as (√(2ρ), δ₀) (see noise.py)."""
    delta = grant.delta if isinstance(grant, ApproxDP) else grant.delta0
    if not 0 < delta < 1:
        raise ValueError("GAP-MAX with truncated Laplace needs a delta in (0, 1)")
    return laplace_epsilon(grant), delta


def _orthonormal_spans(groups: np.ndarray, tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal bases (b×d×j) of each group of j rows, and which groups are independent.

    A group is independent when its rows, scaled to unit norm, have j-th singular value
    above ``tolerance`` (zero rows make a group dependent).
    """
    norms = np.linalg.norm(groups, axis=2, keepdims=True)
    unit = np.divide(groups, norms, out=np.zeros_like(groups), where=norms > 0)
    _, singular, vt = np.linalg.svd(unit, full_matrices=False)
    independent = (singular[:, -1] > tolerance) & np.all(norms[:, :, 0] > 0, axis=1)
    return np.swapaxes(vt, 1, 2), independent


def _membership(
    points: np.ndarray, norms: np.ndarray, bases: np.ndarray, tolerance: float
) -> np.ndarray:
    """b×n booleans: point i lies in span b, i.e. ‖x_i − Π_b x_i‖ ≤ tolerance·‖x_i‖."""
    coords = np.matmul(points, bases)
    residual = points - np.matmul(coords, np.swapaxes(bases, 1, 2))
    return np.linalg.norm(residual, axis=2) <= tolerance * norms


def _subset_batches(n: int, j: int, points: int, dim: int):
    """Index arrays of all j-subsets of range(n), in batches sized for a residual block."""
    size = max(1, min(_BATCH_SUBSETS, _BATCH_FLOATS // max(1, points * dim)))
    combos = itertools.combinations(range(n), j)
    while batch := list(itertools.islice(combos, size)):
        yield np.array(batch, dtype=np.int64).reshape(len(batch), j)


def _members_basis(points: np.ndarray, members: np.ndarray, rank: int) -> np.ndarray:
    """d×k orthonormal basis of the best rank-k fit to the member rows (their span, exactly)."""
    return np.linalg.svd(points[members], full_matrices=False)[2][:rank].T


def _refine(
    points: np.ndarray, norms: np.ndarray, mask: np.ndarray, rank: int, tolerance: float
) -> np.ndarray:
    """Members of the span of a mask's members (a no-op in exact arithmetic).

    Numerically it merges the member sets that different generating k-subsets of the
    same span produce (an ill-conditioned k-subset gives an inaccurate span).
    """
    for _ in range(_REFINE_ROUNDS):
        basis = _members_basis(points, mask, rank)
        refined = _membership(points, norms, basis[None], tolerance)[0]
        if np.array_equal(refined, mask):
            break
        mask = refined
    return mask


def _max_in_proper_subspace(members: np.ndarray, k: int, tolerance: float) -> int:
    """max over (k−1)-dim subspaces t of how many member rows (nonzero, rank k) lie in t."""
    m = members.shape[0]
    if k == 1:
        return 0
    if m == k:
        return k - 1  # k independent rows: any k−1 of them, never all k
    best = 0
    norms = np.linalg.norm(members, axis=1)
    for subsets in _subset_batches(m, k - 1, m, members.shape[1]):
        bases, independent = _orthonormal_spans(members[subsets], tolerance)
        if independent.any():
            inside = _membership(members, norms, bases[independent], tolerance)
            best = max(best, int(inside.sum(axis=1).max()))
    return best


def score_spans(points: np.ndarray, rank: int, tolerance: float = DEFAULT_TOLERANCE) -> SpanScores:
    """Steps 1–2: score u(X, s) of every distinct span of an independent ``rank``-subset.

    A k-subset inside the member set of a span already found with more than k members
    spans that same span, so it is skipped (for exactly low-rank data, most of them).
    """
    points = np.asarray(points, dtype=np.float64)
    n, dim = points.shape
    row_space = None
    if dim > n:  # work in the row space: an isometry on span(X), so memberships are kept
        row_space, _ = np.linalg.qr(points.T)
        points = points @ row_space
    norms = np.linalg.norm(points, axis=1)
    nonzero = norms > 0
    spans: dict[bytes, np.ndarray] = {}  # member set (nonzero rows) of each distinct span
    seen: set[bytes] = set()
    covers: list[np.ndarray] = []  # spans with more than k members
    scored = 0
    for subsets in _subset_batches(n, rank, n, points.shape[1]):
        for cover in covers:
            subsets = subsets[~cover[subsets].all(axis=1)]
        scored += len(subsets)
        if not len(subsets):
            continue
        bases, independent = _orthonormal_spans(points[subsets], tolerance)
        if not independent.any():
            continue
        inside = _membership(points, norms, bases[independent], tolerance) & nonzero
        packed = np.packbits(inside, axis=1)
        for i in np.unique(packed, axis=0, return_index=True)[1]:
            raw = packed[i].tobytes()
            if raw in seen:
                continue
            seen.add(raw)
            mask = inside[i]
            if mask.sum() > rank:
                mask = _refine(points, norms, mask, rank, tolerance) & nonzero
                covers.append(mask)
            spans.setdefault(np.packbits(mask).tobytes(), mask)
    masks = list(spans.values())
    scores = [int(m.sum()) - _max_in_proper_subspace(points[m], rank, tolerance) for m in masks]
    if not scores:
        return SpanScores(np.zeros(0, dtype=np.int64), None, scored)
    order = np.argsort(scores, kind="stable")[::-1]
    basis = _members_basis(points, masks[order[0]], rank)
    if row_space is not None:
        basis = row_space @ basis
    return SpanScores(np.asarray(scores, dtype=np.int64)[order], _canonical(basis), scored)


def _canonical(basis: np.ndarray) -> np.ndarray:
    """The same span as a basis whose last bits do not depend on how it was computed."""
    projection = np.round(basis @ basis.T, RELEASE_DECIMALS)
    return top_eigenvectors(projection, basis.shape[1])[1]


def gap_max_release(
    spans: SpanScores,
    epsilon: float,
    delta: float,
    outliers: int,
    rng: np.random.Generator,
) -> GapMaxRelease:
    """Steps 3–5: NULL, gap, truncated Laplace, release ``s₁`` or ⊥ (SS21 Alg. 1)."""
    null = null_score(outliers, epsilon, delta)
    # Two zeros stand for the infinitely many k-dim subspaces no data span reaches.
    ranked = sorted([*spans.scores.tolist(), null, 0, 0], reverse=True)
    gap = max(0.0, ranked[0] - ranked[1] - 1)
    scale, bound = noise.truncated_laplace_calibration(GAP_SENSITIVITY, epsilon, delta)
    noisy = noise.add_truncated_laplace(rng, gap, scale, bound, GAP_SENSITIVITY)
    data_wins = spans.top_basis is not None and spans.scores[0] > null
    if noisy <= bound:
        basis, reason = None, "gap"
    elif not data_wins:
        basis, reason = None, "null"
    else:
        basis, reason = spans.top_basis, "released"
    return GapMaxRelease(basis, noisy, bound, null, scale, reason)


def gap_max(
    points: np.ndarray,
    rank: int,
    grant: Budget,
    rng: np.random.Generator,
    outliers: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
) -> GapMaxRelease:
    """SS21 Algorithm 1 on ``points`` (n×d): the span of most points, privately, or ⊥."""
    epsilon, delta = gap_max_parameters(grant)
    return gap_max_release(score_spans(points, rank, tolerance), epsilon, delta, outliers, rng)
