"""The centre on a wide table far from the origin, and on digits (docs/centring.md).

Each case runs the default (``dpsub estimate`` with no --method: gauss here) twice per seed,
in process on an in-memory array: ``single``, the one-step centre of earlier releases (the
dataset's ``refined_centre`` cleared), and ``default``, which refines the centre where the
public rule says (:func:`dpsub_dist.methods._centring.refines`). Reported per case and
variant: the median over seeds of the centre's error ``‖μ̂ − μ‖`` and of the captured
variance ``tr(V̂ᵀΣV̂)/Σ_{i≤k}λᵢ``.

Tables: ``wide``, 8,000 rows × 1,500 columns, ``μ + z·diag(96, 38)·Vᵀ + bulk`` (‖μ‖ = 350,
μ's entries lognormal, V two random orthonormal directions, z standard normal, bulk
N(0, (40/√D)²) per entry: centred row norms p50 86, p99 254, raw ≈ 360), k = 2: the numbers
of issue #29's wide table; ``digits``: scikit-learn's ``load_digits`` (1,797 × 64), k = 4.

    python -m bench.centring_wide --seeds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np

from dpsub_dist.engine.gram import gram_of
from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.evaluate import Moments, captured_variance
from dpsub_dist.job import EstimateConfig, run_estimate


def wide(seed: int = 0, rows: int = 8_000, dim: int = 1_500) -> np.ndarray:
    """The wide table far from the origin (module docstring)."""
    rng = np.random.default_rng(seed)
    mean = rng.lognormal(0.0, 1.0, dim)
    mean *= 350.0 / np.linalg.norm(mean)
    basis = np.linalg.qr(rng.standard_normal((dim, 2)))[0]
    spread = (rng.standard_normal((rows, 2)) * [96.0, 38.0]) @ basis.T
    return mean + spread + rng.standard_normal((rows, dim)) * (40.0 / math.sqrt(dim))


def digits() -> np.ndarray:
    from sklearn.datasets import load_digits

    return load_digits().data.astype(np.float64)


TABLES = {"wide": (wide, 2), "digits": (digits, 4)}


def run(rows: np.ndarray, moments: Moments, rank: int, epsilon: float, seed: int, refine: bool):
    dataset = dataclasses.replace(array_dataset(rows), refined_centre=refine)
    config = EstimateConfig(rank=rank, epsilon=epsilon, delta=1e-6, seed=seed)
    result = run_estimate(config, lambda _client: dataset)
    release, parameters = result.manifest["release"], result.manifest["parameters"]
    error = float(np.linalg.norm(np.asarray(release["mean"]) - moments.mean))
    captured = 0.0 if result.basis is None else captured_variance(result.basis, moments).ratio
    return error, captured, "refined_mean" in parameters["budget_shares"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="wide,digits")
    parser.add_argument("--epsilons", default="0.3,1")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variants", default="single,default")
    args = parser.parse_args(argv)
    print("| table | ε | variant | route | centre error ‖μ̂ − μ‖ | captured |")
    print("|---|---|---|---|---|---|")
    for name in args.tables.split(","):
        make, rank = TABLES[name]
        rows = make()
        mean = rows.mean(axis=0)
        moments = Moments(len(rows), mean, gram_of(rows - mean))
        for epsilon in (float(e) for e in args.epsilons.split(",")):
            for variant in args.variants.split(","):
                refine = variant == "default"
                runs = [run(rows, moments, rank, epsilon, s, refine) for s in range(args.seeds)]
                error = float(np.median([r[0] for r in runs]))
                captured = float(np.median([r[1] for r in runs]))
                route = "refined" if all(r[2] for r in runs) else "one step"
                each = ", ".join(f"{r[1]:.3f}" for r in runs)
                print(
                    f"| {name} | {epsilon:g} | {variant} | {route} | {error:.1f} | "
                    f"{captured:.3f} ({each}) |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
