"""``dpsub run JOB --check``: everything a scheduled run needs, checked before it is scheduled.

The checks are the ones a real run makes before it reserves budget, in the same order of
concern, so that a job that passes them is refused later only for reasons that arise at
run time (the data changed, the ledger's budget was spent meanwhile, a storage outage):

1. **job**: the file parses and validates (done by :func:`dpsub_dist.jobfile.load_job`);
2. **ledger**: the ledger opens (file present, or PostgreSQL server reachable) and the
   dataset is granted for the job's privacy unit and budget mode;
3. **budget**: what remains of the grant covers the run's charge (or the run id is already
   published or reserved, so the run charges nothing new);
4. **dataset**: the dataset is listed and every file's Parquet *footer* is read and checked
   against the job's columns and unit column (no row is read: a variable list's width,
   which only its rows hold, is reported as read at run time, and the rank is checked
   against it then);
5. **plan**: the budget plan the run will declare, each private step's share of the charge
   (from the options and the footers, as the run decides it: the manifest lists the same
   steps);
6. **output**: the run's output folder is usable, by the check the run makes itself: its
   parent (or, when that is missing and the run would create it, the nearest existing
   ancestor) is a writable folder (local) or the bucket accepts a write (object storage),
   and it does not exist yet unless the job sets ``overwrite`` (and it holds a previous
   run's output) or the run id is already published; it is not, holds or lies inside the
   dataset or the ledger.

Nothing is reserved and nothing stays written: the check creates no folder, no ledger
and no grant (on object storage, as a run does, it writes and deletes one empty probe
object under the output prefix to learn that the bucket accepts writes).

Privacy: ``--check`` reads only public facts (paths, footers' schemas, the ledger's grant
and charges, which ``dpsub budget show`` prints as well) and never a row, so it can raise no
data error and is no free probe of the data. It prints no row count, since n is private at
user level; a footer error names a file and a column, as a run would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from dpsub_dist.context import check_schema_width
from dpsub_dist.engine.compute import IN_PROCESS
from dpsub_dist.engine.sources import Footers, parquet_dataset, read_footers
from dpsub_dist.errors import BudgetRefused, DpsubError, InputError
from dpsub_dist.io.output import check_output_dir
from dpsub_dist.io.parquet import describe_left_out
from dpsub_dist.io.storage import StorageOptions
from dpsub_dist.job import plan_budget
from dpsub_dist.jobfile import Job, own_unpublished_output
from dpsub_dist.ledger import Grant, RunRecord, RunRequest, check_run_id, open_ledger
from dpsub_dist.ledger.core import charged_accountant, check_compatible, describe_budget


@dataclass(frozen=True)
class Check:
    """One condition of a run: passed (``exit_code`` 0) or the exit code a run would give."""

    name: str
    detail: str
    exit_code: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAILED':>6}  {self.name:<8} {self.detail}"


def preflight(job: Job, run_id: str | None = None, ledger: str | None = None) -> list[Check]:
    """Check the ledger, the budget, the dataset and the output of ``job`` (the job is valid)."""
    run_id = check_run_id(run_id) if run_id is not None else job.default_run_id()
    checks = [Check("job", f"{job.path}: valid ({job.method}, rank {job.rank}, run {run_id})")]
    ledger_checks, record = _ledger_checks(job, run_id, ledger or job.ledger)
    checks += ledger_checks
    options = StorageOptions.wrap(job.storage_options)
    footers = functools.cache(lambda: read_footers(job.dataset, options, IN_PROCESS))  # read once
    checks.append(_guarded("dataset", lambda: _dataset(job, footers())))
    if checks[-1].ok:
        checks.append(_guarded("plan", lambda: _plan(job, footers())))
    inputs = [job.dataset, ledger or job.ledger]
    checks.append(_guarded("output", lambda: _output(job, run_id, record, inputs)))
    return checks


def exit_code(checks: list[Check]) -> int:
    """0 if every check passed, else the exit code of the first failure."""
    return next((c.exit_code for c in checks if not c.ok), 0)


def _guarded(name: str, check: Callable[[], str]) -> Check:
    try:
        return Check(name, check())
    except DpsubError as err:
        return Check(name, str(err), err.exit_code)


def _ledger_checks(
    job: Job, run_id: str, location: str | None
) -> tuple[list[Check], RunRecord | None]:
    """The ledger (reachable, the dataset granted for this job) and the budget left for the run.

    Returns the checks and the run id's ledger record, if it has one.
    """
    if not location:
        missing = f"{job.path}: ledger is required: set ledger: in the job or pass --ledger"
        return [Check("ledger", missing, InputError.exit_code)], None
    charge = job.budget
    try:
        with open_ledger(location) as book:
            where = book.location  # passwords redacted
            granted = book.covering_grant(job.dataset_key)  # the grant a run would charge
            status = book.status(granted)[0]  # LedgerError if not granted
            record = book.lookup(status.grant.dataset, run_id)
            runs = book.history(status.grant.dataset)
        request = RunRequest(
            status.grant.dataset, job.unit, run_id, charge, job.fingerprint(), None, ""
        )
        check_compatible(status.grant, request)  # the unit and budget mode a run needs
    except DpsubError as err:
        return [Check("ledger", str(err), err.exit_code)], None
    grant = status.grant
    found = Check(
        "ledger",
        f"{where}: {grant.dataset} granted {describe_budget(grant.total)} for unit "
        f"{grant.unit}; {describe_budget(status.remaining)} remaining",
    )
    budget = _guarded("budget", lambda: _budget(job, request, record, grant, runs))
    return [found, budget], record


def _budget(
    job: Job, request: RunRequest, record: RunRecord | None, grant: Grant, runs: list[RunRecord]
) -> str:
    """What the run would charge against what remains (a published or reserved id: nothing)."""
    run_id = request.run_id
    if record is not None and record.job_fingerprint != request.job_fingerprint:
        raise InputError(
            f"run id {run_id} was used for a different job on {grant.dataset}: "
            "pass a run id that names this job, e.g. --run-id <job>-<date>"
        )
    accountant = charged_accountant(grant, runs)
    left = describe_budget(accountant.remaining)
    if record is not None and record.state == "published":
        return f"run {run_id} is already published: a re-run charges nothing ({left} remaining)"
    if record is not None and record.state == "reserved":
        return f"run {run_id} is reserved: a re-run resumes it and charges nothing more"
    if not accountant.can_afford({run_id: request.charge}):
        raise BudgetRefused(
            f"run {run_id} would be refused: it asks for {describe_budget(request.charge)} but "
            f"only {left} remains of {describe_budget(grant.total)} (see dpsub budget show)"
        )
    return f"the run charges {describe_budget(request.charge)} of the {left} remaining"


def _dataset(job: Job, footers: Footers) -> str:
    """Validate the job's columns and rank against the footers (no row is read)."""
    chosen = footers.columns(job.columns, job.unit_column, job.exclude_columns)
    left_out = describe_left_out(chosen.choice.left_out)
    found = f"{job.dataset}: {len(footers.files)} Parquet files, footers readable"
    variable = chosen.from_rows
    if job.method == "auto":
        check_schema_width(variable)
    count = chosen.fixed_features
    if variable:
        features = (
            f"{count} features and list column(s) {', '.join(variable)}, whose width the run "
            "reads from their rows (the rank is checked then)"
        )
    else:
        if job.rank >= count:
            raise InputError(
                f"rank {job.rank} must be smaller than the {count} features of {job.dataset}: "
                "lower rank"
            )
        features = f"{count} features"
    return f"{found}, {features}" + (f" (left out: {left_out})" if left_out else "")


