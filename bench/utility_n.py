"""Utility vs n: error of dpsub's methods (and optional peers) as n grows, fixed D; ⊥ rate.

Same model and statistics as ``bench.utility_dim`` (median / p90 over seeds, ⊥ = 1), plus
the rate of ⊥ ("no stable subspace") outcomes, which is what small n produces.

Example (the published run):
``python -m bench.utility_n --dim 100 --rows 2000,5000,20000,100000,500000 --seeds 5``.
"""

from __future__ import annotations

from bench import common, peers
from bench.utility_dim import plot_error


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("utility_n", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[2000, 5000, 20_000, 100_000])
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--gamma-dim", type=float, default=1.0, help="γ = gamma_dim / D")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--methods", type=common.str_list, default=["friendly", "histogram", "gauss"]
    )
    peers.add_peer_arguments(parser, "")
    args = common.parse_args(parser, argv)
    peers.check_peers(parser, args.peers)
    run = common.BenchRun.start("utility_n", args)
    methods = common.available_methods(args.methods)
    records = []
    failures: dict = {}
    if run.replayed:
        records = run.replayed["records"]
    else:
        for n in args.rows:
            for seed in range(1, args.seeds + 1):
                path, truth, params = peers.dataset_for(args, n, args.dim, seed)
                records += peers.run_private_tools(
                    path, truth, params, methods, args.peers, args, seed, False, failures
                )
    table = peers.summarise(records, "rows")
    footer = (
        f"D={args.dim}, rank k={args.rank}, gaussian gap model gamma={args.gamma_dim}/D, "
        f"{args.seeds} seeds; eps={args.epsilon}, delta={args.delta}"
    )
    plots = (
        []
        if args.no_plot
        else plot_error(run, table, "rows", footer, f"utility vs n, D = {args.dim}")
    )
    parameters = {
        "rows": args.rows,
        "dim": args.dim,
        "rank": args.rank,
        "gamma": f"{args.gamma_dim} / D",
        "seeds": list(range(1, args.seeds + 1)),
        "methods": methods,
        "peers": args.peers,
        "epsilon": args.epsilon,
        "delta_dpsub": args.delta,
    }
    run.write(parameters, records, table, plots)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
