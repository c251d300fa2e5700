"""Noise for private subspace clustering (WWS15; ALGORITHMS.md §9 b, c).

Input domain of both mechanisms: rows ``x ∈ R^d`` with ``‖x‖ ≤ 1`` (the estimator
scales or clips them first). Neighbour relation: replace one row (``n`` public).

- :func:`release_cluster_grams` (WWS15 SuLQ k-plane; ALGORITHMS.md §9 b): one iteration
  releases the per-cluster Gram matrices ``A_ℓᵀA_ℓ`` (any number of clusters), each plus
  symmetric Gaussian noise (upper triangle and diagonal i.i.d. ``N(0, σ²)``). The
  assignment of rows to clusters uses only the previous (already released) subspaces, so
  replacing one row moves at most that row: ``−xxᵀ`` in one cluster and ``+x′x′ᵀ`` in one
  cluster, each of Frobenius norm ≤ 1. We calibrate the Gaussian mechanism on the
  concatenated upper triangles with the L2 sensitivity ``Δ = 2`` of ALGORITHMS.md
  §9 (the triangle inequality; the exact value is ``√2``, so Δ = 2 is
  conservative). One iteration is one charge; ``T`` iterations compose in the
  run's mode (basic (ε, δ) composition, or zCDP, which is much tighter).
- :func:`gibbs_subspace_clustering` (WWS15 exponential mechanism; §9 c): a Gibbs
  sampler over assignments ``z`` and subspaces ``S`` targeting
  ``p(z, S) ∝ exp(−(ε/2) Σ_i d²(x_i, S_{z_i}))``. Only ``S`` is released. Its exact
  marginal is ``p(S) ∝ Π_i Σ_ℓ exp(−(ε/2) d²(x_i, S_ℓ))``; replacing one row changes
  one factor by a ratio in ``[e^{−ε/2}, e^{ε/2}]`` (``d² ∈ [0, 1]``), hence the
  normaliser by the same, so an *exact* sample of ``S`` is ε-DP (McSherry &
  Talwar 2007 with a utility of sensitivity 1). A chain run for finitely many
  sweeps only approximates that distribution: its output is (ε, δ)-DP with
  ``δ = (1 + e^ε)·η`` where ``η`` is the chain's total-variation distance to
  stationarity on the worse of the two inputs, and we cannot bound ``η``. So a run
  has **no proven guarantee** (:data:`GIBBS_GUARANTEE`): it is not charged to any
  budget and cannot run under the ledger. Composing the chain's steps instead (each
  label draw and each Bingham column draw is an exponential mechanism of range 1, so
  2κ-DP) would charge ``2κ(1 + q)`` per sweep, and at a useful κ over tens of sweeps
  far more than any budget. The steps themselves are exact: assignments are
  categorical draws, each subspace column is an exact vector-Bingham draw
  (Kent, Ganeiber & Mardia 2018, angular-central-Gaussian rejection), and the
  column-by-column update is Hoff's (2009) Gibbs sampler for the matrix Bingham
  ``p(U) ∝ etr(κ UᵀAU)``.

All randomness here is DP noise: pass a generator from :func:`noise.noise_rng`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import ApproxDP, Budget

GRAM_SENSITIVITY = 2.0
"""L2 sensitivity of one SuLQ iteration's K Gram matrices, rows of norm ≤ 1 (§9 b)."""

GIBBS_GUARANTEE = "none (finite MCMC chain; not differentially private)"
"""What a Gibbs run guarantees; manifests say so, and the ledger refuses the method."""

GIBBS_WARNING = (
    "warning: --method gibbs is not differentially private (a finite MCMC chain only "
    "approximates the exponential mechanism): treat its output as non-private"
)
"""Printed by ``dpsub cluster --method gibbs``."""

MAX_BINGHAM_TRIES = 100_000
"""Rejection-sampler guard; the acceptance rate of the ACG envelope is far above 1e-5."""


def gram_noise_sigma(grant: Budget) -> float:
    """Noise std of one SuLQ iteration's Gram release for this grant (Δ = 2)."""
    return iteration_mechanism(grant).sigma


