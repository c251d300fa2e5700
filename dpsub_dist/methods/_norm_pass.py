"""The workers' half of the private row-norm bound: counts per bin of the public norm grid,
summed on the workers (:mod:`dpsub_dist.privacy.norm_bound` is the driver's half). Only the
grid's 102 integer counts reach the driver (operator-only, never published).

:class:`LevelSums` fuses the bound of a mean with the mean's clipped sum (one read of the rows
instead of two): the same counts, and per bin the rows' sum and their sum scaled to unit norm,
from which the clipped sum at any grid value follows. They stay on the workers; the driver
receives the counts, then the one clipped sum at the bound it released.

:class:`LevelGrams` does the same for the covariance family's bound and Gram (issue #16): per
non-empty bin, ``Σ yyᵀ`` and ``Σ yyᵀ/‖y‖²``, from which the clipped Gram at any grid value
follows; the driver receives the counts, then the one Gram at the bound it released.

:class:`LevelProducts` does the same for ``--method power``'s bound and first iteration
(issue #17): per non-empty bin, ``Σ x(xᵀV₀)`` and ``Σ x(xᵀV₀)/‖x‖²`` for the public start
``V₀`` (``D × k′`` each), from which the first product ``C V₀`` at any grid value follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
from scipy import sparse

from dpsub_dist.engine.compute import Executor, tree_sum
from dpsub_dist.engine.gram import (
    CLIP_MARGIN,
    add_gram,
    add_user_norms,
    one_key,
    sum_on_workers,
    symmetric,
    user_squared_norms,
)
from dpsub_dist.engine.sources import Loader
from dpsub_dist.linalg import row_norms
from dpsub_dist.privacy.norm_bound import GRID, norm_counts, norm_histogram

NORM_SOURCE = (
    "private (step {step}): the smallest value 2^-10·√2^j (j = 0…100) at which the noisy "
    "count of rows with norm ≤ it reaches q·n (sparse vector), q = {q:.6g} from public n, D, "
    "ε, δ (1 − q = clip(16σ√D/n, 20/(ε_norm·n), 0.5); 0.99 for a mean's bound)"
)

USER_NORM_SOURCE = (
    "private at user level (step norm_bound): a noisy user count ñ (half of the step), then "
    "the smallest value 2^-10·√2^j (j = 0…100) at which the noisy count of users with "
    "√Σ‖x‖² ≤ it reaches q·ñ (sparse vector, the other half), q = {q:.6g} from ñ, D, ε, δ"
)


def compute_norm_counts(
    parts: list[Any], loader: Loader, executor: Executor, progress: bool
) -> np.ndarray:
    """Row counts per bin of the public norm grid (:func:`norm_counts`), summed on the workers."""
    count = dask.delayed(_partition_norm_counts, pure=True)
    shared = one_key(loader)
    tasks = [count(shared, part) for part in parts]
    return sum_on_workers(tasks, executor, f"{len(parts)} partitions → row-norm counts", progress)


def _partition_norm_counts(loader: Loader, part: Any) -> np.ndarray:
    return norm_counts(loader(part)[0])


def compute_user_norm_counts(
    parts: list[Any], loader: Loader, executor: Executor, progress: bool
) -> np.ndarray:
    """Counts of users per bin of the public grid by ``√Σ‖x‖²`` over their rows: the per-user
    tables are summed in a tree on the workers and binned there."""
    squares = dask.delayed(user_squared_norms, pure=True)
    shared = one_key(loader)
    tasks = [squares(shared, None, part) for part in parts]
    total = tree_sum(tasks, dask.delayed(add_user_norms, pure=True), tasks)
    root = dask.delayed(_user_histogram, pure=True)(total)
    label = f"{len(parts)} partitions → per-user norm counts"
    return executor.compute(root, tasks, label, progress)


def _user_histogram(totals: Any) -> np.ndarray:
    return norm_histogram(np.sqrt(np.asarray(totals, dtype=np.float64)))


LEVEL_SUMS_BYTES = 16 * 2**20
"""Fuse a bound with its clipped sum only while a partition's :class:`LevelSums` (2 × 102 × D
floats) take at most this many bytes: up to D ≈ 10,000 (public: D only)."""


@dataclass(frozen=True)
class LevelSums:
    """Per bin of the public norm grid (bins as :func:`norm_counts`): the row count, ``Σ x``
    and ``Σ x/‖x‖`` over the bin's rows. Held on the workers: a bin may hold a single row."""

    counts: np.ndarray
    rows: np.ndarray
    unit_rows: np.ndarray

    def __add__(self, other: LevelSums) -> LevelSums:
        return LevelSums(
            self.counts + other.counts, self.rows + other.rows, self.unit_rows + other.unit_rows
        )

    def clipped_sum(self, bound: float) -> np.ndarray:
        """``Σ x/max(‖x‖, bound)`` (:func:`clip_rows`, summed) for ``bound`` in the grid: rows
        with norm ≤ bound (bins ≤ its index) are scaled by 1/bound, the others by 1/‖x‖.
        Equal to the separate pass up to float rounding (the sums are grouped by bin)."""
        index = grid_index(bound)
        inside = self.rows[: index + 1].sum(axis=0) * (1.0 / bound)
        return inside + self.unit_rows[index + 1 :].sum(axis=0)


