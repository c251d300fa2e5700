"""scikit-learn estimators mirroring ``dpsub estimate`` and ``dpsub cluster``.

>>> est = PrivateSubspace(n_components=4, epsilon=1.0, delta=1e-6).fit(X)   # doctest: +SKIP
>>> Z = est.transform(X)                                                   # doctest: +SKIP

Both are scikit-learn estimators (``get_params``/``set_params``, ``clone``, ``Pipeline``,
``GridSearchCV``) that accept NumPy arrays, pandas DataFrames, Dask arrays/DataFrames and
Parquet paths. Every ``fit`` spends its privacy budget on the data it is given (by default
ε = 1, δ = 10⁻⁶); a second fit of an estimator or of its clones (GridSearchCV) warns (see
docs/python-api.md).
"""

from __future__ import annotations

import functools
import os
import re
import warnings
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin, clone
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from dpsub_dist.engine.sources import Dataset, array_dataset, frame_choice, parquet_dataset
from dpsub_dist.errors import InputError, NoStableSubspace
from dpsub_dist.io.parquet import API_OPTIONS, feature_name
from dpsub_dist.job import EstimateResult, run_estimate
from dpsub_dist.methods import DEFAULTS, check_given, declared
from dpsub_dist.methods import flag as cli_flag
from dpsub_dist.methods.boost import chosen_view
from dpsub_dist.params import (
    REQUIRED,
    RUN_PARAMS,
    STORAGE_OPTIONS,
    ClusterConfig,
    EstimateConfig,
    RunConfig,
)
from dpsub_dist.transform import prepared, project, released_centring, unproject

DEFAULT_EPSILON = 1.0
DEFAULT_COMPONENTS = 2
"""``n_components`` of ``PrivateSubspace()``: K = 2, shown in ``get_params`` (never None)."""
"""ε of a fit given neither ``epsilon`` nor ``rho`` (with ``delta``'s default, 10⁻⁶)."""

EXPECTED_FAILED_CHECKS = {
    "check_fit_idempotent": (
        "each fit draws fresh DP noise from OS entropy (no noise seed the caller can set), so "
        "two fits on the same data differ; the checks that compare two fits otherwise skip "
        "themselves on the non_deterministic tag"
    ),
}
"""scikit-learn checks that no randomised private estimator can pass, with the reason."""

FEW_ROWS = (
    "fits on 1 to 100 rows, fewer than this configuration needs at its budget (PrivateSubspace "
    "without row_norm: ≥ 1106 at ε = 1 for the private row-norm bound; friendly, histogram "
    "and sample-aggregate clustering: enough rows for their subsets): fit refuses with a "
    "ValueError before spending (n is public at row level), as PCA refuses too few samples"
)
FEW_ROWS_CHECKS = (
    "check_array_api_input",
    "check_fit_score_takes_y",
    "check_dont_overwrite_parameters",
    "check_n_features_in_after_fitting",
    "check_positive_only_tag_during_fit",
    "check_estimators_dtypes",
    "check_dtype_object",
    "check_estimators_nan_inf",
    "check_estimators_pickle",
    "check_f_contiguous_array_estimator",
    "check_transformer_data_not_an_array",
    "check_transformer_general",
    "check_transformer_preserve_dtypes",
    "check_fit2d_1sample",
    "check_dict_unchanged",
    "check_fit2d_predict1d",
)
"""The checks that fit on so few rows (scikit-learn 1.9)."""
FEW_FEATURES = (
    "fits on 2 features: n_components (clustering: n_clusters × n_components) must be "
    "smaller than the number of features, and fit refuses before spending"
)
FEW_FEATURES_CHECKS = (
    "check_estimators_overwrite_params",
    "check_estimators_fit_returns_self",
    "check_readonly_memmap_input",
    "check_fit_idempotent",
    "check_fit_check_is_fitted",
    "check_n_features_in",
)
"""The checks that fit on 2 features (make_blobs' default) and 21 rows."""
SMALL_DATA_METHODS = {
    "PrivateSubspace": ("auto", "gauss", "power"),
    "PrivateSubspaceClustering": ("sulq",),
}
"""Methods that fit a handful of rows given a public ``row_norm`` (no subsets, no private
bound); any other configuration is declared to need more rows than the checks give."""


