"""``--method auto``: the estimator chosen from public facts only (the rule and its measurements:
:mod:`dpsub_dist.methods.auto`, docs/auto.md), then run with the whole budget. Auto is a
choice, not a runner (:func:`resolve`): the job layer runs the chosen method as if requested.

The rule reads the parameters the user gave and the width D from the Parquet schema (public at
both privacy units), nothing else: not the rows, not n at user level, and no private statistic.
A variable ``list`` column has its width in its rows only, so auto refuses it (exit 2, from
the schema, before any row is read): store it as ``fixed_size_list`` or name the method.
So the choice is a function of public values, the chosen method then spends the whole budget,
and the run is exactly as private as that method (the choice itself costs nothing).

Rule, in order (measured in docs/auto.md):

1. options that only sample and aggregate understands (``--subsets``, ``--ref-points``,
   ``--radius``/``--cell-side``, ``--assign contiguous``) → ``friendly``: the user asked for it;
2. the driver's D×D matrices above :data:`DRIVER_BYTES` → ``power`` (the noisy power method:
   only D×k' matrices anywhere; measured more accurate than friendly on both a gap model and
   a polynomial spectrum where gauss is out, docs/auto.md);
3. otherwise ``gauss`` (Analyze Gauss, private row-norm bound unless ``--row-norm``, centred by
   default at row level): 2.5–23× more accurate than friendly wherever both were measured, and it
   never returns ⊥.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from dpsub_dist.methods.spec import Choice, Method, not_applicable
from dpsub_dist.methods.tables import AUTO as METHOD
from dpsub_dist.methods.tables import FRIENDLY, GAUSS_METHOD, POWER

if TYPE_CHECKING:
    from dpsub_dist.engine.sources import Dataset
    from dpsub_dist.params import EstimateConfig

DRIVER_BYTES = 2 * 2**30
"""Public memory budget for gauss on the driver: the D×D Gram, its noisy copy and the eigen
solver's workspace, about three D×D float64 matrices (D ≤ 9,459 at 2 GiB)."""

GAUSS_COPIES = 3
"""D×D float64 matrices gauss holds at once on the driver (Gram, noisy Gram, eigh workspace)."""


def gauss_fits(dim: int) -> bool:
    """Whether gauss's D×D matrices fit :data:`DRIVER_BYTES` (a public fact: D is public)."""
    return GAUSS_COPIES * 8 * dim * dim <= DRIVER_BYTES


INPUTS = (
    "the options given and D from the Parquet schema (scalar columns and fixed_size_list "
    "widths): no row, no private statistic"
)
"""What the choice read, as the manifest's ``method_choice`` says."""


def choose(config: EstimateConfig, dim: int) -> tuple[str, str]:
    """The method and why, from the user's parameters and the width D from the schema only."""
    given = [
        flag
        for flag, value in (
            ("--subsets", config.subsets),
            ("--ref-points", config.ref_points),
            ("--radius/--cell-side", config.scale),
        )
        if value is not None
    ]
    if config.assign != "random":
        given.append("--assign")
    if given:
        return "friendly", f"{', '.join(given)} given: options of sample and aggregate"
    if not gauss_fits(dim):
        return "power", (
            f"D = {dim}: gauss's {GAUSS_COPIES} D×D matrices exceed the driver budget of "
            f"{DRIVER_BYTES / 2**30:g} GiB; the noisy power method holds only D×k' matrices and "
            "was measured more accurate than friendly there, with or without an eigengap"
        )
    return "gauss", (
        f"D = {dim}: gauss's D×D matrices fit the driver; measured more accurate than friendly "
        "at every D and n compared, and it never returns ⊥"
    )


CHOICES = {method.name: method for method in (FRIENDLY, GAUSS_METHOD, POWER)}
"""The methods the rule chooses between."""


def resolve(config: Any, dataset: Dataset) -> Choice:
    """The method the rule chooses on ``dataset`` (its width D from the schema), its config
    and the manifest's ``method_choice``. Auto runs nothing itself: the job layer opens the
    dataset, resolves and runs the chosen method as if it were requested
    (:func:`dpsub_dist.job.run_estimate`)."""
    name, reason = choose(config, dataset.dim)
    note = {"requested": "auto", "chosen": name, "reason": reason, "inputs": INPUTS}
    return Choice(CHOICES[name], chosen_config(config, CHOICES[name]), note)


def plan_shares(config: Any, dataset: Dataset | None) -> dict[str, tuple[float, float]]:
    """The chosen method's plan on ``dataset`` (auto spends nothing itself); before a dataset
    is open, D is unknown and so is the choice: no step yet."""
    if dataset is None:
        return {}
    method = CHOICES[choose(config, dataset.dim)[0]]
    return method.plan(chosen_config(config, method), dataset)


def chosen_config(config: Any, method: Method) -> Any:
    """``config`` for the chosen ``method`` (the parsed budget goes with it): auto's options
    must be the chosen method's too, refused as ``--method <chosen>`` refuses them; then the
    chosen method's cross-checks, and its table's defaults filled in."""
    taken = {p.field for p in method.params}
    empty = {f.name: f.default for f in dataclasses.fields(config)}
    given = [p for p in METHOD.params if getattr(config, p.field) != empty[p.field]]
    refused = [p for p in given if p.field not in taken]
    if refused:
        takers = [m.name for p in refused for m in (*CHOICES.values(), METHOD) if p in m.params]
        raise not_applicable(method.name, [p.flag for p in refused], takers)
    chosen = dataclasses.replace(config, method=method.name)
    if method.check is not None:
        method.check(chosen)
    return dataclasses.replace(chosen, **method.defaults(chosen))
