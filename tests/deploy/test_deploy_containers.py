"""The shipped image, end to end (slow: builds the image with deploy/build-image.sh, minutes
and network the first time, then a cached rebuild of the package layer): a Dask scheduler
and two workers in containers from the image (podman, host network, 127.0.0.1), Parquet
input on the tests' S3-compatible server, a PostgreSQL ledger, and ``dpsub run JOB.yaml``
in a container from the same image. The same job also runs on the host against a cluster
of this virtualenv, for the wall-time comparison printed by ``pytest -s``. Then a worker
container is killed (``podman kill``) while it holds results: the run completes on the
survivor, or ends with exit 5 and its retry resumes; either way it is published once and
charged once."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from daskprocs import command_line_cluster
from pg import PostgresServer
from s3server import free_port, s3_server, upload

from dpsub_dist.ledger import open_ledger

pytestmark = [
    pytest.mark.slow,
    # The test's own watcher client (this virtualenv) differs from the image in Python and
    # cloudpickle patch versions; dpsub's check covers dpsub_dist, dask and distributed.
    pytest.mark.filterwarnings("ignore::distributed.versions.VersionMismatchWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/dpsub:{VERSION}"
DPSUB = [sys.executable, "-m", "dpsub_dist.cli"]
PODMAN = ["podman", "--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
DATASET = "s3://data/events"
ROWS, DIM, RANK, PARTITIONS = 1_000_000, 10, 2, 8
GRANT = 10.0
CHARGE = 1.0


def podman(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*PODMAN, *args], text=True, capture_output=True, **kwargs)


@pytest.fixture(scope="module")
def image() -> str:
    """The image of this tree: deploy/build-image.sh (layers cached after the first build)."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: apt-get install -y podman runc mmdebstrap")
    build = subprocess.run(
        [ROOT / "deploy" / "build-image.sh"],
        env={**os.environ, "IMAGE": IMAGE},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(build.stderr.strip().splitlines()[-1])
    return IMAGE


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from dpsub_dist.synth import generate

    with s3_server(tmp_path_factory.mktemp("moto")) as server:
        local = tmp_path_factory.mktemp("synth") / "events"
        generate(local, rows=ROWS, dim=DIM, rank=RANK, partitions=PARTITIONS, seed=3)
        upload(server, local, DATASET)
        yield server


@pytest.fixture(scope="module")
def ledger(image):
    server = PostgresServer()
    try:
        url = server.new_database()
        grant = ["budget", "init", "--ledger", url, "--dataset", DATASET]
        done = run_in_image(image, [*grant, "--epsilon", str(GRANT), "--delta", "1e-5"], {})
        assert done.returncode == 0, done.stderr
        yield url
    finally:
        server.stop()


def s3_env(s3, user: str) -> dict[str, str]:
    return {k: v for k, v in s3.env(user).items() if k.startswith("AWS_")}


def env_args(env: dict[str, str]) -> list[str]:
    return [arg for name, value in env.items() for arg in ("--env", f"{name}={value}")]


def run_in_image(image: str, args: list[str], env: dict[str, str], volume: str = ""):
    volumes = ["--volume", volume] if volume else []
    return podman(
        "run", "--rm", "--network", "host", *LIMITS, *env_args(env), *volumes, image, *args,
        timeout=900,
    )  # fmt: skip


@contextlib.contextmanager
def container_cluster(image: str, worker_env: dict[str, str]):
    """A scheduler and workers w0, w1 in containers on 127.0.0.1; yields (address, names)."""
    tag = uuid.uuid4().hex[:8]
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    names = {
        "scheduler": f"dpsub-scheduler-{tag}",
        "w0": f"dpsub-w0-{tag}",
        "w1": f"dpsub-w1-{tag}",
    }
    common = ["run", "-d", "--network", "host", *LIMITS, "--entrypoint", "dask"]
    try:
        scheduler = ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]
        started = podman(*common, "--name", names["scheduler"], image, *scheduler)
        assert started.returncode == 0, started.stderr
        for worker in ("w0", "w1"):
            args = ["worker", address, "--name", worker, "--nthreads", "1", "--no-dashboard"]
            args += ["--memory-limit", "2GiB", "--host", "127.0.0.1"]
            started = podman(*common, "--name", names[worker], *env_args(worker_env), image, *args)
            assert started.returncode == 0, started.stderr
        from distributed import Client

        with Client(address, timeout="120s") as client:
            client.wait_for_workers(2, timeout=180)
        yield address, names
    finally:
        for name in names.values():
            podman("rm", "-f", "-t", "2", name, timeout=120)