def expected_failed_checks(estimator: BaseEstimator) -> dict[str, str]:
    """The scikit-learn checks ``estimator``'s configuration cannot pass, each with the reason,
    in scikit-learn's own form: ``check_estimator(est,
    expected_failed_checks=expected_failed_checks(est))`` runs every check and reports these
    as expected failures (``parametrize_with_checks(…, expected_failed_checks=
    expected_failed_checks)`` likewise). Always :data:`EXPECTED_FAILED_CHECKS`; the
    :data:`FEW_ROWS` checks unless the configuration fits a handful of rows (a public
    ``row_norm`` and a method of :data:`SMALL_DATA_METHODS`, no ``standardize`` or
    ``boost``); the :data:`FEW_FEATURES` checks where it releases 2 or more dimensions."""
    params = estimator.get_params(deep=False)
    checks = {}
    small = (
        params.get("row_norm") is not None
        and params.get("method") in SMALL_DATA_METHODS.get(type(estimator).__name__, ())
        and not params.get("standardize")
        and params.get("boost") is None
    )
    if not small:
        checks |= dict.fromkeys(FEW_ROWS_CHECKS, FEW_ROWS)
    size = (params.get("rank") or params.get("n_components") or 1) * (
        params.get("clusters") or params.get("n_clusters") or 1
    )
    if size >= 2:
        checks |= dict.fromkeys(FEW_FEATURES_CHECKS, FEW_FEATURES)
    return EXPECTED_FAILED_CHECKS | checks


REFIT_WARNING = (
    "{name} or a clone of it (GridSearchCV and cross_val_score fit clones) was already "
    "fitted: this fit spent its privacy budget again, and the privacy loss of all fits on "
    "overlapping data adds up (sequential composition: GridSearchCV over g candidates with "
    "cv=c spends g·(c−1)+1 budgets on each row)"
)


DASK_INDEX_BUG = (
    "Dask could not read the partitions of this DataFrame (KeyError {error}: a Dask bug with "
    "Parquet files that store a pandas index, such as a named RangeIndex, read with "
    "columns=): pass the Parquet path to fit instead, or read it with "
    "dd.read_parquet(..., index=False)"
)
"""Dask's own ``.compute()`` fails the same way on such a frame; the fit says what to do."""


