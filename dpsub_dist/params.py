"""The run's parameters, declared once, at the bottom of the package.

:class:`Param` is one public parameter: its type, its check, its help and its default. The
run-level table (:data:`RUN_PARAMS`: rank, the budget, the unit, the columns, the seed, the
storage options) is shared by every method of a command, as scikit-learn merges
``_parameter_constraints``; each method adds its own table (:mod:`dpsub_dist.methods`). The
doors are generated from these tables: the CLI flags, the job-file keys and the estimators'
parameters (:mod:`dpsub_dist.cli`, :mod:`dpsub_dist.jobfile`, :mod:`dpsub_dist.api`).

The configs (:class:`EstimateConfig`, :class:`ClusterConfig`, :class:`StreamConfig`) live
here too, so every driver imports them without pointing back up. Checks against the method
tables need the registry and run in :func:`dpsub_dist.job.validate`; this module checks the
run-level table only (:meth:`RunConfig.check_run`). All checks need no data.

Light on purpose: the CLI builds its parser from these tables at every call, so this module
imports neither NumPy nor the accountant (SciPy) until a value is checked or a budget parsed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from dpsub_dist.errors import InputError

if TYPE_CHECKING:
    from dpsub_dist.privacy.accountant import Budget


@dataclass(frozen=True, eq=False)
class Param:
    """One public parameter (as scikit-learn's ``_parameter_constraints``).

    ``name`` is the job-file key and the estimators' parameter and, with dashes, the CLI flag
    (``flag_name`` where the flag differs: ``--storage-option`` is given once per option);
    ``attr`` the config attribute it sets (``radius`` and ``cell_side`` both set ``scale``).
    ``default`` is the value when it is not given (help texts print it); ``valid`` checks the
    typed value and ``need`` says in words what it accepts (``fix``: how to choose);
    ``example`` is a value it accepts; ``parse`` reads one word of text (a CLI argument, a
    job-file string) where the type is not a number; a ``secret`` value (storage options hold
    credentials) is never repeated in a message. Parameters compare by identity.
    """

    name: str
    kind: type
    help: str
    example: Any
    need: str = ""
    fix: str = ""
    valid: Callable[[Any], bool] = lambda value: True
    attr: str = ""
    default: Any = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    flag_name: str = ""
    secret: bool = False

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.name.replace("_", "-")

    @property
    def field(self) -> str:
        return self.attr or self.name

    @property
    def described(self) -> str:
        """``help`` with the default, printed from the table (not repeated in the text)."""
        if self.default is None or self.kind is bool or self.choices:
            return self.help
        return f"{self.help} (default {self.default})"

    def typed(self, value: Any, label: str) -> Any:
        """``value`` checked against the type, choices and range; InputError naming ``label``."""
        if self.choices:
            if value not in self.choices:
                raise InputError(
                    f"unknown {label.lstrip('-')} {value!r}: use one of {', '.join(self.choices)}"
                )
            return value
        if not _KINDS[self.kind](value) or not self.valid(value):
            got = "" if self.secret else f" (got {value!r})"
            fix = f": {self.fix}" if self.fix else ""
            raise InputError(f"{label} must be {self.need}{got}{fix}")
        return value


def _is_number(value: Any) -> bool:
    import numpy as np

    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return False
    return math.isfinite(float(value))


def _is_int(value: Any) -> bool:
    import numpy as np

    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
    import numpy as np

    return isinstance(value, bool | np.bool_)


def _is_names(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(v, str) and v for v in value)


_KINDS: dict[type, Callable[[Any], bool]] = {
    bool: _is_bool,
    int: _is_int,
    float: _is_number,
    str: lambda value: isinstance(value, str) and bool(value.strip()),
    list: lambda value: _is_names(value) and len(value) > 0,
    dict: lambda value: isinstance(value, Mapping) and all(isinstance(k, str) for k in value),
}


def positive(value: Any) -> bool:
    return value > 0


def column_names(text: str) -> list[str]:
    """``a, b,c`` → ``["a", "b", "c"]`` (CLI words and job-file strings)."""
    return [c.strip() for c in text.split(",") if c.strip()]


# --------------------------------------------------------------------------- run-level table

RANK = Param(
    "rank",
    int,
    "K, the subspace dimension",
    need="a positive integer",
    fix="K ≥ 1, below the number of features",
    valid=positive,
    example=2,
    metavar="K",
)
CLUSTERS = Param(
    "clusters",
    int,
    "K, the number of subspaces",
    need="a positive integer",
    fix="K ≥ 1 subspaces",
    valid=positive,
    example=2,
    metavar="K",
)
EPSILON = Param("epsilon", float, "ε of (ε, δ)-DP", example=1.0)
DELTA = Param("delta", float, "δ of (ε, δ)-DP (with --rho: δ of the report)", example=1e-6)
RHO = Param("rho", float, "ρ of ρ-zCDP instead of --epsilon", example=0.5)
BUDGET = (EPSILON, DELTA, RHO)
"""The budget: checked together, once, by :func:`~dpsub_dist.privacy.accountant.parse_budget`."""
UNIT_COLUMN = Param(
    "unit_column",
    str,
    "user id column (integers, strings, …): user-level privacy; rows with a null id belong "
    "to no user and are ignored",
    need="a column name",
    example="user_id",
)
COLUMNS = Param(
    "columns",
    list,
    "comma-separated feature columns (default: every numeric column but identifiers such as "
    "user_id and a stored index, from the schema); a vector column (fixed_size_list or list "
    "of numbers, e.g. embeddings) adds its width",
    need="a list of column names",
    example=["x0", "x1"],
    parse=column_names,
)
EXCLUDE_COLUMNS = Param(
    "exclude_columns",
    list,
    "comma-separated columns or patterns (user_*, *_score) to leave out of the feature "
    "columns (of --columns, or of the default ones); from the schema only",
    need="a list of column names or patterns",
    example=["label"],
    parse=column_names,
    metavar="NAMES",
)
SEED = Param(
    "seed",
    int,
    "public seed (assignment, reference points); DP noise never comes from it",
    need="an integer",
    example=7,
)
STORAGE_OPTIONS = Param(
    "storage_options",
    dict,
    "fsspec/s3fs option, repeatable (e.g. endpoint_url=..., anon=true); secrets given here "
    "are never printed or written",
    need="a mapping of option names to values",
    example={"anon": True},
    metavar="KEY=VALUE",
    flag_name="--storage-option",
    secret=True,
)

STANDARDIZE = Param(
    "standardize",
    bool,
    "standardise every column first with a private location and scale (a share of the "
    "budget; the basis is then the private PCA of the correlation matrix; row level, "
    "docs/centring.md)",
    need="true or false",
    example=True,
    default=False,
)

REQUIRED = ("rank", "clusters")
"""The run-level parameters without a default."""
_DATA = (UNIT_COLUMN, COLUMNS, EXCLUDE_COLUMNS, SEED, STORAGE_OPTIONS)
RUN_PARAMS: dict[str, tuple[Param, ...]] = {
    "estimate": (RANK, *BUDGET, *_DATA, STANDARDIZE),
    "cluster": (CLUSTERS, replace(RANK, help="q, the dimension of each subspace"), *BUDGET, *_DATA),
    "stream": (RANK, *BUDGET, COLUMNS),
}
"""Each command's run-level parameters, inherited by every method of that command."""


# --------------------------------------------------------------------------- configs


def _budget_describes(budget: Budget, epsilon: Any, delta: Any, rho: Any) -> bool:
    """Whether ``budget`` is what :func:`parse_budget` makes of these values."""
    from dpsub_dist.privacy.accountant import ApproxDP

    if isinstance(budget, ApproxDP):
        return rho is None and epsilon == budget.epsilon and delta == budget.delta
    return epsilon is None and rho == budget.rho and delta == 2 * budget.delta0


DEFAULT_ITERATIONS = 6
"""T of ``--method power``: iterations (passes over the rows) when --iterations is not given
(docs/power.md); here, below the privacy layer (:mod:`dpsub_dist.privacy.noisy_power`) and
the method tables (:mod:`dpsub_dist.methods.tables`) that both use it."""

DEFAULT_OVERSAMPLE = 8
"""k' − k of ``--method power``: extra columns of the iterate when --oversample is not given."""

DEFAULT_TOLERANCE = 1e-12
"""Relative membership tolerance τ of ``--method exact``: x ∈ s iff ‖x − Π_s x‖ ≤ τ‖x‖
(covers float64 rounding; the release grid :func:`dpsub_dist.privacy.gap_max.snap_side` grows
with τ, so a larger τ costs accuracy)."""

DEFAULT_METHODS = {"estimate": "auto", "cluster": "sample-aggregate", "stream": "online"}
"""Each command's method when none is given (estimate: chosen from public facts, docs/auto.md)."""


@dataclass
class RunConfig:
    """What every run's config holds: the run-level table's fields and the parsed budget.

    ``parsed_budget`` is the run's total :data:`Budget`, parsed once from
    epsilon/delta/rho (at the door, or at the first :meth:`budget` call); it is a field, so
    ``dataclasses.replace`` carries it, and it is parsed again only if epsilon/delta/rho no
    longer give it (an estimator's ``set_params``)."""

    command: ClassVar[str]

    rank: int
    _: KW_ONLY
    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None
    unit_column: str | None = None
    columns: list[str] | None = None
    parsed_budget: Budget | None = field(default=None, repr=False, compare=False)

    def budget(self) -> Budget:
        """The run's total budget: ``parsed_budget``, parsed here if not yet."""
        from dpsub_dist.privacy.accountant import parse_budget

        given = (self.epsilon, self.delta, self.rho)
        if self.parsed_budget is None or not _budget_describes(self.parsed_budget, *given):
            self.parsed_budget = parse_budget(*given)
        return self.parsed_budget

    def check_run(self) -> None:
        """The run-level table's checks (the budget's is :meth:`budget`)."""
        for param in RUN_PARAMS[self.command]:
            value = getattr(self, param.field, None)
            if param in BUDGET or (value is None and param.name not in REQUIRED):
                continue
            param.typed(value, param.flag)


@dataclass(kw_only=True)
class TableConfig(RunConfig):
    """A run over a table (estimate, cluster): the data options of the run-level table."""

    exclude_columns: list[str] | None = None  # names or fnmatch patterns left out (public)
    seed: int | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class EstimateConfig(TableConfig):
    """Parameters of ``dpsub estimate`` / :class:`dpsub_dist.PrivateSubspace`: the run-level
    table, then the method options declared in the method modules of
    :mod:`dpsub_dist.methods` (``dpsub_dist.job.validate`` checks them against it)."""

    command: ClassVar[str] = "estimate"

    standardize: bool = False  # private location and scale first (row level)
    method: str = DEFAULT_METHODS["estimate"]
    subsets: int | None = None
    ref_points: int | None = None
    assign: Literal["random", "contiguous"] = "random"
    scale: float | None = None  # --radius (friendly) or --cell-side (histogram), public
    row_norm: float | None = None
    center: bool | None = None  # private mean first; None: on where the estimate is PCA
    outliers: int | None = None
    tolerance: float | None = None
    boost: int | None = None
    boost_alpha: float | None = None
    iterations: int | None = None  # power: T, public
    oversample: int | None = None  # power: k′ − k, public


@dataclass(kw_only=True)
class ClusterConfig(TableConfig):
    """Parameters of ``dpsub cluster``: ``rank`` is q, the dimension of each of the
    ``clusters`` subspaces; the method options are declared in :mod:`dpsub_dist.methods`."""

    command: ClassVar[str] = "cluster"

    clusters: int
    method: str = DEFAULT_METHODS["cluster"]
    aggregator: str = "friendly"
    subsets: int | None = None
    ref_points: int | None = None
    assign: Literal["random", "contiguous"] = "random"
    scale: float | None = None
    iterations: int | None = None
    sweeps: int | None = None
    row_norm: float | None = None
    private_norm: bool = False


@dataclass(kw_only=True)
class StreamConfig(RunConfig):
    """Parameters of ``dpsub stream init`` / :func:`dpsub_dist.job.init_stream`: a stream of
    ``horizon`` batches and its whole budget; the method options (``horizon``, ``clip_norm``,
    ``center``) are declared in :mod:`dpsub_dist.methods.stream`. ``ledger`` and ``dataset``
    (together): charge the whole budget to the dataset's grant at init. ``unit_column`` is
    refused: streams are row level only."""

    command: ClassVar[str] = "stream"

    method: str = DEFAULT_METHODS["stream"]
    horizon: int | None = None
    clip_norm: float | None = None  # public row-norm bound; None: private, from batch 1
    center: bool | None = None  # private mean of batch 1 first; None: on
    ledger: str | None = None
    dataset: str | None = None
