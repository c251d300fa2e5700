"""Sample and aggregate (ALGORITHMS.md §1–§4): the options and the runner that ``friendly``
and ``histogram`` share (and ``dpsub cluster --method sample-aggregate`` reuses the options).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.routes import LOCAL_ROUTES, local_route
from dpsub_dist.engine.sources import Dataset
from dpsub_dist.engine.subsets import SubsetPlan
from dpsub_dist.errors import InputError
from dpsub_dist.estimators import centring
from dpsub_dist.estimators import sample_aggregate as sa
from dpsub_dist.context import (
    EstimateResult,
    RunContext,
    build_manifest,
    choose_buckets,
    open_checked,
    plan,
    public_seed,
)
from dpsub_dist.methods.spec import Param, positive
from dpsub_dist.privacy.noise import noise_rng

SUBSETS = Param(
    "subsets",
    int,
    "t, the number of disjoint subsets the rows are split into (default: from the budget "
    "and, at row level, n)",
    need=f"between 2 and {sa.MAX_SUBSETS}",
    fix="the driver holds a t×t matrix",
    valid=lambda t: 2 <= t <= sa.MAX_SUBSETS,
    example=50,
)
REF_POINTS = Param(
    "ref_points",
    int,
    "Q, number of public reference points (≥ rank)",
    need="a positive integer ≥ rank",
    valid=positive,
    example=8,
)
ASSIGN = Param(
    "assign",
    str,
    "rows to subsets: keyed hash of position (random, the default; any row order), or "
    "blocks of consecutive rows (contiguous: rows stored in random order; no shuffle)",
    default="random",
    choices=("random", "contiguous"),
    example="contiguous",
)
PLAN_PARAMS = (SUBSETS, REF_POINTS, ASSIGN)


def budget_plan(config: Any) -> dict[str, tuple[float, float]]:
    """The aggregator's steps (a public radius or cell side skips its private search)."""
    return sa.budget_plan(config.method, config.scale is not None)


def estimate_plan(config: Any) -> dict[str, tuple[float, float]]:
    """``dpsub estimate``'s plan: the aggregator's steps, scaled to make room for private
    centring and the explained variance (:func:`dpsub_dist.estimators.centring.plan_shares`)."""
    return centring.plan_shares(budget_plan(config), config)


def check_estimate(config: Any) -> None:
    """:func:`check_plan` and the centring options' cross-checks."""
    check_plan(config)
    centring.check_options(config)


def check_plan(config: Any, rank: int | None = None) -> None:
    """Cross-checks of the subset plan: contiguous blocks are row level; Q ≥ rank."""
    if config.unit_column and config.assign == "contiguous":
        raise InputError(
            "--assign contiguous is row-level only: drop it with --unit-column "
            "(users are assigned by a keyed hash of their id)"
        )
    rank = config.rank if rank is None else rank
    if config.ref_points is not None and config.ref_points < rank:
        raise InputError(
            f"ref-points must be ≥ rank ({rank}), got {config.ref_points}: raise --ref-points"
        )


def run_sample_aggregate(
    config: Any,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None,
    progress: bool,
    noise_seed: int | None,
) -> EstimateResult:
    """Sample and aggregate (ALGORITHMS.md §1–§4) with the friendly or histogram aggregator."""
    started = time.monotonic()
    executor = Executor(client)
    timings: dict[str, float] = {}
    accountant, grants = plan(config, estimate_plan(config))
    dataset = open_checked(config, open_dataset, executor)
    timings["inspect_s"] = time.monotonic() - started
    dim, k, n = dataset.dim, config.rank, dataset.n_rows
    user_level = config.unit_column is not None  # the row count is then private
    t = config.subsets or sa.default_subsets(
        config.method, grants, None if user_level else n, dim, k
    )
    q = config.ref_points or sa.default_ref_points(k, t, dim)
    # At row level n is public and too few rows is bad input. At user level n is private:
    # no check; subsets with fewer than k rows give the null point, and the aggregator
    # releases ⊥ or a noisy point, never a data-dependent exit code.
    if not user_level and n < t * k:
        raise InputError(
            f"too few rows: {n} rows cannot fill {t} subsets of at least {k} rows: "
            f"use more data, fewer --subsets (≥ {sa.minimum_subsets(config.method, grants)} "
            "at this budget), or a larger budget"
        )
    centring.check_bounds(config, grants, n)  # the private mean's bound
    seed = public_seed(config)
    sa.check_scale(config.method, config.scale, sa.reference_points(seed, dim, q))
    subset_plan = SubsetPlan(
        subsets=t,
        n_rows=n,
        seed=seed,
        assign=config.assign,
        user_level=user_level,
        buckets=choose_buckets(n, dim, t, executor),
    )
    step = sa.ProjectedReferenceStep(rank=k, dim=dim, ref_points=q, seed=seed)
    rng = noise_rng(noise_seed)
    mark = time.monotonic()
    ctx = RunContext.adopt(config, dataset, executor, progress, accountant, grants, rng)
    loader, centred, mean_release = centring.centre(ctx)
    timings["centre_s"] = time.monotonic() - mark
    mark = time.monotonic()
    route = local_route(subset_plan, dim, k)
    summaries = LOCAL_ROUTES[route](
        dataset.parts, dataset.offsets, loader, subset_plan, step, executor, progress
    )
    timings["local_steps_s"] = time.monotonic() - mark

    mark = time.monotonic()
    agg = sa.aggregate(
        summaries, config.method, accountant, grants, rng, seed, dim, q, config.scale
    )
    reference = sa.reference_points(seed, dim, q)
    if agg.point is not None and sa.is_null_release(agg.point, reference, k):
        reason = {
            "failed_step": "null_check",
            "failure_reason": sa.null_release_reason(agg, reference, k),
        }
        agg = sa.Aggregate(None, {**agg.details, **reason})
    elif sa.is_spread_release(agg):
        reason = {"failed_step": "core_spread", "failure_reason": sa.CORE_SPREAD_REASON}
        agg = sa.Aggregate(None, {**agg.details, **reason})
    basis = None if agg.point is None else sa.basis_from_aggregate(agg.point, dim, q, k)
    timings["aggregate_s"] = time.monotonic() - mark
    mark = time.monotonic()
    basis, variance = centring.explain(ctx, basis, loader)
    timings["explained_variance_s"] = time.monotonic() - mark
    timings["total_s"] = time.monotonic() - started
    parameters = {
        "subsets": t,
        "ref_points": q,
        "assign": "unit-hash" if config.unit_column else config.assign,
        "public_seed": seed,
        "scale_given": config.scale,
        "budget_shares": estimate_plan(config),
        **centred,
        "local_route": route,
        "shuffle_buckets": subset_plan.buckets if route == "row shuffle" else None,
        "partitions": len(dataset.parts),
    }
    manifest = build_manifest(
        config,
        dataset,
        accountant,
        basis is not None,
        parameters,
        {**mean_release, **agg.details, **variance},
        int(summaries.nbytes),
    )
    return EstimateResult(basis, manifest, timings)
