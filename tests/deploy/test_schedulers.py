"""The shipped Prefect flow and Airflow DAG, run for real against a local dataset and ledger.

Each scheduler is installed (pinned) in its own venv under ``bench/.venvs/`` (gitignored;
reused while its pins match) and runs ``pipelines/`` unchanged, calling this checkout's
dpsub (tests/dpsub_shim.py) through ``$DPSUB``: Prefect's flow runs locally on a temporary
server (no account), Airflow's DAG through ``dag.test()`` on its own SQLite metadata
database. The only change to the shipped files is a retry delay of 1 s instead of 10 min.

One plan, one ledger, five dates, the scheduler-visible outcome of each exit code:
published (0), already published (0, nothing charged), bad input (2: failed, not retried,
reservation returned), aborted after reserving (5: retried, resumed, charged once) and
refused for budget (4: skipped, not retried). Slow (installs and two schedulers): run with
``pytest -m slow tests/deploy/test_schedulers.py``; docs/running-daily.md gives the durations.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from dpsub_shim import ROOT, write_aborting_dpsub, write_dpsub, write_job

from dpsub_dist.cli import main

VENV_DIR = Path(os.environ.get("DPSUB_SCHEDULER_VENVS", ROOT / "bench" / ".venvs"))
SCHEDULERS = {
    "airflow": ["apache-airflow==3.3.2"],
    "prefect": ["prefect==3.8.8", "fastapi==0.150.0"],  # 0.160 dropped Body(min_items=)
}
"""Pinned installs (no constraints file; Python 3.11). Bump here and re-run the slow tests."""
HARNESS = Path(__file__).parents[1] / "scheduler_harness.py"
PREFECT_STARTUP_DEADLINE = 600
"""Seconds the Prefect flow waits for its temporary server to answer: ready is when its
health check answers, whatever the load, and only a server that never does fails."""

PLAN = [  # (label, logical date, job): one ledger granted epsilon 2.5, each run charges 1
    ("published", "2024-06-01", "good"),
    ("already published", "2024-06-01", "good"),
    ("bad input", "2024-06-02", "bad"),
    ("aborted then resumed", "2024-06-03", "good"),
    ("refused for budget", "2024-06-04", "good"),
]
EXPECTED = {  # label: (run state, task state, task tries) as each scheduler shows them
    "airflow": {
        "published": ("success", "success", 1),
        "already published": ("success", "success", 1),
        "bad input": ("failed", "failed", 1),
        "aborted then resumed": ("success", "success", 2),
        "refused for budget": ("success", "skipped", 1),
    },
    "prefect": {
        "published": ("COMPLETED", "Completed", 1),
        "already published": ("COMPLETED", "Completed", 1),
        "bad input": ("FAILED", "Failed", 1),
        "aborted then resumed": ("COMPLETED", "Completed", 2),
        "refused for budget": ("COMPLETED", "Skipped", 1),
    },
}


def scheduler_venv(name: str) -> Path:
    """The scheduler's venv, created and installed on first use (a failed install fails)."""
    venv = VENV_DIR / name
    marker = venv / ".installed.json"
    specs = SCHEDULERS[name]
    if marker.exists() and json.loads(marker.read_text()) == specs:
        return venv
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *specs]
    subprocess.run(pip, check=True, timeout=1800)
    marker.write_text(json.dumps(specs))
    return venv


