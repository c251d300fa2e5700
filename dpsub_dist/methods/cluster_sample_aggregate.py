"""``dpsub cluster --method sample-aggregate`` (default): k-plane on each subset, the K bases'
projected reference points aggregated privately (WWS15 §9 a; ALGORITHMS.md §9)."""

from typing import Any

from dpsub_dist.methods import _clustering as clustering
from dpsub_dist.methods._sample_aggregate import PLAN_PARAMS, check_plan
from dpsub_dist.methods.spec import Method, Param, from_options, positive

AGGREGATOR = Param(
    "aggregator",
    str,
    "the private aggregator: friendly (default) or histogram",
    default="friendly",
    choices=("friendly", "histogram"),
    example="histogram",
)
SCALE = Param(
    "scale",
    float,
    "public friendly radius or histogram cell side (skips its private search)",
    need="> 0",
    fix="a public radius or cell side; omit it to have it chosen privately",
    valid=positive,
    example=0.3,
)


def check(config: Any) -> None:
    check_plan(config)


METHOD = Method(
    name="sample-aggregate",
    command="cluster",
    summary="sample and aggregate of local k-plane clusterings (default)",
    params=(AGGREGATOR, *PLAN_PARAMS, SCALE),
    run=clustering.run_sample_aggregate,
    plan=from_options(clustering.budget_shares),
    check=check,
)
