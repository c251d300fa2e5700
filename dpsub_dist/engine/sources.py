"""Data sources as partitions: Parquet files (read on the workers) or in-memory arrays."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
import numpy as np

from dpsub_dist.engine.assign import unit_type_supported
from dpsub_dist.engine.compute import Executor
from dpsub_dist.errors import InputError
from dpsub_dist.io.parquet import (
    CLI_OPTIONS,
    ColumnChoice,
    ColumnInfo,
    FileInfo,
    OptionNames,
    PartReader,
    check_finite,
    choose_columns,
    column_widths,
    feature_count,
    feature_name,
    first_row_widths,
    inspect_file,
    list_parquet_files,
    plan_parts,
    select_columns,
    widths_in_rows,
)
from dpsub_dist.io.storage import StorageOptions

ARRAY_PART_ROWS = 1_000_000

Loader = Callable[[Any], tuple[np.ndarray, Any]]
"""Loads one partition (on a worker): its float64 rows, and its rows' user ids or None."""


def owns_rows(loader: Loader) -> bool:
    """Whether every call of ``loader`` returns a new float64 array of rows that no one else
    holds (its ``OWNS_ROWS``: the Parquet reader, the centred loader), which the caller may
    then modify in place instead of copying (a partition-sized copy saved per pass)."""
    return bool(getattr(loader, "OWNS_ROWS", False))


def load_native(loader: Loader, part: Any) -> tuple[np.ndarray, Any]:
    """A partition's rows in the source's own precision where the loader has one (its
    ``native`` method: float32 blocks stay float32, no float64 copy), else ``loader(part)``.
    For readers only: the rows may be the caller's own array, never to be modified."""
    native = getattr(loader, "native", None)
    return loader(part) if native is None else native(part)


@dataclass
class Dataset:
    """Partitions of a table, where they are loaded, and public facts about it.

    ``columns`` are the source columns; ``widths`` (None: all scalar) gives each one's
    width, None for a scalar column, so a vector column ``x`` of width 10⁵ is one entry
    in ``columns`` and 10⁵ features in ``dim``.
    """

    parts: list[Any]
    offsets: list[int]
    loader: Any
    columns: list[str]
    n_rows: int
    input: str
    files: int = 0
    widths: list[int | None] | None = None
    left_out: dict[str, str] = field(default_factory=dict)
    """Columns the default rule left out, with the reason (:class:`ColumnChoice`)."""
    widths_from_rows: tuple[str, ...] = ()
    """Variable list columns: their width (so ``dim``) was read from a row, not the schema."""
    sampled_centre: bool = True
    """Whether gauss may centre on a sample of these partitions (boosting clears it where its
    groups would not all take that route, so that every group runs one plan)."""
    refined_centre: bool = True
    """Whether a wide table's centre may take the refinement steps (boosting clears it where
    its groups would not all take them: one plan for every group)."""

    @property
    def dim(self) -> int:
        """Number of features: the total width of the columns."""
        return feature_count(self.columns, self.widths)

    @property
    def vector_columns(self) -> dict[str, int]:
        """Width of each vector column, by name (empty for scalar-only data)."""
        pairs = zip(self.columns, self.widths or [], strict=False)
        return {name: width for name, width in pairs if width is not None}

    def feature_name(self, j: int) -> str:
        """Name of feature ``j``: its column, or ``x[17]`` for element 17 of vector x."""
        return feature_name(self.columns, self.widths, j)


@dataclass(frozen=True)
class FooterColumns:
    """The columns a run reads, as the footers alone tell them (public): the choice, the
    list columns whose width only their rows tell, and the feature count of the others."""

    choice: ColumnChoice
    from_rows: list[str]
    fixed_features: int


@dataclass(frozen=True)
class Footers:
    """A Parquet dataset's files and each one's footer: what is public before any row is read."""

    files: list[str]
    infos: list[FileInfo]

    @property
    def n_rows(self) -> int:
        """The row count the footers state."""
        return sum(info.num_rows for info in self.infos)

    def columns(
        self,
        requested: Sequence[str] | None,
        unit_column: str | None = None,
        exclude: Sequence[str] | None = None,
        options: OptionNames = CLI_OPTIONS,
    ) -> FooterColumns:
        """The columns :func:`parquet_dataset` will read (:func:`select_columns`), without
        reading a row."""
        choice = select_columns(self.infos, requested, unit_column, exclude, options)
        from_rows = widths_in_rows(self.infos, choice.used)
        fixed = [name for name in choice.used if name not in from_rows]
        return FooterColumns(
            choice, from_rows, feature_count(fixed, column_widths(self.infos, fixed))
        )


