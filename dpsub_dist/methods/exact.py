"""``--method exact``: SS21 Algorithm 1 (GAP-MAX) for small inputs (ALGORITHMS.md §5); the
whole budget goes to its one release (:data:`dpsub_dist.methods.exact.BUDGET_SHARES`).

Exact case (SS21 Alg. 1; ALGORITHMS.md §6): GAP-MAX over spans of data points, small inputs only.

The mechanism (:mod:`dpsub_dist.privacy.gap_max`) scores every span of ``k`` data
points, so it enumerates C(n, k) subsets: inputs above :data:`MAX_ROWS` rows or
:data:`MAX_CANDIDATES` subsets are refused before any row is read (``n`` is public
under replace-one neighbours; at user level it is not, so the method is row-level only).

Where it runs: one Dask task on a worker loads the partitions through the Dataset's
loader and scores the spans (no randomness); only the two best scores, the best span's
d×k fit and its conditioning come back. The driver draws all the noise (TLap on the gap, the
snap's offsets) from the private generator, so no private seed enters the task graph,
and it never receives rows.

Exactly low-rank data at scale: use the approximate-case pipeline with a tiny cell,
``dpsub estimate --method histogram --cell-side 1e-3 --no-center`` (sample and aggregate, §1,
with the shifted-grid histogram, §2). Every subset of exactly rank-k rows yields the
same ``y_j = vec(Π R)`` up to rounding, so the histogram's largest cell holds all
subsets but those hit by outliers; ℓ outliers spoil at most ℓ subsets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsub_dist.context import EstimateResult, RunContext
from dpsub_dist.errors import InputError
from dpsub_dist.methods.steps import Step
from dpsub_dist.privacy.gap_max import (
    SNAP_DELTA_SHARE,
    GapMaxRelease,
    SpanScores,
    conditioning_floor,
    gap_max_mechanism,
    gap_max_release,
    projector_shift,
    score_spans,
)

if TYPE_CHECKING:
    from dpsub_dist.engine.sources import Dataset
    from dpsub_dist.params import EstimateConfig
from dpsub_dist.methods.tables import SCALE_ROUTE

MAX_ROWS = 200
"""Largest n the exact method accepts (all rows are scored in one task)."""

MAX_CANDIDATES = 200_000
"""Largest number C(n, k) of k-subsets the exact method enumerates (seconds to a minute)."""

BUDGET_SHARES = {Step.GAP_MAX: (1.0, 1.0)}
"""The whole budget goes to the one GAP-MAX release."""

FAILURE_REASONS = {
    "gap": "no span of the data beats every other candidate by the noisy margin "
    "(or the best one's rows determine it too loosely)",
    "null": "no span of the data holds clearly more points than the NULL score",
}


def check_size(n_rows: int, rank: int) -> int:
    """Number of k-subsets to score; InputError above the stated limits."""
    if n_rows < rank:
        raise InputError(
            f"--method exact needs at least rank = {rank} rows (got {n_rows}): add rows"
        )
    candidates = math.comb(n_rows, rank)
    if n_rows > MAX_ROWS or candidates > MAX_CANDIDATES:
        raise InputError(
            f"--method exact enumerates C(n, k) = C({n_rows}, {rank}) = {candidates} subsets, "
            f"above its limit (n ≤ {MAX_ROWS} rows and C(n, k) ≤ {MAX_CANDIDATES}): for exactly "
            f"low-rank data at this size use {SCALE_ROUTE}"
        )
    return candidates


def score_on_worker(
    parts: list[Any],
    loader: Callable[[Any], tuple[np.ndarray, Any]],
    rank: int,
    tolerance: float,
) -> SpanScores:
    """One task: load every partition here and score the spans (no noise, no seed).

    Only the two best scores travel back, padded with zeros (the scores of subspaces no
    data span reaches): the release needs no others.
    """
    blocks = [loader(part)[0] for part in parts]
    rows = np.concatenate(blocks) if blocks else np.empty((0, 0))
    spans = score_spans(rows, rank, tolerance)
    best = np.zeros(2, dtype=np.int64)
    best[: min(2, spans.scores.size)] = spans.scores[:2]
    return dataclasses.replace(spans, scores=best)


def run_exact(
    config: EstimateConfig,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None,
    progress: bool,
    noise_seed: int | None,
) -> EstimateResult:
    """``--method exact``: SS21 Algorithm 1 as a single worker task, whole budget to GAP-MAX."""
    import dask

    ctx = RunContext.open(config, open_dataset, client, progress, noise_seed)
    ctx.plan(BUDGET_SHARES)
    outliers = config.outliers or 0
    tolerance = config.tolerance
    dataset = ctx.dataset
    candidates = check_size(dataset.n_rows, config.rank)
    steps = gap_max_mechanism(
        ctx.grant(Step.GAP_MAX), tolerance, dataset.n_rows, dataset.dim, outliers
    )
    task = dask.delayed(score_on_worker, pure=False)(
        dataset.parts, dataset.loader, config.rank, tolerance
    )
    with ctx.timed("gap_max_s"):
        spans: SpanScores = ctx.executor.gather([task], "GAP-MAX scores")[0]
        release: GapMaxRelease = ctx.release(Step.GAP_MAX, steps, partial(gap_max_release, spans))

    parameters = {
        "outliers": outliers,
        "tolerance": tolerance,
        "membership": "x in s iff ||x - P_s x|| <= tolerance * ||x||",
        "release": "projector of the span snapped to a grid with private offsets (SS21 Alg. 1 "
        "step 6 here): neighbours publish the same basis except with probability delta_snap",
        "snap_side": release.snap_side,
        "conditioning_floor": conditioning_floor(tolerance, dataset.n_rows),
        "projector_shift_bound": projector_shift(tolerance, dataset.n_rows),
        "delta_split": {"gap": 1 - SNAP_DELTA_SHARE, "snap": SNAP_DELTA_SHARE},
        "candidate_subsets": candidates,
        "limits": {"max_rows": MAX_ROWS, "max_candidates": MAX_CANDIDATES},
        "partitions": len(dataset.parts),
    }
    details: dict[str, Any] = {
        "mechanism": "GAP-MAX with truncated Laplace and a snapped release (SS21 Alg. 1)",
        "noisy_gap": release.noisy_gap,  # h + ξ: the gap, capped by 2(λ − c₀) (gap_max step 4)
        "threshold": release.threshold,
        "null_score": release.null_score,
        "noise_scale": release.noise_scale,
        "reason": release.reason,
    }
    if release.basis is None:
        details["failed_step"] = Step.GAP_MAX
        details["failure_reason"] = FAILURE_REASONS[release.reason]
    # At most two scores and a d×k fit; stated from public shapes, as the presence of a fit
    # (is any k-subset independent?) depends on the data and is not released.
    gathered = 2 * 8 + dataset.dim * config.rank * 8
    return ctx.result(release.basis, parameters, details, gathered)


def budget_shares(config: Any) -> dict[str, tuple[float, float]]:
    """The plan: the whole budget to the one GAP-MAX release."""
    return BUDGET_SHARES
