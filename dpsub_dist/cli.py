"""The ``dpsub`` command: thin argument parsing over the library.

Exit codes: 0 success · 2 bad input or parameters (nothing written, no budget
spent) · 3 no stable subspace (manifest written, no basis) · 4 budget refused ·
5 run aborted: the scheduler was lost or the output could not be written (nothing
written or released) · 6 the run failed after reading its data (NaN, missing values,
ragged lists, or an error while it computed): nothing written, the budget is spent, the
detail is in an owner-only diagnostics file whose path is printed · 1 unexpected failure.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from dpsub_dist.errors import DataError, DpsubError, InputError, did_you_mean
from dpsub_dist.params import (
    BUDGET,
    COLUMNS,
    EXCLUDE_COLUMNS,
    RANK,
    REQUIRED,
    RUN_PARAMS,
    STORAGE_OPTIONS,
    UNIT_COLUMN,
    Param,
)


class Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for a misspelt option, subcommand or choice, and every
    usage error on one line (exit 2). (``suggest_on_error`` arrives only in Python 3.14.)"""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", ExamplesFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        if not self._subparsers and args is not None:  # a command's own options
            unknown = [word for word in _option_words(args) if not self._knows(word)]
            if unknown:
                names = self._option_string_actions
                listed = ", ".join(f"{word}{did_you_mean(word, names)}" for word in unknown)
                self.error(f"unrecognized arguments: {listed}")
        return super().parse_known_args(args, namespace)

    def _knows(self, word: str) -> bool:
        """An option of this command, or an unambiguous abbreviation argparse will expand."""
        return any(name.startswith(word) for name in self._option_string_actions)

    def error(self, message: str):
        chosen = re.search(r"invalid choice: '([^']*)'", message)
        if chosen:
            known = [c for action in self._actions if action.choices for c in action.choices]
            message = message.replace(" (choose", f"{did_you_mean(chosen[1], known)} (choose")
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _option_words(args: Sequence[str]) -> list[str]:
    """The ``--name`` words of a command line (without ``=value``), up to a bare ``--``."""
    words = []
    for arg in args:
        if arg == "--":
            break
        if arg.startswith("--"):
            words.append(arg.split("=", 1)[0])
    return words


class ExamplesFormatter(argparse.HelpFormatter):
    """Wraps descriptions and help as usual but keeps an ``examples:`` epilog's lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def examples(*commands: str) -> str:
    """The ``examples:`` epilog of a command's ``--help``."""
    return "examples:\n" + "\n".join(f"  {command}" for command in commands)


