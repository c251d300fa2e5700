"""One declaration per method (issue #15): the CLI, job files and the configs are generated
from the method tables of :mod:`dpsub_dist.methods`, so an option that does not apply to a
method is refused the same way everywhere: one line naming the option and the fix, exit 2,
nothing written, nothing read."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from dpsub_dist.cli import build_parser, main
from dpsub_dist.errors import InputError
from dpsub_dist.job import ClusterConfig, EstimateConfig, StreamConfig, init_stream, validate
from dpsub_dist.jobfile import load_job
from dpsub_dist.methods import REGISTRY, declared, own_params
from dpsub_dist.params import RUN_PARAMS

COMMON = {"estimate": {"--method"}, "cluster": {"--method"}, "stream": {"--ledger", "--dataset"}}
"""Flags of one door only; the run-level ones come from RUN_PARAMS."""
PARSERS = {"estimate": ("estimate",), "cluster": ("cluster",), "stream": ("stream", "init")}
INPUT = {"--out", "--overwrite", "--scheduler", "--workers", "--quiet", "-h", "--help"}
INPUT |= {"--memory-limit"}  # the local cluster's worker limit, as --workers
CONFIG_OWN = {"method", "parsed_budget"}
CONFIG_OWN_STREAM = {"ledger", "dataset", "unit_column"}  # unit_column: refused, row level only
CONFIGS = {"estimate": EstimateConfig, "cluster": ClusterConfig, "stream": StreamConfig}
JOB = """dataset: {data}
rank: 2
method: {method}
budget: {{epsilon: 1.0, delta: 1.0e-6}}
output: {out}/{{run_id}}
ledger: {out}/ledger.db
"""


def _flags(command: str) -> set[str]:
    parser = build_parser()
    for name in PARSERS[command]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    flags = {f for action in parser._actions for f in action.option_strings}
    run_level = {p.flag for p in RUN_PARAMS[command]}
    assert run_level <= flags, run_level - flags  # the run-level table's flags, all there
    return flags - COMMON[command] - INPUT - run_level


def _cli_arg(param) -> list[str]:
    return [param.flag] if param.kind is bool else [param.flag, str(param.example)]


def _job(tmp_path: Path, method: str, parameters: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    text = JOB.format(data=tmp_path / "data", method=method, out=tmp_path / "out")
    path.write_text(text + f"parameters: {parameters!r}\n".replace("True", "true"))
    return path


def _cli(tmp_path: Path, capsys, command: str, method: str, *args: str) -> tuple[int, str]:
    out = tmp_path / "run"
    argv = [command, str(tmp_path / "missing-data"), "--out", str(out), "--rank", "2"]
    argv += ["--epsilon", "1", "--delta", "1e-6", "--method", method, *args]
    if command == "cluster":
        argv += ["--clusters", "2"]
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert not out.exists()
    return code, err


@pytest.mark.parametrize("command", sorted(REGISTRY))
def test_every_declared_parameter_has_a_flag_a_config_field_and_a_job_key(command, tmp_path):
    params = declared(command)
    negated = {"--no-" + p.flag[2:] for p in params.values() if p.kind is bool}
    assert _flags(command) == {p.flag for p in params.values()} | negated
    fields = {f.name for f in dataclasses.fields(CONFIGS[command])}
    run_level = {p.field for p in RUN_PARAMS[command]}
    own = CONFIG_OWN | (CONFIG_OWN_STREAM if command == "stream" else set())
    assert fields - own == run_level | {p.field for p in params.values()}
    if command != "estimate":  # job files run estimate methods only
        return
    for method in REGISTRY[command]:
        given = {p.name: p.example for p in own_params(command, method)}
        given.pop("boost_alpha")  # needs boost, given here too
        job = load_job(_job(tmp_path, method, given))
        for name, value in given.items():
            assert getattr(job.config(), params[name].field) == value
    with pytest.raises(InputError, match="parameters.bogus is unknown"):
        load_job(_job(tmp_path, "friendly", {"bogus": 1}))


def _inapplicable(command: str) -> list[tuple[str, str]]:
    return [
        (method, param.name)
        for method in REGISTRY[command]
        for param in declared(command).values()
        if param not in own_params(command, method)
    ]


@pytest.mark.parametrize(("command", "method", "name"), [
    (command, method, name) for command in REGISTRY for method, name in _inapplicable(command)
])  # fmt: skip
def test_an_inapplicable_option_is_refused_alike_by_config_cli_and_job(
    command, method, name, tmp_path, capsys
):
    param = declared(command)[name]
    code, err = _cli(tmp_path, capsys, command, method, *_cli_arg(param))
    refusal = f"{param.flag} does not apply to --method {method}: drop it for --method {method}"
    assert code == 2 and refusal in err and len(err.strip().splitlines()) == 1, err
    base = {"rank": 2, "epsilon": 1.0, "delta": 1e-6, "method": method}
    if command == "cluster":
        base["clusters"] = 2
    config = CONFIGS[command](**base, **{param.field: param.example})
    if param.field in {p.field for p in own_params(command, method)}:
        validate(config)  # radius and cell_side both set the config's scale: its own option
    else:
        with pytest.raises(InputError, match="does not apply to --method " + method) as raised:
            validate(config)
        assert raised.value.exit_code == 2 and param.flag in str(raised.value)
    if command == "estimate":
        with pytest.raises(InputError) as raised:
            load_job(_job(tmp_path, method, {name: param.example}))
        job_refusal = err.split("error: ", 1)[1].strip().replace(param.flag, f"parameters.{name}")
        assert str(raised.value) == f"{tmp_path / 'job.yaml'}: {job_refusal}"


def test_exact_refuses_the_options_it_used_to_ignore(tmp_path, capsys):
    """The issue's example: validated and silently ignored four options."""
    options = {"subsets": 50, "ref_points": 8, "assign": "contiguous", "scale": 0.3}
    for name, value in options.items():
        config = EstimateConfig(rank=2, epsilon=1.0, delta=1e-6, method="exact", **{name: value})
        with pytest.raises(InputError, match="does not apply to --method exact"):
            validate(config)
    for args in (["--subsets", "50"], ["--ref-points", "8"], ["--assign", "contiguous"]):
        code, err = _cli(tmp_path, capsys, "estimate", "exact", *args)
        assert code == 2 and f"{args[0]} does not apply to --method exact" in err
    with pytest.raises(InputError, match="parameters.subsets does not apply to --method exact"):
        load_job(_job(tmp_path, "exact", {"subsets": 50}))


