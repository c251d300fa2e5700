"""Methods on a table with a large mean (docs/auto.md): error against the centred subspace.

Rows ``30 + z·diag(5, 3)·Wᵀ + 0.1·noise`` (n = 20,000, d = 8, k = 2), ε = 1, δ = 1e-6, three
private runs per case, in-process through ``job.run_estimate`` on an in-memory array.

``python -m bench.centring_offset gauss:on friendly:default friendly:off auto:default``
(each argument is METHOD:CENTER, CENTER one of on, off, default).
"""

from __future__ import annotations

import sys

import numpy as np

from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error

ROWS, DIM, RANK, RUNS = 20_000, 8, 2, 3


def table() -> tuple[np.ndarray, np.ndarray]:
    """The rows and the true centred basis (d×k)."""
    rng = np.random.default_rng(0)
    truth, _ = np.linalg.qr(rng.standard_normal((DIM, RANK)))
    rows = 30.0 + (rng.standard_normal((ROWS, RANK)) * [5.0, 3.0]) @ truth.T
    return rows + 0.1 * rng.standard_normal((ROWS, DIM)), truth


def main(argv: list[str]) -> int:
    rows, truth = table()
    for case in argv:
        method, center = case.split(":")
        given = {} if center == "default" else {"center": center == "on"}
        errors = []
        for seed in range(RUNS):
            config = EstimateConfig(
                rank=RANK, epsilon=1.0, delta=1e-6, method=method, seed=seed, **given
            )
            result = run_estimate(config, lambda _client: array_dataset(rows))
            basis = result.basis
            errors.append("⊥" if basis is None else f"{subspace_error(basis, truth):.3f}")
        print(f"{method} center={center}: {', '.join(errors)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
