"""The bad-input matrix of docs/bad-input.md: every input fault → exit code and message.

Each row runs ``dpsub estimate`` (in-process, on the shared real cluster via
``--scheduler``) and checks the exit code, that stderr is one line naming the
problem (and the fix), and that no output folder, not even a temporary one, appears.
``test_every_row_is_documented`` keeps the table in docs/ and these rows in step.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsub_dist.cli import INSPECT_NEXT, main
from dpsub_dist.io.output import read_run
from dpsub_dist.linalg import subspace_error
from dpsub_dist.synth import generate

EASY = ("--epsilon", "4", "--delta", "1e-6")
"""A budget at which the valid rows succeed reliably on a few thousand rows."""
DOC = Path(__file__).resolve().parents[2] / "docs" / "bad-input.md"
ROWS = 3000
DIM = 4


def write(path: Path, table: pa.Table | dict, row_group_size: int | None = None) -> Path:
    """Write ``table`` (or a dict of columns) as one Parquet file, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(table, dict):
        table = pa.table(table)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def features(rows: int = ROWS, dim: int = DIM, seed: int = 0, scale: float = 1.0) -> dict:
    """Columns x0..x{dim-1} of rows near a line, float64."""
    rng = np.random.default_rng(seed)
    direction = np.ones(dim) / np.sqrt(dim)
    data = rng.normal(size=(rows, 1)) * direction + 0.01 * rng.normal(size=(rows, dim))
    return {f"x{j}": data[:, j] * scale for j in range(dim)}


def good_folder(root: Path, files: int = 2, **kwargs) -> Path:
    folder = root / "data"
    for i in range(files):
        write(folder / f"part-{i}.parquet", features(seed=i, **kwargs))
    return folder


