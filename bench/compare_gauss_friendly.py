"""gauss (DTTZ14 Alg. 1) vs friendly (sample and aggregate) on the same data: error and time.

Gaussian multiplicative-gap model (BENCHMARKS.md §1), K = 4, γ = gamma50·50/D (default
γ = 0.01·50/D: the gap shrinks as D grows, the SS21 Thm 1.2 regime), one dataset per
(n, D) cell, ``--runs`` private runs per method on it (fresh DP noise each), end to end from
Parquet on one local cluster shared by both methods (peers measured side by side). gauss
uses a public row norm bound ``--row-norm`` (default 2 ≈ the typical row norm √K).
Cells with more than ``--max-values`` n·D values are skipped and listed as such.

Writes ``RESULTS/compare_gauss_friendly.json`` and ``.md`` (the table for docs/covariance.md).

Example (the published run):
``python -m bench.compare_gauss_friendly --rows 1e4,1e5,1e6 --dims 50,500,2000 --runs 3``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import common

METHODS = ("gauss", "friendly")


def cell(run: common.BenchRun, rows: int, dim: int, client: Any, args: Any) -> list[dict[str, Any]]:
    """Every run of both methods on one (n, D) dataset."""
    gamma = args.gamma50 * 50 / dim
    partitions = max(2, min(64, rows * dim * 4 // (64 * 2**20) + 1))
    path, truth = common.dataset(
        args.data_dir, rows=rows, dim=dim, rank=args.rank, gamma=gamma, partitions=partitions
    )
    records = []
    for method in args.methods:
        extra = {"row_norm": args.row_norm} if method == "gauss" else {}
        for index in range(args.runs):
            common.log(f"n={rows} D={dim} {method} run {index + 1}/{args.runs}")
            record = common.run_dpsub(
                method,
                common.parquet_opener(path),
                rank=args.rank,
                epsilon=args.epsilon,
                delta=args.delta,
                seed=index,
                truth=truth,
                client=client,
                **extra,
            )
            records.append(
                {"rows": rows, "dim": dim, "gamma": gamma, "method": method, "run": index}
                | common.drop_arrays(record)
            )
    return records


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median error, ⊥ rate and median wall time per (n, D, method)."""
    table = []
    keys = sorted({(r["rows"], r["dim"], r["method"]) for r in records})
    for rows, dim, method in keys:
        mine = [r for r in records if (r["rows"], r["dim"], r["method"]) == (rows, dim, method)]
        table.append(
            {
                "rows": rows,
                "dim": dim,
                "method": method,
                "error": common.quantiles([r.get("error", 1.0) for r in mine]),
                "bottom_rate": sum(r["status"] != "ok" for r in mine) / len(mine),
                "wall_s_median": common.median([r["wall_s"] for r in mine]),
                "statuses": sorted({r["status"] for r in mine}),
            }
        )
    return table


def markdown(table: list[dict[str, Any]], skipped: list[tuple[int, int]], run: Any) -> str:
    """The comparison as a markdown table, one row per (n, D), gauss and friendly side by side."""
    lines = [
        "| n | D | gauss error (median) | friendly error (median) | friendly ⊥ rate "
        "| gauss time (s) | friendly time (s) | time ratio friendly/gauss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cells = sorted(
        {(r["rows"], r["dim"]) for r in table} | set(skipped), key=lambda c: (c[1], c[0])
    )
    for rows, dim in cells:
        if (rows, dim) in skipped:
            lines.append(f"| {rows:,} | {dim} | not run (size) | – | – | – | – | – |")
            continue
        by = {r["method"]: r for r in table if (r["rows"], r["dim"]) == (rows, dim)}
        gauss, friendly = by.get("gauss"), by.get("friendly")
        row = [f"{rows:,}", str(dim), _error(gauss), _error(friendly)]
        row.append(f"{friendly['bottom_rate']:.2f}" if friendly else "–")
        row += [_seconds(gauss), _seconds(friendly)]
        if gauss and friendly:
            row.append(f"{friendly['wall_s_median'] / gauss['wall_s_median']:.1f}")
        else:
            row.append("–")
        lines.append("| " + " | ".join(row) + " |")
    return (
        "\n".join(lines)
        + f"\n\n`{run.command}`\n\n{common.machine_line(run.machine, run.versions)}\n"
    )


def _warm_up() -> None:
    import dpsub_dist.engine.gram
    import dpsub_dist.io.parquet  # noqa: F401


def _error(record: dict[str, Any] | None) -> str:
    if record is None or record["error"]["median"] is None:
        return "–"
    return f"{record['error']['median']:.4f}"


def _seconds(record: dict[str, Any] | None) -> str:
    return "–" if record is None else f"{record['wall_s_median']:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("compare_gauss_friendly", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--dims", type=common.int_list, default=[50, 500, 2000])
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--gamma50", type=float, default=0.01, help="γ at D = 50 (γ ∝ 1/D)")
    parser.add_argument("--row-norm", type=float, default=2.0, help="gauss: public bound B")
    parser.add_argument("--runs", type=int, default=3, help="private runs per method and cell")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scheduler", help="tcp:// address of a running local cluster")
    parser.add_argument("--methods", type=common.str_list, default=list(METHODS))
    parser.add_argument("--max-values", type=float, default=2e8, help="skip cells with n·D above")
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("compare_gauss_friendly", args)
    records: list[dict[str, Any]] = []
    skipped: list[tuple[int, int]] = []
    with common.local_cluster(args.workers, args.scheduler) as client:
        client.run(_warm_up)  # imports on the workers, so the first cell is not charged for them
        for dim in args.dims:
            for rows in args.rows:
                if rows * dim > args.max_values:
                    common.log(f"skipping n={rows} D={dim}: n·D > --max-values {args.max_values:g}")
                    skipped.append((rows, dim))
                    continue
                records += cell(run, rows, dim, client, args)
    table = summarise(records)
    parameters = {
        "rank": args.rank,
        "gamma": f"{args.gamma50}·50/D",
        "row_norm": args.row_norm,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "runs": args.runs,
        "methods": args.methods,
        "workers": args.workers,
        "skipped_cells": skipped,
    }
    run.write(parameters, records, table)
    text = markdown(table, skipped, run)
    out = Path(args.results_dir) / "compare_gauss_friendly.md"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
