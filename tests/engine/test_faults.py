"""Fault injection: the scheduler lost mid-run, and the output write refused (disk full).

Both leave no output at all (no run folder, no temporary folder) and end with one
clear line on stderr and a documented exit code (docs/privacy.md, docs/bad-input.md).
A worker killed mid-run and a driver killed before publishing are tested with the
ledger and resilience work (tests/ledger/test_ledger.py and the tests linked from docs/).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daskprocs import command_line_cluster

from dpsub_dist.cli import main
from dpsub_dist.io import output
from dpsub_dist.synth import generate

BUDGET = ["--epsilon", "2", "--delta", "1e-6"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "data"
    generate(out, rows=20_000, dim=8, rank=2, partitions=4, seed=9)
    return out


def _no_output(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def _tasks_besides_sleep(dask_scheduler=None) -> int:
    """Runs on the scheduler (tests/ is on its path): tasks other than the blocking sleep."""
    return sum(1 for key in dask_scheduler.tasks if not str(key).startswith("sleep"))


def test_scheduler_lost_mid_run(data: Path, tmp_path: Path) -> None:
    """Kill -9 the scheduler while the driver waits on its tasks: exit 5, one line, no output.

    The only worker is first made busy with a long sleep, so the driver's first tasks
    (reading the footers) queue behind it: once the scheduler holds them, the driver
    has submitted work and is waiting on it, whatever the machine's speed.
    """
    from distributed import Client

    out = tmp_path / "out"
    stderr = tmp_path / "stderr.txt"
    tests = [Path(__file__).parent, Path(__file__).parents[1]]  # this module, tests/'s helpers
    with command_line_cluster(tmp_path / "cluster", workers=1, extra_pythonpath=tests) as cluster:
        with Client(cluster.address) as blocker:
            sleeps = [blocker.submit(time.sleep, 300, pure=False)]
            while not blocker.processing() or not any(blocker.processing().values()):
                time.sleep(0.05)
            with open(stderr, "w") as err:
                driver = subprocess.Popen(
                    [sys.executable, "-m", "dpsub_dist.cli", "estimate", str(data)]
                    + ["--rank", "2", *BUDGET, "--subsets", "40", "--out", str(out)]
                    + ["--scheduler", cluster.address],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            try:
                deadline = time.monotonic() + 120
                while not blocker.run_on_scheduler(_tasks_besides_sleep):
                    assert driver.poll() is None and time.monotonic() < deadline, stderr.read_text()
                    time.sleep(0.05)
                os.kill(cluster.scheduler.pid, signal.SIGKILL)
                code = driver.wait(timeout=180)
            finally:
                if driver.poll() is None:
                    driver.kill()
                    driver.wait()
            del sleeps
    lines = stderr.read_text().strip().splitlines()
    assert code == 5, stderr.read_text()
    assert len(lines) == 1 and "lost the Dask scheduler" in lines[0], lines
    assert "nothing was written or released" in lines[0]
    _no_output(out)


# -- output write refused -------------------------------------------------------------


def _estimate(data: Path, out: Path, scheduler: str) -> int:
    return main(
        ["estimate", str(data), "--rank", "2", *BUDGET, "--subsets", "40", "--seed", "1"]
        + ["--out", str(out), "--scheduler", scheduler, "--quiet"]
    )


def test_disk_full_while_writing_the_manifest(
    data: Path, tmp_path: Path, scheduler_address: str, monkeypatch, capsys
) -> None:
    """ENOSPC on the manifest (after basis.npy was written): nothing is left behind."""
    write = output._write_synced

    def full_at_manifest(path: Path, payload: bytes) -> None:
        if path.name == "manifest.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(path, payload)

    monkeypatch.setattr(output, "_write_synced", full_at_manifest)
    out = tmp_path / "out"
    code = _estimate(data, out, scheduler_address)
    err = capsys.readouterr().err
    assert code == 5, err
    assert err.strip().splitlines() == [err.strip()]
    assert "No space left on device" in err and str(out) in err
    _no_output(out)


@pytest.fixture()
def tiny_disk(tmp_path: Path):
    """A real 64 KiB tmpfs, mostly filled; skips where mounting is not allowed."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()})")
    try:
        filler = mount / "filler"
        with open(filler, "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\0" * 1024)
            except OSError:
                pass
        os.truncate(filler, filler.stat().st_size - 2048)  # ~2 KiB free: basis fits only
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_real_disk_full(data: Path, tiny_disk: Path, scheduler_address: str, capsys) -> None:
    out = tiny_disk / "out"
    code = _estimate(data, out, scheduler_address)
    err = capsys.readouterr().err
    assert code == 5, err
    assert "No space left on device" in err
    _no_output(out)


def test_output_parent_made_read_only_during_the_run(
    data: Path, tmp_path: Path, scheduler_address: str, monkeypatch, capsys
) -> None:
    """The folder accepted at start refuses the write at the end (read-only remount)."""
    mkdir = Path.mkdir

    def refused(self: Path, *args, **kwargs) -> None:
        if self.name.startswith(".out.tmp-"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refused)
    out = tmp_path / "out"
    code = _estimate(data, out, scheduler_address)
    err = capsys.readouterr().err
    assert code == 5, err
    assert "Read-only file system" in err
    _no_output(out)


class BreaksOnWorkers:
    """A task argument that unpickles only in the process that made it: on a worker it raises
    ImportError, as a module missing from the workers' environment would."""

    def __init__(self, home: int) -> None:
        self.home = home

    def __reduce__(self) -> tuple:
        return (_rebuild, (self.home,))


def _rebuild(home: int) -> BreaksOnWorkers:
    if os.getpid() != home:
        raise ImportError("simulated: the worker cannot import this task's module")
    return BreaksOnWorkers(home)


def test_a_local_cluster_left_without_workers_ends_the_run(monkeypatch) -> None:
    """A worker that cannot unpickle a task shuts down with its nanny, so nothing restarts
    it, and the run waited forever (seen when a worker started on a half-edited tree). After
    NO_WORKERS_TIMEOUT with no worker the run ends: RunAborted (exit 5), nothing written."""
    from dpsub_dist.engine import cluster
    from dpsub_dist.errors import RunAborted

    monkeypatch.setattr(cluster, "NO_WORKERS_TIMEOUT", "2s")
    start = time.monotonic()
    with pytest.raises(RunAborted, match="no worker running for 2 s"):
        with cluster.dask_client(None, quiet=True, workers=1) as client:
            client.submit(id, BreaksOnWorkers(os.getpid())).result(timeout=120)
    assert time.monotonic() - start < 60
