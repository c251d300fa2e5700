"""Which route takes the local steps to their subsets' rows, chosen from public facts only.

All routes give each subset's summary from that subset's rows alone (the sketch route up
to its stated bound); they differ in what moves and what a worker holds:

- ``subsets in place`` (row-level contiguous): nothing moves, memory flat in n;
- ``per-subset Gram matrices`` (hashed, t·d² floats small): one pass, exact, flat in n;
- ``per-subset sketches`` (hashed, t·d·m floats small, m = k + oversampling):
  :data:`~dpsub_dist.engine.sketch.PASSES` passes, flat in n;
- ``row shuffle`` (hashed, wider still): rows move to their subsets (grows with n).

The choice reads t, d, k and the assignment: never n or any data value, so it is the same
on neighbouring inputs at row and at user level.
"""

from __future__ import annotations

from collections.abc import Callable

from dpsub_dist.engine.in_place import compute_subset_summaries_in_place
from dpsub_dist.engine.sketch import compute_subset_summaries_from_sketches, sketch_width
from dpsub_dist.engine.subsets import (
    SubsetPlan,
    compute_subset_summaries,
    compute_subset_summaries_from_grams,
)

GRAM_ROUTE_BYTES = 64 * 2**20
"""Up to this size of t per-subset d×d Gram matrices, subsets are summarised from Grams."""

SKETCH_ROUTE_BYTES = 256 * 2**20
"""Up to this size of t per-subset d×m sketches (above the Gram size), from sketches;
above it rows are shuffled to their subsets."""

LOCAL_ROUTES: dict[str, Callable] = {
    "subsets in place": compute_subset_summaries_in_place,
    "per-subset Gram matrices": compute_subset_summaries_from_grams,
    "per-subset sketches": compute_subset_summaries_from_sketches,
    "row shuffle": compute_subset_summaries,
}
"""How the local steps reach their subsets' rows, by the name the manifest records."""


def local_route(plan: SubsetPlan, dim: int, rank: int) -> str:
    """The route for this plan: in place, else the cheapest whose per-subset summaries fit."""
    if plan.assign == "contiguous" and not plan.user_level:
        return "subsets in place"
    if plan.subsets * dim * dim * 8 <= GRAM_ROUTE_BYTES:
        return "per-subset Gram matrices"
    if plan.subsets * dim * sketch_width(rank, dim) * 8 <= SKETCH_ROUTE_BYTES:
        return "per-subset sketches"
    return "row shuffle"
