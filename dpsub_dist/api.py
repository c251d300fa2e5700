"""scikit-learn estimators mirroring ``dpsub estimate`` and ``dpsub cluster``.

>>> est = PrivateSubspace(n_components=4, epsilon=1.0, delta=1e-6).fit(X)   # doctest: +SKIP
>>> Z = est.transform(X)                                                   # doctest: +SKIP

Both are scikit-learn estimators (``get_params``/``set_params``, ``clone``, ``Pipeline``,
``GridSearchCV``) that accept NumPy arrays, pandas DataFrames, Dask arrays/DataFrames and
Parquet paths. Every ``fit`` spends its privacy budget on the data it is given; refitting
an already fitted estimator warns (see docs/python-api.md).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin, clone
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from dpsub_dist.engine.sources import Dataset, array_dataset, parquet_dataset
from dpsub_dist.errors import InputError, NoStableSubspace
from dpsub_dist.estimators.boost import chosen_view
from dpsub_dist.io.parquet import feature_name, id_like_message, looks_like_id
from dpsub_dist.job import EstimateConfig, EstimateResult, run_estimate
from dpsub_dist.methods import DEFAULTS

REFIT_WARNING = (
    "{name} was already fitted: this fit spends its privacy budget again, and the "
    "privacy loss of all fits on the same data adds up (sequential composition)"
)


class _PrivateEstimator(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """What both estimators share: parameters kept as given (checked in ``fit``), the input
    forms, where a fit runs, feature names, and scikit-learn's error types and tags."""

    _fitted_attribute = "components_"

    def _store(self, params: dict[str, Any]) -> None:
        """scikit-learn convention: each ``__init__`` parameter kept unchanged, same name."""
        for name, value in params.items():
            if name not in ("self", "__class__"):
                setattr(self, name, value)

    def __sklearn_clone__(self) -> _PrivateEstimator:
        """``clone`` copies every parameter but the Dask client, which is shared (a
        ``distributed.Client`` cannot be deep-copied)."""
        params = self.get_params(deep=False)
        client = params.pop("client")
        copied = {name: clone(value, safe=False) for name, value in params.items()}
        return type(self)(**copied, client=client)

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, self._fitted_attribute)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # Each fit draws fresh DP noise from OS entropy: two fits differ (docs/python-api.md).
        tags.non_deterministic = True
        return tags

    # ------------------------------------------------------------------ fit

    def _fit_run(
        self,
        X: Any,
        config: Any,
        runner: Callable[..., EstimateResult],
    ) -> EstimateResult:
        """Run ``runner(config, open_dataset, client)`` on ``X``; set ``manifest_``,
        ``n_features_in_`` and ``feature_names_in_``."""
        if hasattr(self, "manifest_"):
            warnings.warn(REFIT_WARNING.format(name=type(self).__name__), UserWarning, 2)
        opened: list[Dataset] = []
        if _is_path(X):
            uri = os.fspath(X)
            exclude = getattr(config, "exclude_columns", None)  # estimates only
            excluded = {} if exclude is None else {"exclude": exclude}

            def open_dataset(client: Any) -> Dataset:
                dataset = parquet_dataset(
                    uri,
                    config.columns,
                    config.unit_column,
                    config.storage_options,
                    client,
                    **excluded,
                )
                opened.append(dataset)
                return dataset
        else:
            if config.unit_column is not None:
                raise InputError("unit_column needs a Parquet input that holds that column")
            rows, names = self._fit_rows(X, config.columns)

            def open_dataset(client: Any) -> Dataset:
                dataset = array_dataset(rows, names)
                opened.append(dataset)
                return dataset

        result = runner(config, open_dataset, self._client(X))
        self.manifest_ = result.manifest
        if _is_path(X):
            self._set_table_features(opened[-1])
        return result

    def _fit_rows(self, X: Any, columns: list[str] | None) -> tuple[Any, list[str] | None]:
        """In-memory input checked as scikit-learn does (its errors and feature names); Dask
        input left where it is (only a Dask DataFrame's partition lengths are computed, on
        Dask). Returns the rows and the feature names."""
        if columns is not None and hasattr(X, "columns"):
            X = X[_present(X, columns)]
        _warn_id_like(X)
        if _is_dask(X):
            if hasattr(X, "columns"):
                self._set_names(X.columns)
                X = X.to_dask_array(lengths=True)  # the lengths (public row counts) on Dask
            else:
                self.__dict__.pop("feature_names_in_", None)
            if X.ndim != 2:
                raise ValueError(f"Expected a 2D array, got a {X.ndim}D Dask array instead")
            self.n_features_in_ = int(X.shape[1])
        else:
            # NaN/inf are refused by the run's own check, which names the column.
            X = validate_data(
                self, X, dtype=np.float64, ensure_all_finite=False, ensure_min_features=2
            )
        names = getattr(self, "feature_names_in_", None)
        return X, None if names is None else [str(n) for n in names]

    def _set_names(self, columns: Any) -> None:
        if all(isinstance(c, str) for c in columns):
            self.feature_names_in_ = np.asarray(list(columns), dtype=object)
        else:
            self.__dict__.pop("feature_names_in_", None)

    def _set_table_features(self, dataset: Dataset) -> None:
        """Features of a Parquet input: ``x[17]`` for element 17 of a vector column ``x``;
        the id-like warning from the schema only."""
        self.n_features_in_ = dataset.dim
        self.feature_names_in_ = np.asarray(
            [feature_name(dataset.columns, dataset.widths, j) for j in range(dataset.dim)],
            dtype=object,
        )
        if dataset.id_like:
            warnings.warn(id_like_message(list(dataset.id_like), "columns="), UserWarning, 4)

    def _client(self, X: Any) -> Any | None:
        """``client=``, else for Dask or Parquet input Dask's default distributed client if
        there is one (as dask-ml does), else None: in-process."""
        if self.client is not None or not (_is_path(X) or _is_dask(X)):
            return self.client
        try:
            from distributed import default_client

            return default_client()
        except (ImportError, ValueError):
            return None

    # ------------------------------------------------------------------ transform

    def _rows(self, X: Any) -> Any:
        """``X`` as a NumPy or (lazy) Dask array of the fitted features, in fitted order."""
        check_is_fitted(self)
        if _is_path(X):
            return self._checked_width(
                _parquet_rows(os.fspath(X), self._source_columns(), self.storage_options)
            )
        if hasattr(X, "columns"):
            X = self._select(X)
        if _is_dask(X):
            if hasattr(X, "columns"):
                X = X.to_dask_array()  # lazy: row counts unknown until computed
            return self._checked_width(X.astype(np.float64))
        return validate_data(self, X, reset=False, dtype=np.float64)

    def _checked_width(self, X: Any) -> Any:
        """scikit-learn's message for a wrong feature count, for the inputs it does not see."""
        width = X.shape[1] if X.ndim == 2 else None
        if width != self.n_features_in_:
            got = width if width is not None else f"shape {X.shape}: expected a 2D array, "
            raise ValueError(
                f"X has {got} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input."
            )
        return X

    def _source_columns(self) -> list[str] | None:
        """Columns to read from a table: the fitted ones, else ``columns=``."""
        if hasattr(self, "feature_names_in_"):
            return list(self.manifest_["columns"])
        return list(self.columns) if self.columns else None

    def _select(self, frame: Any) -> Any:
        """A DataFrame's fitted columns: taken by name from a wider table when ``columns=``
        was given at fit, else checked to be the fitted ones in the fitted order."""
        if self.columns:
            frame = frame[_present(frame, list(self._source_columns()))]
        wanted = self._source_columns() if hasattr(self, "feature_names_in_") else None
        names = [str(c) for c in frame.columns]
        if wanted is not None and names != wanted:
            raise ValueError(
                "The feature names should match those that were passed during fit, in the "
                f"same order: expected {wanted}, got {names}"
            )
        return frame


