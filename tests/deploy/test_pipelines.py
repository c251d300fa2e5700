"""Scheduler examples in pipelines/: the command they build, the action of each exit code,
and the cron line run for real under ``flock`` by two overlapping days.

The Airflow DAG and the Prefect flow themselves run under the real schedulers in
tests/deploy/test_schedulers.py (slow: it installs them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
from dpsub_shim import write_dpsub, write_job

from dpsub_dist.cli import build_parser, main
from dpsub_dist.jobfile import load_job

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "pipelines"


def runner():
    """pipelines/dpsub_runner.py, the module the DAG and the flow share."""
    spec = importlib.util.spec_from_file_location("dpsub_runner", PIPELINES / "dpsub_runner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def parse_run(argv: list[str]):
    args = build_parser().parse_args(argv)
    assert args.command == "run"
    return args


def crontab_lines(name: str = "crontab") -> list[str]:
    """The entries of ``pipelines/<name>`` (comments and blank lines left out)."""
    text = (PIPELINES / name).read_text()
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def cron_command(name: str = "crontab") -> str:
    """The crontab's daily command, as cron hands it to /bin/sh (``\\%`` becomes ``%``)."""
    daily = [line for line in crontab_lines(name) if not line.startswith("@reboot")]
    assert len(daily) == 1
    fields = daily[0].split(maxsplit=5)
    assert fields[:5] == ["15", "2", "*", "*", "*"]
    assert "$(date -u +\\%F)" in fields[5]  # cron needs % escaped
    return fields[5].replace("\\%", "%")


def test_cron_line_builds_an_accepted_command():
    command = shlex.split(cron_command().split(">>")[0].replace("$(date -u +%F)", "2024-06-01"))
    assert command[:2] == ["flock", "/var/lock/dpsub-events-basis.lock"]
    assert command[2] == "dpsub"
    args = parse_run(command[3:])
    assert args.run_id == "events-basis-2024-06-01" and args.quiet


def test_podman_cron_runs_the_same_job_in_the_image():
    """pipelines/crontab-podman: at boot, deploy/cluster.sh up with the folders that
    pipelines/events-basis.yaml names inside the containers; daily, the line of
    pipelines/crontab with ``dpsub`` replaced by ``deploy/cluster.sh submit`` (the image)."""
    assert len(crontab_lines("crontab-podman")) == 2
    (boot,) = [line for line in crontab_lines("crontab-podman") if line.startswith("@reboot")]
    up = shlex.split(boot.split(">>")[0])[1:]
    assert up[:2] == ["/opt/dpsub/deploy/cluster.sh", "up"]
    folders = dict(zip(up[2::2], up[3::2], strict=True))
    assert folders == {
        "--workers": "2",
        "--data": "/srv/dpsub/data",
        "--out": "/srv/dpsub/results",
        "--state": "/srv/dpsub/state",
        "--jobs": "/etc/dpsub",
    }
    host = cron_command().replace(" dpsub run ", " /opt/dpsub/deploy/cluster.sh submit run ")
    assert cron_command("crontab-podman") == host
    # The job file's paths are those cluster.sh mounts the folders at.
    mounts = (ROOT / "deploy" / "cluster.sh").read_text()
    job = load_job(PIPELINES / "events-basis.yaml")
    for path, mount in ((job.dataset, "/data"), (job.output, "/results"), (job.ledger, "/state")):
        assert path.startswith(mount + "/") and f':{mount}"' in mounts, (path, mount)
    assert ':/etc/dpsub:ro"' in mounts and shlex.split(host)[5].startswith("/etc/dpsub/")


def test_runner_splits_dpsub_into_a_command_and_its_arguments(monkeypatch):
    """``DPSUB="/opt/dpsub/deploy/cluster.sh submit"`` (the DAG and the flow in the image)."""
    module = runner()
    monkeypatch.setenv("DPSUB", "/opt/dpsub/deploy/cluster.sh submit")
    monkeypatch.setenv("DPSUB_JOB", "/etc/dpsub/events-basis.yaml")
    argv = module.dpsub_command(date(2024, 6, 1))
    assert argv[:2] == ["/opt/dpsub/deploy/cluster.sh", "submit"]
    assert parse_run(argv[2:]).run_id == "events-basis-2024-06-01"
    report = module.report_command(date(2024, 6, 1))
    assert report[:3] == ["/opt/dpsub/deploy/cluster.sh", "submit", "report"]
    monkeypatch.setenv("DPSUB", "'/opt/my tools/dpsub'")  # a path with a space, quoted
    assert module.dpsub_command(date(2024, 6, 1))[0] == "/opt/my tools/dpsub"


