"""Every registered method has its privacy audits (issue #15): Clopper–Pearson audits on
neighbouring inputs, each catching a planted under-noised twin (tests/privacy_audit.py).

:data:`AUDITS` names, per method of the registry, the audit tests of the noisy steps it runs;
a method added to :data:`dpsub_dist.methods.REGISTRY` without an entry here fails
:func:`test_every_registered_method_names_its_audits`, and an entry naming a test that does
not exist fails :func:`test_every_named_audit_exists`. (The calibration and the noise ledger
of every registered method are checked by tests/privacy/test_noise_ledger.py.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dpsub_dist.methods import REGISTRY

TESTS = Path(__file__).parents[1]

NORM_BOUND = "privacy/test_norm_bound.py::test_audit_catches_an_under_noised_twin"
MEAN = "privacy/test_covariance_audit.py::test_gaussian_mean_audit_catches_half_noise"
VARIANCE = "methods/test_explained_variance.py::test_variance_audit_catches_half_noise"
CORE = "privacy/test_audit_core.py::test_audit_catches_planted_under_noising"  # friendly, histogram
GAUSS = "privacy/test_covariance_audit.py::test_analyze_gauss_audit_catches_half_noise"
CENTRED_SUM = "methods/test_sampled_centre.py::test_centred_sum_audit_catches_an_under_noised_twin"
CONSUMER = "privacy/test_consumer_audits.py::test_published_"  # whole runs, read from the manifest
PUBLISHED_MEAN = CONSUMER + "mean_audit_catches_an_eighth_of_the_noise"
PUBLISHED_VARIANCE = CONSUMER + "explained_variance_audit_catches_an_eighth_of_the_noise"
PUBLISHED_ROW_BOUND = CONSUMER + "row_bound_audit_catches_a_32nd_of_the_noise"
PUBLISHED_USER_BOUND = CONSUMER + "user_level_bound_audit_catches_a_32nd_of_the_noise"
STANDARDIZE = (  # --standardize's histogram and moments steps, ahead of any PCA method's
    CONSUMER + "standardize_histogram_audit_catches_an_eighth_of_the_noise",
    CONSUMER + "standardize_audit_catches_an_eighth_of_the_noise",
)

AUDITS: dict[str, tuple[str, ...]] = {
    "estimate friendly": (CORE, NORM_BOUND, MEAN, VARIANCE, PUBLISHED_VARIANCE, *STANDARDIZE),
    "estimate histogram": (CORE, NORM_BOUND, MEAN, VARIANCE, PUBLISHED_VARIANCE, *STANDARDIZE),
    "estimate gauss": (
        GAUSS,
        NORM_BOUND,
        MEAN,
        CENTRED_SUM,
        PUBLISHED_MEAN,
        PUBLISHED_ROW_BOUND,
        PUBLISHED_USER_BOUND,
        *STANDARDIZE,
    ),
    "estimate gap-perturb": (
        "privacy/test_covariance_audit.py::test_gap_perturbation_projector_audit_catches_half_noise",
        "privacy/test_covariance_audit.py::test_gap_perturbation_gap_test_audit_catches_half_laplace",
        NORM_BOUND,
        MEAN,
        VARIANCE,
        *STANDARDIZE,
    ),
    "estimate exact": (
        "methods/test_exact.py::test_gap_max_audit_catches_under_noised_twin",
        "methods/test_exact.py::test_snapped_release_audit_catches_the_unsnapped_twin",
    ),
    "estimate power": (
        "methods/test_power.py::test_one_iteration_audit_catches_half_noise",
        CONSUMER + "power_basis_audit_catches_a_16th_of_the_noise",
        NORM_BOUND,
        *STANDARDIZE,
    ),
    "estimate auto": (
        CORE,
        GAUSS,
        NORM_BOUND,
        MEAN,
        CENTRED_SUM,
        VARIANCE,
        *STANDARDIZE,
    ),  # runs friendly or gauss
    "cluster sample-aggregate": (CORE,),
    "cluster sulq": (
        "privacy/test_clustering_audit.py::test_one_sulq_iteration_audit_catches_half_noise",
        CONSUMER + "sulq_bound_audit_catches_a_32nd_of_the_noise",
    ),
    "cluster gibbs": (  # claims no DP guarantee; its target mechanism is audited
        "privacy/test_clustering_audit.py::test_exponential_mechanism_audit_catches_doubled_temperature",
    ),
    "stream online": (
        "methods/test_stream.py::test_audit_tree_noise_and_catch_an_under_noised_twin",
        "methods/test_stream.py::test_audit_the_first_releases_mean_and_catch_an_under_noised_twin",
        NORM_BOUND,
    ),
}
"""Registered method ("command name") → the audit tests of its noisy steps."""


def test_every_registered_method_names_its_audits() -> None:
    registered = {f"{command} {name}" for command, methods in REGISTRY.items() for name in methods}
    assert set(AUDITS) == registered, "add the new method's audits to AUDITS"


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("audit", sorted({a for audits in AUDITS.values() for a in audits}))
def test_every_named_audit_exists(audit: str) -> None:
    file, function = audit.split("::")
    assert function in _functions(TESTS / file), audit
    assert "audit" in function and ("catch" in function or "twin" in function), audit
