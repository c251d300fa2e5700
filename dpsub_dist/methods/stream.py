"""``dpsub stream``: online private PCA by tree aggregation (DTTZ14 §4; ALGORITHMS.md §8).

The stream's one method, ``online``, declared like every other: its parameter table (the
flags of ``dpsub stream init`` and the fields of :class:`~.config.StreamConfig`), its budget
plan (:func:`dpsub_dist.estimators.online.plan_shares`: the first batch's ``norm_bound``,
``mean`` and ``centred_norm_bound`` steps, then one ``batch t`` step per tree level) and its
runner (:func:`dpsub_dist.estimators.online.init_stream`, which creates the stream; each
``dpsub stream append`` then runs the plan's steps as their batches arrive).
"""

from typing import Any

from dpsub_dist.errors import InputError
from dpsub_dist.estimators import online
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


METHOD = Method(
    name="online",
    command="stream",
    summary="online PCA by tree aggregation of Σ aaᵀ (DTTZ14 §4)",
    params=(HORIZON, CLIP_NORM, CENTER),
    run=online.init_stream,
    plan=from_options(online.plan_shares),
    check=check_stream,
    row_level_only="a user's rows in different batches could not be scaled jointly without "
    "per-user state",
)
