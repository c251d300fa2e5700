"""Which quantile should the private row-norm bound of gauss/gap-perturb target?

``python -m bench.norm_quantile [--rows N] [--reps R]`` prints, for ``--method gauss``
(ε = 1, δ = 1e-6, row level), the median subspace error over R noise draws of

- hand-picked public bounds B at the 0.5 … 0.999 quantiles and the maximum of the row norms
  (what an oracle that knows the data could pass as ``--row-norm``), and
- the private bound (:mod:`dpsub_dist.privacy.norm_bound`) targeting quantile q, with its
  NORM_SHARE of the budget (the Gram noise gets the rest), as a run without ``--row-norm`` does,

on :func:`heavy_tailed_rows` (known answer) and on scikit-learn's digits table (1797 × 64, the
largest table a package in the environment ships offline; its answer is the exact top-k of
AᵀA). Everything runs in-process on NumPy (the estimator's own functions, no cluster).
"""

from __future__ import annotations

import argparse

import numpy as np

from dpsub_dist.engine.gram import GramSummary, clip_rows, gram_of
from dpsub_dist.estimators.covariance import budget_plan, release_basis
from dpsub_dist.linalg import subspace_error, top_eigenvectors
from dpsub_dist.privacy.accountant import Accountant, ApproxDP
from dpsub_dist.privacy.norm_bound import norm_counts, private_norm_bound

DELTA = 1e-6
HAND_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999, 1.0)
PRIVATE_QUANTILES = (0.9, 0.95, 0.99, 0.999)


def heavy_tailed_rows(n: int, dim: int = 13, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose clipping bias is direction-dependent, and their true top-2 basis.

    Independent coordinates in a random rotation: the first has 0.8·Student-t(2.5) values
    (variance 3.2, heavy tail: a few rows carry much of its variance), the second N(0, 2), the
    third N(0, 1.7) (close behind), the rest N(0, 0.3²). The truth is span(first two). Clipping at a
    low bound removes the first coordinate's tail, so its share of the clipped second moment
    falls behind the third's: bias. A high bound pays noise ∝ B².
    """
    rng = np.random.default_rng(seed)
    scales = np.full(dim, 0.3)
    scales[1:3] = np.sqrt([2.0, 1.7])
    coords = rng.standard_normal((n, dim)) * scales
    coords[:, 0] = 0.8 * rng.standard_t(2.5, n)
    rotation = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
    return coords @ rotation.T, rotation[:, :2]


def _digits() -> tuple[np.ndarray, np.ndarray] | None:
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    rows = load_digits().data.astype(np.float64)
    return rows, top_eigenvectors(gram_of(rows), 2)[1]


def _error(rows: np.ndarray, truth: np.ndarray, bound: float, rng, epsilon: float) -> float:
    """One gauss release at public bound ``bound`` with (ε, DELTA) for the Gram noise."""
    accountant = Accountant(ApproxDP(epsilon, DELTA))
    grants = accountant.split(budget_plan("gauss", False, False))
    summary = GramSummary(gram_of(clip_rows(rows, bound)))
    basis, _ = release_basis(
        summary, "gauss", truth.shape[1], len(rows), "replace", accountant, grants, rng, bound
    )
    return subspace_error(basis, truth)


def measure(
    rows: np.ndarray, truth: np.ndarray, reps: int, epsilon: float = 1.0, seed: int = 1
) -> list[tuple[str, float, float]]:
    """(label, median bound, median error) per hand-picked quantile and per private q."""
    rng = np.random.default_rng(seed)  # the bench's draws; runs use OS entropy
    norms = np.linalg.norm(rows, axis=1)
    counts = norm_counts(rows)
    shares = budget_plan("gauss", False, False, private_norm=True)
    norm_grant = ApproxDP(epsilon * shares["norm_bound"][0])
    out = []
    for q in HAND_QUANTILES:
        bound = float(np.quantile(norms, q))
        errors = [_error(rows, truth, bound, rng, epsilon) for _ in range(reps)]
        out.append((f"hand-picked B = quantile {q}", bound, float(np.median(errors))))
    for q in PRIVATE_QUANTILES:
        bounds, errors = [], []
        for _ in range(reps):
            bound = private_norm_bound(counts, len(rows), norm_grant, rng, quantile=q).bound
            bounds.append(bound)
            errors.append(_error(rows, truth, bound, rng, epsilon * shares["gram_noise"][0]))
        out.append((f"private, q = {q}", float(np.median(bounds)), float(np.median(errors))))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    tables = [
        (f"heavy-tailed synthetic, n = {args.rows}, D = 13, k = 2", 1.0, heavy_tailed_rows),
        ("sklearn digits, n = 1797, D = 64, k = 2 (uncentred)", 1.0, _digits),
        ("sklearn digits, n = 1797, D = 64, k = 2 (uncentred)", 10.0, _digits),
    ]
    for title, epsilon, load in tables:
        data = load(args.rows) if load is heavy_tailed_rows else load()
        if data is None:
            print(f"{title}: not available (scikit-learn missing)")
            continue
        print(f"\n{title}; gauss, ε = {epsilon}, δ = {DELTA}, median of {args.reps} draws")
        print("| bound | B (median) | error (median) |\n|---|---|---|")
        for label, bound, error in measure(*data, args.reps, epsilon):
            print(f"| {label} | {bound:.3g} | {error:.3f} |")


if __name__ == "__main__":
    main()
