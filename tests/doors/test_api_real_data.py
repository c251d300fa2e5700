"""What a real-data user of the Python API and CLI sees: the private mean and centring through
``transform``, explained variance from released values only, feature checks at ``transform``
(count, names, order, ``columns=``, paths), the columns named on success and the schema-only
warning about identifier-like feature columns."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsub_dist import PrivateSubspace
from dpsub_dist.cli import main
from dpsub_dist.privacy import noise

ROWS, DIM, RANK = 50_000, 6, 3
MEAN = np.array([40.0, -30.0, 20.0, 10.0, -25.0, 15.0])
SCALES = np.array([6.0, 4.0, 2.0])
ROW_NORM = 100.0  # public bound above every row's norm here: nothing is clipped
BUDGET = {"epsilon": 50.0, "delta": 1e-6}  # large n·ε: a known-answer test


def shifted_low_rank(rows: int = ROWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``MEAN + z·diag(SCALES)·Wᵀ + small noise`` and the orthonormal d×k truth ``W``."""
    rng = np.random.default_rng(seed)
    truth, _ = np.linalg.qr(rng.standard_normal((DIM, RANK)))
    latent = rng.standard_normal((rows, RANK)) * SCALES
    return MEAN + latent @ truth.T + 0.05 * rng.standard_normal((rows, DIM)), truth


def gauss(rank: int = RANK, **kwargs) -> PrivateSubspace:
    params = {"method": "gauss", "row_norm": ROW_NORM, "seed": 1, **BUDGET, **kwargs}
    return PrivateSubspace(rank, **params)


def test_centred_fit_exposes_the_private_mean_and_transform_applies_it() -> None:
    X, truth = shifted_low_rank()
    est = gauss(center=True).fit(X)
    released = np.asarray(est.manifest_["release"]["mean"])
    assert est.mean_ is not None and np.array_equal(est.mean_, released)
    assert np.allclose(est.mean_, X.mean(axis=0), atol=0.05)
    np.testing.assert_allclose(est.transform(X), (X - est.mean_) @ est.basis_, atol=1e-9)
    # points of the true affine subspace come back (up to the estimate's small error)
    on_plane = MEAN + np.random.default_rng(5).standard_normal((50, RANK)) * SCALES @ truth.T
    assert np.abs(est.inverse_transform(est.transform(on_plane)) - on_plane).max() < 0.5
    # and points of the released affine subspace exactly
    released_plane = est.mean_ + np.arange(12.0).reshape(4, RANK) @ est.components_
    np.testing.assert_allclose(est.inverse_transform(est.transform(released_plane)), released_plane)
    assert gauss().fit(X).mean_ is not None  # centred by default (the estimate is PCA)
    uncentred = gauss(center=False).fit(X)
    assert uncentred.mean_ is None
    np.testing.assert_allclose(uncentred.transform(X), X @ uncentred.basis_, atol=1e-9)


def test_explained_variance_is_sorted_sums_to_at_most_one_and_is_close_to_the_truth() -> None:
    X, _ = shifted_low_rank()
    est = gauss(center=True).fit(X)
    true_values = np.linalg.eigvalsh(np.cov(X.T, bias=True))[::-1]
    ratio, variance = est.explained_variance_ratio_, est.explained_variance_
    assert ratio.shape == (RANK,) and variance.shape == (RANK,)
    assert ratio.sum() <= 1.0 and np.all(np.diff(ratio) <= 0) and np.all(ratio >= 0)
    np.testing.assert_allclose(ratio, true_values[:RANK] / true_values.sum(), atol=0.015)
    np.testing.assert_allclose(variance, true_values[:RANK], rtol=0.1)
    release = est.manifest_["release"]
    assert release["explained_variance"] == variance.tolist()
    assert release["explained_variance_ratio"] == ratio.tolist()
    # components are ordered by it: each one's variance along the data matches, descending
    along = ((X - est.mean_) @ est.basis_).var(axis=0)
    assert np.all(np.diff(along) <= 0)


