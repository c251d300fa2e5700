"""The configs of a run: :class:`EstimateConfig` (``dpsub estimate``, job files, the API),
:class:`ClusterConfig` (``dpsub cluster``) and :class:`StreamConfig` (``dpsub stream init``).
Their method options are checked against the method tables
(:func:`dpsub_dist.methods.check_config`), never field by field here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from dpsub_dist.errors import InputError
from dpsub_dist.methods import DEFAULTS, check_config
from dpsub_dist.privacy.accountant import Budget, parse_budget


class _Run:
    """What both configs share: the budget and the rank."""

    epsilon: float | None
    delta: float | None
    rho: float | None
    rank: int

    def budget(self) -> Budget:
        """The run's total budget, parsed once: at the first call (the edge, ``validate``)
        or handed in already parsed (:meth:`use_budget`), then the same value for the runner,
        the plan, boosting and the ledger. Parsed again only if epsilon/delta/rho change
        (an estimator's ``set_params``)."""
        key = (self.epsilon, self.delta, self.rho)
        parsed: tuple[tuple, Budget] | None = getattr(self, "_parsed_budget", None)
        if parsed is None or parsed[0] != key:
            try:
                parsed = (key, parse_budget(*key))
            except ValueError as err:
                raise InputError(str(err)) from None
            self._parsed_budget = parsed
        return parsed[1]

    def use_budget(self, budget: Budget) -> None:
        """Take the budget the edge already parsed from these epsilon/delta/rho (a job file)."""
        self._parsed_budget = ((self.epsilon, self.delta, self.rho), budget)

    def _check_rank(self) -> None:
        if not _positive_int(self.rank):
            raise InputError(f"rank must be a positive integer (got {self.rank}): pass --rank K")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= 1


@dataclass
class EstimateConfig(_Run):
    """Parameters of ``dpsub estimate`` / :class:`dpsub_dist.PrivateSubspace`; the method
    options (after ``seed``) are declared in the method modules of :mod:`dpsub_dist.methods`."""

    rank: int
    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None
    method: str = DEFAULTS["estimate"]
    subsets: int | None = None
    ref_points: int | None = None
    assign: Literal["random", "contiguous"] = "random"
    unit_column: str | None = None
    columns: list[str] | None = None
    exclude_columns: list[str] | None = None  # names or fnmatch patterns left out (public)
    seed: int | None = None
    scale: float | None = None  # friendly radius or histogram cell side, public
    row_norm: float | None = None
    center: bool | None = None  # private mean first; None: on where the estimate is PCA
    outliers: int | None = None
    tolerance: float | None = None
    boost: int | None = None
    boost_alpha: float | None = None
    iterations: int | None = None  # power: T, public
    oversample: int | None = None  # power: k′ − k, public
    storage_options: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Parameter checks that need no data."""
        self._check_rank()
        check_config(self, "estimate")
        self.budget()


@dataclass
class ClusterConfig(_Run):
    """Parameters of ``dpsub cluster``: ``rank`` is q, the dimension of each of the
    ``clusters`` subspaces; the method options are declared in :mod:`dpsub_dist.methods`."""

    clusters: int
    rank: int
    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None
    method: str = DEFAULTS["cluster"]
    aggregator: str = "friendly"
    subsets: int | None = None
    ref_points: int | None = None
    assign: Literal["random", "contiguous"] = "random"
    unit_column: str | None = None
    columns: list[str] | None = None
    seed: int | None = None
    scale: float | None = None
    iterations: int | None = None
    sweeps: int | None = None
    row_norm: float | None = None
    private_norm: bool = False
    storage_options: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Parameter checks that need no data."""
        self._check_rank()
        if not _positive_int(self.clusters):
            raise InputError(
                f"clusters must be a positive integer (got {self.clusters}): pass --clusters K"
            )
        check_config(self, "cluster")
        self.budget()


@dataclass
class StreamConfig(_Run):
    """Parameters of ``dpsub stream init`` / :func:`dpsub_dist.job.init_stream`: a stream of
    ``horizon`` batches and its whole budget; the method options (``horizon``, ``clip_norm``,
    ``center``) are declared in :mod:`dpsub_dist.methods.stream`. ``ledger`` and ``dataset``
    (together): charge the whole budget to the dataset's grant at init."""

    rank: int
    horizon: int | None = None
    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None
    method: str = DEFAULTS["stream"]
    clip_norm: float | None = None  # public row-norm bound; None: private, from batch 1
    center: bool | None = None  # private mean of batch 1 first; None: on
    columns: list[str] | None = None
    ledger: str | None = None
    dataset: str | None = None
    unit_column: str | None = None  # refused: streams are row level only

    def validate(self) -> None:
        """Parameter checks that need no data."""
        self._check_rank()
        check_config(self, "stream")
        self.budget()