def scheduler_env(name: str, venv: Path, home: Path) -> dict[str, str]:
    """A clean environment: the scheduler's state in ``home``, no cloud API, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AIRFLOW"))}
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    if name == "airflow":
        env.update(
            AIRFLOW_HOME=str(home),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "pipelines"),
        )
    else:
        env.update(
            PREFECT_HOME=str(home),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            # The flow's temporary server: Prefect polls its health until this deadline
            # (default 20 s, which a loaded machine's first start with migrations exceeds).
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=str(PREFECT_STARTUP_DEADLINE),
        )
    return env


def run_plan(
    scheduler: str, venv: Path, plan: list[dict], tmp_path: Path, extra_env: dict[str, str]
) -> dict[str, tuple[str, str, int]]:
    """The shipped DAG or flow run for each date of ``plan`` under the real scheduler
    (tests/scheduler_harness.py): label → (run state, task state, task tries) as it shows
    them. The pinned version must be the one that ran."""
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**scheduler_env(scheduler, venv, tmp_path / scheduler), **extra_env}
    if scheduler == "airflow":
        migrate = [str(venv / "bin" / "airflow"), "db", "migrate"]
        subprocess.run(migrate, env=env, check=True, capture_output=True, timeout=600)
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(HARNESS), scheduler]
        + [str(tmp_path / "plan.json"), str(tmp_path / "results.json")],
        env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert f"=={report['version']}" in SCHEDULERS[scheduler][0]  # the pinned version ran
    return {r["label"]: (r["run_state"], r["task_state"], r["tries"]) for r in report["steps"]}


def ledger_json(command: str, ledger: Path, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["budget", command, "--ledger", str(ledger), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["prefect", "airflow"])
def test_shipped_pipeline_under_the_real_scheduler(scheduler, small_dataset, tmp_path, capsys):
    venv = scheduler_venv(scheduler)
    data, ledger, results = Path(small_dataset.path), tmp_path / "ledger.db", tmp_path / "results"
    results.mkdir()
    jobs = {
        "good": write_job(tmp_path / "events-basis.yaml", data, ledger, results),
        "bad": write_job(tmp_path / "bad.yaml", data, ledger, results, columns="[x0, nope]"),
    }
    grant = ["--ledger", str(ledger), "--dataset", str(data), "--epsilon", "2.5"]
    assert main(["budget", "init", *grant, "--delta", "1e-5"]) == 0
    dpsub = write_dpsub(tmp_path / "bin")
    aborting = write_aborting_dpsub(tmp_path / "bin", ledger)
    plan = [
        {
            "label": label,
            "date": day,
            "env": {
                "DPSUB": str(aborting if label.startswith("aborted") else dpsub),
                "DPSUB_JOB": str(jobs[job]),
            },
        }
        for label, day, job in PLAN
    ]
    seen = run_plan(scheduler, venv, plan, tmp_path, {})
    assert seen == EXPECTED[scheduler]

    runs = {r["run_id"]: r for r in ledger_json("history", ledger, capsys)}
    assert runs["events-basis-2024-06-01"]["state"] == "published"
    assert runs["events-basis-2024-06-03"]["state"] == "published"  # resumed after the abort
    assert "events-basis-2024-06-04" not in runs  # refused before reserving
    assert runs.get("events-basis-2024-06-02", {}).get("state") != "reserved"  # given back
    [status] = ledger_json("show", ledger, capsys)
    assert status["published"]["epsilon"] == pytest.approx(2.0)  # two runs, each charged once
    assert status["reserved"]["epsilon"] == 0
    assert status["remaining"]["epsilon"] == pytest.approx(0.5)
    published = sorted(p.name for p in results.iterdir())
    assert published == ["events-basis-2024-06-01", "events-basis-2024-06-03"]
    for name in published:
        assert (results / name / "basis.npy").exists()
        assert (results / name / "report.html").exists()  # written by the runner


IN_THE_IMAGE = [("published", "2024-06-01"), ("already published", "2024-06-01")]
"""The image variant's plan: one run, then the same date again (nothing charged)."""


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["prefect", "airflow"])
def test_shipped_pipeline_runs_in_the_image_under_the_real_scheduler(scheduler, tmp_path):
    """The same DAG and flow with ``DPSUB="<repo>/deploy/cluster.sh submit"`` (docs/running-
    daily.md's container variant): dpsub runs in the image on a cluster of containers that
    ``cluster.sh up`` started, the job file and the SQLite ledger reached at the container
    paths pipelines/events-basis.yaml names. Needs the image (deploy/build-image.sh)."""
    cluster = str(ROOT / "deploy" / "cluster.sh")
    home = tmp_path / "srv"
    env = {**os.environ, "DPSUB_CLUSTER": f"t{uuid.uuid4().hex[:8]}"}

    def sh(*args: str) -> str:
        done = subprocess.run([cluster, *args], env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        return done.stdout

    venv = scheduler_venv(scheduler)
    (home / "jobs").mkdir(parents=True)
    shutil.copy(ROOT / "pipelines" / "events-basis.yaml", home / "jobs")
    folders = {f"--{name}": str(home / name) for name in ("data", "out", "state")}
    try:
        sh("up", "--workers", "1", *[a for pair in folders.items() for a in pair],
           "--jobs", str(home / "jobs"))  # fmt: skip
        sh("submit", "synth", "/data/events", "--rows", "20000", "--dim", "10", "--rank", "3",
           "--partitions", "2", "--quiet")  # fmt: skip
        sh("submit", "budget", "init", "--ledger", "/state/ledger.db", "--dataset",
           "/data/events", "--epsilon", "5", "--delta", "1e-5")  # fmt: skip
        submit = f"{shlex.quote(cluster)} submit"
        step_env = {"DPSUB": submit, "DPSUB_JOB": "/etc/dpsub/events-basis.yaml"}
        plan = [{"label": label, "date": day, "env": step_env} for label, day in IN_THE_IMAGE]
        cluster_env = {"DPSUB_CLUSTER": env["DPSUB_CLUSTER"]}
        seen = run_plan(scheduler, venv, plan, tmp_path, cluster_env)
        history = sh("submit", "budget", "history", "--ledger", "/state/ledger.db")
    finally:
        sh("down")
    assert seen == {label: EXPECTED[scheduler][label] for label, _ in IN_THE_IMAGE}
    (record,) = history.strip().splitlines()  # published once, the second date charged nothing
    assert " events-basis-2024-06-01 " in record and " published " in record, history
    folder = home / "out" / "events-basis" / "events-basis-2024-06-01"
    assert sorted(p.name for p in folder.iterdir()) == ["basis.npy", "manifest.json", "report.html"]