def lying_footer_file(path: Path, actual: int = 12_345, declared: int = 10**9) -> Path:
    """A Parquet file whose footer declares ``declared`` rows but whose pages hold ``actual``.

    The footer is Thrift compact: every i64 row/value count is a zig-zag varint, so the
    count's varint is replaced by the declared one and the footer length is rewritten.
    """

    def varint(n: int) -> bytes:
        n = n << 1  # zig-zag of a non-negative number
        out = bytearray()
        while True:
            byte, n = n & 0x7F, n >> 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                return bytes(out)

    write(path, features(rows=actual, dim=2))
    raw = path.read_bytes()
    footer_len = int.from_bytes(raw[-8:-4], "little")
    start = len(raw) - 8 - footer_len
    footer = raw[start:-8]
    assert footer.count(varint(actual)) >= 2  # file num_rows, row group num_rows, values
    footer = footer.replace(varint(actual), varint(declared))
    path.write_bytes(raw[:start] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    assert pq.ParquetFile(path).metadata.num_rows == declared
    return path


@dataclass(frozen=True)
class Fault:
    """One row of the matrix: build the input, run estimate, expect code and message."""

    id: str
    build: Callable[[Path], Path]
    message: str
    code: int = 2
    args: tuple[str, ...] = ()
    rank: int = 1
    budget: tuple[str, ...] = ("--epsilon", "1", "--delta", "1e-6")
    extra_checks: Callable[[Path, Path], None] | None = field(default=None, compare=False)


def _schema_drift(root: Path) -> Path:
    folder = good_folder(root)
    write(folder / "part-9.parquet", {**features(), "x9": np.zeros(ROWS)})
    return folder


def _type_drift(root: Path) -> Path:
    folder = good_folder(root)
    cols = {k: v.astype(np.float32) for k, v in features().items()}
    write(folder / "part-9.parquet", cols)
    return folder


def _mixed_types(root: Path) -> Path:
    # ints, float32, float64 and decimal mixed across columns are all numeric: they run.
    cols = features()
    table = pa.table(
        {
            "x0": pa.array(np.round(cols["x0"] * 1000).astype(np.int64)),
            "x1": pa.array(cols["x1"].astype(np.float32)),
            "x2": pa.array(cols["x2"]),
            "x3": pa.array([round(v, 3) for v in cols["x3"]]).cast(pa.decimal128(12, 3)),
            "label": pa.array(["a"] * ROWS),
            "flag": pa.array([True] * ROWS),
        }
    )
    return write(root / "mixed.parquet", table)


def _with(column: str, values: pa.Array) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        folder = good_folder(root)
        cols = features(seed=5)
        cols[column] = values
        write(folder / "part-5.parquet", cols)
        return folder

    return build


def _nan_values() -> np.ndarray:
    values = features(seed=5)["x2"].copy()
    values[[3, 99]] = np.nan
    return values


def _inf_values() -> np.ndarray:
    values = features(seed=5)["x1"].copy()
    values[7] = -np.inf
    return values


def _bad_in_several_columns(root: Path) -> Path:
    """NaN in x2 and −inf in x1 of one file: every bad column is named, not only the first."""
    folder = _with("x2", _nan_values())(root)
    cols = features(seed=5)
    cols["x2"], cols["x1"] = _nan_values(), _inf_values()
    write(folder / "part-5.parquet", cols)
    return folder


def _nulls_in_several_columns(root: Path) -> Path:
    cols = features()
    nulls = {name: pa.array([None] + list(cols[name][1:]), pa.float64()) for name in ("x0", "x3")}
    return write(root / "nulls.parquet", pa.table({**cols, **nulls}))


def _empty_file(root: Path) -> Path:
    folder = good_folder(root)
    (folder / "part-7.parquet").write_bytes(b"")
    return folder


def _not_parquet(root: Path) -> Path:
    folder = good_folder(root)
    (folder / "notes.txt").write_text("not data\n")
    return folder


def _zero_rows(root: Path) -> Path:
    schema = pa.table(features(rows=0)).schema
    return write(root / "empty.parquet", schema.empty_table())


def _one_zero_row_file(root: Path) -> Path:
    folder = good_folder(root)
    write(folder / "part-8.parquet", pa.table(features(rows=0)))
    return folder


def _duplicate_names(root: Path) -> Path:
    cols = features()
    table = pa.Table.from_arrays([pa.array(cols["x0"]), pa.array(cols["x1"])], ["x0", "x0"])
    return write(root / "dup.parquet", table)


def _no_numeric(root: Path) -> Path:
    return write(root / "text.parquet", {"name": ["a"] * 10, "when": ["2024-01-01"] * 10})


def _non_numeric_requested(root: Path) -> Path:
    return write(root / "t.parquet", {**features(), "name": ["a"] * ROWS})


def _one_column(root: Path) -> Path:
    return write(root / "d1.parquet", {"x0": features()["x0"]})


def _nulls(root: Path) -> Path:
    cols = features()
    table = pa.table({**cols, "x1": pa.array([None] + list(cols["x1"][1:]), pa.float64())})
    return write(root / "nulls.parquet", table)


def _as_vector(cols: dict, list_type: pa.DataType | None = None) -> pa.Array:
    """Columns x0..x{DIM-1} as one vector column: fixed_size_list, or ``list_type``."""
    data = np.column_stack([cols[f"x{j}"] for j in range(DIM)])
    if list_type is None:
        return pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1)), DIM)
    return pa.array([list(row) for row in data], list_type)


def _vector(fault: Callable[[np.ndarray], pa.Array] | None = None) -> Callable[[Path], Path]:
    """Good files with features in a vector column ``x`` (and a scalar ``w``); ``fault``
    builds the ``x`` of one more file from its rows."""

    def build(root: Path) -> Path:
        folder = root / "data"
        for i in range(2):
            cols = features(seed=i)
            write(folder / f"part-{i}.parquet", {"w": cols["x0"], "x": _as_vector(cols)})
        if fault is not None:
            cols = features(seed=5)
            data = np.column_stack([cols[f"x{j}"] for j in range(DIM)])
            write(folder / "part-5.parquet", {"w": cols["x0"], "x": fault(data)})
        return folder

    return build


def _ragged(data: np.ndarray) -> pa.Array:
    rows = [list(row) for row in data]
    rows[40] = rows[40][:3]
    return pa.array(rows, pa.list_(pa.float64()))


def _null_element(data: np.ndarray) -> pa.Array:
    mask = np.zeros(data.shape, dtype=bool)
    mask[[5, 6], 2] = True
    return pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1), mask=mask.reshape(-1)), DIM)


def _null_list(data: np.ndarray) -> pa.Array:
    valid = np.ones(len(data), dtype=bool)
    valid[11] = False
    return pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1)), DIM, mask=pa.array(~valid))