@pytest.mark.parametrize("bump", [0.0, 2.0e5], ids=["noise-zero", "noise-bump"])
def test_explained_variance_follows_the_released_noisy_matrix(monkeypatch, bump: float) -> None:
    """The noise is replaced by a known matrix E: the variances are the eigenvalues of the
    released ``AᵀA + E`` (row_norm²/n), not of the exact Gram, and the components follow them."""
    X, _ = shifted_low_rank()
    E = np.zeros((DIM, DIM))
    E[5, 5] = bump  # a large released variance along feature 5 alone

    def known_noise(rng, matrix, sigma, sensitivity):
        return matrix + E

    monkeypatch.setattr(noise, "add_symmetric_gaussian", known_noise)
    est = gauss(center=False).fit(X)  # the uncentred Gram, so AᵀA is known here
    scaled = X / ROW_NORM
    released = scaled.T @ scaled + E
    values = np.linalg.eigvalsh(released)[::-1]
    np.testing.assert_allclose(est.explained_variance_, values[:RANK] * ROW_NORM**2 / ROWS)
    np.testing.assert_allclose(est.explained_variance_ratio_, values[:RANK] / np.trace(released))
    top = np.abs(est.components_[0])
    assert (np.argmax(top) == 5 and top[5] > 0.99) == (bump > 0)


def test_gap_perturb_pays_for_its_explained_variance() -> None:
    X, _ = shifted_low_rank()
    est = gauss(method="gap-perturb").fit(X)  # its projector has no variances: two more steps
    steps = [s["step"] for s in est.manifest_["privacy"]["budget"]["steps"]]
    assert steps[-2:] == ["variance_norm_bound", "explained_variance"]
    ratio = est.explained_variance_ratio_
    assert ratio.shape == (RANK,) and ratio.sum() <= 1.0 and np.all(np.diff(ratio) <= 0)
    assert est.explained_variance_ is not None
    assert np.allclose(est.mean_, X.mean(axis=0), atol=0.05)  # centred by default


def _write(path: Path, frame: pd.DataFrame) -> Path:
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path


def test_user_level_gives_the_ratio_only(tmp_path: Path) -> None:
    X, _ = shifted_low_rank(rows=4_000)
    frame = pd.DataFrame(X - MEAN, columns=list("abcdef"))
    frame["user"] = np.arange(len(frame)) // 2
    path = _write(tmp_path / "users.parquet", frame)
    est = gauss(unit_column="user").fit(path)
    assert est.explained_variance_ is None
    assert est.manifest_["release"]["explained_variance"] is None
    ratio = est.explained_variance_ratio_
    assert ratio.shape == (RANK,) and ratio.sum() <= 1.0 and np.all(np.diff(ratio) <= 0)


def test_dataframe_columns_are_checked_by_name_and_order() -> None:
    X, _ = shifted_low_rank()
    frame = pd.DataFrame(X, columns=list("abcdef"))
    est = gauss(center=True).fit(frame)
    assert list(est.feature_names_in_) == list("abcdef") and est.n_features_in_ == DIM
    np.testing.assert_allclose(est.transform(frame), est.transform(X))
    with pytest.raises(ValueError, match=r"expected \['a', .*'f'\], got \['f', 'a', .*'e'\]"):
        est.transform(frame[list("fabcde")])
    with pytest.raises(
        ValueError, match="X has 5 features, but PrivateSubspace is expecting 6 features"
    ):
        est.transform(X[:, :5])
    on_numpy = gauss().fit(X)
    assert not hasattr(on_numpy, "feature_names_in_")


def test_columns_given_at_fit_are_selected_at_transform() -> None:
    X, _ = shifted_low_rank()
    frame = pd.DataFrame(X, columns=list("abcdef"))
    frame["label"] = 1.0
    est = gauss(columns=list("fedcba")).fit(frame)
    assert list(est.feature_names_in_) == list("fedcba")
    centred = X[:, ::-1] - est.mean_
    np.testing.assert_allclose(est.transform(frame), centred @ est.basis_, atol=1e-9)
    with pytest.raises(ValueError, match=r"lacks the fitted feature columns \['f'\]"):
        est.transform(frame.drop(columns="f"))


