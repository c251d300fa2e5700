"""PrivateSubspace and PrivateSubspaceClustering as scikit-learn estimators: the
scikit-learn conformance suite, clone/Pipeline/GridSearchCV, the names users know
(``n_components``, ``get_feature_names_out``), the refit warning, and Dask collections
read on the cluster and transformed lazily."""

from __future__ import annotations

import re
import warnings
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

from dpsub_dist import PrivateSubspace, PrivateSubspaceClustering
from dpsub_dist.api import FEW_FEATURES, FEW_ROWS, expected_failed_checks
from dpsub_dist.cli import build_parser
from dpsub_dist.errors import NoStableSubspace
from dpsub_dist.linalg import subspace_error

BUDGET = {"epsilon": 1.0, "delta": 1e-6}

_REFUSALS = {
    FEW_ROWS: r"rows are too few for a private norm bound|too few rows: \d+ rows cannot fill",
    FEW_FEATURES: r"must be smaller than the number of (features|columns) \(2\)",
}
"""What fit says for each declared reason: a check declared for it must fail with it."""


def _messages(error: BaseException | None) -> str:
    """The error's message and those of the errors it was raised from or during."""
    texts = []
    while error is not None:
        texts.append(str(error))
        error = error.__cause__ or error.__context__
    return " | ".join(texts)


