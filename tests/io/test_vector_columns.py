"""Wide data as vector columns: fixed_size_list / list / large_list of numbers in Parquet.

A vector column contributes its width to D; features are concatenated in column order;
the same data as a vector column or as scalar columns reads to the same rows and gives
the same local summaries.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsub_dist.cli import main
from dpsub_dist.engine.sources import parquet_dataset
from dpsub_dist.errors import DataError, InputError
from dpsub_dist.io.output import read_run
from dpsub_dist.io.parquet import Part, PartReader, feature_name
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error
from dpsub_dist.methods import _sample_aggregate as sa
from dpsub_dist.synth import generate


def fixed(values: np.ndarray, mask: np.ndarray | None = None) -> pa.FixedSizeListArray:
    """Rows of ``values`` (n × w) as a fixed_size_list<…>[w] array."""
    flat = pa.array(values.reshape(-1), mask=None if mask is None else mask.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


LIST_F64 = pa.list_(pa.float64())


def lists(values, type_: pa.DataType = LIST_F64) -> pa.Array:
    return pa.array([None if row is None else list(row) for row in values], type_)


def read_all(path, columns=None, unit_column=None) -> tuple[np.ndarray, object]:
    """Every row of the dataset through the real loader, in file order."""
    dataset = parquet_dataset(str(path), columns, unit_column, None, None)
    rows = [dataset.loader(part)[0] for part in dataset.parts]
    return np.concatenate(rows) if rows else np.empty((0, dataset.dim)), dataset


def matrix(rows: int = 1_000, dim: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, dim))


@pytest.fixture(scope="module")
def both_layouts(tmp_path_factory):
    """The same synthetic data as scalar columns x0..x11 and as one vector column x."""
    root = tmp_path_factory.mktemp("layouts")
    kwargs = dict(rows=6_000, dim=12, rank=2, partitions=3, seed=5, row_group_size=700)
    scalar = generate(root / "scalar", **kwargs)
    vector = generate(root / "vector", vector_column=True, **kwargs)
    return scalar, vector


def test_synth_vector_layout_has_the_same_rows_and_truth(both_layouts):
    scalar, vector = both_layouts
    schema = pq.ParquetFile(vector.files[0]).schema_arrow
    assert schema.names == ["x"]
    assert schema.field("x").type == pa.list_(pa.float32(), 12)
    assert vector.params["layout"] == "vector" and scalar.params["layout"] == "scalar"
    for a, b in zip(scalar.files, vector.files, strict=True):
        ma, mb = pq.ParquetFile(a).metadata, pq.ParquetFile(b).metadata
        assert [ma.row_group(i).num_rows for i in range(ma.num_row_groups)] == [
            mb.row_group(i).num_rows for i in range(mb.num_row_groups)
        ]
    for name in ("basis.npy",):
        assert (scalar.truth_dir / name).read_bytes() == (vector.truth_dir / name).read_bytes()


def test_vector_column_reads_exactly_like_scalar_columns(both_layouts):
    scalar, vector = both_layouts
    rows_s, ds_s = read_all(scalar.path)
    rows_v, ds_v = read_all(vector.path)
    assert ds_v.columns == ["x"] and ds_v.widths == [12] and ds_v.dim == 12
    assert ds_s.columns == [f"x{j}" for j in range(12)] and ds_s.widths is None
    assert ds_s.dim == 12 and ds_v.n_rows == ds_s.n_rows == 6_000
    assert rows_v.dtype == np.float64 and rows_v.shape == (6_000, 12)
    np.testing.assert_array_equal(rows_v, rows_s)
    assert ds_v.feature_name(11) == "x[11]" and ds_s.feature_name(11) == "x11"
    assert ds_v.vector_columns == {"x": 12} and ds_s.vector_columns == {}
    only, ds = read_all(vector.path, columns=["x"])
    assert ds.dim == 12
    np.testing.assert_array_equal(only, rows_s)


def _estimate_capturing_summaries(path, monkeypatch, **config):
    captured = []
    original = sa.aggregate

    def spy(ctx, summaries, *args, **kwargs):
        captured.append(np.array(summaries, copy=True))
        return original(ctx, summaries, *args, **kwargs)

    monkeypatch.setattr(sa, "aggregate", spy)
    cfg = EstimateConfig(**{"epsilon": 1.0, "delta": 1e-6, "seed": 3, **config})
    result = run_estimate(cfg, lambda c: parquet_dataset(str(path), None, None, None, c), None)
    monkeypatch.setattr(sa, "aggregate", original)
    (summaries,) = captured
    return summaries, result.manifest


@pytest.mark.parametrize("assign", ["random", "contiguous"])
def test_same_local_summaries_and_manifest_facts(both_layouts, monkeypatch, assign):
    scalar, vector = both_layouts
    config = dict(rank=2, subsets=40, assign=assign, center=False)  # no noisy mean
    summaries_s, manifest_s = _estimate_capturing_summaries(scalar.path, monkeypatch, **config)
    summaries_v, manifest_v = _estimate_capturing_summaries(vector.path, monkeypatch, **config)
    assert summaries_v.shape == summaries_s.shape
    np.testing.assert_array_equal(summaries_v, summaries_s)
    assert manifest_v["columns"] == ["x"]  # source columns, not 10⁵ generated names
    assert manifest_v["dim"] == manifest_s["dim"] == 12
    assert manifest_v["n_rows"] == manifest_s["n_rows"] == 6_000
    for key in ("subsets", "ref_points", "public_seed", "partitions"):
        assert manifest_v["parameters"][key] == manifest_s["parameters"][key]
    json.dumps(manifest_v, default=str)  # stays small and serialisable


def test_mixed_scalar_and_vector_columns_concatenate_in_column_order(tmp_path):
    data = matrix(900, 7, seed=1)
    table = pa.table(
        {
            "a": pa.array(data[:, 0]),
            "v": fixed(data[:, 1:4].astype(np.float32)),
            "label": pa.array(["s"] * 900),
            "b": pa.array(np.round(data[:, 4] * 100).astype(np.int32)),
            "w": lists(np.round(data[:, 5:7] * 100).astype(np.int64), pa.large_list(pa.int64())),
        }
    )
    path = tmp_path / "mixed.parquet"
    pq.write_table(table, path, row_group_size=250)
    expected = np.column_stack(
        [
            data[:, 0],
            data[:, 1:4].astype(np.float32).astype(np.float64),
            np.round(data[:, 4] * 100).astype(np.int32),
            np.round(data[:, 5:7] * 100),
        ]
    )
    rows, dataset = read_all(path)
    assert dataset.columns == ["a", "v", "b", "w"] and dataset.widths == [None, 3, None, 2]
    assert dataset.dim == 7
    assert [dataset.feature_name(j) for j in range(7)] == [
        "a", "v[0]", "v[1]", "v[2]", "b", "w[0]", "w[1]"
    ]  # fmt: skip
    np.testing.assert_array_equal(rows, expected)
    rows, dataset = read_all(path, columns=["w", "a"])  # requested order
    assert dataset.dim == 3
    np.testing.assert_array_equal(rows, np.column_stack([expected[:, 5:7], expected[:, 0]]))


def test_runs_of_scalar_columns_are_written_block_by_block_exactly(tmp_path, monkeypatch):
    """Adjacent scalar columns (float32, int64, uint8, float64, a decimal between them) are
    stacked and written in blocks of rows (here 5 rows: the block size patched small), with
    a vector column splitting the runs: the rows equal the columns' values exactly."""
    import dpsub_dist.io.parquet as parquet

    monkeypatch.setattr(parquet, "SCALAR_BLOCK_BYTES", 8 * 3 * 5)  # 5 rows of a 3-column run
    data = matrix(203, 8, seed=2)
    cents = np.round(data[:, 3] * 100)
    table = pa.table(
        {
            "f32": pa.array(data[:, 0].astype(np.float32)),
            "i64": pa.array(np.round(data[:, 1] * 1e6).astype(np.int64)),
            "u8": pa.array((np.abs(data[:, 2]) * 50).astype(np.uint8)),
            "dec": pa.array([f"{c / 100:.2f}" for c in cents]).cast(pa.decimal128(12, 2)),
            "f64": pa.array(data[:, 4]),
            "v": fixed(data[:, 5:7]),
            "last": pa.array(data[:, 7]),
        }
    )
    path = tmp_path / "runs.parquet"
    pq.write_table(table, path, row_group_size=60)  # several chunks per column
    expected = np.column_stack(
        [
            data[:, 0].astype(np.float32),
            np.round(data[:, 1] * 1e6).astype(np.int64),
            (np.abs(data[:, 2]) * 50).astype(np.uint8),
            cents / 100,
            data[:, 4:8],
        ]
    )
    rows, dataset = read_all(path)
    assert dataset.dim == 8
    np.testing.assert_array_equal(rows, expected)
    assert rows.flags.c_contiguous and rows.dtype == np.float64


