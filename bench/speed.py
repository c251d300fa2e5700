"""Speed end to end from Parquet: ``dpsub estimate`` vs dask-ml PCA vs the floor, side by side.

All tools run on the same local process cluster and the same files, interleaved within each
repeat (the order rotates between repeats), and are reported as medians and as ratios to
each other, with the peak resident memory of the workers during each run:

- ``dpsub``: ``dpsub_dist.job.run_estimate`` on ``engine.sources.parquet_dataset`` (what
  ``dpsub estimate`` runs, minus process start and writing the 2-file output);
- ``dask_ml_randomized`` / ``dask_ml_tsqr``: ``dask.dataframe.read_parquet`` →
  ``to_dask_array(lengths=True)`` → ``dask_ml.decomposition.PCA(svd_solver=...).fit``;
- ``floor``: one task per file: pyarrow read → float64 NumPy → ``XᵀX``; the d×d blocks are
  summed on the driver. No pipeline that reads its input can beat it;
- ``floor_stacked``: the floor with dpsub's own column decode (the columns stacked, then
  written transposed: ``io.parquet.write_scalar_columns``), faster than the floor's one
  column at a time: beside it, how much of dpsub's ratio to the floor is that decode.

Example (the published run):
``python -m bench.speed --rows 1e6,1e7 --wide-dims 128,256 --profile``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from bench import common

TOOLS = (
    "dpsub",
    "dpsub_contiguous",
    "dask_ml_randomized",
    "dask_ml_tsqr",
    "floor",
    "floor_stacked",
)


def parquet_files(path: Path) -> list[str]:
    return sorted(str(p) for p in Path(path).glob("*.parquet"))


def speed_dataset(args: Any, rows: int, dim: int) -> tuple[Path, np.ndarray]:
    """The Gaussian-gap data of the speed benches: synth's file layout, or ≥ ``--min-files``."""
    from dpsub_dist.synth import default_partitions

    wanted = args.min_files
    partitions = None if default_partitions(rows, dim, "float32") >= wanted else wanted
    return common.dataset(
        args.data_dir,
        rows=rows,
        dim=dim,
        rank=args.rank,
        gamma=1.0 / dim,
        seed=args.seed,
        partitions=partitions,
    )


def floor_gram(file: str, stacked: bool = False) -> np.ndarray:
    """The floor's task: read one file with pyarrow, XᵀX in float64 NumPy (``stacked``: the
    columns converted as dpsub's reader does, else one at a time)."""
    import pyarrow.parquet as pq

    from dpsub_dist.io.parquet import write_scalar_columns

    table = pq.read_table(file)
    rows = np.empty((table.num_rows, table.num_columns))
    if stacked:
        write_scalar_columns(dict(enumerate(c.to_numpy() for c in table.columns)), rows)
    else:
        for j, column in enumerate(table.columns):
            rows[:, j] = column.to_numpy()
    return rows.T @ rows


def run_floor(path: Path, client: Any, stacked: bool = False) -> dict[str, Any]:
    files = parquet_files(path)
    grams = client.gather(client.map(floor_gram, files, stacked=stacked, pure=False))
    total = np.sum(grams, axis=0)
    return {"status": "ok", "bytes_gathered": int(sum(g.nbytes for g in grams)), "d": total.shape}


def run_dask_ml(path: Path, rank: int, solver: str, client: Any) -> dict[str, Any]:
    import dask.dataframe as dd
    from dask_ml.decomposition import PCA

    frame = dd.read_parquet(parquet_files(path))
    rows = frame.to_dask_array(lengths=True)
    model = PCA(n_components=rank, svd_solver=solver, random_state=0).fit(rows)
    return {"status": "ok", "basis": np.asarray(model.components_).T}


def run_tool(tool: str, path: Path, truth: np.ndarray, args: Any, client: Any) -> dict[str, Any]:
    """One timed run of one tool, with the workers' peak memory."""
    from dpsub_dist.linalg import subspace_error

    rank = truth.shape[1]
    with common.PeakMemory(client, interval=0.05) as memory:
        started = time.monotonic()
        if tool.startswith("dpsub"):
            subsets = int(tool.removeprefix("dpsub_t")) if tool.startswith("dpsub_t") else None
            assign = "contiguous" if tool == "dpsub_contiguous" else "random"
            record = common.run_dpsub(
                args.method,
                common.parquet_opener(path),
                rank=rank,
                epsilon=args.epsilon,
                delta=args.delta,
                seed=args.seed,
                truth=truth,
                client=client,
                subsets=subsets,
                assign=assign,
            )
            record["bytes_gathered"] = record.pop("summary_bytes_gathered", None)
        elif tool in ("floor", "floor_stacked"):
            record = run_floor(path, client, stacked=tool == "floor_stacked")
            record.pop("d")
        else:
            record = run_dask_ml(path, rank, tool.removeprefix("dask_ml_"), client)
            record["error"] = subspace_error(np.linalg.qr(record.pop("basis"))[0], truth)
        wall = time.monotonic() - started
    record.pop("basis", None)
    record["wall_s"] = wall
    record.update(memory.report())
    return record


