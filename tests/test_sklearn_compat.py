"""PrivateSubspace and PrivateSubspaceClustering as scikit-learn estimators: the
scikit-learn conformance suite, clone/Pipeline/GridSearchCV, the names users know
(``n_components``, ``get_feature_names_out``), the refit warning, and Dask collections
read on the cluster and transformed lazily."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from dpsub_dist import PrivateSubspace, PrivateSubspaceClustering
from dpsub_dist.linalg import subspace_error
from dpsub_dist.privacy import noise

BUDGET = {"epsilon": 1.0, "delta": 1e-6}


class _FixedNoise:
    """Test only: the estimator declares itself deterministic, which it is while
    :func:`fixed_private_noise` holds its private noise seed fixed."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags


class FixedNoisePrivateSubspace(_FixedNoise, PrivateSubspace):
    pass


class FixedNoisePrivateSubspaceClustering(_FixedNoise, PrivateSubspaceClustering):
    pass


@pytest.fixture()
def fixed_private_noise(monkeypatch) -> None:
    """Every run's private noise seed fixed (the test seam behind ``noise_rng``): the only
    randomness of a fit with a public ``seed`` is its DP noise, so fits become repeatable."""
    monkeypatch.setattr(noise, "new_noise_seed", lambda: 20_261_123)


@parametrize_with_checks(
    [
        FixedNoisePrivateSubspace(n_components=1, method="gauss", row_norm=10.0, seed=0, **BUDGET),
        FixedNoisePrivateSubspaceClustering(
            n_clusters=1,
            n_components=1,
            method="sulq",
            iterations=2,
            row_norm=10.0,
            seed=0,
            **BUDGET,
        ),
    ]
)
def test_scikit_learn_conformance(estimator, check, fixed_private_noise, monkeypatch) -> None:
    """Every check of scikit-learn's suite passes, idempotence, pipeline consistency and
    subset invariance included: with its noise fixed the estimator is a deterministic
    function of its input, as scikit-learn requires. (Small, in-process: gauss and sulq.)"""
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")  # else check_array_api_input skips itself
    check(estimator)


@pytest.mark.parametrize("cls", [PrivateSubspace, PrivateSubspaceClustering])
def test_each_fit_draws_fresh_noise_and_says_so(cls) -> None:
    """Outside the test seam two fits differ (fresh DP noise from OS entropy even with the
    same public seed), and the estimators declare it to scikit-learn."""
    X, _ = planted(rows=500)
    if cls is PrivateSubspace:
        est = cls(n_components=2, method="gauss", row_norm=20.0, seed=0, **BUDGET)
        first = est.fit(X).components_.copy()
        with pytest.warns(UserWarning):
            second = est.fit(X).components_
    else:
        est = cls(n_clusters=1, n_components=2, method="sulq", row_norm=20.0, seed=0, **BUDGET)
        first = est.fit(X).bases_.copy()
        with pytest.warns(UserWarning):
            second = est.fit(X).bases_
    assert not np.array_equal(first, second)
    assert est.__sklearn_tags__().non_deterministic


def planted(rows: int = 4_000, dim: int = 8, rank: int = 2, seed: int = 0):
    """Rows near a random rank-``rank`` subspace, and its orthonormal dim×rank basis."""
    rng = np.random.default_rng(seed)
    truth, _ = np.linalg.qr(rng.standard_normal((dim, rank)))
    X = rng.standard_normal((rows, rank)) * [3.0, 2.0][:rank] @ truth.T
    return X + 0.01 * rng.standard_normal((rows, dim)), truth


def gauss(**kwargs) -> PrivateSubspace:
    """Large n·ε (a known-answer test: the planted subspace comes back)."""
    return PrivateSubspace(
        **{"method": "gauss", "row_norm": 20.0, "epsilon": 10.0, "delta": 1e-6, **kwargs}
    )


def test_parameters_clone_and_the_names_users_know() -> None:
    est = gauss(n_components=2, center=True)
    assert est.get_params()["n_components"] == 2 and est.get_params()["rank"] is None
    twin = clone(est.set_params(row_norm=15.0))
    assert twin is not est and twin.get_params() == est.get_params()
    X, truth = planted()
    frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(8)])
    fitted = twin.fit(frame)
    assert fitted.n_components_ == 2 and fitted.components_.shape == (2, 8)
    assert list(fitted.feature_names_in_) == list(frame.columns) and fitted.n_features_in_ == 8
    assert list(fitted.get_feature_names_out()) == ["privatesubspace0", "privatesubspace1"]
    assert subspace_error(fitted.basis_, truth) < 0.1
    assert fitted.singular_values_.shape == (2,)  # gauss, row level: from the release
    Z = gauss(rank=2).fit_transform(X)  # rank: the dpsub alias
    assert Z.shape == (4_000, 2)
    np.testing.assert_allclose(fitted.inverse_transform(fitted.transform(X)).shape, X.shape)
    # a pandas output container, named by get_feature_names_out
    out = gauss(n_components=2).set_output(transform="pandas").fit(frame).transform(frame)
    assert list(out.columns) == ["privatesubspace0", "privatesubspace1"]


def test_n_components_and_rank_given_and_different_are_refused() -> None:
    X, _ = planted()
    with pytest.raises(ValueError, match="n_components=2 and rank=3 differ"):
        gauss(n_components=2, rank=3).fit(X)
    with pytest.raises(ValueError, match="pass n_components"):
        gauss().fit(X)
    assert gauss(n_components=2, rank=2).fit(X).n_components_ == 2