class PrivateSubspace(_PrivateEstimator):
    """Differentially private top-k principal subspace (sample and aggregate by default).

    Parameters mirror ``dpsub estimate``: ``n_components`` (K; ``rank`` is an alias),
    ``epsilon``/``delta`` or ``rho`` (+ ``delta``), ``method``, ``subsets``, ``ref_points``,
    ``assign``, ``unit_column``, ``columns``, ``exclude_columns`` (Parquet input), ``seed``
    (public randomness only: DP noise always comes from OS entropy), ``scale`` (public radius
    / cell side), ``row_norm``/``center`` (centring is on by default at row level for every
    method but exact; ``center=False`` for the uncentred subspace), ``outliers``/``tolerance``
    (exact), ``boost``/``boost_alpha`` (SS21 Alg. 3 around any method), ``storage_options``
    and ``client`` (a ``distributed.Client``; without one, Dask and Parquet input run on
    Dask's default distributed client if there is one, NumPy/pandas input in-process).
    Parameters are checked in ``fit`` (scikit-learn convention); bad ones raise
    :class:`~dpsub_dist.errors.InputError`, which is also a ``ValueError`` here.

    Attributes after ``fit`` (released values or public facts; reading them costs nothing):

    - ``components_`` (K×D, orthonormal rows, as scikit-learn's PCA), ``basis_`` (D×K),
      ``n_components_`` (K);
    - ``mean_``: the private mean subtracted before projecting (centred runs), else None;
    - ``explained_variance_`` / ``explained_variance_ratio_`` / ``singular_values_``: for
      ``gauss``, from the released noisy covariance's eigenvalues (post-processing); for
      friendly, histogram and gap-perturb from their own small private step (row level); the
      variance and singular values are None at user level (they need the row count, private
      there), gauss's ratio is given;
    - ``n_features_in_``; ``feature_names_in_`` when fitted on a DataFrame or Parquet;
    - ``manifest_`` (what was spent and released).

    ``fit`` raises :class:`NoStableSubspace` when the aggregator returns ⊥.
    """

    def __init__(
        self,
        n_components: int | None = None,
        *,
        rank: int | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        rho: float | None = None,
        method: str = DEFAULTS["estimate"],
        subsets: int | None = None,
        ref_points: int | None = None,
        assign: str = "random",
        unit_column: str | None = None,
        columns: list[str] | None = None,
        exclude_columns: list[str] | None = None,
        seed: int | None = None,
        scale: float | None = None,
        row_norm: float | None = None,
        center: bool | None = None,
        outliers: int | None = None,
        tolerance: float | None = None,
        boost: int | None = None,
        boost_alpha: float | None = None,
        iterations: int | None = None,
        oversample: int | None = None,
        storage_options: dict[str, Any] | None = None,
        client: Any | None = None,
    ) -> None:
        self._store(locals())

    def _config(self) -> EstimateConfig:
        rank = _alias("n_components", self.n_components, "rank", self.rank)
        return _config_from(self, EstimateConfig, rank=rank)

    def fit(self, X: Any, y: None = None) -> PrivateSubspace:
        """Estimate from a NumPy/Dask array, a pandas/Dask DataFrame, or a Parquet path/URI
        (``str`` or ``pathlib.Path``). Spends the budget; Dask input is read on the cluster."""
        with _value_errors():
            config = self._config()
            if self.exclude_columns is not None and not _is_path(X):
                raise InputError("exclude_columns applies to Parquet input: pass columns=")
            result = self._fit_run(X, config, run_estimate)
        if result.basis is None:
            reason = chosen_view(result.manifest)["release"].get("failure_reason")
            raise NoStableSubspace(
                f"no stable subspace: {reason or 'see manifest_'}; try method='gauss', more "
                "data or a larger budget"
            )
        self.basis_ = result.basis
        self.components_ = result.basis.T
        self.n_components_ = result.basis.shape[1]
        self._n_features_out = self.n_components_
        release = chosen_view(result.manifest)["release"]
        self.mean_ = None if release.get("mean") is None else np.asarray(release["mean"])
        self.explained_variance_ = _array_or_none(release.get("explained_variance"))
        self.explained_variance_ratio_ = _array_or_none(release.get("explained_variance_ratio"))
        n_rows = result.manifest.get("n_rows")
        self.singular_values_ = (
            None
            if self.explained_variance_ is None or n_rows is None
            else np.sqrt(n_rows * self.explained_variance_)
        )
        return self

    def transform(self, X: Any) -> Any:
        """Project rows onto the private basis (post-processing: no extra privacy cost).

        Subtracts ``mean_`` first when the fit centred. NumPy and pandas input give a NumPy
        array; Dask arrays/DataFrames and Parquet paths give a lazy Dask array.
        """
        with _value_errors():
            rows = self._rows(X)
        if self.mean_ is not None:
            rows = rows - self.mean_
        return rows @ self.basis_

    def inverse_transform(self, X: Any) -> Any:
        """Map projected rows back to feature space: ``X @ components_ (+ mean_)``."""
        check_is_fitted(self)
        if not _is_dask(X):
            X = check_array(X, dtype=np.float64)
        k = self.n_components_
        if X.ndim != 2 or X.shape[1] != k:
            raise ValueError(f"expected {k} components per row (rank), got shape {X.shape}")
        out = X @ self.components_
        return out if self.mean_ is None else out + self.mean_

    def plot_explained_variance(self, ax: Any = None) -> Any:
        """Scree plot of the released explained-variance ratio (published values: no budget);
        needs matplotlib (``pip install 'dpsub_dist[plot]'``). Returns the axes."""
        from dpsub_dist.report import plot_explained_variance

        check_is_fitted(self)
        return plot_explained_variance(self.manifest_, ax)