class _FitCount:
    """How many times an estimator and its clones were fitted, shared by reference between
    them (in this process): from the second fit on, each warns that it spends again."""

    def __init__(self) -> None:
        self.fits = 0


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
        twin = type(self)(**copied, client=client)
        twin._fits = self._fit_count()  # a clone's fits spend budget as the original's do
        return twin

    def _fit_count(self) -> _FitCount:
        """The fits of this estimator and of every clone made from it or cloned into it."""
        return self.__dict__.setdefault("_fits", _FitCount())

    def _refuse_refit(self) -> None:
        """An estimator loaded from a published run (``from_run``) holds no data: no fit."""
        loaded = self.__dict__.get("_loaded_from")
        if loaded is not None:
            name = type(self).__name__
            raise _also_value_error(InputError)(
                f"this {name} was loaded from the run {loaded} ({name}.from_run): it holds the "
                "released basis, not the data, so it cannot be fitted again; to estimate on new "
                f"data (spending a new budget) fit sklearn.base.clone(est) or a new {name}"
            )

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
        ``n_features_in_``, ``feature_names_in_`` and ``columns_left_out_``."""
        opened: list[Dataset] = []
        exclude = config.exclude_columns
        if exclude is not None and not (_is_path(X) or hasattr(X, "columns")):
            raise InputError(
                "exclude_columns needs column names: pass a DataFrame or a Parquet path"
            )
        if _is_path(X):
            uri = os.fspath(X)

            def open_dataset(client: Any) -> Dataset:
                dataset = parquet_dataset(
                    uri,
                    config.columns,
                    config.unit_column,
                    config.storage_options,
                    client,
                    exclude,
                    API_OPTIONS,
                )
                opened.append(dataset)
                return dataset
        else:
            if config.unit_column is not None:
                raise InputError("unit_column needs a Parquet input that holds that column")
            rows, names, left_out = self._fit_rows(X, config.columns, exclude)

            def open_dataset(client: Any) -> Dataset:
                dataset = array_dataset(rows, names, client)
                dataset.left_out = left_out
                opened.append(dataset)
                return dataset

        try:
            result = runner(config, open_dataset, self._client(X))
        except KeyError as err:
            if not (_is_dask(X) and hasattr(X, "columns") and "not in index" in str(err)):
                raise
            raise InputError(DASK_INDEX_BUG.format(error=err)) from None
        count = self._fit_count()
        count.fits += 1
        if count.fits > 1:
            warnings.warn(REFIT_WARNING.format(name=type(self).__name__), UserWarning, 3)
        self.manifest_ = result.manifest
        if _is_path(X):
            self._set_table_features(opened[-1])
        self.columns_left_out_ = dict(opened[-1].left_out)
        if self.columns_left_out_:
            warnings.warn(
                _left_out_message(type(self).__name__, self.columns_left_out_), UserWarning, 3
            )
        return result

    def _fit_rows(
        self, X: Any, columns: list[str] | None, exclude: list[str] | None
    ) -> tuple[Any, list[str] | None, dict[str, str]]:
        """In-memory input checked as scikit-learn does (its errors and feature names); Dask
        input left where it is. A DataFrame's columns are chosen by the CLI's rule
        (:func:`frame_choice`: numeric, no identifiers unless named in ``columns=``). Returns
        the rows, the feature names and the columns the rule left out."""
        left_out: dict[str, str] = {}
        if hasattr(X, "columns") and hasattr(X, "dtypes"):
            X, choice = frame_choice(X, columns, exclude, API_OPTIONS)
            left_out = choice.left_out
        if _is_dask(X):
            if hasattr(X, "columns"):
                self._set_names(X.columns)
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
        return X, None if names is None else [str(n) for n in names], left_out

    def _set_names(self, columns: Any) -> None:
        if all(isinstance(c, str) for c in columns):
            self.feature_names_in_ = np.asarray(list(columns), dtype=object)
        else:
            self.__dict__.pop("feature_names_in_", None)

    def _set_table_features(self, dataset: Dataset) -> None:
        """Features of a Parquet input: ``x[17]`` for element 17 of a vector column ``x``."""
        self.n_features_in_ = dataset.dim
        self.feature_names_in_ = np.asarray(
            [feature_name(dataset.columns, dataset.widths, j) for j in range(dataset.dim)],
            dtype=object,
        )

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
        was given at fit, else chosen by the fit's rule (:func:`frame_choice`, which leaves
        out the same text, date, identifier columns) and checked to be the fitted ones in the
        fitted order."""
        if self.columns:
            frame = frame[_present(frame, list(self._source_columns()))]
        wanted = self._source_columns() if hasattr(self, "feature_names_in_") else None
        names = [str(c) for c in frame.columns]
        if wanted is not None and names != wanted and not self.columns:
            try:
                chosen, choice = frame_choice(
                    frame, None, getattr(self, "exclude_columns", None), API_OPTIONS
                )
            except InputError:  # nothing to choose: the names differ, said below
                choice = None
            if choice is not None and choice.used == wanted:
                frame, names = chosen, wanted
        if wanted is not None and names != wanted:
            raise ValueError(
                "The feature names should match those that were passed during fit, in the "
                f"same order: expected {wanted}, got {names}"
            )
        return frame


def _released_model(estimator: PrivateSubspace) -> bool:
    """Whether the probabilistic PCA methods apply: unfitted (they then say so), or fitted
    from a run that released the explained variance and its total; else AttributeError
    saying why (scikit-learn's ``available_if``: ``hasattr`` is then False)."""
    if not hasattr(estimator, "components_") or estimator.noise_variance_ is not None:
        return True
    why = chosen_view(estimator.manifest_)["release"].get("explained_variance_note")
    raise AttributeError(
        "the probabilistic PCA model needs the released explained variance and its total, "
        f"which this run did not release ({why or 'see manifest_'}); a private estimate of "
        "them would need its own budget"
    )


