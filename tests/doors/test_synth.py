"""Tests for dpsub_dist.synth: layout, determinism, known answers, scaling, atomicity."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dpsub_dist import synth


def read_x(path: Path) -> np.ndarray:
    """The whole dataset as a float64 matrix, rows in file order."""
    table = pq.read_table(path)
    return np.column_stack([table.column(n).to_numpy() for n in table.column_names]).astype(
        np.float64
    )


def proj_err(a: np.ndarray, b: np.ndarray) -> float:
    """Operator-norm distance between the projections onto span(a) and span(b)."""
    return float(np.linalg.norm(a @ a.T - b @ b.T, 2))


def top_right_sv(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    return vt[:k].T, s


def test_layout_and_truth(tmp_path):
    calls = []
    out = tmp_path / "d"
    res = synth.generate(
        out,
        rows=1000,
        dim=7,
        rank=2,
        partitions=3,
        row_group_size=100,
        seed=5,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]  # 0 first: the clock starts there
    assert res.path == out and (res.rows, res.dim, res.rank) == (1000, 7, 2)
    assert [f.name for f in res.files] == [f"part-0000{i}.parquet" for i in range(3)]
    assert sorted(p.name for p in out.glob("*.parquet")) == [f.name for f in res.files]
    sizes = []
    for f in res.files:
        meta = pq.ParquetFile(f).metadata
        sizes.append(meta.num_rows)
        assert meta.num_columns == 7
        assert all(meta.row_group(i).num_rows <= 100 for i in range(meta.num_row_groups))
        assert meta.row_group(0).num_rows == 100
        assert meta.row_group(0).column(0).compression == "SNAPPY"
        schema = pq.read_schema(f)
        assert schema.names == [f"x{j}" for j in range(7)]
        assert all(str(t) == "float" for t in schema.types)
    assert sizes == [334, 333, 333]
    assert read_x(out).shape == (1000, 7)

    u = np.load(out / "_truth" / "basis.npy")
    assert u.shape == (7, 2) and u.dtype == np.float64
    np.testing.assert_allclose(u.T @ u, np.eye(2), atol=1e-12)
    assert res.basis_paths == (out / "_truth" / "basis.npy",) and res.bases_path is None
    params = json.loads((out / "_truth" / "params.json").read_text())
    for key, val in dict(rows=1000, dim=7, rank=2, gamma=0.01, model="gaussian", seed=5,
                         order="random", partitions=3, dtype="float32", clusters=None,
                         row_group_size=100, outlier_fraction=0.0).items():  # fmt: skip
        assert params[key] == val, key
    assert params["rows_per_partition"] == [334, 333, 333]
    basis, params2 = synth.read_truth(out)
    np.testing.assert_array_equal(basis, u)
    assert params2 == params == res.params
    assert not (out / "_truth" / "outliers.npy").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # temp folder renamed away


def test_float64_and_default_partitions(tmp_path):
    res = synth.generate(tmp_path / "d", rows=50, dim=3, rank=1, dtype="float64")
    assert len(res.files) == 1
    assert [str(t) for t in pq.read_schema(res.files[0]).types] == ["double"] * 3
    assert synth.default_partitions(10_000_000, 32, "float32") == 10
    assert synth.default_partitions(1_000_000, 200, "float64") == 12  # 128 MiB files
    assert synth.default_partitions(1000, 100_000, "float64") == 6  # 167 rows of 800 kB
    assert synth.default_partitions(5, 3, "float32") == 1


def test_determinism(tmp_path):
    kw = dict(rows=3000, dim=6, rank=2, partitions=2, outlier_fraction=0.01, row_group_size=500)
    a = synth.generate(tmp_path / "a", seed=1, **kw)
    b = synth.generate(tmp_path / "b", seed=1, **kw)
    c = synth.generate(tmp_path / "c", seed=2, **kw)
    for fa, fb in zip(a.files, b.files, strict=True):
        assert pq.read_table(fa).equals(pq.read_table(fb))
    np.testing.assert_array_equal(a.load_basis(), b.load_basis())
    np.testing.assert_array_equal(
        np.load(a.truth_dir / "outliers.npy"), np.load(b.truth_dir / "outliers.npy")
    )
    assert not np.allclose(read_x(a.path), read_x(c.path))
    assert not np.allclose(a.load_basis(), c.load_basis())


def test_gaussian_known_answer(tmp_path):
    gamma, k = 0.01, 3
    res = synth.generate(tmp_path / "g", rows=20_000, dim=20, rank=k, gamma=gamma, seed=3)
    x = read_x(res.path)
    v, s = top_right_sv(x, k)
    assert proj_err(v, res.load_basis()) < 0.05
    # Sample eigenvalues: ~1 (k of them) and ~γ² (the rest): multiplicative gap ≈ γ².
    ratio = s[k] ** 2 / s[k - 1] ** 2
    assert 0.5 * gamma**2 < ratio < 2 * gamma**2
    np.testing.assert_allclose(s[:k] ** 2 / len(x), 1.0, atol=0.05)
    # The noise is orthogonal to U: the residual of x along U vanishes up to float32.
    u = res.load_basis()
    resid = x - (x @ u) @ u.T
    assert np.abs(resid @ u).max() < 1e-5


def test_sphere_norms(tmp_path):
    res = synth.generate(tmp_path / "s", rows=5000, dim=20, rank=3, model="sphere", gamma=0.01)
    x = read_x(res.path)
    norms = np.linalg.norm(x, axis=1)
    assert np.abs(norms - 1).max() < 0.2
    assert abs(np.median(norms) - 1) < 0.01
    v, _ = top_right_sv(x, 3)
    assert proj_err(v, res.load_basis()) < 0.05


def test_exact_rank(tmp_path):
    res = synth.generate(tmp_path / "e", rows=2000, dim=12, rank=4, model="exact")
    x = read_x(res.path)
    v, s = top_right_sv(x, 4)
    assert s[4] / s[3] < 1e-5
    assert s[3] / s[0] > 0.5  # general position: all k directions well represented
    assert proj_err(v, res.load_basis()) < 1e-5


def test_adversarial_order(tmp_path):
    n, k = 12_000, 3
    res = synth.generate(tmp_path / "a", rows=n, dim=10, rank=k, order="adversarial", seed=4)
    x = read_x(res.path)
    u = res.load_basis()
    block = -(-n // (4 * k))
    assert res.params["adversarial_block_rows"] == block == 1000
    for b in (0, 1, 2, 5):
        rows = x[b * block : (b + 1) * block]
        v, s = top_right_sv(rows, 2)
        assert s[1] / s[0] < 0.05  # one direction only
        assert abs(v[:, 0] @ u[:, b % k]) > 0.999  # and it is u_{b mod k}
    # A contiguous subset (here the first block) misses most of the subspace...
    v1, _ = top_right_sv(x[:block], k)
    assert proj_err(v1, u) > 0.9
    # ...the whole data, or a random subset of the same size, spans the full subspace.
    v, _ = top_right_sv(x, k)
    assert proj_err(v, u) < 0.05
    rand = np.random.default_rng(0).choice(n, size=block, replace=False)
    v, _ = top_right_sv(x[rand], k)
    assert proj_err(v, u) < 0.05


def test_outliers(tmp_path):
    n, f = 10_000, 0.03
    res = synth.generate(tmp_path / "o", rows=n, dim=16, rank=2, outlier_fraction=f, partitions=3)
    x = read_x(res.path)
    norms = np.linalg.norm(x, axis=1)
    typical = res.params["typical_norm"]
    huge = np.flatnonzero(norms > 100 * typical)
    assert len(huge) == round(f * n) == res.params["outlier_count"]
    np.testing.assert_array_equal(huge, np.load(res.truth_dir / "outliers.npy"))
    np.testing.assert_allclose(norms[huge], 1000 * typical, rtol=1e-5)
    assert norms[np.setdiff1d(np.arange(n), huge)].max() < 5 * typical
    assert sum(res.params["outliers_per_partition"]) == len(huge)


@pytest.mark.parametrize("order", ["random", "adversarial"])
def test_clusters(tmp_path, order):
    kk, k, n, gamma = 3, 2, 6000, 0.01
    res = synth.generate(
        tmp_path / "c", rows=n, dim=12, rank=k, clusters=kk, gamma=gamma, order=order,
        outlier_fraction=0.01, seed=7,
    )  # fmt: skip
    truth = res.truth_dir
    assert not (truth / "basis.npy").exists()
    bases = np.load(truth / "bases.npy")
    assert bases.shape == (kk, 12, k) and res.bases_path == truth / "bases.npy"
    for c in range(kk):
        np.testing.assert_array_equal(np.load(truth / f"basis_{c}.npy"), bases[c])
        np.testing.assert_allclose(bases[c].T @ bases[c], np.eye(k), atol=1e-12)
    np.testing.assert_array_equal(res.load_basis(), bases)
    x = read_x(res.path)
    labels = np.load(truth / "labels.npy")
    assert labels.shape == (n,)
    resid = np.stack([np.linalg.norm(x - (x @ b) @ b.T, axis=1) for b in bases], axis=1)
    inl = labels >= 0
    assert (labels == -1).sum() == 60
    assert resid[inl].min(axis=1).max() < 10 * gamma * np.sqrt(12)  # near one subspace
    # Rows not too close to the origin (where all subspaces meet) are nearest their own one.
    far = inl & (np.linalg.norm(x, axis=1) > 0.5)
    assert far.sum() > 0.5 * n
    np.testing.assert_array_equal(resid[far].argmin(axis=1), labels[far])
    counts = np.bincount(labels[inl], minlength=kk)
    assert counts.min() > 0.25 * n
    if order == "adversarial":
        block = res.params["adversarial_block_rows"]
        assert block == -(-n // (4 * kk * k))
        first = x[:block][labels[:block] >= 0]
        assert (labels[:block][labels[:block] >= 0] == 0).all()
        _, s, vt = np.linalg.svd(first, full_matrices=False)
        assert s[1] / s[0] < 0.05 and abs(vt[0] @ bases[0][:, 0]) > 0.999


def test_clusters_one_matches_plain(tmp_path):
    kw = dict(rows=500, dim=5, rank=2, seed=9)
    a = synth.generate(tmp_path / "a", **kw)
    b = synth.generate(tmp_path / "b", clusters=1, **kw)
    np.testing.assert_array_equal(read_x(a.path), read_x(b.path))
    np.testing.assert_array_equal(np.load(b.truth_dir / "labels.npy"), np.zeros(500))


@pytest.mark.parametrize("dim", [20_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_wide_dim_no_dense_projector(tmp_path, dim):
    # A dim × dim projector would be 3.2 / 80 GB here; the chunked e − U(Uᵀe) needs a few MB.
    res = synth.generate(tmp_path / "w", rows=3, dim=dim, rank=2, gamma=0.1)
    x = read_x(res.path)
    u = res.load_basis()
    assert x.shape == (3, dim)
    resid = x - (x @ u) @ u.T
    assert np.abs(resid @ u).max() < 1e-3


RSS_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    from dpsub_dist import synth
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    synth.generate(sys.argv[1], rows=int(sys.argv[2]), dim=32, rank=4, partitions=4)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((after - before) * 1024)
    """
)


