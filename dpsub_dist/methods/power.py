"""``--method power``: the private noisy power method on the workers, nothing D×D anywhere
(Hardt & Price 2014; :mod:`dpsub_dist.privacy.noisy_power`, docs/power.md).

Mechanism and privacy argument: :mod:`dpsub_dist.privacy.noisy_power`. This module runs it: each
iteration is one pass over the rows on the workers, where every partition computes
``Zₚᵀ(Zₚ V)`` (``D × k'``) for the current public iterate ``V`` of its clipped, scaled rows
``Zₚ``, as ``Xₚᵀ(w ⊙ Xₚ V)`` from the rows as the source gives them and per-row clipping
weights (:func:`dpsub_dist.engine.gram.clip_weights`: no clipped copy of the rows; float32
sources stay float32, multiplied by SGEMM), and the partial products are tree-summed in float64
on the workers (:func:`dpsub_dist.engine.gram.sum_on_workers`): the driver receives one
``D × k'`` matrix per iteration and holds ``O(D·k')`` numbers; nothing ``D × D`` exists
anywhere. Costs per pass: docs/power.md, "Speed at D = 10⁵".

The private bound's counting pass is the first iteration's where the rows are re-read every
pass (row level, :func:`fuse_bound`: public facts only): every partition keeps its norm
counts and, per filled bin of the norm grid, ``Σ x(xᵀV₀)`` and ``Σ x(xᵀV₀)/‖x‖²`` for the
public start ``V₀`` (:class:`~dpsub_dist.methods._norm_pass.LevelProducts`), held on the
workers; the driver releases the bound from the counts, then receives ``C V₀`` at it
(:meth:`RowPasses.fused_first`: T reads of the rows instead of T + 1, the same released
values; privacy argument there). Each pass's graph takes the loader as one key
(:func:`~dpsub_dist.engine.gram.one_key`), not as an argument Dask walks for every task.

The rows and their weights stay in the workers' memory between iterations when ``n·D·8``
bytes (row count from the footers: public at row level) fit as the covariance family's row
cache decides (:func:`dpsub_dist.engine.row_cache.rows_fit`: a quarter of the workers' memory
limits); otherwise every iteration reads the Parquet files again. Both compute the same
product with the same arithmetic: the choice changes time and memory only, never a published
value.

Shared with gauss (reused, not copied): private centring (:mod:`dpsub_dist.methods._centring`:
the mean released first and subtracted from every row on the workers), the private row-norm
bound of the (centred) rows (:mod:`dpsub_dist.privacy.norm_bound`, at gauss's noise-matched
quantile with this method's σ, clipping at most :data:`MAX_CLIPPED`) and their budget plan
(:func:`dpsub_dist.methods.gauss.budget_plan`, with this method's bound share
:data:`NORM_SHARE`).
User level (``--unit-column``): each user's clipped, scaled rows are scaled jointly so that
their squared norms sum to ≤ 1, as gauss's Gram pass does
(:func:`dpsub_dist.engine.gram.user_scale`; here through the weights), and the bound is
gauss's private user-level bound (:func:`dpsub_dist.methods._centring.private_user_bound`,
at :func:`bound_quantile` of the users' norms); n is private there, so no published value uses
it (no eigenvalue estimates, no refusal of an empty input) — privacy argument in
:mod:`dpsub_dist.privacy.noisy_power`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import dask
import numpy as np

from dpsub_dist.context import EstimateResult, RunContext, public_seed
from dpsub_dist.engine.compute import Executor, tree_sum
from dpsub_dist.engine.gram import (
    add_user_norms,
    clip_weights,
    one_key,
    sum_on_workers,
    tame_rows,
    user_squared_norms,
    user_totals,
)
from dpsub_dist.engine.row_cache import rows_fit
from dpsub_dist.engine.sources import Loader, load_native
from dpsub_dist.errors import InputError
from dpsub_dist.linalg import row_norms
from dpsub_dist.methods import _centring as centring
from dpsub_dist.methods import gauss as cov
from dpsub_dist.methods._norm_pass import (
    LevelProducts,
    fuse_level_products,
    gather_clipped_product,
    held_levels,
    level_products,
)
from dpsub_dist.methods.steps import Step
from dpsub_dist.params import DEFAULT_OVERSAMPLE
from dpsub_dist.privacy import noisy_power as power
from dpsub_dist.privacy.accountant import laplace_epsilon
from dpsub_dist.privacy.norm_bound import (
    TooFewForBound,
    margined_quantile,
    noise_matched_quantile,
)

if TYPE_CHECKING:
    import pandas as pd

    from dpsub_dist.engine.sources import Dataset
    from dpsub_dist.params import EstimateConfig
from dpsub_dist.methods._standardize import with_standardize

MAX_CLIPPED = 0.95
"""The most rows the private bound may clip: the bound targets gauss's noise-matched quantile
(:func:`dpsub_dist.privacy.norm_bound.noise_matched_quantile`, with :data:`NOISE_FACTOR` × the
iterations' σ), capped at 95% clipped instead of gauss's 50%. Where the noise dominates (wide
D, small n), clipping most rows raises the signal n·λ/B² against the noise σ√D, which does not
depend on B, and on elliptical data keeps the eigenvectors (power_sim, docs/history.md; λᵢ = i⁻²,
D = n = 10⁵, ε = 1, T = 6, k = 3, with the even split and 10% bound share of the time: 0.891
captured at 5% covered, 0.760 at the median). Where the noise is small the rule clips few
rows: on the real flights table (D = 13) a fixed 5% or 50% quantile tilted the basis (error
1.0 at ε = 1, 3 and even 1000), the noise-matched one did not (docs/power.md)."""

NORM_SHARE = 0.03
"""Power's share of ε (or ρ) for its private bound (no δ; halved between the raw rows' bound
and the centred rows' bound when centring), where gauss spends
:data:`dpsub_dist.methods.gauss.NORM_SHARE` = 0.1. The bound only has to land on the
right step of a √2 grid, which the sparse vector does with a few hundred rows of count error
at n = 10⁵ (Lap(4/ε_norm) per query), so the budget is worth more to the iterations: measured
(power_sim, docs/history.md; λᵢ = i⁻², D = n = 10⁵, ε = 1, k = 3, T = 6, growth 1.3, B = 0.71,
uncentred, 5 runs) 0.903 captured at 0.1, 0.911 at 0.03 (docs/power.md "The defaults"). The
price is the low-side margin (:func:`dpsub_dist.privacy.norm_bound.margined_quantile`): a
private bound needs n ≥ 55.3/(0.03·ε) ≈ 1,843/ε rows uncentred, twice that centred (exit 2
below: pass ``--row-norm``). The mean's share, when centring, is gauss's
(:data:`dpsub_dist.methods._centring.MEAN_SHARE` = 0.2: 0.827 captured centred, against
0.782 at 0.1 and 0.830 at 0.3, the docs' table)."""

NOISE_FACTOR = 2.0
"""The bound's noise-matched quantile reads this multiple of the iterations' σ (gauss's rule
reads 1×). At D = n = 10⁵, ε = 1 the smaller :data:`NORM_SHARE` leaves σ low enough that 1×
gives q = 0.18, B = 1 on the grid (0.896 captured), 2× gives the 5% cap, B = 0.71 (0.911);
measured at D = 10³ and 10⁴ and on the flights table too (docs/power.md "The defaults")."""


def bound_quantile(
    steps: power.PowerIterations, relation: str, count: float, dim: int, epsilon: float
) -> float:
    """The private bound's quantile, from public values only: n at row level (the released ñ
    at user level), D, the iterations' σ
    (:attr:`~dpsub_dist.privacy.noisy_power.PowerIterations.sigma`,
    the even split's σ for their ρ) times :data:`NOISE_FACTOR` and the sparse vector's ε, with
    the margins of :func:`~dpsub_dist.privacy.norm_bound.margined_quantile` (raises
    :class:`~dpsub_dist.privacy.norm_bound.TooFewForBound`)."""
    sigma = NOISE_FACTOR * steps.sigma
    quantile = noise_matched_quantile(int(max(count, 1)), dim, sigma, epsilon, MAX_CLIPPED)
    unit = "users" if relation == "add_remove" else "rows"
    return margined_quantile(quantile, count, epsilon, unit)


BOUND_SOURCE = (
    "private (step {step}): the smallest value 2^-10·√2^j (j = 0…100) at which the noisy "
    "count of rows with norm ≤ it reaches q·n (sparse vector), q = {q:g} fixed (power)"
)
USER_BOUND_SOURCE = (
    "private at user level (step norm_bound): a noisy user count ñ (half of the step), then "
    "the smallest value 2^-10·√2^j (j = 0…100) at which the noisy count of users with "
    "√Σ‖x‖² ≤ it reaches q·ñ (sparse vector, the other half), q = {q:g} fixed (power)"
)

EXPLAINED_VARIANCE_NOTE = (
    "singular values of the last released noisy product C·V × row_norm²/n: estimates of the "
    "top eigenvalues of the clipped rows' second moment (with most rows clipped at the default "
    "bound, below the raw rows' eigenvalues), post-processing; the ratio needs the trace, "
    "which is not released"
)

USER_VARIANCE_NOTE = (
    "not released at user level: the eigenvalue estimates divide by n, which is private there"
)


def iterations(config: EstimateConfig) -> int:
    """T, public: --iterations or :data:`~dpsub_dist.params.DEFAULT_ITERATIONS`."""
    return int(config.iterations)


def width(config: EstimateConfig, dim: int) -> int:
    """k' = k + oversample (public), at most D."""
    extra = DEFAULT_OVERSAMPLE if config.oversample is None else int(config.oversample)
    return min(dim, config.rank + extra)


def budget_plan(center: bool, zcdp: bool, private_norm: bool) -> dict[str, tuple[float, float]]:
    """Step shares: gauss's plan (norm bounds, mean) with its Gram step as the power step and
    the bounds' share :data:`NORM_SHARE`."""
    plan = cov.budget_plan("gauss", center, zcdp, private_norm, NORM_SHARE)
    return {
        (Step.POWER if step == Step.GRAM_NOISE else step): share for step, share in plan.items()
    }


def plan_shares(config: EstimateConfig) -> dict[str, tuple[float, float]]:
    """This run's :func:`budget_plan` (the total's mode decides the δ shares), after the
    standardisation's steps with ``--standardize``."""
    shares = budget_plan(bool(config.center), config.rho is not None, config.row_norm is None)
    return with_standardize(shares, config)


def _product(rows: np.ndarray, basis: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """``Xᵀ diag(w) X V`` (``D × k'``, float64; ``w`` None: ``Xᵀ(X V)``), in the rows' precision:
    float32 rows (a float32 source) take SGEMM with a float32 ``V`` (half of DGEMM's time and
    memory traffic; relative rounding ≲ √D·2⁻²⁴ of the entries' magnitude), and the partial
    products are summed in float64 on the tree."""
    dtype = np.float32 if rows.dtype == np.float32 else np.float64
    projected = rows @ basis.astype(dtype, copy=False)
    if weights is not None:
        projected *= weights[:, None]
    return np.asarray(rows.T @ projected, dtype=np.float64)


def _weighted_product(held: tuple[np.ndarray, np.ndarray], basis: np.ndarray) -> np.ndarray:
    """:func:`_product` of one partition's held ``(rows, weights)``."""
    rows, weights = held
    return _product(rows, basis, weights)


def _load_product(
    loader: Loader, bound: float, part: Any, users: pd.Series | None, basis: np.ndarray
) -> np.ndarray:
    """One partition read from its source, weighted and multiplied (runs on a worker)."""
    return _weighted_product(_load_weighted(loader, bound, part, users), basis)


def _load_weighted(
    loader: Loader, bound: float, part: Any, users: pd.Series | None
) -> tuple[np.ndarray, np.ndarray]:
    """A partition's rows as the source gives them (:func:`load_native`: float32 stays float32,
    never modified, no copy) and each row's weight ``w`` (float64): ``Σ w xxᵀ`` is the Gram
    matrix of the rows clipped to ``bound`` and scaled by 1/bound
    (:func:`~dpsub_dist.engine.gram.clip_weights`, ``w‖x‖² ≤ 1`` exactly); at user level
    (``users``: every user's Σ‖x‖² of those clipped rows) also divided by ``max(1, Σ‖x‖²)``
    of the row's user, as :func:`~dpsub_dist.engine.gram.user_scale` scales gauss's rows."""
    rows, units = load_native(loader, part)
    rows, weights = clip_weights(rows, bound)
    if users is not None:
        weights /= user_totals(units, users)
    return rows, weights


NORM_CHUNK_BYTES = 4 * 2**20
"""float64 rows :func:`_counted_rows` converts at a time to take their norms (cache-sized)."""


def _counted_rows(loader: Loader, part: Any) -> tuple[np.ndarray, np.ndarray]:
    """A partition's rows in their own precision (:func:`load_native`, as an iteration pass
    reads them) and their norms exactly as the separate counting pass takes them
    (:func:`~dpsub_dist.privacy.norm_bound.norm_counts` of ``loader(part)``'s float64 rows:
    :func:`row_norms`), so that both passes bin every row alike, on a bin's edge too. Float32
    rows are converted (and, centred, shifted by the float64 mean) a few rows at a time, as
    the loader's float64 rows would be: per row the same float64 values and the same sum."""
    if isinstance(loader, centring.CentredLoader):  # the partition is read once either way
        rows, base, _ = loader.native_with_source(part)
        shift = loader.mean
    else:
        rows = base = load_native(loader, part)[0]
        shift = 0.0
    if rows.dtype != np.float32:  # the loader's own float64 rows
        return tame_rows(rows, row_norms(rows))
    step = max(1, NORM_CHUNK_BYTES // (8 * max(base.shape[1], 1)))
    norms = [
        row_norms(np.asarray(base[s : s + step], dtype=np.float64) - shift)
        for s in range(0, len(base), step)
    ]
    return rows, np.concatenate(norms) if norms else np.zeros(0)


def _level_products(loader: Loader, part: Any, basis: np.ndarray) -> LevelProducts:
    """One partition's counts and per-bin products with ``V₀`` (runs on a worker)."""
    rows, norms = _counted_rows(loader, part)
    return level_products(rows, norms, basis)


class RowPasses:
    """One pass over the clipped rows per call: ``Σ_p X_pᵀ(w ⊙ X_p V)`` summed on the workers.

    ``loader`` gives the rows (centred by the released mean when centring). Holds the cached
    rows and weights (futures on the workers, or arrays in process) when they fit.
    ``bound`` None: the private bound is released by :meth:`fused_first` (the bound's counts
    and the first product in one read, :func:`fuse_bound`) before the first call.
    ``user_level``: one extra pass first sums each user's squared norms of the clipped rows (a
    per-user table kept on the workers, :func:`dpsub_dist.engine.gram.user_squared_norms`),
    and every pass divides each row's weight by its user's ``max(1, total)``
    (:func:`dpsub_dist.engine.gram.user_totals`), as gauss's Gram pass scales the rows.
    """

    def __init__(
        self,
        dataset: Dataset,
        loader: Loader,
        bound: float | None,
        executor: Executor,
        progress: bool,
        user_level: bool = False,
    ) -> None:
        self.dataset, self.loader, self.bound = dataset, loader, bound
        self._loader = one_key(loader)  # one key, not walked per task (:func:`one_key`)
        self.executor, self.progress, self.user_level = executor, progress, user_level
        self.passes = 0
        # Time and memory only, never a published value (n is private at user level: the
        # choice is operator-side there, like the wall-clock time it changes).
        self.cached = rows_fit(dataset.n_rows, dataset.dim, executor)
        self._rows: list[Any] | None = None
        self._users: Any = None
        self._first: tuple[np.ndarray, np.ndarray] | None = None

    def fused_first(self, basis: np.ndarray, release: Callable[[np.ndarray], float]) -> float:
        """The bound's pass and the first iteration's in one read (row level, rows not held):
        every partition's norm counts on the public grid and, per filled bin, ``Σ x(xᵀV₀)``
        and ``Σ x(xᵀV₀)/‖x‖²`` (:class:`~dpsub_dist.methods._norm_pass.LevelProducts`),
        tree-summed and held on the workers. ``release`` turns the summed counts into the
        bound (the sparse vector, charged there); then only ``C V₀`` at that bound reaches
        the driver, and the first call with ``basis`` returns it. Returns the bound.

        Privacy: unchanged from the two passes. The counts are the counting pass's exactly
        (:func:`_counted_rows`: the same float64 norms, so the same bins), so the bound is the
        same release of them, at the same cost, with the same draws in the same order. The
        product is ``m·(Σ_{bins ≤ B} Σ x(xᵀV₀)/B² + Σ_{bins > B} Σ x(xᵀV₀)/‖x‖²)`` — B is a
        grid value, so every bin lies wholly on one side of it — which is
        ``Σ w x(xᵀV₀)`` with the iteration's weights ``w = m/max(‖x‖, B)²``: the same function
        of the rows and B up to float rounding (rows added by bin, then scaled), so its
        sensitivity and its noise are the first iteration's (:mod:`dpsub_dist.privacy.noisy_power`).
        ``V₀`` is public (the public seed), fixed before any read. The per-bin sums, which may
        hold a single row, are never published and never leave the workers; the driver
        receives the counts (as from the separate pass) and the one D × k′ product."""
        self.passes += 1
        label = f"{len(self.dataset.parts)} partitions → row-norm counts and per-bin C·V₀"
        shared = dask.delayed(basis, pure=True)
        counts, held = held_levels(
            _level_products,
            LevelProducts.__add__,
            self.dataset.parts,
            self.loader,
            self.executor,
            self.progress,
            label,
            shared,
        )
        self.bound = release(counts)
        self._first = (basis, gather_clipped_product(held, self.bound, self.executor))
        return self.bound

    def _user_norms(self) -> Any:
        """User level: each user's Σ‖x‖² of clipped, scaled rows, on the workers (None at row
        level)."""
        if not self.user_level or self._users is not None:
            return self._users
        norms = dask.delayed(user_squared_norms, pure=True)
        tasks = [norms(self._loader, self.bound, part) for part in self.dataset.parts]
        root = tree_sum(tasks, dask.delayed(add_user_norms, pure=True), tasks)
        (self._users,) = self.executor.persist([root])
        return self._users

    def _cached_rows(self) -> list[Any]:
        if self._rows is None:
            load = dask.delayed(_load_weighted, pure=True)
            users = self._user_norms()
            rows = [load(self._loader, self.bound, part, users) for part in self.dataset.parts]
            self._rows = self.executor.persist(rows)
        return self._rows

    def __call__(self, basis: np.ndarray) -> np.ndarray:
        """``C V`` of all clipped (and, at user level, per-user scaled) rows."""
        if self._first is not None and self._first[0] is basis:  # :meth:`fused_first`'s
            product, self._first = self._first[1], None
            return product
        self.passes += 1
        if not self.dataset.parts:  # user level only (n < 1 is refused at row level): C = 0
            return np.zeros_like(basis)
        label = f"{len(self.dataset.parts)} partitions → C·V (pass {self.passes})"
        shared = dask.delayed(basis, pure=True)  # one key: V is shipped once, not per task
        if self.cached:
            product = dask.delayed(_weighted_product, pure=True)
            tasks = [product(held, shared) for held in self._cached_rows()]
        else:
            product = dask.delayed(_load_product, pure=True)
            users = self._user_norms()
            tasks = [
                product(self._loader, self.bound, part, users, shared)
                for part in self.dataset.parts
            ]
        return sum_on_workers(tasks, self.executor, label, self.progress)


def fuse_bound(passes: RowPasses, width: int) -> bool:
    """Whether the private bound's pass is fused into the first iteration (public facts
    only): row level (the caller's), rows re-read every pass (not cached: held rows cost no
    read) and D·k′ small enough for the per-bin products whatever the data
    (:func:`~dpsub_dist.methods._norm_pass.fuse_level_products`). T reads of the rows
    instead of T + 1, the same released values (:meth:`RowPasses.fused_first`)."""
    return (
        not passes.cached
        and bool(passes.dataset.parts)
        and fuse_level_products(passes.dataset.dim, width)
    )


def run_power(
    config: EstimateConfig,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None,
    progress: bool,
    noise_seed: int | None,
) -> EstimateResult:
    """``--method power`` end to end (module doc; mechanism in :mod:`privacy.noisy_power`)."""
    ctx = RunContext.open(config, open_dataset, client, progress, noise_seed)
    ctx.plan(plan_shares(config))
    relation = cov.neighbours(config)
    # The T iterations' one mechanism (a grant no ρ fits: refused before any read): the bound's
    # quantile reads its σ, and it is charged and draws every iteration below.
    steps = power.power_mechanism(ctx.grant(Step.POWER), iterations(config), relation)
    dataset = ctx.dataset
    user_level = relation == "add_remove"
    # n is public at row level only: there no rows is bad input; at user level an empty input
    # is released like any other (C = 0 plus noise).
    if dataset.n_rows < 1 and not user_level:
        raise InputError(f"{dataset.input} has no rows: pass a dataset with at least one row")
    step = Step.CENTRED_NORM_BOUND if config.center else Step.NORM_BOUND
    if config.row_norm is None and not user_level:  # public n: refused before any read
        try:
            norm_epsilon = laplace_epsilon(ctx.grant(step))
            quantile = bound_quantile(steps, relation, dataset.n_rows, dataset.dim, norm_epsilon)
        except TooFewForBound as err:
            raise InputError(str(err)) from None
    k_prime, seed = width(config, dataset.dim), public_seed(config)
    start = power.start_basis(dataset.dim, k_prime, seed)
    with ctx.timed("norm_bound_s"):  # fused: the first iteration's pass too
        # Centred as gauss is: the private mean first, subtracted from every row on the workers.
        loader, centred, mean_release = centring.centre(ctx)
        if config.row_norm is None and user_level:
            try:
                released = centring.private_user_bound(
                    ctx,
                    lambda users, eps: bound_quantile(steps, relation, users, dataset.dim, eps),
                )
            except TooFewForBound as err:  # a function of the released ñ: ⊥, charged
                parameters, release = cov.too_few_users_bottom(dataset, str(err))
                return cov.without_assignment(ctx.result(None, parameters, release, 0))
            row_norm, norm_source = released.bound, USER_BOUND_SOURCE.format(q=released.quantile)
        elif config.row_norm is None:
            norm_source = BOUND_SOURCE.format(q=quantile, step=step)
            row_norm = None  # released below: by its own pass, or with the first iteration's
        else:
            row_norm, norm_source = float(config.row_norm), "public (--row-norm)"
        passes = RowPasses(dataset, loader, row_norm, ctx.executor, ctx.progress, user_level)
        fused = row_norm is None and fuse_bound(passes, k_prime)
        ctx.timings["fused_bound"] = fused  # operator-only: which passes ran
        if fused:
            row_norm = passes.fused_first(
                start,
                lambda counts: centring.release_bound(ctx, step, counts, dataset.n_rows, quantile),
            )
        elif row_norm is None:
            row_norm = centring.private_bound(ctx, step, dataset, loader, quantile=quantile)
            passes.bound = row_norm

    def multiply(basis: np.ndarray, t: int) -> np.ndarray:
        with ctx.timed(f"pass_{t}_s"):
            return passes(basis)

    release = ctx.release(
        Step.POWER,
        steps,
        lambda iterations, rng: power.noisy_power_method(
            multiply, start, config.rank, iterations, rng
        ),
    )
    top = np.maximum(release.values, 0.0)
    details: dict[str, Any] = {
        "neighbours": relation,
        **mean_release,
        "product_sensitivity": release.sensitivity,
        "noise_sigma": release.sigmas,
        "rho_per_iteration": release.rho_per_iteration,
        "explained_variance": None if user_level else (top * row_norm**2 / dataset.n_rows).tolist(),
        "explained_variance_ratio": None,
        "explained_variance_note": USER_VARIANCE_NOTE if user_level else EXPLAINED_VARIANCE_NOTE,
    }
    ctx.timings["cached_rows"] = passes.cached  # operator-only: where the rows were kept
    parameters = {
        "row_norm": row_norm,
        "row_norm_source": norm_source,
        "row_scaling": cov.ROW_SCALING[relation],
        "clipped_rows": "not counted (a count would need its own privacy budget)",
        **centred,
        "iterations": steps.iterations,
        "width": k_prime,
        "passes": passes.passes,
        "public_seed": seed,
        "start": "Haar-random orthonormal D×width from the public seed",
        "partitions": len(dataset.parts),
    }
    gathered = dataset.dim * k_prime * steps.iterations * 8
    return cov.without_assignment(ctx.result(release.basis, parameters, details, gathered))
