"""Run contexts for tests that call one step of a driver directly, without a run around it."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpsub_dist.context import RunContext
from dpsub_dist.engine.compute import IN_PROCESS
from dpsub_dist.engine.sources import Dataset, array_dataset
from dpsub_dist.job import EstimateConfig

NO_ROWS = array_dataset(np.zeros((2, 2)))
"""The default dataset: two zero rows (the steps these tests call read none)."""


def planned(
    shares: dict[str, tuple[float, float]],
    noise_seed: int,
    dataset: Dataset | None = None,
    **budget: Any,
) -> RunContext:
    """A context that declared ``shares`` of the total ``budget`` (``epsilon``/``delta`` or
    ``rho``/``delta``, as a run is given them), with its private generator from
    ``noise_seed``, over ``dataset`` (default :data:`NO_ROWS`)."""
    config = EstimateConfig(rank=1, method="gauss", **budget)
    dataset = NO_ROWS if dataset is None else dataset
    ctx = RunContext(config, dataset, IN_PROCESS, False, noise_seed)
    ctx.plan(shares)
    return ctx
