"""Sample and aggregate (ALGORITHMS.md §1–§4): the options and the runner that ``friendly``
and ``histogram`` share (and ``dpsub cluster --method sample-aggregate`` reuses the options).

Sample and aggregate (SS21 §5, T24 §4; ALGORITHMS.md §1): local step and private aggregation.

Local half (runs on the workers, once per subset): the subset's top-k right singular
vectors ``V_j`` and ``y_j = vec(V_jᵀ (V_j R))`` for public Gaussian reference points R.
Aggregate half (runs on the driver): a private aggregator over the ``t`` points
``y_j`` (friendly-core average, §3, or shifted-grid histogram, §2), then the top-k
left singular vectors of the aggregate reshaped to d×q (post-processing).

Changing one unit changes exactly one ``y_j``, so the estimator is as private as
the aggregator is for "replace one of its t points".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from dpsub_dist.context import EstimateResult, RunContext, public_seed
from dpsub_dist.engine.routes import LOCAL_ROUTES, local_route
from dpsub_dist.engine.sources import Dataset
from dpsub_dist.errors import InputError
from dpsub_dist.linalg import (
    top_left_singular_vectors,
    top_right_singular_vectors,
    top_right_singular_vectors_from_gram,
)
from dpsub_dist.methods import _centring as centring
from dpsub_dist.methods._standardize import with_standardize
from dpsub_dist.methods.steps import Step
from dpsub_dist.privacy import friendly_core as friendly
from dpsub_dist.privacy import histogram_cells as histogram
from dpsub_dist.privacy.accountant import Budget, laplace_epsilon
from dpsub_dist.privacy.friendly_core import pairwise_sq_distances, radius_floor
from dpsub_dist.privacy.sparse_vector import geometric_grid

Aggregator = Literal["friendly", "histogram"]

_REFERENCE_TAG = 0x5EF
_SKETCH_TAG = 0x5CE
_OFFSET_TAG = 0x0FF

BUDGET_SHARES: dict[str, dict[str, tuple[float, float]]] = {
    # step: (share of epsilon or rho, share of delta)
    "friendly": {
        Step.RADIUS_SEARCH: (0.15, 0.0),
        Step.CORE_TEST: (0.25, 0.5),
        Step.CORE_NOISE: (0.6, 0.5),
    },
    "friendly_fixed_radius": {Step.CORE_TEST: (0.3, 0.5), Step.CORE_NOISE: (0.7, 0.5)},
    "histogram": {Step.CELL_SEARCH: (0.2, 0.0), Step.HISTOGRAM: (0.8, 1.0)},
    "histogram_fixed_side": {Step.HISTOGRAM: (1.0, 1.0)},
}
"""How each aggregator splits the run's budget; chosen from measured utility (README)."""

HISTOGRAM_SEARCH_FRACTION = 0.1
"""The cell-side search stops once the largest cell privately holds this fraction of t:
smaller sides mean less rounding error, and the histogram only needs ~2τ points per cell.
Measured at n = 200k, d = 50, k = 4 (README): 0.8 gave ⊥ in 3/3 runs, 0.1 errors 0.3–0.9."""

TRY = "try --method gauss, more rows, or a larger ε"
"""What helps whenever the subsets' estimates do not agree privately."""

CORE_SPREAD_REASON = (
    "the friend radius is as large as the subsets' projected points: the subsets disagree "
    f"on the subspace (too few rows per subset, or no clear gap after rank k); {TRY}"
)

FAILURE_REASONS = {
    Step.RADIUS_SEARCH: "the private radius search found no friend radius at which most subsets "
    f"agree: their estimates are spread out (too few rows per subset, or no clear gap after "
    f"rank k); {TRY}",
    Step.CORE_TEST: "the noisy core weight was below t/4: too few subsets agree within the chosen "
    f"radius; {TRY}",
    Step.CELL_SEARCH: "the private cell-side search found no cell holding a tenth of the subsets: "
    f"their estimates are spread out; {TRY} (friendly needs less agreement)",
    Step.HISTOGRAM: "no cell's noisy count cleared the stability threshold: too few subsets "
    f"fall in one cell; {TRY} (friendly needs less agreement)",
}
"""Why each aggregator step can return ⊥, and what to try (facts about released values)."""

GRID_SPAN = 1e7
"""Ratio of the largest to the smallest radius/side on the public search grid."""