def test_histogram_refuses_a_radius_in_a_job_file_as_on_the_command_line(tmp_path, capsys):
    """The issue's example: the job file used the radius as the cell side."""
    code, err = _cli(tmp_path, capsys, "estimate", "histogram", "--radius", "0.5")
    assert code == 2 and "--radius does not apply to --method histogram" in err
    with pytest.raises(InputError, match="parameters.radius does not apply to --method histogram"):
        load_job(_job(tmp_path, "histogram", {"radius": 0.5}))
    assert load_job(_job(tmp_path, "histogram", {"cell_side": 0.5})).config().scale == 0.5


STREAM_REFUSALS = [
    ({"horizon": 0}, "--horizon must be an integer in 1..1048576 (got 0)"),
    ({"horizon": 2**21}, "--horizon must be an integer in 1..1048576"),
    ({"clip_norm": 0.0}, "--clip-norm must be a positive finite number (got 0.0)"),
    ({"clip_norm": float("nan")}, "--clip-norm must be a positive finite number (got nan)"),
    ({"clip_norm": -3.0}, "--clip-norm must be a positive finite number (got -3.0)"),
]


def _stream_cli(tmp_path: Path, capsys, options: dict[str, Any]) -> tuple[int, str]:
    state = tmp_path / "s.db"
    argv = ["stream", "init", str(state), "--rank", "2", "--rho", "1", "--delta", "1e-6"]
    options = {"horizon": 4, **options}
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is not None:
            argv += [flag, str(value)]
    capsys.readouterr()
    code = main(argv)
    assert not list(tmp_path.glob("s.db*")), "a refused stream made a file"
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("options", "message"), STREAM_REFUSALS)
def test_stream_options_are_refused_alike_by_cli_and_api(options, message, tmp_path, capsys):
    """The stream's table checks its options on the command line and in the API the same
    way: one line, exit 2, no stream file made (nothing charged: no ledger touched)."""
    code, err = _stream_cli(tmp_path, capsys, options)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    config = StreamConfig(rank=2, rho=1.0, delta=1e-6, **{"horizon": 4, **options})
    with pytest.raises(InputError) as raised:
        init_stream(str(tmp_path / "s.db"), config)
    assert raised.value.exit_code == 2 and err.split("error: ", 1)[1].strip() == str(raised.value)
    assert not list(tmp_path.glob("s.db*"))


