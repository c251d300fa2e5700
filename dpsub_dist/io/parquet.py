"""Parquet readers and input validation (local paths, folders, globs, s3:// URIs).

The driver only *lists* files. Footers (schema, row counts) and rows are read by
tasks on the workers; the driver receives schemas and counts, never rows.

Feature columns are scalar numeric columns or *vector* columns: a ``fixed_size_list``,
``list`` or ``large_list`` of numbers (e.g. ``x: fixed_size_list<float>[100000]``, the
usual layout of embeddings). A vector column contributes its width to the dimension;
features are concatenated in column order. A fixed-size list's width is in the schema;
a variable ``list``'s width is not in the schema: a run reads it from the first row of the
first file with one (after its budget is reserved) and every row must have it, or the run
fails as data that did not pass validation. ``dpsub run --check`` reads no row, so it
reports such a width as known at run time.
Features of a vector column ``x`` are named ``x[0]``, ``x[1]``, … in messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpsub_dist.errors import DataError, InputError
from dpsub_dist.io.storage import (
    STORAGE_ERRORS,
    StorageOptions,
    bucket_of,
    filesystem,
    is_local,
    short_error,
    storage_error,
    with_protocol,
)

TARGET_PART_ROWS = 1_000_000
"""Consecutive row groups are merged into partitions of about this many rows."""

PROGRESS_PARTS = 16
"""At least this many partitions where the row groups allow: a pass's progress counts finished
tasks, so a single file of many row groups read as one task would jump from 0% to 100%."""


@dataclass(frozen=True)
class ColumnInfo:
    """One column of a footer's schema.

    ``numeric``: a number, or a list of numbers (a vector column). ``width``: values per
    row of a numeric ``fixed_size_list`` column, from its type (None for scalars and for
    variable lists, whose width is in their rows: :func:`first_row_widths`).
    """

    name: str
    type: str
    numeric: bool
    vector: bool = False
    width: int | None = None


@dataclass(frozen=True)
class FileInfo:
    """What a worker learned from one file's footer. ``index_columns``: the columns the
    writer's pandas metadata names as the frame's index (:func:`stored_index_columns`)."""

    path: str
    row_group_rows: tuple[int, ...]
    columns: tuple[ColumnInfo, ...]
    index_columns: tuple[str, ...] = ()

    @property
    def num_rows(self) -> int:
        return sum(self.row_group_rows)


@dataclass(frozen=True)
class Part:
    """A run of consecutive row groups of one file: the unit of work on a worker."""

    path: str
    row_groups: tuple[int, ...]
    rows: int


def list_parquet_files(uri: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Files named by a Parquet file, folder or glob; hidden and ``_``-prefixed entries skipped.

    Runs on the driver and only lists names: no object is opened here.
    """
    try:
        fs, path = filesystem(uri, storage_options)
        if any(ch in path for ch in "*?["):
            found = sorted(p for p in fs.glob(path) if fs.isfile(p))
        elif fs.isdir(path):
            found = sorted(fs.find(path))
        elif fs.isfile(path):
            found = [path]
        elif not is_local(uri) and not _bucket_exists(fs, path):
            raise InputError(
                f"bucket {bucket_of(fs, path)!r} does not exist ({uri}): check the bucket name "
                "and the endpoint (AWS_ENDPOINT_URL or --storage-option endpoint_url=...)"
            )
        else:
            raise InputError(
                f"input path not found: {uri}: pass an existing Parquet file, folder or glob"
            )
    except InputError:
        raise
    except STORAGE_ERRORS as err:
        raise storage_error(err, uri, "listing") from None
    root = path.rstrip("/") if not any(ch in path for ch in "*?[") else ""
    visible = [
        p
        for p in found
        if not any(part.startswith(("_", ".")) for part in p[len(root) :].split("/") if part)
    ]
    if not visible:
        raise InputError(f"no Parquet files under {uri}: pass a folder that holds .parquet files")
    return [with_protocol(fs, p) for p in visible]


