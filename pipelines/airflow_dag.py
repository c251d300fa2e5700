"""Airflow DAG: a daily ``dpsub run`` whose run id is the DAG run's logical date.

Copy this file and ``dpsub_runner.py`` into the DAGs folder; set ``DPSUB`` (the dpsub
executable, default ``dpsub`` on the workers' PATH) and ``DPSUB_JOB`` (the job file) in the
workers' environment. Tested with Airflow 3.3 (``dag.test()``; docs/running-daily.md).

Retries re-use the run id, so a retried task resumes the same release (same noise) or
returns the published one; it never charges the budget twice. Exit codes
(``dpsub_runner.EXIT_CODES``): 0 success · 3 published "no stable subspace" and 4 refused
for budget: skipped, not retried · 2 bad job or input, nothing spent: failed, not retried ·
5 aborted and 1 unexpected: failed and retried (the retry resumes the run) · any other
code: failed, not retried.

After each run that published, ``dpsub_runner`` writes ``report.html`` beside the run's
output (``dpsub report``: published values only, no budget; docs/report.md).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

try:  # Airflow 3
    from airflow.sdk import dag, task
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
except ImportError:  # Airflow 2.x
    from airflow.decorators import dag, task
    from airflow.exceptions import AirflowFailException, AirflowSkipException

from dpsub_runner import FAIL, RETRY, SKIP, run_dpsub


@dag(
    dag_id="dpsub_events_basis",
    schedule="@daily",
    start_date=datetime(2024, 6, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 3, "retry_delay": timedelta(minutes=10)},
    tags=["privacy"],
)
def dpsub_events_basis():
    @task(task_id="private_basis")
    def private_basis(ds: str | None = None) -> str:
        """``dpsub run`` for the logical date ``ds`` (YYYY-MM-DD), mapped to a task state."""
        # A run triggered without a logical date (Airflow 3) runs for today, UTC, as cron does.
        result = run_dpsub(date.fromisoformat(ds) if ds else datetime.now(UTC).date())
        print(result.summary())
        if result.action == SKIP:
            raise AirflowSkipException(result.summary())
        if result.action == FAIL:
            raise AirflowFailException(result.summary())
        if result.action == RETRY:
            raise RuntimeError(result.summary())
        return result.meaning

    private_basis()


dag = dpsub_events_basis()
