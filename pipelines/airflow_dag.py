"""Airflow DAG: a daily ``dpsub run`` whose run id is the DAG run's logical date.

Retries re-use the run id, so a retried task resumes the same release (same noise)
or returns the published one; it never charges the budget twice. Exit codes:
0 published (or already published) · 3 published "no stable subspace" (skipped) ·
4 refused: the dataset's budget is spent (skipped: retrying cannot help until more is
granted) · 2 bad job or input, nothing spent (failed) · 5 aborted: scheduler lost or
output not writable (failed, retried: resumes) · 1 unexpected failure (failed, retried).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow import DAG
from airflow.operators.bash import BashOperator

JOB = "/etc/dpsub/events-basis.yaml"

# {{ ds }} is the logical date (YYYY-MM-DD) of the DAG run, rendered by Airflow.
DPSUB_COMMAND = f"dpsub run {JOB} --run-id events-basis-{{{{ ds }}}} --quiet"

with DAG(
    dag_id="dpsub_events_basis",
    schedule="@daily",
    start_date=datetime(2024, 6, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 3, "retry_delay": timedelta(minutes=10)},
    tags=["privacy"],
) as dag:
    BashOperator(
        task_id="private_basis",
        bash_command=DPSUB_COMMAND,
        skip_on_exit_code=[3, 4],
    )