def _bucket_exists(fs, path: str) -> bool:
    """Whether the bucket of ``path`` exists (listing it needs only list permission)."""
    try:
        fs.ls(bucket_of(fs, path), detail=False)
    except FileNotFoundError:
        return False
    return True


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def _column_info(field: pa.Field) -> ColumnInfo:
    t = field.type
    if not _is_list(t):
        return ColumnInfo(field.name, str(t), _is_numeric(t))
    numeric = _is_numeric(t.value_type)
    width = t.list_size if pa.types.is_fixed_size_list(t) and numeric else None
    return ColumnInfo(field.name, str(t), numeric, vector=True, width=width)


SCALAR_NAMES = {
    "halffloat": "float16",
    "float": "float32",
    "double": "float64",
    "bool": "boolean",
    "string": "text",
    "large_string": "text",
    "string_view": "text",
    "binary": "bytes",
    "large_binary": "bytes",
    "null": "all null",
}


def human_type(type_name: str) -> str:
    """A reader's name for an Arrow type string (the schema's ``str(type)``):
    ``dictionary<values=string, …>`` → ``categorical (dictionary of text)``,
    ``fixed_size_list<item: float>[8]`` → ``vector of 8 float32``, ``double`` → ``float64``;
    an unknown type is returned as Arrow spells it."""
    name = type_name.strip()
    found = re.fullmatch(r"dictionary<values=([^,]+), indices=.*>", name)
    if found:
        return f"categorical (dictionary of {human_type(found[1])})"
    found = re.fullmatch(r"fixed_size_list<[^:]+: (.+)>\[(\d+)\]", name)
    if found:
        return f"vector of {found[2]} {human_type(found[1])}"
    found = re.fullmatch(r"(?:large_)?list(?:_view)?<[^:]+: (.+)>", name)
    if found:
        return f"list of {human_type(found[1])} (variable length)"
    found = re.fullmatch(r"(timestamp|date|time|duration)\d*\[(.*)\]", name)
    if found:
        kind = {"date": "date", "time": "time of day"}.get(found[1], found[1])
        return f"{kind} ({found[2]})" if kind != "date" else kind
    found = re.fullmatch(r"decimal\d+\((\d+), (\d+)\)", name)
    if found:
        return f"decimal({found[1]}, {found[2]})"
    return SCALAR_NAMES.get(name, name)


def in_rows(column: ColumnInfo) -> bool:
    """Whether a column is a numeric variable list, whose width only its rows tell."""
    return column.vector and column.numeric and column.width is None


def first_row_widths(
    path: str, names: Sequence[str], storage_options: Mapping[str, Any] | None = None
) -> tuple[int | None, ...]:
    """Length of the first row of each variable list column ``names`` in one file (runs on a
    worker, at run time only): None where the file has no rows or that row is a null list
    (the run's pass then fails on it as data that did not pass validation)."""
    with reading_rows(path):
        fs, local = filesystem(path, storage_options)
        with fs.open(local, "rb") as handle:
            pf = pq.ParquetFile(handle, buffer_size=1 << 20)  # streams the first batch only
            for batch in pf.iter_batches(batch_size=1, columns=list(names), use_threads=False):
                if batch.num_rows:
                    firsts = [batch.column(name)[0] for name in names]
                    return tuple(len(v) if v.is_valid else None for v in firsts)
    return (None,) * len(names)


@contextmanager
def reading_rows(path: str) -> Iterator[None]:
    """A failure to read ``path``'s rows as a one-line error: a file Arrow cannot decode is
    bad input; a storage fault mid-read is not (not refundable under the ledger)."""
    try:
        yield
    except PermissionError as err:
        raise storage_error(err, path, "reading") from None
    except (pa.ArrowInvalid, ValueError) as err:
        raise InputError(
            f"{path}: cannot read rows ({short_error(err)}): replace the file"
        ) from None
    except STORAGE_ERRORS as err:  # OSError included
        raise storage_error(err, path, "reading") from None