def _workers(text: str) -> int:
    """--workers: a local cluster has at least one worker."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be at least 1 (got {value}): omit --workers for one worker per core"
        )
    return value


LOCAL_WORKERS_HELP = (
    "workers of a local cluster, started whatever the table's size (default: one per core)"
)


def _storage_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected key=value")
    return key, value


def _dest(param: Param) -> str:
    return param.flag[2:].replace("-", "_")


def _words(param: Param):
    """The argparse type of a parameter read from one word (``--columns a,b``)."""

    def parse(text: str):
        value = param.parse(text)
        if not value:
            raise argparse.ArgumentTypeError(f"expected {param.need}, comma-separated")
        return value

    return parse


def add_param(parser, param: Param, help: str | None = None, **kwargs) -> None:
    """The flag of a run-level parameter, from its table entry."""
    if param.kind is bool:  # a switch: --standardize
        parser.add_argument(
            param.flag, dest=_dest(param), action="store_true", help=help or param.described
        )
        return
    kwargs.setdefault("metavar", param.metavar)
    if param is STORAGE_OPTIONS:  # --storage-option KEY=VALUE, once per option
        kwargs.update(type=_storage_option, action="append", default=[])
    else:
        kwargs["type"] = _words(param) if param.parse else param.kind
    parser.add_argument(param.flag, dest=_dest(param), help=help or param.described, **kwargs)


def run_values(args: argparse.Namespace, command: str) -> dict:
    """The run-level parameters of ``command`` as given on the command line, by config field."""
    from dpsub_dist.io.storage import StorageOptions

    values = {param.field: getattr(args, _dest(param)) for param in RUN_PARAMS[command]}
    if STORAGE_OPTIONS.field in values:
        values[STORAGE_OPTIONS.field] = StorageOptions.from_pairs(values[STORAGE_OPTIONS.field])
    return values


def add_budget_arguments(parser: argparse.ArgumentParser, scope: str = "for the whole run") -> None:
    """--epsilon/--delta or --rho (with --delta), shared by every private command."""
    group = parser.add_argument_group("privacy budget")
    epsilon, *rest = BUDGET
    add_param(group, epsilon, f"{epsilon.help} {scope}")
    for param in rest:
        add_param(group, param)


def add_run_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """The run-level parameters of ``command`` (:data:`dpsub_dist.params.RUN_PARAMS`): the
    required ones, the budget, then the data options."""
    for param in RUN_PARAMS[command]:
        if param.name in REQUIRED:
            add_param(parser, param, required=True)
    add_budget_arguments(parser)
    for param in RUN_PARAMS[command]:
        if param.name not in REQUIRED and param not in BUDGET:
            add_param(parser, param)


def add_input_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Input, output and cluster options shared by estimate-like commands, and the
    command's run-level parameters."""
    parser.add_argument("input", help="Parquet file, folder or glob (local or s3://)")
    parser.add_argument(
        "--out", required=True, help="output folder (must not exist; missing parents are created)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a previous run's --out")
    add_run_arguments(parser, command)
    add_scheduler_argument(parser)
    parser.add_argument("--workers", type=_workers, help=LOCAL_WORKERS_HELP)
    parser.add_argument(
        "--memory-limit",
        help="memory limit of each local-cluster worker, e.g. 1GiB (default: 80%% of the "
        "machine's memory shared among the workers); Dask spills, pauses and restarts a "
        "worker against it",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or cluster banner")


def add_scheduler_argument(
    parser: argparse.ArgumentParser, scope: str = "", default: str | None = None
) -> None:
    """--scheduler: where the tasks run (:mod:`dpsub_dist.engine.cluster`); ``default``: what
    omitting it does, where not the choice from the table's size."""
    from dpsub_dist.engine.cluster import CHOSEN_DEFAULT, SCHEDULER_HELP

    parser.add_argument("--scheduler", help=f"{scope}{SCHEDULER_HELP}; {default or CHOSEN_DEFAULT}")


def add_storage_arguments(parser: argparse.ArgumentParser) -> None:
    """--storage-option KEY=VALUE for s3:// (or other fsspec) inputs and outputs."""
    add_param(parser, STORAGE_OPTIONS)


def add_method_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """--method and one flag per parameter the command's methods declare (dpsub_dist.methods)."""
    from dpsub_dist.methods import DEFAULTS, REGISTRY, add_arguments

    listed = "; ".join(f"{name}: {m.summary}" for name, m in REGISTRY[command].items())
    parser.add_argument("--method", default=DEFAULTS[command], help=listed)
    add_arguments(parser, command)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dpsub",
        description=__doc__.splitlines()[0],
        epilog=examples("dpsub demo", "dpsub estimate --help"),
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    synth = sub.add_parser(
        "synth",
        help="write Parquet data with a known subspace",
        description="Write synthetic Parquet rows near a known subspace (OUT/part-*.parquet) "
        "and the true basis (OUT/_truth/basis.npy) to test estimates against.",
        epilog=examples(
            "dpsub synth data/gauss --rows 200000 --dim 50 --rank 4",
            "dpsub synth data/wide --rows 100000 --dim 10000 --rank 3 --model polynomial "
            "--vector-column",
        ),
    )
    synth.add_argument("out", help="output folder (Parquet files and _truth/)")
    synth.add_argument("--rows", type=int, required=True, help="n, the number of rows")
    synth.add_argument("--dim", type=int, required=True, help="D, the number of features")
    synth.add_argument("--rank", type=int, required=True, help="k, the true subspace dimension")
    synth.add_argument(
        "--gamma",
        type=float,
        default=0.01,
        help="γ, the noise off the subspace (gaussian, sphere; default 0.01)",
    )
    synth.add_argument(
        "--model",
        choices=["gaussian", "sphere", "exact", "polynomial"],
        default="gaussian",
        help="how rows are drawn (default gaussian; see dpsub_dist/synth.py)",
    )
    synth.add_argument(
        "--decay",
        type=float,
        default=1.0,
        help="polynomial: eigenvalues λ_i = i^(−DECAY), no gap (default 1)",
    )
    synth.add_argument(
        "--order",
        choices=["random", "adversarial"],
        default="random",
        help="row order; adversarial: long runs along one direction, which defeats "
        "contiguous subsets (default random)",
    )
    synth.add_argument(
        "--outlier-fraction",
        type=float,
        default=0.0,
        help="fraction of rows replaced by huge outliers (default 0)",
    )
    synth.add_argument(
        "--partitions", type=int, help="number of Parquet files (default: from the size)"
    )
    synth.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        default="float32",
        help="column type (default float32)",
    )
    synth.add_argument(
        "--vector-column",
        action="store_true",
        help="write the features as one fixed_size_list<DTYPE>[DIM] column named x (the "
        "layout of embeddings; fast to read at large --dim) instead of columns x0..x{DIM-1}; "
        "same rows, values and truth",
    )
    synth.add_argument("--clusters", type=int, help="points near a union of K subspaces")
    synth.add_argument("--seed", type=int, default=0, help="seed of the data (default 0)")
    synth.add_argument("--overwrite", action="store_true", help="replace an OUT that synth wrote")
    synth.add_argument("--quiet", action="store_true", help="no progress bar")

    est = sub.add_parser(
        "estimate",
        help="private top-k basis of a Parquet dataset",
        description="Write a differentially private rank-k basis of a Parquet table's numeric "
        "columns (basis.npy, manifest.json) to --out. The budget covers the whole run.",
        epilog=examples(
            "dpsub estimate events.parquet --rank 3 --epsilon 1 --delta 1e-6 --out runs/events",
            "dpsub estimate data/ --rank 4 --method gauss --exclude-columns 'label,*_score' "
            "--epsilon 1 --delta 1e-6 --out runs/k4",
        ),
    )
    add_input_arguments(est, "estimate")
    add_method_arguments(est, "estimate")

    clu = sub.add_parser(
        "cluster",
        help="private subspace clustering: K bases of one rank",
        epilog=examples(
            "dpsub cluster data/ --clusters 3 --rank 2 --epsilon 1 --delta 1e-6 --out runs/c3"
        ),
    )
    add_input_arguments(clu, "cluster")
    add_method_arguments(clu, "cluster")

    ev = sub.add_parser(
        "evaluate",
        help="error of a run against a true basis, or variance it captures on data",
        description="Operator checks of a released basis; they print and write nothing. "
        "--truth: subspace error ‖Π̂ − Π‖ against an orthonormal true basis. --data: the "
        "captured-variance ratio tr(V̂ᵀΣV̂)/Σ_{i≤k}λᵢ on the given rows against their exact, "
        "non-private top-k PCA (1.0: as good as PCA). --data reads the data without privacy: "
        "its numbers are for the operator, not for publication.",
        epilog=examples(
            "dpsub evaluate runs/k4 --truth data/gauss/_truth/basis.npy",
            "dpsub evaluate runs/events --data events.parquet",
        ),
    )
    ev.add_argument("run", help="the --out folder of a run")
    ev.add_argument("--truth", help="true basis .npy (d×k, or K×d×q), orthonormal columns")
    ev.add_argument(
        "--data",
        help="Parquet file, folder or glob holding the run's columns (e.g. its input): "
        "compare with the exact PCA of these rows",
    )
    ev.add_argument(
        "--no-center",
        dest="center",
        action="store_false",
        help="with --data: uncentred second moments instead of the covariance (for runs "
        "that estimate the uncentred subspace)",
    )
    add_scheduler_argument(ev, "with --data: ")
    ev.add_argument("--workers", type=_workers, help=f"with --data: {LOCAL_WORKERS_HELP}")
    ev.add_argument("--quiet", action="store_true", help="no progress bar or cluster banner")
    add_storage_arguments(ev)

    add_inspect_command(sub)
    add_transform_command(sub)

    demo = sub.add_parser(
        "demo",
        help="generate data, estimate on a local cluster, print error",
        description="End to end on synthetic data with a known answer: synth writes Gaussian "
        "rows near a rank-RANK subspace (off-subspace noise γ = 0.01) to DIR/data (kept for "
        "reruns), estimate runs the default method at ε = 1, δ = 1e-6 on a local cluster "
        "into DIR/run, evaluate prints the subspace error against the true basis (0 is "
        "perfect, 1 useless). For your own table see docs/real-data.md.",
        epilog=examples("dpsub demo", "dpsub demo --dir /tmp/demo --rows 1000000 --dim 100"),
    )
    demo.add_argument("--dir", default="demo-output", help="working folder (default demo-output)")
    demo.add_argument("--rows", type=int, default=200_000, help="n (default 200000)")
    demo.add_argument("--dim", type=int, default=50, help="D, columns (default 50)")
    demo.add_argument("--rank", type=int, default=4, help="k, subspace dimension (default 4)")
    add_scheduled_commands(sub)
    from dpsub_dist.report.command import add_report_command

    report = add_report_command(
        sub,
        examples(
            "dpsub report run/",
            "dpsub report --operator run/",
            "dpsub report --ledger ledger.db --out ledger.html",
        ),
    )
    add_storage_arguments(report)
    return parser


