"""``--method exact``: SS21 Algorithm 1 (GAP-MAX) for small inputs (ALGORITHMS.md §5); the
whole budget goes to its one release (:data:`dpsub_dist.estimators.exact.BUDGET_SHARES`)."""

from dpsub_dist.estimators import exact
from dpsub_dist.methods.spec import Method, Param

OUTLIERS = Param(
    "outliers",
    int,
    "ℓ, outliers the NULL score tolerates",
    need="an integer ≥ 0",
    fix="e.g. 2",
    valid=lambda value: value >= 0,
    default=0,
    example=2,
)
TOLERANCE = Param(
    "tolerance",
    float,
    "relative membership tolerance",
    need="a relative distance in [1e-12, 0.1]",
    fix=f"the default is {exact.DEFAULT_TOLERANCE}",
    valid=lambda value: 1e-12 <= value <= 0.1,
    default=exact.DEFAULT_TOLERANCE,
    example=1e-6,
)

METHOD = Method(
    name="exact",
    command="estimate",
    summary="SS21 GAP-MAX, small inputs only",
    params=(OUTLIERS, TOLERANCE),
    run=exact.run_exact,
    plan=lambda config, dataset: exact.BUDGET_SHARES,
    row_level_only=f"it needs a public row count; at scale use {exact.SCALE_ROUTE}",
)
