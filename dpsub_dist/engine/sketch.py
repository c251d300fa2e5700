"""Hashed subsets summarised from additive per-subset sketches: no shuffle, memory flat in n.

Where t per-subset d×d Gram matrices are too large to sum (the Gram route), each subset
runs a randomized range finder with subspace iteration (Halko, Martinsson & Tropp 2011,
Alg. 4.3/4.4, on XⱼᵀXⱼ) whose every step is a sum over rows, so it runs where the rows lie:

1. pass 1: each partition adds Yⱼ = Xⱼᵀ(XⱼΩ) for the rows hashed to subset j, Ω a d×m
   Gaussian test matrix drawn from the PUBLIC seed (m = k + :data:`OVERSAMPLE`); the
   t × d × m blocks are tree-summed on the workers;
2. a worker orthonormalises each Qⱼ = qr(Yⱼ); each further pass (:data:`PASSES` in all)
   re-reads the rows and sums Yⱼ = XⱼᵀXⱼQⱼ the same way, then orthonormalises again;
3. Rayleigh–Ritz on a worker: Bⱼ = QⱼᵀYⱼ (m×m, Qⱼ the basis the last pass multiplied) =
   Uⱼ Λⱼ Uⱼᵀ. The local step is handed the surrogate Sⱼ = Λⱼ^½ (QⱼUⱼ)ᵀ (min(nⱼ, m) rows,
   those of largest λ), whose Gram SⱼᵀSⱼ = QⱼBⱼQⱼᵀ is XⱼᵀXⱼ compressed to range(Qⱼ): its
   top-k right singular vectors are the Ritz vectors, so the step's summary is computed as
   from the subset's rows, with the subset's own row count deciding "fewer than k rows".

Accuracy: with a gap, the Ritz basis approaches the exact top-k basis of XⱼᵀXⱼ
geometrically, sin∠ ≲ C·(λₘ₊₁/λₖ)^(PASSES−1) (subspace iteration, HMT 2011 §4.5 and
Thm 9.2; C a modest constant that depends on Ω through Gaussian tail bounds: measured
C ≈ 1.3 for the summary's largest entry at d = 60, k = 3, 1000 rows a subset, each extra
pass multiplying the error by λₘ₊₁/λₖ ≈ 3.6·10⁻⁴). A subset with at most m rows, or of
rank ≤ m, is recovered exactly up to rounding (range(Qⱼ) holds its whole row space). The
summary yⱼ = vec(VⱼVⱼᵀR) moves by at most 2‖R‖·sin∠; tests/engine/test_sketch_route.py checks
the bound and the exact cases. PASSES ≥ 2: Rayleigh–Ritz needs an orthonormal Qⱼ.

Privacy: the row shuffle and Gram routes hand the local step subset j's rows; this route
hands it a function of them. By induction over the passes, subset j's sum Yⱼ depends only
on the rows hashed to j (the assignment is independent of row values) and on Qⱼ, which
depends only on subset j's previous sum; Ω, m, the pass count and the route are public
(the seed, t, d, k). So each subset's summary is a function of that subset's rows and
public values alone, which is all sample and aggregate needs (ALGORITHMS.md §1: changing
one row or user changes one subset's summary); the aggregator's noise and its cost are
unchanged. Rows are re-read from storage in every pass and never leave their worker;
only t summaries reach the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import dask
import numpy as np

from dpsub_dist.engine.compute import IN_PROCESS, Executor, gather_summaries, tree_sum
from dpsub_dist.engine.sources import Loader
from dpsub_dist.engine.subsets import (
    GRAM_SUMMARY_TASKS,
    ScaledGrams,
    SubsetPlan,
    add_grams,
    group_grams,
    no_grams,
    partition_groups,
)

OVERSAMPLE = 10
"""Columns of the test matrix beyond k (HMT's p): the ratio in the bound is λₘ₊₁/λₖ."""

PASSES = 3
"""Reads of the data: one sketch and two power steps (HMT's q = 2)."""

_TEST_MATRIX_TAG = 0x5CE7C4
"""Keeps the test matrix independent of every other draw from the public seed."""


def sketch_width(rank: int, dim: int) -> int:
    """m: columns of each subset's sketch (k + oversampling, at most d)."""
    return min(rank + OVERSAMPLE, dim)


def test_matrix(seed: int, dim: int, width: int) -> np.ndarray:
    """Ω ∈ R^{d×m}, i.i.d. N(0, 1), from the run's PUBLIC seed (no private randomness)."""
    return np.random.default_rng([seed, _TEST_MATRIX_TAG]).standard_normal((dim, width))


def orthonormal_bases(total: ScaledGrams) -> np.ndarray:
    """Qⱼ = qr(Yⱼ) for every subset (t×d×m): the basis the next pass multiplies."""
    return np.linalg.qr(total[0])[0]


def ritz_surrogate(basis: np.ndarray, product: np.ndarray, rows: int) -> np.ndarray:
    """Sⱼ = Λ^½(QU)ᵀ of the largest min(rows, m) Ritz pairs of B = QᵀY (module docstring)."""
    small = basis.T @ product
    values, vectors = np.linalg.eigh((small + small.T) / 2)
    keep = np.argsort(values)[::-1][: min(rows, len(values))]
    return (basis @ vectors[:, keep] * np.sqrt(np.maximum(values[keep], 0.0))).T


def sketch_summaries(
    local_step: Any, bases: np.ndarray, total: ScaledGrams, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray]:
    """The local step on each surrogate of subsets ``lo..hi-1`` (runs on a worker)."""
    products, counts, _ = total
    ids = np.arange(lo, hi)
    summaries = [
        local_step(ritz_surrogate(bases[j], products[j], int(counts[j])), int(j)) for j in ids
    ]
    return ids, np.stack(summaries)


def compute_subset_summaries_from_sketches(
    parts: Sequence[Any],
    offsets: Sequence[int],
    loader: Loader,
    plan: SubsetPlan,
    local_step: Any,
    executor: Executor = IN_PROCESS,
    progress: bool = False,
) -> np.ndarray:
    """Summaries of all subsets from per-subset range finders (module docstring): one
    graph of :data:`PASSES` reads, each a tree sum of t×d×m blocks on the workers."""
    dim = local_step.dim
    width = sketch_width(local_step.rank, dim)
    sketch = dask.delayed(group_grams, pure=True)
    groups = partition_groups(offsets, plan.n_rows, plan.subsets * dim * width, executor)
    add = dask.delayed(add_grams, pure=True)
    right = dask.delayed(test_matrix, pure=True)(plan.seed, dim, width)
    tasks: list = []
    total = None
    for _ in range(PASSES):
        if total is not None:
            right = dask.delayed(orthonormal_bases, pure=True)(total)
            tasks.append(right)
        leaves = [sketch(plan, loader, parts[g], offsets[g], right) for g in groups]
        if not leaves:  # no rows (at user level n is private): t empty subsets
            leaves = [dask.delayed(no_grams, pure=True)(plan.subsets, dim, width)]
        tasks += leaves
        total = tree_sum(leaves, add, tasks)
    summarise = dask.delayed(sketch_summaries, pure=True)
    cuts = np.linspace(0, plan.subsets, min(GRAM_SUMMARY_TASKS, plan.subsets) + 1).astype(int)
    outputs = [summarise(local_step, right, total, int(a), int(b)) for a, b in pairwise(cuts)]
    label = f"{len(parts)} partitions in {len(groups)} runs × {PASSES} passes → sketches"
    rows = None if plan.public_rows is None else PASSES * plan.public_rows
    return gather_summaries(executor, tasks, outputs, plan.subsets, label, progress, rows)
