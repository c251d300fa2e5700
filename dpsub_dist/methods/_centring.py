"""The options of the private row-norm bound and private centring, shared by every method whose
estimate is meant to be PCA (friendly, histogram, gauss, gap-perturb, auto): one declaration."""

from dpsub_dist.methods.spec import Param, positive

ROW_NORM = Param(
    "row_norm",
    float,
    "public bound B, longer rows are scaled down to B (gauss/gap-perturb, and the private "
    "mean when centring; default: chosen privately with a small share of the budget)",
    need="a positive finite number",
    fix="e.g. 10",
    valid=positive,
    example=10.0,
)
CENTER = Param(
    "center",
    bool,
    "subtract a private mean first (default: on at row level for friendly, histogram, gauss, "
    "gap-perturb, auto and streams, whose mean is the first batch's; --no-center estimates "
    "the uncentred subspace)",
    need="true or false",
    example=True,
)
CENTRING_PARAMS = (ROW_NORM, CENTER)