class PrivateSubspaceClustering(_PrivateEstimator):
    """Differentially private subspace clustering (``dpsub cluster``): ``n_clusters`` linear
    subspaces of dimension ``n_components`` (q; aliases ``clusters`` and ``rank``).

    Parameters mirror ``dpsub cluster``: ``method`` (``sample-aggregate``, ``sulq``,
    ``gibbs``), ``aggregator``, ``subsets``, ``ref_points``, ``assign``, ``unit_column``,
    ``scale`` (sample-aggregate), ``iterations`` (sulq), ``sweeps`` (gibbs), ``row_norm``
    (sulq, gibbs), ``private_norm`` (sulq), the budget, ``columns``, ``seed``,
    ``storage_options``, ``client``. ``gibbs`` is not differentially private and warns.

    Attributes after ``fit``: ``bases_`` (K×D×q; ``bases_[c]`` is cluster c's orthonormal
    basis), ``n_clusters_``, ``n_components_``, ``n_features_in_``, ``feature_names_in_``
    (tables), ``manifest_``. ``transform`` gives each row's distance to each released
    subspace, ``‖x − B_c B_cᵀ x‖`` (n×K, like KMeans' distances to centres); ``predict`` the
    nearest (smallest projection residual). Both are post-processing of the release: free.
    No ``labels_``: labelling the training rows is ``predict(X)``, an explicit pass.
    """

    _fitted_attribute = "bases_"

    def __init__(
        self,
        n_clusters: int | None = None,
        n_components: int | None = None,
        *,
        clusters: int | None = None,
        rank: int | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        rho: float | None = None,
        method: str = "sample-aggregate",
        aggregator: str = "friendly",
        subsets: int | None = None,
        ref_points: int | None = None,
        assign: str = "random",
        unit_column: str | None = None,
        columns: list[str] | None = None,
        seed: int | None = None,
        scale: float | None = None,
        iterations: int | None = None,
        sweeps: int | None = None,
        row_norm: float | None = None,
        private_norm: bool = False,
        storage_options: dict[str, Any] | None = None,
        client: Any | None = None,
    ) -> None:
        self._store(locals())

    def _config(self) -> Any:
        from dpsub_dist.job import ClusterConfig

        return _config_from(
            self,
            ClusterConfig,
            clusters=_alias("n_clusters", self.n_clusters, "clusters", self.clusters),
            rank=_alias("n_components", self.n_components, "rank", self.rank),
        )

    def fit(self, X: Any, y: None = None) -> PrivateSubspaceClustering:
        """Cluster a NumPy/Dask array, a pandas/Dask DataFrame or a Parquet path (spends the
        budget)."""
        from dpsub_dist.job import run_cluster
        from dpsub_dist.privacy.clustering import GIBBS_WARNING

        with _value_errors():
            result = self._fit_run(X, self._config(), run_cluster)
        if self.method == "gibbs":
            warnings.warn(GIBBS_WARNING.removeprefix("warning: "), UserWarning, 2)
        if result.basis is None:
            raise NoStableSubspace(
                "no stable clustering: the subsets disagree (see manifest_); try more data, "
                "a larger budget or fewer subsets"
            )
        self.bases_ = result.basis
        self.n_clusters_, _, self.n_components_ = result.basis.shape
        self._n_features_out = self.n_clusters_
        return self

    def transform(self, X: Any) -> Any:
        """Distance of each row to each released subspace (n×K; NumPy, or lazy Dask)."""
        with _value_errors():
            rows = self._rows(X)
        energy = (rows * rows).sum(axis=1)
        kept = [((rows @ basis) ** 2).sum(axis=1) for basis in self.bases_]
        return np.sqrt(np.maximum(energy[:, None] - np.stack(kept, axis=1), 0.0))

    def predict(self, X: Any) -> Any:
        """Index of the nearest released subspace for each row (smallest residual)."""
        return self.transform(X).argmin(axis=1)

    def fit_predict(self, X: Any, y: None = None) -> Any:
        return self.fit(X).predict(X)


