"""Scheduler examples in pipelines/: each builds a ``dpsub run`` command line with a run id from
the logical date, and the CLI's parser accepts it. Airflow and Prefect are not installed: the
files are parsed with ``ast`` and only their command-building parts are evaluated."""

from __future__ import annotations

import ast
import shlex
from datetime import date
from pathlib import Path

from dpsub_dist.cli import build_parser
from dpsub_dist.jobfile import load_job

PIPELINES = Path(__file__).resolve().parent.parent / "pipelines"


def parse_run(argv: list[str]):
    args = build_parser().parse_args(argv)
    assert args.command == "run"
    return args


def module(name: str) -> ast.Module:
    return ast.parse((PIPELINES / name).read_text(), filename=name)


def evaluate(tree: ast.Module, keep: type | tuple[type, ...], names: set[str]) -> dict:
    """Run only the top-level statements of ``keep`` type that bind ``names`` (no imports)."""

    def binds(node: ast.stmt) -> set[str]:
        if isinstance(node, ast.FunctionDef):
            return {node.name}
        return {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}

    body = [node for node in tree.body if isinstance(node, keep) and binds(node) & names]
    namespace: dict = {"date": date}
    exec(compile(ast.Module(body=body, type_ignores=[]), "<pipeline>", "exec"), namespace)
    return namespace


def test_cron_line_builds_an_accepted_command():
    lines = [
        line
        for line in (PIPELINES / "crontab").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(lines) == 1
    fields = lines[0].split(maxsplit=5)
    assert fields[:5] == ["15", "2", "*", "*", "*"]
    command = fields[5].split(">>")[0]
    assert "$(date -u +\\%F)" in command  # cron needs % escaped
    rendered = command.replace("$(date -u +\\%F)", "2024-06-01")
    args = parse_run(shlex.split(rendered)[1:])
    assert args.run_id == "events-basis-2024-06-01" and args.quiet


def test_airflow_dag_templates_the_logical_date():
    tree = module("airflow_dag.py")
    namespace = evaluate(tree, ast.Assign, {"JOB", "DPSUB_COMMAND"})
    template = namespace["DPSUB_COMMAND"]
    assert "{{ ds }}" in template
    args = parse_run(shlex.split(template.replace("{{ ds }}", "2024-06-01"))[1:])
    assert args.run_id == "events-basis-2024-06-01" and args.job == namespace["JOB"]
    operators = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "BashOperator"
    ]
    assert len(operators) == 1
    keywords = {k.arg: k.value for k in operators[0].keywords}
    assert getattr(keywords["bash_command"], "id", "") == "DPSUB_COMMAND"
    assert ast.literal_eval(keywords["skip_on_exit_code"]) == [3, 4]  # 4: refused, no retry


def test_prefect_flow_builds_an_accepted_command():
    tree = module("prefect_flow.py")
    namespace = evaluate(
        tree, (ast.Assign, ast.FunctionDef), {"JOB", "EXIT_CODES", "dpsub_command"}
    )
    argv = namespace["dpsub_command"](date(2024, 6, 1))
    assert argv[0] == "dpsub"
    args = parse_run(argv[1:])
    assert args.run_id == "events-basis-2024-06-01" and args.job == namespace["JOB"]
    assert sorted(namespace["EXIT_CODES"]) == [0, 1, 2, 3, 4, 5]


def test_example_job_is_valid_and_writes_one_folder_per_run():
    job = load_job(PIPELINES / "events-basis.yaml")
    assert job.output_for("events-basis-2024-06-01").endswith("/events-basis-2024-06-01")
