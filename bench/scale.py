"""Scale of the default route: memory flat in n, throughput vs the floor, vs dask-ml PCA.

For each width D (default 32, 128, 512) and each n in ``--rows`` (default n and 10·n),
runs on the same cached Parquet files (``bench.speed``'s Gaussian-gap data), each
``--repeats`` times, on a fresh local cluster per run (so a peak holds nothing left by
the run before): dpsub with ``--method`` (default ``auto``, dpsub's default; with
``--method friendly`` and ``--assign random`` the route is whatever
``engine.routes.local_route`` picks at that D), the floor (bare pyarrow read + XᵀX per
file) and dask-ml's randomized PCA. Per D it reports the ratios of medians in the run:

- ``rss_ratio``: dpsub's median peak worker RSS at the largest n over that at the
  smallest (target ≤ 1.15: memory flat in n);
- ``throughput_vs_floor``: floor wall / dpsub wall at the largest n (target ≥ 0.8 at
  D = 32 and 128); ``throughput_vs_floor_stacked`` the same against the floor with dpsub's
  column decode (``--tools …,floor_stacked``: ``bench.speed``);
- ``time_vs_dask_ml``: dpsub wall / dask-ml wall at the largest n (target ≤ 0.5).

Peak memory is one partition plus the route's per-subset blocks (t·d² or t·d·m floats),
so a fair "flat in n" reading holds the partition size (``--rows-per-file``) and t fixed:
t follows n until it reaches its ceiling (see ``sample_aggregate.default_subsets``).

Example: ``python -m bench.scale --rows 1e6,1e7 --dims 32,128,512 --repeats 3``.

``--shuffle-compare N,D`` instead runs the two row routes (wide data, hashed subsets)
side by side on one N×D dataset, each on a fresh cluster of ``--workers`` workers with
``--memory-limit`` each: the bucket shuffle (``engine.subsets``) and Dask's P2P shuffle
(``engine.p2p``), with wall time, peak worker RSS and equal summaries.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench import common, speed

TOOLS = ("dpsub", "floor", "dask_ml_randomized")


def _median(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get("status") in ("ok", "bottom") and key in r]
    return statistics.median(values) if values else None


def summarise(records: list[dict[str, Any]], dims: list[int], rows: list[int]) -> list[dict]:
    """Per D: the three ratios of medians (module docstring), the method and route dpsub took."""
    table = []
    small, large = min(rows), max(rows)
    for dim in dims:

        def pick(tool: str, n: int, dim: int = dim) -> list[dict[str, Any]]:
            return [r for r in records if (r["tool"], r["rows"], r["dim"]) == (tool, n, dim)]

        def ratio(top: float | None, bottom: float | None) -> float | None:
            return None if top is None or not bottom else round(top / bottom, 3)

        dpsub_large = pick("dpsub", large)
        table.append(
            {
                "dim": dim,
                "method": next((r.get("method") for r in dpsub_large), None),
                "route": next((r.get("local_route") for r in dpsub_large), None),
                "sampled_centre": next(
                    (r.get("timings", {}).get("sampled_centre") for r in dpsub_large), None
                ),
                "dpsub_wall_s": _median(dpsub_large, "wall_s"),
                "floor_wall_s": _median(pick("floor", large), "wall_s"),
                "dask_ml_wall_s": _median(pick("dask_ml_randomized", large), "wall_s"),
                "rss_ratio": ratio(
                    _median(dpsub_large, "peak_worker_rss_mib"),
                    _median(pick("dpsub", small), "peak_worker_rss_mib"),
                ),
                "throughput_vs_floor": ratio(
                    _median(pick("floor", large), "wall_s"), _median(dpsub_large, "wall_s")
                ),
                "throughput_vs_floor_stacked": ratio(
                    _median(pick("floor_stacked", large), "wall_s"),
                    _median(dpsub_large, "wall_s"),
                ),
                "time_vs_dask_ml": ratio(
                    _median(dpsub_large, "wall_s"),
                    _median(pick("dask_ml_randomized", large), "wall_s"),
                ),
                "error": _median(dpsub_large, "error"),
            }
        )
    return table


def compare_shuffles(args: Any) -> list[dict[str, Any]]:
    """The bucket shuffle and the P2P shuffle on the same files (module docstring)."""
    import time

    import numpy as np
    from distributed import Client, LocalCluster

    from dpsub_dist.context import choose_buckets
    from dpsub_dist.engine.compute import Executor
    from dpsub_dist.engine.p2p import compute_subset_summaries_p2p
    from dpsub_dist.engine.sources import parquet_dataset
    from dpsub_dist.engine.subsets import SubsetPlan, compute_subset_summaries
    from dpsub_dist.methods._sample_aggregate import ProjectedReferenceStep

    n, dim = args.shuffle_compare
    path, _ = speed.speed_dataset(args, n, dim)
    routes = {
        "bucket shuffle": compute_subset_summaries,
        "p2p shuffle": compute_subset_summaries_p2p,
    }
    records, results = [], {}
    for name, route in routes.items():
        with (
            LocalCluster(
                n_workers=args.workers,
                threads_per_worker=1,
                memory_limit=args.memory_limit,
                dashboard_address=":0",
                host="127.0.0.1",
            ) as cluster,
            Client(cluster) as client,
        ):
            executor = Executor(client)
            data = parquet_dataset(str(path), None, None, None, executor)
            subsets = args.subsets or max(2, n // 2000)
            plan = SubsetPlan(
                subsets, n, args.seed, buckets=choose_buckets(n, dim, subsets, executor)
            )
            step = ProjectedReferenceStep(rank=args.rank, dim=dim, ref_points=4, seed=args.seed)
            with common.PeakMemory(client, interval=0.05) as memory:
                started = time.monotonic()
                try:
                    results[name] = route(
                        data.parts, data.offsets, data.loader, plan, step, executor, False
                    )
                    status = "ok"
                except Exception as err:  # noqa: BLE001 - a failed route is a result here
                    status = f"failed: {type(err).__name__}: {err}"[:300]
                wall = time.monotonic() - started
        record = {"route": name, "rows": n, "dim": dim, "subsets": subsets, "status": status}
        record.update(wall_s=round(wall, 2), buckets=plan.buckets, **memory.report())
        common.log(str(record))
        records.append(record)
    if len(results) == 2:
        first, second = results.values()
        records.append({"max_abs_difference": float(np.abs(first - second).max())})
    return records


def main(argv: list[str] | None = None) -> int:
    from dpsub_dist.methods import DEFAULTS

    parser = common.base_parser("scale", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[10**6, 10**7])
    parser.add_argument("--dims", type=common.int_list, default=[32, 128, 512])
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument(
        "--method", default=DEFAULTS["estimate"], help=f"default: {DEFAULTS['estimate']} (dpsub's)"
    )
    parser.add_argument("--tools", type=common.str_list, default=list(TOOLS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scheduler", help="tcp:// address of a running local cluster")
    parser.add_argument("--min-files", type=int, default=4, help="at least this many files")
    parser.add_argument(
        "--rows-per-file",
        type=int,
        help="at most about this many rows a file, so partitions are the same size at n and 10n",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shuffle-compare", type=common.int_list, help="N,D: row routes only")
    parser.add_argument("--memory-limit", default="1GiB", help="per worker, --shuffle-compare")
    parser.add_argument("--subsets", type=int, help="t for --shuffle-compare (default n/2000)")
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("scale", args)
    if args.shuffle_compare:
        records = compare_shuffles(args)
        run.write(
            {
                "shuffle_compare": args.shuffle_compare,
                "memory_limit": args.memory_limit,
                "workers": args.workers,
            },
            records,
            None,
            [],
        )
        return 0
    records: list[dict[str, Any]] = []
    for dim in args.dims:
        for n in args.rows:
            files = -(-n // args.rows_per_file) if args.rows_per_file else 0
            layout = argparse.Namespace(**{**vars(args), "min_files": max(args.min_files, files)})
            path, truth = speed.speed_dataset(layout, n, dim)
            for repeat in range(args.repeats):
                for tool in args.tools:  # interleaved, so drift hits every tool alike
                    record = speed.run_tool_fresh(tool, path, truth, args)
                    record.update(rows=n, dim=dim, tool=tool, repeat=repeat)
                    records.append(common.drop_arrays(record))
                    common.log(
                        f"D={dim} n={n} {tool:>18} #{repeat}: {record['status']} "
                        f"{record['wall_s']:.1f} s, {record.get('peak_worker_rss_mib')} MiB"
                    )
    summary = summarise(records, args.dims, args.rows)
    for line in summary:
        common.log(str(line))
    parameters = {
        "rows": args.rows,
        "dims": args.dims,
        "rank": args.rank,
        "method": args.method,
        "tools": args.tools,
        "repeats": args.repeats,
        "workers": args.workers,
        "threads_per_worker": 1,
        "epsilon": args.epsilon,
        "delta": args.delta,
    }
    run.write(parameters, records, summary, [])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
