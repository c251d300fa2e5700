"""``--method gauss``: Analyze Gauss, covariance perturbation (DTTZ14 Alg. 1; ALGORITHMS.md §7).
Budget plan: :func:`dpsub_dist.methods.gauss.plan_shares` (the options and the dataset's
footers pick the route; the run declares that plan).

Covariance perturbation (DTTZ14; ALGORITHMS.md §7): ``--method gauss`` and ``gap-perturb``.

Local half (:mod:`dpsub_dist.engine.gram`, on the workers): rows clipped to the norm bound ``B``
and scaled by 1/B, per-partition ``XᵀX`` tree-reduced to one d×d matrix. Aggregate half (driver,
:mod:`dpsub_dist.privacy.covariance_noise`): Analyze Gauss (Alg. 1) or subspace perturbation with a
noisy eigengap (Alg. 2), and the top-k eigenvectors (post-processing).

Centring (default at row level, :mod:`dpsub_dist.methods._centring`): the private mean (steps
``norm_bound`` and ``mean``) is released first and subtracted from every row on the workers;
the Gram then sums the centred rows, clipped to their own bound (``centred_norm_bound`` when
private). Subtracting ``n·μ̂μ̂ᵀ`` from the raw Gram instead would leave an error ``2n·μ·eᵀ``
that grows with the mean's size. Centring needs the public row count, so it is row level only.
On many partitions gauss takes the mean and the centred rows' bound over a public sample of
them and corrects the centre in its one full pass (:func:`centre_sample`, step
``centred_sum``; docs/scale.md).

Neighbours: replace one row (row level) or add/remove one user (``--unit-column``: each user's
rows are scaled together so their squared norms sum to ≤ 1).

Without ``--row-norm`` (row level only), ``B`` is chosen first under DP from a histogram of row
norms over a public grid (:mod:`dpsub_dist.privacy.norm_bound`), published, and then used
exactly like a public bound. The histogram and the Gram share one read where D allows
(:func:`bound_and_gram`): the same counts, the same release of ``B``, the same Gram at it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsub_dist.context import (
    EstimateResult,
    RunContext,
    plan,
    public_seed,
)
from dpsub_dist.engine.gram import GramSummary, compute_gram
from dpsub_dist.engine.row_cache import cache_rows, hold_parts
from dpsub_dist.errors import InputError
from dpsub_dist.linalg import top_eigenvectors
from dpsub_dist.methods import _centring as centring
from dpsub_dist.methods._centring import MEAN_SHARE
from dpsub_dist.methods._norm_pass import (
    NORM_SOURCE,
    USER_NORM_SOURCE,
    compute_level_grams,
    fuse_level_grams,
    gather_clipped_gram,
)
from dpsub_dist.methods._standardize import with_standardize
from dpsub_dist.methods.steps import Step
from dpsub_dist.privacy import covariance_noise as cov_steps
from dpsub_dist.privacy import mechanism, norm_bound
from dpsub_dist.privacy.accountant import Budget, gaussian_sigma, laplace_epsilon, planned_grants
from dpsub_dist.privacy.covariance_noise import (
    SENSITIVITY,
    GapRelease,
    MeanRelease,
    Neighbours,
    analyze_gauss,
    gaussian_mean,
)
from dpsub_dist.privacy.norm_bound import noise_matched_quantile
from dpsub_dist.privacy.variance import EXPLAINED_VARIANCE_NOTE, psd_total, released_variance

if TYPE_CHECKING:
    from dpsub_dist.engine.sources import Dataset
    from dpsub_dist.params import EstimateConfig
from dpsub_dist.methods._centring import CENTRING_PARAMS
from dpsub_dist.methods.spec import Method

COVARIANCE_METHODS = ("gauss", "gap-perturb")


NORM_SHARE = 0.1
"""Share of the budget spent on the private row-norm bound when no --row-norm is given."""

GAP_TEST_SHARE = 0.2
"""Share of gap-perturb's budget spent on the noisy eigengap (typically ≫ its margin)."""

ROW_SCALING = {
    "replace": "each row clipped to norm ≤ row_norm, then divided by row_norm",
    "add_remove": "each row clipped to norm ≤ row_norm, divided by row_norm; then each user's "
    "rows divided by √max(1, Σ their squared norms)",
}

NO_GAP_REASON = (
    "the noisy eigengap is too small for a stable top-k subspace: "
    "use more rows, a larger budget or a smaller --rank"
)


