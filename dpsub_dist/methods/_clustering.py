"""Private subspace clustering (WWS15; ALGORITHMS.md §9): K subspaces of dimension q.

Three methods behind one runner, :func:`run_cluster` (``dpsub cluster``):

- ``sample-aggregate`` (default, §9 a): on the workers, each subset clusters its rows
  with non-private k-plane iterations (:func:`k_plane_clustering`) and emits its K
  subspaces' projected reference points ``vec(Π_ℓ R)`` in a canonical order
  (:func:`canonical_order`), concatenated into one point of ``R^{K·d·Q}``. The driver
  aggregates the ``t`` points with the project's private aggregator (friendly core or
  histogram, :func:`sample_aggregate.aggregate`) and splits the result into K bases.
  Changing one unit changes exactly one subset's point, so the method is exactly as
  private as the aggregator (ALGORITHMS.md §1); the local step is deterministic given
  the rows, the public seed and the subset id.
- ``sulq`` (§9 b): k-plane iterations from public random subspaces. Each iteration
  assigns rows to the nearest current subspace and sums each cluster's Gram matrix on
  the workers (only d×d matrices travel), then releases them with the Gaussian
  mechanism (:func:`privacy.subspace_clustering.release_cluster_grams`); T iterations are T
  charges to the accountant. From random subspaces, plain k-plane ends in a local
  optimum in most runs (two true clusters shared by two planes), so the first half of
  the iterations use ``OVERCLUSTER·K`` planes (the sensitivity does not grow with the
  number of planes: a row still leaves one Gram and joins one), and the released
  Grams are then merged to K by Ward's rule (:func:`merge_grams`, post-processing).
- ``gibbs`` (§9 c): the exponential-mechanism Gibbs sampler
  (:func:`privacy.subspace_clustering.gibbs_subspace_clustering`) for small inputs only
  (:data:`GIBBS_MAX_ROWS`): the workers load and bound the rows, the driver (operator
  side) gathers them and runs the chain inside the release of its one step (the private
  generator is used there only), so no private seed enters the task graph. **Not
  differentially private**: only an exact sample of the mechanism is ε-DP, a finite chain
  has no proven guarantee. Its manifest reports no budget spent or planned and says
  ``"guarantee": "none (…)"``, and job files under the ledger refuse it.

Rows for ``sulq`` and ``gibbs`` must have norm ≤ 1 (:func:`unit_bounded`): by default
each row is scaled to unit length, which keeps its direction, so a row lies on a linear
subspace iff its scaled copy does, and gives every row the largest weight that the
sensitivity allows; ``row_norm=B`` clips rows to norm ``B`` and divides by ``B``
instead. Both methods are row-level only (replace one row, ``n`` public).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
from scipy.optimize import linear_sum_assignment

from dpsub_dist.context import (
    EstimateResult,
    RunContext,
    progress_shown,
    public_seed,
)
from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.gram import clip_rows, gram_of, sum_per_worker
from dpsub_dist.engine.progress import progress_bar
from dpsub_dist.engine.sources import Dataset
from dpsub_dist.engine.subsets import compute_subset_summaries
from dpsub_dist.errors import InputError
from dpsub_dist.linalg import subspace_error, top_eigenvectors
from dpsub_dist.methods import _centring as centring
from dpsub_dist.methods import _sample_aggregate as sa
from dpsub_dist.methods._norm_pass import NORM_SOURCE, compute_norm_counts
from dpsub_dist.methods.gauss import norm_bound_first
from dpsub_dist.methods.steps import Step
from dpsub_dist.privacy.accountant import Budget, laplace_epsilon
from dpsub_dist.privacy.mechanism import Gaussian
from dpsub_dist.privacy.norm_bound import (
    TooFewForBound,
    margined_quantile,
    noise_matched_quantile,
)
from dpsub_dist.privacy.subspace_clustering import (
    GIBBS_GUARANTEE,
    GRAM_SENSITIVITY,
    GibbsChain,
    gibbs_subspace_clustering,
    iteration_mechanism,
    random_bases,
    release_cluster_grams,
    squared_distances,
)

MethodOutcome = tuple[np.ndarray | None, dict[str, Any], dict[str, Any], int]
"""What a clustering method's half returns: the K×d×q bases (None: ⊥), its parameters, its
release and the bytes it gathered on the driver."""

GIBBS_MAX_ROWS = 100_000
"""The Gibbs sampler holds all rows in one worker task and sweeps them many times."""
GIBBS_MAX_DIM = 100
"""Each sweep eigen-decomposes K·q matrices of size up to d×d."""

LOCAL_RESTARTS = 2
"""Seedings per subset in the local k-plane step; the lowest-cost result is kept."""
LOCAL_ITERATIONS = 30
"""Most k-plane iterations per seeding (they stop when the assignment is stable)."""
MAX_SEED_CANDIDATES = 400
"""Cap on the candidate subspaces (spans of q random rows) drawn per seeding."""
OVERCLUSTER = 4
"""SuLQ runs its first half of iterations with 4K planes, then merges them to K."""
ROWS_PER_CLUSTER = 200
"""Default rows per cluster in one subset: enough for subsets to agree on the order."""

_RESTART_TAG = 0xC1A5
_INIT_TAG = 0x1217


# --------------------------------------------------------------------------- rows


def unit_bounded(rows: np.ndarray, row_norm: float | None) -> np.ndarray:
    """Rows with norm ≤ 1: scaled to unit length (``row_norm=None``) or clipped to B, then /B."""
    if row_norm is not None:
        return clip_rows(rows, row_norm)
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    return rows * np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)[:, None]


# --------------------------------------------------------------------------- local k-plane


def _fit_bases(rows: np.ndarray, labels: np.ndarray, clusters: int, rank: int):
    """Top-q eigenvectors of each cluster's Gram matrix, or None if a cluster has < q rows."""
    bases = []
    for c in range(clusters):
        members = rows[labels == c]
        if members.shape[0] < rank:
            return None
        bases.append(top_eigenvectors(members.T @ members, rank)[1])
    return np.stack(bases)