def add_inspect_command(sub) -> None:
    """``dpsub inspect INPUT``: the operator's look at a table before a run (reads rows)."""
    inspect = sub.add_parser(
        "inspect",
        help="per column: what a run would do with it, its type, nulls and values (operator "
        "only: reads the data, not a private release)",
        description="Read a Parquet table (as estimate does: file, folder or glob, local or "
        "s3://) and print, per column, what the run's default does with it (feature, or left "
        "out and why), its type, null and non-finite counts, range and quantiles, then the "
        "options that would change the outcome. It reads the data without privacy, for the "
        "operator: never forward or publish its output as a run's.",
        epilog=examples(
            "dpsub inspect events.parquet",
            "dpsub inspect data/ --exclude-columns 'label,*_score' --unit-column user_id",
        ),
    )
    inspect.add_argument("input", help="Parquet file, folder or glob (local or s3://)")
    for param in (COLUMNS, EXCLUDE_COLUMNS, UNIT_COLUMN, STORAGE_OPTIONS):
        add_param(inspect, param)


def cmd_inspect(args: argparse.Namespace) -> int:
    from dpsub_dist.inspection import inspect_table

    print(inspect_table(args))
    return 0


def add_transform_command(sub) -> None:
    """``dpsub transform``: its body is :mod:`dpsub_dist.transform`."""
    tr = sub.add_parser(
        "transform",
        help="project Parquet rows onto a run's basis (no budget)",
        description="Project every row of INPUT onto the basis RUN published, centred or "
        "standardised with the run's released values exactly as the run did, and write "
        "Parquet with columns pc1…pcK (one row per input row, in input order) and "
        "_transform.json to --out. Post-processing of the release: no budget is spent. The "
        "output holds your rows, projected without noise: it is your data, not a release.",
        epilog=examples(
            "dpsub transform runs/k4 new-events/ --out projected/",
            "dpsub transform runs/k4 s3://bucket/events/ --out s3://bucket/pcs/ "
            "--keep-columns user_id,ts",
        ),
    )
    tr.add_argument("run", help="the --out folder of an estimate run (local or s3://)")
    tr.add_argument("input", help="Parquet file, folder or glob with the run's columns")
    tr.add_argument(
        "--out", required=True, help="output folder (must not exist; missing parents are created)"
    )
    tr.add_argument(
        "--keep-columns",
        metavar="A,B",
        help="input columns copied through untouched beside the components (e.g. user_id,ts)",
    )
    tr.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_scheduler_argument(tr)
    tr.add_argument("--workers", type=_workers, help=LOCAL_WORKERS_HELP)
    tr.add_argument("--memory-limit", help="memory limit of each local-cluster worker, e.g. 1GiB")
    tr.add_argument("--quiet", action="store_true", help="no progress bar or cluster banner")
    add_storage_arguments(tr)


