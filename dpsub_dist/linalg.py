"""Numerical kernels shared by every estimator: top-k bases and subspace distance."""

from __future__ import annotations

import numpy as np
import scipy.linalg

EXACT_FLOP_LIMIT = 2e8
"""Below this estimated cost a local basis is always computed exactly."""

EXACT_SPEED_RATIO = 2.5
"""Above EXACT_FLOP_LIMIT the exact route (one Gram product and ``eigh``) is still taken while
its flops are at most this multiple of the randomized route's: its BLAS-3 product runs about
3× faster per flop than the sketches' thin products and QRs (measured at d = 10⁵, k = 2, one
BLAS thread: 148 rows 0.21 s exact vs 0.79 s randomized, 300 rows 0.34 vs 0.75 s, 600 rows
0.99 vs 1.21 s)."""

OVERSAMPLE = 10
POWER_ITERS = 4


def top_eigenvectors(sym: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k eigenvalues (descending) and eigenvectors (columns) of a symmetric matrix."""
    d = sym.shape[0]
    values, vectors = scipy.linalg.eigh(sym, subset_by_index=[d - k, d - 1])
    return values[::-1], vectors[:, ::-1]


def top_left_singular_vectors(matrix: np.ndarray, k: int) -> np.ndarray:
    """Orthonormal d×k basis of the top-k left singular vectors (k ≤ columns)."""
    u, _, _ = np.linalg.svd(matrix, full_matrices=False)
    return u[:, :k]


def _randomized_right_vectors(
    rows: np.ndarray, k: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Halko–Martinsson–Tropp randomized range finder with power iterations."""
    sketch = rows @ rng.standard_normal((rows.shape[1], k + OVERSAMPLE))
    basis, _ = np.linalg.qr(sketch)
    for _ in range(POWER_ITERS):
        basis, _ = np.linalg.qr(rows.T @ basis)
        basis, _ = np.linalg.qr(rows @ basis)
    _, s, vt = np.linalg.svd(basis.T @ rows, full_matrices=False)
    return s, vt


def _rank_deficient(
    singular: np.ndarray, k: int, rows: int, dim: int, from_gram: bool = False
) -> bool:
    """True when the k-th singular value is numerically zero relative to the first.

    Singular values taken as square roots of Gram eigenvalues carry an error of about
    √(n·eps)·s₁, not n·eps·s₁, so that route uses the square-rooted tolerance.
    """
    tolerance = max(rows, dim) * _EPS
    if from_gram:
        tolerance = np.sqrt(tolerance)
    return bool(singular[0] == 0 or singular[k - 1] <= singular[0] * tolerance)


_EPS = float(np.finfo(float).eps)


def top_right_singular_vectors_from_gram(gram: np.ndarray, k: int, rows: int) -> np.ndarray | None:
    """Top-k right singular vectors (k×d) of a matrix X given only XᵀX and its row count."""
    if rows < k:
        return None
    values, vectors = top_eigenvectors(gram, k)
    singular = np.sqrt(np.maximum(values, 0.0))
    return None if _rank_deficient(singular, k, rows, gram.shape[0], from_gram=True) else vectors.T


def _exact_is_affordable(m: int, d: int, k: int) -> bool:
    """Whether the exact route is cheap outright, or not much dearer than the randomized one."""
    small = min(m, d)
    exact = m * d * small + 4 * small**3
    randomized = 4 * (POWER_ITERS + 1) * m * d * (k + OVERSAMPLE)
    return (
        exact <= EXACT_FLOP_LIMIT
        or small <= 4 * (k + OVERSAMPLE)
        or exact <= EXACT_SPEED_RATIO * randomized
    )


def top_right_singular_vectors(
    rows: np.ndarray, k: int, rng: np.random.Generator
) -> np.ndarray | None:
    """Top-k right singular vectors of ``rows`` as a k×d array, or None if rank < k.

    Exact (eigh of the smaller Gram matrix) when cheap, randomized SVD otherwise;
    ``rng`` only drives the randomized sketch and must come from public randomness.
    Rows are first scaled by a power of two to a largest magnitude in [½, 1) (exact; the
    singular vectors do not change), so any finite input works: no overflow to inf, no
    underflow to zero.
    """
    m, d = rows.shape
    if m < k:
        return None
    peak = max(float(rows.max()), -float(rows.min()))  # max |x| without a temporary copy
    if peak == 0:
        return None
    rows = np.ldexp(rows, -np.frexp(peak)[1])
    if not _exact_is_affordable(m, d, k):
        singular, vt = _randomized_right_vectors(rows, k, rng)
        return None if _rank_deficient(singular, k, m, d) else vt[:k]
    if d <= m:
        return top_right_singular_vectors_from_gram(rows.T @ rows, k, m)
    values, vectors = top_eigenvectors(rows @ rows.T, k)
    singular = np.sqrt(np.maximum(values, 0.0))
    if _rank_deficient(singular, k, m, d, from_gram=True):
        return None
    vt, _ = np.linalg.qr(rows.T @ vectors / singular)  # re-orthonormalise after the m×m route
    return vt.T


def subspace_error(basis_hat: np.ndarray, basis_true: np.ndarray) -> float:
    """‖Π̂ − Π‖ (operator norm of the projection difference) for d×k orthonormal bases.

    Equals the sine of the largest principal angle; computed without forming d×d.
    """
    if basis_hat.shape != basis_true.shape:
        raise ValueError(f"basis shapes differ: {basis_hat.shape} vs {basis_true.shape}")
    cosines = np.linalg.svd(basis_hat.T @ basis_true, compute_uv=False)
    return float(np.sqrt(max(0.0, 1.0 - float(np.min(cosines)) ** 2)))


def row_norms(rows: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row, without overflow or underflow: rows whose squared norm
    leaves the float64 range (norms above ~1e154 or below ~1e-154) are rescaled by their
    largest entry first."""
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    extreme = ~np.isfinite(norms) | ((norms < 1e-150) & (norms > 0))
    zero = np.flatnonzero(norms == 0)  # all-zero rows, or tiny entries whose squares underflow
    extreme[zero] = np.any(rows[zero] != 0, axis=1)
    if extreme.any():
        part = rows[extreme]
        scale = np.max(np.abs(part), axis=1)
        unit = part / scale[:, None]
        with np.errstate(over="ignore"):  # a norm past the float64 range is inf, quietly
            norms[extreme] = scale * np.sqrt(np.einsum("ij,ij->i", unit, unit))
    return norms
