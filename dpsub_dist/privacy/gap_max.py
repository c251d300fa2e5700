"""GAP-MAX over spans of data points (SS21 Alg. 1, "DP exact subspace estimator"; ALGORITHMS.md §6).

Input domain: ``n`` points in R^d (rows) and a rank ``k < d``. Neighbour relation:
replace one point (``n`` is public). Privacy map: (ε, δ)-DP, or δ-approximately
ε²/2-zCDP: truncated Laplace noise TLap(2, ε, δ_gap) on a sensitivity-2 statistic
(:mod:`dpsub_dist.privacy.noise`) plus a snapped release that neighbours disagree on
with probability at most δ_snap, δ_gap + δ_snap = δ (:data:`SNAP_DELTA_SHARE`).

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
3. **NULL** scores ``ℓ + 4 ln(1/δ_gap)/ε + 1`` (a constant, sensitivity 0): unless a span
   beats it by a clear margin, the answer is ⊥. It tolerates ``ℓ`` outliers.
4. **Gap and conditioning**: ``s₁``, ``s₂`` are the best and second-best candidates (the
   infinitely many zero-score subspaces included), ``f_s(X) = max(0, u(X, s) −
   max_{s′≠s} u(X, s′) − 1)``. For a data span ``s`` let ``λ_s(X)`` be the k-th
   eigenvalue of ``Σ x̄x̄ᵀ`` over its members scaled to unit length (how well they
   determine ``s``), and ``h_s = max(0, min(f_s, 2(λ_s − c₀)))`` with the public floor
   ``c₀ = 1 + (1 + τ√n)²`` (:func:`conditioning_floor`); ``h_NULL = f_NULL``. ``f_s``
   has sensitivity 2, and so has ``2λ_s`` (adding or removing one unit row moves an
   eigenvalue of the Gram by at most 1, Weyl), so ``h_s`` has sensitivity 2; it is
   positive for at most one ``s`` (``h_s ≤ f_s``), and if ``h_s(X) > 0`` then
   ``h_{s′}(X′) = 0`` for every ``s′ ≠ s`` on a neighbour X′ (that is what the −1 in
   ``f`` buys). So both neighbours release a post-processing of ``h_s + ξ`` for one
   common ``s``, and ``h = max_s h_s`` (the reported statistic) has sensitivity 2.
5. **Decision**: ``ξ ~ TLap(2, ε, δ_gap)`` with bound ``A``; release ``s₁`` if ``h + ξ > A``
   and ``s₁`` is not NULL, else ⊥. The threshold must be ``A``: then ``h_s = 0`` never
   releases ``s`` whatever ξ, which makes the decision a post-processing of the
   one-dimensional TLap mechanism: (ε, δ_gap). The noisy statistic ``h + ξ`` may be
   reported (``noisy_gap``). A release implies ``h > 0``, hence ``λ_{s₁} > c₀``.
6. **Release of s₁** (:func:`snap_symmetric`): the projector ``P`` onto the best rank-k
   fit of the unit-scaled members is snapped to a grid of side ``w`` (:func:`snap_side`)
   with a uniform offset per upper-triangle entry drawn from the private noise
   generator; the published basis is the top-k eigenvectors of the snapped matrix
   (post-processing). Why neighbours agree: let X, X′ both release ``s`` with member sets
   M, M′ (they differ at most in the replaced row) and fits V, V′. The common rows A
   (unit-scaled) have ``σ_k(A)² ≥ λ_s − 1 > (1 + τ√n)²`` (one row removed), and each
   fit leaves a residual ``‖A(I − Π_V)‖_F ≤ τ√n`` (every member is within τ of s and
   the fit is the best rank-k one). Then ``σ_k(AΠ_V) > 1`` (Weyl) and
   ``‖AΠ_V(Π_V − Π_V′)‖_F ≤ ‖A(Π_V − Π_V′)‖_F + τ√n ≤ 3τ√n``, so
   ``‖sin Θ(V, V′)‖_F ≤ 3τ√n`` and ``‖P − P′‖_F ≤ 3√2·τ√n =: Δ``. With a common
   offset, an entry moving by ``a`` changes cell with probability ``min(1, a/w)``; over
   the D = d(d+1)/2 upper-triangle entries the snapped matrices differ with probability
   at most ``Σ|ΔP_ij|/w ≤ √D·Δ/w = δ_snap`` for ``w = √D·Δ/δ_snap``. Coupling the two
   runs on this event gives (0, δ_snap) for the release given ``s``; with step 5 the
   whole output is (ε, δ_gap + δ_snap)-DP. The grid grows with τ: a small tolerance is
   what makes the release useful (``w ≈ 5e-4`` at τ = 1e-12, n = 60, d = 10,
   δ_snap = 5e-7; at τ = 1e-5 it is coarser than the entries of P).

What is assumed (documented, not proven away). The proof, as SS21's, is for an exact
candidate ``s`` with a membership predicate that depends only on the row and ``s``, so
that neighbours selecting ``s`` have member sets differing only in the replaced row.
The code decides membership against a computed span; a row within about Δ of the
tolerance boundary could be decided differently by the two neighbours, and a span whose
members are decided differently by two generating subsets can appear twice (which only
lowers the gap). The uniform offsets have 53-bit resolution and the grid comparison
rounds at about 1e-16 relative, which moves the boundary probability by far less than δ.
Cost: C(n, k) candidate spans, each tested against all n points — a reference for small
inputs only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpsub_dist.linalg import top_eigenvectors
from dpsub_dist.params import DEFAULT_TOLERANCE
from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import ApproxDP, Budget, laplace_epsilon, split_step_delta

GAP_SENSITIVITY = 2.0
"""Sensitivity of the gap statistic f_s (each score moves by ≤ 1 under replace-one)."""


SNAP_DELTA_SHARE = 0.5
"""Share of the grant's δ spent on the snapped release (step 6); the rest goes to TLap."""

