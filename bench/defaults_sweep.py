"""Sweep T (subsets) and Q (reference points) for friendly: the README defaults table.

    python bench/defaults_sweep.py --rows 200000 --dim 50 --gamma 0.01 --subsets 500,1000,2000,4000
    python bench/defaults_sweep.py --rows 200000 --dim 500 --gamma 0.001 --subsets 700,1000,2000
    python bench/defaults_sweep.py --rows 20000 --dim 10 --rank 2 --gamma 0.1 \
        --subsets 676,1352 --q-multiples 4 --seeds 20

In-process (no cluster), Gaussian model with a multiplicative gap γ², K = 4, ε = 1,
δ = 1e-6; prints the median and 90th percentile of the subspace error over public seeds
(1.0 stands for ⊥) and how many runs returned ⊥.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error


def gaussian_data(n: int, d: int, k: int, gamma: float, seed: int):
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((d, k)))[0]
    noise = rng.standard_normal((n, d)) * gamma
    noise -= (noise @ basis) @ basis.T
    return rng.standard_normal((n, k)) @ basis.T + noise, basis


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=50)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--gamma", type=float, default=0.01)
    parser.add_argument("--subsets", default="500,1000,2000,4000")
    parser.add_argument("--q-multiples", default="1,2,4")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    data, truth = gaussian_data(args.rows, args.dim, args.rank, args.gamma, 0)
    for t in (int(x) for x in args.subsets.split(",")):
        for multiple in (int(x) for x in args.q_multiples.split(",")):
            q = multiple * args.rank
            errors, started = [], time.monotonic()
            for seed in range(args.seeds):
                config = EstimateConfig(
                    rank=args.rank, epsilon=1.0, delta=1e-6, seed=seed, subsets=t, ref_points=q
                )
                result = run_estimate(config, lambda client: array_dataset(data))
                errors.append(1.0 if result.basis is None else subspace_error(result.basis, truth))
            print(
                f"n={args.rows} d={args.dim} t={t} rows/subset={args.rows // t} q={q} "
                f"median={np.median(errors):.4f} p90={np.quantile(errors, 0.9):.4f} "
                f"bottom={sum(e >= 1.0 for e in errors)}/{len(errors)} "
                f"errors={[round(e, 3) for e in errors]} "
                f"{time.monotonic() - started:.1f}s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