@functools.lru_cache(maxsize=4)
def reference_points(seed: int, dim: int, ref_points: int) -> np.ndarray:
    """Public reference points R ∈ R^{d×q}, i.i.d. N(0, 1), from the public seed."""
    return np.random.default_rng([seed, _REFERENCE_TAG]).standard_normal((dim, ref_points))


@dataclass(frozen=True)
class ProjectedReferenceStep:
    """Local step (§1 step 2–3): y_j = vec(V_jᵀ(V_j R)), or the null point if rank < k."""

    rank: int
    dim: int
    ref_points: int
    seed: int

    def __call__(self, rows: np.ndarray, subset: int) -> np.ndarray:
        vt = None
        if rows.shape[0] >= self.rank:
            sketch_rng = np.random.default_rng([self.seed, _SKETCH_TAG, subset])
            vt = top_right_singular_vectors(rows, self.rank, sketch_rng)
        return self._project(vt)

    def from_gram(self, gram: np.ndarray, rows: int, subset: int) -> np.ndarray:
        """The same summary from the subset's Gram matrix XᵀX (exact eigh route)."""
        return self._project(top_right_singular_vectors_from_gram(gram, self.rank, rows))

    def _project(self, vt: np.ndarray | None) -> np.ndarray:
        if vt is None:
            return np.zeros(self.dim * self.ref_points)
        reference = reference_points(self.seed, self.dim, self.ref_points)
        return (vt.T @ (vt @ reference)).ravel()


def aggregator_shares(method: Aggregator, scale_given: bool) -> dict[str, tuple[float, float]]:
    """The budget shares of the chosen aggregator (a fixed radius/side skips the search)."""
    key = {"friendly": "friendly_fixed_radius", "histogram": "histogram_fixed_side"}[method]
    return BUDGET_SHARES[key if scale_given else method]


def minimum_subsets(method: Aggregator, grants: dict[str, Budget]) -> int:
    """Fewest subsets for which the aggregator can succeed on perfectly agreeing points."""
    if method == "friendly":
        grant = grants[Step.CORE_TEST]
        margin = 4 / laplace_epsilon(grant) * math.log(1 / (2 * friendly.ptr_delta(grant))) + 4
        return math.ceil(3 * margin)  # W ≈ t must clear t/4 + margin with room to spare
    grant = grants[Step.HISTOGRAM]
    threshold = 1 + 2 / laplace_epsilon(grant) * math.log(1 / histogram.stability_delta(grant))
    return max(50, math.ceil(2 * threshold))


DEFAULT_MAX_SUBSETS = 4000
"""The default t stops growing here: the driver holds a t×t distance matrix and more
subsets gained little in the README's sweep (t = 2000 → 4000: error 0.023 → 0.019)."""


ROBUST_SUBSETS_FACTOR = 2
"""Friendly's default t is at least this multiple of the minimum while subsets keep 5k rows:
at the minimum the noisy radius search often stops where the core test then fails (README:
n = 20,000, k = 2, ε = 1, t = 676 → 1352: ⊥ in 2 → 0 of 20 runs at D = 10, median error
0.28 → 0.18; D = 100: 0.34 → 0.17). Not at the price of reference points: at D = 10⁴,
t = 1352 forced q from 8 to 4 and the median error rose from 0.29 to 0.41 (n = 20,000,
bench.utility_dim, 3 seeds each)."""


