"""Utility vs dimension: error of dpsub's methods and the private peers as D grows, fixed n.

Gaussian multiplicative-gap model (BENCHMARKS.md §1) with γ = gamma_dim / D (the SS21
Thm 1.2 regime), several data seeds; reports the median and 90th percentile of
‖Π̂ − Π‖ over seeds (⊥, time-outs and failures count as 1, the useless answer) and the
rate of ⊥. dpsub reads the generated Parquet (threads scheduler, in process); the peers
run in their own venvs on the same rows (see ``bench/peers.py``).

Example (the published run):
``python -m bench.utility_dim --rows 20000 --dims 10,100,1000,10000 --seeds 3 --time-limit 120``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import common, peers


def plot_error(
    run: common.BenchRun, table: list[dict[str, Any]], key: str, footer: str, title: str
) -> list[Path]:
    """Median error with a bar up to the 90th percentile, one line per tool."""
    fig, axes = common.figure(run, footer, ncols=2 if key == "rows" else 1, width=9.5)
    err_ax = axes[0]
    tools = sorted({r["tool"] for r in table})
    for i, tool in enumerate(tools):
        rows = sorted((r for r in table if r["tool"] == tool), key=lambda r: r[key])
        for r in rows:  # nothing finished (time-outs, skipped): say so instead of a point
            if not {"ok", "bottom"} & set(r["statuses"]):
                err_ax.annotate(
                    f"{tool}: {'/'.join(sorted(r['statuses']))}",
                    (r[key], 0.95 - 0.06 * i),
                    fontsize=6,
                    ha="center",
                )
        rows = [r for r in rows if {"ok", "bottom"} & set(r["statuses"])]
        xs = [r[key] * (1 + 0.04 * (i - len(tools) / 2)) for r in rows]  # dodge overlaps
        med = [r["error"]["median"] for r in rows]
        p90 = [r["error"]["p90"] for r in rows]
        err_ax.errorbar(
            xs,
            med,
            yerr=[[0] * len(med), [b - a for a, b in zip(med, p90, strict=True)]],
            fmt="o-",
            capsize=3,
            label=tool,
        )
        if key == "rows":
            axes[1].plot([r[key] for r in rows], [r["bottom_rate"] for r in rows], "o-", label=tool)
    err_ax.set_xscale("log")
    err_ax.set_xlabel("D (columns)" if key == "dim" else "n (rows)")
    err_ax.set_ylabel("||P_hat - P||, median (bar: p90)")
    err_ax.set_ylim(-0.02, 1.05)
    err_ax.grid(True, which="both", alpha=0.3)
    err_ax.legend(fontsize=7)
    err_ax.set_title(title)
    if key == "rows":
        axes[1].set_xscale("log")
        axes[1].set_xlabel("n (rows)")
        axes[1].set_ylabel("rate of ⊥ (no stable subspace)")
        axes[1].set_ylim(-0.02, 1.05)
        axes[1].grid(True, which="both", alpha=0.3)
        axes[1].legend(fontsize=7)
        axes[1].set_title("⊥ rate")
    return [common.save(fig, run)]


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("utility_dim", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=lambda v: int(float(v)), default=20_000)
    parser.add_argument("--dims", type=common.int_list, default=[10, 100, 1000, 10_000])
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--gamma-dim", type=float, default=1.0, help="γ = gamma_dim / D")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--methods", type=common.str_list, default=["friendly", "histogram", "gauss"]
    )
    peers.add_peer_arguments(parser, "diffprivlib,opendp")
    args = common.parse_args(parser, argv)
    peers.check_peers(parser, args.peers)
    run = common.BenchRun.start("utility_dim", args)
    methods = common.available_methods(args.methods)
    records = []
    failures: dict = {}
    if run.replayed:
        records = run.replayed["records"]
    else:
        for d in args.dims:
            for seed in range(1, args.seeds + 1):
                path, truth, params = peers.dataset_for(args, args.rows, d, seed)
                records += peers.run_private_tools(
                    path, truth, params, methods, args.peers, args, seed, False, failures
                )
    table = peers.summarise(records, "dim")
    footer = (
        f"n={args.rows}, rank k={args.rank}, gaussian gap model gamma={args.gamma_dim}/D, "
        f"{args.seeds} seeds; eps={args.epsilon}, dpsub delta={args.delta} (peers pure eps); "
        f"peer limit {args.time_limit:.0f}s / {args.memory_limit_gib} GiB"
    )
    plots = (
        []
        if args.no_plot
        else plot_error(run, table, "dim", footer, f"utility vs dimension, n = {args.rows}")
    )
    parameters = {
        "rows": args.rows,
        "dims": args.dims,
        "rank": args.rank,
        "gamma": f"{args.gamma_dim} / D",
        "seeds": list(range(1, args.seeds + 1)),
        "methods": methods,
        "peers": args.peers,
        "epsilon": args.epsilon,
        "delta_dpsub": args.delta,
        "time_limit_s": args.time_limit,
        "memory_limit_gib": args.memory_limit_gib,
        "dpsub_source": "Parquet, threads scheduler in process (client=None)",
    }
    run.write(parameters, records, table, plots)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
