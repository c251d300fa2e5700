"""One run's context: the dataset, the executor, the budget plan, the private noise
generator and the manifest, and :meth:`RunContext.release`, the one place a private step is
charged and drawn.

A method's driver opens a :class:`RunContext` (:meth:`RunContext.open`), declares its plan
(:meth:`RunContext.plan`: every step's share, fixed from public facts before any row is
read), then runs each private step as ``ctx.release(step, mechanism, draw)``: the mechanism
calibrated to the step's grant is charged (:meth:`Accountant.charge` computes its cost from
its own noise parameters) and ``draw(mechanism, rng)`` — a pure function of
:mod:`dpsub_dist.privacy` — adds that same mechanism's noise. The charged object is the
drawing object by construction (OpenDP's measurement is both the function and its privacy
map; PipelineDP accounts the spec it draws with). The private generator is handed out only
inside ``release`` (or :meth:`RunContext.redraw`: a charged step drawn again on other rows;
:func:`active_release` tells the tests which step is drawing), and
:meth:`RunContext.result` checks that the charged steps are the declared ones.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from dpsub_dist._version import __version__
from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.sources import Dataset
from dpsub_dist.engine.subsets import SubsetPlan
from dpsub_dist.errors import DataError, InputError
from dpsub_dist.privacy.accountant import Accountant, Budget
from dpsub_dist.privacy.mechanism import Mechanism
from dpsub_dist.privacy.noise import new_noise_seed, noise_rng

SHUFFLE_BUCKET_BYTES = 256 * 2**20


@dataclass
class EstimateResult:
    """What a run produced: the basis (None for ⊥), the manifest describing it (published),
    the wall-clock timings of its steps (operator-only: they depend on the data) and the
    mechanism each step was charged with (not published: boosting composes its groups')."""

    basis: np.ndarray | None
    manifest: dict[str, Any]
    timings: dict[str, Any] = field(default_factory=dict)
    mechanisms: dict[str, Mechanism] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        return self.manifest["outcome"]


M = TypeVar("M", bound=Mechanism)
T = TypeVar("T")

_ACTIVE: ContextVar[tuple[str, Mechanism] | None] = ContextVar("active_release", default=None)


def active_release() -> tuple[str, Mechanism] | None:
    """The step and mechanism whose noise is being drawn now (None outside a release)."""
    return _ACTIVE.get()


class PlanMismatch(AssertionError):
    """The steps a run charged are not the steps it declared (an internal error)."""


class RunContext:
    """One run: ``config``, the opened ``dataset``, the ``executor`` its tasks run on, whether
    ``progress`` is drawn, the operator-only ``timings``; after :meth:`plan`, the
    ``accountant`` and each step's grant. The private generator is never an attribute a
    caller reads: it reaches privacy code only through :meth:`release`."""

    def __init__(
        self,
        config: Any,
        dataset: Dataset,
        executor: Executor,
        progress: bool,
        noise_seed: int | None,
        started: float | None = None,
    ) -> None:
        self.config = config
        self.dataset = dataset
        self.executor = executor
        self.progress = progress
        self.started = time.monotonic() if started is None else started
        self.timings: dict[str, Any] = {}
        self.shares: dict[str, tuple[float, float]] = {}
        self.grants: dict[str, Budget] = {}
        self.mechanisms: dict[str, Mechanism] = {}  # each charged step's, in charge order
        self.accountant: Accountant | None = None
        self._rng = noise_rng(noise_seed)
        self._forgone: list[str] = []
        self._skipped: list[str] = []
        self._earlier = 0  # the charges of earlier commands a resumed plan counts (resume)

    @classmethod
    def open(
        cls,
        config: Any,
        open_dataset: Callable[[Executor], Dataset],
        client: Any | None,
        progress: bool,
        noise_seed: int | None,
    ) -> RunContext:
        """Open the dataset (:func:`open_checked`: footers only) on ``client``'s executor."""
        started = time.monotonic()
        executor = Executor(client)
        dataset = open_checked(config, open_dataset, executor)
        ctx = cls(config, dataset, executor, progress, noise_seed, started)
        ctx.timings["inspect_s"] = time.monotonic() - started
        return ctx

    def plan(self, shares: dict[str, tuple[float, float]]) -> dict[str, Budget]:
        """Declare the run's plan (public facts only, before any row is read): each step's
        (share of ε or ρ, share of δ). Returns the grants; every later charge is held to them."""
        self.accountant, self.grants = plan(self.config, shares)
        self.shares = dict(shares)
        return self.grants

    def resume(
        self,
        accountant: Accountant,
        grants: dict[str, Budget],
        shares: dict[str, tuple[float, float]],
    ) -> None:
        """Continue a plan an earlier command declared (a stream's, at ``stream init``):
        ``accountant`` holds its ``grants`` and counts the steps earlier commands released;
        this command declares ``shares``, its part of the plan. :attr:`charged` then counts
        this command's charges only, and :meth:`check_charged` holds them to ``shares``."""
        self.accountant, self.grants, self.shares = accountant, grants, dict(shares)
        self._earlier = len(accountant.report()["steps"])

    def grant(self, step: str) -> Budget:
        """The grant the plan gives ``step`` (KeyError: not a declared step)."""
        return self.grants[step]

    def subset_plan(self, subsets: int) -> SubsetPlan:
        """How the run's units map to ``subsets`` subsets, from public facts: the public
        seed, the assignment, the unit, the footers' row count, the width and the cluster's
        size (the shuffle's buckets)."""
        n, config = self.dataset.n_rows, self.config
        return SubsetPlan(
            subsets=subsets,
            n_rows=n,
            seed=public_seed(config),
            assign=config.assign,
            user_level=config.unit_column is not None,
            buckets=choose_buckets(n, self.dataset.dim, subsets, self.executor),
        )

    def release(self, step: str, mechanism: M, draw: Callable[[M, np.random.Generator], T]) -> T:
        """Charge ``step`` with ``mechanism`` (refused if undeclared, charged twice or above its
        grant), then return ``draw(mechanism, rng)``: the noise of the object just charged."""
        self._charge(step, mechanism)
        return self._draw(step, mechanism, draw)

    def redraw(self, step: str, mechanism: M, draw: Callable[[M, np.random.Generator], T]) -> T:
        """Draw ``step``'s noise again, charging nothing, on rows none of its earlier draws
        read (parallel composition: a stream's tree level, one node per row). Refused unless
        the step was charged, by this command or an earlier one of the plan, at exactly
        ``mechanism``'s cost (a cost in the plan's mode, as a tree level's ρ)."""
        if self._accountant.stated.get(step) != mechanism.cost():
            raise PlanMismatch(f"step '{step}' is drawn again but was not charged so")
        return self._draw(step, mechanism, draw)

    def _draw(self, step: str, mechanism: M, draw: Callable[[M, np.random.Generator], T]) -> T:
        token = _ACTIVE.set((step, mechanism))
        try:
            return draw(mechanism, self._rng)
        finally:
            _ACTIVE.reset(token)

    def forgo(self, step: str, mechanism: Mechanism) -> None:
        """Charge ``step`` and draw nothing: a released value (a failed test) made it
        unnecessary, and its grant stays spent, as the declared plan reserved it."""
        self._charge(step, mechanism)
        self._forgone.append(step)

    def skip(self, step: str) -> None:
        """Leave the declared ``step`` uncharged, nothing drawn: a decision from public facts
        (n and ε too small for its bound's margin) dropped it; :meth:`result` counts it."""
        if step not in self.grants:
            raise PlanMismatch(f"step '{step}' is skipped but was not declared")
        self._skipped.append(step)

    def _charge(self, step: str, mechanism: Mechanism) -> None:
        self._accountant.charge(step, mechanism)
        self.mechanisms[step] = mechanism

    @property
    def _accountant(self) -> Accountant:
        if self.accountant is None:
            raise PlanMismatch("a step was released before the run declared its plan")
        return self.accountant

    @property
    def charged(self) -> list[str]:
        """The steps this command charged so far, in order."""
        return [entry["step"] for entry in self._accountant.report()["steps"]][self._earlier :]

    def check_charged(self) -> None:
        """Raise :class:`PlanMismatch` unless the declared steps are those charged and those
        skipped (:meth:`skip`)."""
        charged = self.charged
        if sorted(charged + self._skipped) != sorted(self.shares):
            raise PlanMismatch(
                f"declared steps {list(self.shares)} but charged {charged}"
                + (f" and skipped {self._skipped}" if self._skipped else "")
            )

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Record the wall-clock seconds of a block as ``timings[name]`` (operator-only)."""
        mark = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = time.monotonic() - mark

    def result(
        self,
        basis: np.ndarray | None,
        parameters: dict[str, Any],
        release: dict[str, Any],
        gathered_bytes: int,
    ) -> EstimateResult:
        """The run's result: its manifest (:func:`build_manifest`, with the declared plan as
        ``budget_shares``) and timings. A released basis needs every declared step charged or
        skipped (:meth:`skip`, :meth:`check_charged`); a ⊥ may stop early (its later steps'
        grants are reserved, not drawn)."""
        if basis is not None:
            self.check_charged()
        self.timings["total_s"] = time.monotonic() - self.started
        parameters = {**parameters, "budget_shares": self.shares}
        manifest = build_manifest(
            self.config,
            self.dataset,
            self._accountant,
            basis is not None,
            parameters,
            release,
            gathered_bytes,
        )
        return EstimateResult(basis, manifest, self.timings, dict(self.mechanisms))


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
        check_schema_width(dataset.widths_from_rows)
    if config.rank >= dataset.dim:
        raise width_failure(
            dataset,
            f"--rank {config.rank} must be smaller than the number of features ({dataset.dim}): "
            "lower --rank or add columns",
        )
    return dataset


def check_schema_width(widths_from_rows: Sequence[str]) -> None:
    """Refuse (exit 2) columns whose width, so D, only a row would tell (variable lists)."""
    if widths_from_rows:
        names = ", ".join(widths_from_rows)
        raise InputError(
            f"--method auto chooses from the width D in the Parquet schema, but list column(s) "
            f"{names} have their width in their rows only: store them as fixed_size_list "
            "(pyarrow: pa.list_(pa.float32(), D)) or pass --method gauss or --method power"
        )


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
