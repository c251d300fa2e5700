"""Prefect flow: ``dpsub run`` with a run id derived from the flow run's logical date.

Keep ``dpsub_runner.py`` beside this file; set ``DPSUB`` (the dpsub executable, default
``dpsub`` on PATH) and ``DPSUB_JOB`` (the job file). Run it once locally with
``python pipelines/prefect_flow.py 2024-06-01``, or deploy it on a daily schedule (e.g.
``prefect deploy pipelines/prefect_flow.py:daily_basis --cron "15 2 * * *"``). Tested with
Prefect 3.8 (docs/running-daily.md).

Task retries re-use the run id: a retried run resumes the same release or returns the
published one and never charges the budget twice. Exit codes (``dpsub_runner.EXIT_CODES``):
0 Completed · 3 and 4 Completed in a state named "Skipped" (final: not retried) · 2 Failed,
not retried · 5 and 1 Failed and retried (the retry resumes the run) · any other code
Failed, not retried.

After each run that published, ``dpsub_runner`` writes ``report.html`` beside the run's
output (``dpsub report``: published values only, no budget; docs/report.md).
"""

from __future__ import annotations

import sys
from datetime import UTC, date, datetime

from dpsub_runner import RETRY, SKIP, SUCCESS, DpsubResult, run_dpsub
from prefect import flow, get_run_logger, task
from prefect.states import Completed


class DpsubFailed(RuntimeError):
    """A failed ``dpsub run``; ``retry`` tells whether a retry can succeed (it resumes)."""

    def __init__(self, result: DpsubResult) -> None:
        super().__init__(result.summary())
        self.retry = result.action == RETRY


def retry_if_resumable(task, task_run, state) -> bool:
    """Retry exit codes 1 and 5 (and a killed run) only: they resume the same run id."""
    try:
        state.result()
    except DpsubFailed as err:
        return err.retry
    except Exception:
        return False
    return False


@task(retries=3, retry_delay_seconds=600, retry_condition_fn=retry_if_resumable)
def run_job(logical_date: date):
    result = run_dpsub(logical_date)
    get_run_logger().info(result.summary())
    if result.action == SUCCESS:
        return result.meaning
    if result.action == SKIP:
        return Completed(message=result.summary(), name="Skipped", data=result.meaning)
    raise DpsubFailed(result)


@flow(name="dpsub-events-basis")
def daily_basis(logical_date: date | None = None) -> str:
    """One private basis per logical date (default: today, UTC)."""
    return run_job(logical_date or datetime.now(UTC).date())


if __name__ == "__main__":
    daily_basis(date.fromisoformat(sys.argv[1]) if len(sys.argv) > 1 else None)
