"""The names of the private steps a plan declares, a run charges and its manifest lists: one
home, so that a plan, its charge and its draw cannot disagree by a typo.

Members are ``str`` (:class:`enum.StrEnum`): manifests, ledgers and JSON keep the names they
always had, and a name read back from a manifest compares equal to its member. The clustering
methods' per-iteration steps (``iteration_1`` …) are numbered where they are planned
(:mod:`dpsub_dist.methods._clustering`); a stream's steps are its batches' tree nodes.
"""

from __future__ import annotations

from enum import StrEnum


class Step(StrEnum):
    """A private step's name."""

    # Centring and norm bounds (methods/_centring.py, gauss, power, the stream's first batch)
    NORM_BOUND = "norm_bound"
    MEAN = "mean"
    MEAN_NORM_BOUND = "mean_norm_bound"
    REFINED_MEAN = "refined_mean"
    CENTRED_NORM_BOUND = "centred_norm_bound"
    CENTRED_SUM = "centred_sum"
    VARIANCE_NORM_BOUND = "variance_norm_bound"
    EXPLAINED_VARIANCE = "explained_variance"
    # Standardisation (methods/_standardize.py)
    STANDARDIZE_HISTOGRAM = "standardize_histogram"
    STANDARDIZE_MOMENTS = "standardize_moments"
    STANDARDIZE_REFINE = "standardize_refine"
    # Covariance (gauss, gap-perturb) and power
    GRAM_NOISE = "gram_noise"
    GAP_TEST = "gap_test"
    PROJECTOR_NOISE = "projector_noise"
    POWER = "power"
    # Sample and aggregate (friendly, histogram)
    RADIUS_SEARCH = "radius_search"
    CORE_TEST = "core_test"
    CORE_NOISE = "core_noise"
    CELL_SEARCH = "cell_search"
    HISTOGRAM = "histogram"
    # exact
    GAP_MAX = "gap_max"
