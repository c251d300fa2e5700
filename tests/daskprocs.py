"""A Dask cluster from the command line, for tests: ``dask scheduler`` and ``dask worker``
processes on 127.0.0.1 (the console script of this virtualenv), stopped by the test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from distributed import WorkerPlugin

DASK = str(Path(sys.executable).with_name("dask"))
SINGLE_THREADED_BLAS = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclass
class CommandLineCluster:
    """A running scheduler and its workers, each a process of its own."""

    address: str
    workdir: Path
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)

    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes still running (``--no-nanny``: the worker)."""
        return [p.pid for p in self.workers if p.poll() is None]

    def logs(self) -> str:
        """Everything the scheduler and workers wrote so far."""
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob("*.log")))

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after 10 s)."""
        procs = [*self.workers, self.scheduler]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as handle:
        return subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=env)


def _wait_for(predicate, what: str, cluster: CommandLineCluster, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if cluster.scheduler.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not happen within {timeout} s:\n{cluster.logs()[-3000:]}")


def start_cluster(
    workdir: Path,
    workers: int = 2,
    env: dict[str, str] | None = None,
    nanny: bool = True,
    extra_pythonpath: list[Path] = (),
    memory_limit: str = "2GiB",
) -> CommandLineCluster:
    """``dask scheduler --host 127.0.0.1 --port 0`` and ``workers`` × ``dask worker ADDRESS``.

    ``env`` is the workers' whole environment (default: this process's); BLAS is single
    threaded so results do not depend on thread scheduling. Each worker gets
    ``--memory-limit memory_limit``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    scheduler_file = workdir / "scheduler.json"
    base = dict(os.environ if env is None else env)
    base.update(SINGLE_THREADED_BLAS)
    if extra_pythonpath:
        paths = [str(p) for p in extra_pythonpath] + [base.get("PYTHONPATH", "")]
        base["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    scheduler = _spawn(
        [
            DASK,
            "scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-dashboard",
            "--scheduler-file",
            str(scheduler_file),
        ],
        workdir / "scheduler.log",
        base,
    )
    cluster = CommandLineCluster("", workdir, scheduler)
    try:
        _wait_for(scheduler_file.exists, "the scheduler writing its address", cluster)
        cluster.address = json.loads(scheduler_file.read_text())["address"]
        for i in range(workers):
            args = [
                DASK,
                "worker",
                cluster.address,
                "--nthreads",
                "1",
                "--name",
                f"w{i}",
                "--no-dashboard",
                "--memory-limit",
                memory_limit,
                "--local-directory",
                str(workdir / f"w{i}"),
            ]
            if not nanny:
                args.append("--no-nanny")
            cluster.workers.append(_spawn(args, workdir / f"worker-{i}.log", base))
        from distributed import Client

        with Client(cluster.address, timeout="60s") as client:
            client.wait_for_workers(workers, timeout=120)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def command_line_cluster(workdir: Path, **kwargs) -> Iterator[CommandLineCluster]:
    """A scheduler and workers started from the command line for the block, then stopped."""
    cluster = start_cluster(workdir, **kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()


@dataclass(frozen=True)
class GatedLoader:
    """Wraps a partition loader (importable on workers started with ``tests/`` on the path).

    Every call leaves a marker file ``<calls>/<pid>-<n>-…``; a process's second and later
    calls wait until the file ``gate`` exists. So once some process has two markers, its
    first partition is loaded and held in its memory and its second is in flight: the
    moment to kill it, reached without any timing luck.
    """

    inner: object
    calls: str
    gate: str
    timeout_s: float = 300.0

    def __call__(self, part):
        pid = os.getpid()
        earlier = len(list(Path(self.calls).glob(f"{pid}-*")))
        (Path(self.calls) / f"{pid}-{earlier}-{time.monotonic_ns()}").touch()
        deadline = time.monotonic() + self.timeout_s
        while earlier and not Path(self.gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {self.gate} never opened")
            time.sleep(0.05)
        return self.inner(part)


def calls_by_process(calls: Path) -> dict[int, int]:
    """How many partitions each process has started loading, from the markers."""
    counts: dict[int, int] = {}
    for marker in calls.iterdir():
        pid = int(marker.name.split("-")[0])
        counts[pid] = counts.get(pid, 0) + 1
    return counts


class HaltAfterTasks(WorkerPlugin):
    """A worker plugin (``Client.register_plugin``): the first worker to finish ``tasks``
    tasks of its own writes its process id to ``marker`` and then stops answering (its
    event loop sleeps) until the test kills it: a worker holding results mid-run, reached
    without timing luck. Later workers find the marker taken and go on."""

    name = "halt-after-tasks"

    def __init__(self, marker: str, tasks: int, timeout_s: float = 120.0) -> None:
        self.marker, self.tasks, self.timeout_s = marker, tasks, timeout_s
        self.done = 0

    def transition(self, key, start, finish, **kwargs) -> None:
        if (start, finish) != ("executing", "memory"):
            return
        self.done += 1
        if self.done != self.tasks:
            return
        try:
            handle = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(handle, str(os.getpid()).encode())
        os.close(handle)
        time.sleep(self.timeout_s)
