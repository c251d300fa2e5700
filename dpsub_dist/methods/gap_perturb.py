"""``--method gap-perturb``: subspace perturbation with a noisy eigengap (DTTZ14 Alg. 2;
ALGORITHMS.md §7). Budget plan: :func:`dpsub_dist.methods.gauss.plan_shares`."""

from dpsub_dist.methods import gauss as cov
from dpsub_dist.methods.gauss import COVARIANCE_PARAMS, check_covariance
from dpsub_dist.methods.spec import Method

METHOD = Method(
    name="gap-perturb",
    command="estimate",
    summary="covariance perturbation with a noisy eigengap",
    params=COVARIANCE_PARAMS,
    run=cov.run_covariance,
    plan=cov.plan_shares,
    check=check_covariance,
)
