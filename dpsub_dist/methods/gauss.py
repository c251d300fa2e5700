"""``--method gauss``: Analyze Gauss, covariance perturbation (DTTZ14 Alg. 1; ALGORITHMS.md §7).
Budget plan: :func:`dpsub_dist.estimators.covariance.plan_shares` (the options and the dataset's
footers pick the route; the run declares that plan)."""

from typing import Any

from dpsub_dist.errors import InputError
from dpsub_dist.estimators import covariance as cov
from dpsub_dist.methods._centring import CENTRING_PARAMS
from dpsub_dist.methods.spec import Method

COVARIANCE_PARAMS = CENTRING_PARAMS


def check_covariance(config: Any) -> None:
    """Centring needs the public row count (user level has none)."""
    if config.center and config.unit_column:
        raise InputError(
            "--center is row level only: the private mean needs the public row count, which "
            "user level does not have; drop --center or --unit-column"
        )


METHOD = Method(
    name="gauss",
    command="estimate",
    summary="covariance perturbation (Analyze Gauss)",
    params=COVARIANCE_PARAMS,
    run=cov.run_covariance,
    plan=cov.plan_shares,
    check=check_covariance,
)