def test_refitting_warns_that_the_budget_is_spent_again() -> None:
    X, _ = planted(rows=500)
    est = gauss(n_components=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.fit(X)  # the first fit: no warning
    with pytest.warns(UserWarning, match="spends its privacy budget again"):
        est.fit(X)


def test_pipeline_and_grid_search() -> None:
    X, truth = planted()
    pipe = Pipeline([("scale", StandardScaler(with_mean=False)), ("dp", gauss(n_components=2))])
    assert pipe.fit_transform(X).shape == (4_000, 2)
    assert list(pipe.get_feature_names_out()) == ["privatesubspace0", "privatesubspace1"]

    def score(estimator, X, y=None) -> float:  # released values only: no extra cost
        return -subspace_error(estimator.basis_, truth)

    search = GridSearchCV(gauss(n_components=2), {"row_norm": [5.0, 20.0]}, scoring=score, cv=2)
    search.fit(X)
    assert search.best_params_["row_norm"] in (5.0, 20.0)
    assert search.best_estimator_.components_.shape == (2, 8)


def test_dask_input_runs_on_the_default_client_and_transforms_lazily(dask_client) -> None:
    """Without client=, Dask collections run on Dask's default distributed client (as
    dask-ml's PCA does): the Gram is summed in worker tasks, not in this process."""
    import dask.array as da
    import dask.dataframe as dd
    from distributed import get_task_stream

    X, truth = planted(rows=6_000)
    lazy = da.from_array(X, chunks=1_500).persist()  # rows on the workers
    with get_task_stream(dask_client) as stream:
        est = gauss(n_components=2).fit(lazy)
    ran = {
        task["key"][0] if isinstance(task["key"], tuple) else task["key"] for task in stream.data
    }
    assert any(str(key).startswith("partition_gram") for key in ran), ran
    assert subspace_error(est.basis_, truth) < 0.1
    frame = dd.from_pandas(pd.DataFrame(X, columns=list("abcdefgh")), npartitions=3)
    on_frame = gauss(n_components=2).fit(frame)
    assert list(on_frame.feature_names_in_) == list("abcdefgh")
    projected = on_frame.transform(frame)
    assert isinstance(projected, da.Array)
    expected = (X - on_frame.mean_) @ on_frame.basis_  # centred by default
    np.testing.assert_allclose(projected.compute(), expected, atol=1e-9)
    # clone shares the client (a distributed.Client cannot be deep-copied)
    assert clone(gauss(n_components=2, client=dask_client)).client is dask_client


def test_clustering_predicts_the_nearest_released_subspace() -> None:
    import dask.array as da

    rng = np.random.default_rng(1)
    planes = [np.linalg.qr(rng.standard_normal((10, 2)))[0] for _ in range(2)]
    X = np.vstack([rng.standard_normal((3_000, 2)) @ p.T for p in planes])
    est = PrivateSubspaceClustering(
        n_clusters=2, n_components=2, method="sulq", iterations=4, seed=0, epsilon=5.0, delta=1e-6
    )  # large n·ε: the planted clusters come back (at ε = 1 one run in four does not)
    labels = est.fit_predict(X)
    assert est.bases_.shape == (2, 10, 2) and est.n_clusters_ == 2
    distances = est.transform(X)
    assert distances.shape == (6_000, 2) and np.all(distances >= 0)
    np.testing.assert_array_equal(labels, distances.argmin(axis=1))
    planted_labels = np.repeat([0, 1], 3_000)
    agreement = np.mean(labels == planted_labels)
    assert max(agreement, 1 - agreement) > 0.9  # the planted clusters, up to relabelling
    lazy = est.predict(da.from_array(X, chunks=2_000))  # post-processing, lazily on Dask
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), labels)
    assert list(est.get_feature_names_out()) == [
        "privatesubspaceclustering0",
        "privatesubspaceclustering1",
    ]
    assert clone(est).get_params() == est.get_params()


def test_the_cli_and_the_engine_do_not_import_scikit_learn() -> None:
    """scikit-learn is imported by the estimators only: every ``dpsub`` command and every Dask
    worker that loads a dpsub_dist task would otherwise pay its import (about 1.5 s)."""
    import subprocess
    import sys

    code = (
        "import sys, dpsub_dist.cli, dpsub_dist.job, dpsub_dist.estimators.clustering; "
        "assert 'sklearn' not in sys.modules, 'sklearn imported'; "
        "from dpsub_dist import PrivateSubspace; assert 'sklearn' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("estimator", "config", "own"),
    [
        (PrivateSubspace, "EstimateConfig", {"client", "n_components"}),
        (PrivateSubspaceClustering, "ClusterConfig", {"client", "n_components", "n_clusters"}),
    ],
)
def test_estimator_parameters_are_the_declared_config_fields(estimator, config, own):
    """The estimators take exactly the run config's fields (generated from the methods'
    declarations) plus their scikit-learn names: a declared option cannot be missing from,
    or extra in, the Python API."""
    import dataclasses
    import inspect

    from dpsub_dist import job

    declared = {f.name for f in dataclasses.fields(getattr(job, config))}
    taken = set(inspect.signature(estimator.__init__).parameters) - {"self"}
    assert taken - own == declared
