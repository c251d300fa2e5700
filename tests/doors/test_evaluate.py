"""``dpsub evaluate``: a non-orthonormal truth is refused; ``--data`` gives the captured-variance
ratio against the non-private PCA of the same rows (an operator's check that writes nothing)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsub_dist.cli import main
from dpsub_dist.io.output import write_run

SCALES = {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0}
"""Column standard deviations of the table below: its centred covariance is exactly
diag(16, 9, 4, 1), so the top-2 PCA is span(e_a, e_b) and captures 25."""


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    """Every sign pattern of 4 columns, 100 times: orthogonal, zero-mean columns; then column
    a is shifted by 1000 (a mean that centring removes) and two non-features are added."""
    signs = np.array(list(itertools.product([-1.0, 1.0], repeat=4)))
    rows = np.tile(signs, (100, 1)) * np.array(list(SCALES.values()))
    frame = pd.DataFrame(rows, columns=list(SCALES))
    frame["a"] += 1000.0
    frame["e"] = np.arange(len(frame), dtype=float)  # numeric but not fitted on
    frame["name"] = "x"
    path = tmp_path / "data.parquet"
    frame[["e", "d", "name", "c", "b", "a"]].to_parquet(path)  # another column order
    return path


def run(tmp_path: Path, basis: np.ndarray, columns: list[str] | None = None) -> Path:
    out = tmp_path / "run"
    manifest = {"outcome": "ok", "columns": columns or list(SCALES), "method": "gauss"}
    write_run(str(out), basis, manifest, overwrite=True)
    return out


def axes(*names: str) -> np.ndarray:
    return np.eye(len(SCALES))[:, [list(SCALES).index(n) for n in names]]


def values(line: str) -> dict[str, float]:
    pairs = (item.split("=") for item in line.split() if "=" in item)
    return {key: float(value) for key, value in pairs}


def test_non_orthonormal_truth_is_refused(tmp_path, capsys):
    out = run(tmp_path, axes("a", "b"))
    truth = tmp_path / "truth.npy"
    np.save(truth, axes("a", "b") * 2.0)  # right span, wrong lengths
    assert main(["evaluate", str(out), "--truth", str(truth)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "not orthonormal (‖UᵀU − I‖ = 3," in err and "qr" in err
    np.save(truth, axes("a", "b") @ np.array([[1.0, 0.0], [0.0, -1.0]]))  # orthonormal
    assert main(["evaluate", str(out), "--truth", str(truth)]) == 0
    assert capsys.readouterr().out.strip() == "subspace_error=0.000000"


def test_non_orthonormal_cluster_truth_is_refused(tmp_path, capsys):
    out = run(tmp_path, np.stack([axes("a"), axes("b")]))
    truth = tmp_path / "truth.npy"
    np.save(truth, np.stack([axes("a"), axes("b") * 1.5]))
    assert main(["evaluate", str(out), "--truth", str(truth)]) == 2
    assert "not orthonormal" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("basis", "ratio", "error"),
    [(("a", "b"), 1.0, 0.0), (("b", "a"), 1.0, 0.0), (("a", "c"), 20 / 25, 1.0)],
)
def test_data_metric_has_the_known_answer(
    table, tmp_path, scheduler_address, capsys, basis, ratio, error
):
    out = run(tmp_path, axes(*basis))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code = main(["evaluate", str(out), "--data", str(table), "--scheduler", scheduler_address])
    assert code == 0
    printed = capsys.readouterr().out
    assert "operator check, not a release" in printed
    assert "1600 rows" in printed and "a, b, c, d" in printed
    found = values(printed.strip().splitlines()[-1])
    assert found["captured_variance_ratio"] == pytest.approx(ratio, abs=1e-6)
    assert found["subspace_error_vs_pca"] == pytest.approx(error, abs=1e-6)
    assert found["pca_explained_variance_fraction"] == pytest.approx(25 / 30, abs=1e-6)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing written


def test_uncentred_data_metric(table, tmp_path, scheduler_address, capsys):
    """Uncentred, column a's mean (1000) dominates: the top-2 second-moment axes are still
    a and b, and span(a, c) captures (10⁶ + 16 + 4) of (10⁶ + 16 + 9)."""
    out = run(tmp_path, axes("a", "c"))
    cmd = ["evaluate", str(out), "--data", str(table), "--no-center"]
    assert main([*cmd, "--scheduler", scheduler_address]) == 0
    found = values(capsys.readouterr().out.strip().splitlines()[-1])
    expected = (1e6 + 16 + 4) / (1e6 + 16 + 9)
    assert found["captured_variance_ratio"] == pytest.approx(expected, abs=1e-6)


def test_data_metric_matches_sklearn_pca(tmp_path, scheduler_address, capsys):
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(5)
    rows = rng.standard_normal((3000, 6)) @ rng.standard_normal((6, 6)) + 50.0
    columns = [f"x{j}" for j in range(6)]
    pd.DataFrame(rows, columns=columns).to_parquet(tmp_path / "r.parquet")
    basis = np.linalg.qr(rng.standard_normal((6, 3)))[0]
    out = run(tmp_path, basis, columns)
    cmd = ["evaluate", str(out), "--data", str(tmp_path / "r.parquet")]
    assert main([*cmd, "--scheduler", scheduler_address]) == 0
    found = values(capsys.readouterr().out.strip().splitlines()[-1])
    pca = PCA(n_components=3).fit(rows)
    cov = np.cov(rows, rowvar=False)
    expected = np.trace(basis.T @ cov @ basis) / pca.explained_variance_.sum()
    assert found["captured_variance_ratio"] == pytest.approx(expected, abs=1e-6)
    cosines = np.linalg.svd(basis.T @ pca.components_.T, compute_uv=False)
    assert found["subspace_error_vs_pca"] == pytest.approx(
        np.sqrt(1 - cosines.min() ** 2), abs=1e-6
    )


def test_refusals(table, tmp_path, capsys):
    out = run(tmp_path, axes("a", "b"))
    assert main(["evaluate", str(out)]) == 2
    assert "--truth" in capsys.readouterr().err
    clustered = run(tmp_path, np.stack([axes("a"), axes("b")]))
    assert main(["evaluate", str(clustered), "--data", str(table)]) == 2
    assert "one basis" in capsys.readouterr().err
