"""Simulated ``--method power`` on a population covariance: sweep T, k′, the bound, the plan.

The mechanism is the library's own (:func:`dpsub_dist.privacy.power.noisy_power_method`: the
run's budget plan, :func:`dpsub_dist.estimators.power.plan_shares`, with a private bound,
uncentred or centred (``--center``), each iteration's σ_t from the power grant and its split,
the public Haar start, QR, Rayleigh–Ritz in the last release); only the product ``C·V`` is not
computed from rows but from the population: ``C = n·E[y yᵀ·min(1, B²/‖y‖²)]/B²`` for the rows
``y`` the run clips, ``x ~ N(0, diag(λ))``, ``λᵢ = i^(−α)``.

Uncentred, ``y = x``: ``C`` is diagonal by sign symmetry (its top ``--exact`` entries by Monte
Carlo, the rest as ``λᵢ·E[min(1, B²/‖x‖²)]``). Centred, ``y = x − μ̂`` with ``μ̂ = μ + e`` (the
population mean μ = 0 and the sample's own mean error, ~√(λ/n), are in the non-private centred
covariance as well): ``e ~ N(0, σ_m² I)`` is the private mean's noise, ``σ_m = B_m·σ(mean)/n``
with σ(mean) the Gaussian of the plan's ``mean`` grant at the row sum's sensitivity and ``B_m``
the raw rows' bound at the mean's quantile (:data:`~dpsub_dist.privacy.norm_bound.NORM_QUANTILE`,
as :func:`dpsub_dist.estimators.centring.centre` finds it; ``--mean-quantile`` to try another).
Then ``‖y‖² = ‖x‖² − 2x·e + ‖e‖²`` where ``x·e ~ N(0, eᵀΛe)`` is ~10⁻³ of ``‖x‖²`` (dropped),
so the rows' weight is ``w = min(1, B²/(‖x‖² + ‖e‖²))`` with ``‖e‖² ≈ D·σ_m²`` (concentrated),
even in x, and ``E[y yᵀ w] = E[x xᵀ w] + E[w]·e eᵀ``: the diagonal above, shifted, plus a rank-one
spike of size ``‖e‖²·E[w]`` in the random direction of ``e``, clipped as the rows are.

``B`` is the bound the private search would find: the ``q``-quantile of ‖y‖ rounded up to the
public √2 grid (the sparse vector's count error at n = 10⁵ is a few hundred rows), ``q`` the
run's rule (:func:`dpsub_dist.estimators.power.bound_quantile`; ``--quantiles rule``, the
default) or fixed values. At n = D = 10⁵ the sample Gram is within a few percent of ``n·Σ`` in
the top directions (effective rank tr Σ/λ₁ ≈ 1.6), so the population stands in for the rows.
The noise is a continuous Gaussian of each iteration's σ_t (the grid sampler draws the same
distribution on a 2⁻³⁰σ grid), unless ``--exact-noise``. ``--growths``, ``--norm-shares``,
``--noise-factors`` and ``--mean-shares`` set :data:`dpsub_dist.privacy.power.SPLIT_GROWTH`,
:data:`dpsub_dist.estimators.power.NORM_SHARE`, :data:`~dpsub_dist.estimators.power.NOISE_FACTOR`
and the mean's share (:data:`dpsub_dist.estimators.centring.MEAN_SHARE` as gauss's plan reads it)
for the sweep (the defaults: the library's; 1, 0.1, 1 and 0.2 were the defaults before).

Score: captured variance ``tr(V̂ᵀΣV̂)/Σ_{i≤k}λᵢ`` (the non-private top-k captures 1).

Example (docs/history.md, "The defaults" of the power method):
``nice -n 19 python -m bench.power_sim --dims 100000 --iterations 6 --center --runs 5``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import time
from collections.abc import Iterator

import numpy as np

from dpsub_dist.context import plan
from dpsub_dist.estimators import covariance as cov
from dpsub_dist.estimators import power as runner
from dpsub_dist.job import EstimateConfig
from dpsub_dist.privacy import power
from dpsub_dist.privacy.accountant import Budget, gaussian_sigma, laplace_epsilon
from dpsub_dist.privacy.covariance import SENSITIVITY
from dpsub_dist.privacy.norm_bound import GRID, NORM_QUANTILE


def spectrum(dim: int, decay: float) -> np.ndarray:
    return np.arange(1, dim + 1, dtype=np.float64) ** -decay


def squared_norms(lam: np.ndarray, exact: int, draws: int, seed: int) -> tuple[np.ndarray, float]:
    """Monte Carlo ``λᵢ zᵢ²`` of the top ``exact`` coordinates and the rest's mean squared norm."""
    rng = np.random.default_rng(seed)
    top = lam[:exact]
    squares = np.empty((draws, len(top)))
    for start in range(0, draws, 2000):
        z = rng.standard_normal((min(2000, draws - start), len(top)))
        squares[start : start + len(z)] = top * z**2
    return squares, float(lam[exact:].sum())  # Σ_{i>m} λᵢ zᵢ²: concentrated, its mean stands in


