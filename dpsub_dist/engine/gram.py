"""Dask plumbing of the covariance family: per-partition ``XᵀX`` on the workers, summed there.

Each partition task loads its rows with the Dataset's loader, clips every row to norm ≤ B and
scales it by 1/B (:func:`clip_rows`: norms ≤ 1), and adds their ``XᵀX`` (plus their row sum
when centring) into its worker thread's accumulator, one partition after another; the
accumulators are added pairwise in a tree of tasks on the workers, so a worker holds one or
two d×d matrices and the driver receives one :class:`GramSummary` (d×d, and a d-vector)
whatever the number of partitions: never rows. The number of clipped rows is never computed.

User level (``user_level=True``): every user's rows are scaled together so that their squared
norms sum to ≤ 1 (ALGORITHMS.md §0/§7). A first pass sums each user's squared norms per
partition and adds those per-user tables in a tree on the workers; the second pass reads the
rows again and looks up each row's user factor there. Users are told apart by their canonical
ids (:mod:`dpsub_dist.engine.assign`): ids that are equal as float64 but not as integers
stay two users, and rows with a null id belong to no user (the loader drops them). Only
per-user scalars move between workers (every worker holds the whole table: about 100 bytes a
user); the driver gets none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
from dask.sizeof import sizeof
from scipy.linalg.blas import dsyrk

from dpsub_dist.engine.compute import IN_PROCESS, Executor, fold_per_thread, tree_sum
from dpsub_dist.engine.sources import Loader, owns_rows
from dpsub_dist.errors import InputError
from dpsub_dist.linalg import row_norms

if TYPE_CHECKING:
    import pandas as pd  # user level only: imported there, not by every run


@dataclass(frozen=True)
class GramSummary:
    """What reaches the driver: ``Σ xxᵀ`` (d×d) and, when centring, ``Σ x`` (d) of scaled rows."""

    gram: np.ndarray
    row_sum: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.gram.nbytes + (0 if self.row_sum is None else self.row_sum.nbytes))

    def __add__(self, other: GramSummary) -> GramSummary:
        row_sum = None if self.row_sum is None else self.row_sum + other.row_sum
        return GramSummary(self.gram + other.gram, row_sum)


def clip_rows(rows: np.ndarray, bound: float, in_place: bool = False) -> np.ndarray:
    """A float64 copy of the rows, clipped to norm ≤ ``bound`` then scaled by 1/bound (norm ≤ 1).

    Never modifies ``rows`` unless ``in_place`` (float64 rows the caller owns, e.g. from a
    loader that :func:`~dpsub_dist.engine.sources.owns_rows`: the same values, no copy): an
    in-memory loader may hand out the caller's own array.
    """
    rows = np.asarray(rows, dtype=np.float64)
    scale = (1.0 / np.maximum(row_norms(rows), bound))[:, None]
    if in_place:
        rows *= scale
        return rows
    return rows * scale


CLIP_MARGIN = 1.0 - 2.0**-24
"""Factor on :func:`clip_weights` (1 − 6·10⁻⁸): it absorbs the float64 rounding of the norms,
of the weights and (user level) of the per-user totals — at most ``(4D + m + 20)·2⁻⁵³``
relative for D features and m rows of one user, below 2⁻²⁴ while D ≤ 2²⁷ and m ≤ 2²⁸ — so a
weighted row's squared norm is ≤ 1 exactly, not up to rounding."""


