"""``dpsub stream``: online private PCA by tree aggregation (DTTZ14 §4; ALGORITHMS.md §8).

The stream's one method, ``online``, declared like every other: its parameter table (the
flags of ``dpsub stream init`` and the fields of :class:`~.config.StreamConfig`), its budget
plan (:func:`plan_shares`: the first batch's ``norm_bound``, ``mean`` and
``centred_norm_bound`` steps, then one ``batch 2^h`` step per tree level) and its runner
(:func:`init`, which creates the stream with that plan; each ``dpsub stream append`` then
releases the plan's steps as their batches arrive,
:func:`dpsub_dist.estimators.online.append_plan`).
"""

from typing import Any

from dpsub_dist.errors import InputError
from dpsub_dist.estimators import online
from dpsub_dist.estimators.centring import MEAN_SHARE
from dpsub_dist.estimators.covariance import NORM_SHARE
from dpsub_dist.methods._centring import CENTER
from dpsub_dist.methods.spec import Method, Param, from_options, positive

HORIZON = Param(
    "horizon",
    int,
    "T, the number of batches the stream takes (its budget covers all T together)",
    need=f"an integer in 1..{online.MAX_HORIZON}",
    fix="pass --horizon T, the number of batches the stream will take",
    valid=lambda value: 1 <= value <= online.MAX_HORIZON,
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


def check_stream(config: Any) -> None:
    """A horizon is required; the ledger and its dataset go together."""
    if config.horizon is None:
        HORIZON.typed(config.horizon, HORIZON.flag)
    if (config.ledger is None) != (config.dataset is None):
        raise InputError(
            "--dataset needs --ledger (and --ledger needs --dataset): pass both to charge the "
            "stream's whole budget to the dataset's grant, or neither for an untracked stream"
        )


def plan_shares(config: Any) -> dict[str, tuple[float, float]]:
    """The stream's plan, all of ρ (zCDP: no δ share). Without ``--clip-norm``,
    :data:`NORM_SHARE` for the first batch's private bound (halved between the raw rows'
    ``norm_bound``, for the mean, and the centred rows' ``centred_norm_bound`` when centred);
    centred, ``mean`` takes :data:`MEAN_SHARE` of the rest (gauss's shares); the tree takes
    what is left, evenly over its L levels (``batch 2^h``, :func:`online.tree_steps`)."""
    centred = online.resolve_center(config)
    norm = NORM_SHARE if config.clip_norm is None else 0.0
    first: dict[str, tuple[float, float]] = {}
    if norm:
        first["norm_bound"] = (norm / 2 if centred else norm, 0.0)
    if centred:
        first["mean"] = (MEAN_SHARE * (1.0 - norm), 0.0)
    if norm and centred:
        first["centred_norm_bound"] = (norm / 2, 0.0)
    tree = (1.0 - MEAN_SHARE if centred else 1.0) * (1.0 - norm)
    return {**first, **online.tree_steps(tree, online.tree_levels(config.horizon))}


def init(path: str, config: Any) -> online.StreamSettings:
    """Create the stream at ``path`` with the plan declared here
    (:func:`dpsub_dist.estimators.online.init_stream`)."""
    return online.init_stream(path, config, plan_shares(config))


METHOD = Method(
    name="online",
    command="stream",
    summary="online PCA by tree aggregation of Σ aaᵀ (DTTZ14 §4)",
    params=(HORIZON, CLIP_NORM, CENTER),
    run=init,
    plan=from_options(plan_shares),
    check=check_stream,
    row_level_only="a user's rows in different batches could not be scaled jointly without "
    "per-user state",
)
