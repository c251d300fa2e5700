"""Covariance perturbation (DTTZ14; ALGORITHMS.md §7): ``--method gauss`` and ``gap-perturb``.

Local half (:mod:`dpsub_dist.engine.gram`, on the workers): rows clipped to the public norm
bound ``B`` and scaled by 1/B, per-partition ``XᵀX`` tree-reduced to one d×d matrix (plus the
row sum when centring). Aggregate half (driver, :mod:`dpsub_dist.privacy.covariance`): an
optional Gaussian mean for centring, then Analyze Gauss (Alg. 1) or subspace perturbation with a
noisy eigengap (Alg. 2), and the top-k eigenvectors (post-processing).

Neighbours: replace one row (row level) or add/remove one user (``--unit-column``: each user's
rows are scaled together so their squared norms sum to ≤ 1). Centring needs the public row count,
so it is row level only.

Without ``--row-norm`` (row level only), ``B`` is chosen first under DP from a histogram of row
norms over a public grid (:mod:`dpsub_dist.privacy.norm_bound`, step ``norm_bound``), published,
and then used exactly like a public bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import dask
import numpy as np

from dpsub_dist.engine.gram import GramSummary, compute_gram, sum_on_workers
from dpsub_dist.engine.subsets import Loader
from dpsub_dist.errors import InputError
from dpsub_dist.linalg import top_eigenvectors
from dpsub_dist.privacy.accountant import ZCDP, Accountant, Budget
from dpsub_dist.privacy.covariance import (
    SENSITIVITY,
    Neighbours,
    analyze_gauss,
    gap_perturbation,
    gaussian_mean,
)
from dpsub_dist.privacy.noise import noise_rng
from dpsub_dist.privacy.norm_bound import NORM_QUANTILE, norm_counts, private_norm_bound

if TYPE_CHECKING:  # job imports this module to register the runners
    from dpsub_dist.engine.sources import Dataset
    from dpsub_dist.job import EstimateConfig, EstimateResult

COVARIANCE_METHODS = ("gauss", "gap-perturb")
ROW_NORM_METHODS = (*COVARIANCE_METHODS, "power")
"""Methods that clip rows to --row-norm and may --center (power: estimators/power.py)."""

MEAN_SHARE = 0.2
"""Share of the budget spent on the mean when centring (its error enters only as n‖μ̂ − μ‖²)."""

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


def check_options(config: EstimateConfig) -> None:
    """Parameter checks of this family, and refusal of its options on other methods."""
    if config.method not in ROW_NORM_METHODS:
        if config.row_norm is not None:
            raise InputError(
                f"--row-norm applies to --method gauss, gap-perturb or power only: "
                f"drop it for --method {config.method}"
            )
        if config.center:
            raise InputError(
                f"--center applies to --method gauss, gap-perturb or power only: "
                f"drop it for --method {config.method}"
            )
        return
    if config.row_norm is None:
        if config.unit_column:
            raise InputError(
                f"--method {config.method} at user level needs a public bound on row norms: "
                "pass --row-norm B (the private bound is row level only)"
            )
    else:
        try:
            bound = float(config.row_norm)
        except (TypeError, ValueError):
            bound = math.nan
        if isinstance(config.row_norm, bool) or not (math.isfinite(bound) and bound > 0):
            raise InputError(
                f"--row-norm must be a positive finite number (got {config.row_norm!r}): "
                "pass e.g. --row-norm 10"
            )
    if config.center and config.unit_column:
        raise InputError(
            "--center is row level only: the private mean needs the public row count, which "
            "user level does not have; drop --center or --unit-column"
        )
    for flag, value in (
        ("--subsets", config.subsets),
        ("--ref-points", config.ref_points),
        ("--radius/--cell-side", config.scale),
    ):
        if value is not None:
            raise InputError(
                f"{flag} applies to friendly/histogram only: drop it for --method {config.method}"
            )
    if config.assign != "random":
        raise InputError(
            f"--assign applies to friendly/histogram only: drop it for --method {config.method}"
        )


def neighbours(config: EstimateConfig) -> Neighbours:
    """The neighbour relation every constant is calibrated for (ALGORITHMS.md §0)."""
    return "add_remove" if config.unit_column else "replace"


def budget_plan(
    method: str, center: bool, zcdp: bool, private_norm: bool = False
) -> dict[str, tuple[float, float]]:
    """Each step's (share of ε or ρ, share of δ); zCDP Gaussians need no δ, the gap test does.

    ``private_norm`` (no ``--row-norm``): the pure-DP ``norm_bound`` step first, NORM_SHARE of
    ε or ρ and no δ, the other steps scaled by the rest.
    """
    delta_share = 0.0 if zcdp else 1.0
    if method == "gauss":
        steps = {"gram_noise": (1.0, delta_share)}
    else:
        steps = {
            "gap_test": (GAP_TEST_SHARE, 1.0 if zcdp else 0.5),
            "projector_noise": (1.0 - GAP_TEST_SHARE, 0.0 if zcdp else 0.5),
        }
    if center:
        rest = 1.0 - MEAN_SHARE
        steps = {name: (p * rest, q * rest) for name, (p, q) in steps.items()}
        steps = {"mean": (MEAN_SHARE, MEAN_SHARE * delta_share), **steps}
    if private_norm:
        rest = 1.0 - NORM_SHARE
        steps = {"norm_bound": (NORM_SHARE, 0.0)} | {
            name: (p * rest, q) for name, (p, q) in steps.items()
        }
    return steps


def plan_budget(config: EstimateConfig) -> tuple[Accountant, dict[str, Budget]]:
    """Split the run's budget between the steps; checked before any data is read."""
    total = config.budget()
    accountant = Accountant(total)
    shares = budget_plan(
        config.method, config.center, isinstance(total, ZCDP), config.row_norm is None
    )
    grants = accountant.split(shares)
    if not accountant.can_afford(grants):
        raise InputError("the budget plan exceeds the budget: this is a bug, please report it")
    return accountant, grants