def cmd_transform(args: argparse.Namespace) -> int:
    from dpsub_dist.transform import cmd_transform as run_transform

    return run_transform(args)


def _version() -> str:
    from dpsub_dist import __version__

    return f"dpsub {__version__}"


def cmd_synth(args: argparse.Namespace) -> int:
    from dpsub_dist.engine.progress import Progress
    from dpsub_dist.synth import generate

    shown: list[Progress] = []  # a live bar on a terminal, plain periodic lines in a log

    def report(done: int, total: int) -> None:
        if args.quiet:
            return
        if not shown:
            shown.append(Progress(total, f"writing {args.out}", rows=args.rows).__enter__())
        shown[0].update(done)
        if done == total:
            shown[0].__exit__(None, None, None)

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
            vector_column=args.vector_column,
            decay=args.decay,
        )
    except (ValueError, FileExistsError) as err:
        raise InputError(str(err)) from None
    if args.vector_column:
        print(f"wrote {result.rows} rows × {args.dim} features (vector column x) to {args.out}")
    else:
        print(f"wrote {result.rows} rows × {args.dim} columns to {args.out}")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from dpsub_dist.job import EstimateConfig, run_estimate

    return run_to_output(args, EstimateConfig, run_estimate)


def run_to_output(args: argparse.Namespace, make_config, runner) -> int:
    """Build the config from the flags the method declares, validate, check --out, run on the
    Dask cluster or in process (:func:`~dpsub_dist.engine.cluster.run_place`), write
    atomically; exit 3 for ⊥."""
    from dpsub_dist.diagnostics import keep_run_timings, private_phase
    from dpsub_dist.engine.cluster import run_place
    from dpsub_dist.engine.progress import closing_line, numbered_passes
    from dpsub_dist.engine.sources import parquet_dataset
    from dpsub_dist.io.output import check_output_dir, write_run
    from dpsub_dist.job import validate
    from dpsub_dist.methods import given_arguments

    config = make_config(
        **run_values(args, args.command),
        method=args.method,
        **given_arguments(args, args.command),
    )
    validate(config)
    storage_options = config.storage_options
    check_output_dir(args.out, args.overwrite, storage_options, [args.input])

    def open_dataset(client):
        dataset = parquet_dataset(
            args.input,
            config.columns,
            config.unit_column,
            storage_options,
            client,
            config.exclude_columns,
        )
        if config.unit_column is None:  # n is public at row level: every pass's rows/s
            passes.rows = dataset.n_rows
        return dataset

    row_level = config.unit_column is None
    where = (args.scheduler, open_dataset, row_level, args.quiet, args.workers, args.memory_limit)
    with private_phase(args.command), numbered_passes() as passes:  # rows read: fails as data
        with run_place(*where) as (client, opened):
            result = runner(config, opened, client, progress=not args.quiet)
    out = write_run(args.out, result.basis, result.manifest, args.overwrite, storage_options)
    keep_run_timings(args.out, result.manifest, result.timings)
    if not args.quiet:
        print(closing_line(result.manifest), file=sys.stderr)
    if result.basis is None:
        failed = result.manifest["release"].get("failed_step", "aggregation")
        reason = result.manifest["release"].get("failure_reason", "the subsets disagree")
        print(
            f"no stable subspace (step {failed}): {reason}; manifest in {args.out}",
            file=sys.stderr,
        )
        return 3
    where = out.rstrip("/")
    shape = "×".join(str(size) for size in result.basis.shape)
    print(f"wrote {where}/basis.npy ({shape}) and manifest.json{columns_used(result.manifest)}")
    return 0


