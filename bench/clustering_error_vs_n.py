"""Private subspace clustering: error vs n of sample-aggregate, sulq and gibbs (docs/clustering.md).

Data: ``dpsub synth --clusters K`` (K random rank-q subspaces of R^D, γ = 0.01, rows split
uniformly), written once per (n, seed) to the data cache. Each method runs through the
library (``job.run_cluster``) on a local process cluster reading the
Parquet files. Error: the largest ‖Π̂_c − Π_c‖ over clusters after Hungarian matching
(⊥ counts as 1); median and 90th percentile over seeds; ⊥ rate; wall time. gibbs only runs
where n ≤ its limit (100,000 rows).

Example (the published run):
``python -m bench.clustering_error_vs_n --rows 3000,10000,30000,100000,300000 --seeds 5``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import common


def clustered_dataset(
    data_dir: Path, rows: int, dim: int, rank: int, clusters: int, seed: int
) -> tuple[Path, np.ndarray]:
    """A cached ``synth --clusters`` dataset and its K×d×q truth."""
    from dpsub_dist.synth import generate, read_truth

    path = Path(data_dir) / f"clusters{clusters}-n{rows}-d{dim}-k{rank}-s{seed}"
    if not (path / "_truth" / "params.json").exists():
        common.log(f"generating {path.name}")
        generate(path, rows=rows, dim=dim, rank=rank, clusters=clusters, seed=seed, overwrite=True)
    return path, read_truth(path)[0]


def run_once(method: str, path: Path, truth: np.ndarray, args, seed: int, client) -> dict:
    """One clustering run; its matched error against the truth."""
    from dpsub_dist.errors import DpsubError
    from dpsub_dist.job import ClusterConfig, run_cluster
    from dpsub_dist.methods._clustering import matched_subspace_errors

    config = ClusterConfig(
        clusters=args.clusters,
        rank=args.rank,
        epsilon=args.epsilon,
        delta=args.delta,
        method=method,
        seed=seed,
    )
    started = time.monotonic()
    try:
        result = run_cluster(config, common.parquet_opener(path), client)
    except DpsubError as err:
        return {"status": "error", "message": str(err)}
    record: dict[str, Any] = {"status": "ok", "wall_s": time.monotonic() - started}
    if result.basis is None:
        record.update(status="bottom", error=1.0)
        record["failed_step"] = result.manifest["release"].get("failed_step")
    else:
        errors = matched_subspace_errors(result.basis, truth)
        record.update(error=float(errors.max()), per_cluster=errors.tolist())
    record["subsets"] = result.manifest["parameters"].get("subsets")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("clustering_error_vs_n", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[3000, 10_000, 30_000, 100_000])
    parser.add_argument("--dim", type=int, default=20)
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scheduler", help="a running Dask scheduler instead of a local cluster")
    parser.add_argument(
        "--methods", type=common.str_list, default=["sample-aggregate", "sulq", "gibbs"]
    )
    args = parser.parse_args(argv)
    from dpsub_dist.methods._clustering import GIBBS_MAX_ROWS

    run = common.BenchRun.start("clustering_error_vs_n", args)
    records = []
    with common.local_cluster(args.workers, args.scheduler) as client:
        for n in args.rows:
            for seed in range(args.seeds):
                path, truth = clustered_dataset(
                    args.data_dir, n, args.dim, args.rank, args.clusters, seed
                )
                for method in args.methods:
                    if method == "gibbs" and n > GIBBS_MAX_ROWS:
                        continue
                    record = run_once(method, path, truth, args, seed, client)
                    record.update(method=method, rows=n, seed=seed)
                    common.log(f"n={n} seed={seed} {method}: {record.get('error')}")
                    records.append(record)
    summary = []
    for n in args.rows:
        for method in args.methods:
            done = [r for r in records if r["rows"] == n and r["method"] == method]
            if not done:
                continue
            errors = [r["error"] for r in done if "error" in r]
            summary.append(
                {
                    "rows": n,
                    "method": method,
                    **common.quantiles(errors),
                    "bottom_rate": sum(r["status"] == "bottom" for r in done) / len(done),
                    "median_wall_s": common.median([r["wall_s"] for r in done if "wall_s" in r]),
                }
            )
    parameters = {k: v for k, v in vars(args).items() if not k.endswith("_dir")}
    run.write(parameters, records, summary)
    print(markdown_table(summary, args.methods))
    print(f"\n{run.footer(str(parameters))}")
    return 0


def markdown_table(summary: list[dict], methods: list[str]) -> str:
    """Rows = n, columns = methods: 'median (p90)' of the matched error, ⊥ rate if any."""
    lines = ["| n | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for n in sorted({s["rows"] for s in summary}):
        cells = []
        for method in methods:
            found = [s for s in summary if s["rows"] == n and s["method"] == method]
            if not found:
                cells.append("—")
                continue
            s = found[0]
            if s["median"] is None:
                cells.append("refused: too few rows")
                continue
            cell = f"{s['median']:.3f} ({s['p90']:.3f})"
            if s["bottom_rate"]:
                cell += f", ⊥ {s['bottom_rate']:.0%}"
            cells.append(cell)
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
