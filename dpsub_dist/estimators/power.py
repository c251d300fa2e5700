"""``--method power``: the private noisy power method on the Dask engine (docs/power.md).

Mechanism and privacy argument: :mod:`dpsub_dist.privacy.power`. This module runs it: each
iteration is one pass over the rows on the workers, where every partition computes
``Xₚᵀ(Xₚ V)`` (``D × k'``) for the current public iterate ``V`` of its clipped, scaled rows
(:func:`dpsub_dist.engine.gram.clip_rows`), and the partial products are tree-summed on the
workers (:func:`dpsub_dist.engine.gram.sum_on_workers`): the driver receives one ``D × k'``
matrix per iteration and holds ``O(D·k')`` numbers; nothing ``D × D`` exists anywhere.

The clipped rows stay in the workers' memory between iterations when ``n·D·8`` bytes (row
count from the footers: public at row level) fit in :data:`CACHE_FRACTION` of the workers'
memory limits; otherwise every iteration reads the Parquet files again. The choice changes
time and memory only, never a published value.

Shared with gauss (reused, not copied): the private row-norm bound
(:mod:`dpsub_dist.privacy.norm_bound`, step ``norm_bound``), the private mean for centring
(:func:`dpsub_dist.privacy.covariance.gaussian_mean`, step ``mean``, released with the first
pass) and their budget shares (:func:`dpsub_dist.estimators.covariance.budget_plan`).
Row level only: user-level scaling lives inside the Gram pass of the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import dask
import numpy as np

from dpsub_dist.engine.gram import clip_rows, sum_on_workers
from dpsub_dist.engine.subsets import Loader
from dpsub_dist.errors import InputError
from dpsub_dist.estimators import covariance as cov
from dpsub_dist.privacy import power
from dpsub_dist.privacy.accountant import ZCDP, Accountant, Budget
from dpsub_dist.privacy.covariance import SENSITIVITY, gaussian_mean
from dpsub_dist.privacy.noise import noise_rng
from dpsub_dist.privacy.norm_bound import private_norm_bound

if TYPE_CHECKING:  # job imports this module to register the runner
    from dpsub_dist.engine.sources import Dataset
    from dpsub_dist.job import EstimateConfig, EstimateResult

CACHE_FRACTION = 0.25
"""Cache the clipped rows on the workers when they take at most this share of their memory."""

IN_PROCESS_CACHE_BYTES = 2**30
"""Without a cluster, cache the clipped rows in this process up to this many bytes."""

NORM_QUANTILE = 0.5
"""Share of rows the private bound covers (gauss: 0.99). Clipping half the rows keeps the
eigenvectors of elliptical data and raises the signal n·λ/B² against the √D noise: measured
captured variance 0.86 vs 0.46 at D = 10⁵, n = 10⁵, ε = 1, λᵢ = i⁻² (docs/power.md)."""

NORM_SOURCE = (
    f"private (step norm_bound): the smallest value 2^-10·√2^j (j = 0…100) at which the noisy "
    f"count of rows with norm ≤ it reaches {NORM_QUANTILE}·n (sparse vector)"
)

EXPLAINED_VARIANCE_NOTE = (
    "singular values of the last released noisy product C·V (minus the centring term) × "
    "row_norm²/n: estimates of the top eigenvalues, post-processing; the ratio needs the "
    "trace, which is not released"
)


def check_options(config: EstimateConfig) -> None:
    """Parameters of ``--method power`` (public): iterations T ≥ 1, oversample ≥ 0, row level."""
    options = (("--iterations", config.iterations, 1), ("--oversample", config.oversample, 0))
    if config.method != "power":
        for flag, value, _ in options:
            if value is not None:
                raise InputError(f"{flag} applies to --method power only: drop it")
        return
    if config.unit_column:
        raise InputError(
            "--method power is row level only for now: drop --unit-column, or use --method "
            "gauss for user-level privacy"
        )
    for flag, value, low in options:
        integer = isinstance(value, int | np.integer) and not isinstance(value, bool)
        if value is not None and not (integer and value >= low):
            raise InputError(f"{flag} must be an integer ≥ {low} (got {value!r})")


def iterations(config: EstimateConfig) -> int:
    """T, public: --iterations or :data:`power.DEFAULT_ITERATIONS`."""
    return int(config.iterations or power.DEFAULT_ITERATIONS)


def width(config: EstimateConfig, dim: int) -> int:
    """k' = k + oversample (public), at most D."""
    extra = power.DEFAULT_OVERSAMPLE if config.oversample is None else int(config.oversample)
    return min(dim, config.rank + extra)