def read_footers(uri: str, storage_options: StorageOptions | None, executor: Executor) -> Footers:
    """List the files (driver) and read their footers (``executor``: workers, or in process)."""
    files = list_parquet_files(uri, storage_options)
    return Footers(files, executor.map(inspect_file, files, storage_options=storage_options))


def parquet_dataset(
    uri: str,
    columns: list[str] | None,
    unit_column: str | None,
    storage_options: dict[str, Any] | None,
    executor: Executor | Any | None,
    exclude: list[str] | None = None,
    options: OptionNames = CLI_OPTIONS,
    footers: Footers | None = None,
) -> Dataset:
    """List the files (driver), read their footers (workers), choose the columns
    (``exclude``: names or patterns removed from them, see :func:`choose_columns`; ``options``:
    how the caller's door spells them in messages). ``footers``: already read (no second
    read).

    ``executor``: a bare client (or None: in process) is accepted too, for scripts."""
    storage_options = StorageOptions.wrap(storage_options)  # redacted in reprs and task keys
    footers = footers or read_footers(uri, storage_options, Executor.of(executor))
    files, infos = footers.files, footers.infos
    chosen = footers.columns(columns, unit_column, exclude, options)
    choice, selected = chosen.choice, chosen.choice.used
    if unit_column is not None:
        check_unit_column(infos[0], unit_column)
    variable = chosen.from_rows  # their width: from rows, at run time only
    firsts = (
        Executor.of(executor).map(
            first_row_widths, files, names=tuple(variable), storage_options=storage_options
        )
        if variable
        else []
    )
    widths = column_widths(infos, selected, firsts)
    if all(w is None for w in widths):
        widths = []  # scalar columns only: one feature per column
    parts = plan_parts(infos)
    offsets = list(np.cumsum([0] + [p.rows for p in parts[:-1]]).astype(int)) if parts else []
    reader = PartReader(tuple(selected), unit_column, storage_options, tuple(widths))
    n_rows = sum(p.rows for p in parts)
    return Dataset(
        parts,
        offsets,
        reader,
        selected,
        n_rows,
        uri,
        files=len(files),
        widths=widths or None,
        left_out=choice.left_out,
        widths_from_rows=tuple(variable),
    )


def check_unit_column(info: FileInfo, unit_column: str) -> None:
    """Refuse, from the schema alone, a unit column whose type cannot hold user ids."""
    type_name = next(c.type for c in info.columns if c.name == unit_column)
    if not unit_type_supported(type_name):
        raise InputError(
            f"unit column {unit_column!r} has type {type_name}: user ids must be integers, "
            "floats, decimals, strings or binary; convert the column"
        )


@dataclass(frozen=True)
class _ArrayBlock:
    """Loader for in-memory blocks (arrays, or a Dask DataFrame's pandas partitions):
    converts to float64 and rejects NaN/inf (a pandas missing value counts as NaN)."""

    columns: tuple[str, ...]

    def __call__(self, block: Any) -> tuple[np.ndarray, None]:
        rows = _block_array(block, np.float64)
        check_finite(rows, self.columns, "input array")
        return rows, None

    def native(self, block: Any) -> tuple[np.ndarray, None]:
        """float32 blocks as they are (possibly the caller's array: read only), any other
        type as float64 (:func:`load_native`). NaN/inf first by the rows' float64 sums (no
        array as large as the block: a sum is NaN or infinite if one of its terms is, and
        float32 terms cannot overflow it), then, only if one is, by :func:`check_finite`."""
        rows = _block_array(block, None)
        if rows.dtype != np.float32:
            rows = np.asarray(rows, dtype=np.float64)
        if not np.isfinite(np.einsum("ij->i", rows, dtype=np.float64)).all():
            check_finite(rows, self.columns, "input array")
        return rows, None


def _block_array(block: Any, dtype: type | None) -> np.ndarray:
    """A block as a NumPy array of ``dtype`` (None: float32 kept, else float64); a pandas
    partition's missing values (``pd.NA``) become NaN, for :func:`check_finite` to name."""
    if not hasattr(block, "columns"):
        return np.asarray(block, dtype=dtype)
    if dtype is None:
        dtype = np.float32 if all(t == np.float32 for t in block.dtypes) else np.float64
    return block.to_numpy(dtype=dtype, na_value=np.nan)


