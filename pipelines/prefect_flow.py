"""Prefect flow: ``dpsub run`` with a run id derived from the flow run's logical date.

Deploy it on a daily schedule (e.g. ``prefect deploy pipelines/prefect_flow.py:daily_basis
--cron "15 2 * * *"``). Task retries re-use the run id: a retried run resumes the same
release or returns the published one and never charges the budget twice.
"""

from __future__ import annotations

import subprocess
from datetime import date

from prefect import flow, get_run_logger, task

JOB = "/etc/dpsub/events-basis.yaml"

EXIT_CODES = {
    0: "published (or already published: nothing charged)",
    1: "failed unexpectedly: retry, it resumes under the same run id",
    2: "bad job file or input: nothing was spent; fix and re-run",
    3: "published: no stable subspace (the budget was spent)",
    4: "refused: the dataset's budget is spent; grant more or stop",
    5: "aborted (scheduler lost or output not writable): retry, it resumes the same run",
}


def dpsub_command(logical_date: date, job: str = JOB) -> list[str]:
    """The ``dpsub run`` command line for the run of ``logical_date``."""
    return ["dpsub", "run", job, "--run-id", f"events-basis-{logical_date.isoformat()}", "--quiet"]


@task(retries=3, retry_delay_seconds=600)
def run_job(logical_date: date) -> str:
    logger = get_run_logger()
    done = subprocess.run(dpsub_command(logical_date), capture_output=True, text=True)
    meaning = EXIT_CODES.get(done.returncode, "unknown exit code")
    logger.info("dpsub run exited %s (%s): %s", done.returncode, meaning, done.stdout.strip())
    if done.returncode in (0, 3, 4):  # final answers: retrying would not change them
        return meaning
    raise RuntimeError(f"dpsub run failed ({meaning}): {done.stderr.strip()}")


@flow(name="dpsub-events-basis")
def daily_basis(logical_date: date | None = None) -> str:
    """One private basis per logical date (default: today, UTC)."""
    from datetime import UTC, datetime

    return run_job(logical_date or datetime.now(UTC).date())


if __name__ == "__main__":
    daily_basis()