def clip_weights(rows: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """The rows (:func:`tame_rows`) and per-row weights ``w = CLIP_MARGIN/max(‖x‖, bound)²``
    (float64), so that ``Σ wᵢ xᵢxᵢᵀ`` is the Gram matrix of the rows clipped to norm ≤
    ``bound`` and scaled by 1/bound (:func:`clip_rows`), shrunk by :data:`CLIP_MARGIN`,
    without materialising them: ``wᵢ‖xᵢ‖² ≤ 1`` holds exactly for the floats ``xᵢ`` used
    (norms computed in float64, also for float32 rows, whose squares and sums cannot
    overflow there). Never modifies ``rows``.

    A norm whose square leaves the float64 range (a bound above :data:`SQUARE_LIMIT`) gets
    ``(√m/‖x‖)²`` instead, which underflows quietly rather than overflowing: an overflow
    warning would tell, on stderr, that some row is that large.
    """
    if rows.dtype == np.float32:
        norms = np.sqrt(np.einsum("ij,ij->i", rows, rows, dtype=np.float64))
    else:
        rows, norms = tame_rows(rows, row_norms(rows), bound)
    largest = np.maximum(norms, bound)
    huge = largest > SQUARE_LIMIT
    if not huge.any():
        return rows, CLIP_MARGIN / largest**2
    weights = np.empty_like(largest)
    weights[~huge] = CLIP_MARGIN / largest[~huge] ** 2
    weights[huge] = (math.sqrt(CLIP_MARGIN) / largest[huge]) ** 2
    return rows, weights


SQUARE_LIMIT = 1e150
"""Norms above this have squares near or past the float64 range (~1.34e154 overflows)."""

TAME_NORM = 1e100
"""Rows of a larger norm are used at this norm (:func:`tame_rows`)."""


def tame_rows(
    rows: np.ndarray, norms: np.ndarray, bound: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` and their ``norms``, except that a row of norm above ``L = max(TAME_NORM,
    bound)`` (or infinite: entries near 1e308) becomes its direction at norm L, in a copy.

    Clipped to any bound ≤ L, both are the same row (clipping keeps only the direction of a
    row above the bound), and they fall in the same bin of a grid below L; but the original
    overflows the products taken before the clipping weights apply (``XV``: inf, then
    inf·0 = NaN, and a run that fails only when some row is that large). Rows in range are
    returned as they are, uncopied."""
    limit = max(TAME_NORM, bound)
    huge = ~(norms <= limit)
    if not huge.any():
        return rows, norms
    rows, norms = np.array(rows, dtype=np.float64), np.array(norms, dtype=np.float64)
    part = rows[huge]
    part /= np.max(np.abs(part), axis=1)[:, None]
    part /= row_norms(part)[:, None]
    rows[huge] = part * limit
    norms[huge] = row_norms(rows[huge])
    return rows, norms


def user_squared_norms(loader: Loader, bound: float | None, part: Any) -> pd.Series:
    """Pass 1 at user level: each user's Σ‖x‖² over this partition's clipped, scaled rows
    (``bound=None``: the raw rows, for the private bound's per-user histogram)."""
    rows, units = loader(part)
    rows = np.asarray(rows, dtype=np.float64) if bound is None else clip_rows(rows, bound)
    squared = np.bincount(
        units.inverse, weights=np.einsum("ij,ij->i", rows, rows), minlength=len(units.keys)
    )
    import pandas as pd

    return pd.Series(squared, index=pd.Index(units.keys, dtype=object))


def add_user_norms(a: pd.Series, b: pd.Series) -> pd.Series:
    """Per-user totals of two partitions' tables."""
    return a.add(b, fill_value=0.0)


def partition_gram(
    loader: Loader,
    bound: float,
    center: bool,
    part: Any,
    user_norms: pd.Series | None = None,
) -> GramSummary:
    """``XᵀX`` (and ``Σ x``) of one partition's clipped, scaled rows.

    With ``user_norms`` (user level), each row is also multiplied by
    ``1/√max(1, Σ‖x‖² of its user)`` so that each user's contribution has trace ≤ 1.
    """
    return finish_gram(partition_gram_into(None, loader, bound, center, part, user_norms))


def partition_gram_into(
    total: GramSummary | None,
    loader: Loader,
    bound: float,
    center: bool,
    part: Any,
    user_norms: pd.Series | None = None,
) -> GramSummary:
    """``total`` plus one partition's :func:`partition_gram`, summed into ``total``'s arrays
    in place (None: a new accumulator); runs on a worker, one link of its accumulator's chain
    (:func:`compute_gram`). The matrix holds the upper triangle only (``syrk``'s):
    :func:`finish_gram` completes it."""
    rows, units = loader(part)
    if not owns_rows(loader):
        rows = np.array(rows, dtype=np.float64)  # a copy of the caller's rows, this task's own
    users = None if user_norms is None else user_scale(units, user_norms)
    dim = rows.shape[1]
    if total is None:
        total = GramSummary(np.zeros((dim, dim), order="F"), np.zeros(dim) if center else None)
    gram, row_sum = total.gram, total.row_sum
    step = max(1, GRAM_BLOCK_BYTES // (8 * max(dim, 1)))
    for start in range(0, len(rows), step):  # clip, scale, sum and syrk while in cache
        block = clip_rows(rows[start : start + step], bound, in_place=True)
        if users is not None:
            block *= users[start : start + step, None]
        if row_sum is not None:
            row_sum += block.sum(axis=0)
        gram = add_gram(gram, block)
    return GramSummary(gram, row_sum)


def add_into(total: GramSummary, other: GramSummary) -> GramSummary:
    """``total + other``, summed into ``total``'s arrays: an accumulator is the input of one
    task only, so a worker adding two holds two D × D matrices, not three."""
    np.add(total.gram, other.gram, out=total.gram)
    if total.row_sum is not None:
        np.add(total.row_sum, other.row_sum, out=total.row_sum)
    return total


def finish_gram(summary: GramSummary) -> GramSummary:
    """The summed upper triangles made the exactly symmetric Gram (in place)."""
    return GramSummary(symmetric(summary.gram), summary.row_sum)


@sizeof.register(GramSummary)
def _sizeof_summary(summary: GramSummary) -> int:
    """Its arrays' bytes, so that Dask places, counts and spills a Gram by its size."""
    return summary.nbytes


GRAM_BLOCK_BYTES = 2 * 2**20
"""Rows :func:`partition_gram` clips and sums at a time (a cache-sized block): the clip, the
sum and the ``syrk`` of a partition each read it from memory once more (250,000 × 32 rows,
in process, the task with its decode: 0.052 → 0.047 s; 62,500 × 128: 0.070 → 0.064 s;
25,000 × 512: 0.216 → 0.211 s; ``full_pass_task`` of bench.passes, docs/history.md)."""


def user_scale(units: Any, user_norms: pd.Series) -> np.ndarray:
    """Each row's factor ``1/√max(1, Σ‖x‖² of its user)`` on its clipped, scaled form, the
    totals from :func:`user_squared_norms` summed over all partitions: every user's rows then
    have squared norms summing to ≤ 1 (user level; also ``--method power``)."""
    return 1.0 / np.sqrt(user_totals(units, user_norms))


def user_totals(units: Any, user_norms: pd.Series) -> np.ndarray:
    """Each row's ``max(1, Σ‖x‖² of its user)`` (the totals of :func:`user_squared_norms`)."""
    index = user_norms.index.get_indexer(units.keys)
    if (index < 0).any():  # pragma: no cover - pass 1 saw every user
        raise RuntimeError("a user is missing from the per-user norms: the input changed")
    return np.maximum(user_norms.to_numpy()[index][units.inverse], 1.0)


def gram_of(rows: np.ndarray) -> np.ndarray:
    """``XᵀX`` (exactly symmetric) by BLAS ``syrk``: half the flops of a general product."""
    return symmetric(dsyrk(1.0, np.asarray(rows, dtype=np.float64).T, lower=0))


def add_gram(total: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``total + XᵀX`` in the upper triangle (``syrk`` accumulating in place where ``total``
    is a Fortran-ordered float64 D × D), for sums over many small blocks of float64 rows;
    :func:`symmetric` completes the sum."""
    return dsyrk(1.0, rows.T, beta=1.0, c=total, lower=0, overwrite_c=1)


SYMMETRIC_BLOCK = 512
"""Columns copied at a time by :func:`symmetric` (a 512 × D strip: 41 MB at D = 10⁴)."""


def symmetric(upper: np.ndarray) -> np.ndarray:
    """The exactly symmetric matrix of ``syrk``'s upper triangle, written over ``upper``'s
    lower triangle in place (strips of :data:`SYMMETRIC_BLOCK` columns): no D × D temporary.
    The earlier ``triu(U) + triu(U, 1)ᵀ`` held three more D × D copies, 2.4 GB at D = 10⁴ on
    top of a worker's 0.8 GB Gram. Returns ``upper``."""
    dim = upper.shape[0]
    for start in range(0, dim, SYMMETRIC_BLOCK):
        stop = min(start + SYMMETRIC_BLOCK, dim)
        square = upper[start:stop, start:stop]
        lower = np.tril_indices(stop - start, -1)
        square[lower] = square.T[lower]
        upper[stop:, start:stop] = upper[start:stop, stop:].T
    return upper


def one_key(value: Any) -> Any:
    """``value`` (a loader, say) as one key of the graph that every task takes as an input:
    shipped to each worker once, not inside every task, and never walked by Dask. A loader
    passed to each task directly is searched for collections on every call
    (``dask.delayed``'s ``unpack_collections``): an array source's column names, 10⁵ at
    D = 10⁵, cost about 0.26 s of the driver's CPU per task (docs/history.md, "Where the workers
    wait")."""
    return dask.delayed(value, pure=True, traverse=False)


def sum_on_workers(tasks: list, executor: Executor, label: str, progress: bool) -> Any:
    """Σ of the delayed ``tasks`` (arrays), tree-summed on the workers; only the sum
    reaches the driver."""
    root = tree_sum(tasks, dask.delayed(np.add, pure=True), tasks)
    return executor.compute(root, tasks, label, progress)


def sum_per_worker(
    function: Callable[..., np.ndarray],
    parts: Sequence[Any],
    executor: Executor,
    label: str,
    *args: Any,
) -> np.ndarray:
    """Σ over ``parts`` of ``function(part, *args)`` (each a new array), one accumulator per
    worker thread (:func:`~dpsub_dist.engine.compute.fold_per_thread`): for summaries of a
    Gram's size, of which a tree over the partitions' own (:func:`sum_on_workers`) holds every
    one that waits for its partner. ``function`` and ``args`` are shipped once each."""
    shared = [one_key(value) for value in (function, *args)]
    add = dask.delayed(_add_value, pure=True)
    tasks: list = []
    root = fold_per_thread(
        parts,
        lambda total, part: add(total, part, *shared),
        dask.delayed(_add_arrays, pure=True),
        executor,
        tasks,
    )
    return executor.compute(root, tasks, label, False)


def _add_value(total: np.ndarray | None, part: Any, function: Callable, *args: Any) -> np.ndarray:
    value = function(part, *args)
    return value if total is None else _add_arrays(total, value)


def _add_arrays(total: np.ndarray, other: np.ndarray) -> np.ndarray:
    return np.add(total, other, out=total)


def compute_gram(
    parts: Sequence[Any],
    loader: Loader,
    bound: float,
    center: bool = False,
    user_level: bool = False,
    executor: Executor = IN_PROCESS,
    progress: bool = False,
) -> GramSummary:
    """The Gram matrix (and row sum) of all clipped, scaled rows, reduced on the workers: one
    accumulator per worker thread that each of its partitions is added into, then a tree over
    the accumulators (:func:`~dpsub_dist.engine.compute.fold_per_thread`), so a worker holds
    one or two D × D matrices whatever the number of partitions."""
    if not parts:
        raise InputError("the input has no rows: pass a dataset with at least one row")
    if not (np.isfinite(bound) and bound > 0):
        raise InputError(f"row norm bound must be a positive number (got {bound})")
    if user_level and center:
        raise InputError("centring is not available at user level: drop --center")
    tasks: list = []
    user_norms = None
    loader = one_key(loader)
    if user_level:
        norms = dask.delayed(user_squared_norms, pure=True)
        tasks += [norms(loader, bound, part) for part in parts]
        user_norms = tree_sum(tasks, dask.delayed(add_user_norms, pure=True), tasks)
    add_part = dask.delayed(partition_gram_into, pure=True)
    chained = fold_per_thread(
        parts,
        lambda total, part: add_part(total, loader, bound, center, part, user_norms),
        dask.delayed(add_into, pure=True),
        executor,
        tasks,
    )
    root = dask.delayed(finish_gram, pure=True)(chained)
    tasks.append(root)
    label = f"{len(parts)} partitions → Gram"
    return executor.compute(root, tasks, label, progress)
