"""Gibbs clustering has no proven privacy guarantee (ALGORITHMS.md §9 c): what a consumer sees.

A finite MCMC chain only approximates the exponential mechanism, so ``dpsub cluster
--method gibbs`` charges no budget, says ``"guarantee": "none (…)"`` in its manifest with
no budget reported as spent, and warns on stderr; a job file naming it is refused (exit 2)
before the ledger is touched or any data is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpsub_dist.cli import main
from dpsub_dist.privacy.subspace_clustering import GIBBS_GUARANTEE
from dpsub_dist.synth import generate


@pytest.fixture(scope="module")
def two_lines(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gibbs") / "data"
    generate(out, rows=2000, dim=6, rank=1, clusters=2, partitions=2, seed=3)
    return out


def test_cli_gibbs_is_marked_not_private_and_warns(two_lines, scheduler_address, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        ["cluster", str(two_lines), "--clusters", "2", "--rank", "1", "--method", "gibbs"]
        + ["--sweeps", "3", "--epsilon", "10", "--delta", "1e-6", "--out", str(out)]
        + ["--scheduler", scheduler_address, "--quiet"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "not differentially private" in captured.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["privacy"]["guarantee"] == GIBBS_GUARANTEE
    assert manifest["privacy"]["budget"] is None  # nothing reported as spent
    assert "epsilon" not in json.dumps(manifest["privacy"])
    assert np.load(out / "basis.npy").shape == (2, 6, 1)


def test_job_file_with_gibbs_is_refused_before_the_ledger_or_data(two_lines, tmp_path, capsys):
    ledger = tmp_path / "ledger.db"
    grant = ["budget", "init", "--ledger", str(ledger), "--dataset", str(two_lines)]
    assert main([*grant, "--epsilon", "10", "--delta", "1e-5"]) == 0
    capsys.readouterr()
    before = ledger.read_bytes()
    job = tmp_path / "gibbs.yaml"
    job.write_text(
        f"dataset: {two_lines}\nrank: 1\nmethod: gibbs\n"
        "budget: {epsilon: 1.0, delta: 1.0e-6}\n"
        f"output: {tmp_path / 'out'}\nledger: {ledger}\n"
    )
    code = main(["run", str(job), "--run-id", "r1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "gibbs has no privacy guarantee" in err
    assert ledger.read_bytes() == before  # no reservation, no run record
    assert not (tmp_path / "out").exists()
