"""Dask plumbing of sample and aggregate: partitions → subsets → one summary per subset.

Each partition is loaded and split by subset *on the workers*; subsets are grouped
into buckets so the shuffle has ``partitions × buckets`` edges instead of
``partitions × t``; each bucket task runs the estimator's local step on each of its
subsets. A partition's rows are sorted by subset once and buckets are ranges of subset
ids, so each shard is one slice, sent as float32 when that holds the rows exactly; a
bucket copies each row once, into its subset's float64 block. Only the per-subset
summaries (``t × out_dim`` floats) reach the driver.
Every task is a pure function of (partition, public plan), so Dask may retry it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

import dask
import numpy as np
from dask.sizeof import sizeof

from dpsub_dist.engine.assign import contiguous_row_subsets, random_row_subsets, unit_subsets
from dpsub_dist.engine.compute import IN_PROCESS, Executor, gather_summaries, tree_sum
from dpsub_dist.engine.progress import progress_bar  # noqa: F401  (methods/_clustering.py)
from dpsub_dist.engine.sources import Loader

LocalStep = Callable[[np.ndarray, int], np.ndarray]


@dataclass(frozen=True)
class SubsetPlan:
    """Public description of how units map to subsets."""

    subsets: int
    n_rows: int
    seed: int
    assign: Literal["random", "contiguous"] = "random"
    user_level: bool = False
    buckets: int = 1

    @property
    def public_rows(self) -> int | None:
        """n where it is public (row level), for progress's rows/s; None at user level."""
        return None if self.user_level else self.n_rows

    def subset_of(self, positions: np.ndarray, units: np.ndarray | None) -> np.ndarray:
        """Subset index of each row, from its global position or its unit id."""
        if self.user_level:
            return unit_subsets(units, self.seed, self.subsets)
        if self.assign == "contiguous":
            return contiguous_row_subsets(positions, self.n_rows, self.subsets)
        return random_row_subsets(positions, self.seed, self.subsets)


@dataclass(frozen=True)
class Shard:
    """Rows of one partition that belong to one bucket, grouped by subset.

    ``rows`` holds ``counts[i]`` rows of subset ``subsets[i]`` for each i in turn
    (ascending ids, present subsets only), each subset's rows in position order;
    ``offset`` is the partition's first global position, so a bucket can join its
    shards in position order. ``rows`` is float32 when that holds the loaded float64
    values exactly (half the bytes to copy and send), else float64.
    """

    offset: int
    subsets: np.ndarray
    counts: np.ndarray
    rows: np.ndarray


@sizeof.register(Shard)
def _shard_bytes(shard: Shard) -> int:
    """What a shard holds, so workers count (and can spill) shuffled rows."""
    return int(shard.rows.nbytes + shard.subsets.nbytes + shard.counts.nbytes)