SHOWN_COLUMNS = 8


def columns_used(manifest: dict) -> str:
    """`` from N columns: a, b, …; left out: user_id (identifier), …`` for the success line:
    names and reasons from the schema, no data."""
    from dpsub_dist.io.parquet import describe_left_out

    columns = manifest.get("columns") or []
    if not columns:
        return ""
    shown = ", ".join(columns[:SHOWN_COLUMNS])
    more = ", … (manifest lists all)" if len(columns) > SHOWN_COLUMNS else ""
    noun = "column" if len(columns) == 1 else "columns"
    line = f" from {len(columns)} {noun}: {shown}{more}"
    left_out = describe_left_out(manifest.get("columns_left_out") or {}, SHOWN_COLUMNS)
    return line + (f"; left out: {left_out} (--columns to choose)" if left_out else "")


def cmd_cluster(args: argparse.Namespace) -> int:
    from dpsub_dist.job import ClusterConfig, run_cluster

    code = run_to_output(args, ClusterConfig, run_cluster)
    if args.method == "gibbs":
        from dpsub_dist.privacy.subspace_clustering import GIBBS_WARNING

        print(GIBBS_WARNING, file=sys.stderr)
    return code


def cmd_evaluate(args: argparse.Namespace) -> int:
    from dpsub_dist import evaluate
    from dpsub_dist.io.output import read_npy, read_run
    from dpsub_dist.io.storage import StorageOptions
    from dpsub_dist.linalg import subspace_error

    if args.truth is None and args.data is None:
        raise InputError("nothing to compare with: pass --truth BASIS.npy and/or --data PARQUET")
    storage_options = StorageOptions.from_pairs(args.storage_option)
    basis, manifest = read_run(args.run, storage_options)
    if basis is None:
        raise InputError(f"{args.run} has no basis (outcome {manifest.get('outcome')})")
    if args.data is not None and basis.ndim != 2:
        raise InputError("--data applies to runs with one basis (estimate), not cluster runs")
    if args.truth is not None:
        truth = read_npy(args.truth, storage_options)
        if truth.shape != basis.shape:
            raise InputError(f"truth shape {truth.shape} differs from the basis {basis.shape}")
        evaluate.check_orthonormal(truth, f"--truth {args.truth}")
        if basis.ndim == 3:  # a cluster run: K bases, matched to the true ones
            from dpsub_dist.methods._clustering import matched_subspace_errors

            errors = matched_subspace_errors(basis, truth)
            listed = ",".join(f"{e:.6f}" for e in errors)
            print(f"subspace_error={errors.max():.6f} per_cluster={listed}")
        else:
            print(f"subspace_error={subspace_error(basis, truth):.6f}")
    if args.data is not None:
        print(evaluate_on_data(args, basis, manifest.get("columns"), storage_options))
    return 0


def evaluate_on_data(args: argparse.Namespace, basis, columns, storage_options) -> str:
    """The two lines of ``evaluate --data``: what was read, then the key=value metrics."""
    from dpsub_dist import evaluate
    from dpsub_dist.engine.cluster import run_place
    from dpsub_dist.engine.compute import Executor
    from dpsub_dist.engine.sources import parquet_dataset

    def open_data(executor: Executor):
        return parquet_dataset(args.data, columns, None, storage_options, executor)

    where = (args.scheduler, open_data, True, args.quiet, args.workers)  # n: the operator's
    with run_place(*where) as (client, opened):
        executor = Executor(client)
        dataset = opened(executor)
        moments = evaluate.data_moments(dataset, executor, progress=not args.quiet)
    check = evaluate.captured_variance(basis, moments, args.center)
    shown = ", ".join(dataset.columns[:SHOWN_COLUMNS])
    shown += ", …" if len(dataset.columns) > SHOWN_COLUMNS else ""
    what = "centred covariance" if args.center else "uncentred second moments"
    return (
        f"operator check, not a release (reads the data without privacy: do not publish): "
        f"{check.rows} rows × {dataset.dim} features ({shown}) of {args.data}, "
        f"top-{check.rank} exact PCA of the {what}\n{check.line()}"
    )