def write_job(folder: Path, s3, ledger: str, scheduler: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = {
        "name": "events-basis",
        "dataset": DATASET,
        "columns": [f"x{i}" for i in range(DIM)],
        "rank": RANK,
        "method": "friendly",
        "budget": {"epsilon": CHARGE, "delta": 1e-6},
        "output": "s3://data/runs/events-basis/{run_id}",
        "ledger": ledger,
        "storage_options": {"endpoint_url": s3.endpoint},
        "scheduler": scheduler,
    }
    path = folder / "events-basis.yaml"
    path.write_text(yaml.safe_dump(job))
    path.chmod(0o644)
    folder.chmod(0o755)
    return path


def run_job_in_image(image, job: Path, run_id: str, s3) -> subprocess.Popen:
    """``dpsub run`` in a container as the S3 ``driver`` user (it cannot read data)."""
    args = ["run", "--network", "host", *LIMITS, "--rm", *env_args(s3_env(s3, "driver"))]
    args += ["--volume", f"{job.parent}:/job:ro", image]
    args += ["run", f"/job/{job.name}", "--run-id", run_id, "--quiet"]
    return subprocess.Popen(
        [*PODMAN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def published(s3, ledger: str, run_id: str) -> np.ndarray:
    """The run's basis, after checking it is published once and charged once."""
    with open_ledger(ledger) as book:
        records = [r for r in book.history(DATASET) if r.run_id == run_id]
    assert [r.state for r in records] == ["published"], records
    assert records[0].charge.epsilon == pytest.approx(CHARGE)
    fs = s3.fs("admin")
    folder = f"data/runs/events-basis/{run_id}"
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(folder)) == ["basis.npy", "manifest.json"]
    with fs.open(f"{folder}/basis.npy", "rb") as handle:
        return np.load(handle)


def charged(ledger: str) -> float:
    with open_ledger(ledger) as book:
        (status,) = book.status(DATASET)
    return GRANT - status.remaining.epsilon


def timed(proc: subprocess.Popen, started: float) -> tuple[int, str, float]:
    _, err = proc.communicate(timeout=900)
    return proc.returncode, err, time.monotonic() - started


def test_job_on_a_containerised_cluster_vs_host(image, s3, ledger, tmp_path):
    with command_line_cluster(tmp_path / "host-dask", env=s3.env("reader")) as host:
        job = write_job(tmp_path / "host-job", s3, ledger, host.address)
        started = time.monotonic()
        proc = subprocess.Popen(
            [*DPSUB, "run", str(job), "--run-id", "host", "--quiet"],
            env=s3.env("driver"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        code, err, host_s = timed(proc, started)
    assert code == 0, err
    with container_cluster(image, s3_env(s3, "reader")) as (address, _):
        job = write_job(tmp_path / "container-job", s3, ledger, address)
        started = time.monotonic()
        code, err, container_s = timed(run_job_in_image(image, job, "containers", s3), started)
    assert code == 0, err
    assert published(s3, ledger, "containers").shape == (DIM, RANK)
    assert published(s3, ledger, "host").shape == (DIM, RANK)
    assert charged(ledger) == pytest.approx(2 * CHARGE)
    start = time.monotonic()
    assert run_in_image(image, ["--version"], {}).returncode == 0
    overhead = time.monotonic() - start
    print(
        f"\ndpsub run wall time: host {host_s:.1f} s, containers {container_s:.1f} s "
        f"(a container that only runs dpsub --version: {overhead:.1f} s)"
    )


def test_worker_container_killed_mid_run(image, s3, ledger, tmp_path):
    from distributed import Client

    before = charged(ledger)
    with container_cluster(image, s3_env(s3, "reader")) as (address, names):
        job = write_job(tmp_path / "kill-job", s3, ledger, address)
        started = time.monotonic()
        proc = run_job_in_image(image, job, "killed", s3)
        killed = False
        with Client(address, timeout="60s") as watcher:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                workers = watcher.scheduler_info()["workers"]
                held = watcher.has_what()
                if any(info["name"] == "w1" and held.get(addr) for addr, info in workers.items()):
                    podman("kill", names["w1"], timeout=60)
                    killed, killed_at = True, time.monotonic() - started
                    break
                time.sleep(0.05)
        running_at_kill = proc.poll() is None
        code, err, wall = timed(proc, started)
        outcome = f"exit {code}"
        if code == 5:  # aborted: the retry resumes the reserved run on the survivor
            code, err, _ = timed(run_job_in_image(image, job, "killed", s3), time.monotonic())
            outcome += f", retry exit {code}"
    assert killed and running_at_kill, "the worker was not killed mid-run"
    assert code == 0, err
    assert published(s3, ledger, "killed").shape == (DIM, RANK)
    assert charged(ledger) - before == pytest.approx(CHARGE)
    print(
        f"\nworker w1 killed {killed_at:.1f} s into the run: {outcome} after {wall:.1f} s; "
        "published once, charged once"
    )