def released_variance(
    top_values: np.ndarray,
    trace: float,
    row_norm: float,
    n_rows: int,
    relation: Neighbours,
) -> dict[str, Any]:
    """Explained variance of the released components, from the released noisy matrix only.

    Post-processing of Analyze Gauss's output (no privacy cost): ``top_values`` are the top-k
    eigenvalues of the released ``AᵀA + E`` (minus ``n·μ̂μ̂ᵀ`` from the released mean when
    centring) and ``trace`` its trace; the exact Gram never enters. Negative noisy eigenvalues
    are clipped to 0 and the total is at least the sum of the top k, so the ratios are
    non-negative, sorted descending (the components' order) and sum to ≤ 1. Variances are in
    input units, ``row_norm²·λ/n`` (rows as clipped to ``row_norm``; divided by n, not n − 1):
    ``row_norm`` and, at row level, ``n`` are public. At user level n is private, so only the
    ratio (which does not need it) is released.
    """
    top = np.maximum(np.asarray(top_values, dtype=np.float64), 0.0)
    total = max(float(trace), float(top.sum()))
    ratio = top / total if total > 0 else np.zeros_like(top)
    while ratio.sum() > 1.0:  # rounding: step the total up by ulps until Σ ratio ≤ 1 exactly
        total = float(np.nextafter(total, np.inf))
        ratio = top / total
    variance = None
    if relation == "replace" and n_rows > 0:
        variance = (top * (row_norm**2 / n_rows)).tolist()
    return {
        "explained_variance": variance,
        "explained_variance_ratio": ratio.tolist(),
        "explained_variance_note": EXPLAINED_VARIANCE_NOTE[relation],
    }


EXPLAINED_VARIANCE_NOTE = {
    "replace": "eigenvalues of the released noisy matrix × row_norm²/n (rows clipped to "
    "row_norm), clipped at 0; ratio to its trace: post-processing, no privacy cost",
    "add_remove": "ratio only (top eigenvalues of the released noisy matrix to its trace): "
    "the variance itself needs the row count, private at user level",
    "gap-perturb": "not released: gap-perturb releases a noisy projector, whose eigenvalues "
    "(about 1 and 0) say nothing of the variance; a private one would need its own budget",
}