def _nan_element(data: np.ndarray) -> pa.Array:
    data = data.copy()
    data[[3, 99], 1] = np.nan
    return pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1)), DIM)


def _ragged_folder(root: Path) -> Path:
    folder = root / "data"
    list_type = pa.list_(pa.float64())
    for i in range(2):
        write(folder / f"part-{i}.parquet", {"x": _as_vector(features(seed=i), list_type)})
    data = np.column_stack(list(features(seed=5).values()))
    write(folder / "part-5.parquet", {"x": _ragged(data)})
    return folder


def _string_lists(root: Path) -> Path:
    cols = features()
    return write(root / "t.parquet", {"x": _as_vector(cols), "tags": [["a", "b"]] * ROWS})


def _synth(rows: int, dim: int, rank: int, scale: float = 1.0) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        generate(root / "synth", rows=rows, dim=dim, rank=rank, seed=3, partitions=2)
        if scale == 1.0:
            return root / "synth"
        scaled = root / "scaled"
        for source in sorted((root / "synth").glob("*.parquet")):
            table = pq.read_table(source)
            columns = {
                name: pa.array(table.column(name).to_numpy().astype(np.float64) * scale)
                for name in table.column_names
            }
            write(scaled / source.name, columns)
        (scaled / "_truth").mkdir()
        truth = np.load(root / "synth" / "_truth" / "basis.npy")
        np.save(scaled / "_truth" / "basis.npy", truth)
        return scaled

    return build


def _matches_truth(input_path: Path, out: Path) -> None:
    basis, manifest = read_run(str(out))
    truth = np.load(input_path / "_truth" / "basis.npy")
    assert basis is not None and manifest["outcome"] == "ok"
    assert basis.shape == truth.shape
    np.testing.assert_allclose(basis.T @ basis, np.eye(basis.shape[1]), atol=1e-10)
    assert subspace_error(basis, truth) < 0.1


