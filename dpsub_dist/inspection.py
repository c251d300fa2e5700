"""``dpsub inspect INPUT``: what a run would do with each column of a table, and what its
values look like, read for the operator before a budget is spent on it.

It lists the files and reads the footers as ``dpsub estimate`` does, chooses the columns with
the run's own rule (:meth:`~dpsub_dist.engine.sources.Footers.columns`, so the two never
disagree), then reads every row in this process: per column its null and non-finite counts,
its range, a few quantiles (from every row up to :data:`SAMPLE` rows, else from evenly spaced
rows) and, for list columns, their lengths. It names the options that would change the
outcome: a column a run would fail on (exit 6), identifiers and indexes left out, mixed units
(``--standardize``), columns far from the origin.

This is not a private release: the operator may see the data, and these numbers are the data.
Its first line says so; its output must never be forwarded or published as a run's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.sources import Footers, read_footers
from dpsub_dist.errors import InputError
from dpsub_dist.io.parquet import (
    LEFT_OUT_ID,
    LEFT_OUT_INDEX,
    LEFT_OUT_NOT_NUMERIC,
    ColumnInfo,
    human_type,
    reading_rows,
)
from dpsub_dist.io.storage import StorageOptions, filesystem

HEADER = (
    "dpsub inspect reads the data for the operator: this is NOT a private release. Never "
    "forward or publish this output as a run's (it shows the rows' values)."
)
QUANTILES = (0.01, 0.25, 0.5, 0.75, 0.99)
SAMPLE = 200_000
"""Rows whose values the quantiles are read from: all of them up to this many, else every
k-th row (k = ⌈n / SAMPLE⌉)."""
MIXED_UNITS = 100.0
"""Spreads of feature columns differing by more than this factor: mixed units."""
FAR = 10.0
"""A column whose median is this many spreads from 0 is far from the origin."""


@dataclass
class Values:
    """Running statistics of one column's numbers (elements, for a list column)."""

    count: int = 0
    nulls: int = 0
    non_finite: int = 0
    low: float = math.inf
    high: float = -math.inf
    sample: list[np.ndarray] = field(default_factory=list)

    def add(self, values: pa.ChunkedArray | pa.Array, stride: int) -> None:
        self.count += len(values)
        self.nulls += values.null_count
        numbers = values.drop_null()
        if pa.types.is_decimal(numbers.type) or not pa.types.is_floating(numbers.type):
            numbers = pc.cast(numbers, pa.float64(), safe=False)
        array = np.asarray(numbers.to_numpy(), dtype=np.float64)
        finite = array[np.isfinite(array)]
        self.non_finite += len(array) - len(finite)
        if len(finite):
            self.low = min(self.low, float(finite.min()))
            self.high = max(self.high, float(finite.max()))
            self.sample.append(finite[::stride])

    def quantiles(self) -> list[float]:
        kept = np.concatenate(self.sample) if self.sample else np.empty(0)
        return [float(q) for q in np.quantile(kept, QUANTILES)] if len(kept) else []

    def spread(self) -> float | None:
        """The interquartile range of the kept values (None: no finite value)."""
        q = self.quantiles()
        return q[3] - q[1] if q else None


@dataclass
class Column:
    """What was read of one column: its schema entry, its role and its values."""

    info: ColumnInfo
    role: str
    values: Values = field(default_factory=Values)
    lengths: Values | None = None  # list columns: the lengths of the non-null lists


def roles(footers: Footers, args: Any) -> tuple[dict[str, str], str | None]:
    """Each column's role, by the run's rule, and the refusal a run would give (or None). Bad
    options are refused as estimate refuses them; a table the default rule finds no feature
    in is shown, with the refusal."""
    names = [c.name for c in footers.infos[0].columns]
    try:
        chosen = footers.columns(args.columns, args.unit_column, args.exclude_columns)
    except InputError as err:
        if args.columns or args.exclude_columns or args.unit_column:
            raise  # the options are wrong: refused as estimate refuses them (exit 2)
        return {name: "not chosen" for name in names}, str(err)  # the table: show it
    used, left_out = set(chosen.choice.used), chosen.choice.left_out
    out = {}
    for name in names:
        if name == args.unit_column:
            out[name] = "the user id (--unit-column): the privacy unit, never a feature"
        elif name in used:
            out[name] = "feature"
        elif name in left_out:
            out[name] = f"left out: {left_out[name]}"
        elif args.columns:
            out[name] = "left out: not in --columns"
        else:
            out[name] = "left out: matches --exclude-columns"
    return out, None


def read_columns(footers: Footers, columns: list[Column], options: StorageOptions) -> None:
    """One pass over every row group of every file, in this process."""
    stride = max(1, math.ceil(footers.n_rows / SAMPLE))
    for path in footers.files:
        with reading_rows(path):
            fs, local = filesystem(path, options)
            with fs.open(local, "rb") as handle:
                parquet = pq.ParquetFile(handle)
                for group in range(parquet.num_row_groups):
                    table = parquet.read_row_group(group)
                    for column in columns:
                        add_chunk(column, table.column(column.info.name), stride)


