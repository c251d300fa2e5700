"""Where ``--method power``'s workers wait: one run with Dask's task stream, summarised.

The rows are ``bench.power``'s generated float32 blocks. Per worker, from the task stream
(every task's ``startstops``): CPU-side compute seconds by task kind (generating a block,
the partition task, a tree-sum node), seconds spent fetching a dependency from the other
worker and the bytes fetched (the workers' ``transfer_incoming_log``), and the idle time
split into the gaps *between* passes (from a worker's last task of one pass to its first of the
next: the per-pass barrier, the driver's work and the next graph's submission) and the gaps
*within* a pass. Also the workers' CPU seconds (psutil) against the wall, and this process's
(the driver and the scheduler, which share the machine's cores with the workers).

Example (docs/history.md, "Where the workers wait"):
``nice -n 19 python -m bench.power_stream --dims 50000 --rows 20000 --memory-limit 2.5GiB``.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np

from bench import common
from bench.power import generated_array, worker_cpu_seconds

KINDS = {
    "polynomial_block": "generate",
    "_load_product": "product",
    "_weighted_product": "product (held rows)",
    "_load_weighted": "load held rows",
    "_level_products": "fused bound + product",
    "_partition_norm_counts": "bound counts",
    "add": "tree sum",
    "__add__": "tree sum",
    "clipped_product": "gather",
    "_counts": "gather",
}


def kind(key: Any) -> str:
    """The task kind of a task-stream key (its function's name prefix)."""
    name = key[0] if isinstance(key, tuple) else str(key)
    for prefix, label in KINDS.items():
        if name.startswith(prefix):
            return label
    return name.rsplit("-", 1)[0]


def summarise(stream: list[dict[str, Any]], marks: list[float], wall: float) -> dict[str, Any]:
    """Per worker: compute seconds by kind, transfer seconds, idle between and within passes
    (``marks``: the driver's clock at each pass's end, on the stream's time.time() clock)."""
    busy: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for record in stream:
        worker = record["worker"]
        for step in record["startstops"]:
            action = step["action"]
            label = kind(record["key"]) if action == "compute" else action
            busy[worker][label] += step["stop"] - step["start"]
            if action == "compute":
                spans[worker].append((step["start"], step["stop"], label))
    report: dict[str, Any] = {}
    for worker, intervals in spans.items():
        intervals.sort()
        between = within = 0.0
        gaps: dict[str, float] = defaultdict(float)
        for (_, stop, before), (start, _, after) in zip(intervals, intervals[1:], strict=False):
            gap = max(0.0, start - stop)
            if any(stop <= mark <= start for mark in marks):
                between += gap
            else:
                within += gap
                gaps[f"{before} → {after}"] += gap
        report[worker] = {
            "busy_s": {k: round(v, 2) for k, v in sorted(busy[worker].items())},
            "compute_s": round(sum(b - a for a, b, _ in intervals), 2),
            "idle_between_passes_s": round(between, 2),
            "idle_within_passes_s": round(within, 2),
            "idle_within_by_neighbours_s": {k: round(v, 2) for k, v in gaps.items() if v > 0.01},
            "idle_before_first_and_after_last_s": round(
                intervals[0][0] - marks[0] + marks[-1] - max(b for _, b, _ in intervals), 2
            ),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("power_stream", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dims", type=int, default=50_000)
    parser.add_argument("--rank", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--block-rows", type=int, default=1000)
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--center", action="store_true")
    parser.add_argument("--memory-limit", default="2.5GiB")
    parser.add_argument("--seed", type=int, default=1)
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("power_stream", args)
    import psutil
    from distributed import get_task_stream

    from dpsub_dist.engine.cluster import dask_client
    from dpsub_dist.engine.sources import array_dataset
    from dpsub_dist.estimators import power as runner
    from dpsub_dist.job import EstimateConfig, run_estimate

    marks: list[float] = []
    real = runner.RowPasses.__call__

    def marked(self: Any, basis: np.ndarray) -> np.ndarray:
        product = real(self, basis)
        marks.append(time.time())
        return product

    runner.RowPasses.__call__ = marked  # type: ignore[method-assign]
    cluster = dask_client(None, quiet=True, workers=args.workers, memory_limit=args.memory_limit)
    with cluster as client:
        array = generated_array(args.rows, args.dims, 2.0, args.seed, args.block_rows)
        config = EstimateConfig(
            rank=args.rank,
            method="power",
            epsilon=args.epsilon,
            delta=args.delta,
            seed=args.seed,
            iterations=args.iterations,
            center=True if args.center else None,
        )
        client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
        cpu, driver = worker_cpu_seconds(client), psutil.Process().cpu_times()
        main_thread = threading.get_native_id()
        threads = {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
        started = time.time()
        with get_task_stream(client) as stream:
            result = run_estimate(config, lambda c: array_dataset(array), client)
        wall = time.time() - started
        worker_cpu = worker_cpu_seconds(client) - cpu
        after = psutil.Process().cpu_times()
        main_cpu = sum(
            t.user_time + t.system_time - threads.get(t.id, 0.0)
            for t in psutil.Process().threads()
            if t.id == main_thread
        )
        logs = client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log))
    driver_cpu = after.user + after.system - driver.user - driver.system
    workers = summarise(stream.data, [started, *marks], wall)
    for address, log in logs.items():
        workers.setdefault(address, {})["fetched_mb"] = round(
            sum(entry["total"] for entry in log) / 1e6, 1
        )
        workers[address]["fetches"] = len(log)
    record = {
        "rows": args.rows,
        "dim": args.dims,
        "wall_s": round(wall, 1),
        "worker_cpu_s": round(worker_cpu, 1),
        "cpu_share": round(worker_cpu / (wall * args.workers), 3),
        "driver_and_scheduler_cpu_s": round(driver_cpu, 1),
        "driver_main_thread_cpu_s": round(main_cpu, 1),
        "timings": result.timings,
        "passes": result.manifest["parameters"]["passes"],
        "workers": workers,
    }
    common.log(
        f"wall {record['wall_s']} s, worker CPU {record['worker_cpu_s']} s "
        f"({record['cpu_share']:.0%} of wall × workers), driver+scheduler CPU "
        f"{record['driver_and_scheduler_cpu_s']} s (main thread {main_cpu:.1f} s)"
    )
    for address, summary in workers.items():
        common.log(f"{address}: {summary}")
    parameters = {
        name: getattr(args, name)
        for name in ("rows", "dims", "rank", "workers", "block_rows", "iterations", "center")
    }
    parameters |= {"memory_limit": args.memory_limit, "epsilon": args.epsilon}
    run.write(parameters, [record], None, ())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
