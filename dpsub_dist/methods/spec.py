"""How a method is declared: its parameter table (:class:`~dpsub_dist.params.Param`, which
extends its command's run-level table) and its :class:`Method`.

One table per method is the only description of its options: the CLI flags of ``dpsub
estimate``/``cluster``, the ``parameters:`` of a job file, the estimators' parameters and the
checks of the configs are generated from it (:mod:`dpsub_dist.methods`), so an option is
accepted, typed, range-checked and refused for other methods the same way everywhere. All
checks need no data: they run before any footer is read, and a refusal is exit 2 with nothing
spent.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpsub_dist.errors import InputError
from dpsub_dist.params import Param, positive

__all__ = ["Choice", "Later", "Method", "Modifier", "Param", "not_applicable", "positive"]

if TYPE_CHECKING:
    from dpsub_dist.engine.sources import Dataset

Shares = dict[str, tuple[float, float]]
"""A budget plan: each step's (share of ε or ρ, share of δ)."""


@dataclass(frozen=True)
class Later:
    """``module.name``, imported at its first call: a declaration names its code without
    importing it (:mod:`dpsub_dist.methods.tables`), so building the CLI's parser imports no
    NumPy, SciPy or Dask. Looked up at each call: a patched ``module.name`` is the one called."""

    module: str
    name: str

    def resolve(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


def not_applicable(method: str, names: list[str], takers: list[str]) -> InputError:
    """The one refusal of options (``names``, as the door names them) given to a method they
    do not apply to (exit 2); ``takers``: the methods that take them."""
    listed = "/".join(dict.fromkeys(names))
    return InputError(
        f"{listed} does not apply to --method {method}: drop it for --method {method} "
        f"(it applies to --method {'/'.join(dict.fromkeys(takers))})"
    )


def unset_defaults(params: tuple[Param, ...], config: Any) -> dict[str, Any]:
    """The table's defaults for the options ``config`` leaves unset, by config attribute."""
    return {
        p.field: p.default
        for p in params
        if p.default is not None and getattr(config, p.field) is None
    }


@dataclass(frozen=True)
class Method:
    """One method: its table, its runner, and the cross-parameter checks its table cannot say.

    ``run(config, open_dataset, client, progress, noise_seed)`` runs it end to end (its driver,
    in the method's own module); a stream's ``run(path, config)``
    creates the stream, whose appends then run its plan. A method that is a choice between
    others (auto) has ``choose(config, dataset)`` in place of a runner: from public facts
    only, the :class:`Choice` the job layer runs as if it were requested
    (:func:`dpsub_dist.job.run_estimate`). ``plan(config, dataset)`` is its
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
    run: Callable[..., Any] | None
    plan: Callable[[Any, Dataset | None], Shares]
    check: Callable[[Any], None] | None = None
    row_level_only: str = ""
    choose: Callable[[Any, Dataset], Choice] | None = None

    def defaults(self, config: Any) -> dict[str, Any]:
        """Its table's defaults for the options ``config`` leaves unset, by config attribute:
        the values the run uses (help texts print the same table)."""
        return unset_defaults(self.params, config)


@dataclass(frozen=True)
class Choice:
    """What a choosing method resolved to: the chosen ``method``, the ``config`` it runs with
    (the parsed budget goes with it) and ``note``, the manifest's ``method_choice``."""

    method: Method
    config: Any
    note: dict[str, str]


def from_options(plan: Callable[[Any], Shares]) -> Callable[[Any, Dataset | None], Shares]:
    """A :attr:`Method.plan` fixed by the options alone: the dataset's footers change nothing
    (``__wrapped__``: ``plan``)."""

    def fixed(config: Any, dataset: Dataset | None) -> Shares:
        return plan(config)

    fixed.__wrapped__ = plan  # type: ignore[attr-defined]
    return fixed


@dataclass(frozen=True)
class Modifier:
    """Parameters that wrap every method of a command (boosting): ``check`` as in Method."""

    name: str
    command: str
    params: tuple[Param, ...]
    check: Callable[[Any], None] | None = None

    def defaults(self, config: Any) -> dict[str, Any]:
        """Its table's defaults for the options ``config`` leaves unset, once the modifier is
        in use (its first parameter given); nothing otherwise."""
        in_use = getattr(config, self.params[0].field) is not None
        return unset_defaults(self.params, config) if in_use else {}