def inspect_file(path: str, storage_options: Mapping[str, Any] | None = None) -> FileInfo:
    """Read one file's footer (runs on a worker): its schema and row groups, no row."""
    try:
        fs, local = filesystem(path, storage_options)
        with fs.open(local, "rb") as handle:
            meta = pq.ParquetFile(handle).metadata
            schema = meta.schema.to_arrow_schema()
            groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
            columns = tuple(_column_info(f) for f in schema)
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(
            f"{path}: file disappeared while reading: re-run when the input is stable"
        ) from None
    except PermissionError as err:
        raise storage_error(err, path, "reading") from None
    except (pa.ArrowInvalid, OSError, ValueError) as err:
        raise InputError(
            f"{path}: not a readable Parquet file ({short_error(err)}): replace or remove the file"
        ) from None
    except STORAGE_ERRORS as err:
        raise storage_error(err, path, "reading") from None
    return FileInfo(path, groups, columns, stored_index_columns(schema.metadata))


def stored_index_columns(metadata: Mapping[bytes, bytes] | None) -> tuple[str, ...]:
    """The columns a pandas or Dask writer stored as the frame's index, from the ``pandas``
    key of the Arrow schema's metadata (its ``index_columns``: a name per stored index
    level; a RangeIndex is kept as a description, not a column). Schema only: public."""
    raw = (metadata or {}).get(b"pandas")
    if raw is None:
        return ()
    try:
        levels = json.loads(raw).get("index_columns", [])
    except (ValueError, AttributeError):
        return ()  # metadata a writer got wrong: the names alone then (is_index_column)
    return tuple(level for level in levels if isinstance(level, str))


INDEX_COLUMN = re.compile(r"__index_level_\d+__|__null_dask_index__")
"""Names pandas (``__index_level_0__``) and Dask (``__null_dask_index__``) give the index
they store beside the data: row labels, not features."""


def is_index_column(name: str) -> bool:
    """Whether a column is a stored pandas/Dask index (skipped unless named in --columns)."""
    return INDEX_COLUMN.fullmatch(name) is not None


@dataclass(frozen=True)
class OptionNames:
    """How a door spells the column options, for its messages: the CLI's flags or the
    Python API's parameters."""

    columns: str
    exclude: str


CLI_OPTIONS = OptionNames("--columns", "--exclude-columns")
API_OPTIONS = OptionNames("columns=", "exclude_columns=")

LEFT_OUT_INDEX = "index"
LEFT_OUT_ID = "identifier"
LEFT_OUT_NOT_NUMERIC = "not numeric"


@dataclass(frozen=True)
class ColumnChoice:
    """The feature columns of a table, and the columns the default rule left out with the
    reason (``LEFT_OUT_*``; empty when the columns were named). Schema only: public."""

    used: list[str]
    left_out: dict[str, str] = field(default_factory=dict)


def select_columns(
    infos: Sequence[FileInfo],
    requested: Sequence[str] | None,
    unit_column: str | None,
    exclude: Sequence[str] | None = None,
    options: OptionNames = CLI_OPTIONS,
) -> ColumnChoice:
    """:func:`choose_columns` on the files' schema, after checking every file has the
    first one's columns and types; an index any file's metadata names is an index."""
    first = infos[0]
    _refuse_duplicates([c.name for c in first.columns], first.path)
    schema = [(c.name, c.type) for c in first.columns]
    for info in infos[1:]:
        if [(c.name, c.type) for c in info.columns] != schema:
            raise InputError(
                f"schema differs between {first.path} and {info.path}: "
                "write all files with the same columns and types"
            )
    index = tuple(dict.fromkeys(name for info in infos for name in info.index_columns))
    where = first.path
    return choose_columns(first.columns, requested, unit_column, exclude, index, where, options)