def bucket_range(plan: SubsetPlan, bucket: int) -> tuple[int, int]:
    """Subsets ``[lo, hi)`` of one bucket: subset j goes to bucket ⌊j·buckets/t⌋."""
    t, b = plan.subsets, plan.buckets
    return -(-bucket * t // b), -(-(bucket + 1) * t // b)


def shipping_rows(rows: np.ndarray) -> np.ndarray:
    """A float32 copy of ``rows`` when it is exact (as for data read from float32
    Parquet), else ``rows`` itself: the bucket widens back to the same float64 values.

    Cast and checked in cache-sized blocks of rows (≈ 1.6× faster than whole-array
    cast then compare), stopping at the first block that float32 does not hold.
    """
    narrow = np.empty(rows.shape, dtype=np.float32)
    step = max(1, 2**16 // max(rows.shape[1], 1))
    for start in range(0, rows.shape[0], step):
        block = slice(start, start + step)
        with np.errstate(over="ignore", under="ignore"):  # inf or 0 here: not exact
            narrow[block] = rows[block]
        if not np.array_equal(narrow[block], rows[block]):
            return rows
    return narrow


def subset_order(
    plan: SubsetPlan, n_rows: int, units: Any, offset: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stable order of a partition's rows by subset, rows per subset, and each subset's
    first index in that order (t + 1 edges): each subset's rows stay in position order."""
    positions = offset + np.arange(n_rows, dtype=np.int64)
    subset = plan.subset_of(positions, units)
    # The narrowest unsigned type that holds every id: a radix sort below 2¹⁶ subsets.
    keys = subset.astype(np.min_scalar_type(max(plan.subsets - 1, 0)))
    order = np.argsort(keys, kind="stable")
    counts = np.bincount(subset, minlength=plan.subsets)
    return order, counts, np.concatenate([[0], np.cumsum(counts)])


def split_partition(plan: SubsetPlan, loader: Loader, part: Any, offset: int) -> tuple[Shard, ...]:
    """Load one partition (on a worker) and split its rows into the plan's buckets.

    The rows are sorted by subset once (stably, so each subset's rows stay in position
    order); buckets are contiguous ranges of subset ids, so each shard is one slice.
    """
    rows, units = loader(part)
    order, counts, edges = subset_order(plan, rows.shape[0], units, offset)
    ship = shipping_rows(rows)
    del rows
    ship = np.take(ship, order, axis=0)
    shards = []
    for b in range(plan.buckets):
        lo, hi = bucket_range(plan, b)
        present = lo + np.flatnonzero(counts[lo:hi])
        shards.append(Shard(offset, present, counts[present], ship[edges[lo] : edges[hi]]))
    return tuple(shards)


SLICE_MIN_VALUES = 512
"""Mean values per (shard, subset) slice from which a bucket joins each subset's slices;
below it (many small partitions) the cost per slice dominates and it gathers instead."""


def bucket_summaries(
    plan: SubsetPlan, local_step: LocalStep, bucket: int, *shards: Shard
) -> tuple[np.ndarray, np.ndarray]:
    """Run the local step on every subset of one bucket (rows in position order, float64).

    Each subset's block is a fresh float64 array of its rows from every shard, in
    position order, whichever way it is built.
    """
    lo, hi = bucket_range(plan, bucket)
    ordered = sorted(shards, key=lambda s: s.offset)
    slices = sum(len(s.subsets) for s in shards)
    values = sum(s.rows.size for s in shards)
    build = joined_blocks if values >= SLICE_MIN_VALUES * slices else gathered_blocks
    ids = np.arange(lo, hi)
    blocks = build(ordered, lo, hi)
    summaries = [local_step(block, j) for j, block in zip(ids.tolist(), blocks, strict=True)]
    return ids, np.stack(summaries)


def joined_blocks(shards: Sequence[Shard], lo: int, hi: int) -> Iterator[np.ndarray]:
    """Subsets ``lo..hi-1`` one at a time, each joined from its slices of the shards
    (given in position order) and widened to float64 in the same copy: each row is
    copied once; an empty subset is a (0, dim) array."""
    dim = max((s.rows.shape[1] for s in shards), default=0)
    pieces: list[list[np.ndarray]] = [[] for _ in range(hi - lo)]
    for shard in shards:
        ends = np.cumsum(shard.counts).tolist()
        starts = [0, *ends][:-1]
        for j, start, end in zip((shard.subsets - lo).tolist(), starts, ends, strict=True):
            pieces[j].append(shard.rows[start:end])
    for subset_pieces in pieces:
        if subset_pieces:
            yield np.concatenate(subset_pieces, dtype=np.float64)
        else:
            yield np.empty((0, dim))


def gathered_blocks(shards: Sequence[Shard], lo: int, hi: int) -> Iterator[np.ndarray]:
    """The blocks of :func:`joined_blocks`, for shards of many tiny slices: one join of
    the shards as shipped, a stable sort of their rows by subset (position order kept),
    and one gather per subset."""
    rows = np.concatenate([s.rows for s in shards])
    subset = np.concatenate([np.repeat(s.subsets - lo, s.counts) for s in shards])
    order = np.argsort(subset.astype(np.min_scalar_type(max(hi - lo - 1, 0))), kind="stable")
    ends = np.cumsum(np.bincount(subset, minlength=hi - lo)).tolist()
    for start, end in zip([0, *ends][:-1], ends, strict=True):
        yield np.take(rows, order[start:end], axis=0).astype(np.float64, copy=False)


EMPTY_EXPONENT = -(2**20)
"""Scale exponent of a subset with no rows: any other exponent wins when Grams are added."""

ScaledGrams = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Per-subset Gram matrices (t×d×d), row counts (t) and exponents e (t): Gⱼ·4^eⱼ = XⱼᵀXⱼ."""


SAFE_EXPONENT = 400
"""Subsets whose largest |x| is within 2^±400 multiply their raw rows: no product can
overflow, and what underflows is below 2⁻²⁷⁴ of the largest term."""


STACK_FLOATS = 2**17
"""Floats of one zero-padded stack of subsets' rows (1 MiB): a chunk stays cache-sized."""


def partition_grams(
    plan: SubsetPlan, loader: Loader, part: Any, offset: int, right: np.ndarray | None = None
) -> ScaledGrams:
    """Per-subset Gram matrices XⱼᵀXⱼ, row counts and scale exponents of one partition;
    with ``right`` (d×m, or t×d×m: one per subset) the products Xⱼᵀ(XⱼRⱼ) instead.

    Each product is scaled by the power of two that brings its subset's largest |x| into
    [½, 1) (exact), so sums never overflow or underflow whatever the data's magnitude;
    the eigenvectors, hence the summaries, do not depend on the scale. Usual magnitudes
    multiply the raw rows and scale the products after (the same values: powers of two
    commute with rounding); extreme ones scale their subset's rows first.

    The subsets are taken largest first in chunks of :data:`STACK_FLOATS`: each chunk's
    rows are gathered once into a zero-padded stack (zero rows add nothing to a product)
    and multiplied by one batched ``np.matmul``, which loops over BLAS in C, instead of
    one gather and BLAS call per subset in Python (t ≈ 4000 of ~60 rows a partition).
    """
    rows, units = loader(part)
    order, counts, bounds = subset_order(plan, rows.shape[0], units, offset)
    dim = rows.shape[1]
    grams = np.zeros((plan.subsets, dim, dim if right is None else right.shape[-1]))
    exponents = np.full(plan.subsets, EMPTY_EXPONENT, dtype=np.int64)
    present = np.flatnonzero(counts)
    largest_first = present[np.argsort(-counts[present], kind="stable")]
    for chunk in _stack_chunks(counts[largest_first], dim):
        ids = largest_first[chunk]
        stack = _padded_rows(rows, order, counts[ids], bounds[ids])
        exponents[ids], shift = _scale_exponents(stack)
        grams[ids] = scaled(_stacked_product(stack, right, ids), shift)
    return grams, counts, exponents


def _stack_chunks(sizes: np.ndarray, dim: int) -> Iterator[slice]:
    """Runs of subsets (``sizes`` rows each, largest first) whose padded stack holds about
    :data:`STACK_FLOATS` floats: the run's first subset sets its rows per subset."""
    start = 0
    while start < len(sizes):
        step = max(1, STACK_FLOATS // max(int(sizes[start]) * dim, 1))
        yield slice(start, start + step)
        start += step


def _padded_rows(
    rows: np.ndarray, order: np.ndarray, counts: np.ndarray, starts: np.ndarray
) -> np.ndarray:
    """c × max(counts) × d stack: subset i's rows ``order[starts[i]:][:counts[i]]`` in
    order, then zero rows."""
    slots = np.arange(counts.max())
    held = slots < counts[:, None]
    stack = np.take(rows, order[np.where(held, starts[:, None] + slots, 0)], axis=0)
    stack[~held] = 0.0
    return stack


def _scale_exponents(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each subset's exponent e (its largest |x| in [2^(e-1), 2^e); empty if all its rows are
    zero) and the shift its product takes after; extreme subsets' rows are scaled by 2^-e in
    place first (shift 0)."""
    flat = stack.reshape(len(stack), -1)
    peaks = np.maximum(flat.max(axis=1, initial=0.0), -flat.min(axis=1, initial=0.0))
    nonzero = peaks > 0
    exponents = np.where(nonzero, np.frexp(peaks)[1], EMPTY_EXPONENT).astype(np.int64)
    extreme = nonzero & (np.abs(exponents) >= SAFE_EXPONENT)
    for i in np.flatnonzero(extreme):  # the raw product may overflow: scale rows first
        stack[i] = np.ldexp(stack[i], -exponents[i])
    return exponents, np.where(nonzero & ~extreme, -2 * exponents, 0)


def _stacked_product(stack: np.ndarray, right: np.ndarray | None, ids: np.ndarray) -> np.ndarray:
    """BᵀB of each stacked block (both halves equal: the lower copied from the upper), or
    Bᵀ(B·R), R the subset's own matrix when ``right`` is stacked."""
    left = stack.transpose(0, 2, 1)
    if right is None:
        product = np.matmul(left, stack)
        lower = np.tri(stack.shape[2], k=-1, dtype=bool)
        return np.where(lower, product.transpose(0, 2, 1), product)
    if right.ndim == 3:
        return np.matmul(left, np.matmul(stack, right[ids]))
    projected = (stack.reshape(-1, stack.shape[2]) @ right).reshape(*stack.shape[:2], -1)
    return np.matmul(left, projected)


def no_grams(subsets: int, dim: int, width: int | None = None) -> ScaledGrams:
    """The Grams (or d×width products) of ``subsets`` subsets without rows: zero, counted
    0, exponent empty."""
    exponents = np.full(subsets, EMPTY_EXPONENT, dtype=np.int64)
    shape = (subsets, dim, dim if width is None else width)
    return np.zeros(shape), np.zeros(subsets, dtype=np.int64), exponents


def add_grams(a: ScaledGrams, b: ScaledGrams) -> ScaledGrams:
    """Sum two partitions' per-subset Gram matrices and counts (a node of the tree)."""
    exponents = np.maximum(a[2], b[2])
    shift_a = np.maximum(2 * (a[2] - exponents), EMPTY_EXPONENT)
    shift_b = np.maximum(2 * (b[2] - exponents), EMPTY_EXPONENT)
    return scaled(a[0], shift_a) + scaled(b[0], shift_b), a[1] + b[1], exponents


def scaled(stack: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``np.ldexp(stack, shift)`` per subset (a t × d × w stack, t exponents), bit for bit, as
    one multiply per float by the exact ``2^shift`` instead of a libm call per float: both
    are the correctly rounded ``x·2^shift``. Subsets shifted below 2⁻¹⁰²², where ``2^shift`` is
    subnormal or 0 (an empty subset's, or magnitudes 10³⁰⁰ apart), keep ``np.ldexp``."""
    out = stack * np.ldexp(1.0, np.maximum(shift, -1022))[:, None, None]
    tiny = np.flatnonzero(shift < -1022)
    if len(tiny):
        out[tiny] = np.ldexp(stack[tiny], shift[tiny][:, None, None])
    return out


GROUP_ROWS_PER_FLOAT = 8
"""A task sums the per-subset blocks of consecutive partitions holding at least this many
rows per float of one partition's blocks (t·d·width), so the blocks' cost (allocate,
scale, send, add) stays small beside reading the rows."""


def partition_groups(
    offsets: Sequence[int], n_rows: int, block_floats: int, executor: Executor
) -> list[slice]:
    """Runs of consecutive partitions, each summed by one task (:func:`group_grams`).

    Enough runs that every worker gets two, fewer where the partitions are small beside
    the per-subset blocks; each run about the same number of rows. Reads the partition
    offsets (footers) and the cluster's size, never a row value.
    """
    parts = len(offsets)
    if parts == 0:
        return []
    workers = executor.workers
    by_rows = -(-n_rows // max(GROUP_ROWS_PER_FLOAT * block_floats, 1))
    groups = min(parts, max(2 * workers, by_rows))
    starts = np.searchsorted(np.asarray(offsets), np.arange(groups) * n_rows / groups)
    edges = sorted({0, *starts.tolist()}) + [parts]
    return [slice(a, b) for a, b in pairwise(edges) if b > a]


def group_grams(
    plan: SubsetPlan,
    loader: Loader,
    parts: Sequence[Any],
    offsets: Sequence[int],
    right: np.ndarray | None = None,
) -> ScaledGrams:
    """Σ of :func:`partition_grams` over consecutive partitions, read one at a time."""
    total = None
    for part, offset in zip(parts, offsets, strict=True):
        grams = partition_grams(plan, loader, part, offset, right)
        total = grams if total is None else add_grams(total, grams)
        del grams
    assert total is not None, "a group holds at least one partition"
    return total


GRAM_SUMMARY_TASKS = 4
"""The t Grams' local steps are split over this many tasks, so every worker takes a share."""


def gram_summaries(
    local_step: Any, total: ScaledGrams, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray]:
    """Run the local step on the summed Gram matrices of subsets ``lo..hi-1`` (a worker)."""
    grams, counts, _ = total
    ids = np.arange(lo, hi)
    return ids, np.stack([local_step.from_gram(grams[j], int(counts[j]), int(j)) for j in ids])


def compute_subset_summaries_from_grams(
    parts: Sequence[Any],
    offsets: Sequence[int],
    loader: Loader,
    plan: SubsetPlan,
    local_step: Any,
    executor: Executor = IN_PROCESS,
    progress: bool = False,
) -> np.ndarray:
    """Summaries of all subsets via per-subset Gram matrices: no shuffle, memory flat in n.

    For small d (t·d² floats per partition): each partition emits XⱼᵀXⱼ for every subset
    j, the blocks are tree-summed on the workers, and a few worker tasks turn the t Grams
    into t summaries with ``local_step.from_gram``. Exact, like the rows route.
    """
    grams = dask.delayed(group_grams, pure=True)
    dim = local_step.dim
    groups = partition_groups(offsets, plan.n_rows, plan.subsets * dim * dim, executor)
    leaves = [grams(plan, loader, parts[g], offsets[g]) for g in groups]
    if not leaves:  # no rows (refused at row level; at user level n is private): t empty subsets
        leaves = [dask.delayed(no_grams, pure=True)(plan.subsets, local_step.dim)]
    total = tree_sum(leaves, dask.delayed(add_grams, pure=True))
    summarise = dask.delayed(gram_summaries, pure=True)
    cuts = np.linspace(0, plan.subsets, min(GRAM_SUMMARY_TASKS, plan.subsets) + 1).astype(int)
    outputs = [summarise(local_step, total, int(a), int(b)) for a, b in pairwise(cuts)]
    label = f"{len(parts)} partitions in {len(leaves)} runs → per-subset Grams"
    return gather_summaries(
        executor, leaves, outputs, plan.subsets, label, progress, plan.public_rows
    )


def compute_subset_summaries(
    parts: Sequence[Any],
    offsets: Sequence[int],
    loader: Loader,
    plan: SubsetPlan,
    local_step: LocalStep,
    executor: Executor = IN_PROCESS,
    progress: bool = False,
) -> np.ndarray:
    """Summaries of all ``t`` subsets as a t×out_dim array, computed where the data lives."""
    split = dask.delayed(split_partition, pure=True, nout=plan.buckets)
    shards = [
        split(plan, loader, part, offset) for part, offset in zip(parts, offsets, strict=True)
    ]
    summarise = dask.delayed(bucket_summaries, pure=True)
    buckets = [summarise(plan, local_step, b, *[s[b] for s in shards]) for b in range(plan.buckets)]
    label = f"{len(shards)} partitions → {len(buckets)} buckets"
    return gather_summaries(
        executor, shards, buckets, plan.subsets, label, progress, plan.public_rows
    )