def _seed_bases(rows: np.ndarray, clusters: int, rank: int, rng: np.random.Generator):
    """Initial subspaces: spans of q random rows, chosen for many close rows (RANSAC-like).

    Each candidate is scored by the residual quantile at half a cluster's share of the
    rows not yet explained: a span of rows from one cluster has many rows near it, a
    span mixing clusters has few. The best candidate is kept and the rows within 4×
    its score are marked explained. (Measured while developing, d = 20, K = 3, q = 2:
    greedy selection on the k-plane cost left 10–40% of subsets of 120–666 rows in a
    mixed local optimum; this rule, with two seedings, none of 200.)
    """
    n = rows.shape[0]
    count = min(MAX_SEED_CANDIDATES, max(12 * clusters, 3 * clusters**rank))
    picks = np.stack([rng.choice(n, rank, replace=False) for _ in range(count)])
    candidates = np.stack([np.linalg.qr(rows[p].T)[0] for p in picks])
    residuals = squared_distances(rows, candidates)
    chosen: list[int] = []
    explained = np.zeros(n, dtype=bool)
    for k in range(clusters):
        pool = residuals[~explained]
        if pool.shape[0] <= rank:
            pool = residuals
        jth = min(pool.shape[0] - 1, max(rank, pool.shape[0] // (2 * (clusters - k))))
        scores = np.partition(pool, jth, axis=0)[jth]
        scores[chosen] = np.inf
        best = int(np.argmin(scores))
        chosen.append(best)
        explained |= residuals[:, best] <= max(4 * scores[best], 1e-12)
    return candidates[chosen]


def k_plane_clustering(
    rows: np.ndarray,
    clusters: int,
    rank: int,
    rng: np.random.Generator,
    restarts: int = LOCAL_RESTARTS,
    iterations: int = LOCAL_ITERATIONS,
) -> np.ndarray | None:
    """Non-private K-subspace clustering (k-plane, Bradley & Mangasarian 2000).

    Rows are clustered by direction (scaled to unit length, so a few huge rows cannot
    capture a cluster); the final bases are refitted on the rows at their own scale,
    clipped to 3× the median norm, which lowers the local error where the noise is
    isotropic. Returns K×d×q orthonormal bases of the lowest-cost seeding, or None if
    the rows cannot fill K rank-q clusters. ``rng`` must be public (seed + subset id).
    """
    units = unit_bounded(rows, None)
    nonzero = np.einsum("ij,ij->i", units, units) > 0
    rows, units = rows[nonzero], units[nonzero]
    if units.shape[0] < clusters * rank or np.linalg.matrix_rank(units) < rank:
        return None
    best_cost, best = math.inf, None
    for _ in range(restarts):
        bases = _seed_bases(units, clusters, rank, rng)
        labels = None
        for _ in range(iterations):
            new_labels = np.argmin(squared_distances(units, bases), axis=1)
            if labels is not None and np.array_equal(new_labels, labels):
                break
            labels = new_labels
            refit = _fit_bases(units, labels, clusters, rank)
            if refit is None:
                break
            bases = refit
        cost = float(squared_distances(units, bases).min(axis=1).sum())
        if cost < best_cost:
            best_cost, best = cost, bases
    labels = np.argmin(squared_distances(units, best), axis=1)
    clipped = clip_rows(rows, 3 * float(np.median(np.linalg.norm(rows, axis=1))))
    refit = _fit_bases(clipped, labels, clusters, rank)
    return best if refit is None else refit


def canonical_order(bases: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """Order of the K subspaces by ‖Π_ℓ p‖² for one fixed public vector p (ascending).

    The order must be a function of the *set* of subspaces, so that subsets that found
    the same subspaces under different labels emit the same point. Sorting by one
    public key is such a function; subsets disagree only when two clusters' keys are
    within their local estimation error of each other (measured in the tests: with
    ~200 rows per cluster nearly all subsets agree; choosing the probe per subset by
    the largest key gap was worse, as that choice itself flips between subsets).
    """
    keys = np.einsum("kdq,d->kq", bases, probe)
    return np.argsort(np.einsum("kq,kq->k", keys, keys), kind="stable")


@dataclass(frozen=True)
class KPlaneStep:
    """Local step of §9 a: y_j = [vec(Π_ℓ R)]_ℓ in canonical order, or the null point."""

    clusters: int
    rank: int
    dim: int
    ref_points: int
    seed: int
    restarts: int = LOCAL_RESTARTS

    def __call__(self, rows: np.ndarray, subset: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, _RESTART_TAG, subset])
        bases = k_plane_clustering(rows, self.clusters, self.rank, rng, self.restarts)
        if bases is None:
            return np.zeros(self.clusters * self.dim * self.ref_points)
        reference = sa.reference_points(self.seed, self.dim, self.ref_points)
        bases = bases[canonical_order(bases, reference[:, 0])]
        coordinates = np.einsum("kdq,dr->kqr", bases, reference)
        return np.einsum("kdq,kqr->kdr", bases, coordinates).ravel()


# --------------------------------------------------------------------------- SuLQ reduction


def cluster_grams(rows: np.ndarray, bases: np.ndarray) -> np.ndarray:
    """K×d×d Gram matrices of the rows nearest to each subspace (ties: lowest index)."""
    labels = np.argmin(squared_distances(rows, bases), axis=1)
    return np.stack([gram_of(rows[labels == c]) for c in range(bases.shape[0])])


@dataclass(frozen=True)
class PartitionGrams:
    """Worker task: load one partition, bound its rows, sum each cluster's Gram matrix."""

    loader: Any
    row_norm: float | None

    def __call__(self, part: Any, bases: np.ndarray) -> np.ndarray:
        rows, _ = self.loader(part)
        return cluster_grams(unit_bounded(rows, self.row_norm), bases)


def sum_over_partitions(task: PartitionGrams, parts: list, bases: np.ndarray, executor: Executor):
    """Σ over partitions of ``task(part, bases)``, summed on the workers into one accumulator
    per worker thread (K × d × d each: a Gram's size)."""
    return sum_per_worker(task, parts, executor, "cluster Grams", bases)


# --------------------------------------------------------------------------- Gibbs rows


def bounded_rows(loader: Any, part: Any, row_norm: float | None) -> np.ndarray:
    """Worker task: one partition's rows with norm ≤ 1 (no randomness, no seed)."""
    return unit_bounded(loader(part)[0], row_norm)


def gather_bounded_rows(dataset: Dataset, row_norm: float | None, executor: Executor) -> np.ndarray:
    """All rows, bounded on the workers and gathered on the driver (small inputs only)."""
    load = dask.delayed(bounded_rows, pure=False)
    tasks = [load(dataset.loader, part, row_norm) for part in dataset.parts]
    return np.concatenate(executor.gather(tasks, "gibbs rows"))


# --------------------------------------------------------------------------- evaluation


def matched_subspace_errors(bases_hat: np.ndarray, bases_true: np.ndarray) -> np.ndarray:
    """Per true cluster, ‖Π̂ − Π‖ after matching clusters (Hungarian, least total error)."""
    if bases_hat.shape != bases_true.shape or bases_hat.ndim != 3:
        raise ValueError(f"need two K×d×q stacks, got {bases_hat.shape} and {bases_true.shape}")
    k = bases_true.shape[0]
    cost = np.array(
        [[subspace_error(bases_hat[i], bases_true[j]) for j in range(k)] for i in range(k)]
    )
    rows, cols = linear_sum_assignment(cost)
    errors = np.empty(k)
    errors[cols] = cost[rows, cols]
    return errors


# --------------------------------------------------------------------------- runners


def budget_shares(config: Any) -> dict[str, tuple[float, float]]:
    """How the run's budget is split between the method's private steps."""
    if config.method == "sample-aggregate":
        return sa.aggregator_shares(config.aggregator, config.scale is not None)
    if config.method == "sulq":
        iterations = config.iterations
        if not config.private_norm:
            return {f"iteration_{i + 1}": (1.0, 1.0) for i in range(iterations)}
        return norm_bound_first(
            {f"iteration_{i + 1}": (1 / iterations, 1.0) for i in range(iterations)}
        )
    return {"exponential_mechanism": (1.0, 0.0)}  # gibbs: sets the temperature, never reported


def run_clustering(
    config: Any,
    run_method: Callable[[RunContext], MethodOutcome],
    shares: dict[str, tuple[float, float]],
    open_dataset: Callable[[Any], Dataset],
    client: Any | None = None,
    progress: bool = False,
    noise_seed: int | None = None,
) -> EstimateResult:
    """The driver every clustering method shares: open the dataset, declare ``shares`` (the
    method's plan), run ``run_method`` (the method's own half) on the run's context, write
    the manifest; the basis is K×d×q (None: ⊥). ``config`` is already validated."""
    progress = progress_shown(config, progress)
    ctx = RunContext.open(config, open_dataset, client, progress, noise_seed)
    k, q, d = config.clusters, config.rank, ctx.dataset.dim
    if k * q >= d:
        raise InputError(
            f"clusters × rank = {k}×{q} = {k * q} must be smaller than the number of "
            f"columns ({d}): lower --clusters or --rank"
        )
    ctx.plan(shares)
    bases, parameters, release, gathered = run_method(ctx)
    result = ctx.result(bases, {"clusters": config.clusters, **parameters}, release, gathered)
    manifest = result.manifest
    if config.method == "gibbs":  # not DP: no budget may be reported as spent, nor planned
        manifest["privacy"]["guarantee"] = GIBBS_GUARANTEE
        manifest["privacy"]["budget"] = None
        del manifest["parameters"]["budget_shares"]
    manifest["clusters"] = config.clusters
    manifest["basis_layout"] = "basis.npy is K×d×q: basis[c] is cluster c's orthonormal basis"
    return result


def default_subsets(config: Any, grants: dict[str, Budget], n: int | None) -> int:
    """Default t: about ROWS_PER_CLUSTER rows per cluster per subset, at least the minimum;
    the minimum when the row count is private (``n=None``, user level), as t must not
    depend on it."""
    minimum = sa.minimum_subsets(config.aggregator, grants)
    if n is None:
        return minimum
    rows_per_subset = config.clusters * max(ROWS_PER_CLUSTER, 10 * config.rank)
    return max(minimum, min(n // rows_per_subset, sa.DEFAULT_MAX_SUBSETS))


def projection_residual(block: np.ndarray, reference: np.ndarray, rank: int) -> float:
    """‖ŷ_c − vec(Û_cÛ_cᵀR)‖ / ‖vec(Û_cÛ_cᵀR)‖: how far a released block is from the rank-q
    projection of R it is read as. About noise/signal when the subsets agreed (≲ 0.15 at
    n = 10⁵ in the bench); about 0.5 or more when the core averaged subsets that disagreed
    (e.g. on the order of two clusters), and then the bases are unreliable."""
    dim, ref_points = reference.shape
    basis = sa.basis_from_aggregate(block, dim, ref_points, rank)
    projection = (basis @ (basis.T @ reference)).ravel()
    return float(np.linalg.norm(block - projection) / np.linalg.norm(projection))


def split_release(
    point: np.ndarray, reference: np.ndarray, clusters: int, rank: int
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """K bases from the aggregate (post-processing) and each block's projection residual;
    ⊥ (None) when a block is the null point of failed subsets, as for ``estimate``."""
    dim, ref_points = reference.shape
    blocks = point.reshape(clusters, dim * ref_points)
    found: dict[str, Any] = {
        "projection_residual": [projection_residual(b, reference, rank) for b in blocks]
    }
    if any(sa.is_null_release(block, reference, rank) for block in blocks):
        reason = {"failed_step": "null_check", "failure_reason": sa.NULL_RELEASE_REASON}
        return None, {**found, **reason}
    return np.stack([sa.basis_from_aggregate(b, dim, ref_points, rank) for b in blocks]), found


def run_sample_aggregate(ctx: RunContext) -> MethodOutcome:
    """§9 a: local k-plane on each subset, the projected reference points aggregated."""
    config, dataset = ctx.config, ctx.dataset
    dim, k, q, n = dataset.dim, config.clusters, config.rank, dataset.n_rows
    user_level = config.unit_column is not None  # the row count is then private
    t = config.subsets or default_subsets(config, ctx.grants, None if user_level else n)
    ref = config.ref_points or sa.default_ref_points(q, t, k * dim)
    if not user_level and n < t * k * q:  # at user level n is private: see job.py
        raise InputError(
            f"too few rows: {n} rows cannot fill {t} subsets of at least {k * q} rows: use "
            f"more data, fewer --subsets (≥ {sa.minimum_subsets(config.aggregator, ctx.grants)} "
            "at this budget), or a larger budget"
        )
    seed = public_seed(config)
    plan = ctx.subset_plan(t)
    step = KPlaneStep(clusters=k, rank=q, dim=dim, ref_points=ref, seed=seed)
    with ctx.timed("local_steps_s"):
        summaries = compute_subset_summaries(
            dataset.parts, dataset.offsets, dataset.loader, plan, step, ctx.executor, ctx.progress
        )
    with ctx.timed("aggregate_s"):
        # The aggregator uses (seed, dim, ref_points) only to draw the public reference that
        # bounds the points' spread for its scale search; our points stack K blocks of d×Q.
        agg = sa.aggregate(ctx, summaries, config.aggregator, seed, k * dim, ref, config.scale)
        bases, release = None, dict(agg.details)
        if agg.point is not None:
            bases, found = split_release(agg.point, sa.reference_points(seed, dim, ref), k, q)
            release.update(found)
    parameters = {
        "aggregator": config.aggregator,
        "subsets": t,
        "ref_points": ref,
        "assign": "unit-hash" if config.unit_column else config.assign,
        "public_seed": seed,
        "scale_given": config.scale,
        "local_step": f"k-plane, {LOCAL_RESTARTS} seedings, ≤ {LOCAL_ITERATIONS} iterations",
        "canonical_order": "ascending ‖Π_ℓ r₁‖², r₁ the first public reference point",
        "shuffle_buckets": plan.buckets,
        "partitions": len(dataset.parts),
    }
    return bases, parameters, release, int(summaries.nbytes)


def residual_energy(gram: np.ndarray, rank: int) -> float:
    """Energy of a (noisy) Gram matrix outside its best rank-q subspace (trace − top q)."""
    values = np.linalg.eigvalsh(gram)
    return float(values[:-rank].sum())


def merge_grams(grams: np.ndarray, clusters: int, rank: int) -> np.ndarray:
    """Merge M ≥ K Gram matrices into K, pairing at each step the two whose union adds the
    least residual energy (Ward's rule for subspaces). Post-processing of released Grams."""
    groups = list(grams)
    energy = [residual_energy(g, rank) for g in groups]
    while len(groups) > clusters:
        best, pair = math.inf, (0, 1)
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                cost = residual_energy(groups[i] + groups[j], rank) - energy[i] - energy[j]
                if cost < best:
                    best, pair = cost, (i, j)
        i, j = pair
        groups[i] = groups[i] + groups.pop(j)
        energy.pop(j)
        energy[i] = residual_energy(groups[i], rank)
    return np.stack(groups)


def run_sulq(ctx: RunContext) -> MethodOutcome:
    """§9 b: k-plane iterations from public random subspaces, each iteration's cluster Grams
    released through ``ctx`` (its step ``iteration_i``), after a private row-norm bound
    (step ``norm_bound``) where the plan declares one."""
    config, dataset = ctx.config, ctx.dataset
    if dataset.n_rows < 1:  # row level only: n is public (footers), so this is bad input
        raise InputError(f"{dataset.input} has no rows: pass a dataset with at least one row")
    dim, k, q = dataset.dim, config.clusters, config.rank
    seed = public_seed(config)
    planes = OVERCLUSTER * k
    bases = random_bases(np.random.default_rng([seed, _INIT_TAG]), planes, dim, q)
    steps = [step for step in ctx.grants if step != Step.NORM_BOUND]
    iterations = [iteration_mechanism(ctx.grant(step)) for step in steps]
    row_norm, norm_source = config.row_norm, "public (--row-norm)"
    if Step.NORM_BOUND in ctx.grants:
        with ctx.timed("norm_bound_s"):
            row_norm, quantile = sulq_norm_bound(ctx, iterations[0])
        norm_source = NORM_SOURCE.format(q=quantile, step=Step.NORM_BOUND)
    task = PartitionGrams(dataset.loader, row_norm)
    gathered = 0
    mark = time.monotonic()
    with ctx.timed("iterations_s"):
        for number, (step, iteration) in enumerate(zip(steps, iterations, strict=True), 1):
            grams = sum_over_partitions(task, dataset.parts, bases, ctx.executor)
            gathered += int(grams.nbytes)
            noisy = ctx.release(
                step, iteration, lambda m, rng, g=grams: release_cluster_grams(g, m, rng)
            )
            if noisy.shape[0] > k and (number >= len(steps) // 2 or number == len(steps)):
                noisy = merge_grams(noisy, k, q)
            bases = np.stack([top_eigenvectors(g, q)[1] for g in noisy])
            if ctx.progress:
                progress_bar(number, len(steps), mark, f"sulq: {len(steps)} noisy iterations")
    parameters = {
        "iterations": len(steps),
        "row_norm": row_norm,
        "row_scaling": "unit length" if row_norm is None else "clip to row_norm, then /row_norm",
        **({} if row_norm is None else {"row_norm_source": norm_source}),
        "gram_sensitivity": GRAM_SENSITIVITY,
        "public_seed": seed,
        "partitions": len(dataset.parts),
    }
    release = {
        "noise_sigma_per_iteration": [iteration.sigma for iteration in iterations],
        "noisy_cluster_mass": [float(np.trace(g)) for g in noisy],
    }
    return bases, parameters, release, gathered


SULQ_FIX = "drop --private-norm, pass --row-norm B, a larger ε"
"""Where n is too few for ``--private-norm``'s bound: unit-length rows (the default), a public
bound, or more budget."""


def sulq_norm_bound(ctx: RunContext, iteration: Gaussian) -> tuple[float, float]:
    """The private bound of privacy/norm_bound.py before the iterations (``--private-norm``).

    Same mechanism and cost as gauss's (sparse vector over the public grid's cumulative counts,
    Δ = 1 at row level, ε_norm-DP, no δ); its quantile follows the noise of one iteration's
    Gram release (``iteration``: σ at Δ = 2), from public n, D and grants, with the low-side
    margin of :func:`~dpsub_dist.privacy.norm_bound.margined_quantile`: where n is too small
    for it, :class:`InputError` before any read or charge (SuLQ is row level: n is public).
    Returns the released B and that quantile. B then plays the part of a public --row-norm:
    each iteration's sensitivity is for rows of norm ≤ 1 after /B.
    """
    dataset = ctx.dataset
    epsilon = laplace_epsilon(ctx.grant(Step.NORM_BOUND))
    quantile = noise_matched_quantile(dataset.n_rows, dataset.dim, iteration.sigma, epsilon)
    try:
        quantile = margined_quantile(quantile, dataset.n_rows, epsilon, "rows", fix=SULQ_FIX)
    except TooFewForBound as err:
        raise InputError(str(err)) from None
    counts = compute_norm_counts(dataset.parts, dataset.loader, ctx.executor, ctx.progress)
    bound = centring.release_bound(ctx, Step.NORM_BOUND, counts, dataset.n_rows, quantile)
    return bound, quantile


def run_gibbs(ctx: RunContext) -> MethodOutcome:
    """§9 c: the Gibbs chain on the driver (operator side), inside the release of its step
    ``exponential_mechanism``: the chain's draws are that step's randomness, and the private
    seed never enters the task graph. Not DP (:data:`GIBBS_GUARANTEE`): the run reports no
    budget (:func:`run_clustering`)."""
    config, dataset = ctx.config, ctx.dataset
    n, dim = dataset.n_rows, dataset.dim
    if n > GIBBS_MAX_ROWS or dim > GIBBS_MAX_DIM:
        raise InputError(
            f"--method gibbs is for small data (≤ {GIBBS_MAX_ROWS} rows and ≤ {GIBBS_MAX_DIM} "
            f"columns), this input has {n} rows × {dim} columns: use --method sample-aggregate "
            "or sulq, or a sample of the rows"
        )
    chain = GibbsChain(laplace_epsilon(ctx.grant("exponential_mechanism")), config.sweeps)
    with ctx.timed("gather_s"):
        rows = gather_bounded_rows(dataset, config.row_norm, ctx.executor)
    with ctx.timed("sampler_s"):
        bases = ctx.release(
            "exponential_mechanism",
            chain,
            lambda c, rng: gibbs_subspace_clustering(
                rows, config.clusters, config.rank, c.epsilon, c.sweeps, rng
            ),
        )
    parameters = {
        "sweeps": chain.sweeps,
        "row_norm": config.row_norm,
        "row_scaling": "unit length"
        if config.row_norm is None
        else "clip to row_norm, then /row_norm",
        "temperature_epsilon": chain.epsilon,
        "temperature_note": "the chain targets the ε-DP exponential mechanism with this ε; "
        "a finite chain is not covered by it, so no budget is charged",
    }
    return bases, parameters, {}, int(rows.nbytes)


def check_sulq(config: Any) -> None:
    """One bound: a public --row-norm or a private one, not both."""
    if config.private_norm and config.row_norm is not None:
        raise InputError(
            "--private-norm chooses the row-norm bound privately: drop it or --row-norm"
        )