def grid_index(bound: float) -> int:
    """The index of ``bound`` in the public grid: rows with norm ≤ bound lie in bins ≤ it
    (:func:`norm_counts`: bin j holds norms in (grid_{j-1}, grid_j])."""
    index = int(np.searchsorted(GRID, bound))
    if index >= len(GRID) or GRID[index] != bound:
        raise ValueError(f"{bound} is not a value of the norm grid")
    return index


def norm_bins(norms: np.ndarray) -> np.ndarray:
    """Each norm's bin of the public grid, as :func:`norm_counts` bins it."""
    return np.searchsorted(GRID, norms, side="left")


def fuse_level_sums(dim: int) -> bool:
    """Whether a mean's bound and its sum take one read (:data:`LEVEL_SUMS_BYTES`)."""
    return 2 * (len(GRID) + 1) * dim * 8 <= LEVEL_SUMS_BYTES


def partition_level_sums(loader: Loader, part: Any) -> LevelSums:
    """One partition's :class:`LevelSums` (runs on a worker)."""
    rows = np.asarray(loader(part)[0], dtype=np.float64)
    norms = row_norms(rows)
    bins = norm_bins(norms)
    shape, where = (len(GRID) + 1, len(rows)), (bins, np.arange(len(rows)))
    unit = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return LevelSums(
        norm_histogram(norms),
        sparse.csr_matrix((np.ones(len(rows)), where), shape=shape) @ rows,
        sparse.csr_matrix((unit, where), shape=shape) @ rows,
    )


def compute_level_sums(
    parts: list[Any], loader: Loader, executor: Executor, progress: bool
) -> tuple[np.ndarray, Any]:
    """The norm counts (to the driver) and the held :class:`LevelSums` of all rows (a
    delayed value on the workers, for :func:`gather_clipped_sum`)."""
    label = f"{len(parts)} partitions → row-norm counts and clipped sums"
    return held_levels(
        partition_level_sums, LevelSums.__add__, parts, loader, executor, progress, label
    )


def held_levels(
    partition: Any,
    add: Any,
    parts: list[Any],
    loader: Loader,
    executor: Executor,
    progress: bool,
    label: str,
    *extra: Any,
) -> tuple[np.ndarray, Any]:
    """One read: ``partition(loader, part, *extra)`` per part, tree-summed by ``add`` and held
    on the workers; only the summed counts reach the driver."""
    shared = one_key(loader)
    tasks = [dask.delayed(partition, pure=True)(shared, part, *extra) for part in parts]
    root = tree_sum(tasks, dask.delayed(add, pure=True), tasks)
    (held,) = executor.persist([root])  # runs the pass; progress counts its one output
    counts = dask.delayed(_counts, pure=True)(held)
    return executor.compute(counts, [], label, progress), held


def gather_clipped_sum(held: Any, bound: float, executor: Executor) -> np.ndarray:
    """The clipped sum at the released ``bound``, computed where the level sums are held."""
    return _gather(held, LevelSums.clipped_sum, bound, executor, "clipped row sum")


def gather_clipped_gram(held: Any, bound: float, executor: Executor) -> np.ndarray:
    """The clipped Gram at the released ``bound``, computed where the per-bin Grams are held:
    only that D × D matrix reaches the driver."""
    return _gather(held, LevelGrams.clipped_gram, bound, executor, "clipped Gram")


def _gather(held: Any, at_bound: Any, bound: float, executor: Executor, label: str) -> Any:
    return executor.compute(dask.delayed(at_bound, pure=True)(held, bound), [], label, False)


def gather_clipped_product(held: Any, bound: float, executor: Executor) -> np.ndarray:
    """The first power iteration's ``C V₀`` at the released ``bound``, computed where the
    per-bin products are held: only that D × k′ matrix reaches the driver."""
    return _gather(held, LevelProducts.clipped_product, bound, executor, "first C·V")


def _counts(held: LevelSums | LevelGrams) -> np.ndarray:
    return held.counts