FAULTS: list[Fault] = [
    Fault("missing-path", lambda root: root / "nope", r"input path not found: .*nope"),
    Fault(
        "empty-folder",
        lambda root: (root / "d").mkdir() or root / "d",
        r"no Parquet files under",
    ),
    Fault("schema-drift-columns", _schema_drift, r"schema differs between .*part-0.* and .*9"),
    Fault("schema-drift-types", _type_drift, r"schema differs between"),
    Fault("empty-file", _empty_file, r"part-7.parquet: not a readable Parquet file"),
    Fault("non-parquet-file-in-folder", _not_parquet, r"notes.txt: not a readable Parquet"),
    Fault("zero-rows", _zero_rows, r"empty.parquet has no rows: pass a dataset with at least"),
    Fault("duplicate-column-names", _duplicate_names, r"duplicate column names \['x0'\]"),
    Fault("no-numeric-columns", _no_numeric, r"no numeric columns in .*text.parquet"),
    Fault(
        "non-numeric-column-requested",
        _non_numeric_requested,
        r"non-numeric columns requested: \['name \(string\)'\]",
        args=("--columns", "x0,name"),
    ),
    Fault(
        "unknown-column-requested",
        _non_numeric_requested,
        r"columns not found: \['x7'\]",
        args=("--columns", "x0,x7"),
    ),
    Fault(
        "unknown-unit-column",
        _non_numeric_requested,
        r"unit column 'user' not found",
        args=("--unit-column", "user"),
    ),
    Fault("nan-values", _with("x2", _nan_values()), r"column x2 has 2 NaN or infinite val", 6),
    Fault("inf-values", _with("x1", _inf_values()), r"column x1 has 1 NaN or infinite val", 6),
    Fault("null-values", _nulls, r"column x1 has 1 missing values", 6),
    Fault(
        "bad-values-in-several-columns",
        _bad_in_several_columns,
        r"column x1 has 1 NaN or infinite values; column x2 has 2 NaN or infinite values: clean",
        6,
    ),
    Fault(
        "nulls-in-several-columns",
        _nulls_in_several_columns,
        r"column x0 has 1 missing values; column x3 has 1 missing values: fill",
        6,
    ),
    Fault(
        "lying-footer",
        lambda root: lying_footer_file(root / "liar.parquet"),
        r"liar.parquet: (footer declares 1000000000 rows|cannot read rows)",
    ),
    Fault("d-equals-1", _one_column, r"rank 1 must be smaller than the number of features \(1\)"),
    Fault("rank-equals-d", good_folder, r"rank 4 must be smaller than .* \(4\)", rank=DIM),
    Fault("rank-above-d", good_folder, r"rank 9 must be smaller than .* \(4\)", rank=9),
    Fault("rank-zero", good_folder, r"rank must be a positive integer \(got 0\)", rank=0),
    Fault(
        "epsilon-zero",
        good_folder,
        r"epsilon must be > 0",
        budget=("--epsilon", "0", "--delta", "1e-6"),
    ),
    Fault(
        "epsilon-negative",
        good_folder,
        r"epsilon must be > 0",
        budget=("--epsilon", "-1", "--delta", "1e-6"),
    ),
    Fault(
        "epsilon-infinite",
        good_folder,
        r"epsilon must be > 0 and finite",
        budget=("--epsilon", "inf", "--delta", "1e-6"),
    ),
    Fault(
        "epsilon-missing",
        good_folder,
        r"no privacy budget given",
        budget=("--delta", "1e-6"),
    ),
    Fault(
        "delta-zero",
        good_folder,
        r"delta must be in \(0, 1\)",
        budget=("--epsilon", "1", "--delta", "0"),
    ),
    Fault(
        "delta-one",
        good_folder,
        r"delta must be in \(0, 1\)",
        budget=("--epsilon", "1", "--delta", "1"),
    ),
    Fault("delta-missing", good_folder, r"delta is required", budget=("--epsilon", "1")),
    Fault(
        "too-few-rows",
        lambda root: write(root / "small.parquet", features(rows=300)),
        r"too few rows: 300 rows cannot fill \d+ subsets of at least 1 rows",
        args=("--method", "friendly"),  # sample and aggregate needs rows for its subsets
    ),
    Fault(
        "too-few-rows-for-subsets",
        good_folder,
        r"too few rows: 6000 rows cannot fill 4000 subsets of at least 2 rows",
        args=("--subsets", "4000"),
        rank=2,
    ),
    Fault(
        "one-subset",
        good_folder,
        r"subsets must be between 2 and \d+ \(got 1\)",
        args=("--subsets", "1"),
    ),
    Fault(
        "too-many-subsets",
        good_folder,
        r"subsets must be between 2 and \d+ \(got 10000000\): the driver holds a t×t matrix",
        args=("--subsets", "10000000"),
    ),
    Fault(
        "ref-points-below-rank",
        good_folder,
        r"ref-points must be ≥ rank \(2\)",
        args=("--ref-points", "1"),
        rank=2,
    ),
    Fault(
        "unknown-method",
        good_folder,
        r"unknown method 'pca'",
        args=("--method", "pca"),
    ),
    Fault(
        "radius-not-positive",
        good_folder,
        r"--radius must be > 0 \(got -1.0\): a public radius",
        args=("--radius", "-1"),
    ),
    Fault(
        "scheduler-unreachable",
        good_folder,
        r"cannot reach the Dask scheduler at tcp://127.0.0.1:9",
        args=("--scheduler", "tcp://127.0.0.1:9"),
    ),
    Fault(
        "scheduler-not-a-name",
        good_folder,
        r"--scheduler 'inprocess' is not an address or a name \(did you mean 'in-process'\?\): "
        r"pass tcp://host:port, local-cluster or in-process",
        args=("--scheduler", "inprocess"),
    ),
    Fault(
        "workers-in-process",
        good_folder,
        r"--workers and --memory-limit size a local cluster: omit them with --scheduler "
        r"in-process, or pass --scheduler local-cluster",
        args=("--scheduler", "in-process", "--workers", "2"),
    ),
    Fault(
        "memory-limit-with-scheduler",
        good_folder,
        r"--memory-limit sizes the workers of a local cluster: set it on the workers of the "
        r"cluster at tcp://",
        args=("--memory-limit", "1GiB"),
    ),
    Fault(
        "memory-limit-not-a-size",
        good_folder,
        r"--memory-limit must be a positive size \(got 'lots'\): pass e.g. 1GiB or 500MB",
        args=("--memory-limit", "lots", "--scheduler", ""),
    ),
    Fault(
        "vector-ragged-list",
        _ragged_folder,
        r"part-5.parquet: list column x has rows of different lengths \(row 40 has 3 values, "
        r"expected 4\)",
        6,
        args=("--method", "gauss"),
    ),
    Fault(
        "auto-with-variable-list",
        _ragged_folder,
        r"--method auto chooses from the width D in the Parquet schema, but list column\(s\) x "
        r"have their width in their rows only: store them as fixed_size_list",
    ),
    Fault(  # boosting opens the data before its groups: the refusal comes before the rank's
        "auto-boost-with-variable-list",
        _ragged_folder,
        r"--method auto chooses from the width D in the Parquet schema, but list column\(s\) x",
        args=("--boost", "2"),
        rank=4,
    ),
    Fault(
        "vector-null-element",
        _vector(_null_element),
        r"part-5.parquet: column x\[2\] has 2 missing values \(null elements of vector column x\)",
        6,
    ),
    Fault("vector-null-list", _vector(_null_list), r"column x has 1 missing \(null\) lists", 6),
    Fault(
        "vector-nan-values",
        _vector(_nan_element),
        r"part-5.parquet: column x\[1\] has 2 NaN or infinite values",
        6,
    ),
    Fault(
        "non-numeric-list-requested",
        _string_lists,
        r"non-numeric columns requested: \['tags \(list<",
        args=("--columns", "x,tags"),
    ),
    # Inputs that are unusual but valid: they must run, not fail or silently degrade.
    Fault(
        "vector-and-scalar-columns",
        _vector(),
        r"wrote .*basis.npy \(5×1\)",
        code=0,
        budget=EASY,
    ),
    Fault("mixed-numeric-types", _mixed_types, r"wrote .*basis.npy", code=0, budget=EASY),
    Fault("one-zero-row-file", _one_zero_row_file, r"wrote .*basis.npy", code=0, budget=EASY),
    Fault(
        "all-rows-zero",
        lambda root: write(root / "zeros.parquet", features(scale=0.0)),
        r"no stable subspace \(step null_check\): the aggregate is closer to the null point",
        # friendly (gauss releases a noisy basis of the zero matrix); centred, constant rows
        # would have only the noisy mean's direction
        args=("--method", "friendly", "--no-center"),
        code=3,
        budget=EASY,
    ),
    Fault(
        "rank-d-minus-1",
        _synth(rows=40_000, dim=3, rank=2),
        r"wrote .*basis.npy \(3×2\)",
        code=0,
        rank=2,
        budget=EASY,
        extra_checks=_matches_truth,
    ),
    Fault(
        "huge-norms",
        _synth(rows=40_000, dim=6, rank=2, scale=1e250),
        r"wrote .*basis.npy \(6×2\)",
        code=0,
        rank=2,
        budget=EASY,
        extra_checks=_matches_truth,
    ),
    Fault(
        "tiny-norms",
        _synth(rows=40_000, dim=6, rank=2, scale=1e-250),
        r"wrote .*basis.npy \(6×2\)",
        # far below the private norm grid's 2^-10 (docs/centring.md): friendly is scale-free;
        # gauss needs a public --row-norm at this scale
        args=("--method", "friendly", "--no-center"),
        code=0,
        rank=2,
        budget=EASY,
        extra_checks=_matches_truth,
    ),
]