def neighbours(config: EstimateConfig) -> Neighbours:
    """The neighbour relation every constant is calibrated for (ALGORITHMS.md §0)."""
    return "add_remove" if config.unit_column else "replace"


def budget_plan(
    method: str,
    center: bool,
    zcdp: bool,
    private_norm: bool = False,
    norm_share: float = NORM_SHARE,
    sampled: bool = False,
    refined: bool = False,
) -> dict[str, tuple[float, float]]:
    """Each step's (share of ε or ρ, share of δ); zCDP Gaussians need no δ, the gap test does.

    ``private_norm`` (no ``--row-norm``): the pure-DP ``norm_bound`` step first, ``norm_share``
    (default NORM_SHARE) of ε or ρ and no δ, the other steps scaled by the rest. Centred, the
    share is split between ``norm_bound`` (raw rows, for the mean) and ``centred_norm_bound``
    (the rows the Gram sums). ``sampled`` (the sampled-centre route, :func:`centre_sample`):
    the mean's share is split, :data:`CORRECTION_SHARE` of it to ``centred_sum`` (drawn
    after ``centred_norm_bound``, from the full pass's sum). ``refined`` (a wide table's
    centre, :func:`refined_centre`; centred with a private bound): ``mean`` and
    ``refined_mean`` take :data:`~dpsub_dist.methods._centring.REFINED_MEAN_SHARE` each and
    the norm share is split in three, ``mean_norm_bound`` between the two means.
    """
    delta_share = 0.0 if zcdp else 1.0
    if method == "gauss":
        steps = {Step.GRAM_NOISE: (1.0, delta_share)}
    else:
        steps = {
            Step.GAP_TEST: (GAP_TEST_SHARE, 1.0 if zcdp else 0.5),
            Step.PROJECTOR_NOISE: (1.0 - GAP_TEST_SHARE, 0.0 if zcdp else 0.5),
        }
    refined = refined and center and private_norm
    means = (Step.MEAN, Step.REFINED_MEAN) if refined else (Step.MEAN,)
    if center:
        share = centring.REFINED_MEAN_SHARE if refined else MEAN_SHARE
        rest = 1.0 - share * len(means)
        steps = {name: (p * rest, q * rest) for name, (p, q) in steps.items()}
        steps = {name: (share, share * delta_share) for name in means} | steps
    if not private_norm:
        return steps
    if not center:
        return norm_bound_first(steps, norm_share)
    rest = 1.0 - norm_share
    scaled = {name: (p * rest, q) for name, (p, q) in steps.items()}
    if refined:  # the raw rows' bound, the coarse-centred rows', the centred rows'
        third = (norm_share / 3, 0.0)
        coarse, fine = scaled.pop(Step.MEAN), scaled.pop(Step.REFINED_MEAN)
        return {
            Step.NORM_BOUND: third,
            Step.MEAN: coarse,
            Step.MEAN_NORM_BOUND: third,
            Step.REFINED_MEAN: fine,
            Step.CENTRED_NORM_BOUND: third,
            **scaled,
        }
    half = (norm_share / 2, 0.0)  # the raw rows' bound (for the mean), the centred rows'
    mean = scaled.pop(Step.MEAN)
    if not sampled:
        return {Step.NORM_BOUND: half, Step.MEAN: mean, Step.CENTRED_NORM_BOUND: half, **scaled}
    sample = (mean[0] * (1 - CORRECTION_SHARE), mean[1] * (1 - CORRECTION_SHARE))
    correction = (mean[0] * CORRECTION_SHARE, mean[1] * CORRECTION_SHARE)
    return {
        Step.NORM_BOUND: half,
        Step.MEAN: sample,
        Step.CENTRED_NORM_BOUND: half,
        Step.CENTRED_SUM: correction,
        **scaled,
    }


def norm_bound_first(
    steps: dict[str, tuple[float, float]], norm_share: float = NORM_SHARE
) -> dict[str, tuple[float, float]]:
    """A plan with the pure-DP ``norm_bound`` step first (``norm_share`` of ε or ρ, no δ) and
    the other steps' privacy shares (summing to 1) scaled by the rest (every method with a
    private bound)."""
    rest = 1.0 - norm_share
    return {Step.NORM_BOUND: (norm_share, 0.0)} | {n: (p * rest, q) for n, (p, q) in steps.items()}


