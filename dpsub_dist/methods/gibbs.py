"""``dpsub cluster --method gibbs``: the exponential-mechanism Gibbs sampler for small inputs
(WWS15 §9 c). A finite chain has no DP guarantee: nothing is charged, and job files refuse it.
"""

from dpsub_dist.methods import _clustering as clustering
from dpsub_dist.methods.spec import Method, Param, from_options, positive
from dpsub_dist.methods.sulq import ROW_LEVEL, UNIT_ROW_NORM

SWEEPS = Param(
    "sweeps",
    int,
    "sampler sweeps",
    need="a positive integer",
    valid=positive,
    default=clustering.DEFAULT_SWEEPS,
    example=20,
)

METHOD = Method(
    name="gibbs",
    command="cluster",
    summary="Gibbs sampler of the exponential mechanism (small inputs, no DP guarantee)",
    params=(SWEEPS, UNIT_ROW_NORM),
    run=clustering.run_gibbs,
    plan=from_options(clustering.budget_shares),
    row_level_only=ROW_LEVEL,
)
