"""``--boost B`` around any estimate method: SS21 Alg. 3 on B disjoint groups (ALGORITHMS.md
§5): the job layer runs the method's own runner on each group (:func:`dpsub_dist.job.run_boosted`:
no frame of boosting holds the budget while a group draws); this module holds the steps around.

1. **Groups**, independent of values: row level — keyed hash of (group seed, global row
   position) mod B, so a row whose values are replaced stays in its group; user level —
   keyed hash of (group seed, user id) mod B, so adding or removing a user touches one
   group. The group seed is derived from the run's public seed with a tag, so groups are
   independent of the subset assignment inside each group (which hashes positions too).
2. **Runs**: the method runs on each group with the **full budget**. The groups are
   disjoint, so one unit changes one group's output only and the B outputs together are
   as private as one run (parallel composition, McSherry 2009); the manifest lists the
   budget once: the boosted run declares the groups' one plan and charges each step with
   the :class:`~dpsub_dist.privacy.mechanism.Parallel` of the mechanisms the groups charged
   it with (its largest cost; :func:`charge_parallel`), which covers every group's total.
   Every group runs one plan (the same steps at the same charges): the one plan-changing
   route, gauss's sampled centre, is decided per group from its public row count, so where
   the groups would not all take it none does (:func:`one_centre_route`).
3. **Selection** (post-processing): the first estimate ``Π̂_i`` within operator-norm
   ``2α`` of at least ``⌈0.6B − 1⌉`` other estimates, else ⊥.

Each group is the same Dataset with a filtering loader, so every registered method runs
unchanged. At row level a group's rows are renumbered 0..n_g−1 in global order; ``n_g``
is public because it depends on positions only. At user level ``n_g`` would need the
unit column and n itself is private: a group's Dataset carries ``n // B`` rows (from the
footers) only because the type needs a number; no user-level step reads it and the
manifests never publish it.
Cost: every group reads every partition once (B passes over the data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsub_dist.context import EstimateResult, PlanMismatch, RunContext, public_seed
from dpsub_dist.engine.assign import random_row_subsets, unit_subsets
from dpsub_dist.engine.sources import Dataset
from dpsub_dist.linalg import subspace_error
from dpsub_dist.methods.gauss import centre_sample, refined_centre
from dpsub_dist.privacy.mechanism import Mechanism, Parallel

if TYPE_CHECKING:
    from dpsub_dist.params import EstimateConfig
from dpsub_dist.errors import InputError

_GROUP_TAG = 0xB0057
_POSITION_CHUNK = 1 << 22


def agreement_needed(groups: int) -> int:
    """⌈0.6B − 1⌉ (exact integer arithmetic): how many others an estimate must be close to."""
    return max(0, -(-(3 * groups - 5) // 5))


def select_stable(bases: Sequence[np.ndarray | None], alpha: float) -> tuple[int | None, list[int]]:
    """SS21 Alg. 3 selection: first basis within 2α of ≥ ⌈0.6B − 1⌉ others, and every count."""
    need = agreement_needed(len(bases))
    counts = [
        0
        if a is None
        else sum(
            1
            for j, b in enumerate(bases)
            if j != i and b is not None and subspace_error(a, b) <= 2 * alpha
        )
        for i, a in enumerate(bases)
    ]
    for i, a in enumerate(bases):
        if a is not None and counts[i] >= need:
            return i, counts
    return None, counts


def group_seed(seed: int) -> int:
    """Public seed of the group assignment, derived from the run's public seed."""
    return int(np.random.default_rng([seed, _GROUP_TAG]).integers(2**63))


def groups_of(
    positions: np.ndarray, units: Any, seed: int, groups: int, user_level: bool
) -> np.ndarray:
    """Group of each row: keyed hash of its unit id (user level) or global position."""
    if user_level:  # keyed apart from the subsets' hash: groups and subsets are independent
        return unit_subsets(units, seed, groups, purpose=b"groups")
    return random_row_subsets(positions, seed, groups)


