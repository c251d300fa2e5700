"""Wide data: one ``friendly`` estimate at large D from Parquet, against the 10-minute target.

The target (issue 6): at D = 10⁵, n = 10⁵ the friendly estimate finishes on this machine in
under 10 minutes with error ≤ 0.2 (ε = 1, δ = 1e-6). The subset engine holds every row (as
float64) in worker memory during its shuffle, so a run needs about ``8·n·D`` bytes across the
workers; sizes above ``--max-data-gib`` are recorded as ``not_run_memory`` with that number
instead of being started. Runs on the project's local process cluster, like
``dpsub estimate``; the peak worker memory is polled as in ``bench.speed``.

Example (the published runs): ``python -m bench.wide --rows 2500,100000 --dims 10000,100000``.
"""

from __future__ import annotations

from typing import Any

from bench import common


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("wide", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[100_000])
    parser.add_argument("--dims", type=common.int_list, default=[100_000])
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--gamma-dim", type=float, default=1.0, help="γ = gamma_dim / D")
    parser.add_argument("--method", default="friendly")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scheduler", help="tcp:// address of a running local cluster")
    parser.add_argument("--seed", type=int, default=1)
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
                if need > args.max_data_gib:
                    records.append({**base, "status": "not_run_memory"})
                    common.log(f"n={n} d={d}: not run, the shuffle needs {need:.1f} GiB")
                    continue
                path, truth = common.dataset(
                    args.data_dir,
                    rows=n,
                    dim=d,
                    rank=args.rank,
                    gamma=args.gamma_dim / d,
                    seed=args.seed,
                )
                with common.PeakMemory(client) as memory:
                    record = common.run_dpsub(
                        args.method,
                        common.parquet_opener(path),
                        rank=args.rank,
                        epsilon=args.epsilon,
                        delta=args.delta,
                        seed=args.seed,
                        truth=truth,
                        client=client,
                    )
                record = {**base, **common.drop_arrays(record), **memory.report()}
                record["meets_target"] = (
                    record["status"] == "ok"
                    and record["wall_s"] <= args.target_s
                    and record["error"] <= args.target_error
                )
                records.append(record)
                common.log(
                    f"n={n} d={d}: {record['status']} error={record.get('error')} "
                    f"{record['wall_s']:.1f}s peak {record['peak_worker_rss_mib']} MiB"
                )
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
        "target": f"wall <= {args.target_s}s and error <= {args.target_error}",
    }
    run.write(parameters, records, None, ())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