LEVEL_GRAMS_BYTES = 64 * 2**20
"""Fuse a bound with its Gram only while a partition's :class:`LevelGrams` can take at most
this many bytes whatever the data: 2 × 102 × D² floats if every bin holds a row, so up to
D = 202 (public: D only). Rows usually fill a few bins, so the held sums are a few D × D."""


def fuse_level_grams(dim: int) -> bool:
    """Whether a bound and the Gram of the rows clipped to it take one read
    (:data:`LEVEL_GRAMS_BYTES`, a function of D only)."""
    return 2 * (len(GRID) + 1) * dim * dim * 8 <= LEVEL_GRAMS_BYTES


@dataclass(frozen=True)
class LevelGrams:
    """Per bin of the public norm grid (bins as :func:`norm_counts`): the row count, and for
    the bins ``levels`` that hold a row, ``Σ yyᵀ`` (``raw``) and ``Σ yyᵀ/‖y‖²`` (``unit``)
    over the bin's rows (``len(levels) × D × D`` each). Held on the workers: a bin may hold a
    single row."""

    counts: np.ndarray
    levels: np.ndarray
    raw: np.ndarray
    unit: np.ndarray

    def __add__(self, other: LevelGrams) -> LevelGrams:
        counts = self.counts + other.counts
        if np.array_equal(self.levels, other.levels):
            return type(self)(counts, self.levels, self.raw + other.raw, self.unit + other.unit)
        levels = np.union1d(self.levels, other.levels)
        raw = np.zeros((len(levels), *self.raw.shape[1:]))
        unit = np.zeros_like(raw)
        for part in (self, other):
            where = np.searchsorted(levels, part.levels)
            raw[where] += part.raw
            unit[where] += part.unit
        return type(self)(counts, levels, raw, unit)

    def clipped_gram(self, bound: float) -> np.ndarray:
        """``Σ cc ᵀ`` over ``c = y/max(‖y‖, bound)`` (:func:`~dpsub_dist.engine.gram.clip_rows`,
        then :func:`~dpsub_dist.engine.gram.gram_of`, summed) for ``bound`` in the grid: rows
        in bins ≤ its index (norm ≤ bound; a row exactly on the bound included, where both
        forms agree) add ``Σ yyᵀ/bound²``, the others ``Σ yyᵀ/‖y‖²``. Equal to the separate
        pass up to float rounding (the rows are added by bin, then scaled)."""
        inside = self.levels <= grid_index(bound)
        scale = 1.0 / bound
        return self.raw[inside].sum(axis=0) * (scale * scale) + self.unit[~inside].sum(axis=0)


LEVEL_GRAMS_CHUNK_BYTES = 4 * 2**20
"""Rows a partition's :class:`LevelGrams` sorts and sums at a time (a cache-sized block)."""


