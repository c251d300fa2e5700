"""Nothing of the user's is lost (issue #41): every command that writes refuses an output that
is, holds or lies inside its input, or that ``--overwrite`` would replace without having
written it: exit 2, one line naming the fix, every input byte for byte as it was, nothing
reserved or charged. One test per door: the CLI's commands in a subprocess, a job file, the
Python API from a fresh interpreter (object storage: tests/io/test_s3.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dpsub_shim import dpsub

BUDGET = ["--epsilon", "1", "--delta", "1e-6"]


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (or ``root`` itself) and its bytes."""
    if root.is_file():
        return {root.name: root.read_bytes()}
    found = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in found}


def refused(run: subprocess.CompletedProcess, reason: str) -> str:
    """Exit 2 with one line on stderr naming ``reason`` and a fix; nothing on stdout."""
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert reason in lines[0] and ("choose" in lines[0] or "outside" in lines[0])
    assert "Traceback" not in run.stderr and run.stdout == ""
    return lines[0]


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    """A user's Parquet folder as pandas writes it: the input that must survive."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "mydata"
    folder.mkdir()
    pd.DataFrame(rng.normal(size=(300, 3)), columns=["a", "b", "c"]).to_parquet(
        folder / "part-0.parquet"
    )
    return folder


@pytest.fixture()
def user_folder(tmp_path: Path) -> Path:
    """A folder of the user's that is no dpsub output (with a manifest.json of its own)."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"owner": "me"}\n')
    (folder / "thesis.txt").write_text("three years of work\n")
    return folder


@pytest.mark.parametrize(
    ("command", "where", "reason"),
    [
        ("estimate", "input", "is the input"),
        ("estimate", "inside", "lies inside the input"),
        ("estimate", "above", "holds the input"),
        ("estimate", "user", "is not a previous dpsub run output"),
        ("cluster", "input", "is the input"),
    ],
)
def test_estimate_and_cluster_never_replace_the_input_or_a_users_folder(
    tmp_path, data, user_folder, command, where, reason
):
    out = {"input": data, "inside": data / "run", "above": tmp_path, "user": user_folder}[where]
    before = files(tmp_path)
    extra = ["--clusters", "2"] if command == "cluster" else []
    run = dpsub(command, str(data), "--rank", "1", *BUDGET, *extra, "--out", str(out))
    run_overwrite = dpsub(
        command, str(data), "--rank", "1", *BUDGET, *extra, "--out", str(out), "--overwrite"
    )
    for attempt in (run, run_overwrite):
        if where == "user" and attempt is run:
            refused(attempt, "output folder already exists")  # the old refusal, still first
        else:
            refused(attempt, reason)
    assert files(tmp_path) == before


def test_a_previous_run_holding_the_users_files_is_not_replaced(tmp_path, data):
    """A run folder the user also kept a file in: ``--overwrite`` would delete that file."""
    from dpsub_dist.io.output import write_run

    previous = tmp_path / "run"
    write_run(str(previous), np.eye(3)[:, :1], {"outcome": "ok"}, overwrite=False)
    (previous / "notes.txt").write_text("what I saw in this run\n")
    before = files(tmp_path)
    run = dpsub(
        "estimate", str(data), "--rank", "1", *BUDGET, "--out", str(previous), "--overwrite"
    )
    line = refused(run, "holds files dpsub did not write (notes.txt)")
    assert "move them away first" in line
    assert files(tmp_path) == before


def test_synth_overwrite_replaces_only_a_synth_folder(tmp_path, data):
    before = files(data)
    run = dpsub("synth", str(data), "--rows", "50", "--dim", "3", "--rank", "1", "--overwrite")
    refused(run, "is not a previous dpsub synth folder")
    assert files(data) == before
    made = tmp_path / "synthetic"
    args = ["--rows", "50", "--dim", "3", "--rank", "1", "--quiet"]
    assert dpsub("synth", str(made), *args).returncode == 0
    again = dpsub("synth", str(made), *args, "--seed", "1", "--overwrite")
    assert again.returncode == 0, again.stderr
    params = json.loads((made / "_truth" / "params.json").read_text())
    assert params["seed"] == 1  # a synth folder is replaced


