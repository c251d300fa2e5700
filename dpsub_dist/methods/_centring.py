"""The options of the private row-norm bound and private centring, shared by every method whose
estimate is meant to be PCA (friendly, histogram, gauss, gap-perturb, auto): one declaration.

Private centring and private explained variance for sample and aggregate (friendly, histogram).

Centring (row level): a private row-norm bound ``B`` (:mod:`dpsub_dist.privacy.norm_bound`, step
``norm_bound``; skipped with a public ``--row-norm``), then the Gaussian mean of the rows
clipped to ``B`` (:func:`dpsub_dist.privacy.covariance_noise.gaussian_mean`, step ``mean``: the same
mechanism as gauss's ``--center``); where each pass re-reads the files the two steps share one
read (:func:`fused_mean`). The released mean ``μ̂`` is subtracted from every row on the
workers before the local step. Privacy by composition: ``μ̂`` is a DP release, and for any fixed
public ``μ̂`` the map ``x ↦ x − μ̂`` is applied row by row, so replacing one row still changes one
subset's summary and the aggregator's argument holds unchanged.

Refined centre (gauss and gap-perturb on wide tables, row level, private bound): the mean
above is only a coarse centre c₀; a private bound B₁ on the norms of the rows centred at c₀
(step ``mean_norm_bound``) and the Gaussian mean of those rows clipped to B₁ (step
``refined_mean``) move it to c₁ = c₀ + that mean (:func:`refine`; CoinPress, Biswas, Dong,
Kamath & Ullman 2020, one refinement step). The plan declares the two steps on wide-shaped
tables where the coarse mean's noise is a large share of its bound and the refined one's is
not (:func:`refines`: public n, D and grants only).

Explained variance (row level): after the basis is released, a private bound ``C`` on the norms
of the centred rows (step ``variance_norm_bound``), then a Gaussian on the k squared projections
and the squared norm of the rows clipped to ``C`` (:mod:`dpsub_dist.privacy.variance`, step
``explained_variance``). Components are ordered by the released variances (post-processing).

Both private bounds (the mean's ``norm_bound`` and ``variance_norm_bound``) take the low-side
margin of :func:`dpsub_dist.privacy.norm_bound.margined_quantile` at the public n. Where n is
too small for the mean's, the run is bad input before any read (:func:`check_bounds`; a public
``--row-norm`` replaces that bound); where it is too small for the explained variance's, the
basis is released without it (nothing drawn or charged for those two steps: a function of the
public n and ε only).

User level: the mean needs a count, private there, and both sums move by a user's row count:
centring is refused (``--center``) or off (default), and no explained variance is released.

Standardisation (``--standardize``, :func:`standardize`; declared in
:mod:`dpsub_dist.methods._standardize`) replaces the mean: a private location and scale per
column, and the method reads ``(x − μ̂)/σ̂``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import dask
import numpy as np

from dpsub_dist.engine.gram import clip_rows, sum_on_workers
from dpsub_dist.engine.row_cache import is_held
from dpsub_dist.engine.sources import load_native, owns_rows
from dpsub_dist.errors import InputError
from dpsub_dist.linalg import top_eigenvectors
from dpsub_dist.methods._norm_pass import (
    NORM_SOURCE,
    compute_level_sums,
    compute_norm_counts,
    compute_user_norm_counts,
    fuse_level_sums,
    gather_clipped_sum,
)
from dpsub_dist.methods._standardize import ROUNDS, StandardisedLoader
from dpsub_dist.methods.steps import Step
from dpsub_dist.privacy import column_scales, mechanism
from dpsub_dist.privacy.accountant import Budget, gaussian_sigma, laplace_epsilon
from dpsub_dist.privacy.covariance_noise import SENSITIVITY, MeanRelease, gaussian_mean
from dpsub_dist.privacy.norm_bound import (
    FIX,
    GRID,
    NORM_QUANTILE,
    NormBound,
    TooFewForBound,
    margined_quantile,
    norm_bound_mechanism,
    private_norm_bound,
    private_user_norm_bound,
    user_norm_bound_mechanism,
)
from dpsub_dist.privacy.variance import (
    private_variances,
    projected_sums,
    released_variance,
    variance_mechanism,
)

if TYPE_CHECKING:
    from dpsub_dist.context import RunContext
    from dpsub_dist.engine.sources import Dataset
    from dpsub_dist.params import EstimateConfig
from dpsub_dist.methods.spec import Param, positive

SAMPLE_AGGREGATE = ("friendly", "histogram")

CENTRED_BY_DEFAULT = (*SAMPLE_AGGREGATE, "gauss", "gap-perturb", "auto")
"""Methods whose estimate is meant to be PCA: centred unless ``--no-center`` (row level)."""

MEAN_SHARE = 0.2
"""Share of the budget spent on the mean when centring (its error enters only as n‖μ̂ − μ‖²)."""

CENTRING_SHARES = {Step.NORM_BOUND: (0.05, 0.0), Step.MEAN: (MEAN_SHARE, MEAN_SHARE)}
"""(ε or ρ share, δ share) of the centring steps in sample and aggregate (``norm_bound`` only
without ``--row-norm``); the mean takes gauss's share. The mean's error ``e`` enters every
subset's Gram as ``−m(m_j eᵀ + e m_jᵀ)``, with ``m_j`` the subset's own mean: measured on
near-low-rank data (docs/centring.md) a 6% share doubled the friend radius, 20% did not."""


VARIANCE_SHARES = {Step.VARIANCE_NORM_BOUND: (0.03, 0.0), Step.EXPLAINED_VARIANCE: (0.07, 0.05)}
"""Budget of the explained-variance steps (row level, after the basis is released)."""


def resolve_center(config: EstimateConfig) -> bool:
    """``--center``/``--no-center`` as given; by default on at row level for the PCA methods."""
    if config.center is not None:
        return bool(config.center)
    if getattr(config, "standardize", False):
        return False  # the standardisation's location centres the rows (_standardize.py)
    return config.unit_column is None and config.method in CENTRED_BY_DEFAULT


def check_options(config: EstimateConfig) -> None:
    """Centring options of friendly/histogram (public facts: exit 2, nothing read)."""
    if config.method not in SAMPLE_AGGREGATE:
        return
    if config.center and config.unit_column:
        raise InputError(
            "--center is row level only: the private mean needs the row count, which is private "
            "at user level; drop --center (or pass --no-center) with --unit-column"
        )
    if config.row_norm is not None and not resolve_center(config):
        raise InputError(
            f"--row-norm bounds the rows for the private mean: it needs centring with "
            f"--method {config.method}; drop --row-norm or --no-center"
        )


def plan_shares(
    base: dict[str, tuple[float, float]], config: EstimateConfig, centre: bool = True
) -> dict[str, tuple[float, float]]:
    """``base`` (the estimator's shares) scaled down to make room for the centring steps
    (unless ``centre`` is False: the base has them) and the explained variance (row level)."""
    before: dict[str, tuple[float, float]] = {}
    if centre and resolve_center(config):
        before = dict(CENTRING_SHARES)
        if config.row_norm is not None:
            before.pop(Step.NORM_BOUND)
    after = VARIANCE_SHARES if config.unit_column is None else {}
    extra = [*before.values(), *after.values()]
    rest_p = 1.0 - sum(p for p, _ in extra)
    rest_q = 1.0 - sum(q for _, q in extra)
    scaled = {name: (p * rest_p, q * rest_q) for name, (p, q) in base.items()}
    return {**before, **scaled, **after}


WIDE_NOISE_RATIO = 0.1
"""A table is *wide* for the centre when the single mean's noise norm √D·σ·B/n is at least
this share of its bound B (:func:`mean_noise_ratio`): there B, the raw rows' bound, carries
the distance from the origin into the centre's error, and a second step clipped around the
coarse centre pays (docs/centring.md). Below it (every tall table: κ ≈ 0.007 at n = 2·10⁴,
D = 8, ε = 1) the centre is one step, as before."""

CONTRACTING_RATIO = 0.5
"""…and where the refined mean's own κ is below this: at κ ≥ 0.5 its error κ·B₁ is half its
bound, which is at least the coarse error, so the step cannot bring the centre within the
spread and its budget is worth more to the Gram (measured: the wide table at ε = 0.3)."""

WIDE_SHAPE = 10
"""…and wide in shape, n ≤ this × D. Measured (docs/centring.md): on digits (n/D = 28,
κ = 0.20 at ε = 1) the refinement halved the centre's error but the Gram's smaller share
cost more captured variance than it gained; on the wide table (n/D = 5.3) it gained."""

REFINED_MEAN_SHARE = 0.25
"""Share of the budget (after the norm bounds) of each of the two mean steps on the refined
route (``mean`` and ``refined_mean``): measured on the wide table of docs/centring.md at
ε = 1, 0.2 each left the refined centre's error at 40, above the second component's scale
(38; captured 0.845), 0.25 each at 24 (captured 0.943)."""

MEAN_NOISE_WEIGHT = 4.0
"""Weight of the refined mean's noise against its clipping-bias bound in
:func:`refined_quantile`: the bound adds the clipped rows' overshoots as if they were
parallel; in many dimensions they mostly cancel. Measured on the wide table at 0.2 shares
it made no difference (centre error 39.8 against 40.2 at weight 1: B₁ lands on the same √2
step of the grid); it lowers B₁ where the spread, not the coarse error, sets it."""

MEAN_MAX_CLIPPED = 0.5
"""The refined mean's bound never targets a quantile below 0.5 (:func:`refined_quantile`)."""


def mean_noise_ratio(grant: Budget, n_rows: int, dim: int) -> float:
    """κ = √D·σ/n: the expected norm of the Gaussian mean's noise over its clipping bound, σ
    the Gaussian's for the row sum (Δ = 2) at ``grant``. Public: the grant, n and D."""
    return math.sqrt(dim) * gaussian_sigma(grant, SENSITIVITY["replace"].row_sum) / n_rows


def refined_quantile(grants: dict[str, Budget], n_rows: int, dim: int) -> float:
    """The quantile of the centred rows' norms that ``mean_norm_bound`` searches for:
    ``1 − min(4κ, 0.5)`` (:data:`MEAN_NOISE_WEIGHT`) with κ the refined mean's
    :func:`mean_noise_ratio`, with the margins of :func:`margined_row_quantile`. Public:
    grants, n and D.

    Derivation (as :func:`~dpsub_dist.privacy.norm_bound.noise_matched_quantile` for the
    Gram): clipping the rows y = x − c₀ to B moves their mean by at most
    ``Σ(‖y‖ − B)₊/n`` and the noise adds ≈ κ·B, so the sum of the two is convex in B with
    derivative ``−P(‖y‖ > B) + κ``: smallest where the share of clipped rows is κ; the
    bias bound is loose, hence the weight."""
    kappa = mean_noise_ratio(grants[Step.REFINED_MEAN], n_rows, dim)
    quantile = 1.0 - min(MEAN_NOISE_WEIGHT * kappa, MEAN_MAX_CLIPPED)
    bound, fix = BOUND_STEPS[Step.MEAN_NORM_BOUND]
    epsilon = laplace_epsilon(grants[Step.MEAN_NORM_BOUND])
    return margined_quantile(quantile, n_rows, epsilon, "rows", bound, fix)


def refines(single: Budget, refined: dict[str, Budget], n_rows: int, dim: int) -> bool:
    """Whether a centred run with a private bound takes the refinement steps: where the
    table is wide (n ≤ :data:`WIDE_SHAPE`·D), the single-step mean (at its grant ``single``)
    has κ ≥ :data:`WIDE_NOISE_RATIO`, the refined mean's κ < :data:`CONTRACTING_RATIO` and n
    meets the refined bound's margin at the ``refined`` plan's grants. Public facts only."""
    if n_rows < 1 or n_rows > WIDE_SHAPE * dim:
        return False
    if mean_noise_ratio(single, n_rows, dim) < WIDE_NOISE_RATIO:
        return False
    if mean_noise_ratio(refined[Step.REFINED_MEAN], n_rows, dim) >= CONTRACTING_RATIO:
        return False
    try:
        refined_quantile(refined, n_rows, dim)
    except TooFewForBound:
        return False
    return True


REFINE_RULE = (
    "public: centred, private bound, row level, not the sampled centre; "
    f"n ≤ {WIDE_SHAPE}·D, the single mean's √D·σ/n ≥ {WIDE_NOISE_RATIO} (σ for Δ = 2 at its "
    f"grant), the refined mean's < {CONTRACTING_RATIO} and n meets the refined bound's margin"
)


REFINED_SOURCE = (
    "private (step mean_norm_bound): the smallest value 2^-10·√2^j (j = 0…100) at which the "
    "noisy count of the rows x − coarse_mean with norm ≤ it reaches q·n (sparse vector), "
    "q = {q:.6g} = 1 − min(4√D·σ/n, 0.5) from public n, D and the refined mean's grant (σ for "
    "Δ = 2), within 35.3/ε ≤ q·n ≤ n − 20/ε"
)


BOUND_STEPS = {
    Step.NORM_BOUND: ("a private norm bound", FIX),
    Step.MEAN_NORM_BOUND: ("the refined centre's private norm bound", "pass a larger ε"),
    Step.VARIANCE_NORM_BOUND: ("the explained variance's private norm bound", "pass a larger ε"),
}
"""This module's private bounds at row level: (what the message calls it, its fix). The mean's
bound is replaced by ``--row-norm``; the explained variance's is always private."""


def margined_row_quantile(step: str, grants: dict[str, Budget], n_rows: int) -> float:
    """Row level: :data:`NORM_QUANTILE` with the margins of
    :func:`~dpsub_dist.privacy.norm_bound.margined_quantile` for the bound charged as ``step``
    (at ε of its grant); raises :class:`TooFewForBound` where the public n is too small. At
    0.99 the quantile is unchanged wherever n is large enough."""
    bound, fix = BOUND_STEPS[step]
    return margined_quantile(
        NORM_QUANTILE, n_rows, laplace_epsilon(grants[step]), "rows", bound, fix
    )


def row_quantile(step: str, grants: dict[str, Budget], n_rows: int) -> float:
    """:func:`margined_row_quantile`, with too few rows as bad input (exit 2)."""
    try:
        return margined_row_quantile(step, grants, n_rows)
    except TooFewForBound as err:
        raise InputError(str(err)) from None


def check_bounds(config: EstimateConfig, grants: dict[str, Budget], n_rows: int) -> None:
    """Before any read, at row level: the mean's private bound (step ``norm_bound``, when the
    plan has it) must meet its margin, or the run is bad input with nothing read or charged
    (n and the grants are public). The explained variance's bound is not checked here: where
    it cannot meet its margin the basis is released without it (:func:`explain`)."""
    if config.unit_column is None and Step.NORM_BOUND in grants:
        row_quantile(Step.NORM_BOUND, grants, n_rows)


@dataclass(frozen=True)
class CentredLoader:
    """The dataset's loader, with the released mean subtracted from every row (on a worker)."""

    loader: Any
    mean: np.ndarray
    OWNS_ROWS: ClassVar[bool] = True
    """Each call returns a new float64 array (:func:`~dpsub_dist.engine.sources.owns_rows`)."""

    def __call__(self, part: Any) -> tuple[np.ndarray, Any]:
        rows, units = self.loader(part)
        # One float64 array, centred in place: the loader's own where it owns it (the Parquet
        # reader's), else one new copy (``asarray(rows) − mean`` allocated two for float32
        # rows, and every large allocation costs page faults on a Dask worker: its nanny's
        # MALLOC_TRIM_THRESHOLD_ hands freed memory back at once; docs/scale.md).
        if owns_rows(self.loader) and rows.dtype == np.float64:
            centred = rows
        else:
            centred = np.array(rows, dtype=np.float64)
        centred -= self.mean
        return centred, units

    def native(self, part: Any) -> tuple[np.ndarray, Any]:
        """The centred rows in the source's precision (:func:`load_native`: float32 rows minus
        the mean rounded to float32), a new array."""
        centred, _, units = self.native_with_source(part)
        return centred, units

    def native_with_source(self, part: Any) -> tuple[np.ndarray, np.ndarray, Any]:
        """:meth:`native`'s centred rows and the source rows they came from, from one read."""
        rows, units = load_native(self.loader, part)
        return rows - self.mean.astype(rows.dtype), rows, units


def private_bound(
    ctx: RunContext, step: str, dataset: Dataset, loader: Any, quantile: float = NORM_QUANTILE
) -> float:
    """The private row-norm bound of ``loader``'s rows (over ``dataset``'s partitions) at
    ``quantile``, released as ``step`` (norm_bound.py)."""
    counts = compute_norm_counts(dataset.parts, loader, ctx.executor, ctx.progress)
    return release_bound(ctx, step, counts, dataset.n_rows, quantile)


def release_bound(
    ctx: RunContext, step: str, counts: np.ndarray, n_rows: int, quantile: float = NORM_QUANTILE
) -> float:
    """The driver's half of :func:`private_bound`: the sparse vector over the grid's norm
    ``counts`` (:func:`~dpsub_dist.privacy.norm_bound.private_norm_bound`), released as
    ``step``; whichever pass summed the counts (a fused one too), the release is this one."""
    return ctx.release(
        step,
        norm_bound_mechanism(ctx.grant(step)),
        lambda mech, rng: private_norm_bound(counts, n_rows, mech, rng, quantile=quantile).bound,
    )


def private_user_bound(ctx: RunContext, quantile_for: Callable[[float, float], float]) -> NormBound:
    """User level: the private bound on the users' norms ``√Σ‖x‖²`` (raw rows of
    ``ctx.dataset``), released as ``norm_bound``
    (:func:`dpsub_dist.privacy.norm_bound.private_user_norm_bound`); an input without parts
    gives zero counts (n is private: no refusal). Raises
    :class:`~dpsub_dist.privacy.norm_bound.TooFewForBound` where the released ñ is too small
    for the sparse vector's margins (the caller publishes ⊥: the step was read and charged)."""
    dataset = ctx.dataset
    counts = (
        compute_user_norm_counts(dataset.parts, dataset.loader, ctx.executor, ctx.progress)
        if dataset.parts
        else np.zeros(len(GRID) + 1, dtype=np.int64)
    )
    return ctx.release(
        Step.NORM_BOUND,
        user_norm_bound_mechanism(ctx.grant(Step.NORM_BOUND)),
        lambda mech, rng: private_user_norm_bound(counts, mech, rng, quantile_for),
    )


def centre(
    ctx: RunContext, dataset: Dataset | None = None
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The loader the local step reads (centred or not, or standardised with ``--standardize``:
    :func:`~dpsub_dist.methods._standardize.standardize`), the parameters and the release;
    the mean is taken over ``dataset`` (default: the run's)."""
    config = ctx.config
    dataset = ctx.dataset if dataset is None else dataset
    if getattr(config, "standardize", False):
        return standardize(ctx, dataset)
    if not resolve_center(config):
        return dataset.loader, {"center": False, "center_note": UNCENTRED_NOTE}, {}
    if config.row_norm is None:
        quantile = row_quantile(Step.NORM_BOUND, ctx.grants, dataset.n_rows)  # low-side margin
        source = NORM_SOURCE.format(q=quantile, step=Step.NORM_BOUND)
    else:
        bound, source = float(config.row_norm), "public (--row-norm)"
    if config.row_norm is None and fused_mean(dataset):
        bound, row_sum = _bound_and_sum(ctx, dataset, quantile)
    else:
        if config.row_norm is None:
            bound = private_bound(ctx, Step.NORM_BOUND, dataset, dataset.loader, quantile)
        row_sum = clipped_sum(ctx, dataset, dataset.loader, bound)
    mean = release_mean(ctx, Step.MEAN, row_sum, dataset.n_rows, bound)
    parameters = {"center": True, "mean_row_norm": bound, "mean_row_norm_source": source}
    release = {
        "mean": mean.mean.tolist(),
        "mean_note": "private mean of the rows clipped to norm ≤ mean_row_norm, input units; "
        "subtracted from every row before the estimate",
        "mean_sensitivity": mean.sensitivity,
        "mean_noise_sigma": mean.sigma,
    }
    if Step.REFINED_MEAN in ctx.grants:  # the plan's refined route (:func:`refines`)
        return refine(ctx, dataset, mean, parameters, release)
    return CentredLoader(dataset.loader, mean.mean), parameters, release


def release_mean(
    ctx: RunContext, step: str, row_sum: np.ndarray, n_rows: int, bound: float
) -> MeanRelease:
    """Step ``step``: the Gaussian mean of rows clipped to ``bound`` whose sum is ``row_sum``
    (:func:`~dpsub_dist.privacy.covariance_noise.gaussian_mean`; Δ = 2 for the sum of rows
    scaled to norm ≤ 1 under replace-one, n public), in input units."""
    gaussian = mechanism.gaussian(ctx.grant(step), SENSITIVITY["replace"].row_sum)

    def draw(mech: mechanism.Gaussian, rng: np.random.Generator) -> MeanRelease:
        return gaussian_mean(row_sum, n_rows, mech, rng, unit=bound)

    return ctx.release(step, gaussian, draw)


def clipped_sum(ctx: RunContext, dataset: Dataset, loader: Any, bound: float) -> np.ndarray:
    """Σ clip(y, ``bound``) over ``loader``'s rows y of ``dataset``, summed on the workers."""
    total = dask.delayed(_clipped_row_sum, pure=True)
    tasks = [total(loader, bound, part) for part in dataset.parts]
    label = f"{len(tasks)} partitions → clipped row sum"
    return sum_on_workers(tasks, ctx.executor, label, ctx.progress)


def refine(
    ctx: RunContext,
    dataset: Dataset,
    coarse: MeanRelease,
    parameters: dict[str, Any],
    release: dict[str, Any],
) -> tuple[CentredLoader, dict[str, Any], dict[str, Any]]:
    """One CoinPress step (Biswas, Dong, Kamath & Ullman, NeurIPS 2020, Alg. 1 with one
    refinement) from the released coarse centre c₀: the rows y = x − c₀, their private norm
    bound B₁ (step ``mean_norm_bound``, at :func:`refined_quantile`), and the centre
    c₁ = c₀ + B₁·(Σ clip(y, B₁)/B₁)/n + N(0, (B₁σ/n)²) (step ``refined_mean``). The coarse
    mean's error grows with its bound, the raw rows' (the distance from the origin); the
    refined one's with B₁, the spread around c₀.

    Privacy (replace one row, n public): c₀ is released before this step and fixed, so
    ``x ↦ x − c₀`` acts on each row alone and a replaced row is still one replaced row y.
    ``mean_norm_bound`` is the sparse vector of :mod:`dpsub_dist.privacy.norm_bound` over the
    y's norm counts (each cumulative count moves by ≤ 1): ε of its grant. Given B₁ (released),
    the sum of the y clipped to B₁ and scaled by 1/B₁ moves by ``a − b`` with ‖a‖, ‖b‖ ≤ 1:
    Δ = 2, the Gaussian mechanism at its grant (:func:`release_mean`). c₁ is post-processing
    of c₀ and that release. Cost: the two grants, composed with the others as every step
    (the run's accountant); the rows are then centred at c₁, a released value."""
    quantile = refined_quantile(ctx.grants, dataset.n_rows, dataset.dim)
    around = CentredLoader(dataset.loader, coarse.mean)
    bound = private_bound(ctx, Step.MEAN_NORM_BOUND, dataset, around, quantile)
    step = release_mean(
        ctx, Step.REFINED_MEAN, clipped_sum(ctx, dataset, around, bound), dataset.n_rows, bound
    )
    centre = coarse.mean + step.mean
    parameters = {
        **parameters,
        "refined_row_norm": bound,
        "refined_row_norm_source": REFINED_SOURCE.format(q=quantile),
        "centre_rule": REFINE_RULE,
    }
    release = {
        **release,
        "mean": centre.tolist(),
        "coarse_mean": release["mean"],
        "mean_note": "private: the coarse mean c₀ of the rows clipped to mean_row_norm (step "
        "mean) plus the mean of the rows x − c₀ clipped to refined_row_norm (step "
        "refined_mean), input units; subtracted from every row before the estimate",
        "refined_mean_sensitivity": step.sensitivity,
        "refined_mean_noise_sigma": step.sigma,
    }
    return CentredLoader(dataset.loader, centre), parameters, release


def sample_partitions(dataset: Dataset, target_rows: int, seed: int) -> Dataset:
    """A public random subset S of ``dataset``'s partitions: in the order of a permutation
    drawn from the public ``seed``, the fewest partitions holding ≥ ``target_rows`` rows (all
    of them if they hold fewer), in file order, with ``n_rows`` their public row count n_S.

    Public facts only (the seed, the partitions' row counts from the footers, public at row
    level). Any fixed S keeps a step's sensitivity: a replace-one neighbour differs in at
    most one row of S, and n_S does not move."""
    sizes = np.diff([*dataset.offsets, dataset.n_rows]).astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(sizes))
    taken = int(np.searchsorted(np.cumsum(sizes[order]), target_rows)) + 1
    chosen = np.sort(order[:taken]).tolist()
    return dataclasses.replace(
        dataset,
        parts=[dataset.parts[i] for i in chosen],
        offsets=[int(dataset.offsets[i]) for i in chosen],
        n_rows=int(sizes[chosen].sum()),
    )


def fused_mean(dataset: Dataset) -> bool:
    """Whether the mean's bound and clipped sum take one read of the rows (public facts
    only): where each pass re-reads the files (rows not held, :mod:`dpsub_dist.engine.row_cache`)
    and D is small enough (:func:`fuse_level_sums`). Held rows keep the two passes, which
    cost no read and give the sum bit for bit as before."""
    return not is_held(dataset) and fuse_level_sums(dataset.dim)


def _bound_and_sum(ctx: RunContext, dataset: Dataset, quantile: float) -> tuple[float, np.ndarray]:
    """The private bound (step ``norm_bound``, at ``quantile``) and the rows' clipped sum at it,
    in one read.

    The workers keep, per bin of the public grid, the count, ``Σ x`` and ``Σ x/‖x‖``
    (:class:`~dpsub_dist.methods._norm_pass.LevelSums`); the driver gets the counts, runs
    the sparse vector exactly as :func:`private_bound` does, and then gathers the clipped sum
    at the released bound, computed on the workers from those per-bin sums. Privacy is
    unchanged: the counts are the ones the separate pass sums, the bound is the same release
    of them, and the sum is the same function of the rows and the released bound (up to float
    rounding: the rows are added by bin), so the mean's sensitivity and noise are as before.
    The noisy mean is rounded to its noise grid (:func:`noise.add_gaussian`), so it is the
    separate passes' bit for bit unless the sum lies within rounding of a grid midpoint (the
    release checksums did not move).
    """
    counts, held = compute_level_sums(dataset.parts, dataset.loader, ctx.executor, ctx.progress)
    bound = release_bound(ctx, Step.NORM_BOUND, counts, dataset.n_rows, quantile)
    return bound, gather_clipped_sum(held, bound, ctx.executor)


UNCENTRED_NOTE = (
    "uncentred: the basis spans the top directions of the raw second moment E[xxᵀ], which on "
    "data with a mean far from 0 is close to the mean's direction, not the principal components"
)


def _clipped_row_sum(loader: Any, bound: float, part: Any) -> np.ndarray:
    return clip_rows(loader(part)[0], bound).sum(axis=0)


def explain(
    ctx: RunContext, basis: np.ndarray | None, loader: Any
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Private explained variance of a released basis over ``loader``'s rows of the run's
    dataset; the basis re-ordered by it. Where the public n and ε are too small for its
    bound's margin, its two steps are skipped (:meth:`RunContext.skip`: nothing drawn or
    charged)."""
    if basis is None:
        return None, {}
    config, dataset = ctx.config, ctx.dataset
    if config.unit_column is not None:
        return basis, {
            "explained_variance": None,
            "explained_variance_ratio": None,
            "explained_variance_note": "not released at user level: the sums move by a user's "
            "row count and n is private",
        }
    try:
        quantile = margined_row_quantile(Step.VARIANCE_NORM_BOUND, ctx.grants, dataset.n_rows)
    except TooFewForBound as err:  # public n and ε: skipped, nothing drawn or charged
        for step in VARIANCE_SHARES:
            ctx.skip(step)
        return basis, {
            "explained_variance": None,
            "explained_variance_ratio": None,
            "explained_variance_note": f"not released, nothing charged for it: {err}",
        }
    bound = private_bound(ctx, Step.VARIANCE_NORM_BOUND, dataset, loader, quantile)
    part_sums = dask.delayed(_projected_sums, pure=True)
    tasks = [part_sums(loader, basis, bound, part) for part in dataset.parts]
    label = f"{len(tasks)} partitions → projected variances"
    sums = sum_on_workers(tasks, ctx.executor, label, ctx.progress)
    release = ctx.release(
        Step.EXPLAINED_VARIANCE,
        variance_mechanism(ctx.grant(Step.EXPLAINED_VARIANCE)),
        lambda mech, rng: private_variances(sums, dataset.n_rows, bound, mech, rng),
    )
    values, rotation = top_eigenvectors(release.matrix, basis.shape[1])  # descending
    details = released_variance(values, release.total, 1.0, 1, "replace")
    details.update(
        explained_variance_note=VARIANCE_NOTE,
        variance_row_norm=bound,
        variance_sensitivity=release.sensitivity,
        variance_noise_sigma=release.sigma,
        component_order="principal axes of the released projected covariance, descending",
    )
    return basis @ rotation, details


VARIANCE_NOTE = (
    "private (steps variance_norm_bound, explained_variance): eigenvalues of the noisy k×k "
    "Σ (Vᵀz)(Vᵀz)ᵀ and the noisy Σ ‖z‖² over the rows z = clip(x − mean, variance_row_norm), "
    "divided by n, clipped at 0; the basis is rotated to that matrix's eigenvectors"
)


def _projected_sums(loader: Any, basis: np.ndarray, bound: float, part: Any) -> np.ndarray:
    return projected_sums(loader(part)[0], basis, bound)


STANDARDIZE_NOTE = (
    "private standardisation (steps standardize_histogram, standardize_moments, "
    "standardize_refine): every row is "
    "(x − location)/scale before the method's steps; the basis is in those standardised units"
)


def standardize(ctx: RunContext, dataset: Dataset) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``--standardize`` (:mod:`~dpsub_dist.methods._standardize`): release the location and
    scale of ``dataset``'s columns (three passes over the rows) and return the standardised
    loader, the parameters and the release."""
    dim = dataset.dim
    histogram = dask.delayed(_column_histograms, pure=True)
    tasks = [histogram(dataset.loader, part) for part in dataset.parts]
    label = f"{len(tasks)} partitions → column histograms"
    counts = sum_on_workers(tasks, ctx.executor, label, ctx.progress)  # n ≥ 1: some part
    ranges = ctx.release(
        Step.STANDARDIZE_HISTOGRAM,
        column_scales.histogram_mechanism(ctx.grant(Step.STANDARDIZE_HISTOGRAM), dim),
        lambda mech, rng: column_scales.private_ranges(counts, mech, rng),
    )
    moments = dask.delayed(_clipped_moments, pure=True)
    around, rounds = ranges, []
    for step, clip in zip(ROUNDS, column_scales.CLIPS, strict=True):
        tasks = [
            moments(dataset.loader, around.centre, around.spread, clip, p) for p in dataset.parts
        ]
        label = f"{len(tasks)} partitions → clipped moments"
        sums = sum_on_workers(tasks, ctx.executor, label, ctx.progress)
        released = ctx.release(
            step,
            column_scales.moments_mechanism(ctx.grant(step), dim),
            lambda mech, rng, sums=sums, around=around, clip=clip: (
                column_scales.private_location_scale(sums, dataset.n_rows, around, clip, mech, rng)
            ),
        )
        around = released.refined
        rounds.append(released.location.tolist())
    parameters = {
        "center": False,
        "center_note": "no separate private mean: " + STANDARDIZE_NOTE,
        "standardize": True,
        "standardize_clips": list(column_scales.CLIPS),
        "standardize_grid": f"signed, 2^{column_scales.LOW}…2^{column_scales.HIGH}, "
        f"{column_scales.PER_OCTAVE} bins per octave",
    }
    release = {
        "location": released.location.tolist(),
        "scale": released.scale.tolist(),
        "standardize_note": STANDARDIZE_NOTE,
        "location_rounds": rounds,
        "coarse_centre": ranges.centre.tolist(),
        "coarse_spread": ranges.spread.tolist(),
        "standardize_histogram_sigma": ranges.sigma,
        "standardize_moments_sigma": released.sigma,  # the last round's
        "standardize_sensitivity": released.sensitivity,
    }
    return (
        StandardisedLoader(dataset.loader, released.location, released.scale),
        parameters,
        release,
    )


def _column_histograms(loader: Any, part: Any) -> np.ndarray:
    return column_scales.column_histograms(loader(part)[0])


def _clipped_moments(
    loader: Any, centre: np.ndarray, spread: np.ndarray, clip: float, part: Any
) -> np.ndarray:
    return column_scales.clipped_moments(loader(part)[0], centre, spread, clip)


ROW_NORM = Param(
    "row_norm",
    float,
    "public bound B, longer rows are scaled down to B (gauss/gap-perturb, and the private "
    "mean when centring; default: chosen privately with a small share of the budget)",
    need="a positive finite number",
    fix="e.g. 10",
    valid=positive,
    example=10.0,
)
CENTER = Param(
    "center",
    bool,
    "subtract a private mean first (default: on at row level for friendly, histogram, gauss, "
    "gap-perturb, auto and streams, whose mean is the first batch's; --no-center estimates "
    "the uncentred subspace)",
    need="true or false",
    example=True,
)
CENTRING_PARAMS = (ROW_NORM, CENTER)