def _config_from(estimator: BaseEstimator, kind: type, **resolved: Any) -> Any:
    """The run config of ``kind`` from the estimator's parameters of the same names (the
    methods' declared fields), lists and mappings copied so a fit never edits them."""
    values = {}
    for spec in fields(kind):
        if spec.name in resolved or not hasattr(estimator, spec.name):
            continue
        value = getattr(estimator, spec.name)
        if spec.name == "storage_options":
            value = dict(value or {})
        elif isinstance(value, list | tuple):
            value = list(value)
        values[spec.name] = value
    return kind(**values, **resolved)


def _alias(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    """The value of a parameter given under its scikit-learn name or its dpsub alias."""
    if value is not None and alias_value is not None and value != alias_value:
        raise InputError(f"{name}={value} and {alias}={alias_value} differ: pass only {name}")
    chosen = value if value is not None else alias_value
    if chosen is None:
        raise InputError(f"pass {name} (or its alias {alias})")
    return chosen


@functools.cache
def _also_value_error(kind: type[InputError]) -> type[InputError]:
    """``kind`` that is also a ``ValueError``, as scikit-learn expects of bad input."""
    return type(kind.__name__, (kind, ValueError), {"__module__": kind.__module__})


@contextmanager
def _value_errors() -> Iterator[None]:
    """Re-raise an :class:`InputError` as the same error that is also a ``ValueError``."""
    try:
        yield
    except InputError as err:
        if isinstance(err, ValueError):
            raise
        raise _also_value_error(type(err))(*err.args).with_traceback(err.__traceback__) from None


def _is_path(X: Any) -> bool:
    return isinstance(X, str | os.PathLike)


def _is_dask(X: Any) -> bool:
    from dask import is_dask_collection

    return is_dask_collection(X)


def _present(frame: Any, columns: list[str]) -> list[str]:
    """``columns`` after checking the DataFrame has them all."""
    names = [str(c) for c in frame.columns]
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"X lacks the fitted feature columns {missing} (has {names})")
    return columns


