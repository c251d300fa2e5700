"""The ``dpsub`` command: thin argument parsing over the library.

Exit codes: 0 success · 2 bad input or parameters (nothing written, no budget
spent) · 3 no stable subspace (manifest written, no basis) · 4 budget refused ·
1 unexpected failure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from dpsub_dist.errors import DpsubError, InputError


def _columns(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated column names")
    return names


def _storage_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected key=value")
    return key, value


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """--epsilon/--delta or --rho (with --delta), shared by every private command."""
    group = parser.add_argument_group("privacy budget")
    group.add_argument("--epsilon", type=float, help="ε of (ε, δ)-DP for the whole run")
    group.add_argument("--delta", type=float, help="δ of (ε, δ)-DP (with --rho: δ of the report)")
    group.add_argument("--rho", type=float, help="ρ of ρ-zCDP instead of --epsilon")


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """Input, columns, unit, cluster and output options shared by estimate-like commands."""
    parser.add_argument("input", help="Parquet file, folder or glob (local or s3://)")
    parser.add_argument("--out", required=True, help="output folder (must not exist)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--columns", type=_columns, help="comma-separated feature columns")
    parser.add_argument("--unit-column", help="user id column: user-level privacy")
    parser.add_argument("--scheduler", help="tcp://host:port of a running Dask scheduler")
    parser.add_argument("--workers", type=int, help="workers of the local cluster (default: cores)")
    parser.add_argument("--seed", type=int, help="public seed (assignment, reference points)")
    add_storage_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar or cluster banner")


def add_storage_arguments(parser: argparse.ArgumentParser) -> None:
    """--storage-option KEY=VALUE for s3:// (or other fsspec) inputs and outputs."""
    parser.add_argument(
        "--storage-option",
        type=_storage_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec/s3fs option, repeatable (e.g. endpoint_url=..., anon=true); "
        "secrets given here are never printed or written",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpsub", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    synth = sub.add_parser("synth", help="write Parquet data with a known subspace")
    synth.add_argument("out")
    synth.add_argument("--rows", type=int, required=True)
    synth.add_argument("--dim", type=int, required=True)
    synth.add_argument("--rank", type=int, required=True)
    synth.add_argument("--gamma", type=float, default=0.01)
    synth.add_argument("--model", choices=["gaussian", "sphere", "exact"], default="gaussian")
    synth.add_argument("--order", choices=["random", "adversarial"], default="random")
    synth.add_argument("--outlier-fraction", type=float, default=0.0)
    synth.add_argument("--partitions", type=int)
    synth.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    synth.add_argument("--clusters", type=int, help="points near a union of K subspaces")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--overwrite", action="store_true")
    synth.add_argument("--quiet", action="store_true")

    est = sub.add_parser("estimate", help="private top-k basis of a Parquet dataset")
    add_input_arguments(est)
    est.add_argument("--rank", type=int, required=True, help="K, the subspace dimension")
    add_budget_arguments(est)
    est.add_argument(
        "--method",
        default="friendly",
        help="friendly (default), histogram, gauss or gap-perturb (covariance: need --row-norm), "
        "or exact (SS21 GAP-MAX, small inputs only)",
    )
    est.add_argument("--subsets", type=int, help="T, number of disjoint subsets")
    est.add_argument("--ref-points", type=int, help="Q, number of reference points")
    est.add_argument("--assign", choices=["random", "contiguous"], default="random")
    est.add_argument("--radius", type=float, help="public friendly radius (skips its search)")
    est.add_argument("--cell-side", type=float, help="public histogram cell side (skips search)")
    est.add_argument(
        "--row-norm",
        type=float,
        help="gauss/gap-perturb (required): public bound B; longer rows are scaled down to B",
    )
    est.add_argument(
        "--center", action="store_true", help="gauss/gap-perturb: centre with a private mean"
    )
    est.add_argument("--outliers", type=int, help="exact: ℓ, outliers tolerated (default 0)")
    est.add_argument("--tolerance", type=float, help="exact: relative membership tolerance")
    est.add_argument(
        "--boost", type=int, metavar="B", help="run on B disjoint groups, keep an agreed estimate"
    )
    est.add_argument(
        "--boost-alpha", type=float, help="with --boost: groups agree within 2α (default 0.1)"
    )

    ev = sub.add_parser("evaluate", help="subspace error of a run against a true basis")
    ev.add_argument("run", help="the --out folder of a run")
    ev.add_argument("--truth", required=True, help="true basis .npy (d×k)")
    add_storage_arguments(ev)

    demo = sub.add_parser("demo", help="generate data, estimate on a local cluster, print error")
    demo.add_argument("--dir", default="demo-output", help="working folder (default demo-output)")
    demo.add_argument("--rows", type=int, default=200_000)
    demo.add_argument("--dim", type=int, default=50)
    demo.add_argument("--rank", type=int, default=4)
    return parser


def _version() -> str:
    from dpsub_dist import __version__

    return f"dpsub {__version__}"


def cmd_synth(args: argparse.Namespace) -> int:
    from dpsub_dist.synth import generate

    def report(done: int, total: int) -> None:
        if not args.quiet:
            print(
                f"\rwrote {done}/{total} files", end="\n" if done == total else "", file=sys.stderr
            )

    try:
        result = generate(
            args.out,
            rows=args.rows,
            dim=args.dim,
            rank=args.rank,
            gamma=args.gamma,
            model=args.model,
            order=args.order,
            outlier_fraction=args.outlier_fraction,
            partitions=args.partitions,
            dtype=args.dtype,
            seed=args.seed,
            clusters=args.clusters,
            overwrite=args.overwrite,
            progress=report,
        )
    except (ValueError, FileExistsError) as err:
        raise InputError(str(err)) from None
    print(f"wrote {result.rows} rows × {args.dim} columns to {args.out}")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from dpsub_dist.engine.cluster import dask_client
    from dpsub_dist.engine.sources import parquet_dataset
    from dpsub_dist.io.output import check_output_dir, write_run
    from dpsub_dist.io.storage import StorageOptions
    from dpsub_dist.job import EstimateConfig, run_estimate

    if args.radius is not None and args.method != "friendly":
        raise InputError("--radius applies to --method friendly: use --cell-side for histogram")
    if args.cell_side is not None and args.method != "histogram":
        raise InputError("--cell-side applies to --method histogram: use --radius for friendly")
    storage_options = StorageOptions.from_pairs(args.storage_option)
    config = EstimateConfig(
        rank=args.rank,
        epsilon=args.epsilon,
        delta=args.delta,
        rho=args.rho,
        method=args.method,
        subsets=args.subsets,
        ref_points=args.ref_points,
        assign=args.assign,
        unit_column=args.unit_column,
        columns=args.columns,
        seed=args.seed,
        scale=args.radius if args.radius is not None else args.cell_side,
        row_norm=args.row_norm,
        center=args.center,
        outliers=args.outliers,
        tolerance=args.tolerance,
        boost=args.boost,
        boost_alpha=args.boost_alpha,
        storage_options=storage_options,
    )
    config.validate()
    check_output_dir(args.out, args.overwrite, storage_options)

    def open_dataset(client):
        return parquet_dataset(args.input, args.columns, args.unit_column, storage_options, client)

    with dask_client(args.scheduler, args.quiet, args.workers) as client:
        result = run_estimate(config, open_dataset, client, progress=not args.quiet)
    out = write_run(args.out, result.basis, result.manifest, args.overwrite, storage_options)
    if result.basis is None:
        failed = result.manifest["release"].get("failed_step", "aggregation")
        reason = result.manifest["release"].get("failure_reason", "the subsets disagree")
        print(
            f"no stable subspace (step {failed}): {reason}; manifest in {args.out}",
            file=sys.stderr,
        )
        return 3
    where = out.rstrip("/")
    print(f"wrote {where}/basis.npy ({result.manifest['dim']}×{args.rank}) and manifest.json")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from dpsub_dist.io.output import read_npy, read_run
    from dpsub_dist.io.storage import StorageOptions
    from dpsub_dist.linalg import subspace_error

    storage_options = StorageOptions.from_pairs(args.storage_option)
    basis, manifest = read_run(args.run, storage_options)
    if basis is None:
        raise InputError(f"{args.run} has no basis (outcome {manifest.get('outcome')})")
    truth = read_npy(args.truth, storage_options)
    if truth.shape != basis.shape:
        raise InputError(f"truth shape {truth.shape} differs from the basis {basis.shape}")
    print(f"subspace_error={subspace_error(basis, truth):.6f}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    data, out = root / "data", root / "run"
    if not (data / "_truth" / "basis.npy").exists():
        cmd = [
            "synth",
            str(data),
            "--rows",
            str(args.rows),
            "--dim",
            str(args.dim),
            "--rank",
            str(args.rank),
            "--gamma",
            "0.01",
            "--partitions",
            "4",
            "--overwrite",
        ]
        main(cmd)
    code = main(
        [
            "estimate",
            str(data),
            "--rank",
            str(args.rank),
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--out",
            str(out),
            "--overwrite",
        ]
    )
    if code == 0:
        main(["evaluate", str(out), "--truth", str(data / "_truth" / "basis.npy")])
    return code


COMMANDS = {
    "synth": cmd_synth,
    "estimate": cmd_estimate,
    "evaluate": cmd_evaluate,
    "demo": cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except DpsubError as err:
        print(f"dpsub {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
