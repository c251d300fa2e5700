"""Parquet readers and input validation (local paths, folders, globs, s3:// URIs).

The driver only *lists* files. Footers (schema, row counts) and rows are read by
tasks on the workers; the driver receives schemas and counts, never rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpsub_dist.errors import InputError
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


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    type: str
    numeric: bool


@dataclass(frozen=True)
class FileInfo:
    """What a worker learned from one file's footer."""

    path: str
    row_group_rows: tuple[int, ...]
    columns: tuple[ColumnInfo, ...]

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


def inspect_file(path: str, storage_options: Mapping[str, Any] | None = None) -> FileInfo:
    """Read one file's footer (runs on a worker)."""
    try:
        fs, local = filesystem(path, storage_options)
        with fs.open(local, "rb") as handle:
            meta = pq.ParquetFile(handle).metadata
            schema = meta.schema.to_arrow_schema()
            groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
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
    columns = tuple(ColumnInfo(f.name, str(f.type), _is_numeric(f.type)) for f in schema)
    return FileInfo(path, groups, columns)


def select_columns(
    infos: Sequence[FileInfo], requested: Sequence[str] | None, unit_column: str | None
) -> list[str]:
    """Validate and resolve the feature columns against every file's schema."""
    first = infos[0]
    names = [c.name for c in first.columns]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"{first.path}: duplicate column names {dup}: rename them in the data")
    for info in infos[1:]:
        if info.columns != first.columns:
            raise InputError(
                f"schema differs between {first.path} and {info.path}: "
                "write all files with the same columns and types"
            )
    by_name = {c.name: c for c in first.columns}
    if unit_column is not None and unit_column not in by_name:
        raise InputError(f"unit column {unit_column!r} not found: available columns {names[:20]}")
    if requested:
        missing = [c for c in requested if c not in by_name]
        if missing:
            raise InputError(f"columns not found: {missing}: available columns are {names[:20]}")
        bad = [f"{c} ({by_name[c].type})" for c in requested if not by_name[c].numeric]
        if bad:
            raise InputError(f"non-numeric columns requested: {bad}: pass numeric columns only")
        if unit_column in requested:
            raise InputError(f"the unit column {unit_column!r} cannot also be a feature column")
        return list(requested)
    numeric = [c.name for c in first.columns if c.numeric and c.name != unit_column]
    if not numeric:
        raise InputError(
            f"no numeric columns in {first.path}: pass --columns naming numeric columns"
        )
    return numeric


def plan_parts(infos: Sequence[FileInfo], target_rows: int = TARGET_PART_ROWS) -> list[Part]:
    """Group consecutive row groups of each file into partitions of about ``target_rows``."""
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

    ``storage_options`` (pairs or a mapping) is held as :class:`StorageOptions`, so the
    reader's ``repr`` (which Dask logs when a task fails) never shows a secret.
    """

    columns: tuple[str, ...]
    unit_column: str | None = None
    storage_options: StorageOptions | tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage_options", StorageOptions.wrap(self.storage_options))

    def __call__(self, part: Part) -> tuple[np.ndarray, np.ndarray | None]:
        wanted = list(self.columns) + ([self.unit_column] if self.unit_column else [])
        try:
            fs, local = filesystem(part.path, self.storage_options)
            with fs.open(local, "rb") as handle:
                table = pq.ParquetFile(handle).read_row_groups(list(part.row_groups), wanted)
        except PermissionError as err:
            raise storage_error(err, part.path, "reading") from None
        except (pa.ArrowInvalid, OSError, ValueError) as err:
            raise InputError(
                f"{part.path}: cannot read rows ({short_error(err)}): replace the file"
            ) from None
        except STORAGE_ERRORS as err:
            raise storage_error(err, part.path, "reading") from None
        if table.num_rows != part.rows:
            raise InputError(
                f"{part.path}: footer declares {part.rows} rows but {table.num_rows} were read: "
                "the file is corrupt; rewrite it"
            )
        rows = np.empty((table.num_rows, len(self.columns)), dtype=np.float64)
        for j, name in enumerate(self.columns):
            column = table.column(name)
            if column.null_count:
                raise InputError(
                    f"{part.path}: column {name} has {column.null_count} missing values: "
                    "fill or drop them before estimating"
                )
            rows[:, j] = column.to_numpy()
        check_finite(rows, self.columns, part.path)
        units = table.column(self.unit_column).to_pandas() if self.unit_column else None
        return rows, units


def check_finite(rows: np.ndarray, columns: Sequence[str], where: str) -> None:
    """Raise InputError naming the first column with NaN or infinite values."""
    finite = np.isfinite(rows)
    if not finite.all():
        bad = int(np.argmin(finite.all(axis=0)))
        count = int((~finite[:, bad]).sum())
        raise InputError(
            f"{where}: column {columns[bad]} has {count} NaN or infinite values: "
            "clean or drop those rows before estimating"
        )