def _warn_id_like(X: Any) -> None:
    """The schema-only id-like warning for a pandas/Dask DataFrame, from its dtypes."""
    if not hasattr(X, "dtypes") or not hasattr(X, "columns"):
        return
    types = {str(c): str(t) for c, t in zip(X.columns, X.dtypes, strict=True)}
    id_like = [c for c in types if looks_like_id(c, types[c])]
    if id_like:
        warnings.warn(id_like_message(id_like, "columns="), UserWarning, 5)


def _array_or_none(values: Any) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=np.float64)


def _read_part(loader: Any, part: Any) -> np.ndarray:
    return loader(part)[0]


def _parquet_rows(
    uri: str, columns: list[str] | None, storage_options: dict[str, Any] | None
) -> Any:
    """A Parquet file/folder/glob as a lazy Dask array, read like ``fit`` reads it."""
    import dask
    import dask.array as da

    dataset = parquet_dataset(uri, columns, None, dict(storage_options or {}), None)
    blocks = [
        da.from_delayed(
            dask.delayed(_read_part)(dataset.loader, part),
            shape=(part.rows, dataset.dim),
            dtype=np.float64,
        )
        for part in dataset.parts
    ]
    return da.concatenate(blocks) if blocks else da.zeros((0, dataset.dim))