_BATCH_FLOATS = 2**22  # floats per residual block (32 MiB)
_BATCH_SUBSETS = 1024
_REFINE_ROUNDS = 3


@dataclass(frozen=True)
class SpanScores:
    """What the scoring step hands to the release (no noise, no rows).

    Scores of the distinct candidate spans (descending); the best span's rank-k fit of its
    unit-scaled members (``top_basis``, d×k) and the k-th eigenvalue of their Gram
    (``top_conditioning``, λ of step 4); the shape and tolerance the scores used.
    """

    scores: np.ndarray
    top_basis: np.ndarray | None
    top_conditioning: float
    subsets_scored: int
    n_rows: int
    dim: int
    tolerance: float


@dataclass(frozen=True)
class GapMaxRelease:
    """GAP-MAX outcome: the basis (d×k) or None for ⊥, and what may be reported."""

    basis: np.ndarray | None
    noisy_gap: float
    threshold: float
    null_score: float
    noise_scale: float
    reason: Literal["released", "null", "gap"]
    snap_side: float


def null_score(outliers: int, epsilon: float, delta: float) -> float:
    """Score of the NULL candidate: ℓ + 4 ln(1/δ)/ε + 1 (SS21 Alg. 1; δ is TLap's δ_gap)."""
    return outliers + 4 * math.log(1 / delta) / epsilon + 1


def split_delta(delta: float) -> tuple[float, float]:
    """(δ_gap, δ_snap): the grant's δ split between the TLap decision and the snap (sum δ)."""
    return split_step_delta(delta, SNAP_DELTA_SHARE)


def conditioning_floor(tolerance: float, n_rows: int) -> float:
    """c₀ = 1 + (1 + τ√n)²: a released span's members have λ > c₀ (step 4)."""
    return 1.0 + (1.0 + tolerance * math.sqrt(n_rows)) ** 2


def projector_shift(tolerance: float, n_rows: int) -> float:
    """Δ = 3√2·τ√n: largest ‖P − P′‖_F between neighbours that release the same span (step 6)."""
    return 3.0 * math.sqrt(2.0) * tolerance * math.sqrt(n_rows)


def snap_side(tolerance: float, n_rows: int, dim: int, delta_snap: float) -> float:
    """Grid side w = √D·Δ/δ_snap, D = d(d+1)/2: neighbours' snaps differ w.p. ≤ δ_snap."""
    entries = dim * (dim + 1) // 2
    return math.sqrt(entries) * projector_shift(tolerance, n_rows) / delta_snap


def snap_symmetric(matrix: np.ndarray, side: float, rng: np.random.Generator) -> np.ndarray:
    """Each upper-triangle entry rounded to the centre of its cell of a grid of side ``side``
    shifted by a private uniform offset; the result is symmetric (step 6).

    Pass the private noise generator: the guarantee is over fresh offsets drawn
    independently of the data (with offsets fixed by a user's seed the map would be
    deterministic, and some neighbouring pair would straddle a cell boundary for sure).
    The output reveals the offsets, which is harmless. Cost: (0, δ_snap) for
    ``side = snap_side(...)``.
    """
    rows, cols = np.triu_indices(matrix.shape[0])
    offset = rng.uniform(0.0, 1.0, rows.size)
    cell = np.floor(matrix[rows, cols] / side - offset)
    snapped = np.zeros_like(matrix, dtype=np.float64)
    snapped[rows, cols] = (cell + offset + 0.5) * side
    snapped[cols, rows] = snapped[rows, cols]
    return snapped


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


def _members_fit(points: np.ndarray, members: np.ndarray, rank: int) -> tuple[np.ndarray, float]:
    """Best rank-k fit (d×k basis) of the member rows scaled to unit length, and λ: the k-th
    eigenvalue of their Gram (σ_k² of the scaled rows; 0 with fewer than k members)."""
    rows = points[members]
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    rows = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
    _, singular, vt = np.linalg.svd(rows, full_matrices=False)
    return vt[:rank].T, float(singular[rank - 1] ** 2) if singular.size >= rank else 0.0


