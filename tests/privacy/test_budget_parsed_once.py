"""The run's budget is parsed once, at the edge, and the same value is handed down to the
runner, the plan and the ledger (issue #15: it was parsed three times per CLI run and five
times per job-file run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsub_dist import jobfile
from dpsub_dist.cli import main
from dpsub_dist.privacy import accountant
from dpsub_dist.synth import generate


@pytest.fixture
def parses(monkeypatch) -> list[tuple]:
    """Every parse_budget call, wherever the package makes it."""
    calls: list[tuple] = []
    real = accountant.parse_budget

    def counted(*args):
        calls.append(args)
        return real(*args)

    for module in (accountant, jobfile):  # params imports it from accountant at each call
        monkeypatch.setattr(module, "parse_budget", counted)
    return calls


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parsed-once")
    return generate(root / "rows", rows=2_000, dim=4, rank=1, partitions=1, seed=1).path


@pytest.mark.parametrize("budget", [["--epsilon", "4"], ["--rho", "1"]])
def test_cli_estimate_parses_the_budget_once(
    budget, parses, source, tmp_path, scheduler_address
) -> None:
    args = ["estimate", str(source), "--rank", "1", "--delta", "1e-6", *budget]
    args += ["--method", "gauss", "--row-norm", "5", "--out", str(tmp_path / "out"), "--quiet"]
    assert main([*args, "--scheduler", scheduler_address]) == 0
    assert len(parses) == 1, parses


def test_job_file_run_parses_the_budget_once(parses, source, tmp_path, scheduler_address) -> None:
    ledger = tmp_path / "ledger.db"
    grant = ["--ledger", str(ledger), "--dataset", f"{source}/", "--epsilon", "10"]
    assert main(["budget", "init", *grant, "--delta", "1e-5"]) == 0
    parses.clear()  # the grant is another command's budget
    job = tmp_path / "job.yaml"
    job.write_text(
        f"dataset: {source}/\nrank: 1\nmethod: gauss\nparameters: {{row_norm: 5}}\n"
        "budget: {epsilon: 4.0, delta: 1.0e-6}\n"
        f"output: {tmp_path}/{{run_id}}\nledger: {ledger}\n"
    )
    run = ["run", str(job), "--run-id", "r1", "--quiet", "--scheduler", scheduler_address]
    assert main(run) == 0
    assert len(parses) == 1, parses


def test_the_parsed_budget_is_a_field_that_replace_carries(parses) -> None:
    """Issue #28: the parsed budget is a typed field of the config, so ``dataclasses.replace``
    (auto's choice, the defaults, boosting's groups) carries it instead of dropping a hidden
    cache; a replace that changes ε parses the new budget, never keeps the old one."""
    import dataclasses

    from dpsub_dist.params import EstimateConfig
    from dpsub_dist.privacy.accountant import ApproxDP

    config = EstimateConfig(2, epsilon=1.0, delta=1e-6)
    budget = config.budget()
    chosen = dataclasses.replace(config, method="gauss", center=True)
    assert chosen.parsed_budget is budget and chosen.budget() is budget
    assert len(parses) == 1
    assert dataclasses.replace(config, epsilon=2.0).budget() == ApproxDP(2.0, 1e-6)
