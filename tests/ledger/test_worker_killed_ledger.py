"""A worker killed by the OS mid-run, under the ledger, through the real commands.

The cluster is ``dask scheduler`` and two ``dask worker --no-nanny --memory-limit 1GiB``
processes started from the command line; the run is ``dpsub run JOB --ledger LEDGER
--scheduler ADDRESS`` in a process of its own (default method). The first worker to
finish its 12th task stops answering (``HaltAfterTasks``, holding results the run still
needs) and is sent SIGKILL, as the kernel's OOM killer would. Whatever happens next, the
run ends with exit 0 (finished on the survivor) or 5 (aborted, nothing written), the
ledger holds one record for the run id, and the output is either complete or absent.
Re-running the run id charges nothing more and leaves one published release.
``tests/engine/test_resilience.py`` checks the same fault through the Python API, without the
ledger (same basis bit for bit); ``bench/beyond_memory.py`` runs it at 5 GB.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from daskprocs import HaltAfterTasks, command_line_cluster
from distributed import Client

from dpsub_dist.cli import main
from dpsub_dist.io.output import read_run
from dpsub_dist.ledger import open_ledger
from dpsub_dist.linalg import subspace_error
from dpsub_dist.synth import generate

TESTS = [Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]]
"""This module and tests/'s helpers, importable on the workers."""
RUN_ID = "day-1"


def _dpsub_run(job: Path, ledger: str, scheduler: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "dpsub_dist.cli", "run", str(job), "--ledger", ledger]
            + ["--scheduler", scheduler, "--run-id", RUN_ID, "--quiet"],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )


def _records(ledger: str, dataset: str) -> list:
    with open_ledger(ledger) as book:
        return [r for r in book.history(dataset) if r.run_id == RUN_ID]


def _outputs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_worker_killed_mid_run_under_the_ledger(tmp_path: Path) -> None:
    """Dask's default: the dead worker's tasks rerun on the survivor (exit 0 expected)."""
    code = _kill_a_worker_mid_run(tmp_path, dict(os.environ))
    assert code in (0, 5)


def test_task_whose_workers_keep_dying_aborts_with_exit_5(tmp_path: Path) -> None:
    """With ``allowed-failures: 0`` one death of the worker running a task is Dask's
    KilledWorker (a task that kills every worker it lands on, as an OOM would): exit 5,
    one line, nothing written, the run reserved; the re-run resumes it, charged once."""
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    assert _kill_a_worker_mid_run(tmp_path, env) == 5


def _kill_a_worker_mid_run(tmp_path: Path, env: dict[str, str]) -> int:
    """The run, the kill and every check of the module docstring; returns the exit code."""
    data = generate(tmp_path / "data", rows=40_000, dim=8, rank=2, partitions=16, seed=5)
    dataset = str(data.path)
    ledger = str(tmp_path / "ledger.sqlite")
    grant = ["budget", "init", "--ledger", ledger, "--dataset", dataset]
    assert main(grant + ["--epsilon", "3", "--delta", "1e-5"]) == 0
    outputs = tmp_path / "out"
    outputs.mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(
        f"dataset: {dataset}\nrank: 2\nbudget: {{epsilon: 1.0, delta: 1.0e-6}}\n"
        f"output: {outputs}/{{run_id}}\n"
    )
    marker, log = tmp_path / "halted-worker", tmp_path / "dpsub.log"
    with command_line_cluster(
        tmp_path / "dask", env=env, nanny=False, extra_pythonpath=TESTS, memory_limit="1GiB"
    ) as cluster:
        with Client(cluster.address) as client:
            client.register_plugin(HaltAfterTasks(str(marker), tasks=12))
        driver = _dpsub_run(job, ledger, cluster.address, log)
        try:
            deadline = time.monotonic() + 120
            while not marker.exists() or not marker.read_text():
                assert driver.poll() is None, f"the run ended before the kill:\n{log.read_text()}"
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            victim = int(marker.read_text())
            assert victim in cluster.worker_pids()
            os.kill(victim, signal.SIGKILL)
            code = driver.wait(timeout=180)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
        assert victim not in cluster.worker_pids() and len(cluster.worker_pids()) == 1
        assert code in (0, 5), log.read_text()
        (record,) = _records(ledger, dataset)
        if code == 0:  # finished on the survivor: published once, complete
            assert record.state == "published"
            assert _outputs(outputs) == [RUN_ID]
            assert _outputs(outputs / RUN_ID)[-1] == "manifest.json"
            first = read_run(str(outputs / RUN_ID))
        else:  # aborted: one line, nothing written, the charge stays reserved for the re-run
            lines = log.read_text().strip().splitlines()
            assert len(lines) == 1 and "nothing was written or released" in lines[0], lines
            assert record.state == "reserved"
            assert _outputs(outputs) == []
        again = _dpsub_run(job, ledger, cluster.address, log)
        assert again.wait(timeout=180) == 0, log.read_text()

    (record,) = _records(ledger, dataset)
    assert record.state == "published" and record.charge.epsilon == 1.0
    with open_ledger(ledger) as book:
        (status,) = book.status(dataset)
    assert status.published.epsilon == 1.0 and status.runs == {"published": 1}
    assert _outputs(outputs) == [RUN_ID]
    basis, manifest = read_run(str(outputs / RUN_ID))
    assert manifest["ledger"]["run_id"] == RUN_ID
    if code == 0:  # the re-run published nothing new: the same release
        np.testing.assert_array_equal(basis, first[0])
        assert manifest == first[1]
        assert "nothing charged" in log.read_text()
    assert subspace_error(basis, data.load_basis()) <= 0.1
    return code