def test_stream_append_and_show_refuse_the_input_and_charge_nothing(tmp_path, data, user_folder):
    state = tmp_path / "events.stream"
    init = ["--rank", "1", "--horizon", "4", "--rho", "0.5", "--delta", "1e-6"]
    assert dpsub("stream", "init", str(state), *init).returncode == 0
    before = files(tmp_path)
    batch = data / "part-0.parquet"
    append = dpsub("stream", "append", str(state), str(batch), "--out", str(data), "--overwrite")
    refused(append, "holds the input")
    show = dpsub("stream", "show", str(state), "--out", str(user_folder), "--overwrite")
    refused(show, "is not a previous dpsub run output")
    above = dpsub("stream", "show", str(state), "--out", str(tmp_path), "--overwrite")
    refused(above, "holds the input")  # the stream's own file
    assert files(tmp_path) == before
    status = json.loads(dpsub("stream", "show", str(state), "--json").stdout)
    assert status["step"] == 0 and status["budget"]["spent"]["rho"] == 0


def test_ledger_report_replaces_only_its_own_page(tmp_path, data):
    ledger = tmp_path / "ledger.db"
    grant = ["--ledger", str(ledger), "--dataset", str(data), *BUDGET]
    assert dpsub("budget", "init", *grant).returncode == 0
    before = files(tmp_path)
    on_ledger = dpsub("report", "--ledger", str(ledger), "--out", str(ledger))
    refused(on_ledger, "is the input")
    on_data = dpsub("report", "--ledger", str(ledger), "--out", str(data / "part-0.parquet"))
    refused(on_data, "is not a previous dpsub report page")
    assert files(tmp_path) == before
    page = tmp_path / "ledger.html"
    for _ in range(2):  # the second replaces the first
        assert dpsub("report", "--ledger", str(ledger), "--out", str(page)).returncode == 0


def job_file(tmp_path: Path, data: Path, output: Path) -> Path:
    job = tmp_path / "events.yaml"
    job.write_text(
        f"dataset: {data}\nrank: 1\nbudget: {{epsilon: 1.0, delta: 1.0e-6}}\n"
        f"output: {output}\nledger: {tmp_path / 'ledger.db'}\noverwrite: true\nworkers: 1\n"
    )
    grant = ["--ledger", str(tmp_path / "ledger.db"), "--dataset", str(data)]
    assert dpsub("budget", "init", *grant, "--epsilon", "3", "--delta", "1e-5").returncode == 0
    return job


@pytest.mark.parametrize("where", ["input", "user"])
def test_job_file_output_is_refused_before_anything_is_reserved(tmp_path, data, user_folder, where):
    output = {"input": data, "user": user_folder}[where]
    job = job_file(tmp_path, data, output)
    before = files(tmp_path)
    reason = "is the input" if where == "input" else "is not a previous dpsub run output"
    refused(dpsub("run", str(job), "--run-id", "r1"), reason)
    checked = dpsub("run", str(job), "--run-id", "r1", "--check")
    assert checked.returncode == 2 and reason in checked.stdout + checked.stderr
    assert files(tmp_path) == before  # the ledger too: nothing reserved
    history = dpsub("budget", "history", "--ledger", str(tmp_path / "ledger.db"), "--json")
    assert history.returncode == 0 and json.loads(history.stdout) == []  # no run reserved


def test_python_api_refuses_the_input(tmp_path, data):
    """From a fresh interpreter: ``synth.generate`` and ``run_job`` over the user's data."""
    job = job_file(tmp_path, data, data)
    before = files(tmp_path)
    script = textwrap.dedent(
        f"""
        from dpsub_dist import synth
        from dpsub_dist.errors import InputError
        from dpsub_dist.jobfile import load_job, run_job
        try:
            synth.generate({str(data)!r}, rows=10, dim=3, rank=1, overwrite=True)
        except FileExistsError as err:
            print("synth:", err)
        try:
            run_job(load_job({str(job)!r}), "r1")
        except InputError as err:
            print("job:", err)
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    said = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert "is not a previous dpsub synth folder" in said["synth"]
    assert "is the input" in said["job"]
    assert files(tmp_path) == before