class PrivateSubspace(_PrivateEstimator):
    """Differentially private top-k principal subspace (``method="auto"`` by default).

    Parameters are those of ``dpsub estimate``, by the same names (one table,
    :mod:`dpsub_dist.params` and :mod:`dpsub_dist.methods`): ``n_components`` (K, default 2;
    None is refused, not read as PCA's "all"; ``rank`` is an alias), ``epsilon``/``delta``
    or ``rho`` (+ ``delta``; default ε = 1, δ = 10⁻⁶), ``method``, ``subsets``,
    ``ref_points``, ``assign``, ``unit_column``,
    ``columns``, ``exclude_columns`` (named tables), ``standardize`` (private per-column
    location and scale first: the correlation matrix's PCA; row level), ``seed`` (public
    randomness only: DP noise always comes from OS entropy), ``radius`` (friendly, auto) /
    ``cell_side`` (histogram): the public radius or cell side (``scale``, their old shared name, is
    deprecated), ``row_norm``/``center``
    (centring is on by default at row level for every method but exact; ``center=False`` for
    the uncentred subspace), ``outliers``/``tolerance`` (exact), ``boost``/``boost_alpha``
    (SS21 Alg. 3 around any method), ``storage_options`` and ``client`` (a
    ``distributed.Client``; without one, Dask and Parquet input run on Dask's default
    distributed client if there is one, NumPy/pandas input in-process). Parameters are
    checked in ``fit`` (scikit-learn convention); bad ones, and inputs too small for them (n
    is public at row level), raise :class:`~dpsub_dist.errors.InputError`, which is also a
    ``ValueError`` here, before anything is spent.

    Attributes after ``fit`` (released values or public facts; reading them costs nothing):

    - ``components_`` (K×D, orthonormal rows, as scikit-learn's PCA), ``basis_`` (D×K),
      ``n_components_`` (K);
    - ``mean_``: the private mean subtracted before projecting (centred runs; with
      ``standardize=True`` the private location), else None; ``scale_``: with
      ``standardize=True`` the private per-column scale rows are divided by, else None;
    - ``explained_variance_`` / ``explained_variance_ratio_`` / ``singular_values_``: for
      ``gauss``, from the released noisy covariance's eigenvalues (post-processing); for
      friendly, histogram and gap-perturb from their own small private step (row level); the
      variance and singular values are None at user level (they need the row count, private
      there), gauss's ratio is given;
    - ``n_features_in_``; ``feature_names_in_`` when fitted on a DataFrame or Parquet;
      ``columns_left_out_``: the columns the default rule left out, and why (identifier,
      index, not numeric; from the schema);
    - ``noise_variance_``, ``get_covariance``, ``get_precision``, ``score_samples``,
      ``score``: PCA's probabilistic model from the released variance and its total (absent
      where the run released none);
    - ``manifest_`` (what was spent and released).

    :meth:`from_run` gives the fitted estimator of a published run (``dpsub estimate
    --out``). ``fit`` raises :class:`NoStableSubspace` when the aggregator returns ⊥: the budget is
    spent (``manifest_`` says so) and the estimator stays unfitted.
    """

    def __init__(
        self,
        n_components: int | None = DEFAULT_COMPONENTS,
        *,
        rank: int | None = None,
        epsilon: float | None = None,
        delta: float = 1e-6,
        rho: float | None = None,
        unit_column: str | None = None,
        columns: list[str] | None = None,
        exclude_columns: list[str] | None = None,
        seed: int | None = None,
        storage_options: dict[str, Any] | None = None,
        standardize: bool = False,
        method: str = DEFAULTS["estimate"],
        subsets: int | None = None,
        ref_points: int | None = None,
        assign: str = "random",
        radius: float | None = None,
        row_norm: float | None = None,
        center: bool | None = None,
        cell_side: float | None = None,
        outliers: int | None = None,
        tolerance: float | None = None,
        iterations: int | None = None,
        oversample: int | None = None,
        boost: int | None = None,
        boost_alpha: float | None = None,
        client: Any | None = None,
        scale: float | None = None,
    ) -> None:
        self._store(locals())

    def _config(self) -> EstimateConfig:
        rank = _alias("n_components", self.n_components, "rank", self.rank, DEFAULT_COMPONENTS)
        return _config_from(self, EstimateConfig, self._scale_alias(), rank=rank)

    def _scale_alias(self) -> dict[str, float]:
        """``scale=`` (deprecated) as the parameter it names for ``method``: ``cell_side``
        for histogram, else ``radius``; FutureWarning."""
        if self.scale is None:
            return {}
        name = "cell_side" if self.method == "histogram" else "radius"
        warnings.warn(
            f"scale= is deprecated and will be removed in the next release: pass {name}= "
            "(radius= for friendly and auto, cell_side= for histogram: the names of "
            "--radius and --cell-side)",
            FutureWarning,
            4,
        )
        given = getattr(self, name)
        if given is not None and given != self.scale:
            raise InputError(f"scale={self.scale} and {name}={given} differ: pass only {name}")
        return {name: self.scale}

    def fit(self, X: Any, y: None = None) -> PrivateSubspace:
        """Estimate from a NumPy/Dask array, a pandas/Dask DataFrame, or a Parquet path/URI
        (``str`` or ``pathlib.Path``). Spends the budget; Dask input is read on the cluster."""
        self._refuse_refit()
        with _api_errors(self):
            result = self._fit_run(X, self._config(), run_estimate)
        if result.basis is None:
            reason = (
                chosen_view(result.manifest)["release"].get("failure_reason") or "see manifest_"
            )
            raise NoStableSubspace(
                f"no stable subspace: {api_wording(reason, self.get_params(deep=False))}; try "
                "method='gauss', more data or a larger budget"
            )
        self._set_release(result.basis, result.manifest)
        return self

    def _set_release(self, basis: np.ndarray, manifest: dict[str, Any]) -> None:
        """The fitted attributes from a release: its basis and its manifest's values."""
        self.manifest_ = manifest
        self.basis_ = basis
        self.components_ = basis.T
        self.n_components_ = basis.shape[1]
        self._n_features_out = self.n_components_
        self.mean_, self.scale_ = released_centring(manifest)
        release = chosen_view(manifest)["release"]
        self.explained_variance_ = _array_or_none(release.get("explained_variance"))
        self.explained_variance_ratio_ = _array_or_none(release.get("explained_variance_ratio"))
        n_rows = manifest.get("n_rows")
        self.singular_values_ = (
            None
            if self.explained_variance_ is None or n_rows is None
            else np.sqrt(n_rows * self.explained_variance_)
        )
        self.noise_variance_ = _noise_variance(
            self.explained_variance_, self.explained_variance_ratio_, basis.shape[0]
        )

    @classmethod
    def from_run(
        cls, run: str | os.PathLike, storage_options: dict[str, Any] | None = None
    ) -> PrivateSubspace:
        """The estimator a published run defines (``dpsub estimate --out RUN``, ``dpsub run``,
        a stream release written with ``--out``; a local folder or ``s3://`` prefix), fitted:
        its ``transform``/``inverse_transform`` are the run's, as ``dpsub transform`` applies
        them. Reading a release is post-processing: no budget. It holds no data, so ``fit``
        refuses (``clone`` gives an unfitted estimator to fit anew, at a new budget)."""
        from dpsub_dist.transform import run_projection

        uri = os.fspath(run)
        with _api_errors(cls()):
            projection, manifest = run_projection(uri, storage_options)
        view = chosen_view(manifest)
        params = {
            "n_components": projection.rank,
            "columns": list(projection.columns),
            "method": manifest.get("method", DEFAULTS["estimate"]),
            "unit_column": view.get("parameters", {}).get("unit_column"),
            "standardize": projection.scale is not None,
            "storage_options": storage_options,
        }
        estimator = cls(**{name: value for name, value in params.items() if value is not None})
        estimator._set_release(projection.basis, manifest)
        estimator.n_features_in_ = projection.basis.shape[0]
        estimator.feature_names_in_ = np.asarray(
            [
                feature_name(projection.columns, projection.widths, j)
                for j in range(estimator.n_features_in_)
            ],
            dtype=object,
        )
        estimator.columns_left_out_ = dict(manifest.get("columns_left_out") or {})
        estimator._loaded_from = uri
        return estimator

    def transform(self, X: Any) -> Any:
        """Project rows onto the private basis (post-processing: no extra privacy cost).

        Subtracts ``mean_`` first when the fit centred, and divides by ``scale_`` when it
        standardised (:func:`dpsub_dist.transform.project`, the map ``dpsub transform``
        applies). NumPy and pandas input give a NumPy array; Dask arrays/DataFrames and
        Parquet paths give a lazy Dask array.
        """
        with _api_errors(self):
            rows = self._rows(X)
        return project(rows, self.basis_, self.mean_, self.scale_)

    def inverse_transform(self, X: Any) -> Any:
        """Map projected rows back to feature space: ``X @ components_ (· scale_) (+ mean_)``."""
        check_is_fitted(self)
        if not _is_dask(X):
            X = check_array(X, dtype=np.float64)
        k = self.n_components_
        if X.ndim != 2 or X.shape[1] != k:
            raise ValueError(f"expected n_components_ = {k} columns per row, got shape {X.shape}")
        return unproject(X, self.components_, self.mean_, self.scale_)

    @available_if(_released_model)
    def get_covariance(self) -> np.ndarray:
        """The covariance of the probabilistic PCA model of the release, as scikit-learn's
        ``PCA.get_covariance``: ``Vᵀ diag(max(λ − σ², 0)) V + σ² I`` with V = ``components_``,
        λ = ``explained_variance_`` and σ² = ``noise_variance_``, in the units the run
        estimated in (standardised with ``standardize``). Released values only: free."""
        variance, noise = self._model()
        excess = np.maximum(variance - noise, 0.0)
        covariance = (self.components_.T * excess) @ self.components_
        covariance.flat[:: len(covariance) + 1] += noise
        return covariance

    @available_if(_released_model)
    def get_precision(self) -> np.ndarray:
        """The inverse of :meth:`get_covariance` (released values only: free)."""
        return np.linalg.inv(self.get_covariance())

    @available_if(_released_model)
    def score_samples(self, X: Any) -> np.ndarray:
        """Log-likelihood of each row of ``X`` under the released model (as
        ``PCA.score_samples``: Gaussian with mean ``mean_`` and :meth:`get_covariance`, on
        the rows centred and scaled as ``transform`` does). The model is released values;
        the numbers are about the rows you pass, read without privacy as ``transform``
        reads them: yours, not a release (a score used to choose between fits makes the
        choice non-private)."""
        self._model()
        with _api_errors(self):
            rows = np.asarray(self._rows(X), dtype=np.float64)
        rows = prepared(rows, self.mean_, self.scale_)
        precision = self.get_precision()
        _, logdet = np.linalg.slogdet(precision)
        log_like = -0.5 * np.einsum("ij,ij->i", rows, rows @ precision)
        return log_like - 0.5 * (rows.shape[1] * np.log(2 * np.pi) - logdet)

    @available_if(_released_model)
    def score(self, X: Any, y: None = None) -> float:
        """The mean of :meth:`score_samples` (as ``PCA.score``)."""
        return float(np.mean(self.score_samples(X)))

    def _model(self) -> tuple[np.ndarray, float]:
        """λ and σ² of the probabilistic PCA model of the release."""
        check_is_fitted(self)
        return self.explained_variance_, self.noise_variance_

    def plot_explained_variance(self, ax: Any = None) -> Any:
        """Scree plot of the released explained-variance ratio (published values: no budget);
        needs matplotlib (``pip install 'dpsub_dist[plot]'``). Returns the axes."""
        from dpsub_dist.report import plot_explained_variance

        check_is_fitted(self)
        return plot_explained_variance(self.manifest_, ax)