def run_tool_fresh(tool: str, path: Path, truth: np.ndarray, args: Any) -> dict[str, Any]:
    """:func:`run_tool` on a fresh local cluster of ``args.workers`` (or ``args.scheduler``'s),
    so a run's peak holds nothing left by the run before. A peer that fails (dask-ml's
    workers killed for memory, say) is a record with status ``failed: …``, so the run goes
    on to the next tool; dpsub's own failure is a bug and is raised."""
    started = time.monotonic()
    try:
        with common.local_cluster(args.workers, args.scheduler) as client:
            return run_tool(tool, path, truth, args, client)
    except Exception as err:  # noqa: BLE001 - a peer's failure is a result
        if tool.startswith("dpsub"):
            raise
        status = f"failed: {type(err).__name__}: {err}"[:300]
        return {"status": status, "wall_s": time.monotonic() - started}


def task_breakdown(stream: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Seconds per task prefix and action (compute / transfer / disk) from a Dask task stream."""
    from dask.utils import key_split

    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for task in stream:
        prefix = key_split(task["key"])
        for step in task.get("startstops", ()):
            totals[prefix][step["action"]] += step["stop"] - step["start"]
    return {p: {a: round(s, 3) for a, s in acts.items()} for p, acts in totals.items()}


def summarise(records: list[dict[str, Any]], cores: int) -> list[dict[str, Any]]:
    """Medians per (n, d, tool) and ratios against dask-ml and the floor, per configuration."""
    groups: dict[tuple[int, int], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in records:
        if r["status"] in ("ok", "bottom") and not r.get("warmup"):
            groups[(r["rows"], r["dim"])][r["tool"]].append(r)
    table = []
    for (n, d), by_tool in sorted(groups.items()):
        row: dict[str, Any] = {"rows": n, "dim": d, "tools": {}}
        for tool, runs in by_tool.items():
            wall = common.median([r["wall_s"] for r in runs])
            row["tools"][tool] = {
                "median_wall_s": wall,
                "rows_per_s_per_core": n / wall / cores,
                "median_peak_worker_rss_mib": common.median(
                    [r["peak_worker_rss_mib"] for r in runs]
                ),
                "repeats": len(runs),
                "median_error": common.median([r["error"] for r in runs if "error" in r]),
                "bytes_gathered": runs[0].get("bytes_gathered"),
            }
        walls = {tool: v["median_wall_s"] for tool, v in row["tools"].items()}
        ratios = {}
        for ours in [t for t in walls if t.startswith("dpsub")]:
            for peer in ("dask_ml_randomized", "dask_ml_tsqr"):
                if peer in walls:
                    ratios[f"{ours}_over_{peer}"] = walls[ours] / walls[peer]
            if "floor" in walls:
                ratios[f"{ours}_fraction_of_floor_throughput"] = walls["floor"] / walls[ours]
        row["ratios"] = ratios
        row["not_run"] = sorted(
            {
                r["tool"]: r["message"]
                for r in records
                if (r["rows"], r["dim"]) == (n, d) and r["status"].startswith("not_run")
            }.items()
        )
        row["paired_ratios"] = paired_ratios(by_tool)
        table.append(row)
    return table


def paired_ratios(by_tool: dict[str, list[dict[str, Any]]]) -> dict[str, float | None]:
    """Median over repeats of the per-repeat ratio (same repeat, interleaved runs)."""
    by_repeat = {tool: {r["repeat"]: r["wall_s"] for r in runs} for tool, runs in by_tool.items()}
    out: dict[str, float | None] = {}
    for ours in [t for t in by_repeat if t.startswith("dpsub")]:
        for peer in ("dask_ml_randomized", "dask_ml_tsqr", "floor"):
            mine, other = by_repeat[ours], by_repeat.get(peer, {})
            shared = sorted(set(mine) & set(other))
            out[f"{ours}_over_{peer}"] = common.median([mine[i] / other[i] for i in shared])
    return out


def plot(run: common.BenchRun, table: list[dict[str, Any]], args: Any) -> list[Path]:
    fig, (by_n, by_d) = common.figure(
        run,
        f"D={args.dims[0]} sweep n; n={args.wide_rows:.0e} sweep D; rank k={args.rank}; "
        f"{args.method}, eps={args.epsilon}, delta={args.delta}; "
        f"{args.workers} workers x 1 thread; "
        f"median of {args.repeats} interleaved repeats",
        ncols=2,
    )
    styles = {
        "dpsub": "o-",
        "dpsub_t2000": "D-",
        "dpsub_contiguous": "v-",
        "dask_ml_randomized": "s--",
        "dask_ml_tsqr": "^--",
        "floor": "k:",
    }
    for ax, fixed, key in (
        (by_n, ("dim", args.dims[0]), "rows"),
        (by_d, ("rows", args.wide_rows), "dim"),
    ):
        rows = [r for r in table if r[fixed[0]] == fixed[1]]
        for tool in args.tools:
            points = [
                (r[key], r["tools"][tool]["median_wall_s"]) for r in rows if tool in r["tools"]
            ]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(xs, ys, styles.get(tool, "o-"), label=tool)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (rows)" if key == "rows" else "D (columns)")
        ax.set_ylabel("wall time, s (median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    by_n.set_title(f"end to end from Parquet, D = {args.dims[0]}")
    by_d.set_title(f"end to end from Parquet, n = {args.wide_rows:.0e}")
    return [common.save(fig, run)]


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("speed", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[10**6, 10**7])
    parser.add_argument("--dims", type=common.int_list, default=[32], help="D of the n sweep")
    parser.add_argument("--wide-dims", type=common.int_list, default=[128, 512])
    parser.add_argument("--wide-rows", type=lambda v: int(float(v)), default=10**6)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--method", default="friendly")
    parser.add_argument(
        "--tools",
        type=common.str_list,
        default=["dpsub", "dpsub_t2000", *TOOLS[1:]],
        help=f"from {','.join(TOOLS)}; dpsub_tT = dpsub with --subsets T; "
        "dpsub_contiguous = dpsub with --assign contiguous",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scheduler", help="tcp:// address of a running local cluster")
    parser.add_argument(
        "--min-files", type=int, default=1, help="write at least this many Parquet files"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="task-stream breakdown per tool")
    args = common.parse_args(parser, argv)
    unknown = {t for t in args.tools if not t.startswith("dpsub_t")} - set(TOOLS)
    if unknown:
        parser.error(f"unknown tools {sorted(unknown)}: use {','.join(TOOLS)}")
    run = common.BenchRun.start("speed", args)
    configs = [(n, d) for d in args.dims for n in args.rows]
    configs += [(args.wide_rows, d) for d in args.wide_dims if (args.wide_rows, d) not in configs]
    records: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    from distributed import get_task_stream

    with common.local_cluster(args.workers, args.scheduler) as client:
        for n, d in configs:
            path, truth = speed_dataset(args, n, d)
            if not records:  # warm-up: imports and first-touch costs on the workers
                for tool in args.tools:
                    warm = run_tool(tool, path, truth, args, client)
                    records.append({"rows": n, "dim": d, "tool": tool, "warmup": True, **warm})
            for repeat in range(args.repeats):
                shift = repeat % len(args.tools)
                for tool in args.tools[shift:] + args.tools[:shift]:
                    profile = args.profile and repeat == args.repeats - 1
                    with get_task_stream(client) if profile else nullcontext() as stream:
                        record = run_tool(tool, path, truth, args, client)
                    if profile:
                        profiles[f"{tool} n={n} d={d}"] = task_breakdown(stream.data)
                    record.update(rows=n, dim=d, tool=tool, repeat=repeat)
                    records.append(record)
                    common.log(
                        f"n={n} d={d} {tool:>20} rep {repeat}: {record['wall_s']:.2f}s "
                        f"peak {record['peak_worker_rss_mib']} MiB {record['status']}"
                    )
    cores = args.workers
    table = summarise(records, cores)
    plots = [] if args.no_plot else plot(run, table, args)
    parameters = {
        k: getattr(args, k)
        for k in ("rows", "dims", "wide_dims", "wide_rows", "rank", "method", "tools", "repeats")
    }
    parameters.update(
        workers=args.workers,
        threads_per_worker=1,
        epsilon=args.epsilon,
        delta=args.delta,
        model="gaussian, gamma = 1/D, float32 Parquet (dpsub_dist.synth defaults)",
    )
    run.write(parameters, records, {"table": table, "profiles": profiles}, plots)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
