"""How a method is declared: its parameter table (:class:`Param`) and its :class:`Method`.

One table per method is the only description of its options: the CLI flags of ``dpsub
estimate``/``cluster``, the ``parameters:`` of a job file and the checks of
``EstimateConfig``/``ClusterConfig`` are generated from it (:mod:`dpsub_dist.methods`), so an
option is accepted, typed, range-checked and refused for other methods the same way
everywhere. All checks need no data: they run before any footer is read, and a refusal is
exit 2 with nothing spent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsub_dist.errors import InputError

if TYPE_CHECKING:
    from dpsub_dist.engine.sources import Dataset

Shares = dict[str, tuple[float, float]]
"""A budget plan: each step's (share of ε or ρ, share of δ)."""


@dataclass(frozen=True)
class Param:
    """One public parameter of a method (as scikit-learn's ``_parameter_constraints``).

    ``name`` is the job-file key (``parameters.name``) and, with dashes, the CLI flag;
    ``attr`` the config attribute it sets (``radius`` and ``cell_side`` both set ``scale``).
    ``default`` is the config's value when it is not given; ``valid`` checks the typed value
    and ``need`` says in words what it accepts (``fix``: how to choose); ``example`` is a
    value it accepts.
    """

    name: str
    kind: type
    help: str
    example: Any
    need: str = ""
    fix: str = ""
    valid: Callable[[Any], bool] = lambda value: True
    attr: str = ""
    default: Any = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def field(self) -> str:
        return self.attr or self.name

    def typed(self, value: Any, label: str) -> Any:
        """``value`` checked against the type, choices and range; InputError naming ``label``."""
        if self.choices:
            if value not in self.choices:
                raise InputError(
                    f"unknown {label.lstrip('-')} {value!r}: use one of {', '.join(self.choices)}"
                )
            return value
        if self.kind is bool:
            ok = isinstance(value, bool | np.bool_)
        elif self.kind is int:
            ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
        else:
            ok = _is_number(value)
        if not ok or not self.valid(value):
            fix = f": {self.fix}" if self.fix else ""
            raise InputError(f"{label} must be {self.need} (got {value!r}){fix}")
        return value


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return False
    return math.isfinite(float(value))


def positive(value: Any) -> bool:
    return value > 0


@dataclass(frozen=True)
class Method:
    """One method: its table, its runner, and the cross-parameter checks its table cannot say.

    ``run(config, open_dataset, client, progress, noise_seed)`` runs it end to end (the worker
    and driver halves live in :mod:`dpsub_dist.estimators`); a stream's ``run(path, config)``
    creates the stream, whose appends then run its plan. ``plan(config, dataset)`` is its
    budget plan: each named private step's (share of ε or ρ, share of δ), from public facts
    only (the options and the opened dataset's footers; None where no dataset is open yet),
    fixed before any row is read; the runner declares this very plan (:func:`from_options`
    for a plan the footers do not change).
    ``check(config)`` raises InputError for combinations that need no data (e.g. user level
    without a public bound).
    ``row_level_only`` is the reason a method refuses ``--unit-column`` (empty: it takes it).
    """

    name: str
    command: str
    summary: str
    params: tuple[Param, ...]
    run: Callable[..., Any]
    plan: Callable[[Any, Dataset | None], Shares]
    check: Callable[[Any], None] | None = None
    row_level_only: str = ""


def from_options(plan: Callable[[Any], Shares]) -> Callable[[Any, Dataset | None], Shares]:
    """A :attr:`Method.plan` fixed by the options alone: the dataset's footers change nothing."""
    return lambda config, dataset: plan(config)


@dataclass(frozen=True)
class Modifier:
    """Parameters that wrap every method of a command (boosting): ``check`` as in Method."""

    name: str
    command: str
    params: tuple[Param, ...]
    check: Callable[[Any], None] | None = None