def choose_columns(
    columns: Sequence[ColumnInfo],
    requested: Sequence[str] | None,
    unit_column: str | None,
    exclude: Sequence[str] | None = None,
    index_columns: Sequence[str] = (),
    where: str = "the table",
    options: OptionNames = CLI_OPTIONS,
) -> ColumnChoice:
    """The one rule for the feature columns of a table: a Parquet schema (the CLI, job files,
    the API on a path) or a DataFrame's dtypes (the API on pandas and Dask frames).

    ``requested`` is used as given (each must exist and be numeric; identifiers too).
    Otherwise every numeric column but the unit column, a stored index (by name,
    :func:`is_index_column`, or named in ``index_columns`` by the writer's metadata) and an
    identifier-like column (:func:`looks_like_id`): those are in ``left_out``. Then less the
    columns matching ``exclude`` (names or :mod:`fnmatch` patterns, e.g. ``user_*``). Schema
    only, so the choice is public; a bad choice is an InputError (exit 2).
    """
    names = [c.name for c in columns]
    _refuse_duplicates(names, where)
    by_name = {c.name: c for c in columns}
    if unit_column is not None and unit_column not in by_name:
        raise InputError(f"unit column {unit_column!r} not found: available columns {names[:20]}")
    if unit_column is not None and by_name[unit_column].vector:
        raise InputError(
            f"unit column {unit_column!r} is a list ({by_name[unit_column].type}): "
            "pass a scalar user id column"
        )
    if requested:
        missing = [c for c in requested if c not in by_name]
        if missing:
            raise InputError(f"columns not found: {missing}: available columns are {names[:20]}")
        bad = [f"{c} ({by_name[c].type})" for c in requested if not by_name[c].numeric]
        if bad:
            raise InputError(f"non-numeric columns requested: {bad}: pass numeric columns only")
        if unit_column in requested:
            raise InputError(f"the unit column {unit_column!r} cannot also be a feature column")
        return ColumnChoice(_excluding(list(requested), names, exclude, options))
    left_out: dict[str, str] = {}
    used: list[str] = []
    for column in columns:
        if column.name == unit_column:
            continue
        if is_index_column(column.name) or column.name in index_columns:
            left_out[column.name] = LEFT_OUT_INDEX
        elif not column.numeric:
            left_out[column.name] = LEFT_OUT_NOT_NUMERIC
        elif looks_like_id(column.name, column.type):
            left_out[column.name] = LEFT_OUT_ID
        else:
            used.append(column.name)
    if not used:
        ids = [name for name, why in left_out.items() if why == LEFT_OUT_ID]
        raise InputError(
            f"no feature columns in {where}: its numeric columns {ids[:20]} look like "
            f"identifiers; name the ones to use in {options.columns}"
            if ids
            else f"no numeric columns in {where}: pass {options.columns} naming numeric columns"
        )
    return ColumnChoice(_excluding(used, names, exclude, options), left_out)


def describe_left_out(left_out: Mapping[str, str], shown: int = 8) -> str:
    """``user_id (identifier), when (not numeric), …`` for the lines that name the columns
    the default rule left out (the first ``shown``); empty when none were."""
    pairs = list(left_out.items())
    listed = ", ".join(f"{name} ({why})" for name, why in pairs[:shown])
    return listed + (", …" if len(pairs) > shown else "")


def _refuse_duplicates(names: Sequence[str], where: str) -> None:
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"{where}: duplicate column names {dup}: rename them in the data")


def _excluding(
    selected: list[str],
    names: Sequence[str],
    exclude: Sequence[str] | None,
    options: OptionNames,
) -> list[str]:
    """``selected`` without the columns matching any pattern of ``exclude`` (case-sensitive)."""
    if not exclude:
        return selected
    unmatched = [p for p in exclude if not any(fnmatchcase(name, p) for name in names)]
    if unmatched:
        raise InputError(
            f"{options.exclude} pattern {unmatched[0]!r} matches no column: available "
            f"columns are {list(names[:20])}"
        )
    kept = [name for name in selected if not any(fnmatchcase(name, p) for p in exclude)]
    if not kept:
        raise InputError(
            f"{options.exclude} leaves no feature column (it removes all of {selected[:20]}): "
            "exclude fewer columns"
        )
    return kept