def budget_plan(center: bool, zcdp: bool, private_norm: bool) -> dict[str, tuple[float, float]]:
    """Step shares: gauss's plan (norm bound, mean) with its Gram step as the power step."""
    plan = cov.budget_plan("gauss", center, zcdp, private_norm)
    return {("power" if step == "gram_noise" else step): share for step, share in plan.items()}


def plan_budget(config: EstimateConfig) -> tuple[Accountant, dict[str, Budget]]:
    """Split the run's budget; checked (and the power grant converted to ρ) before any read."""
    total = config.budget()
    accountant = Accountant(total)
    grants = accountant.split(
        budget_plan(config.center, isinstance(total, ZCDP), config.row_norm is None)
    )
    if not accountant.can_afford(grants):
        raise InputError("the budget plan exceeds the budget: this is a bug, please report it")
    power.iteration_grant(grants["power"], iterations(config))  # fails on a bad grant, early
    return accountant, grants


def _product(rows: np.ndarray, basis: np.ndarray, with_sum: bool) -> np.ndarray:
    """``Xᵀ(X V)`` (``D × k'``), with ``Σ x`` appended as a last column when ``with_sum``."""
    product = rows.T @ (rows @ basis)
    return np.column_stack([product, rows.sum(axis=0)]) if with_sum else product


def _load_product(
    loader: Loader, bound: float, part: Any, basis: np.ndarray, with_sum: bool
) -> np.ndarray:
    """One partition read from its source, clipped and multiplied (runs on a worker)."""
    return _product(_load_clipped(loader, bound, part), basis, with_sum)


def _load_clipped(loader: Loader, bound: float, part: Any) -> np.ndarray:
    return clip_rows(loader(part)[0], bound)


class RowPasses:
    """One pass over the clipped rows per call: ``Σ_p X_pᵀ(X_p V)`` summed on the workers.

    Holds the cached rows (futures on the workers, or arrays in process) when they fit.
    """

    def __init__(self, dataset: Dataset, bound: float, client: Any | None, progress: bool) -> None:
        self.dataset, self.bound, self.client, self.progress = dataset, bound, client, progress
        self.passes = 0
        need = dataset.n_rows * dataset.dim * 8  # n public at row level: a public decision
        if client is None:
            self.cached = need <= IN_PROCESS_CACHE_BYTES
        else:
            workers = client.scheduler_info()["workers"].values()
            limit = sum(int(w.get("memory_limit") or 0) for w in workers)
            self.cached = need <= CACHE_FRACTION * limit
        self._rows: list[Any] | None = None

    def _cached_rows(self) -> list[Any]:
        if self._rows is None:
            load = dask.delayed(_load_clipped, pure=True)
            rows = [load(self.dataset.loader, self.bound, part) for part in self.dataset.parts]
            if self.client is None:
                self._rows = [r.compute(scheduler="sync") for r in rows]
            else:
                self._rows = list(self.client.persist(rows))
        return self._rows

    def __call__(self, basis: np.ndarray, with_sum: bool = False) -> np.ndarray:
        """``C V`` (and ``Σ x`` as an extra column) of all clipped rows."""
        self.passes += 1
        label = f"{len(self.dataset.parts)} partitions → C·V (pass {self.passes})"
        if self.cached and self.client is None:
            return sum(_product(rows, basis, with_sum) for rows in self._cached_rows())
        shared = dask.delayed(basis, pure=True)  # one key: V is shipped once, not per task
        if self.cached:
            product = dask.delayed(_product, pure=True)
            tasks = [product(rows, shared, with_sum) for rows in self._cached_rows()]
        else:
            product = dask.delayed(_load_product, pure=True)
            tasks = [
                product(self.dataset.loader, self.bound, part, shared, with_sum)
                for part in self.dataset.parts
            ]
        return sum_on_workers(tasks, self.client, label, self.progress)


