"""Wide data: one ``friendly`` estimate at large D, against the 10-minute target.

The target (issue 6): at D = 10⁵, n = 10⁵ the friendly estimate finishes on this machine in
under 10 minutes with error ≤ 0.2 (ε = 1, δ = 1e-6).

``--source array`` (default) feeds the library a Dask array whose blocks of ``--block-rows``
rows are generated on the workers from the Gaussian gap model (the rows never touch disk or
the driver: n = D = 10⁵ is 40 GB as float32, more than this machine's memory or a sensible
Parquet file with 10⁵ scalar columns); ``--source parquet`` generates a Parquet dataset
with ``dpsub synth`` first. ``--assign contiguous`` (default here, right for rows stored in
random order) lets the engine summarise each subset where its rows lie; ``--assign random``
shuffles rows, which holds about ``8·n·D`` bytes in worker memory, so such sizes above
``--max-data-gib`` are recorded as ``not_run_memory`` instead of being started. Runs on the
project's local process cluster, like ``dpsub estimate``; peak worker memory is polled as in
``bench.speed``.

Example (the published run): ``python -m bench.wide --rows 100000 --dims 100000``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench import common


def true_basis(seed: int, dim: int, rank: int) -> np.ndarray:
    """The model's orthonormal D×k basis, from the public bench seed."""
    q, r = np.linalg.qr(np.random.default_rng([seed, 0]).standard_normal((dim, rank)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def gaussian_block(seed: int, index: int, rows: int, dim: int, rank: int, gamma: float):
    """Rows of synth's ``gaussian`` model, x = U z + e − U(Uᵀe), as float32, on a worker."""
    basis = true_basis(seed, dim, rank).astype(np.float32)
    rng = np.random.default_rng([seed, 2, index])
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    x *= np.float32(gamma)
    z = rng.standard_normal((rows, rank), dtype=np.float32)
    x += (z - x @ basis) @ basis.T
    return x


def generated_array(rows: int, dim: int, rank: int, gamma: float, seed: int, block_rows: int):
    """A Dask array of the model whose blocks are generated where they are computed."""
    import dask
    import dask.array as da

    make = dask.delayed(gaussian_block, pure=True)
    starts = range(0, rows, block_rows)
    blocks = [
        da.from_delayed(
            make(seed, i, min(block_rows, rows - s), dim, rank, gamma),
            shape=(min(block_rows, rows - s), dim),
            dtype=np.float32,
        )
        for i, s in enumerate(starts)
    ]
    return da.concatenate(blocks)


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("wide", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[100_000])
    parser.add_argument("--dims", type=common.int_list, default=[100_000])
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--gamma-dim", type=float, default=1.0, help="γ = gamma_dim / D")
    parser.add_argument("--method", default="friendly")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scheduler", help="tcp:// address of a running local cluster")
    parser.add_argument("--seed", type=int, default=1, help="first seed (data and public)")
    parser.add_argument("--seeds", type=int, default=1, help="runs per size, seeds seed, seed+1…")
    parser.add_argument("--ref-points", type=int, help="q (default: the library's)")
    parser.add_argument("--subsets", type=int, help="t (default: the library's)")
    parser.add_argument("--vector-column", action="store_true", help="Parquet: one list column")
    parser.add_argument("--source", choices=("array", "parquet"), default="array")
    parser.add_argument("--assign", choices=("contiguous", "random"), default="contiguous")
    parser.add_argument("--block-rows", type=int, default=1000, help="rows per array block")
    parser.add_argument("--max-data-gib", type=float, default=3.0)
    parser.add_argument("--target-s", type=float, default=600.0)
    parser.add_argument("--target-error", type=float, default=0.2)
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("wide", args)
    records: list[dict[str, Any]] = []
    with common.local_cluster(args.workers, args.scheduler) as client:
        for n in args.rows:
            for d in args.dims:
                need = 8 * n * d / 2**30
                base = {"rows": n, "dim": d, "shuffle_gib": round(need, 2)}
                if args.assign == "random" and need > args.max_data_gib:
                    records.append({**base, "status": "not_run_memory"})
                    common.log(f"n={n} d={d}: not run, the shuffle needs {need:.1f} GiB")
                    continue
                for seed in range(args.seed, args.seed + args.seeds):
                    records.append(run_one(args, client, n, d, seed, base))
    parameters = {
        "rows": args.rows,
        "dims": args.dims,
        "rank": args.rank,
        "method": args.method,
        "gamma": f"{args.gamma_dim} / D",
        "epsilon": args.epsilon,
        "delta": args.delta,
        "workers": args.workers,
        "max_data_gib": args.max_data_gib,
        "source": args.source,
        "assign": args.assign,
        "block_rows": args.block_rows if args.source == "array" else None,
        "vector_column": args.vector_column if args.source == "parquet" else None,
        "seeds": list(range(args.seed, args.seed + args.seeds)),
        "ref_points": args.ref_points or "library default",
        "subsets": args.subsets or "library default",
        "target": f"wall <= {args.target_s}s and error <= {args.target_error}",
    }
    run.write(parameters, records, None, ())
    return 0


def run_one(args: Any, client: Any, rows: int, dim: int, seed: int, base: dict) -> dict:
    """One estimate at one size and seed, timed from opening the data to the basis."""
    opener, truth = open_source(args, rows, dim, seed)
    with common.PeakMemory(client) as memory:
        record = common.run_dpsub(
            args.method,
            opener,
            rank=args.rank,
            epsilon=args.epsilon,
            delta=args.delta,
            seed=seed,
            truth=truth,
            client=client,
            assign=args.assign,
            ref_points=args.ref_points,
            subsets=args.subsets,
        )
    record = {**base, "seed": seed, **common.drop_arrays(record), **memory.report()}
    record["meets_target"] = (
        record["status"] == "ok"
        and record["wall_s"] <= args.target_s
        and record["error"] <= args.target_error
    )
    common.log(
        f"n={rows} d={dim} seed={seed}: {record['status']} error={record.get('error')} "
        f"{record['wall_s']:.1f}s peak {record['peak_worker_rss_mib']} MiB"
    )
    return record


def open_source(args: Any, rows: int, dim: int, seed: int) -> tuple[Any, np.ndarray]:
    """``open_dataset`` for the chosen source, and the true basis."""
    gamma = args.gamma_dim / dim
    if args.source == "parquet":
        path, truth = common.dataset(
            args.data_dir,
            rows=rows,
            dim=dim,
            rank=args.rank,
            gamma=gamma,
            seed=seed,
            vector_column=args.vector_column,
        )
        return common.parquet_opener(path), truth
    from dpsub_dist.engine.sources import array_dataset

    array = generated_array(rows, dim, args.rank, gamma, seed, args.block_rows)
    return (lambda client: array_dataset(array)), true_basis(seed, dim, args.rank)


if __name__ == "__main__":
    raise SystemExit(main())