def add_chunk(column: Column, values: pa.ChunkedArray, stride: int) -> None:
    if not column.info.numeric:
        column.values.count += len(values)
        column.values.nulls += values.null_count
        return
    if not column.info.vector:
        column.values.add(values, stride)
        return
    if column.lengths is None:
        column.lengths = Values()
    column.lengths.add(pc.list_value_length(values), 1)
    column.values.add(pc.list_flatten(values), stride)


def number(value: float) -> str:
    return f"{value:.4g}"


def describe(column: Column) -> list[str]:
    """The lines of one column: name, type and role, then its counts and values."""
    values = column.values
    lines = [f"{column.info.name}  [{human_type(column.info.type)}]  {column.role}"]
    if column.lengths is not None:
        nulls = f"{column.lengths.nulls} null lists"
        counts = f"rows {column.lengths.count} · {nulls} · {values.nulls} null elements"
    else:
        counts = f"rows {values.count} · nulls {values.nulls}"
    if column.info.numeric:
        counts += f" · non-finite (NaN, ±inf) {values.non_finite}"
    lines.append("    " + counts)
    if column.lengths is not None and column.lengths.high >= column.lengths.low:
        low, high = int(column.lengths.low), int(column.lengths.high)
        lines.append(f"    list lengths {low}" + ("" if low == high else f" to {high} (ragged)"))
    q = values.quantiles()
    if q:
        pairs = zip(QUANTILES, q, strict=True)
        listed = " ".join(f"q{round(p * 100)} {number(v)}" for p, v in pairs)
        lines.append(f"    min {number(values.low)} · max {number(values.high)} · {listed}")
    return lines


def advice(columns: list[Column], refusal: str | None) -> list[str]:
    """What the default run would do with this table and which options change it."""
    lines: list[str] = []
    if refusal:
        lines.append(f"a run with these options is refused before reading (exit 2): {refusal}")
    features = [c for c in columns if c.role == "feature"]
    for c in features:
        v, name = c.values, c.info.name
        fixes = []
        if v.nulls or (c.lengths and c.lengths.nulls):
            fixes.append("missing values: fill or drop those rows")
        if v.non_finite:
            fixes.append("NaN or infinite values: fill or drop those rows")
        if c.lengths and c.lengths.high > c.lengths.low:
            fixes.append("lists of different lengths: store lists of one length")
        if fixes:
            lines.append(
                f"{name}: {'; '.join(fixes)}; or --exclude-columns {name}. As it is, a run "
                "fails on it after reading (exit 6, budget spent)"
            )
    for c in columns:
        name = c.info.name
        if c.role == f"left out: {LEFT_OUT_ID}":
            lines.append(
                f"{name}: looks like an identifier and is left out: --unit-column {name} if "
                f"it is the user id, or name it in --columns to use it as a feature"
            )
        elif c.role == f"left out: {LEFT_OUT_INDEX}":
            lines.append(f"{name}: a stored index (row labels), left out: --columns to use it")
        elif c.role == f"left out: {LEFT_OUT_NOT_NUMERIC}":
            lines.append(f"{name}: not numeric, left out: convert it to numbers to use it")
    spreads = {c.info.name: c.values.spread() for c in features}
    positive = {name: s for name, s in spreads.items() if s}
    if len(positive) >= 2:
        small, large = min(positive, key=positive.get), max(positive, key=positive.get)
        ratio = positive[large] / positive[small]
        if ratio > MIXED_UNITS:
            lines.append(
                f"mixed units: interquartile ranges differ {number(ratio)}× ({large} "
                f"{number(positive[large])}, {small} {number(positive[small])}); the widest "
                "columns drive the basis: --standardize puts every column on one scale (a "
                "share of the budget, row level), or rescale them before the run"
            )
    for c in features:
        q, spread = c.values.quantiles(), spreads[c.info.name]
        if q and spread and abs(q[2]) > FAR * spread:
            lines.append(
                f"{c.info.name}: far from the origin (median {number(q[2])}, interquartile "
                f"range {number(spread)}): keep the default centring (not --no-center), or "
                "--standardize"
            )
    return lines or ["every feature column is complete and finite, on comparable scales"]


def inspect_table(args: Any) -> str:
    """The report ``dpsub inspect`` prints (:data:`HEADER` first)."""
    options = StorageOptions.from_pairs(args.storage_option)
    footers = read_footers(args.input, options, Executor(None))
    role, refusal = roles(footers, args)
    columns = [Column(info, role[info.name]) for info in footers.infos[0].columns]
    read_columns(footers, columns, options)
    features = sum(c.role == "feature" for c in columns)
    files = len(footers.files)
    lines = [
        HEADER,
        f"{args.input}: {files} file{'s' * (files != 1)}, {footers.n_rows} rows, "
        f"{len(columns)} columns, {features} chosen as features by the run's rule"
        + ("" if args.columns or args.exclude_columns else " (no --columns given)")
        + f"; quantiles {quantile_note(footers.n_rows)}",
        "",
    ]
    for column in columns:
        lines.extend(describe(column))
    lines += ["", "what a run would do, and what changes it:"]
    lines += [f"  - {line}" for line in advice(columns, refusal)]
    return "\n".join(lines)


def quantile_note(n_rows: int) -> str:
    """Which rows the quantiles were read from."""
    stride = max(1, math.ceil(n_rows / SAMPLE))
    return "from every row" if stride == 1 else f"from every {stride}th row"