def group_sizes(part_rows: Sequence[int], seed: int, groups: int) -> np.ndarray:
    """Rows of each group in each partition (parts × B), from positions alone (public)."""
    sizes = np.zeros((len(part_rows), groups), dtype=np.int64)
    start = 0
    for p, rows in enumerate(part_rows):
        for lo in range(start, start + rows, _POSITION_CHUNK):
            positions = np.arange(lo, min(lo + _POSITION_CHUNK, start + rows), dtype=np.int64)
            sizes[p] += np.bincount(random_row_subsets(positions, seed, groups), minlength=groups)
        start += rows
    return sizes


@dataclass(frozen=True)
class GroupLoader:
    """Loads a (part, global offset) pair on a worker and keeps the rows of one group."""

    loader: Callable[[Any], tuple[np.ndarray, Any]]
    group: int
    groups: int
    seed: int
    user_level: bool

    def __call__(self, part_at: tuple[Any, int]) -> tuple[np.ndarray, Any]:
        part, offset = part_at
        rows, units = self.loader(part)
        positions = offset + np.arange(rows.shape[0], dtype=np.int64)
        keep = groups_of(positions, units, self.seed, self.groups, self.user_level) == self.group
        return rows[keep], None if units is None else units[keep]


def group_dataset(
    dataset: Dataset, group: int, groups: int, seed: int, sizes: np.ndarray | None
) -> Dataset:
    """The dataset restricted to one group (``sizes``: :func:`group_sizes`, None at user level)."""
    loader = GroupLoader(dataset.loader, group, groups, seed, sizes is None)
    parts = list(zip(dataset.parts, dataset.offsets, strict=True))
    if sizes is None:
        offsets, n_rows = list(dataset.offsets), dataset.n_rows // groups
    else:
        counts = sizes[:, group]
        offsets = [int(x) for x in np.cumsum(counts) - counts]
        n_rows = int(counts.sum())
    return Dataset(
        parts,
        offsets,
        loader,
        dataset.columns,
        n_rows,
        dataset.input,
        dataset.files,
        widths=dataset.widths,
    )


def _part_rows(dataset: Dataset) -> list[int]:
    ends = [*dataset.offsets[1:], dataset.n_rows]
    return [int(e - s) for s, e in zip(dataset.offsets, ends, strict=True)]


def group_noise_seed(noise_seed: int | None, group: int) -> int | None:
    """Private noise seed of one group, derived from the run's (None: OS entropy)."""
    if noise_seed is None:
        return None
    state = np.random.SeedSequence([noise_seed, group]).generate_state(4, dtype=np.uint32)
    return int.from_bytes(state.tobytes(), "little")


def one_centre_route(config: EstimateConfig, parts: list[Dataset]) -> list[Dataset]:
    """The groups, without gauss's sampled-centre route unless every one takes it (public:
    the groups' row counts at row level; asked as gauss, which auto may choose and which
    alone reads it). The route splits the mean's charge in two steps, so groups on both
    sides of its threshold would list each step at its larger charge and sum above the
    budget: the run refused after its noise was drawn. The same for a wide table's refined
    centre (:func:`~dpsub_dist.methods.gauss.refined_centre`): all groups or none."""
    as_gauss = dataclasses.replace(config, method="gauss", parsed_budget=config.budget())
    if not all(centre_sample(as_gauss, part) is not None for part in parts):
        parts = [dataclasses.replace(part, sampled_centre=False) for part in parts]
    if len({refined_centre(as_gauss, part) for part in parts}) > 1:
        parts = [dataclasses.replace(part, refined_centre=False) for part in parts]
    return parts


def one_plan(results: Sequence[EstimateResult]) -> dict[str, tuple[float, float]]:
    """The plan every group declared (each from public facts, before its rows were read):
    the boosted run's declared plan. Groups on different plans are an internal error
    (:func:`one_centre_route` puts them on one)."""
    plans = [dict(r.manifest["parameters"]["budget_shares"]) for r in results]
    if any(other != plans[0] for other in plans[1:]):
        raise PlanMismatch(f"the boosted groups declared different plans: {plans}")
    return plans[0]