class PrivateSubspaceClustering(_PrivateEstimator):
    """Differentially private subspace clustering (``dpsub cluster``): ``n_clusters`` linear
    subspaces (default 2) of dimension ``n_components`` (q, default 1; aliases ``clusters``
    and ``rank``), by default at ε = 1, δ = 10⁻⁶.

    Parameters are those of ``dpsub cluster``, by the same names: ``method``
    (``sample-aggregate``, ``sulq``, ``gibbs``), ``aggregator``, ``subsets``, ``ref_points``,
    ``assign``, ``unit_column``, ``scale`` (sample-aggregate: its aggregator's radius or cell
    side, ``--scale``), ``iterations`` (sulq), ``sweeps`` (gibbs), ``row_norm`` (sulq, gibbs),
    ``private_norm`` (sulq), the budget, ``columns``, ``exclude_columns``, ``seed``,
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
        n_clusters: int | None = 2,
        n_components: int | None = 1,
        *,
        clusters: int | None = None,
        rank: int | None = None,
        epsilon: float | None = None,
        delta: float = 1e-6,
        rho: float | None = None,
        unit_column: str | None = None,
        columns: list[str] | None = None,
        exclude_columns: list[str] | None = None,
        seed: int | None = None,
        storage_options: dict[str, Any] | None = None,
        method: str = "sample-aggregate",
        aggregator: str = "friendly",
        subsets: int | None = None,
        ref_points: int | None = None,
        assign: str = "random",
        scale: float | None = None,
        iterations: int | None = None,
        row_norm: float | None = None,
        private_norm: bool = False,
        sweeps: int | None = None,
        client: Any | None = None,
    ) -> None:
        self._store(locals())

    def _config(self) -> ClusterConfig:
        return _config_from(
            self,
            ClusterConfig,
            {},
            clusters=_alias("n_clusters", self.n_clusters, "clusters", self.clusters, 2),
            rank=_alias("n_components", self.n_components, "rank", self.rank, 1),
        )

    def fit(self, X: Any, y: None = None) -> PrivateSubspaceClustering:
        """Cluster a NumPy/Dask array, a pandas/Dask DataFrame or a Parquet path (spends the
        budget)."""
        from dpsub_dist.job import run_cluster
        from dpsub_dist.privacy.subspace_clustering import GIBBS_WARNING

        with _api_errors(self):
            result = self._fit_run(X, self._config(), run_cluster)
        if self.method == "gibbs":
            text = GIBBS_WARNING.removeprefix("warning: ")
            warnings.warn(api_wording(text, self.get_params(deep=False)), UserWarning, 2)
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
        with _api_errors(self):
            rows = self._rows(X)
        energy = (rows * rows).sum(axis=1)
        kept = [((rows @ basis) ** 2).sum(axis=1) for basis in self.bases_]
        return np.sqrt(np.maximum(energy[:, None] - np.stack(kept, axis=1), 0.0))

    def predict(self, X: Any) -> Any:
        """Index of the nearest released subspace for each row (smallest residual)."""
        return self.transform(X).argmin(axis=1)

    def fit_predict(self, X: Any, y: None = None) -> Any:
        return self.fit(X).predict(X)


def _config_from(
    estimator: _PrivateEstimator, kind: type[RunConfig], aliases: dict[str, Any], **required: Any
) -> Any:
    """The run config of ``kind`` from the estimator's parameters, which are the tables'
    names (:func:`api_parameters`), checked before any input is read: the run-level ones
    (lists, a pandas ``Index`` of names too, and mappings copied so a fit never edits them;
    ε = :data:`DEFAULT_EPSILON` when neither ``epsilon`` nor ``rho`` is given), then the
    method options given, checked as the CLI and job files check them (``aliases``: values
    of deprecated names, by the name they stand for)."""
    run: dict[str, Any] = {}
    for param in RUN_PARAMS[kind.command]:
        if param.name in REQUIRED:
            continue
        value = getattr(estimator, param.name)
        if param is STORAGE_OPTIONS:
            value = dict(value or {})
        elif param.kind is list and value is not None and not isinstance(value, str):
            value = [str(name) if isinstance(name, np.str_) else name for name in value]
        run[param.field] = value
    if run["epsilon"] is None and run["rho"] is None:
        run["epsilon"] = DEFAULT_EPSILON
    unset = {f.name: f.default for f in fields(kind)}
    given = {}
    for name, param in declared(kind.command).items():
        value = aliases.get(name, getattr(estimator, name))
        if value is not None and value != unset[param.field]:
            given[name] = value
    options = check_given(kind.command, estimator.method, given, cli_flag)
    config = kind(**required, **run, method=estimator.method, **options)
    config.check_run()
    return config


def api_parameters(command: str) -> list[str]:
    """The estimator parameters of ``command``'s tables: every run-level and method parameter
    by its table name (``rank``/``clusters`` are aliases of ``n_components``/``n_clusters``),
    the method and the Dask client. Each estimator's ``__init__`` has exactly these (a test
    holds it to the tables; scikit-learn needs an explicit signature)."""
    names = ["n_clusters"] if command == "cluster" else []
    names += ["n_components", *(p.name for p in RUN_PARAMS[command]), "method"]
    return [*names, *declared(command), "client"]


NONE_REFUSED = {
    "n_components": "scikit-learn's PCA reads None as all D components, but a private basis "
    "has fewer than D (all D span the whole space, and the directions past the signal would "
    "be drawn by the noise): pass the dimension to release, n_components=K < D",
    "n_clusters": "pass the number of subspaces, n_clusters=K",
}
"""Why ``None`` is refused for a size parameter (no size is chosen for the caller)."""


def _alias(name: str, value: Any, alias: str, alias_value: Any, default: int) -> Any:
    """The value of a parameter given under its scikit-learn name or its dpsub alias:
    the alias when given (the name at its ``default`` gives way; another value that differs
    is refused), else the name's value; ``None`` is refused with its reason."""
    if alias_value is not None:
        if value not in (None, default, alias_value):
            raise InputError(f"{name}={value} and {alias}={alias_value} differ: pass only {name}")
        return alias_value
    if value is None:
        raise InputError(f"{name}=None is not accepted: {NONE_REFUSED[name]} (default {default})")
    return value


