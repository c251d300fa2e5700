"""The sampled centre's correction on data sorted across partitions (docs/scale.md).

Rows: top-3 standard deviations 3, 2, 1.5 in a random subspace, 0.2 noise, an offset of 2, and
a drift of amplitude ``DRIFT`` along w ⟂ the subspace over the row order (variance DRIFT²/12):
``sorted`` rows follow the drift (the partitions' means differ along w), ``shuffled`` rows
draw it at random. n = 4·10⁵ × 16 in partitions of 25,000, ε = 1, δ = 10⁻⁶, k = 3, in process
(rows re-read, not held), through ``job.run_estimate``. Variants: ``today`` (the route without
the sample), ``sampled`` (the default), ``no_correction`` (the sample's centre, the shift
n·z̃z̃ᵀ dropped) and ``shareX`` (``CORRECTION_SHARE`` = X). Prints the median and each sin∠.

``python -m bench.sampled_centre 5.0 8`` (DRIFT, number of seeds).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from dpsub_dist.engine import row_cache, sources
from dpsub_dist.engine.sources import Dataset, array_dataset
from dpsub_dist.estimators import covariance as cov
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error

ROWS, DIM, RANK, PART_ROWS = 400_000, 16, 3, 25_000
VARIANTS = ("today", "sampled", "no_correction", "share0.25", "share0.75")


def table(seed: int, sort: bool, drift: float) -> tuple[Dataset, np.ndarray]:
    """The rows (module docstring) as partitions of PART_ROWS, and the true basis."""
    rng = np.random.default_rng(seed)
    q = np.linalg.qr(rng.standard_normal((DIM, RANK + 1)))[0]
    basis, w = q[:, :RANK], q[:, RANK]
    z = rng.standard_normal((ROWS, RANK)) * [3.0, 2.0, 1.5]
    t = np.linspace(0, 1, ROWS) if sort else rng.random(ROWS)
    rows = z @ basis.T + 0.2 * rng.standard_normal((ROWS, DIM)) + 2.0 + drift * np.outer(t, w)
    return array_dataset(rows), basis


def main(argv: list[str]) -> int:
    drift, seeds = float(argv[0]), int(argv[1])
    sources.ARRAY_PART_ROWS = PART_ROWS
    row_cache.IN_PROCESS_CACHE_BYTES = 0
    real = cov.bound_gram_and_correction

    def no_shift(*args: Any) -> Any:
        bound, quantile, gram, shift, centred = real(*args)
        return bound, quantile, gram, np.zeros_like(shift), centred

    errors: dict[tuple[str, str], list[float]] = {}
    for sort in (False, True):
        for seed in range(seeds):
            data, basis = table(seed, sort, drift)
            for variant in VARIANTS:
                cov.CORRECTION_SHARE = float(variant[5:]) if variant.startswith("share") else 0.5
                cov.bound_gram_and_correction = no_shift if variant == "no_correction" else real
                cov.SAMPLE_MIN_PARTITIONS = 10**9 if variant == "today" else 8
                config = EstimateConfig(rank=RANK, epsilon=1.0, delta=1e-6, seed=seed)
                result = run_estimate(config, lambda _e, d=data: d, None)
                error = 1.0 if result.basis is None else subspace_error(result.basis, basis)
                errors.setdefault(("sorted" if sort else "shuffled", variant), []).append(error)
    for (order, variant), values in errors.items():
        rounded = [round(v, 5) for v in values]
        print(f"{order:>8} {variant:>13}: median {np.median(values):.4f} {rounded}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