def frame_columns(frame: Any) -> tuple[ColumnInfo, ...]:
    """A pandas or Dask DataFrame's columns as a schema (names and dtypes, no values), for
    :func:`choose_columns`: numeric as in Parquet (integers, floats; not bool)."""
    import pandas as pd

    def described(dtype: Any) -> str:
        arrow = getattr(dtype, "pyarrow_dtype", None)  # int64[pyarrow] → int64
        return str(dtype if arrow is None else arrow)

    def numeric(dtype: Any) -> bool:
        types = pd.api.types
        return (
            types.is_numeric_dtype(dtype)
            and not types.is_bool_dtype(dtype)
            and not types.is_complex_dtype(dtype)
        )

    return tuple(
        ColumnInfo(str(name), described(dtype), numeric(dtype))
        for name, dtype in zip(frame.columns, frame.dtypes, strict=True)
    )


def frame_choice(
    frame: Any,
    requested: Sequence[str] | None,
    exclude: Sequence[str] | None,
    options: OptionNames,
) -> tuple[Any, ColumnChoice]:
    """The frame's feature columns by the CLI's rule (:func:`choose_columns` on its dtypes;
    its index is never a feature), and the frame cut to them in that order."""
    columns = frame_columns(frame)
    choice = choose_columns(columns, requested, None, exclude, (), "the DataFrame", options)
    labels = {str(name): name for name in frame.columns}
    return frame[[labels[name] for name in choice.used]], choice


def row_counts(blocks: Sequence[Any], executor: Executor) -> list[int]:
    """Rows of each delayed block, counted where the blocks are (a pass over them). Row
    level only: the API refuses ``unit_column`` for in-memory input, and a user-level count
    would be private (build_manifest withholds n_rows and what follows from it)."""
    counts = executor.gather([dask.delayed(len)(b) for b in blocks], "row counts")
    return [int(c) for c in counts]


def array_dataset(
    data: Any, columns: list[str] | None = None, executor: Executor | None = None
) -> Dataset:
    """A NumPy array, pandas DataFrame, Dask array or Dask DataFrame as partitions.

    A Dask DataFrame is read a partition at a time (``to_delayed``) and its row counts are
    those of the very partitions read, never ``to_dask_array(lengths=True)``, whose lengths
    disagree with the partitions of ``read_parquet`` frames (dask/dask#12411); a Dask array
    with unknown chunk sizes has its blocks counted the same way (``executor``: where; None:
    in process)."""
    import dask.array as da

    executor = executor or Executor()

    if dask.is_dask_collection(data) and hasattr(data, "columns"):  # Dask DataFrame
        columns = columns or [str(c) for c in data.columns]
        parts = list(data[columns].to_delayed())
        lost = [i for i, part in enumerate(parts) if part.key not in part.dask]
        if lost:
            raise InputError(
                f"the Dask DataFrame cannot compute its partitions {lost[:10]} of {len(parts)} "
                "(Dask loses them when a read_parquet frame with columns= is persisted; "
                "compute() fails too): pass the frame before .persist(), or the Parquet path"
            )
        return _blocks_dataset(parts, row_counts(parts, executor), len(columns), columns)
    if hasattr(data, "columns"):  # pandas DataFrame
        columns = columns or [str(c) for c in data.columns]
        data = data[columns].to_numpy()
    if getattr(data, "ndim", None) != 2:
        raise InputError("input must be a 2-D array or a table: rows are records, columns features")
    if isinstance(data, da.Array):
        if data.numblocks[1] != 1:
            data = data.rechunk({1: -1})
        parts = list(data.to_delayed()[:, 0])
        sizes = list(data.chunks[0])
        if any(math.isnan(size) for size in sizes):
            sizes = row_counts(parts, executor)
        return _blocks_dataset(parts, sizes, data.shape[1], columns)
    data = np.asarray(data)
    starts = range(0, data.shape[0], ARRAY_PART_ROWS)
    parts = [data[s : s + ARRAY_PART_ROWS] for s in starts]
    sizes = [len(p) for p in parts]
    return _blocks_dataset(executor.place(parts), sizes, data.shape[1], columns)


def _blocks_dataset(
    parts: list[Any], sizes: Sequence[int], dim: int, columns: list[str] | None
) -> Dataset:
    columns = columns or [f"x{j}" for j in range(dim)]
    offsets = list(np.cumsum([0] + list(sizes[:-1])).astype(int))
    loader = _ArrayBlock(tuple(columns))
    return Dataset(parts, offsets, loader, list(columns), int(sum(sizes)), "array")