def test_paths_fit_and_transform_lazily(tmp_path: Path) -> None:
    import dask.array as da
    import dask.dataframe as dd

    X, _ = shifted_low_rank()
    frame = pd.DataFrame(X, columns=list("abcdef"))
    frame["row"] = np.arange(len(frame), dtype=np.int64)
    path = _write(tmp_path / "data.parquet", frame)
    est = gauss(center=True, columns=list("abcdef")).fit(path)  # a pathlib.Path
    assert list(est.feature_names_in_) == list("abcdef")
    projected = est.transform(path)
    assert isinstance(projected, da.Array)
    np.testing.assert_allclose(projected.compute(), est.transform(X), atol=1e-9)
    np.testing.assert_allclose(est.transform(str(path)).compute(), est.transform(X), atol=1e-9)
    lazy = est.transform(dd.from_pandas(frame, npartitions=3))
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(lazy.compute(), est.transform(X), atol=1e-9)
    assert isinstance(est.transform(da.from_array(X, chunks=5_000)), da.Array)


def test_id_like_columns_are_left_out_by_default_and_used_when_named(tmp_path: Path) -> None:
    import dask.dataframe as dd

    X, _ = shifted_low_rank(rows=4_000)
    frame = pd.DataFrame(X, columns=list("abcdef"))
    frame["user_id"] = np.arange(len(frame), dtype=np.int64)  # the name and type decide
    path = _write(tmp_path / "ids.parquet", frame)
    left_out = r"^PrivateSubspace left out the columns user_id \(identifier\): pass columns="
    for data in (path, frame, dd.from_pandas(frame, npartitions=2)):
        with pytest.warns(UserWarning, match=left_out):
            est = gauss(rank=2).fit(data)
        assert list(est.feature_names_in_) == list("abcdef")
        assert est.columns_left_out_ == {"user_id": "identifier"}
        assert est.manifest_["columns_left_out"] == {"user_id": "identifier"}
        np.testing.assert_allclose(est.transform(frame), est.transform(X), atol=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named: used, and nothing to warn about
        named = gauss(rank=2, columns=[*"abcdef", "user_id"]).fit(path)
        as_float = gauss(rank=2).fit(frame.assign(user_id=frame["user_id"].astype(float)))
    assert named.manifest_["columns"] == [*"abcdef", "user_id"] and named.columns_left_out_ == {}
    assert list(as_float.feature_names_in_) == [*"abcdef", "user_id"]


def test_cli_names_the_columns_used_and_the_id_like_ones_left_out(
    tmp_path: Path, scheduler_address: str, capsys
) -> None:
    X, _ = shifted_low_rank(rows=4_000)
    names = [f"feature_{j}" for j in range(DIM)]
    frame = pd.DataFrame(X, columns=names)
    frame["customerId"] = np.arange(len(frame), dtype=np.int64)
    frame["count_items"] = np.ones(len(frame), dtype=np.int64)  # integer, not id-like
    frame["score"] = 1.0
    path = _write(tmp_path / "wide.parquet", frame)
    argv = ["estimate", str(path), "--rank", "2", "--method", "gauss", "--row-norm", "1e4"]
    argv += ["--epsilon", "4", "--delta", "1e-6", "--quiet", "--seed", "1"]
    argv += ["--scheduler", scheduler_address]
    code = main([*argv, "--out", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    success = captured.out.strip().splitlines()
    assert len(success) == 1
    shown = ", ".join([*names, "count_items", "score"])
    left_out = "; left out: customerId (identifier) (--columns to choose)"
    assert success[0].endswith(f"from 8 columns: {shown}{left_out}"), success[0]
    assert "identifier" not in captured.err
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["columns"] == [*names, "count_items", "score"]
    assert manifest["columns_left_out"] == {"customerId": "identifier"}
    named = ",".join([*names, "customerId"])
    assert main([*argv, "--out", str(tmp_path / "named"), "--columns", named]) == 0
    manifest = json.loads((tmp_path / "named" / "manifest.json").read_text())
    assert manifest["columns"] == [*names, "customerId"] and manifest["columns_left_out"] == {}


def test_boosted_fit_takes_the_mean_and_variance_of_the_chosen_group() -> None:
    X, _ = shifted_low_rank()
    est = gauss(center=True, boost=3).fit(X)
    chosen = est.manifest_["release"]["chosen_group"]
    group = est.manifest_["parameters"]["group_runs"][chosen]["release"]
    assert est.mean_.tolist() == group["mean"]
    assert est.explained_variance_ratio_.tolist() == group["explained_variance_ratio"]
    np.testing.assert_allclose(est.transform(X), (X - est.mean_) @ est.basis_, atol=1e-9)
