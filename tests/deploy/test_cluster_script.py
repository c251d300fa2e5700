"""deploy/cluster.sh's podman command lines, checked without podman: a stand-in ``podman``
on PATH records every call and keeps the containers' labels, so the script's own logic
(folders, ownership, ports, mounts, credentials, ``--scheduler``, ``down``) runs here; the
real containers run in the slow tests/deploy/test_deploy_walkthrough.py. Like the script's
``up``, these tests need root (it hands folders to uid 1000)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "cluster.sh"

FAKE_PODMAN = r"""
import json, os, sys
from pathlib import Path

state = Path(os.environ["FAKE_PODMAN_STATE"])
containers = json.loads(state.read_text()) if state.exists() else {}
args = sys.argv[1:]
if args[:2] == ["--runtime", "runc"]:
    args = args[2:]
with open(os.environ["FAKE_PODMAN_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")


def option(name):
    return [args[i + 1] for i, a in enumerate(args) if a == name]


if args[:2] == ["image", "exists"]:
    sys.exit(0)
if args[:2] == ["container", "inspect"]:
    found = containers.get(args[-1])
    if found is None:
        sys.exit(125)
    fmt = args[args.index("--format") + 1]
    if "State.Running" in fmt:
        print("true")
    else:
        key = fmt.split('"')[1]
        print(found["labels"].get(key, ""))
elif args[0] == "run" and "-d" in args:
    labels = dict(label.split("=", 1) for label in option("--label"))
    containers[option("--name")[0]] = {"labels": labels}
elif args[0] == "ps":
    wanted = option("--filter")[0].removeprefix("label=").split("=", 1)
    for name, found in containers.items():
        if found["labels"].get(wanted[0]) == wanted[1]:
            print(name)
elif args[0] == "rm":
    for name in args[4:]:
        containers.pop(name, None)
state.write_text(json.dumps(containers))
"""


@pytest.fixture
def podman(tmp_path):
    """Runs cluster.sh with the stand-in podman; returns (run, calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "podman"
    fake.write_text(f"#!{sys.executable}\n{FAKE_PODMAN}")
    fake.chmod(0o755)
    log = tmp_path / "podman.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_PODMAN_STATE": str(tmp_path / "containers.json"),
        "FAKE_PODMAN_LOG": str(log),
        "DPSUB_CLUSTER": "c1",
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
        )

    def calls(verb: str) -> list[list[str]]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [c for c in map(json.loads, lines) if c[0] == verb]

    return run, calls


def up_args(tmp_path: Path, *extra: str) -> list[str]:
    home = tmp_path / "home"
    args = ["up", "--workers", "3"]
    for name in ("data", "out", "state", "jobs"):
        args += [f"--{name}", str(home / name)]
    return [*args, *extra]


def value(call: list[str], name: str) -> list[str]:
    return [call[i + 1] for i, a in enumerate(call) if a == name]


def test_up_starts_a_scheduler_and_workers_on_free_ports_with_the_folders_mounted(podman, tmp_path):
    run, calls = podman
    secrets = tmp_path / "s3.env"
    secrets.write_text("AWS_ACCESS_KEY_ID=reader\n")
    done = run(*up_args(tmp_path, "--env-file", str(secrets)))
    assert done.returncode == 0, done.stderr
    home = tmp_path / "home"
    for name in ("out", "state", "data"):  # the image's user writes there
        assert (home / name).stat().st_uid == 1000
    assert (home / "jobs").stat().st_uid == os.geteuid()  # read-only: left alone
    scheduler, *workers = calls("run")
    assert value(scheduler, "--name") == ["c1-scheduler"] and len(workers) == 3
    ports = [int(scheduler[scheduler.index("--port") + 1])]
    ports += [int(c[c.index("--dashboard-address") + 1].rsplit(":", 1)[1]) for c in calls("run")]
    assert len(set(ports)) == 5  # comm + 4 dashboards, all different
    for container in calls("run"):
        assert "--network" in container and value(container, "--network") == ["host"]
        assert value(container, "--ulimit") == ["nofile=4096:4096", "nproc=4096:4096"]
        assert "c1-" in value(container, "--name")[0]
        assert value(container, "--label")[0] == "dpsub.cluster=c1"
        address = container[container.index("--dashboard-address") + 1]
        assert address.startswith("127.0.0.1:")  # nothing listens beyond this machine
        assert value(container, "--env")[0] == f"DPSUB_HEALTH_PORT={address.split(':')[1]}"
    for worker in workers:
        assert value(worker, "--volume") == [f"{home / 'data'}:/data:ro"]
        assert value(worker, "--env-file") == [str(secrets)]
        assert f"tcp://127.0.0.1:{ports[0]}" in worker
    assert "--env-file" not in scheduler  # the scheduler reads no data
    assert f"scheduler tcp://127.0.0.1:{ports[0]}" in done.stdout


@pytest.mark.parametrize(
    "args, scheduler",
    [
        (["run", "/etc/dpsub/job.yaml", "--run-id", "r1"], True),
        (["estimate", "/data/events", "--rank", "2", "--out", "/results/x"], True),
        (["run", "/etc/dpsub/job.yaml", "--scheduler", "tcp://elsewhere:8786"], False),
        (["budget", "show", "--ledger", "/state/ledger.db"], False),
        (["synth", "/data/events", "--rows", "10", "--dim", "2", "--rank", "1"], False),
    ],
    ids=["run", "estimate", "own-scheduler", "budget", "synth"],
)
def test_submit_runs_dpsub_in_the_image_against_the_cluster(podman, tmp_path, args, scheduler):
    run, calls = podman
    secrets = tmp_path / "s3.env"
    secrets.write_text("AWS_ACCESS_KEY_ID=driver\n")
    assert run(*up_args(tmp_path, "--env-file", str(secrets))).returncode == 0
    address = run("address").stdout.strip()
    done = run("submit", *args)
    assert done.returncode == 0, done.stderr
    (call,) = [c for c in calls("run") if "--rm" in c]
    home = tmp_path / "home"
    assert value(call, "--volume") == [
        f"{home / 'data'}:/data",
        f"{home / 'out'}:/results",
        f"{home / 'state'}:/state",
        f"{home / 'jobs'}:/etc/dpsub:ro",
    ]
    assert "--no-healthcheck" in call and value(call, "--env-file") == [str(secrets)]
    assert "DPSUB_DIAGNOSTICS_DIR=/state/diagnostics" in value(call, "--env")
    image = call.index("localhost/dpsub:0.1.0")
    expected = [*args, "--scheduler", address] if scheduler else args
    assert call[image + 1 :] == expected


def test_submit_without_a_cluster_says_how_to_start_one(podman):
    run, calls = podman
    done = run("submit", "run", "/etc/dpsub/job.yaml")
    assert done.returncode == 2 and calls("run") == []
    assert done.stderr.strip() == (
        "deploy/cluster.sh: error: no cluster 'c1' is running: start it with deploy/cluster.sh up"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["up", "--workers", "0"], "--workers must be a positive integer (got 0)"),
        (["up", "--workers", "2", "--data", "/d"], "up needs --out DIR"),
        (["up", "--nodes", "2"], "unknown option --nodes for up"),
        (["up", "--workers"], "--workers needs a value"),
        (["kill-worker", "x"], "kill-worker needs a worker number"),
        (["start"], "usage: deploy/cluster.sh up|submit|status|address|kill-worker|down"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(podman, args, message):
    run, calls = podman
    done = run(*args)
    assert done.returncode == 2 and calls("run") == []
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"deploy/cluster.sh: error: {message}"), line


def test_down_removes_every_container_of_this_cluster_only(podman, tmp_path):
    run, calls = podman
    assert run(*up_args(tmp_path)).returncode == 0
    done = run("down")
    assert done.returncode == 0, done.stderr
    (removed,) = calls("rm")
    assert sorted(removed[4:]) == ["c1-scheduler", "c1-w1", "c1-w2", "c1-w3"]
    assert run("submit", "budget", "show").returncode == 2  # nothing left running
    assert shlex.join(removed[:4]) == "rm -f -t 5"