@functools.cache
def _also_value_error(kind: type[InputError]) -> type[InputError]:
    """``kind`` that is also a ``ValueError``, as scikit-learn expects of bad input."""
    return type(kind.__name__, (kind, ValueError), {"__module__": kind.__module__})


@contextmanager
def _api_errors(estimator: BaseEstimator) -> Iterator[None]:
    """Re-raise an :class:`InputError` as the same error that is also a ``ValueError``, its
    message naming the estimator's parameters where the engine's names a CLI flag."""
    try:
        yield
    except InputError as err:
        kind = type(err) if isinstance(err, ValueError) else _also_value_error(type(err))
        text = api_wording(str(err), estimator.get_params(deep=False))
        raise kind(text).with_traceback(err.__traceback__) from None


_API_NAMES = {
    "rank": "n_components",
    "clusters": "n_clusters",
    "storage_option": "storage_options",
}
"""CLI flag (dashes as underscores) → estimator parameter, where the two names differ."""

_METHOD_FLAG = re.compile(r"--method ([\w-]+(?:/[\w-]+)*)")
_FLAGS = re.compile(
    r"--(?:no-)?[a-z][a-z0-9-]*(?:/--(?:no-)?[a-z][a-z0-9-]*)*"
    r"(?: [A-Z]\b| \d+(?:\.\d+)?(?:e[+-]?\d+)?\b)?"  # a metavar (K) or a value (2)
)


