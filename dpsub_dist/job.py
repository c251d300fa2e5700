"""One estimation run: validate → plan the budget → read on the workers → aggregate on the driver.

Every check that can fail on parameters runs before any data is read, and the
whole budget plan is checked before the first footer is opened.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from dpsub_dist import __version__
from dpsub_dist.engine.in_place import compute_subset_summaries_in_place
from dpsub_dist.engine.sources import Dataset
from dpsub_dist.engine.subsets import (
    SubsetPlan,
    compute_subset_summaries,
    compute_subset_summaries_from_grams,
)
from dpsub_dist.errors import InputError
from dpsub_dist.estimators import boost, exact, power
from dpsub_dist.estimators import covariance as cov
from dpsub_dist.estimators import sample_aggregate as sa
from dpsub_dist.privacy.accountant import Accountant, Budget, parse_budget
from dpsub_dist.privacy.noise import new_noise_seed, noise_rng

SHUFFLE_BUCKET_BYTES = 256 * 2**20
GRAM_ROUTE_BYTES = 64 * 2**20
"""Below this size of t per-subset d×d Gram matrices, subsets are summarised from Grams
(no shuffle, worker memory flat in n); above it rows are shuffled to their subsets."""


@dataclass
class EstimateConfig:
    """Parameters of ``dpsub estimate`` / :class:`dpsub_dist.PrivateSubspace`."""

    rank: int
    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None
    method: str = "friendly"
    subsets: int | None = None
    ref_points: int | None = None
    assign: Literal["random", "contiguous"] = "random"
    unit_column: str | None = None
    columns: list[str] | None = None
    seed: int | None = None
    scale: float | None = None  # friendly radius or histogram cell side, public
    row_norm: float | None = None  # gauss/gap-perturb: public row norm bound B
    center: bool = False  # gauss/gap-perturb: centre with a private mean
    outliers: int | None = None  # exact: ℓ, outliers the NULL score tolerates (default 0)
    tolerance: float | None = None  # exact: relative membership tolerance
    boost: int | None = None  # B disjoint groups (SS21 Alg. 3)
    boost_alpha: float | None = None  # boosting: estimates agree within 2α
    iterations: int | None = None  # power: T, public
    oversample: int | None = None  # power: k' − k, public
    storage_options: dict[str, Any] = field(default_factory=dict)

    def budget(self) -> Budget:
        """The run's total budget, validated."""
        try:
            return parse_budget(self.epsilon, self.delta, self.rho)
        except ValueError as err:
            raise InputError(str(err)) from None

    def validate(self) -> None:
        """Parameter checks that need no data."""
        if not isinstance(self.rank, int | np.integer) or self.rank < 1:
            raise InputError(f"rank must be a positive integer (got {self.rank}): pass --rank K")
        if self.method not in METHODS:
            raise InputError(f"unknown method {self.method!r}: use one of {sorted(METHODS)}")
        if self.assign not in ("random", "contiguous"):
            raise InputError(f"unknown assignment {self.assign!r}: use random or contiguous")
        if self.unit_column and self.assign == "contiguous":
            raise InputError(
                "--assign contiguous is row-level only: drop it with --unit-column "
                "(users are assigned by a keyed hash of their id)"
            )
        if self.subsets is not None and not 2 <= self.subsets <= sa.MAX_SUBSETS:
            raise InputError(
                f"subsets must be between 2 and {sa.MAX_SUBSETS} (got {self.subsets}): "
                "the driver holds a t×t matrix; pass a --subsets in that range"
            )
        if self.ref_points is not None and self.ref_points < self.rank:
            raise InputError(
                f"ref-points must be ≥ rank ({self.rank}), got {self.ref_points}: "
                "raise --ref-points"
            )
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            raise InputError(
                f"radius/cell side must be a positive number (got {self.scale}): pass a "
                "positive --radius/--cell-side, or omit it to have it chosen privately"
            )
        cov.check_options(self)
        power.check_options(self)
        exact.check_options(self)
        boost.check_options(self)
        self.budget()


@dataclass
class EstimateResult:
    """What a run produced: the basis (None for ⊥), the manifest describing it (published)
    and the wall-clock timings of its steps (operator-only: they depend on the data)."""

    basis: np.ndarray | None
    manifest: dict[str, Any]
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        return self.manifest["outcome"]


