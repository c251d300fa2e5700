"""A worker killed mid-run changes nothing: local steps are pure functions of (partition,
public seed), so Dask recomputes what the dead worker held and the release is the same
basis, charged once.

The cluster is a ``dask scheduler`` and two ``dask worker --no-nanny`` processes started
from the command line; a worker is killed with SIGKILL after its first partition is loaded
(held only in its memory) and while its second is being read (see ``GatedLoader``).
DP noise is fresh per run unless a private noise seed is given, so both runs get the same
private ``noise_seed`` (as a resumed ledger run does): any difference in the released basis
would then come from different subset summaries.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from daskprocs import GatedLoader, calls_by_process, command_line_cluster
from distributed import Client

from dpsub_dist.engine.sources import parquet_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error

TESTS = [Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]]
"""This module and tests/'s helpers, importable on the workers."""
PARTS = 8
NOISE_SEED = 20_260_521  # private, test-only: makes the DP noise of both runs identical


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from dpsub_dist.synth import generate

    out = tmp_path_factory.mktemp("synth") / "gauss"
    return generate(out, rows=80_000, dim=10, rank=2, gamma=0.01, partitions=PARTS, seed=3)


def _wait(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_killed_worker_gives_the_same_basis_and_one_charge(dataset, tmp_path):
    config = EstimateConfig(rank=2, epsilon=1.0, delta=1e-6, seed=7)
    calls, gate = tmp_path / "calls", tmp_path / "gate"
    calls.mkdir()

    def open_plain(client):
        return parquet_dataset(str(dataset.path), None, None, None, client)

    def open_gated(client):
        plain = open_plain(client)
        return dataclasses.replace(plain, loader=GatedLoader(plain.loader, str(calls), str(gate)))

    with (
        command_line_cluster(tmp_path / "dask", nanny=False, extra_pythonpath=TESTS) as cluster,
        Client(cluster.address) as client,
    ):
        undisturbed = run_estimate(config, open_plain, client, noise_seed=NOISE_SEED)
        assert undisturbed.basis is not None
        assert undisturbed.manifest["parameters"]["partitions"] == PARTS

        outcome: dict = {}

        def disturbed_run() -> None:
            try:
                outcome["result"] = run_estimate(config, open_gated, client, noise_seed=NOISE_SEED)
            except BaseException as err:  # handed to the test thread below
                outcome["error"] = err

        runner = threading.Thread(target=disturbed_run)
        runner.start()
        try:
            _wait(lambda: any(n >= 2 for n in calls_by_process(calls).values()), "a 2nd load")
            victim = next(pid for pid, n in calls_by_process(calls).items() if n >= 2)
            assert victim in cluster.worker_pids()
            os.kill(victim, signal.SIGKILL)
            _wait(lambda: len(client.scheduler_info()["workers"]) == 1, "the scheduler to notice")
        finally:
            gate.touch()
            runner.join(timeout=300)
        assert "error" not in outcome, outcome.get("error")
        disturbed = outcome["result"]

    loads = calls_by_process(calls)
    survivor = next(pid for pid in loads if pid != victim)
    assert loads[victim] >= 2  # one partition loaded, one lost in flight …
    # … so that one was read again: partitions already folded into a sum held by the
    # survivor need not be, the one in flight must.
    assert loads[victim] + loads[survivor] >= PARTS + 1
    assert loads[survivor] >= PARTS - 1
    # Same release, bit for bit, and the same single set of charges.
    np.testing.assert_array_equal(disturbed.basis, undisturbed.basis)
    assert disturbed.manifest["release"] == undisturbed.manifest["release"]
    budget = disturbed.manifest["privacy"]["budget"]
    assert budget == undisturbed.manifest["privacy"]["budget"]
    steps = [step["step"] for step in budget["steps"]]
    assert len(steps) == len(set(steps)) and steps
    assert subspace_error(disturbed.basis, dataset.load_basis()) <= 0.1