def test_feature_name_without_widths_is_the_column():
    assert feature_name(["p", "q"], None, 1) == "q"
    assert feature_name(["p", "x"], [None, 4], 4) == "x[3]"


@pytest.mark.parametrize(
    "type_", [pa.list_(pa.float32()), pa.large_list(pa.float64()), pa.list_(pa.int16())]
)
def test_variable_lists_of_equal_length_work(tmp_path, type_):
    data = np.round(matrix(1_000, 5, seed=2) * 50)
    path = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"x": lists(data, type_)}), path, row_group_size=300)
    rows, dataset = read_all(path)
    assert dataset.widths == [5] and dataset.dim == 5
    np.testing.assert_array_equal(rows, data.astype(type_.value_type.to_pandas_dtype()))


def test_list_rows_of_unequal_length_name_file_column_and_row(tmp_path):
    data = [list(row) for row in matrix(1_000, 4, seed=3)]
    data[650] = data[650][:3]
    path = tmp_path / "ragged.parquet"
    pq.write_table(pa.table({"x": lists(data)}), path, row_group_size=300)
    with pytest.raises(InputError) as err:
        read_all(path)
    message = str(err.value)
    assert str(path) in message and "list column x" in message
    assert "row 650 has 3 values, expected 4" in message
    # a part that starts at row group 2 still reports the row's position in the file
    reader = PartReader(("x",), widths=(4,))
    with pytest.raises(InputError, match="row 650 has 3 values"):
        reader(Part(str(path), (2,), 300))