def privacy_unit(config: EstimateConfig) -> dict[str, str]:
    """The privacy unit and neighbour relation every constant was calibrated for."""
    if config.unit_column:
        return {
            "unit": f"user (all rows with the same {config.unit_column})",
            "neighbours": "add or remove all rows of one user",
            "assignment": "keyed hash of (public seed, user id) mod t",
        }
    how = {
        "random": "keyed hash of (public seed, global row position) mod t",
        "contiguous": "consecutive blocks of rows in file order",
    }
    return {
        "unit": "row",
        "neighbours": "replace one row's values (n is public)",
        "assignment": how[config.assign],
    }


def plan_budget(config: EstimateConfig) -> tuple[Accountant, dict[str, Budget]]:
    """Split the budget between the steps and check the plan is affordable."""
    accountant = Accountant(config.budget())
    grants = accountant.split(sa.budget_plan(config.method, config.scale is not None))
    if not accountant.can_afford(grants):
        raise InputError("the budget plan exceeds the budget: this is a bug, please report it")
    return accountant, grants


def choose_buckets(n_rows: int, dim: int, subsets: int, client: Any | None) -> int:
    """Enough shuffle buckets that each holds ≲256 MiB and every worker has work."""
    workers = len(client.scheduler_info()["workers"]) if client is not None else 1
    by_size = math.ceil(n_rows * dim * 8 / SHUFFLE_BUCKET_BYTES)
    return int(min(subsets, max(2 * workers, by_size, 1)))


LOCAL_ROUTES = {
    "subsets in place": compute_subset_summaries_in_place,
    "per-subset Gram matrices": compute_subset_summaries_from_grams,
    "row shuffle": compute_subset_summaries,
}
"""How the local steps reach their subsets' rows (all give the same summaries)."""


def local_route(plan: SubsetPlan, dim: int) -> str:
    """Contiguous subsets are summarised where they lie (no shuffle, any d); hashed
    subsets use per-subset Grams while t·d² floats are small, else a row shuffle."""
    if plan.assign == "contiguous" and not plan.user_level:
        return "subsets in place"
    if plan.subsets * dim * dim * 8 <= GRAM_ROUTE_BYTES:
        return "per-subset Gram matrices"
    return "row shuffle"


def run_estimate(
    config: EstimateConfig,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None = None,
    progress: bool = False,
    noise_seed: int | None = None,
) -> EstimateResult:
    """Run ``config.method`` end to end; ``open_dataset(client)`` returns the Dataset.

    ``noise_seed`` is a *private* seed from a run record (ledger) for reproducible
    resumption; without it DP noise comes from OS entropy.
    """
    config.validate()
    progress = progress_shown(config, progress)
    if config.boost is not None:
        return boost.run_boosted(config, open_dataset, client, progress, noise_seed)
    return METHODS[config.method](config, open_dataset, client, progress, noise_seed)


def progress_shown(config: EstimateConfig, progress: bool) -> bool:
    """Whether to draw the progress bar: at row level only. It counts tasks (one or more per
    partition, and partitions follow the footers' row counts) and seconds (proportional to
    n), and a scheduler forwards stderr: at user level both would publish a function of the
    private row count."""
    return progress and config.unit_column is None


def open_checked(config: EstimateConfig, open_dataset, client) -> Dataset:
    """Open the dataset (footers only) and check the rank against its width."""
    dataset: Dataset = open_dataset(client)
    if config.rank >= dataset.dim:
        raise InputError(
            f"rank {config.rank} must be smaller than the number of features ({dataset.dim}): "
            "lower --rank or add columns"
        )
    return dataset


def public_seed(config: EstimateConfig) -> int:
    """The user's public seed, or a fresh one that the manifest will record."""
    return config.seed if config.seed is not None else new_noise_seed() % 2**63