def iteration_mechanism(grant: Budget) -> mechanism.Gaussian:
    """Step ``iteration_i``: the K Grams + symmetric Gaussian noise, Δ = 2 (§9 b)."""
    return mechanism.gaussian(grant, GRAM_SENSITIVITY)


def release_cluster_grams(
    grams: np.ndarray, iteration: mechanism.Gaussian, rng: np.random.Generator
) -> np.ndarray:
    """K×d×d Gram matrices plus symmetric Gaussian noise (WWS15 SuLQ k-plane, §9 b).

    ``iteration`` is :func:`iteration_mechanism` of the step's grant: that is what makes one
    release (ε, δ)-DP (or ρ-zCDP) for rows of norm ≤ 1 under replace-one neighbours. The K
    upper triangles are one symmetric release with L2 sensitivity Δ = 2 (on its grid).
    """
    return iteration.release_symmetric(rng, grams)


# --------------------------------------------------------------------------- Bingham sampling


def _acg_b(eigenvalues: np.ndarray) -> float:
    """Root b ∈ [1, m] of Σ 1/(b + 2a_i) = 1 (Kent et al. 2018: the tightest ACG envelope).

    Newton's method from b = 1 (where the sum is ≥ 1, as min a_i = 0) increases
    monotonically to the root because the sum is convex and decreasing in b. Any
    b ∈ (0, m] gives an exact sampler; the root only maximises the acceptance rate.
    """
    m = eigenvalues.size
    b = 1.0
    for _ in range(50):
        terms = 1.0 / (b + 2.0 * eigenvalues)
        excess = float(terms.sum()) - 1.0
        if excess <= 1e-10:
            break
        b += excess / float((terms * terms).sum())
    return min(b, float(m))


