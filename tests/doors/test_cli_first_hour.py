"""The command line as a new user meets it in the first hour: every option and command has
help with an example, a misspelt option, command, choice or method gets "did you mean",
and an impossible worker count is refused instead of silently replaced."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpsub_dist.cli import build_parser, main
from dpsub_dist.jobfile import JOB_FIELDS
from dpsub_dist.methods import DEFAULTS


def _commands(
    parser: argparse.ArgumentParser, path: str = "dpsub"
) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every command and sub-command of ``parser``, with its path (``dpsub budget init``)."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _commands(child, f"{path} {name}")
    return found


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err
    assert raised.value.code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_every_option_has_help_and_every_command_an_example():
    commands = _commands(build_parser())
    assert len(commands) > 10
    for path, parser in commands:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(choice.help for choice in action._choices_actions), path
                continue
            name = "/".join(action.option_strings) or action.dest
            assert action.help and action.help != argparse.SUPPRESS, f"{path} {name}: no help"
        assert parser.epilog and f"\n  {path}" in parser.epilog, f"{path}: no example"
        if path != "dpsub":
            assert f"  {path}" in parser.format_help().split("examples:")[1], path


def test_synth_help_explains_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("n, the number of rows", "γ, the noise off the subspace", "row order"):
        assert words in text
    assert "examples: dpsub synth data/gauss --rows 200000" in text


def test_subsets_and_iterations_have_distinct_names(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    subsets = text.split("--subsets SUBSETS ")[1].split(" [--method")[0]
    passes = text.split("--iterations PASSES ")[1].split(" [--method")[0]
    assert subsets.startswith("t, the number of disjoint subsets")
    assert passes.startswith("power-iteration passes over the rows")


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "data", "--rank", "1", "--out", "o", "--workers", "0"],
        ["evaluate", "run", "--data", "d", "--workers", "-1"],
        ["run", "job.yaml", "--workers", "0"],
        ["stream", "append", "s.db", "b.parquet", "--workers", "0"],
    ],
)
def test_zero_workers_is_refused(argv, capsys):
    err = _usage_error(argv, capsys)
    assert "argument --workers: must be at least 1" in err
    assert "omit --workers for one worker per core" in err


def test_misspelt_command_option_and_choice_get_a_suggestion(capsys):
    err = _usage_error(["estmate"], capsys)
    assert "invalid choice: 'estmate' (did you mean 'estimate'?)" in err
    err = _usage_error(["budget", "inti"], capsys)
    assert "(did you mean 'init'?)" in err
    args = ["estimate", "d", "--out", "o", "--epsilon", "1", "--delta", "1e-6"]
    err = _usage_error([*args, "--rnk", "3"], capsys)  # --rank is required, and misspelt
    assert "unrecognized arguments: --rnk (did you mean '--rank'?)" in err
    err = _usage_error([*args, "--rank", "3", "--row_norm=2", "--subset", "4"], capsys)
    assert "--row_norm (did you mean '--row-norm'?)" in err
    assert "--subset" not in err  # an abbreviation argparse accepts is not an error
    err = _usage_error(
        ["synth", "o", "--rows", "9", "--dim", "3", "--rank", "1", "--model", "gaus"], capsys
    )
    assert "'gaus' (did you mean 'gaussian'?)" in err


def test_misspelt_method_gets_a_suggestion(tmp_path: Path, capsys):
    code = main(
        ["estimate", str(tmp_path), "--rank", "1", "--epsilon", "1", "--delta", "1e-6"]
        + ["--out", str(tmp_path / "o"), "--method", "gaus"]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "unknown method 'gaus' (did you mean 'gauss'?)" in err
    job = tmp_path / "job.yaml"
    job.write_text(
        "dataset: /d\nrank: 1\nmethod: frendly\nbudget: {epsilon: 1, delta: 1.0e-6}\n"
        "output: /o/{run_id}\nledger: l.db\nparameter: {subsets: 4}\n"
    )
    assert main(["run", str(job), "--check"]) == 2
    assert "unknown field 'parameter' (did you mean 'parameters'?)" in capsys.readouterr().err
    job.write_text(job.read_text().replace("parameter:", "parameters:"))
    assert main(["run", str(job), "--check"]) == 2
    assert "method 'frendly' is unknown (did you mean 'friendly'?)" in capsys.readouterr().err


def test_usage_error_is_one_line_from_the_real_command():
    proc = subprocess.run(
        [sys.executable, "-m", "dpsub_dist.cli", "estimate", "x", "--rnk", "3", "--out", "o"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "dpsub estimate: error: unrecognized arguments: --rnk (did you mean '--rank'?) "
        "(see dpsub estimate --help)"
    ]


def test_job_fields_name_the_default_method():
    assert f"default {DEFAULTS['estimate']};" in JOB_FIELDS["method"]


def test_help_lists_the_subcommands_the_parser_has():
    """A group's help line that lists its subcommands (``budget: init, show, history``)
    names exactly the ones the parser accepts, as ``dpsub --help`` prints it."""
    wide = {**os.environ, "COLUMNS": "200"}  # one line per command
    shown = subprocess.run(
        [sys.executable, "-m", "dpsub_dist.cli", "--help"], capture_output=True, text=True, env=wide
    ).stdout
    checked = 0
    for path, parser in _commands(build_parser()):
        groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if path == "dpsub" or not groups:
            continue
        name = path.split()[-1]
        [line] = [ln for ln in shown.splitlines() if ln.split()[:1] == [name]]
        if ":" in line:
            listed = [word.strip() for word in line.rsplit(":", 1)[1].split(",")]
            assert listed == list(groups[0].choices), line
            checked += 1
    assert checked >= 1  # the budget group lists its subcommands