def build_manifest(
    config: EstimateConfig,
    dataset: Dataset,
    accountant: Accountant,
    ok: bool,
    parameters: dict[str, Any],
    release: dict[str, Any],
    gathered_bytes: int,
) -> dict[str, Any]:
    """The manifest every method writes: input, parameters, privacy, outcome, versions.

    Wall-clock timings are never published (they depend on the data: on n at user level,
    on the data's rank and spread everywhere); they stay in :attr:`EstimateResult.timings`.
    At user level the row count is private, so nothing computed from it is published: not
    n, nor ``partitions`` (from the footers' row counts) or ``shuffle_buckets`` (from n·d);
    ``withheld`` names them.
    """
    user_level = config.unit_column is not None
    if user_level:
        parameters = {k: v for k, v in parameters.items() if k not in USER_LEVEL_WITHHELD}
    manifest = {
        "outcome": "ok" if ok else "no_stable_subspace",
        "input": dataset.input,
        "files": dataset.files,
        "columns": dataset.columns,
        "vector_columns": dataset.vector_columns,
        "n_rows": None if user_level else dataset.n_rows,
        "n_rows_note": "not released: row counts are private at user level"
        if user_level
        else "counted from the Parquet footers; public under replace-one neighbours",
        "dim": dataset.dim,
        "rank": config.rank,
        "method": config.method,
        "parameters": {"unit_column": config.unit_column, **parameters},
        "release": release,
        "privacy": {**privacy_unit(config), "budget": accountant.report()},
        "summary_bytes_gathered": gathered_bytes,
        "versions": versions(),
    }
    if user_level:
        manifest["withheld"] = {
            "fields": ["n_rows", *USER_LEVEL_WITHHELD],
            "reason": "functions of the row count, which is private at user level",
        }
    return manifest


USER_LEVEL_WITHHELD = ("partitions", "shuffle_buckets")
"""Parameters that follow the row count (footers, n·d): left out of user-level manifests."""


def run_sample_aggregate(
    config: EstimateConfig,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None,
    progress: bool,
    noise_seed: int | None,
) -> EstimateResult:
    """Sample and aggregate (ALGORITHMS.md §1–§4) with the friendly or histogram aggregator."""
    started = time.monotonic()
    timings: dict[str, float] = {}
    accountant, grants = plan_budget(config)
    dataset = open_checked(config, open_dataset, client)
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
    seed = public_seed(config)
    sa.check_scale(config.method, config.scale, sa.reference_points(seed, dim, q))
    plan = SubsetPlan(
        subsets=t,
        n_rows=n,
        seed=seed,
        assign=config.assign,
        user_level=user_level,
        buckets=choose_buckets(n, dim, t, client),
    )
    step = sa.ProjectedReferenceStep(rank=k, dim=dim, ref_points=q, seed=seed)
    mark = time.monotonic()
    route = local_route(plan, dim)
    summaries = LOCAL_ROUTES[route](
        dataset.parts, dataset.offsets, dataset.loader, plan, step, client, progress
    )
    timings["local_steps_s"] = time.monotonic() - mark

    mark = time.monotonic()
    rng = noise_rng(noise_seed)
    agg = sa.aggregate(
        summaries, config.method, accountant, grants, rng, seed, dim, q, config.scale
    )
    if agg.point is not None and sa.is_null_release(
        agg.point, sa.reference_points(seed, dim, q), k
    ):
        reason = {"failed_step": "null_check", "failure_reason": sa.NULL_RELEASE_REASON}
        agg = sa.Aggregate(None, {**agg.details, **reason})
    elif sa.is_spread_release(agg):
        reason = {"failed_step": "core_spread", "failure_reason": sa.CORE_SPREAD_REASON}
        agg = sa.Aggregate(None, {**agg.details, **reason})
    basis = None if agg.point is None else sa.basis_from_aggregate(agg.point, dim, q, k)
    timings["aggregate_s"] = time.monotonic() - mark
    timings["total_s"] = time.monotonic() - started
    parameters = {
        "subsets": t,
        "ref_points": q,
        "assign": "unit-hash" if config.unit_column else config.assign,
        "public_seed": seed,
        "scale_given": config.scale,
        "budget_shares": sa.budget_plan(config.method, config.scale is not None),
        "local_route": route,
        "shuffle_buckets": plan.buckets if route == "row shuffle" else None,
        "partitions": len(dataset.parts),
    }
    manifest = build_manifest(
        config,
        dataset,
        accountant,
        basis is not None,
        parameters,
        agg.details,
        int(summaries.nbytes),
    )
    return EstimateResult(basis, manifest, timings)


Runner = Callable[
    [EstimateConfig, Callable[[Any], Dataset], Any, bool, "int | None"], EstimateResult
]
METHODS: dict[str, Runner] = {
    "friendly": run_sample_aggregate,
    "histogram": run_sample_aggregate,
    "gauss": cov.run_gauss,
    "gap-perturb": cov.run_gap_perturb,
    "exact": exact.run_exact,
    "power": power.run_power,
}
"""Estimation methods by name; other estimator families register their runner here."""


def versions() -> dict[str, str]:
    """Versions of this package and the libraries that shape its results."""
    import dask
    import pyarrow
    import scipy

    return {
        "dpsub_dist": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "dask": dask.__version__,
        "pyarrow": pyarrow.__version__,
    }
