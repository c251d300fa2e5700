"""What every method's driver half shares: the budget plan, opening the dataset, the public
seed, the manifest and the result. Depends on the engine and privacy layers only; the
configs (:mod:`dpsub_dist.methods.config`) are read by attribute, never imported.
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpsub_dist._version import __version__
from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.sources import Dataset
from dpsub_dist.errors import DataError, InputError
from dpsub_dist.estimators import auto
from dpsub_dist.privacy.accountant import Accountant, Budget
from dpsub_dist.privacy.noise import new_noise_seed

SHUFFLE_BUCKET_BYTES = 256 * 2**20


@dataclass
class EstimateResult:
    """What a run produced: the basis (None for ⊥), the manifest describing it (published)
    and the wall-clock timings of its steps (operator-only: they depend on the data)."""

    basis: np.ndarray | None
    manifest: dict[str, Any]
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        return self.manifest["outcome"]


def plan(
    config: Any, shares: dict[str, tuple[float, float]]
) -> tuple[Accountant, dict[str, Budget]]:
    """The run's accountant (its total parsed here, once) and each step's grant; the whole
    plan is checked affordable before any data is read."""
    accountant = Accountant(config.budget())
    grants = accountant.split(shares)
    if not accountant.can_afford(grants):
        raise InputError("the budget plan exceeds the budget: this is a bug, please report it")
    return accountant, grants


def privacy_unit(config: Any) -> dict[str, str]:
    """The privacy unit and neighbour relation every constant was calibrated for."""
    if config.unit_column:
        return {
            "unit": f"user (all rows with the same {config.unit_column})",
            "neighbours": "add or remove all rows of one user",
            "assignment": "keyed hash of (public seed, user id) mod t",
        }
    how = {
        "random": "keyed hash of (public seed, global row position) mod t",
        "contiguous": "consecutive blocks of rows in file order",
    }
    return {
        "unit": "row",
        "neighbours": "replace one row's values (n is public)",
        "assignment": how[getattr(config, "assign", "random")],
    }


def choose_buckets(n_rows: int, dim: int, subsets: int, executor: Executor) -> int:
    """Enough shuffle buckets that each holds ≲256 MiB and every worker has work."""
    by_size = math.ceil(n_rows * dim * 8 / SHUFFLE_BUCKET_BYTES)
    return int(min(subsets, max(2 * executor.workers, by_size, 1)))


def progress_shown(config: Any, progress: bool) -> bool:
    """Whether to draw the progress bar: at row level only. It counts tasks (one or more per
    partition, and partitions follow the footers' row counts) and seconds (proportional to
    n), and a scheduler forwards stderr: at user level both would publish a function of the
    private row count."""
    return progress and config.unit_column is None


def open_checked(config: Any, open_dataset, executor: Executor) -> Dataset:
    """Open the dataset (footers, and a variable list's first row, read where ``executor``
    runs tasks), refuse what auto cannot choose from the schema (first: a public cause), then
    check the rank against the width: bad input where the width is the schema's; where a row
    gave it, data that did not pass validation (published as such and charged, as every
    failure that depends on a row is)."""
    dataset: Dataset = open_dataset(executor)
    if config.method == "auto":  # boosted auto opens here too, before its groups
        auto.check_schema_width(dataset.widths_from_rows)
    if config.rank >= dataset.dim:
        raise width_failure(
            dataset,
            f"--rank {config.rank} must be smaller than the number of features ({dataset.dim}): "
            "lower --rank or add columns",
        )
    return dataset


def width_failure(dataset: Dataset, message: str) -> InputError:
    """A check against ``dataset.dim`` that failed: bad input (exit 2, free) where every width
    is the schema's; where a variable list's width came from a row, data that did not pass
    validation (:class:`DataError`: published as such and charged; ``message`` only in the
    operator's diagnostics)."""
    if not dataset.widths_from_rows:
        return InputError(message)
    return DataError(
        f"{message} (list column(s) {', '.join(dataset.widths_from_rows)} have the width of "
        "their first row; store them as fixed_size_list to have it checked before any budget "
        "is spent)"
    )


def public_seed(config: Any) -> int:
    """The user's public seed, or a fresh one that the manifest will record."""
    return config.seed if config.seed is not None else new_noise_seed() % 2**63


def build_manifest(
    config: Any,
    dataset: Dataset,
    accountant: Accountant,
    ok: bool,
    parameters: dict[str, Any],
    release: dict[str, Any],
    gathered_bytes: int,
) -> dict[str, Any]:
    """The manifest every method writes: input, parameters, privacy, outcome, versions.

    Wall-clock timings are never published (they depend on the data: on n at user level,
    on the data's rank and spread everywhere); they stay in :attr:`EstimateResult.timings`.
    At user level the row count is private, so nothing computed from it is published: not
    n, nor ``partitions`` (from the footers' row counts) or ``shuffle_buckets`` (from n·d);
    ``withheld`` names them.
    """
    user_level = config.unit_column is not None
    if user_level:
        parameters = {k: v for k, v in parameters.items() if k not in USER_LEVEL_WITHHELD}
    manifest = {
        "outcome": "ok" if ok else "no_stable_subspace",
        "input": dataset.input,
        "files": dataset.files,
        "columns": dataset.columns,
        "columns_left_out": dataset.left_out,
        "vector_columns": dataset.vector_columns,
        "n_rows": None if user_level else dataset.n_rows,
        "n_rows_note": "not released: row counts are private at user level"
        if user_level
        else "counted from the Parquet footers; public under replace-one neighbours",
        "dim": dataset.dim,
        "rank": config.rank,
        "method": config.method,
        "parameters": {"unit_column": config.unit_column, **parameters},
        "release": release,
        "privacy": {**privacy_unit(config), "budget": accountant.report()},
        "summary_bytes_gathered": gathered_bytes,
        "versions": versions(),
    }
    if user_level:
        manifest["withheld"] = {
            "fields": ["n_rows", *USER_LEVEL_WITHHELD],
            "reason": "functions of the row count, which is private at user level",
        }
    return manifest


USER_LEVEL_WITHHELD = ("partitions", "shuffle_buckets")
"""Parameters that follow the row count (footers, n·d): left out of user-level manifests."""


def versions() -> dict[str, str]:
    """Versions of this package and the libraries that shape its results."""
    import dask
    import pyarrow
    import scipy

    return {
        "dpsub_dist": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "dask": dask.__version__,
        "pyarrow": pyarrow.__version__,
    }
