"""Every method's declaration: its parameter table, its summary and the names of its runner,
plan and checks, importable without NumPy, SciPy, pandas or Dask.

The CLI's parser, the job file's keys and the estimators' parameters are generated from these
tables (:mod:`dpsub_dist.methods`); building them imports nothing heavy, so ``dpsub --help``
answers at once. A method's code lives in its own module (``gauss``, ``power``,
``_sample_aggregate``, …) and is imported on its first call (:class:`~.spec.Later`).
"""

from __future__ import annotations

from dpsub_dist.methods.spec import Later, Method, Modifier, Param, from_options, positive
from dpsub_dist.params import DEFAULT_ITERATIONS, DEFAULT_OVERSAMPLE, DEFAULT_TOLERANCE

SA = "dpsub_dist.methods._sample_aggregate"
CLUSTERING = "dpsub_dist.methods._clustering"
GAUSS = "dpsub_dist.methods.gauss"

# --------------------------------------------------------------------------- sample and aggregate

MAX_SUBSETS = 20_000
"""Largest t accepted at all (the t×t float64 distance matrix is 3.2 GB at this size)."""

SUBSETS = Param(
    "subsets",
    int,
    "t, the number of disjoint subsets the rows are split into (default: from the budget "
    "and, at row level, n)",
    need=f"between 2 and {MAX_SUBSETS}",
    fix="the driver holds a t×t matrix",
    valid=lambda t: 2 <= t <= MAX_SUBSETS,
    example=50,
)
REF_POINTS = Param(
    "ref_points",
    int,
    "Q, number of public reference points (≥ rank)",
    need="a positive integer ≥ rank",
    valid=positive,
    example=8,
)
ASSIGN = Param(
    "assign",
    str,
    "rows to subsets: keyed hash of position (random, the default; any row order), or "
    "blocks of consecutive rows (contiguous: rows stored in random order; no shuffle)",
    default="random",
    choices=("random", "contiguous"),
    example="contiguous",
)
PLAN_PARAMS = (SUBSETS, REF_POINTS, ASSIGN)

# --------------------------------------------------------------------------- centring

ROW_NORM = Param(
    "row_norm",
    float,
    "public bound B, longer rows are scaled down to B (gauss/gap-perturb, and the private "
    "mean when centring; default: chosen privately with a small share of the budget)",
    need="a positive finite number",
    fix="e.g. 10",
    valid=positive,
    example=10.0,
)
CENTER = Param(
    "center",
    bool,
    "subtract a private mean first (default: on at row level for friendly, histogram, gauss, "
    "gap-perturb, auto and streams, whose mean is the first batch's; --no-center estimates "
    "the uncentred subspace)",
    need="true or false",
    example=True,
)
CENTRING_PARAMS = (ROW_NORM, CENTER)
COVARIANCE_PARAMS = CENTRING_PARAMS

# --------------------------------------------------------------------------- estimate