def cmd_demo(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    data, out = root / "data", root / "run"
    if (data / "_truth" / "basis.npy").exists():
        print(f"step 1 of 3: data kept from an earlier demo in {data}", file=sys.stderr)
    else:
        print(f"step 1 of 3: synthetic data with a known answer → {data}", file=sys.stderr)
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
    print(f"step 2 of 3: private rank-{args.rank} basis → {out}", file=sys.stderr)
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
        print("step 3 of 3: error against the true basis", file=sys.stderr)
        main(["evaluate", str(out), "--truth", str(data / "_truth" / "basis.npy")])
    return code


BUDGET_INIT_EXAMPLE = (
    "dpsub budget init --ledger ledger.db --dataset /data/events --epsilon 10 --delta 1e-5"
)
STREAM_INIT_EXAMPLE = "dpsub stream init events.stream --rank 3 --horizon 30 --rho 0.5 --delta 1e-6"
STREAM_APPEND_EXAMPLE = "dpsub stream append events.stream batches/day-01.parquet --out runs/day-01"
"""Examples shown both in a group's ``--help`` and in its subcommand's."""


def add_scheduled_commands(sub) -> None:
    """``dpsub run``, ``dpsub budget …`` and ``dpsub stream …`` (scheduled, ledgered runs)."""
    from dpsub_dist.methods import DEFAULTS, add_arguments

    run = sub.add_parser(
        "run",
        help="run a job file under the privacy-budget ledger",
        epilog=examples(
            "dpsub run pipelines/events-basis.yaml --check",
            "dpsub run pipelines/events-basis.yaml --run-id events-basis-2024-06-01",
        ),
    )
    run.add_argument("job", help="job file (.yaml; see pipelines/)")
    run.add_argument(
        "--run-id",
        help="run id (default <job name>-<UTC date>-<job hash>); schedulers pass one derived "
        "from the logical date. Re-running a published id charges nothing",
    )
    run.add_argument("--ledger", help="ledger file or postgresql:// URL (overrides the job's)")
    run.add_argument(
        "--check",
        action="store_true",
        help="check without running: the job, the ledger and the budget left, the dataset's "
        "footers and the output folder (exit code as a run would fail; nothing written)",
    )
    add_scheduler_argument(run, "overrides the job's; ")
    run.add_argument("--workers", type=_workers, help=LOCAL_WORKERS_HELP)
    run.add_argument("--quiet", action="store_true", help="no progress bar or cluster banner")

    budget = sub.add_parser(
        "budget",
        help="the privacy-budget ledger: init, show, history",
        epilog=examples(
            BUDGET_INIT_EXAMPLE,
            "dpsub budget show --ledger ledger.db",
        ),
    )
    budget_sub = budget.add_subparsers(dest="budget_command", required=True, metavar="COMMAND")
    init = budget_sub.add_parser(
        "init",
        help="grant a dataset its total budget",
        epilog=examples(BUDGET_INIT_EXAMPLE),
    )
    init.add_argument("--ledger", required=True, help="ledger file (created) or postgresql:// URL")
    init.add_argument("--dataset", required=True, help="dataset URI, as the jobs name it")
    init.add_argument("--unit-column", help="user id column: grant for user-level privacy")
    add_budget_arguments(init, "of the dataset's total grant: all its runs together, ever")
    for name, text in (("show", "granted, spent and remaining"), ("history", "every run")):
        view = budget_sub.add_parser(
            name,
            help=f"{text} per dataset",
            epilog=examples(f"dpsub budget {name} --ledger ledger.db --dataset /data/events"),
        )
        view.add_argument("--ledger", required=True, help="ledger file or postgresql:// URL")
        view.add_argument("--dataset", help="only this dataset URI")
        view.add_argument("--json", action="store_true", help="machine-readable output")

    stream = sub.add_parser(
        "stream",
        help="online private PCA over a stream of batches",
        epilog=examples(
            STREAM_INIT_EXAMPLE,
            STREAM_APPEND_EXAMPLE,
        ),
    )
    stream_sub = stream.add_subparsers(dest="stream_command", required=True, metavar="COMMAND")
    s_init = stream_sub.add_parser(
        "init",
        help="create a stream for a fixed horizon and its whole budget",
        description="The budget covers the stream's whole horizon: all T batches together, "
        "not each batch. With --ledger and --dataset it is charged at once to the dataset's "
        "grant; without them the stream is not tracked by any ledger.",
        epilog=examples(STREAM_INIT_EXAMPLE),
    )
    s_init.add_argument("state", help="stream file to create (SQLite, 0600; beside it the "
                        "operator-only STATE.private)")  # fmt: skip
    add_param(s_init, RANK, required=True)
    add_param(s_init, COLUMNS)
    s_init.add_argument(
        "--ledger", help="ledger file or postgresql:// URL: charge the whole budget to --dataset"
    )
    s_init.add_argument(
        "--dataset", help="dataset URI as granted (dpsub budget init); batches must lie under it"
    )
    add_budget_arguments(s_init, "for the stream's whole horizon (all T batches together)")
    add_arguments(s_init, "stream", "stream options")  # methods/stream.py
    s_init.set_defaults(method=DEFAULTS["stream"])
    s_append = stream_sub.add_parser(
        "append",
        help="add one batch and release the new basis",
        epilog=examples(STREAM_APPEND_EXAMPLE),
    )
    s_append.add_argument("state", help="stream state file")
    s_append.add_argument("batch", help="the batch: Parquet file, folder or glob")
    s_append.add_argument("--out", help="write the release (basis.npy, manifest.json) here")
    s_append.add_argument("--overwrite", action="store_true", help="replace a previous run's --out")
    s_append.add_argument(
        "--batch-id",
        help="batch id (default: the batch URI); appending an id again re-releases that step "
        "and changes nothing",
    )
    add_scheduler_argument(s_append)
    s_append.add_argument("--workers", type=_workers, help="workers of the local cluster")
    add_storage_arguments(s_append)
    s_append.add_argument("--quiet", action="store_true", help="no progress bar or banner")
    s_show = stream_sub.add_parser(
        "show",
        help="progress, budget and (with --out) the release",
        epilog=examples("dpsub stream show events.stream --out runs/latest"),
    )
    s_show.add_argument("state", help="stream state file")
    s_show.add_argument("--out", help="write the latest release here")
    s_show.add_argument("--overwrite", action="store_true", help="replace a previous run's --out")
    add_storage_arguments(s_show)
    s_show.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_run(args: argparse.Namespace) -> int:
    from dpsub_dist.jobfile import describe_outcome, load_job, run_job

    job = load_job(args.job)
    if args.check:
        from dpsub_dist.preflight import exit_code, preflight

        checks = preflight(job, args.run_id, args.ledger)
        print("\n".join(check.line() for check in checks))
        return exit_code(checks)
    outcome = run_job(
        job,
        args.run_id,
        args.ledger,
        scheduler=args.scheduler,
        workers=args.workers,
        quiet=args.quiet,
    )
    print(describe_outcome(outcome))
    if outcome.exit_code == 3:
        print(f"no stable subspace: manifest in {outcome.output}", file=sys.stderr)
    return outcome.exit_code


def cmd_budget(args: argparse.Namespace) -> int:
    import json

    from dpsub_dist.ledger import dataset_key, open_ledger, unit_name
    from dpsub_dist.ledger.core import describe_budget, public_outcome
    from dpsub_dist.privacy.accountant import parse_budget

    dataset = dataset_key(args.dataset) if args.dataset else None
    if args.budget_command == "init":
        total = parse_budget(args.epsilon, args.delta, args.rho)
        with open_ledger(args.ledger, create=True) as ledger:
            grant, created = ledger.grant(dataset, unit_name(args.unit_column), total)
        verb = "granted" if created else "already granted"
        print(f"{verb} {grant.dataset} ({grant.unit}): {describe_budget(grant.total)}")
        return 0
    with open_ledger(args.ledger) as ledger:
        if args.budget_command == "show":
            rows = ledger.status(dataset)
            if args.json:
                print(json.dumps([_status_json(r) for r in rows], indent=2))
            for r in [] if args.json else rows:
                unfinished = r.runs.get("reserved", 0) + r.runs.get("publishing", 0)
                print(
                    f"{r.grant.dataset}  unit {r.grant.unit}\n"
                    f"  granted    {describe_budget(r.grant.total)}\n"
                    f"  published  {describe_budget(r.published)}  "
                    f"({r.runs.get('published', 0)} runs)\n"
                    f"  reserved   {describe_budget(r.reserved)}  "
                    f"({unfinished} unfinished runs: resume them by run id)\n"
                    f"  failed     {describe_budget(r.failed)}  "
                    f"({r.runs.get('failed', 0)} runs that failed after reading their data)\n"
                    f"  remaining  {describe_budget(r.remaining)}"
                )
            return 0
        records = ledger.history(dataset)
    if args.json:
        print(json.dumps([r.public_view() for r in records], indent=2))
        return 0
    for r in records:
        print(
            f"{r.reserved_at}  {r.run_id}  {r.state:<10}  {describe_budget(r.charge)}  "
            f"{public_outcome(r.state, r.outcome) or '-'}  {r.output}  ({r.dataset})"
        )
    return 0


def _status_json(status) -> dict:
    from dpsub_dist.ledger.core import budget_fields

    return {
        "dataset": status.grant.dataset,
        "unit": status.grant.unit,
        "granted_at": status.grant.granted_at,
        "granted": budget_fields(status.grant.total),
        "published": budget_fields(status.published),
        "reserved": budget_fields(status.reserved),
        "failed": budget_fields(status.failed),
        "remaining": budget_fields(status.remaining),
        "runs": status.runs,
        "accountant": status.report,
    }


def cmd_stream(args: argparse.Namespace) -> int:
    import json

    from dpsub_dist.io.output import check_output_dir, write_run
    from dpsub_dist.io.storage import StorageOptions
    from dpsub_dist.methods.stream import (
        UNTRACKED,
        describe_bound_and_centre,
        ledger_charge,
        open_stream,
    )

    if args.stream_command == "init":
        from dpsub_dist.job import StreamConfig, init_stream
        from dpsub_dist.methods import given_arguments

        config = StreamConfig(
            **run_values(args, "stream"),
            ledger=args.ledger,
            dataset=args.dataset,
            **given_arguments(args, "stream"),
        )
        settings = init_stream(args.state, config)
        bound = (
            f"row norms clipped to {settings.clip_norm:g}"
            if settings.clip_norm is not None
            else "row-norm bound chosen privately from the first batch"
        )
        centred = "centred at the first batch's private mean" if settings.center else "uncentred"
        print(
            f"created stream {args.state}: horizon {settings.horizon} batches, "
            f"{settings.levels} tree levels, rho={settings.rho:.6g} for the whole horizon, "
            f"node noise sigma={settings.node_sigma:.6g}; {centred}, {bound}"
        )
        if settings.ledger is None:
            print(f"warning: stream {args.state} is {UNTRACKED}", file=sys.stderr)
        else:
            from dpsub_dist.ledger import open_ledger
            from dpsub_dist.ledger.core import describe_budget

            entry = settings.ledger
            with open_ledger(args.ledger) as book:
                remaining = book.status(entry["dataset"])[0].remaining
            print(
                f"reserved {describe_budget(ledger_charge(settings))} of {entry['dataset']} "
                f"in {entry['location']} (run id {entry['run_id']}); "
                f"{describe_budget(remaining)} remains"
            )
        return 0
    options = StorageOptions.from_pairs(args.storage_option)
    with open_stream(args.state) as stream:
        if args.stream_command == "append":
            from dpsub_dist.engine.cluster import batch_place

            if args.out:
                check_output_dir(args.out, args.overwrite, options, [args.batch, args.state])
            columns = stream.settings.columns
            where = (args.scheduler, args.batch, columns, options, args.quiet, args.workers)
            with batch_place(*where) as (client, footers):
                release = stream.append(
                    args.batch,
                    args.batch_id,
                    options,
                    client,
                    progress=not args.quiet,
                    footers=footers,
                )
            left, total = stream.accountant().remaining.rho, stream.settings.rho
            verb = "already appended; re-released" if release.already_appended else "appended"
            print(
                f"{verb} step {release.step}/{stream.settings.horizon}: this batch charged "
                f"rho={release.charged_rho:.6g}; rho={left:.6g} of {total:.6g} remains"
            )
        else:
            if args.out:  # before anything is printed
                check_output_dir(args.out, args.overwrite, options, [args.state])
            status = stream.status()
            if args.json:
                print(json.dumps(status, indent=2))
            else:
                spent = status["budget"]["spent_as_approx_dp"]
                print(
                    f"stream {args.state}: step {status['step']}/{stream.settings.horizon}, "
                    f"spent rho={status['budget']['spent']['rho']:.6g} of "
                    f"{stream.settings.rho:.6g} (epsilon={spent['epsilon']:.4g}, "
                    f"delta={spent['delta']:.3g})"
                )
                for line in describe_bound_and_centre(status["bound_and_centre"]):
                    print(f"  {line}")
                entry = stream.settings.ledger
                print(
                    f"  charged to {entry['dataset']} in ledger {entry['location']} "
                    f"(run id {entry['run_id']})"
                    if entry
                    else f"  {UNTRACKED}"
                )
            if not args.out:
                return 0
            release = stream.latest_release()
            if release is None:
                raise InputError(
                    f"stream {args.state} has released no basis yet: append a batch first"
                )
        if args.out:
            write_run(args.out, release.basis, release.manifest, args.overwrite, options)
            print(f"wrote {args.out}/basis.npy and manifest.json (step {release.step})")
    return 0


INSPECT_NEXT = "next: dpsub inspect INPUT shows each column's missing and non-finite values"
"""The exit-6 line's next step: the same words whatever the data (the line is published)."""


def data_error_report(args: argparse.Namespace, err: DataError) -> str:
    """The published line for data that failed validation; the detail goes to the operator.

    Exit code, stderr and the ledger are published, and the detail (counts, columns, row
    positions) depends on private values, so it is written to an owner-only diagnostics
    file (:mod:`dpsub_dist.diagnostics`) and only that file's path is printed.
    """
    from dpsub_dist.diagnostics import DIAGNOSTICS_ENV, write_diagnostics

    failed = f"{err.public_message} ({INSPECT_NEXT})"
    try:
        path = write_diagnostics(args.command, str(err), getattr(args, "run_id", None))
    except OSError as problem:
        where = f"could not write the diagnostics file ({type(problem).__name__}): set "
        return f"{failed}; {where}{DIAGNOSTICS_ENV} to a writable folder"
    return f"{failed}; details for the operator in {path}"


def cmd_report(args: argparse.Namespace) -> int:
    from dpsub_dist.report.command import run_report_command

    return run_report_command(args)


COMMANDS = {
    "synth": cmd_synth,
    "estimate": cmd_estimate,
    "cluster": cmd_cluster,
    "evaluate": cmd_evaluate,
    "inspect": cmd_inspect,
    "transform": cmd_transform,
    "demo": cmd_demo,
    "run": cmd_run,
    "budget": cmd_budget,
    "stream": cmd_stream,
    "report": cmd_report,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except DataError as err:
        print(f"dpsub {args.command}: error: {data_error_report(args, err)}", file=sys.stderr)
        return err.exit_code
    except DpsubError as err:
        print(f"dpsub {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