def test_list_widths_that_differ_between_files(tmp_path):
    """The first file's first row sets the width; the pass finds the other file's rows."""
    pq.write_table(pa.table({"x": lists(matrix(10, 4))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": lists(matrix(10, 5))}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b.parquet: list column x has rows of different "
                       r"lengths \(row 0 has 5 values, expected 4\)"):  # fmt: skip
        read_all(tmp_path)


def test_a_null_first_row_is_found_by_the_pass_not_at_open(tmp_path):
    data: list = [list(row) for row in matrix(20, 3)]
    data[0] = None
    pq.write_table(pa.table({"x": lists(data)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": lists(matrix(10, 3))}), tmp_path / "b.parquet")
    dataset = parquet_dataset(str(tmp_path), None, None, None, None)
    assert dataset.widths == [3] and dataset.widths_from_rows == ("x",)  # from b's first row
    with pytest.raises(DataError, match="column x has 1 missing"):
        read_all(tmp_path)
    pq.write_table(pa.table({"x": lists([None, [1.0]])}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match="null.* list in the first row of every file"):
        read_all(tmp_path)


def test_fixed_size_widths_that_differ_are_schema_drift(tmp_path):
    pq.write_table(pa.table({"x": fixed(matrix(10, 4))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": fixed(matrix(10, 5))}), tmp_path / "b.parquet")
    with pytest.raises(InputError, match="schema differs between"):
        read_all(tmp_path)


def test_null_element_names_column_and_element(tmp_path):
    data = matrix(500, 6, seed=4)
    mask = np.zeros(data.shape, dtype=bool)
    mask[[10, 20], 4] = True
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"x": fixed(data, mask)}), path, row_group_size=100)
    with pytest.raises(InputError, match=r"nulls.parquet: column x\[4\] has 2 missing values"):
        read_all(path)


def test_null_list_is_reported(tmp_path):
    data: list = [list(row) for row in matrix(500, 3)]
    data[7] = None
    path = tmp_path / "nulllist.parquet"
    pq.write_table(pa.table({"x": lists(data)}), path)
    with pytest.raises(InputError, match=r"column x has (1 missing \(null\) lists|a missing)"):
        read_all(path)
    fixed_nulls = pa.FixedSizeListArray.from_arrays(
        pa.array(matrix(500, 3).reshape(-1)), 3, mask=pa.array(np.arange(500) == 9)
    )
    pq.write_table(pa.table({"x": fixed_nulls}), path)
    with pytest.raises(InputError, match=r"column x has 1 missing \(null\) lists"):
        read_all(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_name_column_and_element(tmp_path, bad):
    data = matrix(400, 5, seed=6)
    data[[3, 30, 300], 2] = bad
    path = tmp_path / "nan.parquet"
    pq.write_table(pa.table({"a": data[:, 0], "x": fixed(data[:, 1:])}), path)
    with pytest.raises(InputError, match=r"column x\[1\] has 3 NaN or infinite values"):
        read_all(path)


def test_non_numeric_lists_are_rejected_like_non_numeric_columns(tmp_path):
    data = matrix(100, 3)
    table = pa.table(
        {
            "a": data[:, 0],
            "tags": pa.array([["p", "q"]] * 100),
            "nested": pa.array([[[1.0]]] * 100),
            "flags": pa.array([[True, False]] * 100),
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    _, dataset = read_all(path)  # default: skipped
    assert dataset.columns == ["a"] and dataset.dim == 1
    with pytest.raises(InputError, match=r"non-numeric columns requested: \['tags \(list<"):
        read_all(path, columns=["a", "tags"])
    with pytest.raises(InputError, match=r"non-numeric columns requested: \['nested"):
        read_all(path, columns=["nested"])
    only_text = tmp_path / "text"
    only_text.mkdir()
    pq.write_table(table.select(["tags", "flags"]), only_text / "t.parquet")
    with pytest.raises(InputError, match="no numeric columns"):
        read_all(only_text)


def test_list_unit_column_is_refused(tmp_path):
    path = tmp_path / "u.parquet"
    pq.write_table(pa.table({"x": fixed(matrix(50, 3)), "user": lists(matrix(50, 2))}), path)
    with pytest.raises(InputError, match="unit column 'user' is a list"):
        read_all(path, columns=["x"], unit_column="user")


def test_list_without_rows_has_no_known_width(tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"x": lists([])}), path)
    with pytest.raises(InputError, match="list column x has no rows in any file"):
        read_all(path)


def test_sliced_chunks_are_read_at_their_offsets():
    """Tables whose chunks are slices (offset > 0) convert correctly."""
    from dpsub_dist.io.parquet import _read_vector

    data = matrix(40, 3, seed=8)
    for array in (fixed(data), lists(data)):
        column = pa.chunked_array([array.slice(5, 10), array.slice(20, 7)])
        out = np.empty((17, 3))
        _read_vector(column, 3, out, "x", "mem", 0)
        np.testing.assert_array_equal(out, np.concatenate([data[5:15], data[20:27]]))


def test_cli_synth_vector_column_then_estimate(tmp_path, scheduler_address, capsys):
    data, out = tmp_path / "data", tmp_path / "run"
    argv = ["synth", str(data), "--rows", "20000", "--dim", "10", "--rank", "2"]
    assert main([*argv, "--partitions", "4", "--seed", "7", "--vector-column", "--quiet"]) == 0
    assert "20000 rows × 10 features (vector column x)" in capsys.readouterr().out
    assert pq.ParquetFile(data / "part-00000.parquet").schema_arrow.names == ["x"]
    code = main(
        ["estimate", str(data), "--rank", "2", "--epsilon", "1", "--delta", "1e-6"]
        + ["--out", str(out), "--scheduler", scheduler_address, "--seed", "3", "--quiet"]
    )
    assert code == 0, capsys.readouterr().err
    basis, manifest = read_run(str(out))
    assert basis.shape == (10, 2)
    assert manifest["columns"] == ["x"] and manifest["dim"] == 10
    assert subspace_error(basis, np.load(data / "_truth" / "basis.npy")) < 0.1
    code = main(
        ["estimate", str(data), "--rank", "2", "--epsilon", "1", "--delta", "1e-6"]
        + ["--out", str(tmp_path / "run2"), "--scheduler", scheduler_address, "--quiet"]
        + ["--columns", "x", "--method", "gauss", "--row-norm", "5"]
    )
    assert code == 0, capsys.readouterr().err


def test_stream_appends_vector_batches_and_refuses_a_width_change(tmp_path, dask_client):
    from dpsub_dist.job import StreamConfig, init_stream
    from dpsub_dist.methods.stream import open_stream

    state = str(tmp_path / "stream.db")
    options = {"horizon": 3, "rank": 2, "clip_norm": 5.0, "rho": 1.0, "delta": 1e-6}
    init_stream(state, StreamConfig(**options, columns=["x"]))
    for i, width in enumerate((6, 6)):
        pq.write_table(pa.table({"x": fixed(matrix(300, width, i))}), tmp_path / f"b{i}.parquet")
    pq.write_table(pa.table({"x": fixed(matrix(300, 7, 9))}), tmp_path / "wide.parquet")
    with open_stream(state) as stream:
        release = stream.append(str(tmp_path / "b0.parquet"), client=dask_client)
        assert release.basis.shape == (6, 2)
        assert release.manifest["dim"] == 6 and release.manifest["columns"] == ["x"]
        with pytest.raises(InputError, match="has 7 features but the stream's earlier batches"):
            stream.append(str(tmp_path / "wide.parquet"), client=dask_client)
        assert stream.append(str(tmp_path / "b1.parquet"), client=dask_client).step == 2