def release_basis(
    summary: GramSummary,
    method: str,
    rank: int,
    n_rows: int,
    relation: Neighbours,
    accountant: Accountant,
    grants: dict[str, Budget],
    rng: np.random.Generator,
    row_norm: float = 1.0,
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Driver half: private mean (if centring), Alg. 1 or Alg. 2, top-k eigenvectors.

    The mean is released in input units (``row_norm`` × the scaled rows' mean), on the noise
    grid; the centring shift is computed from that released mean (post-processing).
    """
    sens = SENSITIVITY[relation]
    details: dict[str, Any] = {"neighbours": relation}
    shift = 0.0
    if summary.row_sum is not None:
        if sens.row_sum is None:
            raise InputError("centring is not available at user level: drop --center")
        accountant.charge("mean", grants["mean"])
        mean = gaussian_mean(
            summary.row_sum, n_rows, grants["mean"], sens.row_sum, rng, unit=row_norm
        )
        scaled = mean.mean / row_norm
        shift = n_rows * np.outer(scaled, scaled)
        details.update(mean_sensitivity=mean.sensitivity, mean_noise_sigma=mean.sigma)
        details["mean"] = mean.mean.tolist()
        details["mean_note"] = "private mean of the rows clipped to norm ≤ row_norm, input units"
    if method == "gauss":
        accountant.charge("gram_noise", grants["gram_noise"])
        noisy = analyze_gauss(summary.gram, grants["gram_noise"], sens.gram, rng)
        details.update(gram_sensitivity=noisy.sensitivity, gram_noise_sigma=noisy.sigma)
        released = noisy.matrix - shift  # from released values only: noisy Gram, noisy mean
        values, basis = top_eigenvectors(released, rank)
        details.update(
            released_variance(values, float(np.trace(released)), row_norm, n_rows, relation)
        )
        return basis, details
    accountant.charge("gap_test", grants["gap_test"])
    accountant.charge("projector_noise", grants["projector_noise"])
    release = gap_perturbation(
        summary.gram - shift, rank, grants["gap_test"], grants["projector_noise"], relation, rng
    )
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
        details.update(failed_step="gap_test", failure_reason=NO_GAP_REASON)
    return release.basis, details


NORM_SOURCE = (
    f"private (step norm_bound): the smallest value 2^-10·√2^j (j = 0…100) at which the noisy "
    f"count of rows with norm ≤ it reaches {NORM_QUANTILE}·n (sparse vector)"
)


def compute_norm_counts(
    parts: list[Any], loader: Loader, client: Any | None, progress: bool
) -> np.ndarray:
    """Row counts per bin of the public norm grid (:func:`norm_counts`), summed on the workers.

    Only the grid's 102 integer counts reach the driver (operator-only, never published).
    """
    count = dask.delayed(_partition_norm_counts, pure=True)
    tasks = [count(loader, part) for part in parts]
    return sum_on_workers(tasks, client, f"{len(parts)} partitions → row-norm counts", progress)


def _partition_norm_counts(loader: Loader, part: Any) -> np.ndarray:
    return norm_counts(loader(part)[0])


def run_covariance(
    config: EstimateConfig,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None,
    progress: bool,
    noise_seed: int | None,
) -> EstimateResult:
    """``gauss`` (DTTZ14 Alg. 1) or ``gap-perturb`` (Alg. 2) end to end (ALGORITHMS.md §7)."""
    from dpsub_dist.job import EstimateResult, build_manifest, open_checked

    started = time.monotonic()
    timings: dict[str, float] = {}
    accountant, grants = plan_budget(config)
    grants_total = accountant.total
    dataset = open_checked(config, open_dataset, client)
    relation = neighbours(config)
    # No rows is bad input at row level (n is public); at user level n is private, so an
    # empty input is summarised as the zero matrix and released with noise like any other.
    if dataset.n_rows < 1 and relation == "replace":
        raise InputError(f"{dataset.input} has no rows: pass a dataset with at least one row")
    timings["inspect_s"] = time.monotonic() - started
    rng = noise_rng(noise_seed)
    if config.row_norm is None:
        mark = time.monotonic()
        counts = compute_norm_counts(dataset.parts, dataset.loader, client, progress)
        accountant.charge("norm_bound", grants["norm_bound"])
        row_norm = private_norm_bound(counts, dataset.n_rows, grants["norm_bound"], rng).bound
        norm_source = NORM_SOURCE
        timings["norm_bound_s"] = time.monotonic() - mark
    else:
        row_norm, norm_source = float(config.row_norm), "public (--row-norm)"
    mark = time.monotonic()
    if dataset.parts:
        summary = compute_gram(
            dataset.parts,
            dataset.loader,
            row_norm,
            config.center,
            relation == "add_remove",
            client,
            progress,
        )
    else:
        summary = GramSummary(np.zeros((dataset.dim, dataset.dim)))
    timings["gram_s"] = time.monotonic() - mark
    mark = time.monotonic()
    basis, release = release_basis(
        summary,
        config.method,
        config.rank,
        dataset.n_rows,
        relation,
        accountant,
        grants,
        rng,
        row_norm,
    )
    timings["aggregate_s"] = time.monotonic() - mark
    timings["total_s"] = time.monotonic() - started
    parameters = {
        "row_norm": row_norm,
        "row_norm_source": norm_source,
        "row_scaling": ROW_SCALING[relation],
        "clipped_rows": "not counted (a count would need its own privacy budget)",
        "center": config.center,
        "budget_shares": budget_plan(
            config.method, config.center, isinstance(grants_total, ZCDP), config.row_norm is None
        ),
        "partitions": len(dataset.parts),
    }
    manifest = build_manifest(
        config, dataset, accountant, basis is not None, parameters, release, summary.nbytes
    )
    manifest["privacy"].pop("assignment", None)  # no subsets in this family
    return EstimateResult(basis, manifest, timings)


run_gauss = run_covariance
"""``--method gauss``: DTTZ14 Alg. 1 (Analyze Gauss)."""

run_gap_perturb = run_covariance
"""``--method gap-perturb``: DTTZ14 Alg. 2 (subspace perturbation with a noisy eigengap)."""
