"""The method registry: every method of ``dpsub estimate``, ``dpsub cluster`` and ``dpsub
stream``, declared once.

Each method is declared in :mod:`dpsub_dist.methods.tables` (a :class:`~.spec.Method`: its
parameter table, its summary, the names of its runner, plan and cross-checks) and its code
lives in its own module, imported on first use; adding a method is its module, its
declaration and one line below. Every method's table extends its command's run-level table
(:data:`dpsub_dist.params.RUN_PARAMS`). The CLI flags (:func:`add_arguments`), the job file's
``parameters:`` (:func:`check_given`), the estimators' parameters and the configs' checks
(:func:`check_config`) are generated from the tables, so an option is refused for a method it
does not apply to the same way everywhere. Nothing here imports NumPy, SciPy or Dask: the
CLI builds its parser from these tables at every call.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from dpsub_dist.errors import InputError, did_you_mean
from dpsub_dist.methods import tables
from dpsub_dist.methods.spec import Method, Modifier, Param, not_applicable
from dpsub_dist.params import DEFAULT_METHODS, RUN_PARAMS

REGISTRY: dict[str, dict[str, Method]] = {
    "estimate": {
        m.name: m
        for m in (
            tables.FRIENDLY,
            tables.HISTOGRAM,
            tables.GAUSS_METHOD,
            tables.GAP_PERTURB,
            tables.EXACT,
            tables.POWER,
            tables.AUTO,
        )
    },
    "cluster": {m.name: m for m in (tables.CLUSTER_SAMPLE_AGGREGATE, tables.SULQ, tables.GIBBS)},
    "stream": {m.name: m for m in (tables.ONLINE,)},
}
"""Methods by command and name: the one list a new method is added to."""

DEFAULTS = DEFAULT_METHODS
"""Each command's method when none is given (estimate: chosen from public facts, docs/auto.md)."""

MODIFIERS: dict[str, tuple[Modifier, ...]] = {
    "estimate": (tables.BOOSTING,),
    "cluster": (),
    "stream": (),
}
"""Options that wrap every method of a command."""

Label = Callable[[Param], str]


def flag(param: Param) -> str:
    return param.flag


def method_named(command: str, name: str) -> Method:
    """The registered method; InputError listing the others."""
    methods = REGISTRY[command]
    if name not in methods:
        hint = did_you_mean(name, methods)
        raise InputError(f"unknown method {name!r}{hint}: use one of {list(methods)}")
    return methods[name]


def own_params(command: str, method: str) -> tuple[Param, ...]:
    """The parameters ``method`` takes: its table and its command's modifiers'."""
    mods = tuple(p for m in MODIFIERS[command] for p in m.params)
    return (*method_named(command, method).params, *mods)


def declared(command: str) -> dict[str, Param]:
    """Every parameter of a command's methods by name (one Param per name), modifiers last."""
    params: dict[str, Param] = {}
    own = [m.params for m in REGISTRY[command].values()]
    for table in [*own, *(m.params for m in MODIFIERS[command])]:
        for param in table:
            if params.setdefault(param.name, param) is not param:
                raise AssertionError(f"two declarations of {command} parameter {param.name}")
    return params


def every_param(command: str) -> dict[str, Param]:
    """The command's whole table by name: its run-level parameters, then every method's."""
    return {**{p.name: p for p in RUN_PARAMS[command]}, **declared(command)}


def users(command: str, param: Param) -> list[str]:
    """The methods of ``command`` that take ``param``."""
    return [name for name in REGISTRY[command] if param in own_params(command, name)]


def refusal(command: str, method: str, params: list[Param], label: Label) -> InputError:
    """:func:`~.spec.not_applicable` naming every method of ``command`` that takes them."""
    takers = [m for p in params for m in users(command, p)]
    return not_applicable(method, [label(p) for p in params], takers)


def check_given(command: str, method: str, given: dict[str, Any], label: Label) -> dict[str, Any]:
    """Options given by name (CLI flags, job-file keys): each must belong to ``method`` and
    pass its table's check. Returns them by config attribute."""
    params = declared(command)
    own = own_params(command, method)
    fields: dict[str, Any] = {}
    for name, value in given.items():
        param = params[name]
        if param not in own:
            raise refusal(command, method, [param], label)
        fields[param.field] = param.typed(value, label(param))
    return fields


def unset(config: Any) -> dict[str, Any]:
    """Each config field's value when nothing sets it (the dataclass default)."""
    return {f.name: f.default for f in fields(config)}


def check_config(config: Any, command: str) -> None:
    """A config's options against the method's table (by attribute), then its cross-checks."""
    method = method_named(command, config.method)
    own = own_params(command, config.method)
    empty = unset(config)
    for param in own:
        value = getattr(config, param.field)
        if value is not None and value != empty[param.field]:
            param.typed(value, param.flag)
    taken = {p.field for p in own}
    for field in dict.fromkeys(p.field for p in declared(command).values()):
        if field in taken:
            continue
        others = [p for p in declared(command).values() if p.field == field]
        value = getattr(config, field)
        if value is not None and value != empty[field]:
            raise refusal(command, config.method, others, flag)
    if config.unit_column and method.row_level_only:
        raise InputError(
            f"--method {config.method} is row-level only ({method.row_level_only}): "
            "drop --unit-column"
        )
    for check in (method.check, *(m.check for m in MODIFIERS[command])):
        if check is not None:
            check(config)


def add_arguments(
    parser: argparse.ArgumentParser, command: str, title: str = "method options (see --method)"
) -> None:
    """One CLI flag per declared parameter (default None: "not given")."""
    group = parser.add_argument_group(title)
    for param in declared(command).values():
        text = f"{param.described} [--method {'/'.join(users(command, param))}]"
        if param.kind is bool:
            action = argparse.BooleanOptionalAction  # --center / --no-center
            group.add_argument(param.flag, action=action, default=None, help=text)
        elif param.choices:
            group.add_argument(param.flag, choices=param.choices, default=None, help=text)
        else:
            group.add_argument(param.flag, type=param.kind, metavar=param.metavar, help=text)


def given_arguments(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The declared options present on the command line, by config attribute (checked)."""
    given = {
        name: getattr(args, name)
        for name in declared(command)
        if getattr(args, name, None) is not None
    }
    return check_given(command, args.method, given, flag)
