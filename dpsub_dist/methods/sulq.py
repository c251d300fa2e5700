"""``dpsub cluster --method sulq``: Gaussian k-plane iterations, one charge per iteration
(WWS15 §9 b; ALGORITHMS.md §9)."""

from dpsub_dist.estimators import clustering
from dpsub_dist.methods.spec import Method, Param, positive

ITERATIONS = Param(
    "iterations",
    int,
    f"k-plane iterations, each a Gaussian release (default {clustering.DEFAULT_ITERATIONS})",
    need="a positive integer",
    valid=positive,
    example=4,
)
UNIT_ROW_NORM = Param(
    "row_norm",
    float,
    "clip rows to this public norm, then divide by it (default: scale each row to length 1)",
    need="a positive finite number",
    fix="e.g. 10",
    valid=positive,
    example=10.0,
)
ROW_LEVEL = "its sensitivity is for replacing one row, with n public"

METHOD = Method(
    name="sulq",
    command="cluster",
    summary="Gaussian (SuLQ) k-plane iterations",
    params=(ITERATIONS, UNIT_ROW_NORM),
    run=clustering.run_sulq,
    plan=clustering.budget_shares,
    row_level_only=ROW_LEVEL,
)