def api_wording(message: str, params: Collection[str]) -> str:
    """``message`` (written for the CLI) with each flag of a parameter in ``params`` named as
    that parameter: ``--rank K`` → ``n_components=K`` (``--rank 3`` → ``n_components=3``),
    ``--method gibbs`` →
    ``method='gibbs'``, ``--no-center`` → ``center=False``, ``--radius`` → ``radius``.
    Flags of anything else (``--out``) are left as they are."""

    def method(match: re.Match[str]) -> str:
        return "method=" + "/".join(f"'{name}'" for name in match[1].split("/"))

    def flags(match: re.Match[str]) -> str:
        text, _, metavar = match[0].partition(" ")
        names = []
        for flag in text.split("/"):
            name = flag.removeprefix("--").removeprefix("no-").replace("-", "_")
            param = _API_NAMES.get(name, name)
            if param not in params:
                return match[0]
            names.append(f"{param}=False" if flag.startswith("--no-") else param)
        named = "/".join(dict.fromkeys(names))
        return f"{named}={metavar}" if metavar else named

    if "method" in params:
        message = _METHOD_FLAG.sub(method, message)
    return _FLAGS.sub(flags, message)


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


def _left_out_message(name: str, left_out: dict[str, str]) -> str:
    """The one-line warning naming the columns a fit left out and why (schema only)."""
    listed = ", ".join(f"{column} ({why})" for column, why in left_out.items())
    return (
        f"{name} left out the columns {listed}: pass columns= to choose the feature columns "
        "(columns_left_out_ lists them)"
    )


