"""``--method auto``: the estimator chosen from public facts only (the rule and its measurements:
:mod:`dpsub_dist.estimators.auto`, docs/auto.md), then run with the whole budget."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dpsub_dist.context import EstimateResult, open_checked
from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.sources import Dataset
from dpsub_dist.estimators import auto as rule
from dpsub_dist.methods._centring import CENTRING_PARAMS
from dpsub_dist.methods._sample_aggregate import PLAN_PARAMS
from dpsub_dist.methods.friendly import METHOD as FRIENDLY
from dpsub_dist.methods.friendly import RADIUS
from dpsub_dist.methods.gauss import METHOD as GAUSS
from dpsub_dist.methods.power import METHOD as POWER
from dpsub_dist.methods.spec import Method, not_applicable

CHOICES = {method.name: method for method in (FRIENDLY, GAUSS, POWER)}
"""The methods the rule chooses between."""


def run_auto(
    config: Any,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None,
    progress: bool,
    noise_seed: int | None,
) -> EstimateResult:
    """Open the dataset, choose (public facts only), run the chosen method with the budget."""
    dataset = open_checked(config, open_dataset, Executor(client))  # D from the schema
    name, reason = rule.choose(config, dataset.dim)
    chosen = chosen_config(config, CHOICES[name])
    result = CHOICES[name].run(chosen, lambda _client: dataset, client, progress, noise_seed)
    result.manifest["method_choice"] = {
        "requested": "auto",
        "chosen": name,
        "reason": reason,
        "inputs": rule.INPUTS,
    }
    return result


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


METHOD = Method(
    name="auto",
    command="estimate",
    summary="the default: gauss, power or friendly, chosen from public facts (docs/auto.md)",
    params=(*PLAN_PARAMS, RADIUS, *CENTRING_PARAMS),
    run=run_auto,
    plan=lambda config, dataset: {},  # spends nothing itself: the chosen method's plan applies
)
