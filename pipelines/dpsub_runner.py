"""One ``dpsub run`` per logical date, and what its exit code means to a scheduler.

Imported by ``airflow_dag.py`` and ``prefect_flow.py``: copy it beside them (into the
Airflow DAGs folder, or the Prefect project). It needs only the standard library; dpsub
itself runs as a separate program, so the scheduler's Python environment does not need
dpsub's dependencies.

The command is ``$DPSUB run $DPSUB_JOB --run-id events-basis-<YYYY-MM-DD> --quiet``:
``DPSUB`` is the dpsub command (default: ``dpsub`` on ``PATH``; split as the shell splits
words, so ``DPSUB="/opt/dpsub/deploy/cluster.sh submit"`` runs dpsub in the image, on the
cluster that ``deploy/cluster.sh up`` started), ``DPSUB_JOB`` the job file (default
``/etc/dpsub/events-basis.yaml``; in the image, the path its container sees), both read
when the task runs. The run id
comes from the logical date, so a retry or a backfill of a date is the same run: it
resumes the same release or returns the published one, and never charges twice.

After a run that published (exit 0, or 3: published without a basis) it runs
``$DPSUB report --job $DPSUB_JOB --run-id <run id>``, which writes ``report.html`` beside
the run's output (published values only; no budget). The page is a convenience: if it
cannot be written the task keeps its state and the summary says why.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from datetime import date

JOB = "/etc/dpsub/events-basis.yaml"
RUN_ID_PREFIX = "events-basis"

SUCCESS, SKIP, FAIL, RETRY = "success", "skip", "fail", "retry"
"""What the scheduler does with a task: succeed, skip (final, not retried), fail without
retrying (retrying cannot help), or fail and retry (the retry resumes the same run)."""

EXIT_CODES: dict[int, tuple[str, str]] = {
    0: (SUCCESS, "published (or already published: nothing charged)"),
    3: (SKIP, "published 'no stable subspace' (the budget was spent; no basis)"),
    4: (SKIP, "refused: the dataset's remaining budget cannot cover the run; grant or stop"),
    2: (FAIL, "bad job file, input or ledger: nothing was spent; fix it and re-run"),
    5: (RETRY, "aborted (Dask scheduler lost or output not writable): a retry resumes the run"),
    6: (FAIL, "the data failed validation: charged; the detail is in the diagnostics file"),
    1: (RETRY, "unexpected failure (e.g. ledger server unreachable): a retry resumes the run"),
}
"""dpsub run's exit codes (dpsub --help). Any other code fails the task without a retry."""

PUBLISHED = (0, 3)
"""Exit codes after which the run's output folder holds a published manifest."""

UNKNOWN = (FAIL, "unknown exit code: failed without retrying; read the task log")
KILLED = (RETRY, "killed by a signal: a retry resumes the same run")


@dataclass(frozen=True)
class DpsubResult:
    """One ``dpsub run``: its exit code, the scheduler action and dpsub's own messages."""

    code: int
    action: str
    meaning: str
    stdout: str
    stderr: str
    report: str = ""

    def summary(self) -> str:
        said = (self.stdout.strip() + " " + self.stderr.strip()).strip()
        report = f" | report: {self.report}" if self.report else ""
        return (
            f"dpsub run exited {self.code}: {self.meaning}"
            + (f" | {said}" if said else "")
            + report
        )


def run_id(logical_date: date) -> str:
    """The run id of the run for ``logical_date``."""
    return f"{RUN_ID_PREFIX}-{logical_date.isoformat()}"


def dpsub() -> list[str]:
    """The dpsub command from ``$DPSUB``: an executable, or a command and its arguments."""
    return shlex.split(os.environ.get("DPSUB", "dpsub"))


def dpsub_command(logical_date: date, job: str | None = None) -> list[str]:
    """The ``dpsub run`` command line for the run of ``logical_date``."""
    job = job or os.environ.get("DPSUB_JOB", JOB)
    return [*dpsub(), "run", job, "--run-id", run_id(logical_date), "--quiet"]


def report_command(logical_date: date, job: str | None = None) -> list[str]:
    """The ``dpsub report`` command line writing the page beside that run's output."""
    job = job or os.environ.get("DPSUB_JOB", JOB)
    return [*dpsub(), "report", "--job", job, "--run-id", run_id(logical_date)]


def action_for(code: int) -> tuple[str, str]:
    """(action, meaning) of an exit code; a negative code is a signal (subprocess's view)."""
    if code < 0:
        return KILLED
    return EXIT_CODES.get(code, UNKNOWN)


def run_dpsub(logical_date: date) -> DpsubResult:
    """Run ``dpsub run`` for ``logical_date`` and classify its exit code."""
    done = subprocess.run(dpsub_command(logical_date), capture_output=True, text=True)
    action, meaning = action_for(done.returncode)
    report = ""
    if done.returncode in PUBLISHED:
        page = subprocess.run(report_command(logical_date), capture_output=True, text=True)
        report = (page.stdout if page.returncode == 0 else page.stderr).strip()
    return DpsubResult(done.returncode, action, meaning, done.stdout, done.stderr, report)