def plan_shares(config: EstimateConfig, dataset: Dataset | None) -> dict[str, tuple[float, float]]:
    """The method's declared plan: :func:`route_shares` of the route :func:`centre_sample`
    picks from public facts (the options and ``dataset``'s footers). The runner declares this
    very plan, so ``job.plan_budget`` and the run's manifest show the same steps. Without a
    dataset only a plan the footers cannot change is known (ValueError otherwise)."""
    sampled = centre_sample(config, dataset) is not None
    return route_shares(config, sampled, refined=not sampled and refined_centre(config, dataset))


def route_shares(
    config: EstimateConfig, sampled: bool, refined: bool = False
) -> dict[str, tuple[float, float]]:
    """:func:`budget_plan` for this run on a route (``sampled``: the sampled centre's;
    ``refined``: the wide table's centre); gap-perturb also pays for its explained variance
    (row level; gauss gets it free from its noisy matrix); the standardisation's steps first
    with ``--standardize``."""
    zcdp = config.rho is not None
    private = config.row_norm is None
    shares = budget_plan(
        config.method, config.center, zcdp, private, sampled=sampled, refined=refined
    )
    if config.method == "gap-perturb":
        shares = centring.plan_shares(shares, config, centre=False)
    return with_standardize(shares, config)


def refined_centre(config: EstimateConfig, dataset: Dataset | None) -> bool:
    """Whether the run's centre takes the refinement steps (the route's rule,
    :data:`~dpsub_dist.methods._centring.REFINE_RULE`; public facts only: the options, n, D
    and the grants): centred, private bound, row level, on a dataset that allows it
    (boosting's groups take it all or none), where :func:`centring.refines` says the table is
    wide. Not on the sampled centre's route (its own second step, ``centred_sum``)."""
    if not config.center or config.row_norm is not None or config.unit_column is not None:
        return False
    if dataset is None:
        raise ValueError("the centre's route depends on the dataset's n and D: pass the dataset")
    if not dataset.refined_centre:
        return False
    single = planned_grants(config.budget(), route_shares(config, sampled=False))
    refined = planned_grants(config.budget(), route_shares(config, sampled=False, refined=True))
    return centring.refines(single[Step.MEAN], refined, dataset.n_rows, dataset.dim)


