"""``--boost B`` around any estimate method: SS21 Alg. 3 on B disjoint groups (ALGORITHMS.md
§5); the runner wraps the method's own runner (:func:`dpsub_dist.estimators.boost.run_boosted`)."""

from typing import Any

from dpsub_dist.errors import InputError
from dpsub_dist.estimators import boost
from dpsub_dist.methods.spec import Modifier, Param

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
    default=boost.DEFAULT_BOOST_ALPHA,
    example=0.2,
)


def check_boost(config: Any) -> None:
    if config.boost is None and config.boost_alpha is not None:
        raise InputError("--boost-alpha applies with --boost B: add --boost or drop it")


MODIFIER = Modifier("boost", "estimate", (BOOST, BOOST_ALPHA), check_boost)
