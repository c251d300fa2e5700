"""deploy/README.md's walkthrough, run as written (slow: builds the image with podman).

The commands are read from the README's blocks marked ``<!-- commands: build -->`` and
``<!-- commands: cluster -->`` and run by bash from the repository root, one line at a
time, with two differences from a person at a terminal: ``DPSUB_HOME`` is a temporary
folder instead of /srv/dpsub, and ``DPSUB_CLUSTER`` names a cluster of this test only.
``apt-get`` lines are checked, not run (the machine has podman). The README's "from a
second terminal" line (``kill-worker``) runs while the first ``submit run`` runs, once the
scheduler shows that worker holding results: the run then completes on the survivor, or
exits 5 and the same command resumes it; either way the ledger shows one published run
charged once, the re-run charges nothing, and ``down`` leaves no container behind.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
import tomllib
import uuid
from datetime import date
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    # The test's watcher client (this virtualenv) and the image differ in Python patch
    # versions; dpsub's own check covers dpsub_dist, dask and distributed.
    pytest.mark.filterwarnings("ignore::distributed.versions.VersionMismatchWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "deploy" / "README.md"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def readme_commands(block: str) -> list[str]:
    """The command lines of the README's fenced block after ``<!-- commands: BLOCK -->``."""
    text = README.read_text()
    found = re.search(rf"<!-- commands: {block} -->\s*```bash\n(.*?)```", text, re.S)
    assert found, f"deploy/README.md has no block marked <!-- commands: {block} -->"
    return [line for line in found.group(1).splitlines() if line.strip()]


def bash(line: str, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", line],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def started(line: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", line],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_readme_builds_the_image_and_its_quick_check_runs():
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: apt-get update && apt-get install -y podman")
    lines = readme_commands("build")
    assert lines[0].startswith("apt-get update && apt-get install -y podman"), lines[0]
    build, check = lines[1:]
    start = time.monotonic()
    (built,) = [s for s in bash(build, dict(os.environ), 3600).stderr.splitlines() if "built " in s]
    print(f"\n{build}: {time.monotonic() - start:.1f} s\n{built}")
    # The build reports the image's Python: the one the README states for this base.
    (stated,) = re.findall(r"\(`python3`, \*\*(\d+\.\d+\.\d+)\*\*\)", README.read_text())
    assert built.endswith(f"; Python {stated}"), built
    start = time.monotonic()
    version = bash(check, dict(os.environ)).stdout.strip()
    print(f"{check}: {time.monotonic() - start:.1f} s\n{version}")
    assert version == f"dpsub {VERSION}"


def wait_until_worker_holds_results(address: str, worker: str, run: subprocess.Popen) -> float:
    """Seconds until ``worker`` holds a result of the running job (or the run ended)."""
    from distributed import Client

    start = time.monotonic()
    with Client(address, timeout="60s") as watcher:
        while run.poll() is None and time.monotonic() - start < 600:
            workers = watcher.scheduler_info()["workers"]
            held = watcher.has_what()
            if any(info["name"] == worker and held.get(addr) for addr, info in workers.items()):
                return time.monotonic() - start
            time.sleep(0.05)
    raise AssertionError(f"{worker} never held a result while the run ran")


def test_readme_cluster_walkthrough_survives_a_killed_worker(tmp_path):
    home = tmp_path / "dpsub"
    env = {**os.environ, "DPSUB_HOME": str(home), "DPSUB_CLUSTER": f"t{uuid.uuid4().hex[:8]}"}
    lines = readme_commands("cluster")
    assert lines[0].split("#")[0].strip() == "DPSUB_HOME=/srv/dpsub", lines[0]
    (kill,) = [line for line in lines if "kill-worker" in line]
    worker = "w" + shlex.split(kill.split("#")[0])[-1]
    runs = [line for line in lines if " submit run " in line]
    assert len(runs) == 2 and runs[0] == runs[1]  # the run, then the same run again
    down = next(line for line in lines if line.endswith(" down"))
    seen: dict[str, str] = {}
    try:
        for line in lines[1:]:
            if line == kill:
                continue
            if line == runs[0] and "run" not in seen:
                start = time.monotonic()
                run = started(line, env)
                address = bash("deploy/cluster.sh address", env).stdout.strip()
                held_at = wait_until_worker_holds_results(address, worker, run)
                assert run.poll() is None, "the run ended before the worker could be killed"
                bash(kill, env)
                _, err = run.communicate(timeout=900)
                seen["run"] = f"exit {run.returncode}, worker killed {held_at:.1f} s into it"
                if run.returncode == 5:  # aborted: the same command resumes the run
                    bash(line, env)
                    seen["run"] += ", resumed by the same command"
                else:
                    assert run.returncode == 0, err[-3000:]
                seen["run"] += f", {time.monotonic() - start:.1f} s"
                continue
            seen[line] = bash(line, env).stdout
    finally:
        bash(down, env)
    name = env["DPSUB_CLUSTER"]
    again = seen[runs[1]]
    assert "already published" in again, again  # the same run id: nothing computed or charged
    history = next(out for line, out in seen.items() if "budget history" in line)
    (record,) = history.strip().splitlines()  # one run in the ledger, published once
    assert " events-basis-2026-12-04  published " in record and "epsilon=1," in record, record
    listing = next(out for line, out in seen.items() if line.startswith("ls "))
    assert listing.split() == ["basis.npy", "manifest.json"], listing
    left = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label=dpsub.cluster={name}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert left.stdout.strip() == ""  # down leaves nothing, running or stopped
    print(f"\n{seen['run']}")