def release_basis(
    ctx: RunContext, summary: GramSummary, row_norm: float = 1.0, shift: np.ndarray | None = None
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Driver half: Alg. 1 or Alg. 2 and the top-k eigenvectors. When centring, the rows were
    centred by the released mean before the Gram (:func:`run_covariance`); ``shift`` (gauss,
    sampled centre: a released value) is subtracted from the noisy Gram (post-processing)."""
    config, relation = ctx.config, neighbours(ctx.config)
    sens = SENSITIVITY[relation]
    details: dict[str, Any] = {"neighbours": relation}
    if config.method == "gauss":
        noisy = ctx.release(
            Step.GRAM_NOISE,
            mechanism.gaussian(ctx.grant(Step.GRAM_NOISE), sens.gram),
            lambda mech, rng: analyze_gauss(summary.gram, mech, rng),
        )
        details.update(gram_sensitivity=noisy.sensitivity, gram_noise_sigma=noisy.sigma)
        matrix = noisy.matrix if shift is None else noisy.matrix - shift
        values, basis = top_eigenvectors(matrix, config.rank)
        total = psd_total(matrix)
        details.update(released_variance(values, total, row_norm, ctx.dataset.n_rows, relation))
        return basis, details
    release = perturb_subspace(ctx, summary.gram, config.rank, relation)
    details.update(
        noisy_gap=release.noisy_gap,
        gap_lower_bound=release.gap_lower_bound,
        gap_noise=release.gap_noise,
        gap_noise_scale=release.gap_noise_scale,
        gap_sensitivity=sens.gap,
        projector_sensitivity=release.projector_sensitivity,
        projector_noise_sigma=release.sigma,
        explained_variance=None,
        explained_variance_ratio=None,
        explained_variance_note=EXPLAINED_VARIANCE_NOTE["gap-perturb"],
    )
    if release.basis is None:
        details.update(failed_step=Step.GAP_TEST, failure_reason=NO_GAP_REASON)
    return release.basis, details


def perturb_subspace(
    ctx: RunContext, gram: np.ndarray, rank: int, relation: Neighbours
) -> GapRelease:
    """DTTZ14 Alg. 2 as two releases (:mod:`dpsub_dist.privacy.covariance_noise`): step ``gap_test``
    (the noisy eigengap and its lower bound L), then step ``projector_noise`` with the
    Gaussian calibrated for the projector's sensitivity c/(L − s), known once L is released;
    where L ≤ s the release is ⊥ and ``projector_noise`` is forgone (charged at Δ = 1, the
    same privacy map, nothing drawn: the plan reserved it)."""
    sens = SENSITIVITY[relation]
    gap_grant = ctx.grant(Step.GAP_TEST)
    gap, top = cov_steps.eigengap(gram, rank)
    noisy_gap, lower, noise_name, noise_scale = ctx.release(
        Step.GAP_TEST,
        cov_steps.gap_test_mechanism(gap_grant, sens.gap),
        lambda mech, rng: cov_steps.noisy_gap_lower_bound(
            gap, mech, cov_steps.gap_failure(gap_grant), rng
        ),
    )
    test = (noisy_gap, lower, noise_name, noise_scale)
    projector_sens = sens.projector(lower)
    noise_grant = ctx.grant(Step.PROJECTOR_NOISE)
    if projector_sens is None:
        ctx.forgo(Step.PROJECTOR_NOISE, cov_steps.projector_mechanism(noise_grant))
        return GapRelease(None, None, *test, None, None)
    projector = cov_steps.projector_mechanism(noise_grant, projector_sens)
    basis, noisy = ctx.release(
        Step.PROJECTOR_NOISE,
        projector,
        lambda mech, rng: cov_steps.perturb_projector(top, mech, rng),
    )
    return GapRelease(basis, noisy, *test, projector_sens, projector.sigma)


def bound_quantile(
    method: str,
    grants: dict[str, Budget],
    relation: Neighbours,
    n_rows: float,
    dim: int,
    norm_epsilon: float | None = None,
) -> float:
    """The quantile this run's private bound targets (:func:`noise_matched_quantile`).

    σ is the Gram noise gauss adds at its grant; gap-perturb's noise falls with B² the same way
    (its gap test and projector noise see the Gram of rows scaled by 1/B), so it uses the σ a
    Gram release would have at its projector grant. Public: grants, n (row level; the released
    noisy user count at user level), D and the sparse vector's ε (default: the whole
    ``norm_bound`` grant's). With the margins of :func:`norm_bound.margined_quantile`: raises
    :class:`norm_bound.TooFewForBound` where n (or ñ) is too small for them.
    """
    noise_grant = grants[Step.GRAM_NOISE] if method == "gauss" else grants[Step.PROJECTOR_NOISE]
    sigma = gaussian_sigma(noise_grant, SENSITIVITY[relation].gram)
    if norm_epsilon is None:
        norm_epsilon = laplace_epsilon(grants[Step.NORM_BOUND])
    quantile = noise_matched_quantile(n_rows, dim, sigma, norm_epsilon)
    unit = "users" if relation == "add_remove" else "rows"
    return norm_bound.margined_quantile(quantile, n_rows, norm_epsilon, unit)


def fused_gram(dataset: Dataset) -> bool:
    """Whether the private row-level bound and the Gram take one pass (public facts only):
    D small enough for the per-bin Grams (:func:`norm_pass.fuse_level_grams`). Where rows are
    re-read (:mod:`dpsub_dist.engine.row_cache`) it saves a read; where they are held, a
    round of tasks (measured no slower: docs/scale.md). Either way the same values are
    released (:func:`bound_and_gram`)."""
    return bool(dataset.parts) and fuse_level_grams(dataset.dim)


def bound_and_gram(
    ctx: RunContext, step: str, quantile: float, loader: Any
) -> tuple[float, GramSummary]:
    """The private row-norm bound ``B`` (charged as ``step``) and the Gram of the rows clipped
    to it, in one read (issue #16), instead of a counting pass then a Gram pass.

    Each partition keeps, for its rows y (centred by the released mean when centring), the
    counts per bin of the public norm grid and, per bin holding a row, ``Σ yyᵀ`` and
    ``Σ yyᵀ/‖y‖²`` (:class:`~dpsub_dist.methods._norm_pass.LevelGrams`), summed in a tree
    on the workers and held there. The driver receives the counts, releases ``B`` by the same
    sparse vector as :func:`centring.private_bound` (same counts, same cost and noise), and
    receives the Gram at ``B`` only: ``Σ_{bins ≤ B} Σ yyᵀ/B² + Σ_{bins > B} Σ yyᵀ/‖y‖²``,
    which is ``Σ clip(y, B)clip(y, B)ᵀ/B²`` as :func:`compute_gram` sums it. Privacy is
    unchanged: the released values (``B``, then the Gram at ``B`` with the same Gaussian
    noise) are the same functions of the data as with two passes, up to float rounding
    (rows are added by bin, then scaled: ≤ 10⁻¹² relative in the tests; the noisy Gram is
    rounded to its noise grid, so it is the two passes' bit for bit unless an entry lies
    within rounding of a grid midpoint). The per-bin sums, which may hold a single row, are
    never published and never leave the workers.
    """
    dataset = ctx.dataset
    counts, held = compute_level_grams(dataset.parts, loader, ctx.executor, ctx.progress)
    bound = centring.release_bound(ctx, step, counts, dataset.n_rows, quantile)
    return bound, GramSummary(gather_clipped_gram(held, bound, ctx.executor))


SAMPLE_MIN_PARTITIONS = 8
"""The sampled centre needs at least this many partitions (its sample ≤ 1/8 of the rows)."""

SAMPLE_FRACTION = 1 / 32
"""The sample aims at this share of the rows (its extra read: ≈ 3 % of a full one)…"""

SAMPLE_MIN_ROWS = 50_000
"""…and at least this many rows…"""

SAMPLE_NOISE = 0.05
"""…and at least enough rows that the sample mean's noise norm, √D·σ·B/n_S, is at most this
share of its bound B (σ: the ``mean`` step's Gaussian for Δ = 2 at its grant)."""

SAMPLE_MAX_FRACTION = 1 / 8
"""Where the partitions reaching that target hold more than this share of the rows (few
or uneven partitions), or n_S cannot meet the mean bound's margin: today's route."""

CORRECTION_SHARE = 0.5
"""Of the mean's share on the sampled route, the part spent on ``centred_sum``; the sample's
mean (step ``mean``) keeps the rest."""

SAMPLE_BOUND_SOURCE = ", over centre_sample's partitions (q·n_S, q capped at 1 − 20/(ε_norm·n_S))"
"""What the manifest's ``row_norm_source`` adds on the sampled route (B₂ from S's rows)."""

SAMPLE_RULE = (
    "public: gauss, centred, private bound, row level, ≥ 8 partitions; partitions in "
    "a permutation from the public seed until n_S ≥ max(5·10⁴, n/32, √D·σ_mean/0.05), used "
    "if n_S ≤ n/8 and n_S meets both bounds' margins"
)


@dataclass(frozen=True)
class CentreSample:
    """The sampled-centre route's public sample S of partitions (:func:`centre_sample`)."""

    dataset: Dataset
    """S's partitions, with ``n_rows`` = n_S (public)."""
    seed: int
    of_partitions: int

    def parameters(self) -> dict[str, Any]:
        """What the manifest says about S (public facts only)."""
        return {
            "mean_n_rows": self.dataset.n_rows,  # the mean's divisor: n_S
            "centre_sample": {
                "partitions": len(self.dataset.parts),
                "of_partitions": self.of_partitions,
                "rows": self.dataset.n_rows,
                "seed": self.seed,
                "rule": SAMPLE_RULE,
            },
        }


def centre_sample(config: EstimateConfig, dataset: Dataset | None) -> CentreSample | None:
    """The sample S whose private mean centres the rows on the sampled-centre route, or None
    for today's route (public facts only: the options, n, D, the partitions' row counts, ε,
    δ and the public seed; :data:`SAMPLE_RULE`).

    The route (issue #16): the mean's steps (``norm_bound``, ``mean``) run on S only, dividing
    by n_S, and give the centre c; the centred rows' bound B₂ comes from S's rows too; then one
    full read releases the Gram of the rows y = x − c clipped to B₂ and their clipped sum s
    (step ``centred_sum``, :func:`bound_gram_and_correction`), and gauss releases
    ``G̃ − s̃s̃ᵀ/n``: the Gram about the
    clipped rows' own mean, so a c biased by S (data sorted across partitions) adds nothing.
    Without s, a centre off by e = μ − c would add the rank-one n·eeᵀ (docs/scale.md)."""
    if (
        config.method != "gauss"
        or not config.center
        or config.row_norm is not None
        or config.unit_column is not None
    ):
        return None
    if dataset is None:
        raise ValueError("gauss's route depends on the dataset's partitions: pass the dataset")
    if not dataset.sampled_centre or len(dataset.parts) < SAMPLE_MIN_PARTITIONS:
        return None
    _, grants = plan(config, route_shares(config, sampled=True))
    sigma = gaussian_sigma(grants[Step.MEAN], SENSITIVITY["replace"].row_sum)
    target = max(
        SAMPLE_MIN_ROWS,
        math.ceil(dataset.n_rows * SAMPLE_FRACTION),
        math.ceil(math.sqrt(dataset.dim) * sigma / SAMPLE_NOISE),
    )
    seed = public_seed(config)
    sample = centring.sample_partitions(dataset, target, seed)
    if sample.n_rows > dataset.n_rows * SAMPLE_MAX_FRACTION:
        return None
    try:  # both of S's bounds (the raw rows', the centred rows') meet their margins at n_S
        centring.margined_row_quantile(Step.NORM_BOUND, grants, sample.n_rows)
        epsilon = laplace_epsilon(grants[Step.CENTRED_NORM_BOUND])
        norm_bound.margined_quantile(0.5, sample.n_rows, epsilon, "rows")
    except norm_bound.TooFewForBound:
        return None
    return CentreSample(sample, seed, len(dataset.parts))


def hold_sample(
    sample: CentreSample, dataset: Dataset, executor: Any
) -> tuple[CentreSample, Dataset]:
    """S and the dataset with S's partitions read once and held where their n_S rows fit
    (:func:`~dpsub_dist.engine.row_cache.hold_parts`; public facts: the footers' counts and
    the cluster's memory limits): S's two passes (the mean, the centred rows' bound) and the
    full pass then take them from memory, so every partition is read once. The rows are the
    ones each read would give, so every count, sum and release is unchanged."""
    index = {id(part): i for i, part in enumerate(dataset.parts)}
    positions = [index[id(part)] for part in sample.dataset.parts]
    held = hold_parts(dataset, positions, executor)
    if held is dataset:
        return sample, dataset
    parts = [held.parts[i] for i in positions]
    inner = dataclasses.replace(sample.dataset, parts=parts, loader=held.loader)
    return dataclasses.replace(sample, dataset=inner), held


def release_centred_mean(ctx: RunContext, clipped_sum: np.ndarray, n_rows: int) -> MeanRelease:
    """Step ``centred_sum``: the mean z̄ = s/n of the centred rows clipped to the released B₂
    and scaled by 1/B₂ (each of norm ≤ 1), by the Gaussian mechanism.

    Privacy: replacing one row moves s by ≤ 2 (L2; Δ = ``row_sum`` of
    :data:`SENSITIVITY`), c and B₂ being released values fixed before this step; n is
    public. Cost: the Gaussian's privacy map at σ for Δ = 2 and this step's grant, released
    as the mechanism that draws the noise (:func:`gaussian_mean`, the ``mean`` step's
    mechanism, divided by the public n)."""
    return ctx.release(
        Step.CENTRED_SUM,
        mechanism.gaussian(ctx.grant(Step.CENTRED_SUM), SENSITIVITY["replace"].row_sum),
        lambda mech, rng: gaussian_mean(clipped_sum, n_rows, mech, rng),
    )


@dataclass(frozen=True)
class CentredMean:
    """The released :func:`release_centred_mean`, in units of B₂."""

    release: MeanRelease

    def published(self, centre: list[float], row_norm: float) -> dict[str, Any]:
        """The manifest's mean (post-processing of released values): the sample's centre c
        plus B₂·z̄̃, the centre the released covariance is taken about."""
        mean = np.asarray(centre, dtype=np.float64) + row_norm * self.release.mean
        return {
            "mean": mean.tolist(),
            "centre_sample_mean": centre,
            "mean_note": "private: the mean c of the sample's rows clipped to mean_row_norm "
            "(step mean, over centre_sample's partitions) plus row_norm × the mean of the rows "
            "x − c clipped to row_norm, scaled by 1/row_norm (step centred_sum); the "
            "covariance is taken about it",
            "centred_sum_sensitivity": self.release.sensitivity,
            "centred_sum_noise_sigma": self.release.sigma,
        }


def bound_gram_and_correction(
    ctx: RunContext, quantile: float, sample: CentreSample, loader: Any
) -> tuple[float, float, GramSummary, np.ndarray, CentredMean]:
    """The sampled route after its centre c (:func:`centre_sample`): the centred rows' bound
    B₂ from S's rows, then one full read for the Gram and the correction.

    1. Step ``centred_norm_bound`` on S (its partitions held, :func:`hold_sample`): the sparse
       vector over the norm counts of S's rows y = x − c at the quantile ``quantile`` chosen for all
       n rows, its threshold capped at n_S − SV_MARGIN/ε (:func:`norm_bound.margined_quantile`).
       Privacy: S is public, and replacing one row moves S's counts by ≤ 1 (by 0 if the row
       is outside S), so the argument and the cost are those of the bound over all rows;
       the threshold q_S·n_S is public (n_S: the footers').
    2. One full read at the released B₂ (:func:`compute_gram`: per row one clip and one
       ``syrk``, no per-bin sums): the Gram of the rows y clipped to B₂ and scaled by 1/B₂,
       noised by gauss, and their sum s, released by ``centred_sum``
       (:func:`release_centred_mean`). Both at a released c and B₂: as on every route.

    B₂ then clips the rows of partitions outside S by what S's rows show; where partitions
    differ (data sorted by a column that drives the norms) more of them may be clipped than
    the quantile aims at, which biases the covariance towards the sample's scale but
    releases nothing more (docs/scale.md). Returns B₂, the quantile searched for on S, the
    Gram, the shift n·z̄̃z̄̃ᵀ = s̃s̃ᵀ/n (released) and the released z̄̃."""
    step, dataset = Step.CENTRED_NORM_BOUND, ctx.dataset
    on_sample = norm_bound.margined_quantile(
        quantile, sample.dataset.n_rows, laplace_epsilon(ctx.grant(step)), "rows"
    )
    bound = centring.private_bound(ctx, step, sample.dataset, loader, on_sample)
    summary = compute_gram(dataset.parts, loader, bound, True, False, ctx.executor, ctx.progress)
    assert summary.row_sum is not None
    centred = release_centred_mean(ctx, summary.row_sum, dataset.n_rows)
    shift = dataset.n_rows * np.outer(centred.mean, centred.mean)
    return bound, on_sample, GramSummary(summary.gram), shift, CentredMean(centred)


def too_few_users_bottom(dataset: Dataset, reason: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """⊥ at user level when the released ñ is too small for the private bound
    (:func:`norm_bound.margined_quantile`): the ``norm_bound`` step was read and charged; no
    Gram pass (nor power iteration), no basis, the reason names ñ (released) and the fix.
    The manifest's parameters and release."""
    parameters = {
        "row_norm": None,
        "row_norm_source": "private (not released: too few users)",
        "row_scaling": ROW_SCALING["add_remove"],
        "partitions": len(dataset.parts),
    }
    release = {"neighbours": "add_remove", "failed_step": Step.NORM_BOUND, "failure_reason": reason}
    return parameters, release


def without_assignment(result: EstimateResult) -> EstimateResult:
    """``result`` without a subset assignment in its privacy unit (no subsets here)."""
    result.manifest["privacy"].pop("assignment", None)
    return result


def run_covariance(
    config: EstimateConfig,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None,
    progress: bool,
    noise_seed: int | None,
) -> EstimateResult:
    """``gauss`` (DTTZ14 Alg. 1) or ``gap-perturb`` (Alg. 2) end to end (ALGORITHMS.md §7)."""
    ctx = RunContext.open(config, open_dataset, client, progress, noise_seed)
    dataset = ctx.dataset
    grants = ctx.plan(plan_shares(config, dataset))  # public facts only: before any read
    sample = centre_sample(config, dataset)  # the route that plan declared
    relation = neighbours(config)
    # No rows is bad input at row level (n is public); at user level n is private, so an
    # empty input is summarised as the zero matrix and released with noise like any other.
    if dataset.n_rows < 1 and relation == "replace":
        raise InputError(f"{dataset.input} has no rows: pass a dataset with at least one row")
    step = Step.CENTRED_NORM_BOUND if config.center else Step.NORM_BOUND
    if config.row_norm is None and relation == "replace":  # public n, D, ε, δ: before any read
        try:
            quantile = bound_quantile(
                config.method,
                grants,
                relation,
                dataset.n_rows,
                dataset.dim,
                laplace_epsilon(grants[step]),
            )
        except norm_bound.TooFewForBound as err:
            raise InputError(str(err)) from None
    if sample is None:
        centring.check_bounds(config, grants, dataset.n_rows)  # the private mean's bound
        # Up to four passes follow: each partition is read once and held when the rows fit
        # (row level; engine/row_cache.py), which changes no released value.
        dataset = ctx.dataset = cache_rows(
            dataset, ctx.executor, user_level=relation == "add_remove"
        )
    else:  # S's partitions held for its two passes and the full pass: each one read once
        sample, dataset = hold_sample(sample, dataset, ctx.executor)
        ctx.dataset = dataset
    ctx.timings["inspect_s"] = time.monotonic() - ctx.started
    # Centred: the private mean first, subtracted from every row on the workers; the Gram
    # then sums the centred rows, clipped to their own bound (docs/centring.md).
    summary: GramSummary | None = None  # the Gram, where the bound's pass also summed it
    shift: np.ndarray | None = None  # sampled centre: the released n·z̄z̄ᵀ, subtracted
    with ctx.timed("norm_bound_s"):
        loader, centred, mean_release = centring.centre(
            ctx, dataset if sample is None else sample.dataset
        )
        if config.row_norm is None and relation == "add_remove":
            try:
                released = centring.private_user_bound(
                    ctx,
                    lambda users, eps: bound_quantile(
                        config.method, grants, relation, users, dataset.dim, eps
                    ),
                )
            except norm_bound.TooFewForBound as err:  # a function of the released ñ: ⊥
                parameters, release = too_few_users_bottom(dataset, str(err))
                return without_assignment(ctx.result(None, parameters, release, 0))
            row_norm, norm_source = released.bound, USER_NORM_SOURCE.format(q=released.quantile)
        elif config.row_norm is None:
            if sample is not None:  # S's bound, then the one full pass: Gram and correction
                row_norm, quantile, summary, shift, correction = bound_gram_and_correction(
                    ctx, quantile, sample, loader
                )
                centred.update(sample.parameters())
                mean_release.update(correction.published(mean_release["mean"], row_norm))
            elif fused_gram(dataset):  # the bound's counts and the Gram in one pass
                row_norm, summary = bound_and_gram(ctx, step, quantile, loader)
            else:
                row_norm = centring.private_bound(ctx, step, dataset, loader, quantile)
            norm_source = NORM_SOURCE.format(q=quantile, step=step)
            norm_source += " of the centred rows" if config.center else ""
            norm_source += SAMPLE_BOUND_SOURCE if sample is not None else ""
        else:
            row_norm, norm_source = float(config.row_norm), "public (--row-norm)"
    ctx.timings["fused_gram"] = summary is not None and sample is None  # operator-only
    ctx.timings["sampled_centre"] = sample is not None
    with ctx.timed("gram_s"):
        if summary is None and dataset.parts:
            summary = compute_gram(
                dataset.parts,
                loader,
                row_norm,
                False,
                relation == "add_remove",
                ctx.executor,
                ctx.progress,
            )
        elif summary is None:
            summary = GramSummary(np.zeros((dataset.dim, dataset.dim)))
    with ctx.timed("aggregate_s"):
        basis, release = release_basis(ctx, summary, row_norm, shift)
    if config.method == "gap-perturb":  # a projector has no variances: pay for them
        with ctx.timed("explained_variance_s"):
            basis, variance = centring.explain(ctx, basis, loader)
        release.update(variance)
    parameters = {
        "row_norm": row_norm,
        "row_norm_source": norm_source,
        "row_scaling": ROW_SCALING[relation],
        "clipped_rows": "not counted (a count would need its own privacy budget)",
        **centred,
        "partitions": len(dataset.parts),
    }
    sums = 1 + (shift is not None) + (Step.REFINED_MEAN in grants)  # the mean steps' row sums
    gathered = summary.nbytes + (8 * dataset.dim * sums if config.center else 0)
    return without_assignment(ctx.result(basis, parameters, {**mean_release, **release}, gathered))


COVARIANCE_PARAMS = CENTRING_PARAMS


def check_covariance(config: Any) -> None:
    """Centring needs the public row count (user level has none)."""
    if config.center and config.unit_column:
        raise InputError(
            "--center is row level only: the private mean needs the public row count, which "
            "user level does not have; drop --center or --unit-column"
        )


METHOD = Method(
    name="gauss",
    command="estimate",
    summary="covariance perturbation (Analyze Gauss)",
    params=COVARIANCE_PARAMS,
    run=run_covariance,
    plan=plan_shares,
    check=check_covariance,
)