def sample_bingham(matrix: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One exact draw z on the unit sphere of R^m with density ∝ exp(zᵀ M z), M symmetric.

    Kent, Ganeiber & Mardia (2018), angular central Gaussian envelope: with
    ``A = λ_max I − M`` (eigenvalues ``a_i ≥ 0``), ``Ω = I + 2A/b``, draw
    ``y ~ N(0, Ω⁻¹)``, ``z = y/‖y‖``, accept with probability
    ``exp(−zᵀAz)(zᵀΩz)^{m/2} e^{(m−b)/2} (b/m)^{m/2}`` (≤ 1 for every b ∈ (0, m]).
    """
    values, vectors = np.linalg.eigh(matrix)
    a = values.max() - values  # eigenvalues of A, ≥ 0, in the eigenbasis of M
    m = a.size
    b = _acg_b(a)
    omega = 1.0 + 2.0 * a / b
    log_bound = 0.5 * (m - b) + 0.5 * m * math.log(b / m)
    for _ in range(MAX_BINGHAM_TRIES):
        y = rng.standard_normal(m) / np.sqrt(omega)
        z = y / np.linalg.norm(y)
        log_accept = -float(a @ z**2) + 0.5 * m * math.log(float(omega @ z**2)) + log_bound
        if math.log(rng.uniform()) < log_accept:
            return vectors @ z
    raise RuntimeError("Bingham rejection sampler did not accept: report this as a bug")


def _complement(basis: np.ndarray) -> np.ndarray:
    """Orthonormal basis (d × (d − c)) of the orthogonal complement of d×c orthonormal columns."""
    dim, cols = basis.shape
    if cols == 0:
        return np.eye(dim)
    full, _ = np.linalg.qr(basis, mode="complete")
    return full[:, cols:]


def matrix_bingham_step(
    basis: np.ndarray, scatter: np.ndarray, concentration: float, rng: np.random.Generator
) -> np.ndarray:
    """One Gibbs sweep over the columns of U ~ p(U) ∝ etr(κ UᵀAU) on the Stiefel manifold.

    Hoff (2009), §2.1: column j given the others is ``N z`` with ``N`` an orthonormal
    basis of their complement and ``z`` vector-Bingham with matrix ``κ NᵀAN``.
    """
    basis = basis.copy()
    for j in range(basis.shape[1]):
        others = np.delete(basis, j, axis=1)
        null = _complement(others)
        z = sample_bingham(concentration * (null.T @ scatter @ null), rng)
        basis[:, j] = null @ z
    return basis


# --------------------------------------------------------------------------- the Gibbs chain


def squared_distances(rows: np.ndarray, bases: np.ndarray) -> np.ndarray:
    """n×K squared distances d²(x_i, S_ℓ) = ‖x‖² − ‖U_ℓᵀx‖² (bases K×d×q, orthonormal)."""
    sq_norms = np.einsum("ij,ij->i", rows, rows)
    projected = np.einsum("id,kdq->ikq", rows, bases)
    return np.maximum(sq_norms[:, None] - np.einsum("ikq,ikq->ik", projected, projected), 0.0)


def sample_assignments(
    sq_dists: np.ndarray, concentration: float, rng: np.random.Generator
) -> np.ndarray:
    """z_i ~ P(z_i = ℓ) ∝ exp(−κ d²(x_i, S_ℓ)), independently for each row."""
    logits = -concentration * sq_dists
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    cumulative = np.cumsum(probs, axis=1)
    draws = rng.uniform(size=(sq_dists.shape[0], 1)) * cumulative[:, -1:]
    return np.minimum((draws > cumulative).sum(axis=1), sq_dists.shape[1] - 1)


def random_bases(rng: np.random.Generator, clusters: int, dim: int, rank: int) -> np.ndarray:
    """K Haar-uniform orthonormal d×q bases (K×d×q): QR of Gaussian matrices, sign-fixed."""
    out = np.empty((clusters, dim, rank))
    for c in range(clusters):
        q, r = np.linalg.qr(rng.standard_normal((dim, rank)))
        out[c] = q * np.where(np.diag(r) < 0, -1.0, 1.0)
    return out


@dataclass(frozen=True)
class GibbsChain(mechanism.Mechanism):
    """Step ``exponential_mechanism``: ``sweeps`` sweeps of the chain targeting the
    exponential mechanism at ``epsilon`` (:func:`gibbs_subspace_clustering`). Its cost is
    that target's, ε-DP, which only an exact sample meets: a finite chain has no proven
    guarantee, so a run reports none (:data:`GIBBS_GUARANTEE`) and no budget."""

    epsilon: float
    sweeps: int

    def cost(self) -> Budget:
        return ApproxDP(self.epsilon, 0.0)


def gibbs_subspace_clustering(
    rows: np.ndarray,
    clusters: int,
    rank: int,
    epsilon: float,
    sweeps: int,
    rng: np.random.Generator,
    temperature_factor: float = 0.5,
) -> np.ndarray:
    """K×d×q bases from a Gibbs chain for the exponential mechanism (WWS15, §9 c; see module doc).

    ``rows`` must have norms ≤ 1. The chain starts from Haar-random subspaces drawn
    with ``rng`` (data-independent) and runs ``sweeps`` sweeps of: assignments given
    subspaces, then one Hoff sweep per subspace given its rows. ``temperature_factor``
    is the ½ of ``exp(−(ε/2)·d²)``; tests pass other values to plant an under-noised
    variant, nothing else should.
    """
    if rows.size and float(np.max(np.einsum("ij,ij->i", rows, rows))) > 1.0 + 1e-9:
        raise ValueError("rows must have norm ≤ 1 (scale or clip them first)")
    if sweeps < 1:
        raise ValueError(f"sweeps must be ≥ 1, got {sweeps}")
    concentration = temperature_factor * epsilon
    bases = random_bases(rng, clusters, rows.shape[1], rank)
    for _ in range(sweeps):
        labels = sample_assignments(squared_distances(rows, bases), concentration, rng)
        for c in range(clusters):
            members = rows[labels == c]
            bases[c] = matrix_bingham_step(bases[c], members.T @ members, concentration, rng)
    return bases
