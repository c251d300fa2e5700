"""Memory and traffic as n grows ×10: peak resident memory per worker, bytes to the driver.

Runs dpsub (default t, and a fixed t) and the floor one after the other on the same
files as ``bench.speed`` (same data cache), each on a fresh local cluster (so a run's peak
holds nothing left by the one before; with ``--scheduler`` all share that cluster),
polling each worker process's RSS every 50 ms (``bench.common.PeakMemory``). The first
run of a tool in fresh workers includes its imports. The bytes gathered are the
manifest's ``summary_bytes_gathered`` (the floor: its d×d blocks).

Example (the published run): ``python -m bench.memory --rows 1e5,1e6,1e7``.
"""

from __future__ import annotations

from typing import Any

from bench import common, speed


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("memory", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[10**5, 10**6, 10**7])
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--method", default="friendly")
    parser.add_argument("--tools", type=common.str_list, default=["dpsub", "dpsub_t2000", "floor"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scheduler", help="tcp:// address of a running local cluster")
    parser.add_argument(
        "--min-files", type=int, default=1, help="write at least this many Parquet files"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("memory", args)
    records: list[dict[str, Any]] = []
    for n in args.rows:
        path, truth = speed.speed_dataset(args, n, args.dim)
        for tool in args.tools:
            record = speed.run_tool_fresh(tool, path, truth, args)
            record.update(rows=n, dim=args.dim, tool=tool)
            records.append(record)
            peak, gathered = record.get("peak_worker_rss_mib"), record.get("bytes_gathered")
            common.log(f"n={n} {tool:>12}: {record['status']} {peak} MiB, {gathered} B")
    plots = [] if args.no_plot else plot(run, records, args)
    parameters = {
        "rows": args.rows,
        "dim": args.dim,
        "rank": args.rank,
        "method": args.method,
        "tools": args.tools,
        "workers": args.workers,
        "threads_per_worker": 1,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "poll_interval_s": 0.05,
    }
    run.write(parameters, records, None, plots)
    return 0


def plot(run: common.BenchRun, records: list[dict[str, Any]], args: Any) -> list:
    fig, (mem_ax, bytes_ax) = common.figure(
        run,
        f"D={args.dim}, k={args.rank}, {args.method}, eps={args.epsilon}, delta={args.delta}; "
        f"{args.workers} workers x 1 thread; RSS polled every 50 ms; one run each",
        ncols=2,
    )
    for tool in args.tools:
        ok = [r for r in records if r["tool"] == tool and "peak_worker_rss_mib" in r]
        if not ok:
            continue
        xs = [r["rows"] for r in ok]
        mem_ax.plot(xs, [r["peak_worker_rss_mib"] for r in ok], "o-", label=tool)
        gathered = [(r["rows"], r["bytes_gathered"]) for r in ok if r.get("bytes_gathered")]
        if gathered:
            bytes_ax.plot(*zip(*gathered, strict=True), "o-", label=tool)
    if records and "baseline_worker_rss_mib" in records[0]:
        mem_ax.axhline(
            records[0]["baseline_worker_rss_mib"], color="grey", ls=":", label="idle worker"
        )
    for ax, label in (
        (mem_ax, "peak RSS of a worker, MiB"),
        (bytes_ax, "bytes gathered to driver"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (rows)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    mem_ax.set_title("peak worker memory vs n")
    bytes_ax.set_title("traffic to the driver vs n")
    return [common.save(fig, run)]


if __name__ == "__main__":
    raise SystemExit(main())