ID_WORDS = frozenset({"id", "ids", "key", "idx", "index", "uuid", "pk"})
"""Name parts that mark an identifier (``id``, ``user_id``, ``userId``, ``row_key``, ``idx``)."""


def looks_like_id(name: str, type_name: str) -> bool:
    """Whether a column looks like an identifier from the schema alone: integer type and a name
    part in :data:`ID_WORDS`. Values are never looked at: reading them to test uniqueness or
    scale would be a data access no budget pays for."""
    if not re.fullmatch(r"u?int\d*", type_name.lower()):
        return False
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)  # userId → user Id
    return any(part in ID_WORDS for part in re.split(r"[^a-z0-9]+", spaced.lower()))


def widths_in_rows(infos: Sequence[FileInfo], selected: Sequence[str]) -> list[str]:
    """The selected columns that are variable lists: their width is in their rows only."""
    variable = {c.name for c in infos[0].columns if in_rows(c)}
    return [name for name in selected if name in variable]


def column_widths(
    infos: Sequence[FileInfo],
    selected: Sequence[str],
    firsts: Sequence[Sequence[int | None]] = (),
) -> list[int | None]:
    """Width of each selected column (None: scalar): a fixed_size_list's from the schema, a
    variable list's from ``firsts`` (:func:`first_row_widths` of its columns, in
    :func:`widths_in_rows` order, one tuple per file): the first file's whose first row has one.
    Rows of another length are found by the pass that reads them (:class:`PartReader`)."""
    variable = widths_in_rows(infos, selected)
    fixed = {c.name: c.width for c in infos[0].columns if c.vector and not in_rows(c)}
    widths: list[int | None] = []
    for name in selected:
        if name not in variable:
            widths.append(fixed.get(name))
            continue
        i = variable.index(name)
        known = [f[i] for f in firsts if f[i] is not None]
        if known:
            widths.append(known[0])
        elif not any(info.num_rows for info in infos):
            raise InputError(
                f"list column {name} has no rows in any file, so its length is unknown: "
                "pass data with rows, or store it as a fixed_size_list"
            )
        else:
            raise DataError(
                f"list column {name} has a missing (null) list in the first row of every file: "
                "fill or drop the rows with missing values before estimating"
            )
    return widths


def feature_count(columns: Sequence[str], widths: Sequence[int | None] | None) -> int:
    """Number of features: one per scalar column, its width per vector column."""
    if not widths:
        return len(columns)
    return sum(1 if w is None else w for w in widths)


def feature_name(columns: Sequence[str], widths: Sequence[int | None] | None, j: int) -> str:
    """Name of feature ``j``: the column for a scalar, ``x[17]`` for element 17 of vector x."""
    if not widths:
        return columns[j]
    start = 0
    for name, width in zip(columns, widths, strict=True):
        size = 1 if width is None else width
        if j < start + size:
            return name if width is None else f"{name}[{j - start}]"
        start += size
    raise IndexError(f"feature {j} is beyond the {start} features")