def partition_level_grams(loader: Loader, part: Any) -> LevelGrams:
    """One partition's :class:`LevelGrams` (runs on a worker). Block by block of rows: the
    block sorted by bin, then per bin two accumulating ``syrk`` (its rows, then the same rows
    scaled to unit norm), so the rows are gathered and scaled while in cache."""
    rows = np.asarray(loader(part)[0], dtype=np.float64)
    norms = row_norms(rows)
    bins = norm_bins(norms).astype(np.uint8)  # ≤ 101: argsort sorts by radix
    counts = np.bincount(bins, minlength=len(GRID) + 1).astype(np.int64)
    levels = np.flatnonzero(counts)
    dim = rows.shape[1]
    raw = [np.zeros((dim, dim), order="F") for _ in levels]
    unit = [np.zeros((dim, dim), order="F") for _ in levels]
    slot = dict(zip(levels.tolist(), range(len(levels)), strict=True))
    unit_scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    step = max(1, LEVEL_GRAMS_CHUNK_BYTES // (8 * max(dim, 1)))
    # One buffer for every chunk's sorted copy: a new block per chunk costs page faults on a
    # Dask worker, whose nanny's MALLOC_TRIM_THRESHOLD_ returns each freed block to the OS.
    buffer = np.empty((min(step, len(rows)), dim))
    for start in range(0, len(rows), step):
        chunk = slice(start, start + step)
        order = np.argsort(bins[chunk], kind="stable")
        block = np.take(rows[chunk], order, axis=0, out=buffer[: len(order)])
        scale = unit_scale[chunk][order]
        sizes = np.bincount(bins[chunk], minlength=len(GRID) + 1)
        present = np.flatnonzero(sizes)
        stops = np.cumsum(sizes[present])
        for level, stop, size in zip(present.tolist(), stops, sizes[present], strict=True):
            i, own = slot[level], block[stop - size : stop]
            raw[i] = add_gram(raw[i], own)
            own *= scale[stop - size : stop, None]  # block is this chunk's own copy
            unit[i] = add_gram(unit[i], own)
    shape = (len(levels), dim, dim)
    return LevelGrams(
        counts,
        levels,
        np.array([symmetric(m) for m in raw]).reshape(shape),
        np.array([symmetric(m) for m in unit]).reshape(shape),
    )


def compute_level_grams(
    parts: list[Any], loader: Loader, executor: Executor, progress: bool
) -> tuple[np.ndarray, Any]:
    """The norm counts (to the driver) and the held :class:`LevelGrams` of all rows (a
    delayed value on the workers, for :func:`gather_clipped_gram`): one read."""
    label = f"{len(parts)} partitions → row-norm counts and per-bin Grams"
    return held_levels(
        partition_level_grams, LevelGrams.__add__, parts, loader, executor, progress, label
    )


LEVEL_PRODUCTS_BYTES = 2 * 2**30
"""Fuse power's bound with its first iteration only while a partition's (or a tree node's)
:class:`LevelProducts` can take at most this many bytes whatever the data: 2 × 102 × D × k′
floats if every bin holds a row (public: D and k′ only), so up to D·k′ ≈ 1.3·10⁶ (D = 10⁵ at
the default k′ = 11: 1.8 GB in that worst case). Rows usually fill a few bins: 17.6 MB per
filled bin there, against a generated block of 400 MB."""


def fuse_level_products(dim: int, width: int) -> bool:
    """Whether power's bound and first product ``C V₀`` take one read
    (:data:`LEVEL_PRODUCTS_BYTES`, a function of D and k′ only)."""
    return 2 * (len(GRID) + 1) * dim * width * 8 <= LEVEL_PRODUCTS_BYTES


class LevelProducts(LevelGrams):
    """:class:`LevelGrams` times the public start ``V₀`` (``D × k′``): per bin holding a row,
    ``Σ x(xᵀV₀)`` (``raw``) and ``Σ x(xᵀV₀)/‖x‖²`` (``unit``), ``len(levels) × D × k′``
    each, float64. Held on the workers: a bin may hold a single row."""

    def clipped_product(self, bound: float) -> np.ndarray:
        """``Σ w x(xᵀV₀)`` with ``w = m/max(‖x‖, bound)²`` (m = :data:`CLIP_MARGIN`, as
        :func:`~dpsub_dist.engine.gram.clip_weights` weighs each row) for ``bound`` in the
        grid: ``m·(Σ_{bins ≤ bound} raw/bound² + Σ_{bins > bound} unit)``
        (:meth:`LevelGrams.clipped_gram`; a row exactly on the bound is in the bin ≤ it, where
        both forms agree). Equal to the separate pass's product up to float rounding."""
        return CLIP_MARGIN * self.clipped_gram(bound)


def level_products(rows: np.ndarray, norms: np.ndarray, basis: np.ndarray) -> LevelProducts:
    """One partition's :class:`LevelProducts` (runs on a worker) from its rows in their own
    precision and their float64 ``norms`` (the counting pass's: the bins of
    :func:`norm_counts`). ``P = XV₀`` and ``P/‖x‖²`` are formed once (``r × 2k′``, SGEMM for
    float32 rows as :func:`~dpsub_dist.methods.power._product`), then per filled bin one
    ``X_bᵀ[P_b, P_b/‖x‖²]`` from a copy of the bin's rows: the same flops as an iteration's
    ``Xᵀ(w ⊙ P)`` plus one copy of the block (measured at D = 10⁵, 1000 rows over 8 bins: as
    fast as that product, docs/power.md)."""
    bins = norm_bins(norms)
    counts = np.bincount(bins, minlength=len(GRID) + 1).astype(np.int64)
    levels = np.flatnonzero(counts)
    dim, width = basis.shape
    dtype = np.float32 if rows.dtype == np.float32 else np.float64
    projected = rows @ basis.astype(dtype, copy=False)
    unit = np.divide(1.0, norms * norms, out=np.zeros_like(norms), where=norms > 0)
    both = np.concatenate([projected, (projected * unit[:, None]).astype(dtype)], axis=1)
    order = np.argsort(bins, kind="stable")
    raw = np.zeros((len(levels), dim, width))
    scaled = np.zeros_like(raw)
    stops = np.cumsum(counts[levels])
    for i, (stop, size) in enumerate(zip(stops.tolist(), counts[levels].tolist(), strict=True)):
        own = order[stop - size : stop]
        product = rows[own].T @ both[own]
        raw[i], scaled[i] = product[:, :width], product[:, width:]
    return LevelProducts(counts, levels, raw, scaled)
