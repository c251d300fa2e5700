"""The local cluster's worker processes: glibc heap settings that keep arrays off fresh mmaps,
and a Ctrl-C that the driver alone answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import dask
import distributed  # noqa: F401  (loads Dask's distributed config)
import pytest

from dpsub_dist.engine import cluster


def _worker_environ(client) -> dict[str, str | None]:
    seen = client.run(lambda: {name: os.environ.get(name) for name in cluster.WORKER_MALLOC})
    (environ,) = seen.values()
    return environ


def test_local_workers_start_with_the_heap_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dask's own MALLOC_TRIM_THRESHOLD_=65536 (which also fixes glibc's mmap threshold at
    128 KiB) is replaced in the workers' environment, and Dask's config is left as it was."""
    for name in cluster.WORKER_MALLOC:  # a nanny started earlier in this process sets them
        monkeypatch.delenv(name, raising=False)
    before = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    with cluster.dask_client(quiet=True, workers=1, memory_limit="1GiB") as client:
        environ = _worker_environ(client)
    assert environ == {name: str(value) for name, value in cluster.WORKER_MALLOC.items()}
    assert dask.config.get("distributed.nanny.pre-spawn-environ") == before


def test_an_operators_own_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    with cluster.dask_client(quiet=True, workers=1, memory_limit="1GiB") as client:
        environ = _worker_environ(client)
    assert environ["MALLOC_TRIM_THRESHOLD_"] == "65536"
    assert environ["MALLOC_MMAP_THRESHOLD_"] == str(cluster.WORKER_MALLOC["MALLOC_MMAP_THRESHOLD_"])


def test_local_workers_ignore_ctrl_c() -> None:
    """A terminal's Ctrl-C reaches every process of the group; the workers ignore it."""
    with cluster.dask_client(quiet=True, workers=1, memory_limit="1GiB") as client:
        (handler,) = client.run(lambda: signal.getsignal(signal.SIGINT)).values()
    assert handler == signal.SIG_IGN


def test_ctrl_c_during_a_run_prints_one_line_and_exits_130(tmp_path) -> None:
    """``dpsub estimate`` on a local cluster, interrupted as a terminal does (SIGINT to the
    whole process group) once its workers are up: exit 130, the one line, no worker
    traceback before it, nothing written."""
    from dpsub_dist.synth import generate

    data = generate(tmp_path / "data", rows=400_000, dim=16, rank=2, partitions=8, seed=1)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "dpsub_dist.cli", "estimate", str(data.path), "--rank", "2"]
    command += ["--epsilon", "1", "--delta", "1e-6", "--out", str(out), "--workers", "2"]
    command += ["--scheduler", "local-cluster"]
    run = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    seen = []
    for line in run.stderr:  # the banner: the workers are up and the run starts
        seen.append(line)
        if line.startswith("local Dask cluster:"):
            break
    os.killpg(run.pid, signal.SIGINT)
    stdout, rest = run.communicate(timeout=300)
    stderr = "".join(seen) + rest
    assert run.returncode == 130, stderr
    assert stderr.rstrip().endswith("interrupted: nothing was written"), stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stdout == "" and not out.exists()
