"""Runs the shipped Airflow DAG or Prefect flow for a list of dates, inside its own venv.

Usage: ``python scheduler_harness.py airflow|prefect PLAN.json RESULTS.json`` (started by
tests/deploy/test_schedulers.py with the scheduler's environment set). PLAN is a list of
``{"label", "date", "env"}``: ``env`` (``DPSUB``, ``DPSUB_JOB``) is set before that date's
run. RESULTS gets the scheduler's version and, per step, the state the scheduler shows for
the run and for the dpsub task, and how many times the task ran. Only the retry delay is
shortened (10 min → 1 s).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

PIPELINES = Path(__file__).resolve().parent.parent / "pipelines"


def run_airflow(plan: list[dict]) -> list[dict]:
    import airflow_dag

    dag = airflow_dag.dag
    dag.get_task("private_basis").retry_delay = timedelta(seconds=1)
    results = []
    for step in plan:
        os.environ.update(step["env"])
        day = date.fromisoformat(step["date"])
        run = dag.test(logical_date=datetime(day.year, day.month, day.day, tzinfo=UTC))
        [ti] = run.get_task_instances()
        results.append(
            {
                "label": step["label"],
                "run_state": str(run.state),
                "task_state": str(ti.state),
                "tries": int(ti.try_number),
            }
        )
    return results


def run_prefect(plan: list[dict]) -> list[dict]:
    import prefect_flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    prefect_flow.run_job = prefect_flow.run_job.with_options(retry_delay_seconds=1)
    results = []
    for step in plan:
        os.environ.update(step["env"])
        state = prefect_flow.daily_basis(date.fromisoformat(step["date"]), return_state=True)
        runs_of = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        with get_client(sync_client=True) as client:
            [task_run] = client.read_task_runs(flow_run_filter=runs_of)
        results.append(
            {
                "label": step["label"],
                "run_state": state.type.value,
                "task_state": task_run.state.name,
                "tries": task_run.run_count,
            }
        )
    return results


def main() -> None:
    scheduler, plan_path, results_path = sys.argv[1:4]
    sys.path.insert(0, str(PIPELINES))
    plan = json.loads(Path(plan_path).read_text())
    runner = run_airflow if scheduler == "airflow" else run_prefect
    steps = runner(plan)
    version = importlib.metadata.version("apache-airflow" if scheduler == "airflow" else scheduler)
    Path(results_path).write_text(json.dumps({"version": version, "steps": steps}, indent=2))


if __name__ == "__main__":
    main()
