"""Simulated ``--method power`` on a population covariance: sweep T, k′ and the bound's quantile.

The mechanism is the library's own (:func:`dpsub_dist.privacy.power.noisy_power_method`: the
budget plan of an uncentred run with a private bound, σ per iteration from the power grant,
the public Haar start, QR, Rayleigh–Ritz in the last release); only the product ``C·V`` is not
computed from rows but from the population: ``C = n·E[x xᵀ·min(1, B²/‖x‖²)]/B²`` for
``x ~ N(0, diag(λ))``, ``λᵢ = i^(−α)`` (diagonal by sign symmetry; its top ``--exact`` entries by
Monte Carlo, the rest as ``λᵢ·E[min(1, B²/‖x‖²)]``). ``B`` is the bound the private search
would find: the ``q``-quantile of ‖x‖ rounded up to the public √2 grid (the sparse vector's count
error at n = 10⁵ is ~0.1% of the rows). At n = D = 10⁵ the sample Gram is within a few percent
of ``n·Σ`` in the top directions (effective rank tr Σ/λ₁ ≈ 1.6), so the population stands in
for the rows. The noise is a continuous Gaussian of the run's σ (the grid sampler draws the
same distribution on a 2⁻³⁰σ grid), unless ``--exact-noise``.

Score: captured variance ``tr(V̂ᵀΣV̂)/Σ_{i≤k}λᵢ`` (the non-private top-k captures 1).

Example (docs/power.md):
``nice -n 19 python -m bench.power_sim --dims 100000 --iterations 2,3,4,6 --widths 11,32,64``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import time
from collections.abc import Iterator

import numpy as np

from dpsub_dist.estimators import power as runner
from dpsub_dist.estimators.common import plan
from dpsub_dist.job import EstimateConfig
from dpsub_dist.privacy import power
from dpsub_dist.privacy.norm_bound import GRID


def spectrum(dim: int, decay: float) -> np.ndarray:
    return np.arange(1, dim + 1, dtype=np.float64) ** -decay


def clipped_second_moment(
    lam: np.ndarray, quantile: float, exact: int, draws: int, seed: int
) -> tuple[float, np.ndarray]:
    """(B, diag of E[x xᵀ min(1, B²/‖x‖²)]/B²) for x ~ N(0, diag(λ)), B on the public grid."""
    rng = np.random.default_rng(seed)
    top = lam[:exact]
    tail = float(lam[exact:].sum())  # Σ_{i>m} λᵢ zᵢ²: concentrated, its mean stands in
    squares = np.empty((draws, len(top)))
    for start in range(0, draws, 2000):
        z = rng.standard_normal((min(2000, draws - start), len(top)))
        squares[start : start + len(z)] = top * z**2
    norms2 = squares.sum(axis=1) + tail
    bound = float(GRID[np.searchsorted(GRID, np.sqrt(np.quantile(norms2, quantile)))])
    weight = np.minimum(1.0, bound**2 / norms2)
    moment = np.empty_like(lam)
    moment[:exact] = (squares * weight[:, None]).mean(axis=0)
    moment[exact:] = lam[exact:] * weight.mean()
    return bound, moment / bound**2


@contextlib.contextmanager
def continuous_noise() -> Iterator[None]:
    """The run's σ, drawn as a continuous Gaussian (fast; same law up to the 2⁻³⁰σ grid)."""
    real = power.PowerIterations.release

    def release(self, rng, product):
        return product + self.sigma * rng.standard_normal(product.shape)

    power.PowerIterations.release = release
    try:
        yield
    finally:
        power.PowerIterations.release = real


def simulate(
    lam: np.ndarray,
    moment: np.ndarray,
    rows: int,
    rank: int,
    iterations: int,
    width: int,
    epsilon: float,
    delta: float,
    seed: int,
    public_bound: float | None = None,
) -> float:
    """One run's captured variance (module doc); ``public_bound``: a --row-norm run (no
    private bound step: the whole budget goes to the iterations)."""
    config = EstimateConfig(
        rank=rank,
        method="power",
        epsilon=epsilon,
        delta=delta,
        iterations=iterations,
        row_norm=public_bound,
    )
    _, grants = plan(config, runner.plan_shares(config))
    diag = rows * moment[:, None]
    release = power.noisy_power_method(
        lambda basis, t: diag * basis,
        power.start_basis(len(lam), width, seed),
        rank,
        iterations,
        grants["power"],
        "replace",
        np.random.default_rng([seed, 99]),
    )
    basis = release.basis
    return float(np.sum(lam[:, None] * basis**2) / lam[:rank].sum())


def int_list(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",")]


def float_list(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int_list, default=[100_000])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--ranks", type=int_list, default=[3])
    parser.add_argument("--decay", type=float, default=2.0)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--iterations", type=int_list, default=[2, 3, 4, 6])
    parser.add_argument("--widths", type=int_list, default=[0], help="k′ (0: k + default)")
    parser.add_argument("--quantiles", type=float_list, default=[0.5])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--exact", type=int, default=2000, help="coordinates by Monte Carlo")
    parser.add_argument("--draws", type=int, default=20_000)
    parser.add_argument("--exact-noise", action="store_true")
    parser.add_argument(
        "--public-bound", action="store_true", help="B passed as --row-norm (no norm_bound step)"
    )
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)
    records = []
    noise = contextlib.nullcontext() if args.exact_noise else continuous_noise()
    with noise:
        for dim, q in itertools.product(args.dims, args.quantiles):
            lam = spectrum(dim, args.decay)
            bound, moment = clipped_second_moment(lam, q, min(dim, args.exact), args.draws, 0)
            for rank, steps, width in itertools.product(args.ranks, args.iterations, args.widths):
                k_prime = min(dim, width or rank + power.DEFAULT_OVERSAMPLE)
                if k_prime < rank:
                    continue
                mark = time.monotonic()
                scores = [
                    simulate(
                        *(lam, moment, args.rows, rank, steps, k_prime, args.epsilon, args.delta),
                        seed,
                        bound if args.public_bound else None,
                    )
                    for seed in range(args.runs)
                ]
                record = {
                    "dim": dim,
                    "rows": args.rows,
                    "rank": rank,
                    "quantile": q,
                    "bound": bound,
                    "iterations": steps,
                    "width": k_prime,
                    "public_bound": args.public_bound,
                    "captured_mean": float(np.mean(scores)),
                    "captured_min": float(min(scores)),
                    "captured": scores,
                }
                records.append(record)
                print(
                    f"D={dim} k={rank} q={q} B={bound:.3g} T={steps} k'={k_prime}: "
                    f"captured {np.mean(scores):.3f} (min {min(scores):.3f}) "
                    f"[{time.monotonic() - mark:.0f}s]",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"argv": argv, "records": records}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