RADIUS = Param(
    "radius",
    float,
    "public friendly radius (skips its private search)",
    need="> 0",
    fix="a public radius; omit it to have it chosen privately",
    valid=positive,
    attr="scale",
    example=0.3,
)
CELL_SIDE = Param(
    "cell_side",
    float,
    "public histogram cell side (skips its private search)",
    need="> 0",
    fix="a public cell side; omit it to have it chosen privately",
    valid=positive,
    attr="scale",
    example=0.3,
)
OUTLIERS = Param(
    "outliers",
    int,
    "ℓ, outliers the NULL score tolerates",
    need="an integer ≥ 0",
    fix="e.g. 2",
    valid=lambda value: value >= 0,
    default=0,
    example=2,
)
TOLERANCE = Param(
    "tolerance",
    float,
    "relative membership tolerance",
    need="a relative distance in [1e-12, 0.1]",
    fix=f"the default is {DEFAULT_TOLERANCE}",
    valid=lambda value: 1e-12 <= value <= 0.1,
    default=DEFAULT_TOLERANCE,
    example=1e-6,
)
POWER_ITERATIONS = Param(
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

SCALE_ROUTE = "--method histogram with a small --cell-side (e.g. 1e-3) and --no-center"
"""Exactly low-rank data at scale: sample and aggregate with a tiny cell (methods/exact.py)."""

FRIENDLY = Method(
    name="friendly",
    command="estimate",
    summary="sample and aggregate, friendly-core aggregator",
    params=(*PLAN_PARAMS, RADIUS, *CENTRING_PARAMS),
    run=Later(SA, "run_sample_aggregate"),
    plan=from_options(Later(SA, "estimate_plan")),
    check=Later(SA, "check_estimate"),
)
HISTOGRAM = Method(
    name="histogram",
    command="estimate",
    summary="sample and aggregate, histogram aggregator",
    params=(*PLAN_PARAMS, CELL_SIDE, *CENTRING_PARAMS),
    run=Later(SA, "run_sample_aggregate"),
    plan=from_options(Later(SA, "estimate_plan")),
    check=Later(SA, "check_estimate"),
)
GAUSS_METHOD = Method(
    name="gauss",
    command="estimate",
    summary="covariance perturbation (Analyze Gauss)",
    params=COVARIANCE_PARAMS,
    run=Later(GAUSS, "run_covariance"),
    plan=Later(GAUSS, "plan_shares"),
    check=Later(GAUSS, "check_covariance"),
)
GAP_PERTURB = Method(  # DTTZ14 Alg. 2, ALGORITHMS.md §7; plan: gauss.plan_shares
    name="gap-perturb",
    command="estimate",
    summary="covariance perturbation with a noisy eigengap",
    params=COVARIANCE_PARAMS,
    run=Later(GAUSS, "run_covariance"),
    plan=Later(GAUSS, "plan_shares"),
    check=Later(GAUSS, "check_covariance"),
)
EXACT = Method(
    name="exact",
    command="estimate",
    summary="SS21 GAP-MAX, small inputs only",
    params=(OUTLIERS, TOLERANCE),
    run=Later("dpsub_dist.methods.exact", "run_exact"),
    plan=from_options(Later("dpsub_dist.methods.exact", "budget_shares")),
    row_level_only=f"it needs a public row count; at scale use {SCALE_ROUTE}",
)
POWER = Method(
    name="power",
    command="estimate",
    summary="noisy power method on the workers (wide data without a gap, nothing D×D)",
    params=(POWER_ITERATIONS, OVERSAMPLE, *CENTRING_PARAMS),
    run=Later("dpsub_dist.methods.power", "run_power"),
    plan=from_options(Later("dpsub_dist.methods.power", "plan_shares")),
    check=Later(GAUSS, "check_covariance"),
)
AUTO = Method(
    name="auto",
    command="estimate",
    summary="the default: gauss, power or friendly, chosen from public facts (docs/auto.md)",
    params=(*PLAN_PARAMS, RADIUS, *CENTRING_PARAMS),
    run=None,
    plan=Later("dpsub_dist.methods.auto", "plan_shares"),
    choose=Later("dpsub_dist.methods.auto", "resolve"),
)

DEFAULT_BOOST_ALPHA = 0.1
"""Accuracy α each group's estimate is expected to reach: two agree within 2α = 0.2."""

BOOST = Param(
    "boost",
    int,
    "run on B disjoint groups, keep an agreed estimate",
    need="an integer ≥ 2",
    fix="e.g. 3",
    valid=lambda value: value >= 2,
    metavar="B",
    example=3,
)
BOOST_ALPHA = Param(
    "boost_alpha",
    float,
    "with --boost: groups agree within 2α",
    need="in (0, 0.5)",
    fix="estimates agree within 2α in operator norm, and any two are within 1",
    valid=lambda value: 0 < value < 0.5,
    default=DEFAULT_BOOST_ALPHA,
    example=0.2,
)
BOOSTING = Modifier(
    "boost", "estimate", (BOOST, BOOST_ALPHA), Later("dpsub_dist.methods.boost", "check_boost")
)

# --------------------------------------------------------------------------- cluster

SULQ_ITERATIONS_DEFAULT = 6
"""SuLQ iterations T: fewer than 4 often merges too early; each extra one adds noise."""
DEFAULT_SWEEPS = 50
"""Gibbs sweeps over (assignments, subspaces)."""

AGGREGATOR = Param(
    "aggregator",
    str,
    "the private aggregator: friendly (default) or histogram",
    default="friendly",
    choices=("friendly", "histogram"),
    example="histogram",
)
SCALE = Param(
    "scale",
    float,
    "public friendly radius or histogram cell side (skips its private search)",
    need="> 0",
    fix="a public radius or cell side; omit it to have it chosen privately",
    valid=positive,
    example=0.3,
)
SULQ_ITERATIONS = Param(
    "iterations",
    int,
    "k-plane iterations, each a Gaussian release",
    need="a positive integer",
    valid=positive,
    default=SULQ_ITERATIONS_DEFAULT,
    example=4,
)
UNIT_ROW_NORM = Param(
    "row_norm",
    float,
    "clip rows to this public norm, then divide by it (default: scale each row to length 1)",
    need="a positive finite number",
    fix="e.g. 10",
    valid=positive,
    example=10.0,
)
PRIVATE_NORM = Param(
    "private_norm",
    bool,
    "clip rows to a bound B chosen privately from the data (10%% of the budget, step "
    "norm_bound, B published) instead of scaling each row to length 1",
    need="true or false",
    default=False,
    example=True,
)
SWEEPS = Param(
    "sweeps",
    int,
    "sampler sweeps",
    need="a positive integer",
    valid=positive,
    default=DEFAULT_SWEEPS,
    example=20,
)
ROW_LEVEL = "its sensitivity is for replacing one row, with n public"

CLUSTER_SAMPLE_AGGREGATE = Method(  # WWS15 §9 a; ALGORITHMS.md §9
    name="sample-aggregate",
    command="cluster",
    summary="sample and aggregate of local k-plane clusterings (default)",
    params=(AGGREGATOR, *PLAN_PARAMS, SCALE),
    run=Later(CLUSTERING, "run_sample_aggregate"),
    plan=from_options(Later(CLUSTERING, "budget_shares")),
    check=Later(SA, "check_plan"),
)
SULQ = Method(  # WWS15 §9 b; one charge per iteration (and norm_bound first if private)
    name="sulq",
    command="cluster",
    summary="Gaussian (SuLQ) k-plane iterations",
    params=(SULQ_ITERATIONS, UNIT_ROW_NORM, PRIVATE_NORM),
    run=Later(CLUSTERING, "run_sulq"),
    plan=from_options(Later(CLUSTERING, "budget_shares")),
    check=Later(CLUSTERING, "check_sulq"),
    row_level_only=ROW_LEVEL,
)
GIBBS = Method(  # WWS15 §9 c: a finite chain has no DP guarantee; nothing charged, no job file
    name="gibbs",
    command="cluster",
    summary="Gibbs sampler of the exponential mechanism (small inputs, no DP guarantee)",
    params=(SWEEPS, UNIT_ROW_NORM),
    run=Later(CLUSTERING, "run_gibbs"),
    plan=from_options(Later(CLUSTERING, "budget_shares")),
    row_level_only=ROW_LEVEL,
)

# --------------------------------------------------------------------------- stream

MAX_HORIZON = 2**20

HORIZON = Param(
    "horizon",
    int,
    "T, the number of batches the stream takes (its budget covers all T together)",
    need=f"an integer in 1..{MAX_HORIZON}",
    fix="pass --horizon T, the number of batches the stream will take",
    valid=lambda value: 1 <= value <= MAX_HORIZON,
    example=4,
)
CLIP_NORM = Param(
    "clip_norm",
    float,
    "public row-norm bound B, longer rows are scaled down to B (default: chosen privately "
    "from the first batch with a share of the stream's budget, then fixed)",
    need="a positive finite number",
    fix="pass --clip-norm B, a public bound on row norms, or drop it for a private bound",
    valid=positive,
    example=3.0,
)
ONLINE = Method(
    name="online",
    command="stream",
    summary="online PCA by tree aggregation of Σ aaᵀ (DTTZ14 §4)",
    params=(HORIZON, CLIP_NORM, CENTER),
    run=Later("dpsub_dist.methods.stream", "init"),
    plan=from_options(Later("dpsub_dist.methods.stream", "plan_shares")),
    check=Later("dpsub_dist.methods.stream", "check_stream"),
    row_level_only="a user's rows in different batches could not be scaled jointly without "
    "per-user state",
)