def default_subsets(
    method: Aggregator, grants: dict[str, Budget], n: int | None, dim: int, rank: int
) -> int:
    """Default t: subsets of about max(10k, min(2d, 2000)) rows, within [minimum, 4000];
    for friendly at least twice the minimum when that leaves 5k rows per subset and does
    not cost reference points (q is lowered to keep t·q·d floats under the byte cap).

    ``n=None`` when the row count is private (user level: adding or removing a user
    changes it): t must then not depend on it, or neighbouring inputs would be split
    into different subsets; the default is the row-free part of the rule.
    """
    minimum = minimum_subsets(method, grants)
    rows_per_subset = max(10 * rank, min(2 * dim, 2000))
    wanted = minimum if n is None else n // rows_per_subset
    if method == "friendly":
        robust = ROBUST_SUBSETS_FACTOR * minimum
        if n is not None:
            robust = min(robust, n // (5 * rank))
        q = default_ref_points(rank, minimum, dim)
        if q > rank + 2:  # no more subsets than keep q reference points under the byte cap
            robust = min(robust, SUMMARY_BYTES_LIMIT // (8 * q * dim))
        wanted = max(wanted, robust)
    return max(minimum, min(wanted, DEFAULT_MAX_SUBSETS))


SUMMARY_BYTES_LIMIT = 512 * 2**20
"""Default q is lowered (not below k + 2) to keep the gathered t×qd summaries under this."""


def default_ref_points(rank: int, subsets: int, dim: int) -> int:
    """Default q = 4k reference points, capped by SUMMARY_BYTES_LIMIT (README: measured)."""
    affordable = SUMMARY_BYTES_LIMIT // (8 * subsets * dim)
    return int(max(rank + 2, min(4 * rank, affordable)))


@dataclass
class Aggregate:
    """Driver-side result: the private point (None for ⊥) and what was released on the way."""

    point: np.ndarray | None
    details: dict[str, Any] = field(default_factory=dict)


def aggregate(
    ctx: RunContext,
    summaries: np.ndarray,
    method: Aggregator,
    seed: int,
    dim: int,
    ref_points: int,
    scale: float | None = None,
) -> Aggregate:
    """Private aggregation of the t summaries on the driver (§2/§3, scale by §4 unless given):
    each step released through ``ctx`` with the mechanism its grant calibrates."""
    reference = reference_points(seed, dim, ref_points)
    if method == "friendly":
        return _aggregate_friendly(ctx, summaries, reference, scale)
    return _aggregate_histogram(ctx, summaries, reference, seed, scale)


def reference_norm(reference: np.ndarray) -> float:
    """‖R‖_F, the same bits on every CPU: it sets the public radius grid. (``np.linalg.norm``
    takes a BLAS dot product, whose last bit depends on the CPU's kernel: on SkylakeX the
    chosen friend radius, and so the noise scale, moved by one ulp from Haswell's.)"""
    return math.sqrt(math.fsum(np.square(reference).ravel().tolist()))


def _search_grid(reference: np.ndarray, floor: float = 0.0) -> np.ndarray:
    # Every y_j = vec(Π_j R) has norm ≤ ‖R‖_F, so pairwise distances are ≤ 2‖R‖_F.
    top = 2 * reference_norm(reference)
    return geometric_grid(max(top / GRID_SPAN, floor), top)


def friend_radius_floor(reference: np.ndarray) -> float:
    """Smallest friend radius resolved for the points y_j (norm ≤ ‖R‖_F; public, from R)."""
    return radius_floor(reference.size, reference_norm(reference) * (1 + 2.0**-20))


def check_scale(method: Aggregator, scale: float | None, reference: np.ndarray) -> None:
    """Refuse a given friend radius below the precision floor (public facts: exit 2, free)."""
    if method != "friendly" or scale is None:
        return
    floor = friend_radius_floor(reference)
    if scale < floor:
        raise InputError(
            f"--radius {scale:g} is below the precision floor {floor:.3g} of the friend test "
            f"at D·q = {reference.size} (float64 distances cannot resolve it): pass "
            f"--radius ≥ {floor:.3g}, or omit --radius to choose it privately"
        )


def _aggregate_friendly(
    ctx: RunContext, summaries: np.ndarray, reference: np.ndarray, radius: float | None
) -> Aggregate:
    sq_dists = pairwise_sq_distances(summaries)
    details: dict[str, Any] = {}
    if radius is None:
        grid = _search_grid(reference, friend_radius_floor(reference))
        radius = ctx.release(
            Step.RADIUS_SEARCH,
            friendly.radius_search_mechanism(ctx.grant(Step.RADIUS_SEARCH)),
            lambda search, rng: friendly.choose_radius(sq_dists, grid, search, rng),
        )
        details["radius_chosen_privately"] = True
        if radius is None:
            return Aggregate(None, {**details, **_failure(Step.RADIUS_SEARCH)})
    details["radius"] = radius
    test_grant, noise_grant = ctx.grant(Step.CORE_TEST), ctx.grant(Step.CORE_NOISE)
    delta = friendly.ptr_delta(test_grant)
    core = ctx.release(
        Step.CORE_TEST,
        friendly.core_test_mechanism(test_grant),
        lambda test, rng: friendly.core_test(sq_dists, radius, test, delta, rng),
    )
    details.update(noisy_core_weight=core.noisy_weight, core_weight_lower_bound=core.lower_bound)
    if not core.passed:  # the grant stays spent: at the smallest L that passes, t/4
        smallest_pass = summaries.shape[0] / 4
        ctx.forgo(
            Step.CORE_NOISE,
            friendly.core_noise_mechanism(noise_grant, test_grant, radius, smallest_pass),
        )
        return Aggregate(None, {**details, "noise_sigma": None, **_failure(Step.CORE_TEST)})
    gaussian = friendly.core_noise_mechanism(noise_grant, test_grant, radius, core.lower_bound)
    point = ctx.release(
        Step.CORE_NOISE, gaussian, lambda g, rng: friendly.core_average(summaries, core, g, rng)
    )
    return Aggregate(point, {**details, "noise_sigma": gaussian.sigma})


def _aggregate_histogram(
    ctx: RunContext, summaries: np.ndarray, reference: np.ndarray, seed: int, side: float | None
) -> Aggregate:
    offset = float(np.random.default_rng([seed, _OFFSET_TAG]).uniform())
    details: dict[str, Any] = {"grid_offset": offset}
    if side is None:
        grid = _search_grid(reference)
        side = ctx.release(
            Step.CELL_SEARCH,
            histogram.cell_search_mechanism(ctx.grant(Step.CELL_SEARCH)),
            lambda search, rng: histogram.choose_cell_side(
                summaries, offset, grid, search, rng, HISTOGRAM_SEARCH_FRACTION
            ),
        )
        details["cell_side_chosen_privately"] = True
        if side is None:
            return Aggregate(None, {**details, **_failure(Step.CELL_SEARCH)})
    details["cell_side"] = side
    grant = ctx.grant(Step.HISTOGRAM)
    delta = histogram.stability_delta(grant)
    release = ctx.release(
        Step.HISTOGRAM,
        histogram.histogram_mechanism(grant),
        lambda counts, rng: histogram.shifted_grid_histogram(
            summaries, side, offset, counts, delta, rng
        ),
    )
    details.update(noisy_count=release.noisy_count, count_threshold=release.threshold)
    if release.point is None:
        details.update(_failure(Step.HISTOGRAM))
    return Aggregate(release.point, details)


def _failure(step: str) -> dict[str, str]:
    return {"failed_step": step, "failure_reason": FAILURE_REASONS[step]}


NULL_RELEASE_REASON = (
    "the aggregate is closer to the null point than to the rank-k projection it encodes: most "
    "subsets either had fewer than rank independent directions (lower --rank, or use fewer "
    f"--subsets so each has more rows) or disagree ({TRY})"
)

NOISE_RELEASE_REASON = (
    "the released point is mostly the aggregator's Gaussian noise, which is as large as a real "
    f"projection would be: the agreeing core is too small for the budget; {TRY}"
)


def null_release_reason(agg: Aggregate, reference: np.ndarray, rank: int) -> str:
    """Why ŷ failed :func:`is_null_release`, from released and public values only: the noise's
    expected energy σ²·D·q against a real projection's, ‖ΠR‖² ≈ k·q for R's N(0, 1) entries.
    Noise that large explains ŷ; smaller noise means the core averaged to ≈ 0 itself."""
    sigma = agg.details.get("noise_sigma") or 0.0
    if sigma**2 * reference.size >= 0.25 * rank * reference.shape[1]:
        return NOISE_RELEASE_REASON
    return NULL_RELEASE_REASON


def is_null_release(point: np.ndarray, reference: np.ndarray, rank: int) -> bool:
    """Whether ŷ is nearer the null point (zeros) than the projection vec(Û Ûᵀ R) it encodes.

    Subsets without a rank-k basis emit zeros (§1 step 3); when most do, the aggregators
    agree on ≈ 0 and release noise whose "basis" is meaningless. A real release is
    ≈ vec(Π R). Post-processing of ŷ and the public R: it costs no privacy.
    """
    dim, ref_points = reference.shape
    basis = basis_from_aggregate(point, dim, ref_points, rank)
    projection = (basis @ (basis.T @ reference)).ravel()
    return float(np.linalg.norm(point)) < float(np.linalg.norm(point - projection))


def is_spread_release(agg: Aggregate) -> bool:
    """Whether a friendly release averaged subsets that disagree on the subspace.

    Post-processing of releases only (radius r, noisy mean ŷ, its σ): friends as far apart
    as the mean is long — r² ≥ ‖ŷ‖² − σ²·dim (unbiased for ‖μ‖²) less three of that
    estimate's standard deviations σ²·√(2·dim) — means the radius search had to take in
    points from different subspaces, and their average encodes no subspace.
    """
    if agg.point is None or "radius" not in agg.details or not agg.details.get("noise_sigma"):
        return False
    noise_sq, size = agg.details["noise_sigma"] ** 2, agg.point.size
    signal_sq = float(agg.point @ agg.point) - noise_sq * size
    return agg.details["radius"] ** 2 + 3 * noise_sq * np.sqrt(2 * size) >= signal_sq


def basis_from_aggregate(point: np.ndarray, dim: int, ref_points: int, rank: int) -> np.ndarray:
    """Finish (§1 step 5): top-k left singular vectors of P̂ = reshape(ŷ, d×q)."""
    return top_left_singular_vectors(point.reshape(dim, ref_points), rank)


def budget_plan(config: Any) -> dict[str, tuple[float, float]]:
    """The aggregator's steps (a public radius or cell side skips its private search)."""
    return aggregator_shares(config.method, config.scale is not None)


def estimate_plan(config: Any) -> dict[str, tuple[float, float]]:
    """``dpsub estimate``'s plan: the aggregator's steps, scaled to make room for private
    centring and the explained variance (:func:`dpsub_dist.methods._centring.plan_shares`), after
    the standardisation's steps with ``--standardize``."""
    return with_standardize(centring.plan_shares(budget_plan(config), config), config)


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
    ctx = RunContext.open(config, open_dataset, client, progress, noise_seed)
    grants = ctx.plan(estimate_plan(config))
    dataset = ctx.dataset
    dim, k, n = dataset.dim, config.rank, dataset.n_rows
    user_level = config.unit_column is not None  # the row count is then private
    t = config.subsets or default_subsets(config.method, grants, None if user_level else n, dim, k)
    q = config.ref_points or default_ref_points(k, t, dim)
    # At row level n is public and too few rows is bad input. At user level n is private:
    # no check; subsets with fewer than k rows give the null point, and the aggregator
    # releases ⊥ or a noisy point, never a data-dependent exit code.
    if not user_level and n < t * k:
        raise InputError(
            f"too few rows: {n} rows cannot fill {t} subsets of at least {k} rows: "
            f"use more data, fewer --subsets (≥ {minimum_subsets(config.method, grants)} "
            "at this budget), or a larger budget"
        )
    centring.check_bounds(config, grants, n)  # the private mean's bound
    seed = public_seed(config)
    check_scale(config.method, config.scale, reference_points(seed, dim, q))
    subset_plan = ctx.subset_plan(t)
    step = ProjectedReferenceStep(rank=k, dim=dim, ref_points=q, seed=seed)
    with ctx.timed("centre_s"):
        loader, centred, mean_release = centring.centre(ctx)
    with ctx.timed("local_steps_s"):
        route = local_route(subset_plan, dim, k)
        summaries = LOCAL_ROUTES[route](
            dataset.parts, dataset.offsets, loader, subset_plan, step, ctx.executor, progress
        )
    with ctx.timed("aggregate_s"):
        agg = aggregate(ctx, summaries, config.method, seed, dim, q, config.scale)
        reference = reference_points(seed, dim, q)
        if agg.point is not None and is_null_release(agg.point, reference, k):
            reason = {
                "failed_step": "null_check",
                "failure_reason": null_release_reason(agg, reference, k),
            }
            agg = Aggregate(None, {**agg.details, **reason})
        elif is_spread_release(agg):
            reason = {"failed_step": "core_spread", "failure_reason": CORE_SPREAD_REASON}
            agg = Aggregate(None, {**agg.details, **reason})
        basis = None if agg.point is None else basis_from_aggregate(agg.point, dim, q, k)
    with ctx.timed("explained_variance_s"):
        basis, variance = centring.explain(ctx, basis, loader)
    parameters = {
        "subsets": t,
        "ref_points": q,
        "assign": "unit-hash" if config.unit_column else config.assign,
        "public_seed": seed,
        "scale_given": config.scale,
        **centred,
        "local_route": route,
        "shuffle_buckets": subset_plan.buckets if route == "row shuffle" else None,
        "partitions": len(dataset.parts),
    }
    release = {**mean_release, **agg.details, **variance}
    return ctx.result(basis, parameters, release, int(summaries.nbytes))