def _plan(job: Job, footers: Footers) -> str:
    """The steps the run will charge, from the footers (no row): the plan its method declares."""
    if footers.columns(job.columns, job.unit_column, job.exclude_columns).from_rows:
        return "fixed when the run reads the list columns' width from their rows"
    dataset = parquet_dataset(
        job.dataset,
        job.columns,
        job.unit_column,
        job.storage_options,
        IN_PROCESS,
        job.exclude_columns,
        footers=footers,
    )
    _, grants = plan_budget(job.config(), dataset)
    return "; ".join(f"{step}: {describe_budget(grant)}" for step, grant in grants.items())


def _output(job: Job, run_id: str, record: RunRecord | None, inputs: list[str | None]) -> str:
    """The run's output folder: parent present and writable, and free unless re-publishing."""
    output = job.output_for(run_id)
    if record is not None and record.state == "published":
        return f"{output}: run {run_id} is published there (restored if deleted)"
    options = StorageOptions.wrap(job.storage_options)
    if record is not None and record.state == "reserved":
        if own_unpublished_output(output, record.dataset, run_id, options):
            return f"{output}: holds reserved run {run_id}'s release; a re-run publishes it"
    check_output_dir(output, job.overwrite, options, inputs)  # the run's own check
    return f"{output}: can be created"