def _noise_variance(
    variance: np.ndarray | None, ratio: np.ndarray | None, dim: int
) -> float | None:
    """``noise_variance_`` as scikit-learn's PCA has it, the mean variance along the D − k
    directions the basis leaves out: (total − Σλ)/(D − k), the total being Σλ/Σratio (each
    ratio is λ over the released total). Released values and the public D only: free. None
    where the run released no variance or no total. Noise can put the released total at or
    below Σλ: the remainder is then floored at :data:`NOISE_VARIANCE_FLOOR` of the mean
    variance per direction, so the model's covariance stays invertible (PCA's is too)."""
    if variance is None or ratio is None or not ratio.sum() > 0:
        return None
    rest = dim - len(variance)
    if rest <= 0:
        return 0.0
    total = variance.sum() / ratio.sum()
    floor = NOISE_VARIANCE_FLOOR * max(total, 0.0) / dim
    return float(max((total - variance.sum()) / rest, floor))


NOISE_VARIANCE_FLOOR = 1e-6
"""``noise_variance_`` is at least this share of the released total's mean per direction."""


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

    options = dict(storage_options or {})
    dataset = parquet_dataset(uri, columns, None, options, None, None, API_OPTIONS)
    blocks = [
        da.from_delayed(
            dask.delayed(_read_part)(dataset.loader, part),
            shape=(part.rows, dataset.dim),
            dtype=np.float64,
        )
        for part in dataset.parts
    ]
    return da.concatenate(blocks) if blocks else da.zeros((0, dataset.dim))