def grid_bound(norms2: np.ndarray, quantile: float) -> float:
    """The ``quantile`` of the norms rounded up to the public grid (as the search finds it)."""
    return float(GRID[np.searchsorted(GRID, np.sqrt(np.quantile(norms2, quantile)))])


def clipped_second_moment(
    lam: np.ndarray, squares: np.ndarray, tail: float, quantile: float, shift: float
) -> tuple[float, np.ndarray, float]:
    """(B, diag of E[x xᵀ w]/B², E[w]/B²) with ``w = min(1, B²/(‖x‖² + shift))`` (module doc:
    ``shift`` = ‖e‖² when centred), x ~ N(0, diag(λ)), B on the public grid."""
    exact = squares.shape[1]
    norms2 = squares.sum(axis=1) + tail + shift
    bound = grid_bound(norms2, quantile)
    weight = np.minimum(1.0, bound**2 / norms2)
    moment = np.empty_like(lam)
    moment[:exact] = (squares * weight[:, None]).mean(axis=0)
    moment[exact:] = lam[exact:] * weight.mean()
    return bound, moment / bound**2, float(weight.mean()) / bound**2


def mean_noise_sigma(grant: Budget, raw_bound: float, rows: int) -> float:
    """Per-coordinate σ of the private mean (input units): the row sum's Gaussian × B_m/n."""
    return gaussian_sigma(grant, SENSITIVITY["replace"].row_sum) * raw_bound / rows


@contextlib.contextmanager
def continuous_noise() -> Iterator[None]:
    """Each iteration's σ_t, drawn as a continuous Gaussian (fast; same law up to the grid)."""
    real = power.PowerIterations.release

    def release(self, rng, product, t):
        return product + self.sigmas[t - 1] * rng.standard_normal(product.shape)

    power.PowerIterations.release = release
    try:
        yield
    finally:
        power.PowerIterations.release = real


@contextlib.contextmanager
def defaults(growth: float, norm_share: float, factor: float, mean: float) -> Iterator[None]:
    """The split's growth, power's bound share, its rule's noise factor and the mean's share
    (gauss's plan's, which power's takes) for one sweep point."""
    saved = power.SPLIT_GROWTH, runner.NORM_SHARE, runner.NOISE_FACTOR, cov.MEAN_SHARE
    power.SPLIT_GROWTH, runner.NORM_SHARE, runner.NOISE_FACTOR = growth, norm_share, factor
    cov.MEAN_SHARE = mean
    try:
        yield
    finally:
        power.SPLIT_GROWTH, runner.NORM_SHARE, runner.NOISE_FACTOR, cov.MEAN_SHARE = saved


def run_config(
    rank: int, iterations: int, epsilon: float, delta: float, center: bool, public: float | None
) -> tuple[EstimateConfig, dict[str, Budget]]:
    """The run's config and grants (its plan: :func:`dpsub_dist.estimators.power.plan_shares`)."""
    config = EstimateConfig(
        rank=rank,
        method="power",
        epsilon=epsilon,
        delta=delta,
        iterations=iterations,
        row_norm=public,
        center=center,
    )
    return config, plan(config, runner.plan_shares(config))[1]


def simulate(
    lam: np.ndarray,
    moment: np.ndarray,
    spike: tuple[float, float],
    rows: int,
    grants: dict[str, Budget],
    rank: int,
    iterations: int,
    width: int,
    seed: int,
) -> float:
    """One run's captured variance (module doc). ``spike``: (σ_m, E[w]/B²) of the centred
    rows' ``e eᵀ`` term ((0, 0) uncentred); ``e`` is drawn from the run's seed."""
    rng = np.random.default_rng([seed, 99])
    sigma_mean, weight = spike
    e = sigma_mean * rng.standard_normal(len(lam))
    diag = rows * moment[:, None]

    def multiply(basis: np.ndarray, t: int) -> np.ndarray:
        return diag * basis + (rows * weight) * np.outer(e, e @ basis)

    release = power.noisy_power_method(
        multiply,
        power.start_basis(len(lam), width, seed),
        rank,
        power.power_mechanism(grants["power"], iterations, "replace"),
        rng,
    )
    basis = release.basis
    return float(np.sum(lam[:, None] * basis**2) / lam[:rank].sum())


