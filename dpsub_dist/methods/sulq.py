"""``dpsub cluster --method sulq``: Gaussian k-plane iterations, one charge per iteration
(WWS15 §9 b; ALGORITHMS.md §9)."""

from typing import Any

from dpsub_dist.errors import InputError
from dpsub_dist.methods import _clustering as clustering
from dpsub_dist.methods.spec import Method, Param, from_options, positive

ITERATIONS = Param(
    "iterations",
    int,
    "k-plane iterations, each a Gaussian release",
    need="a positive integer",
    valid=positive,
    default=clustering.DEFAULT_ITERATIONS,
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
PRIVATE_NORM = Param(
    "private_norm",
    bool,
    "clip rows to a bound B chosen privately from the data (10%% of the budget, step "
    "norm_bound, B published) instead of scaling each row to length 1",
    need="true or false",
    default=False,
    example=True,
)
ROW_LEVEL = "its sensitivity is for replacing one row, with n public"


def check_sulq(config: Any) -> None:
    """One bound: a public --row-norm or a private one, not both."""
    if config.private_norm and config.row_norm is not None:
        raise InputError(
            "--private-norm chooses the row-norm bound privately: drop it or --row-norm"
        )


METHOD = Method(
    name="sulq",
    command="cluster",
    summary="Gaussian (SuLQ) k-plane iterations",
    params=(ITERATIONS, UNIT_ROW_NORM, PRIVATE_NORM),
    run=clustering.run_sulq,
    # its sulq branch: iteration_i, and norm_bound first if private
    plan=from_options(clustering.budget_shares),
    check=check_sulq,
    row_level_only=ROW_LEVEL,
)