def _rss_growth(tmp_path: Path, rows: int) -> int:
    root = str(Path(synth.__file__).resolve().parents[1])
    proc = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(tmp_path / "big"), str(rows)],
        capture_output=True, text=True, check=True, timeout=120,
        env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert len(list((tmp_path / "big").glob("*.parquet"))) == 4
    return int(proc.stdout.strip().splitlines()[-1])


def test_streaming_memory_smoke(tmp_path):
    # 2,000,000 × 32 float32 is 256 MB of data; generation must stream it.
    growth = _rss_growth(tmp_path, 2_000_000)
    assert growth < 250 * 2**20, f"peak RSS grew by {growth / 2**20:.0f} MiB"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(rows=0), "rows"),
        (dict(rows=2.5), "rows"),
        (dict(dim=1, rank=1), "dim"),
        (dict(rank=0), "rank"),
        (dict(rank=8), "rank"),
        (dict(gamma=-0.1), "gamma"),
        (dict(gamma=float("nan")), "gamma"),
        (dict(model="laplace"), "model"),
        (dict(order="sorted"), "order"),
        (dict(outlier_fraction=1.0), "outlier_fraction"),
        (dict(outlier_fraction=-0.01), "outlier_fraction"),
        (dict(partitions=0), "partitions"),
        (dict(partitions=11), "partitions"),
        (dict(dtype="int8"), "dtype"),
        (dict(seed=-1), "seed"),
        (dict(clusters=0), "clusters"),
        (dict(clusters=3), "clusters"),  # 3 * 3 > 8
        (dict(row_group_size=0), "row_group_size"),
        (dict(progress=3), "progress"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, name):
    args = dict(rows=10, dim=8, rank=3) | kwargs
    with pytest.raises(ValueError, match=rf"^{name} must be ") as info:
        synth.generate(tmp_path / "d", **args)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, synth.SynthParameterError)
    assert not (tmp_path / "d").exists()


