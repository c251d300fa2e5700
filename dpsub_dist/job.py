"""The generic runner: validate → dispatch through the method registry → result. Auto's choice
and boosting's groups are resolved here, above the method runners, which draw the noise.

Every check that can fail on parameters runs before any data is read (:func:`validate`: the
run-level table of :mod:`dpsub_dist.params`, then the method tables of
:mod:`dpsub_dist.methods`), and each method's whole budget plan is checked before the first
footer is opened. The import graph points one way: this runner → :mod:`dpsub_dist.methods` →
:mod:`dpsub_dist.context` → {privacy, engine} → :mod:`dpsub_dist.params` (the configs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dpsub_dist.context import (
    EstimateResult,
    RunContext,
    open_checked,
    plan,
    progress_shown,
    versions,
)
from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.sources import Dataset
from dpsub_dist.methods import MODIFIERS, REGISTRY, boost, check_config, method_named
from dpsub_dist.methods._centring import resolve_center
from dpsub_dist.methods._standardize import check as standardize_check
from dpsub_dist.methods.spec import Method
from dpsub_dist.params import ClusterConfig, EstimateConfig, RunConfig, StreamConfig
from dpsub_dist.privacy.accountant import Accountant, Budget

__all__ = [
    "CLUSTER_METHODS",
    "METHODS",
    "ClusterConfig",
    "EstimateConfig",
    "EstimateResult",
    "StreamConfig",
    "init_stream",
    "run_cluster",
    "run_estimate",
    "validate",
    "versions",
]

METHODS = REGISTRY["estimate"]
"""Estimation methods by name (:mod:`dpsub_dist.methods` declares them)."""
CLUSTER_METHODS = tuple(REGISTRY["cluster"])
"""Clustering methods by name."""


def validate(config: RunConfig) -> None:
    """Every check of a config that needs no data: the run-level table (rank, clusters, the
    columns…), the method's table and cross-checks, then the budget, parsed once here."""
    config.check_run()
    check_config(config, config.command)
    standardize_check(config)
    config.budget()


def plan_budget(
    config: EstimateConfig | ClusterConfig, dataset: Dataset | None = None
) -> tuple[Accountant, dict[str, Budget]]:
    """The run's accountant and each step's grant, from its method's declared plan: the plan
    its run declares on ``dataset`` (opened: its footers; None: before any is open, for a plan
    the footers do not change)."""
    if isinstance(config, ClusterConfig):
        return plan(config, method_named("cluster", config.method).plan(config, dataset))
    config = with_defaults(config)
    return plan(config, method_named("estimate", config.method).plan(config, dataset))


def with_defaults(config: EstimateConfig) -> EstimateConfig:
    """``config`` with its method table's defaults and those that depend on other options
    (centring) filled in; the parsed budget is a field, so it goes with it."""
    defaults = method_named("estimate", config.method).defaults(config)
    for modifier in MODIFIERS["estimate"]:
        defaults.update(modifier.defaults(config))
    return replace(config, center=resolve_center(config), **defaults)


def run_estimate(
    config: EstimateConfig,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None = None,
    progress: bool = False,
    noise_seed: int | None = None,
) -> EstimateResult:
    """Run ``config.method`` end to end; ``open_dataset(client)`` returns the Dataset.

    ``noise_seed`` is a *private* seed from a run record (ledger) for reproducible
    resumption; without it DP noise comes from OS entropy.
    """
    validate(config)
    config = with_defaults(config)
    progress = progress_shown(config, progress)
    method = method_named("estimate", config.method)
    if config.boost is not None:
        return run_boosted(config, method, open_dataset, client, progress, noise_seed)
    if method.choose is None:
        return method.run(config, open_dataset, client, progress, noise_seed)
    dataset = open_checked(config, open_dataset, Executor(client))  # the choice reads D
    choice = method.choose(config, dataset)
    result = choice.method.run(choice.config, lambda _client: dataset, client, progress, noise_seed)
    result.manifest["method_choice"] = choice.note
    return result


def run_boosted(
    config: EstimateConfig,
    method: Method,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None,
    progress: bool,
    noise_seed: int | None,
) -> EstimateResult:
    """``--boost B`` around ``method`` (SS21 Alg. 3, :mod:`dpsub_dist.methods.boost`): its
    runner on each disjoint group with the whole budget, as an ordinary run (a choosing
    method chosen once, from the width D every group shares), then each step charged once
    for all groups in parallel and the stable estimate selected."""
    ctx = RunContext.open(config, open_dataset, client, progress, noise_seed)
    inner, parts = boost.disjoint_groups(config, ctx.dataset)
    choice = None if method.choose is None else method.choose(inner, ctx.dataset)
    if choice is not None:
        method, inner = choice.method, choice.config
    results = [
        method.run(
            inner, lambda _c, d=part: d, client, progress, boost.group_noise_seed(noise_seed, g)
        )
        for g, part in enumerate(parts)
    ]
    result = boost.boosted_result(ctx, inner.seed, results)
    if choice is not None:  # as an unboosted auto run publishes it
        result.manifest.update(method=choice.method.name, method_choice=choice.note)
    return result


def run_cluster(
    config: ClusterConfig,
    open_dataset: Callable[[Any], Dataset],
    client: Any | None = None,
    progress: bool = False,
    noise_seed: int | None = None,
) -> EstimateResult:
    """Run the clustering ``config.method`` end to end; the basis is K×d×q (None for ⊥)."""
    validate(config)
    method = method_named("cluster", config.method)
    config = replace(config, **method.defaults(config))
    shares = method.plan(config, None)
    from dpsub_dist.methods._clustering import run_clustering  # SciPy's optimizer: cluster only

    return run_clustering(config, method.run, shares, open_dataset, client, progress, noise_seed)


def init_stream(path: str, config: StreamConfig) -> Any:
    """Create a stream at ``path`` (``dpsub stream init``): the config is checked against the
    stream method's table first (InputError, exit 2, nothing made or charged), then its
    runner creates the stream files for the whole horizon's budget
    (:func:`dpsub_dist.methods.stream.init_stream`); returns its settings."""
    validate(config)
    return method_named("stream", config.method).run(path, config)
