"""``--method power``: the private noisy power method on the workers, nothing D×D anywhere
(Hardt & Price 2014; :mod:`dpsub_dist.privacy.power`, docs/power.md)."""

from dpsub_dist.estimators import power
from dpsub_dist.methods._centring import CENTRING_PARAMS
from dpsub_dist.methods.gauss import check_covariance
from dpsub_dist.methods.spec import Method, Param, from_options
from dpsub_dist.privacy.power import DEFAULT_ITERATIONS, DEFAULT_OVERSAMPLE

ITERATIONS = Param(
    "iterations",
    int,
    "power-iteration passes over the rows, one noisy release each",
    need="an integer ≥ 1",
    valid=lambda t: t >= 1,
    default=DEFAULT_ITERATIONS,
    example=3,
    metavar="PASSES",
)
OVERSAMPLE = Param(
    "oversample",
    int,
    "k′ − k, extra columns of the iterate",
    need="an integer ≥ 0",
    valid=lambda extra: extra >= 0,
    default=DEFAULT_OVERSAMPLE,
    example=4,
)

METHOD = Method(
    name="power",
    command="estimate",
    summary="noisy power method on the workers (wide data without a gap, nothing D×D)",
    params=(ITERATIONS, OVERSAMPLE, *CENTRING_PARAMS),
    run=power.run_power,
    plan=from_options(power.plan_shares),
    check=check_covariance,
)