def charge_parallel(ctx: RunContext, results: Sequence[EstimateResult]) -> None:
    """Charge disjoint groups once: each step by the parallel composition of the mechanisms
    the groups charged it with (:class:`~dpsub_dist.privacy.mechanism.Parallel`, in the
    order the groups charged them); their noise was drawn by each group's own release, so
    this one draws nothing."""
    steps: dict[str, list[Mechanism]] = {}
    for result in results:
        for step, charged in result.mechanisms.items():
            steps.setdefault(step, []).append(charged)
    for step, parts in steps.items():
        ctx.release(step, Parallel(tuple(parts)), lambda _groups, _rng: None)


def disjoint_groups(
    config: EstimateConfig, dataset: Dataset
) -> tuple[EstimateConfig, list[Dataset]]:
    """The config every group runs (boosting off, the public seed fixed, the budget parsed at
    the edge) and the B groups of ``dataset``, all on one centre route."""
    groups, seed = int(config.boost), public_seed(config)
    seed_of_groups = group_seed(seed)
    user_level = config.unit_column is not None
    sizes = None if user_level else group_sizes(_part_rows(dataset), seed_of_groups, groups)
    inner = dataclasses.replace(
        config, boost=None, boost_alpha=None, seed=seed, parsed_budget=config.budget()
    )
    parts = [group_dataset(dataset, g, groups, seed_of_groups, sizes) for g in range(groups)]
    return inner, one_centre_route(inner, parts)


def boosted_result(ctx: RunContext, seed: int, results: Sequence[EstimateResult]) -> EstimateResult:
    """The boosted run's result from its groups' (run on :func:`disjoint_groups` with the
    public ``seed``): their one plan declared, each step charged once in parallel, the stable
    estimate selected (post-processing)."""
    config = ctx.config
    groups, alpha = int(config.boost), config.boost_alpha
    user_level = config.unit_column is not None
    ctx.plan(one_plan(results))
    charge_parallel(ctx, results)
    chosen, counts = select_stable([r.basis for r in results], alpha)

    parameters = {
        "boost": {
            "groups": groups,
            "alpha": alpha,
            "agreement_needed": agreement_needed(groups),
            "agreement": "operator norm of the projection difference ≤ 2α",
            "public_seed": seed,
            "group_seed": group_seed(seed),
        },
        "group_runs": [
            {
                "group": g,
                "n_rows": r.manifest["n_rows"],
                "outcome": r.outcome,
                "parameters": r.manifest["parameters"],
                "release": r.manifest["release"],
            }
            for g, r in enumerate(results)
        ],
    }
    release: dict[str, Any] = {"chosen_group": chosen, "agreeing_groups": counts}
    if chosen is None:
        release["failed_step"] = "boost_agreement"
        release["failure_reason"] = (
            f"no group's estimate is within 2α = {2 * alpha:g} of {agreement_needed(groups)} others"
        )
    ctx.timings["group_total_s"] = [r.timings.get("total_s") for r in results]
    gathered = sum(int(r.manifest["summary_bytes_gathered"]) for r in results)
    basis = None if chosen is None else results[chosen].basis
    result = ctx.result(basis, parameters, release, gathered)
    manifest = result.manifest
    del manifest["parameters"]["budget_shares"]  # every group run publishes the one plan
    how = "unit id" if user_level else "global row position"
    manifest["privacy"]["groups"] = f"keyed hash of (group seed, {how}) mod {groups}"
    manifest["privacy"]["composition"] = (
        f"parallel: the {groups} groups hold disjoint units and each ran with the full budget, "
        "so one unit affects one group's output; the budget is listed once (each step at its "
        "largest charge over the groups); the selection is post-processing"
    )
    return result


def chosen_view(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as seen from the release behind its basis: a boosted run's chosen group
    (its release, parameters and row count) in place of the run's own; others unchanged."""
    chosen = manifest["release"].get("chosen_group")
    if chosen is None:
        return manifest
    group = manifest["parameters"]["group_runs"][chosen]
    return {**manifest, **{k: group[k] for k in ("release", "parameters", "n_rows")}}


def check_boost(config: Any) -> None:
    if config.boost is None and config.boost_alpha is not None:
        raise InputError("--boost-alpha applies with --boost B: add --boost or drop it")