def plan_parts(infos: Sequence[FileInfo], target_rows: int = TARGET_PART_ROWS) -> list[Part]:
    """Group consecutive row groups of each file into partitions of about ``target_rows``,
    smaller where that leaves fewer than :data:`PROGRESS_PARTS` (a row group is never split):
    a single file of many row groups is then read by several tasks, and its progress moves
    with them. From the footers only."""
    total = sum(info.num_rows for info in infos)
    target_rows = max(1, min(target_rows, -(-total // PROGRESS_PARTS)))
    parts: list[Part] = []
    for info in infos:
        groups: list[int] = []
        rows = 0
        for index, count in enumerate(info.row_group_rows):
            if groups and rows + count > target_rows:
                parts.append(Part(info.path, tuple(groups), rows))
                groups, rows = [], 0
            groups.append(index)
            rows += count
        if groups and rows:
            parts.append(Part(info.path, tuple(groups), rows))
    return parts


@dataclass(frozen=True)
class PartReader:
    """Picklable loader: reads a Part's feature columns (and unit column) on a worker.

    ``widths`` gives each column's width (None: a scalar column; empty: all scalar).
    Vector columns are converted a chunk at a time (flatten + reshape), never per element.
    ``storage_options`` (pairs or a mapping) is held as :class:`StorageOptions`, so the
    reader's ``repr`` (which Dask logs when a task fails) never shows a secret.
    """

    columns: tuple[str, ...]
    unit_column: str | None = None
    storage_options: StorageOptions | tuple[tuple[str, Any], ...] = ()
    widths: tuple[int | None, ...] = ()
    OWNS_ROWS: ClassVar[bool] = True
    """Each call returns a new float64 array (:func:`~dpsub_dist.engine.sources.owns_rows`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage_options", StorageOptions.wrap(self.storage_options))
        object.__setattr__(self, "widths", tuple(self.widths))

    @property
    def dim(self) -> int:
        return feature_count(self.columns, self.widths)

    def __call__(self, part: Part) -> tuple[np.ndarray, np.ndarray | None]:
        unit = [self.unit_column] if self.unit_column else []
        table, file_row = self.read_table(part, unit)
        units = None
        if self.unit_column:  # canonical ids; rows without one belong to no user: dropped
            from dpsub_dist.engine.assign import canonical_unit_ids

            keep, units = canonical_unit_ids(table.column(self.unit_column))
            if keep is not None:
                table = table.filter(pa.array(keep))
        return self.table_rows(table, part.path, file_row), units

    def read_table(self, part: Part, extra: Sequence[str] = ()) -> tuple[pa.Table, int]:
        """The part's rows of the feature columns and of ``extra`` (one read), and the
        position in its file of its first row."""
        wanted = list(dict.fromkeys([*self.columns, *extra]))
        with reading_rows(part.path):
            fs, local = filesystem(part.path, self.storage_options)
            with fs.open(local, "rb") as handle:
                pf = pq.ParquetFile(handle)
                table = pf.read_row_groups(list(part.row_groups), wanted)
                first = part.row_groups[0] if part.row_groups else 0
                file_row = sum(pf.metadata.row_group(i).num_rows for i in range(first))
        if table.num_rows != part.rows:
            raise InputError(
                f"{part.path}: footer declares {part.rows} rows but {table.num_rows} were read: "
                "the file is corrupt; rewrite it"
            )
        return table, file_row

    def table_rows(self, table: pa.Table, path: str, file_row: int) -> np.ndarray:
        """The feature columns of ``table`` (rows of ``path`` from ``file_row`` on) as one
        float64 array, validated: nulls, ragged lists and NaN/inf raise :class:`DataError`."""
        rows = np.empty((table.num_rows, self.dim), dtype=np.float64)
        widths = self.widths or (None,) * len(self.columns)
        scalars: dict[int, np.ndarray] = {}  # feature position → a numeric scalar column
        missing = [  # every column with nulls, not only the first
            f"column {name} has {table.column(name).null_count} "
            + ("missing values" if width is None else "missing (null) lists")
            for name, width in zip(self.columns, widths, strict=True)
            if table.column(name).null_count
        ]
        j = 0
        for name, width in zip(self.columns, widths, strict=True):
            column = table.column(name)
            if width is None:
                if not missing:  # once a column has nulls the rest are only checked
                    values = column.to_numpy()
                    if values.dtype.kind in "fiub":
                        scalars[j] = values
                    else:  # decimals: Python objects, converted one by one
                        rows[:, j] = values
                j += 1
                continue
            if not column.null_count:  # its null elements are named with the other columns
                out = rows[:, j : j + width]
                missing += _read_vector(column, width, out, name, path, file_row)
            j += width
        if missing:
            raise DataError(bad_columns_message(path, missing, MISSING_FIX))
        write_scalar_columns(scalars, rows)
        check_finite(rows, self.columns, path, self.widths)
        return rows


SCALAR_BLOCK_BYTES = 64 * 2**20
"""Rows of scalar columns stacked at a time by :func:`write_scalar_columns` (≤ 64 MiB)."""


def write_scalar_columns(scalars: dict[int, np.ndarray], rows: np.ndarray) -> None:
    """Write each run of adjacent scalar columns into ``rows`` (row-major) as one stacked
    ``columns × rows`` block transposed, instead of one strided column at a time: every
    column write touched a new cache line per row, and was most of a partition's decode
    (bench.passes, docs/history.md: 250,000 × 32 float32 in 0.016 s against 0.028 s, 62,500
    × 128 in 0.012 s against 0.051 s). The values are the same (each is converted to
    float64 once, as before)."""
    positions = sorted(scalars)
    runs: list[list[int]] = []
    for j in positions:
        if runs and runs[-1][-1] == j - 1:
            runs[-1].append(j)
        else:
            runs.append([j])
    for run in runs:
        step = max(1, SCALAR_BLOCK_BYTES // (8 * len(run)))
        for start in range(0, len(rows), step):
            block = np.stack([scalars[j][start : start + step] for j in run])
            rows[start : start + step, run[0] : run[-1] + 1] = block.T


MISSING_FIX = "fill or drop them before estimating"
SHOWN_PROBLEMS = 20
"""Columns named in one validation message (a diagnostics file; the rest are counted)."""


def bad_columns_message(where: str, problems: Sequence[str], fix: str) -> str:
    """``WHERE: column a has …; column b has …: FIX``, naming every bad column (up to
    :data:`SHOWN_PROBLEMS`)."""
    shown = "; ".join(problems[:SHOWN_PROBLEMS])
    more = len(problems) - SHOWN_PROBLEMS
    rest = f"; and {more} more columns" if more > 0 else ""
    return f"{where}: {shown}{rest}: {fix}"


def _read_vector(
    column: pa.ChunkedArray, width: int, out: np.ndarray, name: str, path: str, file_row: int
) -> list[str]:
    """Fill ``out`` (rows × width) from a list column without null lists, chunk by chunk;
    return its elements with null values, one line each."""
    null_counts: np.ndarray | None = None
    r = 0
    for chunk in column.chunks:
        m = len(chunk)
        if not pa.types.is_fixed_size_list(chunk.type):
            lengths = np.diff(chunk.offsets.to_numpy())
            wrong = np.flatnonzero(lengths != width)
            if wrong.size:
                row = int(wrong[0])
                raise DataError(
                    f"{path}: list column {name} has rows of different lengths (row "
                    f"{file_row + r + row} has {int(lengths[row])} values, expected {width}): "
                    "every row of a vector column must have the same length"
                )
        flat = chunk.flatten()  # honours the chunk's offset (slices)
        if flat.null_count:
            where = np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False)) % width
            counts = np.bincount(where, minlength=width)
            null_counts = counts if null_counts is None else null_counts + counts
        elif null_counts is None and m:
            if pa.types.is_decimal(flat.type):
                flat = flat.cast(pa.float64())
            out[r : r + m] = flat.to_numpy(zero_copy_only=False).reshape(m, width)
        r += m
    if null_counts is None:
        return []
    return [
        f"column {name}[{element}] has {int(null_counts[element])} missing values "
        f"(null elements of vector column {name})"
        for element in np.flatnonzero(null_counts)
    ]


def check_finite(
    rows: np.ndarray,
    columns: Sequence[str],
    where: str,
    widths: Sequence[int | None] | None = None,
) -> None:
    """Raise DataError naming every feature (``x`` or ``x[17]``) with NaN or inf values."""
    finite = np.isfinite(rows)
    if not finite.all():
        counts = (~finite).sum(axis=0)
        problems = [
            f"column {feature_name(columns, widths, int(j))} has {int(counts[j])} NaN or "
            "infinite values"
            for j in np.flatnonzero(counts)
        ]
        raise DataError(
            bad_columns_message(where, problems, "clean or drop those rows before estimating")
        )
