"""``dpsub report``: the arguments and the command (registered by :mod:`dpsub_dist.cli`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dpsub_dist.errors import InputError

LEDGER_REPORT = "ledger-report.html"


def add_report_command(sub: argparse._SubParsersAction, epilog: str) -> argparse.ArgumentParser:
    """``dpsub report RUN_DIR | --job JOB --run-id ID | --ledger L [--dataset URI]`` with the
    caller's ``--help`` examples; the caller adds the storage options
    (:func:`dpsub_dist.cli.add_storage_arguments`)."""
    report = sub.add_parser(
        "report",
        epilog=epilog,
        help="an HTML page of a run (RUN_DIR/report.html) or of a ledger, from published values",
        description="Self-contained HTML pages (inline SVG, nothing fetched) drawn from "
        "published values only, so they cost no budget: of a run (method and route, budget "
        "by step, explained-variance scree plot, columns, outcome, versions) written to "
        "RUN_DIR/report.html, or of a ledger (budget per dataset over time, runs by outcome, "
        "drift between consecutive released bases of a job).",
    )
    report.add_argument("run", nargs="?", help="the --out folder of a run")
    report.add_argument("--job", help="job file: report the run --run-id of this job")
    report.add_argument("--run-id", help="with --job: the run id (as given to dpsub run)")
    report.add_argument("--ledger", help="ledger file or postgresql:// URL: the ledger's page")
    report.add_argument("--dataset", help="with --ledger: only this dataset URI")
    report.add_argument(
        "--out", help=f"with --ledger: where to write the page (default ./{LEDGER_REPORT})"
    )
    report.add_argument(
        "--operator",
        action="store_true",
        help="add the operator-only section (timings: not published); written to the "
        "owner-only diagnostics folder, never beside the run",
    )
    return report


def run_report_command(args: argparse.Namespace) -> int:
    """Write the page asked for and print where it went."""
    from dpsub_dist.io.storage import StorageOptions

    check_arguments(args)
    if args.ledger:
        from dpsub_dist.io.output import check_apart, check_replaceable
        from dpsub_dist.ledger import dataset_key, open_ledger
        from dpsub_dist.report.ledger import ledger_page
        from dpsub_dist.report.page import PAGE
        from dpsub_dist.report.run import write_text

        out = args.out or LEDGER_REPORT
        if not Path(out).resolve().parent.is_dir():
            raise InputError(f"the folder of --out {out} does not exist: create it first")
        check_apart(out, [args.ledger])
        check_replaceable(out, PAGE)  # a page written before, or nothing
        with open_ledger(args.ledger) as book:
            html = ledger_page(book, dataset_key(args.dataset) if args.dataset else None)
        write_text(out, html)
        print(f"wrote {out}")
        return 0
    from dpsub_dist.report.run import write_run_report

    options = StorageOptions.from_pairs(args.storage_option)
    run = args.run
    if args.job:
        from dpsub_dist.jobfile import load_job
        from dpsub_dist.ledger import check_run_id

        job = load_job(args.job)
        run = job.output_for(check_run_id(args.run_id))
        options = StorageOptions.wrap(job.storage_options)
    where = write_run_report(run, options, operator=args.operator)
    said = " (operator only: do not publish it)" if args.operator else ""
    print(f"wrote {where}{said}")
    return 0


def check_arguments(args: argparse.Namespace) -> None:
    """Exactly one of RUN_DIR, --job or --ledger, and only the options that go with it."""
    given = [name for name, value in (("RUN_DIR", args.run), ("--job", args.job),
                                      ("--ledger", args.ledger)) if value]  # fmt: skip
    if len(given) != 1:
        raise InputError(
            "pass one of RUN_DIR (a run's folder), --job JOB --run-id ID, or --ledger LEDGER"
            + (f" (got {' and '.join(given)})" if given else "")
        )
    if bool(args.job) != bool(args.run_id):
        raise InputError("--job and --run-id go together: pass both, or pass RUN_DIR")
    if args.dataset and not args.ledger:
        raise InputError("--dataset goes with --ledger: pass --ledger LEDGER too")
    if args.out and not args.ledger:
        raise InputError("--out goes with --ledger: a run's page is always RUN_DIR/report.html")
    if args.operator and args.ledger:
        raise InputError("--operator applies to a run's page, not to the ledger's")