def test_existing_folder(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    synth.generate(out, rows=10, dim=3, rank=1)  # an empty folder is fine
    with pytest.raises(FileExistsError, match="new path"):
        synth.generate(out, rows=10, dim=3, rank=1)
    res = synth.generate(out, rows=20, dim=4, rank=1, overwrite=True)
    assert read_x(out).shape == (20, 4) and res.params["dim"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["d"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        synth.generate(tmp_path / "file", rows=10, dim=3, rank=1, overwrite=True)


def test_failure_leaves_nothing(tmp_path, monkeypatch):
    real = synth._write_partition
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(synth, "_write_partition", flaky)
    with pytest.raises(OSError, match="injected"):
        synth.generate(tmp_path / "d", rows=100, dim=3, rank=1, partitions=3)
    assert list(tmp_path.iterdir()) == []

    # With overwrite, a failed run keeps the previous dataset intact.
    monkeypatch.setattr(synth, "_write_partition", real)
    synth.generate(tmp_path / "d", rows=100, dim=3, rank=1, partitions=3, seed=1)
    before = read_x(tmp_path / "d")
    calls.clear()
    monkeypatch.setattr(synth, "_write_partition", flaky)
    with pytest.raises(OSError, match="injected"):
        synth.generate(tmp_path / "d", rows=100, dim=3, rank=1, partitions=3, overwrite=True)
    np.testing.assert_array_equal(read_x(tmp_path / "d"), before)
    assert [p.name for p in tmp_path.iterdir()] == ["d"]