def test_cron_overlapping_days_run_one_at_a_time(small_dataset, tmp_path, capsys):
    """Three overlapping cron starts (two of one day, one of the next) under the shipped line.

    flock makes them run one after another: each day is published once and charged once,
    and the repeated day returns the published result. Without the lock they ran at once.
    """
    ledger, results = tmp_path / "ledger.db", tmp_path / "results"
    results.mkdir()
    data = Path(small_dataset.path)
    job = write_job(tmp_path / "events-basis.yaml", data, ledger, results)
    grant = ["--ledger", str(ledger), "--dataset", str(data), "--epsilon", "5", "--delta", "1e-5"]
    assert main(["budget", "init", *grant]) == 0
    events, log = tmp_path / "events.txt", tmp_path / "events-basis.log"
    bin_dir = tmp_path / "bin"
    write_dpsub(bin_dir, log=events)
    paths = {
        "/etc/dpsub/events-basis.yaml": str(job),
        "/var/log/dpsub/events-basis.log": str(log),
        "/var/lock/dpsub-events-basis.lock": str(tmp_path / "events-basis.lock"),
    }
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def start(day: str) -> subprocess.Popen:
        command = cron_command().replace("$(date -u +%F)", day)
        for shipped, here in paths.items():
            command = command.replace(shipped, here)
        return subprocess.Popen(["/bin/sh", "-c", command], env=env)

    starts = [start(day) for day in ("2024-06-01", "2024-06-01", "2024-06-02")]
    assert [p.wait(timeout=600) for p in starts] == [0, 0, 0], log.read_text()
    marks = [line.split()[0] for line in events.read_text().splitlines()]
    assert marks == ["start", "end"] * 3, events.read_text()  # never two at once
    said = log.read_text()
    assert said.count("published run events-basis-2024-06-01:") == 1, said
    assert said.count("run events-basis-2024-06-01 was already published") == 1, said
    assert said.count("published run events-basis-2024-06-02:") == 1, said
    capsys.readouterr()
    assert main(["budget", "show", "--ledger", str(ledger), "--json"]) == 0
    [status] = json.loads(capsys.readouterr().out)
    assert status["published"]["epsilon"] == pytest.approx(2.0)  # one charge per day
    assert status["runs"] == {"published": 2}


def test_runner_builds_an_accepted_command(monkeypatch):
    module = runner()
    monkeypatch.delenv("DPSUB", raising=False)
    monkeypatch.delenv("DPSUB_JOB", raising=False)
    argv = module.dpsub_command(date(2024, 6, 1))
    assert argv[0] == "dpsub"  # from PATH unless $DPSUB names it
    args = parse_run(argv[1:])
    assert args.run_id == "events-basis-2024-06-01" and args.job == module.JOB and args.quiet
    monkeypatch.setenv("DPSUB", "/opt/dpsub/bin/dpsub")
    monkeypatch.setenv("DPSUB_JOB", "/srv/jobs/events.yaml")
    argv = module.dpsub_command(date(2024, 6, 2))
    assert argv[0] == "/opt/dpsub/bin/dpsub" and parse_run(argv[1:]).job == "/srv/jobs/events.yaml"


def test_every_exit_code_has_a_scheduler_action():
    """0 succeeds; 3 and 4 are final (skip); 2 and 6 (data failed validation, charged) fail
    for good; 1, 5 and a kill retry; any other code fails without a retry."""
    module = runner()
    actions = {code: module.action_for(code)[0] for code in (0, 1, 2, 3, 4, 5, 6, 7, 137, -9)}
    assert actions == {
        0: "success",
        1: "retry",
        2: "fail",
        3: "skip",
        4: "skip",
        5: "retry",
        6: "fail",
        7: "fail",
        137: "fail",
        -9: "retry",
    }
    assert sorted(module.EXIT_CODES) == [0, 1, 2, 3, 4, 5, 6]


def test_example_job_is_valid_and_writes_one_folder_per_run():
    job = load_job(PIPELINES / "events-basis.yaml")
    assert job.output_for("events-basis-2024-06-01").endswith("/events-basis-2024-06-01")


def test_runner_writes_the_report_beside_each_published_run(small_dataset, tmp_path, monkeypatch):
    """After a published run (exit 0) the DAG's and the flow's runner writes report.html
    beside the run's output; after a failed one (bad input, exit 2) it writes none."""
    module = runner()
    ledger, results = tmp_path / "ledger.db", tmp_path / "results"
    results.mkdir()
    data = Path(small_dataset.path)
    grant = ["--ledger", str(ledger), "--dataset", str(data), "--epsilon", "3", "--delta", "1e-5"]
    assert main(["budget", "init", *grant]) == 0
    monkeypatch.setenv("DPSUB", str(write_dpsub(tmp_path / "bin")))
    monkeypatch.setenv("DPSUB_JOB", str(write_job(tmp_path / "job.yaml", data, ledger, results)))
    result = module.run_dpsub(date(2024, 6, 1))
    page = results / "events-basis-2024-06-01" / "report.html"
    assert result.code == 0 and result.action == "success", result.summary()
    assert result.report == f"wrote {page}"
    assert "costs no privacy budget" in page.read_text()
    bad = write_job(tmp_path / "bad.yaml", data, ledger, results, columns="[x0, nope]")
    monkeypatch.setenv("DPSUB_JOB", str(bad))
    result = module.run_dpsub(date(2024, 6, 2))
    assert result.code == 2 and result.report == ""
    assert not (results / "events-basis-2024-06-02").exists()