def int_list(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",")]


def float_list(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def quantile_list(text: str) -> list[float | str]:
    return [v if v == "rule" else float(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int_list, default=[100_000])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--ranks", type=int_list, default=[3])
    parser.add_argument("--decay", type=float, default=2.0)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--iterations", type=int_list, default=[power.DEFAULT_ITERATIONS])
    parser.add_argument("--widths", type=int_list, default=[0], help="k′ (0: k + default)")
    parser.add_argument(
        "--quantiles", type=quantile_list, default=["rule"], help="'rule' (the run's) or values"
    )
    parser.add_argument("--center", action="store_true", help="the centred plan (module doc)")
    parser.add_argument("--mean-quantile", type=float, default=NORM_QUANTILE)
    parser.add_argument("--growths", type=float_list, default=[power.SPLIT_GROWTH])
    parser.add_argument("--norm-shares", type=float_list, default=[runner.NORM_SHARE])
    parser.add_argument("--noise-factors", type=float_list, default=[runner.NOISE_FACTOR])
    parser.add_argument("--mean-shares", type=float_list, default=[cov.MEAN_SHARE])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--exact", type=int, default=2000, help="coordinates by Monte Carlo")
    parser.add_argument("--draws", type=int, default=20_000)
    parser.add_argument("--exact-noise", action="store_true")
    parser.add_argument(
        "--public-bound", action="store_true", help="B passed as --row-norm (no bound step)"
    )
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)
    if args.public_bound and (args.center or "rule" in args.quantiles):
        parser.error("--public-bound needs fixed --quantiles and no --center")
    records = []
    noise = contextlib.nullcontext() if args.exact_noise else continuous_noise()
    sweep = itertools.product(
        args.dims,
        args.growths,
        args.norm_shares,
        args.noise_factors,
        args.mean_shares,
        args.quantiles,
        args.ranks,
        args.iterations,
    )
    with noise:
        for dim, growth, share, factor, mean, q, rank, steps in sweep:
            lam = spectrum(dim, args.decay)
            squares, tail = squared_norms(lam, min(dim, args.exact), args.draws, 0)
            with defaults(growth, share, factor, mean):
                mark = time.monotonic()
                public = None if q == "rule" or not args.public_bound else 1.0  # B set below
                config, grants = run_config(
                    rank, steps, args.epsilon, args.delta, args.center, public
                )
                sigma_mean = 0.0
                if args.center:
                    raw = grid_bound(squares.sum(axis=1) + tail, args.mean_quantile)
                    sigma_mean = mean_noise_sigma(grants["mean"], raw, args.rows)
                if q == "rule":
                    step = "centred_norm_bound" if args.center else "norm_bound"
                    epsilon = laplace_epsilon(grants[step])
                    steps_mechanism = power.power_mechanism(grants["power"], steps, "replace")
                    quantile = runner.bound_quantile(
                        steps_mechanism, "replace", args.rows, dim, epsilon
                    )
                else:
                    quantile = float(q)
                shift = dim * sigma_mean**2
                bound, moment, weight = clipped_second_moment(lam, squares, tail, quantile, shift)
                for width in args.widths:
                    k_prime = min(dim, width or rank + power.DEFAULT_OVERSAMPLE)
                    if k_prime < rank:
                        continue
                    scores = [
                        simulate(
                            *(lam, moment, (sigma_mean, weight), args.rows, grants),
                            *(rank, steps, k_prime, seed),
                        )
                        for seed in range(args.runs)
                    ]
                    record = {
                        "dim": dim,
                        "rows": args.rows,
                        "rank": rank,
                        "center": args.center,
                        "growth": growth,
                        "norm_share": share,
                        "noise_factor": factor,
                        "mean_share": mean if args.center else None,
                        "quantile": quantile,
                        "bound": bound,
                        "mean_noise_squared_norm": shift,
                        "iterations": steps,
                        "width": k_prime,
                        "public_bound": args.public_bound,
                        "captured_mean": float(np.mean(scores)),
                        "captured_std": float(np.std(scores)),
                        "captured_min": float(min(scores)),
                        "captured": scores,
                    }
                    records.append(record)
                    print(
                        f"D={dim} k={rank} center={args.center} g={growth} norm={share} f={factor} "
                        f"mean={mean if args.center else '-'} "
                        f"q={quantile:.3g} B={bound:.3g} |e|²={shift:.3g} T={steps} "
                        f"k'={k_prime}: captured {np.mean(scores):.3f} ± {np.std(scores):.3f} "
                        f"(min {min(scores):.3f}) [{time.monotonic() - mark:.0f}s]",
                        flush=True,
                    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"argv": argv, "records": records}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
