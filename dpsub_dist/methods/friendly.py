"""``--method friendly``: sample and aggregate with the friendly-core aggregator
(ALGORITHMS.md §1–§3)."""

from dpsub_dist.methods._centring import CENTRING_PARAMS
from dpsub_dist.methods._sample_aggregate import (
    PLAN_PARAMS,
    check_estimate,
    estimate_plan,
    run_sample_aggregate,
)
from dpsub_dist.methods.spec import Method, Param, from_options, positive

RADIUS = Param(
    "radius",
    float,
    "public friendly radius (skips its private search)",
    need="> 0",
    fix="a public radius; omit it to have it chosen privately",
    valid=positive,
    attr="scale",
    example=0.3,
)

METHOD = Method(
    name="friendly",
    command="estimate",
    summary="sample and aggregate, friendly-core aggregator",
    params=(*PLAN_PARAMS, RADIUS, *CENTRING_PARAMS),
    run=run_sample_aggregate,
    plan=from_options(estimate_plan),
    check=check_estimate,
)