def _refine(
    points: np.ndarray, norms: np.ndarray, mask: np.ndarray, rank: int, tolerance: float
) -> np.ndarray:
    """Members of the span of a mask's members (a no-op in exact arithmetic).

    Numerically it merges the member sets that different generating k-subsets of the
    same span produce (an ill-conditioned k-subset gives an inaccurate span).
    """
    for _ in range(_REFINE_ROUNDS):
        basis = _members_fit(points, mask, rank)[0]
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
        return SpanScores(np.zeros(0, dtype=np.int64), None, 0.0, scored, n, dim, tolerance)
    order = np.argsort(scores, kind="stable")[::-1]
    basis, conditioning = _members_fit(points, masks[order[0]], rank)
    if row_space is not None:
        basis = row_space @ basis
    ranked = np.asarray(scores, dtype=np.int64)[order]
    return SpanScores(ranked, basis, conditioning, scored, n, dim, tolerance)


@dataclass(frozen=True)
class GapMax(mechanism.Composed):
    """Step ``gap_max``: the truncated-Laplace decision (ε, δ_gap) and the snapped release
    (0, δ_snap), composed (basic composition: (ε, δ_gap + δ_snap)); ``null`` is the NULL
    candidate's score (step 3), public: a function of ℓ, ε and δ_gap only."""

    parts: tuple[mechanism.TruncatedLaplace, mechanism.Snap]
    null: float

    @property
    def decision(self) -> mechanism.TruncatedLaplace:
        return self.parts[0]

    @property
    def snap(self) -> mechanism.Snap:
        return self.parts[1]


def gap_max_mechanism(
    grant: Budget, tolerance: float, n_rows: int, dim: int, outliers: int = 0
) -> GapMax:
    """:class:`GapMax` calibrated to ``grant`` (ε and δ by :func:`gap_max_parameters`, δ split
    by :func:`split_delta`) for ``n_rows`` points in R^``dim``, the membership ``tolerance``
    and ``outliers`` tolerated by the NULL score."""
    epsilon, delta = gap_max_parameters(grant)
    delta_gap, delta_snap = split_delta(delta)
    decision = mechanism.truncated_laplace(GAP_SENSITIVITY, epsilon, delta_gap)
    snap = mechanism.Snap(
        dim * (dim + 1) // 2,
        projector_shift(tolerance, n_rows),
        snap_side(tolerance, n_rows, dim, delta_snap),
    )
    return GapMax((decision, snap), null_score(outliers, epsilon, delta_gap))


def gap_max_release(spans: SpanScores, steps: GapMax, rng: np.random.Generator) -> GapMaxRelease:
    """Steps 3–6: NULL, gap and conditioning, truncated Laplace, snapped ``s₁`` or ⊥.

    ``steps`` is the mechanism the caller charged (calibrated for the spans' n, d and
    tolerance); ``rng`` the private noise generator: it draws ξ by ``steps.decision`` and the
    snap's offsets on ``steps.snap``'s grid.
    """
    null = steps.null
    # Two zeros stand for the infinitely many k-dim subspaces no data span reaches.
    ranked = sorted([*spans.scores.tolist(), null, 0, 0], reverse=True)
    gap = max(0.0, ranked[0] - ranked[1] - 1)
    data_wins = spans.top_basis is not None and spans.scores[0] > null
    statistic = gap
    if data_wins:  # h = min(f, 2(λ − c₀)): a release certifies λ > c₀ (step 4)
        floor = conditioning_floor(spans.tolerance, spans.n_rows)
        statistic = max(0.0, min(gap, 2.0 * (spans.top_conditioning - floor)))
    decision, side = steps.decision, steps.snap.side
    noisy = decision.release(rng, statistic)
    if noisy <= decision.bound:
        basis, reason = None, "gap"
    elif not data_wins:
        basis, reason = None, "null"
    else:
        top = spans.top_basis
        snapped = snap_symmetric(top @ top.T, side, rng)  # cost (0, δ_snap), step 6
        basis, reason = top_eigenvectors(snapped, top.shape[1])[1], "released"
    return GapMaxRelease(basis, noisy, decision.bound, null, decision.scale, reason, side)


def gap_max(
    points: np.ndarray,
    rank: int,
    grant: Budget,
    rng: np.random.Generator,
    outliers: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
) -> GapMaxRelease:
    """SS21 Algorithm 1 on ``points`` (n×d): the span of most points, privately, or ⊥ (a
    reference for tests; the runner charges the mechanism it draws with)."""
    n_rows, dim = np.shape(points)
    steps = gap_max_mechanism(grant, tolerance, n_rows, dim, outliers)
    return gap_max_release(score_spans(points, rank, tolerance), steps, rng)