def test_stream_refuses_what_its_table_does_not_declare(tmp_path, capsys):
    """No horizon, a user-level unit, an estimate option, a ledger without its dataset: exit 2
    before anything is made."""
    code, err = _stream_cli(tmp_path, capsys, {"horizon": None})
    assert code == 2 and "--horizon must be an integer in 1..1048576 (got None)" in err
    with pytest.raises(InputError, match="--horizon must be an integer"):
        validate(StreamConfig(rank=2, rho=1.0, delta=1e-6))
    with pytest.raises(InputError, match="row-level only .*drop --unit-column"):
        validate(StreamConfig(rank=2, horizon=4, rho=1.0, delta=1e-6, unit_column="user"))
    init = ["stream", "init", str(tmp_path / "s.db"), "--rank", "2", "--horizon", "4"]
    for extra in (["--row-norm", "3"], ["--no-center", "--unit-column", "user"]):
        with pytest.raises(SystemExit) as raised:  # no stream flag: argparse's exit 2
            main([*init, "--rho", "1", "--delta", "1e-6", *extra])
        err = capsys.readouterr().err
        assert raised.value.code == 2 and f"unrecognized arguments: {extra[-2]}" in err
    code, err = _stream_cli(tmp_path, capsys, {"dataset": "/d"})
    assert code == 2 and "--dataset needs --ledger" in err
    assert not list(tmp_path.glob("s.db*"))


@pytest.mark.parametrize("command", ["estimate", "cluster"])
def test_method_defaults_live_in_the_tables_and_help_prints_them(command, capsys):
    """Issue #28: the real defaults (power's T, exact's ℓ and τ, sulq's iterations, gibbs'
    sweeps, boosting's α) are declared in the tables, ``--help`` prints them from there, and
    the run's config holds them (not ``config.x or DEFAULT`` deep in a driver)."""
    from dpsub_dist.job import with_defaults

    numbers = {p.name: p for p in declared(command).values() if p.kind in (int, float)}
    defaults = {name for name, p in numbers.items() if p.default is not None}
    assert (
        defaults
        == {
            "estimate": {"iterations", "oversample", "outliers", "tolerance", "boost_alpha"},
            "cluster": {"iterations", "sweeps"},
        }[command]
    )
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for name in defaults:
        param = numbers[name]
        assert f"{param.help} (default {param.default})" in shown, name
    for method in REGISTRY[command]:
        base = {"epsilon": 1.0, "delta": 1e-6, "method": method}
        if command == "estimate":
            config = with_defaults(EstimateConfig(2, **base))
        else:
            config = ClusterConfig(1, clusters=2, **base)
            config = dataclasses.replace(config, **REGISTRY[command][method].defaults(config))
        for param in REGISTRY[command][method].params:
            if param.name in defaults:
                assert getattr(config, param.field) == param.default, (method, param.name)