def run_power(
    config: EstimateConfig,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None,
    progress: bool,
    noise_seed: int | None,
) -> EstimateResult:
    """``--method power`` end to end (module doc; mechanism in :mod:`privacy.power`)."""
    from dpsub_dist.job import EstimateResult, build_manifest, open_checked, public_seed

    started = time.monotonic()
    timings: dict[str, Any] = {}
    accountant, grants = plan_budget(config)
    total = accountant.total
    dataset = open_checked(config, open_dataset, client)
    if dataset.n_rows < 1:
        raise InputError(f"{dataset.input} has no rows: pass a dataset with at least one row")
    relation = cov.neighbours(config)
    steps, k_prime, seed = iterations(config), width(config, dataset.dim), public_seed(config)
    rng = noise_rng(noise_seed)
    if config.row_norm is None:
        mark = time.monotonic()
        counts = cov.compute_norm_counts(dataset.parts, dataset.loader, client, progress)
        accountant.charge("norm_bound", grants["norm_bound"])
        bound = private_norm_bound(
            counts, dataset.n_rows, grants["norm_bound"], rng, quantile=NORM_QUANTILE
        )
        row_norm, norm_source = bound.bound, NORM_SOURCE
        timings["norm_bound_s"] = time.monotonic() - mark
    else:
        row_norm, norm_source = float(config.row_norm), "public (--row-norm)"
    passes = RowPasses(dataset, row_norm, client, progress)
    details: dict[str, Any] = {"neighbours": relation}
    mean: list[np.ndarray] = []

    def multiply(basis: np.ndarray, t: int) -> np.ndarray:
        mark = time.monotonic()
        product = passes(basis, with_sum=config.center and t == 1)
        timings[f"pass_{t}_s"] = time.monotonic() - mark
        if config.center and t == 1:
            product, row_sum = product[:, :-1], product[:, -1]
            accountant.charge("mean", grants["mean"])
            release = gaussian_mean(
                row_sum,
                dataset.n_rows,
                grants["mean"],
                SENSITIVITY[relation].row_sum,
                rng,
                unit=row_norm,
            )
            mean.append(release.mean / row_norm)  # released mean, in scaled units
            details.update(
                mean=release.mean.tolist(),
                mean_note="private mean of the rows clipped to norm ≤ row_norm, input units",
                mean_sensitivity=release.sensitivity,
                mean_noise_sigma=release.sigma,
            )
        return product

    def charge(t: int) -> None:
        if isinstance(total, ZCDP):  # compose in zCDP: ρ_power/T per iteration
            accountant.charge(f"power_iteration_{t}", power.iteration_grant(grants["power"], steps))
        elif t == 1:  # (ε_p, δ_p) covers the T iterations (CKS conversion of T·ρ_it)
            accountant.charge("power_iterations", grants["power"])

    def shift(basis: np.ndarray) -> np.ndarray:
        return dataset.n_rows * np.outer(mean[0], mean[0] @ basis)

    release = power.noisy_power_method(
        multiply,
        power.start_basis(dataset.dim, k_prime, seed),
        config.rank,
        steps,
        grants["power"],
        relation,
        rng,
        charge,
        shift if config.center else None,
    )
    top = np.maximum(release.values, 0.0)
    details.update(
        product_sensitivity=release.sensitivity,
        noise_sigma=release.sigma,
        rho_per_iteration=release.rho_per_iteration,
        explained_variance=(top * row_norm**2 / dataset.n_rows).tolist(),
        explained_variance_ratio=None,
        explained_variance_note=EXPLAINED_VARIANCE_NOTE,
    )
    timings["cached_rows"] = passes.cached  # operator-only: where the rows were kept
    timings["total_s"] = time.monotonic() - started
    parameters = {
        "row_norm": row_norm,
        "row_norm_source": norm_source,
        "row_scaling": cov.ROW_SCALING[relation],
        "clipped_rows": "not counted (a count would need its own privacy budget)",
        "center": config.center,
        "iterations": steps,
        "width": k_prime,
        "passes": passes.passes + (config.row_norm is None),
        "public_seed": seed,
        "start": "Haar-random orthonormal D×width from the public seed",
        "budget_shares": budget_plan(
            config.center, isinstance(total, ZCDP), config.row_norm is None
        ),
        "partitions": len(dataset.parts),
    }
    gathered = dataset.dim * (k_prime * steps + config.center) * 8
    manifest = build_manifest(config, dataset, accountant, True, parameters, details, gathered)
    manifest["privacy"].pop("assignment", None)  # no subsets in this method
    return EstimateResult(release.basis, manifest, timings)