def _conformance(estimator) -> Counter:
    """scikit-learn's check_estimator on ``estimator`` with the checks the package declares
    for it (:func:`expected_failed_checks`): nothing fails, each declared check
    fails for its declared reason (none passes unexpectedly), skips are the checks the
    non_deterministic tag skips. Returns the counts by status."""
    not_applicable = expected_failed_checks(estimator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refit warnings of the checks' repeated fits
        # as a user calls it: on_fail="raise" (the default) stops at an undeclared failure
        results = check_estimator(estimator, expected_failed_checks=not_applicable, on_skip=None)
    for result in results:
        if result["check_name"] in not_applicable:
            reason = not_applicable[result["check_name"]]
            assert result["status"] == "xfail", (result["check_name"], "passes: drop its reason")
            if reason in _REFUSALS:
                assert re.search(_REFUSALS[reason], _messages(result["exception"])), result
        elif result["status"] == "skipped":
            assert "non deterministic" in str(result["exception"]), result
    return Counter(r["status"] for r in results)


@pytest.mark.parametrize("estimator", [PrivateSubspace(), PrivateSubspaceClustering()], ids=str)
def test_default_estimators_pass_scikit_learn_checks_or_say_why_not(estimator, monkeypatch):
    """The default constructor (n_components=2, ε = 1, δ = 10⁻⁶) passes scikit-learn's suite
    but for the checks that fit fewer rows or features than the defaults need, which
    expected_failed_checks declares with the reason. (scikit-learn 1.9.1: 20 passed, 24
    expected failures, 1 skipped by the non_deterministic tag, for each estimator; about 1 s
    each, in-process.)"""
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")  # else check_array_api_input skips itself
    declared = expected_failed_checks(estimator)
    assert set(declared.values()) == {FEW_ROWS, FEW_FEATURES}, declared
    counts = _conformance(estimator)
    assert counts["passed"] >= 20 and counts["xfail"] == 24, counts


@pytest.mark.parametrize(
    "estimator",
    [
        PrivateSubspace(n_components=1, row_norm=10.0),
        PrivateSubspaceClustering(
            n_clusters=1, n_components=1, method="sulq", iterations=2, row_norm=10.0
        ),
    ],
    ids=str,
)
def test_estimators_for_small_data_pass_every_check_but_idempotence(estimator, monkeypatch):
    """Set for small data (a public row-norm bound, sulq, one component) the estimators pass
    every check but check_fit_idempotent, which no randomised private estimator can pass
    (api.EXPECTED_FAILED_CHECKS); the checks that compare two fits skip themselves on the
    non_deterministic tag. Fresh DP noise in every fit: no patched noise seed."""
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    assert list(expected_failed_checks(estimator)) == ["check_fit_idempotent"]
    counts = _conformance(estimator)
    assert counts["xfail"] == 1 and counts["passed"] >= 40, counts


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
    """``rank`` (dpsub's name) replaces ``n_components`` at its default; another value of
    ``n_components`` that differs is refused; ``None`` (PCA's "all") is refused with why."""
    X, _ = planted()
    with pytest.raises(ValueError, match="n_components=4 and rank=3 differ"):
        gauss(n_components=4, rank=3).fit(X)
    assert gauss(n_components=2, rank=2).fit(X).n_components_ == 2
    assert gauss(rank=1).fit(X).n_components_ == 1
    assert gauss(rank=3).fit(X).n_components_ == 3
    assert PrivateSubspace().get_params()["n_components"] == 2


@pytest.mark.parametrize("cls", [PrivateSubspace, PrivateSubspaceClustering])
def test_n_components_none_is_refused_with_the_reason_not_fitted_as_two(cls) -> None:
    """scikit-learn's PCA reads n_components=None as all D components: a private basis of
    all D directions is not a subspace estimate (the last ones are drawn by the noise), so
    None is refused before anything is spent, never silently replaced by a default."""
    X, _ = planted(rows=500)
    method = "gauss" if cls is PrivateSubspace else "sulq"
    est = cls(n_components=None, row_norm=20.0, method=method)
    with pytest.raises(ValueError, match=r"n_components=None is not accepted: .*all D") as err:
        est.fit(X)
    assert "noise" in str(err.value) and "--" not in str(err.value)
    assert not hasattr(est, "manifest_")  # refused before the run


def _granted(estimator) -> dict:
    return estimator.manifest_["privacy"]["budget"]["total_granted"]


def test_the_default_constructor_fits_with_the_documented_defaults() -> None:
    """PrivateSubspace(): n_components=2 at (ε, δ) = (1, 10⁻⁶); PrivateSubspaceClustering():
    2 clusters of 1-dimensional subspaces at the same budget; rho= replaces the default ε."""
    X, _ = planted()
    default = PrivateSubspace().fit(X)
    assert default.components_.shape == (2, 8)
    assert _granted(default) == {"epsilon": 1.0, "delta": 1e-6}
    assert _granted(PrivateSubspace(rho=0.5).fit(X)) == {"rho": 0.5, "delta0": 5e-7}
    clusters = PrivateSubspaceClustering(method="sulq", row_norm=20.0).fit(X)
    assert clusters.bases_.shape == (2, 8, 1)
    assert _granted(clusters) == {"epsilon": 1.0, "delta": 1e-6}


def test_a_fit_that_releases_nothing_raises_and_leaves_the_estimator_unfitted() -> None:
    """⊥ is a private outcome that spent the budget: fit raises NoStableSubspace (not a
    ValueError), manifest_ says what was spent, and transform refuses as unfitted. Isotropic
    rows have no subspace for friendly's subsets to agree on (⊥ in 80 of 80 fits tried)."""
    X = np.random.default_rng(0).standard_normal((20_000, 8))
    est = PrivateSubspace(n_components=1, method="friendly", row_norm=10.0, epsilon=0.2)
    with pytest.raises(NoStableSubspace, match="no stable subspace") as refused:
        est.fit(X)
    assert not isinstance(refused.value, ValueError)
    assert est.manifest_["privacy"]["budget"]["total_granted"]["epsilon"] == 0.2
    with pytest.raises(NotFittedError):
        est.transform(X)


def test_refitting_warns_that_the_budget_is_spent_again() -> None:
    X, _ = planted(rows=500)
    est = gauss(n_components=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.fit(X)  # the first fit: no warning
    with pytest.warns(UserWarning, match="spent its privacy budget again"):
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


def test_grid_search_says_that_each_fit_spends_the_budget_again() -> None:
    """GridSearchCV fits clones: 2 candidates × cv=2, then the refit, are 5 fits that each
    spend the budget. The estimator and its clones share one count, so the 4 after the first
    warn, naming the g·(c−1)+1 budgets a search spends on each row."""
    X, _ = planted(rows=2_000)
    search = GridSearchCV(
        gauss(n_components=2), {"row_norm": [5.0, 20.0]}, scoring=lambda *_: 0.0, cv=2
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        search.fit(X)
    spent = [w for w in caught if "spent its privacy budget again" in str(w.message)]
    assert len(spent) == 4 and "g·(c−1)+1 budgets" in str(spent[0].message)


def _refusal(estimator, X) -> str:
    with pytest.raises(ValueError) as refused:
        estimator.fit(X)
    return str(refused.value)


@pytest.mark.parametrize(
    ("estimator", "rows", "says"),
    [
        (PrivateSubspace(n_components=0), 2_000, "n_components must be a positive integer"),
        (PrivateSubspace(n_components=8), 2_000, "n_components=8 must be smaller than the"),
        (PrivateSubspace(epsilon=-1.0), 2_000, "pass epsilon with a positive number"),
        (PrivateSubspace(delta=2.0), 2_000, "pass delta with a number such as 1e-6"),
        (PrivateSubspace(epsilon=1.0, rho=0.5), 2_000, "pass exactly one of epsilon"),
        (PrivateSubspace(), 50, "pass row_norm=B, a larger ε or more rows"),
        (
            PrivateSubspace(method="gauss", radius=1.0),
            2_000,
            "radius does not apply to method='gauss'",
        ),
        (
            PrivateSubspaceClustering(n_clusters=0),
            2_000,
            "n_clusters must be a positive integer",
        ),
        (
            PrivateSubspaceClustering(n_clusters=4, n_components=2),
            2_000,
            "lower n_clusters or n_components",
        ),
        (
            PrivateSubspaceClustering(iterations=3),
            2_000,
            "iterations does not apply to method='sample-aggregate'",
        ),
        (PrivateSubspaceClustering(), 50, "fewer subsets"),
    ],
    ids=repr,
)
def test_api_errors_name_the_estimators_parameters_not_cli_flags(estimator, rows, says):
    """The engine's messages are written for the CLI (``pass --rank K``); through the API
    they name the estimator's parameters (``n_components``) and no CLI flag."""
    message = _refusal(estimator, planted(rows=rows)[0])
    assert says in message and "--" not in message, message


def test_the_gibbs_warning_names_the_parameter_not_the_flag() -> None:
    X, _ = planted(rows=200)
    gibbs = PrivateSubspaceClustering(n_clusters=1, method="gibbs", row_norm=20.0, sweeps=2)
    with pytest.warns(UserWarning, match="not differentially private") as caught:
        gibbs.fit(X)
    texts = [str(w.message) for w in caught if "not differentially private" in str(w.message)]
    assert texts and all("method='gibbs'" in t and "--" not in t for t in texts), texts


@pytest.mark.parametrize(
    ("estimator", "command"),
    [(PrivateSubspace, "estimate"), (PrivateSubspaceClustering, "cluster")],
)
def test_every_option_refused_for_another_method_is_named_as_a_parameter(estimator, command):
    """Each declared option given to a method it does not apply to: the refusal names the
    estimator's parameter and method, never a flag."""
    from dpsub_dist.methods import REGISTRY, declared, users

    X, _ = planted(rows=200)
    params = declared(command).values()
    for param in params:
        refusing = [m for m in REGISTRY[command] if m not in users(command, param)]
        if not refusing:
            continue  # every method takes it (boost's options): nothing to refuse
        other = refusing[0]
        given = {param.name: param.example, "method": other}
        message = _refusal(estimator(**given), X)
        assert f"does not apply to method='{other}'" in message, (given, message)
        assert param.name in message and "--" not in message, (given, message)


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
        "import sys, dpsub_dist.cli, dpsub_dist.job, dpsub_dist.methods._clustering; "
        "assert 'sklearn' not in sys.modules, 'sklearn imported'; "
        "from dpsub_dist import PrivateSubspace; assert 'sklearn' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("estimator", "command", "deprecated"),
    [(PrivateSubspace, "estimate", ["scale"]), (PrivateSubspaceClustering, "cluster", [])],
)
def test_estimator_parameters_are_the_tables(estimator, command, deprecated):
    """The estimators take exactly the parameters of their command's tables (run-level and
    every method's), by the tables' names, which are the job-file keys and, with dashes, the
    CLI flags: one name per concept at every door (``radius``, not ``scale``, as
    ``--radius``). Defaults are the tables' (δ = 10⁻⁶ and ε = 1 are the API's own)."""
    import dataclasses
    import inspect

    from dpsub_dist.api import api_parameters
    from dpsub_dist.methods import declared
    from dpsub_dist.params import RUN_PARAMS, ClusterConfig, EstimateConfig

    signature = inspect.signature(estimator.__init__).parameters
    assert list(signature)[1:] == [*api_parameters(command), *deprecated]
    flags = {
        a.dest: a for a in build_parser()._subparsers._group_actions[0].choices[command]._actions
    }
    config = {"estimate": EstimateConfig, "cluster": ClusterConfig}[command]
    unset = {f.name: f.default for f in dataclasses.fields(config)}
    for param in [*RUN_PARAMS[command], *declared(command).values()]:
        assert flags[param.flag[2:].replace("-", "_")].option_strings[0] == param.flag
        if param.name not in ("delta", "storage_options", "rank", "clusters"):
            assert signature[param.name].default == unset[param.field], param.name
    assert signature["delta"].default == 1e-6


@pytest.mark.parametrize(("method", "name"), [("friendly", "radius"), ("histogram", "cell_side")])
def test_scale_is_a_deprecated_alias_of_radius_and_cell_side(method, name):
    """``scale=`` still works for one release, as the name the method's flag has, and warns."""
    with pytest.warns(FutureWarning, match=f"scale= is deprecated.*pass {name}="):
        config = PrivateSubspace(method=method, scale=0.25)._config()
    assert config.scale == PrivateSubspace(method=method, **{name: 0.25})._config().scale == 0.25


def test_probabilistic_pca_from_released_values_only() -> None:
    """noise_variance_, get_covariance, get_precision, score_samples and score are
    scikit-learn PCA's, computed from the released explained variance, its ratio (which
    gives the released total) and the basis: scikit-learn's own PCA methods on a PCA whose
    attributes are ours give the same numbers. Where the run released no ratio (power), the
    methods are absent and say why."""
    from sklearn.decomposition import PCA

    X, _ = planted(rows=4_000)
    est = gauss(n_components=2).fit(X)
    variance, ratio = est.explained_variance_, est.explained_variance_ratio_
    total = variance.sum() / ratio.sum()
    assert est.noise_variance_ == pytest.approx((total - variance.sum()) / (8 - 2), rel=1e-12)
    twin = PCA(n_components=2)
    for name in ("components_", "explained_variance_", "noise_variance_", "mean_"):
        setattr(twin, name, getattr(est, name))
    twin.n_components_, twin.n_features_in_ = 2, 8
    np.testing.assert_allclose(est.get_covariance(), twin.get_covariance(), rtol=1e-12)
    np.testing.assert_allclose(est.get_precision(), twin.get_precision(), rtol=1e-9)
    np.testing.assert_allclose(est.score_samples(X), twin.score_samples(X), rtol=1e-9)
    assert est.score(X) == pytest.approx(twin.score(X), rel=1e-9)
    power = PrivateSubspace(n_components=2, method="power", row_norm=20.0, epsilon=5.0).fit(X)
    assert power.noise_variance_ is None and not hasattr(power, "score")
    with pytest.raises(AttributeError, match="has no attribute 'score'") as err:
        power.score(X)
    assert "did not release" in str(err.value.__cause__)
