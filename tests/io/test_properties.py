"""Property-based tests (hypothesis) of the Parquet readers and the numerical core.

Readers: any small table written to Parquet (several files, row groups, dtypes) reads
back through ``parquet_dataset`` / ``PartReader`` exactly; a NaN, ±inf or null anywhere
raises ``InputError`` naming the column. Numerical core: for any finite input, incl.
huge and tiny magnitudes and rank-deficient input, the bases are orthonormal, have the
right shape and hold no NaN (or are ``None`` for a rank-deficient subset).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpsub_dist import linalg
from dpsub_dist.engine.sources import parquet_dataset
from dpsub_dist.errors import InputError
from dpsub_dist.linalg import subspace_error, top_left_singular_vectors, top_right_singular_vectors
from dpsub_dist.methods._sample_aggregate import (
    basis_from_aggregate,
    is_null_release,
    reference_points,
)

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)

DTYPES = {
    "float64": (pa.float64(), np.float64),
    "float32": (pa.float32(), np.float32),
    "int64": (pa.int64(), np.int64),
    "int32": (pa.int32(), np.int32),
}


def column_values(dtype: str, rows: int) -> st.SearchStrategy[np.ndarray]:
    """Finite values of one Parquet column type, incl. extremes."""
    numpy_type = DTYPES[dtype][1]
    if dtype.startswith("float"):
        width = 32 if dtype == "float32" else 64
        elements = st.floats(allow_nan=False, allow_infinity=False, width=width)
    else:  # exactly representable as float64
        elements = (
            st.integers(-(2**31), 2**31 - 1) if dtype == "int32" else st.integers(-(2**53), 2**53)
        )
    return hnp.arrays(numpy_type, rows, elements=elements)


@st.composite
def tables(draw) -> tuple[list[dict[str, np.ndarray]], list[str], int]:
    """1–3 files with the same schema (2–4 columns of random types), 0–40 rows each."""
    dim = draw(st.integers(2, 4))
    dtypes = [draw(st.sampled_from(sorted(DTYPES))) for _ in range(dim)]
    files = []
    for _ in range(draw(st.integers(1, 3))):
        rows = draw(st.integers(0, 40))
        files.append({f"c{j}": draw(column_values(t, rows)) for j, t in enumerate(dtypes)})
    return files, dtypes, draw(st.integers(1, 16))


def write_files(folder: Path, files: list[dict], dtypes: list[str], group: int) -> None:
    for i, columns in enumerate(files):
        arrays = [pa.array(v, DTYPES[t][0]) for v, t in zip(columns.values(), dtypes, strict=True)]
        table = pa.Table.from_arrays(arrays, list(columns))
        pq.write_table(table, folder / f"part-{i:03d}.parquet", row_group_size=group)


def read_all(folder: Path) -> tuple[np.ndarray, int]:
    dataset = parquet_dataset(str(folder), None, None, None, None)
    blocks = [dataset.loader(part)[0] for part in dataset.parts]
    rows = np.concatenate(blocks) if blocks else np.empty((0, dataset.dim))
    assert dataset.offsets == list(np.cumsum([0] + [len(b) for b in blocks[:-1]]))[: len(blocks)]
    return rows, dataset.n_rows


@SETTINGS
@given(tables())
def test_reader_returns_exactly_the_written_values(table) -> None:
    files, dtypes, group = table
    with tempfile.TemporaryDirectory() as tmp:
        write_files(Path(tmp), files, dtypes, group)
        rows, n_rows = read_all(Path(tmp))
    expected = np.concatenate(
        [np.column_stack([v.astype(np.float64) for v in f.values()]) for f in files]
    )
    assert n_rows == len(expected)
    assert rows.dtype == np.float64 and rows.shape == expected.shape
    np.testing.assert_array_equal(rows, expected)


@SETTINGS
@given(tables(), st.data())
def test_reader_rejects_a_non_finite_value_anywhere(table, data) -> None:
    files, dtypes, group = table
    floats = [j for j, t in enumerate(dtypes) if t.startswith("float")]
    holders = [i for i, f in enumerate(files) if len(next(iter(f.values())))]
    assume(floats and holders)
    i = data.draw(st.sampled_from(holders))
    j = data.draw(st.sampled_from(floats))
    name = f"c{j}"
    row = data.draw(st.integers(0, len(files[i][name]) - 1))
    files[i][name] = files[i][name].copy()
    files[i][name][row] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    with tempfile.TemporaryDirectory() as tmp:
        write_files(Path(tmp), files, dtypes, group)
        with pytest.raises(InputError, match=f"part-{i:03d}.parquet: column {name} has 1 NaN"):
            read_all(Path(tmp))


@SETTINGS
@given(tables(), st.data())
def test_reader_rejects_a_null_anywhere(table, data) -> None:
    files, dtypes, group = table
    holders = [i for i, f in enumerate(files) if len(next(iter(f.values())))]
    assume(holders)
    i = data.draw(st.sampled_from(holders))
    j = data.draw(st.integers(0, len(dtypes) - 1))
    values = files[i][f"c{j}"]
    row = data.draw(st.integers(0, len(values) - 1))
    mask = np.zeros(len(values), dtype=bool)
    mask[row] = True
    with tempfile.TemporaryDirectory() as tmp:
        write_files(Path(tmp), files, dtypes, group)
        path = Path(tmp) / f"part-{i:03d}.parquet"
        table_i = pq.read_table(path)
        nulled = pa.array(values, DTYPES[dtypes[j]][0], mask=mask)
        pq.write_table(table_i.set_column(j, f"c{j}", nulled), path, row_group_size=group)
        with pytest.raises(InputError, match=f"column c{j} has 1 missing values"):
            read_all(Path(tmp))


# -- numerical core -------------------------------------------------------------------

MAGNITUDES = st.sampled_from([1e-300, 1e-150, 1e-20, 1.0, 1e20, 1e150, 1e300])


@st.composite
def matrices(draw, max_rows: int = 30, max_cols: int = 12, min_size: int = 1) -> np.ndarray:
    """Finite matrices: random entries in [-1, 1] times a magnitude, maybe rank-deficient."""
    m = draw(st.integers(min_size, max_rows))
    d = draw(st.integers(min_size, max_cols))
    base = draw(hnp.arrays(np.float64, (m, d), elements=st.floats(-1, 1, width=64)))
    if draw(st.booleans()):  # rank-deficient: a product through a thin inner dimension
        inner = draw(st.integers(1, max(1, min(m, d) - 1)))
        left = draw(hnp.arrays(np.float64, (m, inner), elements=st.floats(-1, 1)))
        base = left @ draw(hnp.arrays(np.float64, (inner, d), elements=st.floats(-1, 1)))
        base = np.clip(base, -1, 1)
    return base * draw(MAGNITUDES)


def assert_rank_below(rows: np.ndarray, k: int) -> None:
    """``rows`` has numerical rank < k: fewer rows, or σ_k within Gram-route rounding of 0."""
    m, d = rows.shape
    if m < k or not np.any(rows):
        return
    singular = np.linalg.svd(rows / np.max(np.abs(rows)), compute_uv=False)
    tolerance = 10 * np.sqrt(max(m, d) * np.finfo(float).eps)  # 10× the library's own
    assert len(singular) < k or singular[k - 1] <= tolerance * singular[0], singular


def assert_orthonormal_rows(vt: np.ndarray, k: int, d: int) -> None:
    assert vt.shape == (k, d)
    assert np.all(np.isfinite(vt))
    np.testing.assert_allclose(vt @ vt.T, np.eye(k), atol=1e-8)


@SETTINGS
@given(matrices(), st.integers(1, 5))
def test_top_right_singular_vectors_orthonormal_or_none(rows, k) -> None:
    m, d = rows.shape
    assume(k <= d)
    with np.errstate(all="raise"):  # no overflow, underflow to NaN, or invalid operation
        try:
            vt = top_right_singular_vectors(rows, k, np.random.default_rng(0))
        except FloatingPointError as err:
            if "underflow" not in str(err):
                raise
            with np.errstate(under="ignore"):
                vt = top_right_singular_vectors(rows, k, np.random.default_rng(0))
    if vt is None:  # allowed only for an input that has no k-dimensional row space
        assert_rank_below(rows, k)
        return
    assert_orthonormal_rows(vt, k, d)
    # the basis captures the top-k energy (relative to the largest singular value)
    scaled = rows / np.max(np.abs(rows))
    singular = np.linalg.svd(scaled, compute_uv=False)
    captured = np.linalg.norm(scaled @ vt.T) ** 2
    assert captured >= np.sum(singular[:k] ** 2) - 1e-6 * singular[0] ** 2


@SETTINGS
@given(matrices(max_rows=60, max_cols=60, min_size=53), st.integers(1, 3))
def test_randomized_route_orthonormal_or_none(rows, k) -> None:
    m, d = rows.shape
    assert min(m, d) > 4 * (k + 10)  # the exact route is skipped
    with (
        mock.patch.object(linalg, "EXACT_FLOP_LIMIT", 0),
        mock.patch.object(linalg, "EXACT_SPEED_RATIO", 0),
    ):
        vt = top_right_singular_vectors(rows, k, np.random.default_rng(1))
    if vt is None:
        assert_rank_below(rows, k)
    else:
        assert_orthonormal_rows(vt, k, d)


@SETTINGS
@given(st.integers(2, 8), st.integers(1, 4), MAGNITUDES, st.data())
def test_basis_from_any_finite_aggregate_is_orthonormal(dim, q, magnitude, data) -> None:
    k = data.draw(st.integers(1, min(dim - 1, q)))
    point = data.draw(hnp.arrays(np.float64, dim * q, elements=st.floats(-1, 1))) * magnitude
    basis = basis_from_aggregate(point, dim, q, k)
    assert basis.shape == (dim, k) and np.all(np.isfinite(basis))
    np.testing.assert_allclose(basis.T @ basis, np.eye(k), atol=1e-8)


@SETTINGS
@given(st.integers(3, 12), st.integers(1, 3), st.integers(0, 2**32))
def test_exact_aggregate_recovers_its_subspace_and_is_not_null(dim, k, seed) -> None:
    assume(k < dim)
    q = 2 * k
    reference = reference_points(seed, dim, q)
    truth = np.linalg.qr(np.random.default_rng(seed).normal(size=(dim, k)))[0]
    point = (truth @ (truth.T @ reference)).ravel()
    assert subspace_error(basis_from_aggregate(point, dim, q, k), truth) < 1e-6  # √eps floor
    assert not is_null_release(point, reference, k)
    assert is_null_release(np.zeros(dim * q), reference, k)


def test_top_left_singular_vectors_survive_overflowing_magnitudes() -> None:
    matrix = np.array([[1e300, 0.0], [0.0, 5e299], [1e300, 1e300]])
    basis = top_left_singular_vectors(matrix, 2)
    assert np.all(np.isfinite(basis))
    np.testing.assert_allclose(basis.T @ basis, np.eye(2), atol=1e-12)
