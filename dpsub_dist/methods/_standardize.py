"""``--standardize``: the run's first three steps release every column's private location and
scale (:mod:`dpsub_dist.privacy.column_scales`: steps ``standardize_histogram``,
``standardize_moments`` and ``standardize_refine``; released by
:func:`dpsub_dist.methods._centring.standardize`, beside the private mean it replaces), and the
method then reads ``(x − μ̂)/σ̂`` (computed on the workers) instead of ``x``: its basis is the
private PCA of the correlation matrix. This module declares it: its plan, its refusals, its
loader.

Its own private mean is then skipped, not declared: the standardised rows are already centred
at the released location, and a second mean would spend a share on a vector that is 0 up to
the location's noise. Row level only (the location needs the public row count; exit 2 with
``--unit-column``); ``exact`` (a subspace through the origin) and boosting refuse it.

Budget: :data:`SHARES` of the run's ε (or ρ) and δ, declared ahead of the method's own steps,
which are scaled to the rest (:func:`with_standardize`): public facts only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dpsub_dist.engine.sources import load_native
from dpsub_dist.errors import InputError
from dpsub_dist.methods.steps import Step
from dpsub_dist.privacy.column_scales import standardise

ROUNDS = (Step.STANDARDIZE_MOMENTS, Step.STANDARDIZE_REFINE)
"""The moments steps, each around the previous one's centre and spread (CoinPress rounds)."""
SHARES = {
    Step.STANDARDIZE_HISTOGRAM: (0.06, 0.06),
    Step.STANDARDIZE_MOMENTS: (0.03, 0.03),
    Step.STANDARDIZE_REFINE: (0.11, 0.11),
}
"""(ε or ρ share, δ share) of the three steps (20 % together, the share the default run gives
its private mean, which this replaces); δ shares are 0 under zCDP. The histogram is the only
step that finds where a column's rows lie (the rounds only refine around it), and the last
round's noise is what the released scale keeps: they take the largest shares."""

REFUSED_METHODS = {
    "exact": "it finds a subspace through the origin of the raw rows",
}


def check(config: Any) -> None:
    """Public refusals of ``--standardize`` (exit 2, nothing read or spent)."""
    if not getattr(config, "standardize", False):
        return
    if config.unit_column is not None:
        raise InputError(
            "--standardize is row level only: the private location needs the public row "
            "count, which is private at user level; drop --standardize or --unit-column"
        )
    if config.method in REFUSED_METHODS:
        raise InputError(
            f"--standardize does not apply to --method {config.method} "
            f"({REFUSED_METHODS[config.method]}): drop --standardize or pick another method"
        )
    if config.boost is not None:
        raise InputError("--standardize does not combine with --boost: drop one of them")
    if config.center is not None:
        raise InputError(
            "--standardize centres the rows at their private location itself: leave --center unset"
        )


def with_standardize(shares: dict[str, tuple[float, float]], config: Any):
    """``shares`` (a method's plan) with the two standardisation steps first and the rest
    scaled to make room, when ``config.standardize``; else ``shares`` unchanged."""
    if not getattr(config, "standardize", False):
        return shares
    zcdp = config.rho is not None
    steps = {name: (p, 0.0 if zcdp else q) for name, (p, q) in SHARES.items()}
    rest_p = 1.0 - sum(p for p, _ in steps.values())
    rest_q = 1.0 - sum(q for _, q in steps.values())
    return {**steps, **{name: (p * rest_p, q * rest_q) for name, (p, q) in shares.items()}}


@dataclass(frozen=True)
class StandardisedLoader:
    """The dataset's loader, with every row mapped to ``(x − location)/scale`` clipped to
    ±:data:`~dpsub_dist.privacy.column_scales.BOUND` (on a worker; finite for every finite x)."""

    loader: Any
    location: np.ndarray
    scale: np.ndarray
    OWNS_ROWS: ClassVar[bool] = True
    """Each call returns a new float64 array (:func:`~dpsub_dist.engine.sources.owns_rows`)."""

    def __call__(self, part: Any) -> tuple[np.ndarray, Any]:
        rows, units = self.loader(part)
        return standardise(np.asarray(rows, dtype=np.float64), self.location, self.scale), units

    def native(self, part: Any) -> tuple[np.ndarray, Any]:
        """The standardised rows in the source's precision, a new array."""
        standardised, _, units = self.native_with_source(part)
        return standardised, units

    def native_with_source(self, part: Any) -> tuple[np.ndarray, np.ndarray, Any]:
        """:meth:`native`'s rows and the source rows they came from, from one read."""
        rows, units = load_native(self.loader, part)
        return standardise(rows, self.location, self.scale), rows, units