def _run(fault: Fault, tmp_path: Path, scheduler: str, capsys) -> tuple[int, str, str, Path, Path]:
    source = fault.build(tmp_path)
    out = tmp_path / "out"
    argv = [
        "estimate",
        str(source),
        "--rank",
        str(fault.rank),
        *fault.budget,
        "--out",
        str(out),
        "--quiet",
        "--seed",
        "11",
    ]
    if "--scheduler" not in fault.args:
        argv += ["--scheduler", scheduler]
    code = main(argv + list(fault.args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err, source, out


@pytest.mark.parametrize("fault", FAULTS, ids=lambda fault: fault.id)
def test_bad_input(
    fault: Fault, tmp_path: Path, scheduler_address: str, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("DPSUB_DIAGNOSTICS_DIR", str(tmp_path / "diagnostics"))
    code, stdout, stderr, source, out = _run(fault, tmp_path, scheduler_address, capsys)
    if fault.code == 0:
        assert code == 0, stderr
        assert re.search(fault.message, stdout), stdout
        if fault.extra_checks:
            fault.extra_checks(source, out)
        return
    if fault.code == 3:  # a reported outcome, not an error: manifest written, no basis
        assert code == 3, stderr
        assert re.search(fault.message, stderr), stderr
        basis, manifest = read_run(str(out))
        assert basis is None and manifest["outcome"] == "no_stable_subspace"
        return
    if fault.code == 6:  # the data failed validation: published generic, detail to the operator
        assert code == 6, stderr
        assert_data_failure(stderr, "estimate", fault.message)
        assert not out.exists()
        return
    assert code == fault.code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got: {stderr}"
    assert lines[0].startswith("dpsub estimate: error: "), lines[0]
    assert re.search(fault.message, lines[0]), lines[0]
    assert ":" in lines[0][len("dpsub estimate: error: ") :], "message should name a fix"
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")], "temporary output"


def assert_data_failure(stderr: str, command: str, detail: str) -> None:
    """One generic published line; the detail only in the owner-only file it names."""
    lines = stderr.strip().splitlines()
    prefix = f"dpsub {command}: error: the run failed after reading its data ({INSPECT_NEXT}); "
    assert len(lines) == 1 and lines[0].startswith(prefix), stderr
    assert not re.search(detail, lines[0]) and "NaN" not in lines[0], lines[0]
    report = Path(lines[0].rsplit(" ", 1)[1])
    assert report.stat().st_mode & 0o777 == 0o600
    assert re.search(detail, report.read_text()), report.read_text()


def test_output_folder_exists_is_refused_before_any_work(
    tmp_path: Path, scheduler_address: str, capsys
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    code = main(
        ["estimate", str(tmp_path / "missing"), "--rank", "1", "--epsilon", "1", "--delta"]
        + ["1e-6", "--out", str(out), "--scheduler", scheduler_address, "--quiet"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "output folder already exists" in err and "--overwrite" in err
    assert (out / "keep.txt").read_text() == "precious"


def test_output_under_a_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "no").write_text("a file")
    out = tmp_path / "no" / "such" / "out"
    data = good_folder(tmp_path / "input")  # beside the output: never around it
    code = main(
        ["estimate", str(data), "--rank", "1", "--epsilon", "1", "--delta", "1e-6"]
        + ["--out", str(out), "--quiet"]
    )
    assert code == 2
    assert f"{tmp_path / 'no'} is a file" in capsys.readouterr().err


def test_missing_output_parent_is_not_created_when_the_input_is_refused(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "no" / "such" / "out"
    code = main(
        ["estimate", str(tmp_path / "missing"), "--rank", "1", "--epsilon", "1"]
        + ["--delta", "1e-6", "--out", str(out), "--quiet"]
    )
    assert code == 2, capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_lying_footer_fixture_really_lies(tmp_path: Path) -> None:
    path = lying_footer_file(tmp_path / "liar.parquet", actual=12_345, declared=10**9)
    assert pq.ParquetFile(path).metadata.num_rows == 10**9


def test_every_row_is_documented() -> None:
    text = DOC.read_text()
    rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, flags=re.M))
    ids = {fault.id for fault in FAULTS} | {"output-exists", "output-under-a-file"}
    assert ids <= rows, f"undocumented: {sorted(ids - rows)}"
    assert rows <= ids, f"documented but untested: {sorted(rows - ids)}"


def test_worker_side_fault_is_one_line_from_the_real_command(tmp_path: Path) -> None:
    """A fault found on a worker (NaN) prints one generic line, without the workers' log
    dump; the detail goes to the diagnostics file."""
    import subprocess
    import sys

    source = _with("x2", _nan_values())(tmp_path)
    out = tmp_path / "out"
    argv = ["estimate", str(source), "--rank", "1", "--epsilon", "1", "--delta", "1e-6"]
    proc = subprocess.run(
        [sys.executable, "-m", "dpsub_dist.cli", *argv, "--out", str(out), "--quiet"]
        + ["--workers", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DPSUB_DIAGNOSTICS_DIR": str(tmp_path / "diagnostics")},
    )
    assert proc.returncode == 6, proc.stderr
    detail = (
        f"{source / 'part-5.parquet'}: column x2 has 2 NaN or infinite values: clean or drop "
        "those rows before estimating"
    )
    assert_data_failure(proc.stderr, "estimate", re.escape(detail))
    assert not out.exists()