def test_scheduled_job_in_the_image_cron_line_and_runner(tmp_path, monkeypatch):
    """pipelines/crontab-podman run as cron would (its @reboot line, then its daily line)
    with /srv/dpsub, /etc/dpsub, /var/log and /opt/dpsub moved under a temporary folder;
    then the DAG's and the flow's runner with ``DPSUB="<repo>/deploy/cluster.sh submit"``
    for the next date: both runs are published, charged once each, and the runner writes
    the report page beside its run's output, all from the image."""
    from test_pipelines import crontab_lines, runner

    from dpsub_dist.jobfile import load_job

    home, jobs, logs = tmp_path / "srv", tmp_path / "etc-dpsub", tmp_path / "log"
    jobs.mkdir()
    logs.mkdir()
    shutil.copy(ROOT / "pipelines" / "events-basis.yaml", jobs)
    moved = {
        "/srv/dpsub": str(home),
        "/etc/dpsub": str(jobs),
        "/var/log/dpsub": str(logs),
        "/var/lock": str(tmp_path),
        "/opt/dpsub": str(ROOT),
    }

    def here(line: str) -> str:
        command = line.split(maxsplit=1 if line.startswith("@") else 5)[-1]
        command = command.replace("\\%", "%")
        for path, moved_to in moved.items():
            command = command.replace(path, moved_to)
        # The job file's path is the container's /etc/dpsub, not the host folder.
        return command.replace(f"{jobs}/events-basis.yaml", "/etc/dpsub/events-basis.yaml")

    boot, daily = crontab_lines("crontab-podman")
    env = {**os.environ, "DPSUB_CLUSTER": f"t{uuid.uuid4().hex[:8]}"}
    submit = [str(ROOT / "deploy" / "cluster.sh"), "submit"]
    ledger = ["--ledger", "/state/ledger.db"]
    try:
        bash(here(boot), env)
        synth = ["synth", "/data/events", "--rows", "20000", "--dim", "10", "--rank", "3"]
        bash(shlex.join([*submit, *synth, "--partitions", "2", "--quiet"]), env)
        grant = ["budget", "init", *ledger, "--dataset", "/data/events", "--epsilon", "5"]
        bash(shlex.join([*submit, *grant, "--delta", "1e-5"]), env)
        bash(here(daily).replace("$(date -u +%F)", "2024-06-01"), env)
        monkeypatch.setenv("DPSUB_CLUSTER", env["DPSUB_CLUSTER"])
        monkeypatch.setenv("DPSUB", shlex.join(submit))
        monkeypatch.setenv("DPSUB_JOB", "/etc/dpsub/events-basis.yaml")
        result = runner().run_dpsub(date(2024, 6, 2))
        history = bash(shlex.join([*submit, "budget", "history", *ledger]), env).stdout
    finally:
        bash(shlex.join([str(ROOT / "deploy" / "cluster.sh"), "down"]), env)
    said = (logs / "events-basis.log").read_text()
    assert said.count("published run events-basis-2024-06-01:") == 1, said
    assert result.code == 0 and result.action == "success", result.summary()
    records = history.strip().splitlines()
    assert len(records) == 2 and all(" published " in r for r in records), history
    output = load_job(jobs / "events-basis.yaml").output_for("events-basis-2024-06-02")
    folder = home / "results" / Path(output).relative_to("/results")
    assert sorted(p.name for p in folder.iterdir()) == ["basis.npy", "manifest.json", "report.html"]
