"""One partition of ``--method power``, stage by stage: where a pass's time goes at wide D.

A block of ``--rows`` float32 rows of ``bench.power``'s data (``x ~ N(0, diag(i⁻²))``) is
generated, then each stage of one iteration's partition task is timed with one BLAS thread (as
on a worker), in two forms, interleaved ``--repeats`` times (medians; CPU seconds of this
process, which on a shared machine move much less than wall seconds):

- ``float64``: the loader's float64 copy (with its NaN check), a clipped float64 copy
  (``clip_rows``), ``Z V`` and ``Zᵀ(Z V)`` by DGEMM — the product before the float32 path;
- ``native``: the float32 rows as generated (NaN check only), the clipping weights
  (``clip_weights``: norms accumulated in float64), ``X V``, the weighting and ``Xᵀ(w ⊙ X V)``
  by SGEMM — :func:`dpsub_dist.estimators.power._load_product` now.

Also the ``D × k'`` float64 addition of the tree sum. Example (docs/power.md):
``nice -n 10 python -m bench.power_profile --dims 10000,100000 --rows 1000``.
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
    """The stages of both forms, each a closure over the previous stage's output."""
    from dpsub_dist.engine.gram import clip_rows, clip_weights
    from dpsub_dist.engine.sources import array_dataset, load_native

    loader = array_dataset(block).loader
    held: dict[str, Any] = {}
    basis32 = basis.astype(np.float32)

    def put(name: str, value: Any) -> Any:
        held[name] = value
        return value

    return {
        "float64: loader (float64 copy + NaN check)": lambda: put("x64", loader(block)[0]),
        "float64: clip_rows (norms + clipped copy)": lambda: put(
            "z", clip_rows(held["x64"], bound)
        ),
        "float64: Z V (DGEMM)": lambda: put("y64", held["z"] @ basis),
        "float64: Zᵀ(Z V) (DGEMM)": lambda: held["z"].T @ held["y64"],
        "native: loader (NaN check, no copy)": lambda: put("x32", load_native(loader, block)[0]),
        "native: clip_weights (float64 norms)": lambda: put("w", clip_weights(held["x32"], bound)),
        "native: X V (SGEMM)": lambda: put("y32", held["x32"] @ basis32),
        "native: weighting + Xᵀ(w ⊙ X V) (SGEMM)": lambda: np.asarray(
            held["x32"].T @ (held["y32"] * held["w"][:, None]).astype(np.float32), np.float64
        ),
        "tree sum: D × k' float64 addition": lambda: basis + basis,
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
            for form in ("float64", "native"):
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
