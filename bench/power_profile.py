"""One partition of ``--method power``, stage by stage: where a pass's time goes at wide D.

A block of ``--rows`` float32 rows of ``bench.power``'s data (``x ~ N(0, diag(i⁻²))``) is
generated, then each stage of one iteration's partition task is timed with one BLAS thread (as
on a worker), in two forms, interleaved ``--repeats`` times (medians; CPU seconds of this
process, which on a shared machine move much less than wall seconds):

- ``float64``: the loader's float64 copy (with its NaN check), a clipped float64 copy
  (``clip_rows``) and ``Zᵀ(Z V)`` by two DGEMMs — the partition task before the float32 path;
- ``native``: the float32 rows as generated (NaN check by float64 row sums), the clipping
  weights (``clip_weights``: norms accumulated in float64) and ``Xᵀ(w ⊙ X V)`` by two SGEMMs —
  :func:`dpsub_dist.estimators.power._load_product` now.

Also the ``D × k'`` float64 addition of the tree sum, the partition tasks of a centred run's
three preliminary passes (bound of the raw rows, clipped row sum, bound of the centred rows:
float64, shared with gauss), the centred float32 rows of the native form and the fused first
pass's task (the bound's counts and the per-bin products with V₀, which replace a bound pass
and the first iteration's task). Example
(docs/power.md): ``nice -n 10 python -m bench.power_profile --dims 10000,100000 --rows 1000``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench import common
from bench.power import polynomial_block


def cpu_seconds(stage: Callable[[], Any]) -> tuple[float, Any]:
    start = time.process_time()
    out = stage()
    return time.process_time() - start, out


def stages(block: np.ndarray, basis: np.ndarray, bound: float) -> dict[str, Callable[[], Any]]:
    """The stages of both forms (each a closure over the previous stage's output) and the
    partition tasks of the three preliminary passes of a centred run (shared with gauss)."""
    from dpsub_dist.engine.gram import clip_rows, clip_weights
    from dpsub_dist.engine.sources import array_dataset, load_native
    from dpsub_dist.estimators import centring
    from dpsub_dist.estimators import power as runner
    from dpsub_dist.estimators.norm_pass import _partition_norm_counts

    loader = array_dataset(block).loader
    centred = centring.CentredLoader(loader, np.full(block.shape[1], 1e-3))
    held: dict[str, Any] = {}

    def put(name: str, value: Any) -> Any:
        held[name] = value
        return value

    return {
        "float64: loader (float64 copy + NaN check)": lambda: put("x64", loader(block)[0]),
        "float64: clip_rows (norms + clipped copy)": lambda: put(
            "z", clip_rows(held["x64"], bound)
        ),
        "float64: Zᵀ(Z V) (2 DGEMMs)": lambda: runner._product(held["z"], basis),
        "native: loader (NaN check by row sums, no copy)": lambda: put(
            "x32", load_native(loader, block)[0]
        ),
        "native: clip_weights (float64 norms)": lambda: put("w", clip_weights(held["x32"], bound)),
        "native: Xᵀ(w ⊙ X V) (2 SGEMMs)": lambda: runner._product(held["x32"], basis, held["w"]),
        "tree sum: D × k' float64 addition": lambda: basis + basis,
        "prelim 1: row-norm counts (float64 loader)": lambda: _partition_norm_counts(loader, block),
        "prelim 2: clipped row sum (float64 loader, clip_rows)": lambda: centring._clipped_row_sum(
            loader, bound, block
        ),
        "prelim 3: centred row-norm counts (float64)": lambda: _partition_norm_counts(
            centred, block
        ),
        "centred native rows (float32 copy minus the mean)": lambda: load_native(centred, block),
        "fused: bound counts + per-bin C·V₀ (the first pass's task)": lambda: (
            runner._level_products(loader, block, basis)
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("power_profile", __doc__.splitlines()[0])
    parser.add_argument("--dims", type=common.int_list, default=[10_000, 100_000])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--width", type=int, default=11, help="k' (power's default: k = 3 + 8)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("power_profile", args)
    from threadpoolctl import threadpool_limits

    records: list[dict[str, Any]] = []
    with threadpool_limits(limits=1, user_api="blas"):
        for dim in args.dims:
            first, block = cpu_seconds(
                lambda d=dim: polynomial_block(args.seed, 0, args.rows, d, 2.0)
            )
            rng = np.random.default_rng(args.seed)
            basis = np.linalg.qr(rng.standard_normal((dim, args.width)))[0]
            bound = float(np.median(np.linalg.norm(block[:100].astype(np.float64), axis=1)))
            times: dict[str, list[float]] = {"generate (bench source)": [first]}
            for _ in range(args.repeats):
                times["generate (bench source)"].append(
                    cpu_seconds(lambda d=dim: polynomial_block(args.seed, 0, args.rows, d, 2.0))[0]
                )
                for name, stage in stages(block, basis, bound).items():
                    times.setdefault(name, []).append(cpu_seconds(stage)[0])
            medians = {name: float(np.median(t)) for name, t in times.items()}
            for form in ("float64", "native"):  # the iteration pass's partition task
                medians[f"{form}: total"] = sum(v for k, v in medians.items() if k.startswith(form))
            for name, value in medians.items():
                ns = value / (args.rows * dim) * 1e9
                records.append({"dim": dim, "rows": args.rows, "stage": name, "cpu_s": value})
                common.log(f"D={dim} rows={args.rows} {name}: {value:.4f} s ({ns:.2f} ns/value)")
    parameters = {"dims": args.dims, "rows": args.rows, "width": args.width}
    run.write({**parameters, "repeats": args.repeats}, records, None, ())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
