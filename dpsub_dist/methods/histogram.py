"""``--method histogram``: sample and aggregate with the histogram aggregator (ALGORITHMS.md
§1, §2, §4)."""

from dpsub_dist.methods._centring import CENTRING_PARAMS
from dpsub_dist.methods._sample_aggregate import (
    PLAN_PARAMS,
    check_estimate,
    estimate_plan,
    run_sample_aggregate,
)
from dpsub_dist.methods.spec import Method, Param, from_options, positive

CELL_SIDE = Param(
    "cell_side",
    float,
    "public histogram cell side (skips its private search)",
    need="> 0",
    fix="a public cell side; omit it to have it chosen privately",
    valid=positive,
    attr="scale",
    example=0.3,
)

METHOD = Method(
    name="histogram",
    command="estimate",
    summary="sample and aggregate, histogram aggregator",
    params=(*PLAN_PARAMS, CELL_SIDE, *CENTRING_PARAMS),
    run=run_sample_aggregate,
    plan=from_options(estimate_plan),
    check=check_estimate,
)
