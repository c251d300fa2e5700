"""scikit-learn-style Python API mirroring ``dpsub estimate``.

>>> est = PrivateSubspace(rank=4, epsilon=1.0, delta=1e-6).fit(X)   # doctest: +SKIP
>>> Z = est.transform(X)                                           # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from dataclasses import fields
from typing import Any

import numpy as np

from dpsub_dist.engine.sources import Dataset, array_dataset, parquet_dataset
from dpsub_dist.errors import NoStableSubspace
from dpsub_dist.io.parquet import feature_name, id_like_message, looks_like_id
from dpsub_dist.job import EstimateConfig, run_estimate


class PrivateSubspace:
    """Differentially private top-k principal subspace (sample and aggregate by default).

    Parameters mirror the CLI: ``rank``, ``epsilon``/``delta`` or ``rho`` (+ ``delta``),
    ``method``, ``subsets``, ``ref_points``, ``assign``, ``unit_column``, ``columns``,
    ``seed`` (public randomness only), ``scale`` (public radius / cell side),
    ``row_norm``/``center`` (gauss, gap-perturb), ``outliers``/``tolerance`` (exact),
    ``boost``/``boost_alpha`` (SS21 Alg. 3 around any method), ``iterations``/``oversample``
    (power), and ``client`` (a
    ``distributed.Client``; without one, NumPy input runs in-process and Dask input on
    Dask's default scheduler).

    Attributes after ``fit`` (all released values or public facts; reading them costs nothing):

    - ``components_`` (k×d, orthonormal rows, like scikit-learn PCA), ``basis_`` (d×k);
    - ``mean_``: the private mean subtracted before projecting (``center=True``), else None;
    - ``explained_variance_`` / ``explained_variance_ratio_``: for ``gauss``, from the released
      noisy covariance's eigenvalues (post-processing); the variance is None at user level
      (it needs the row count, private there), the ratio is given. None for other methods:
      ``gap-perturb`` releases only a noisy projector, the sample-and-aggregate and exact
      methods no eigenvalues; a private estimate for them would need its own budget share
      (future work);
    - ``n_features_in_``; ``feature_names_in_`` when fitted on a DataFrame or Parquet;
    - ``manifest_`` (what was spent and released).

    ``fit`` raises :class:`NoStableSubspace` when the aggregator returns ⊥.
    """

    def __init__(
        self,
        rank: int,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        rho: float | None = None,
        method: str = "friendly",
        subsets: int | None = None,
        ref_points: int | None = None,
        assign: str = "random",
        unit_column: str | None = None,
        columns: list[str] | None = None,
        seed: int | None = None,
        scale: float | None = None,
        row_norm: float | None = None,
        center: bool = False,
        outliers: int | None = None,
        tolerance: float | None = None,
        boost: int | None = None,
        boost_alpha: float | None = None,
        iterations: int | None = None,
        oversample: int | None = None,
        storage_options: dict[str, Any] | None = None,
        client: Any | None = None,
    ) -> None:
        # scikit-learn convention: each parameter is kept as an attribute of the same name.
        params = dict(locals())
        for name in ("self", "__class__"):
            params.pop(name, None)
        for name, value in params.items():
            setattr(self, name, value)

    def _config(self) -> EstimateConfig:
        values = {f.name: getattr(self, f.name) for f in fields(EstimateConfig)}
        return EstimateConfig(**{**values, "storage_options": dict(self.storage_options or {})})

    def fit(self, X: Any, y: None = None) -> PrivateSubspace:
        """Estimate from a NumPy/Dask array, a pandas/Dask DataFrame, or a Parquet path/URI
        (``str`` or ``pathlib.Path``)."""
        config = self._config()
        opened: list[Dataset] = []
        if _is_path(X):
            uri = os.fspath(X)

            def open_dataset(client):
                dataset = parquet_dataset(
                    uri, config.columns, config.unit_column, config.storage_options, client
                )
                opened.append(dataset)
                return dataset
        else:
            if self.unit_column is not None:
                raise ValueError("unit_column needs a Parquet input that holds that column")

            def open_dataset(client):
                dataset = array_dataset(X, config.columns)
                opened.append(dataset)
                return dataset

        result = run_estimate(config, open_dataset, self.client)
        self.manifest_ = result.manifest
        if result.basis is None:
            raise NoStableSubspace(
                "no stable subspace: the subsets disagree (see manifest_); try more data, "
                "a larger budget or fewer subsets"
            )
        self.basis_ = result.basis
        self.components_ = result.basis.T
        self.n_features_in_ = result.basis.shape[0]
        self._set_feature_names(X, opened[-1] if opened else None)
        release = _chosen_release(result.manifest)
        self.mean_ = None if release.get("mean") is None else np.asarray(release["mean"])
        self.explained_variance_ = _array_or_none(release.get("explained_variance"))
        self.explained_variance_ratio_ = _array_or_none(release.get("explained_variance_ratio"))
        return self

    def _set_feature_names(self, X: Any, dataset: Dataset | None) -> None:
        """``feature_names_in_`` for tables (scikit-learn convention), and the id-like warning."""
        named = _is_path(X) or hasattr(X, "columns")
        if not named or dataset is None:
            self.__dict__.pop("feature_names_in_", None)
            return
        widths = dataset.widths
        self.feature_names_in_ = np.asarray(
            [feature_name(dataset.columns, widths, j) for j in range(dataset.dim)], dtype=object
        )
        id_like = list(dataset.id_like)
        if hasattr(X, "dtypes"):  # pandas/Dask: the same schema-only test on the dtypes
            types = {str(c): str(t) for c, t in zip(X.columns, X.dtypes, strict=True)}
            id_like = [c for c in dataset.columns if looks_like_id(c, types.get(c, ""))]
        if id_like:
            warnings.warn(id_like_message(id_like, "columns="), UserWarning, stacklevel=3)

    def transform(self, X: Any) -> Any:
        """Project rows onto the private basis (post-processing: no extra privacy cost).

        Subtracts ``mean_`` first when the fit centred. NumPy and pandas input give a NumPy
        array; Dask arrays/DataFrames and Parquet paths give a (lazy) Dask array.
        """
        rows = self._rows(X)
        if self.mean_ is not None:
            rows = rows - self.mean_
        return rows @ self.basis_

    def inverse_transform(self, Z: Any) -> Any:
        """Map projected rows back to feature space: ``Z @ components_ (+ mean_)``."""
        self._check_fitted()
        if not hasattr(Z, "dask"):
            Z = np.asarray(Z, dtype=np.float64)
        k = self.basis_.shape[1]
        if Z.ndim != 2 or Z.shape[1] != k:
            raise ValueError(f"expected {k} components per row (rank), got shape {Z.shape}")
        out = Z @ self.components_
        return out if self.mean_ is None else out + self.mean_

    def fit_transform(self, X: Any, y: None = None) -> Any:
        return self.fit(X).transform(X)

    def _check_fitted(self) -> None:
        if not hasattr(self, "components_"):
            raise AttributeError("call fit before transform")

    def _source_columns(self) -> list[str] | None:
        """Columns to read from a table at transform: the fitted ones, else ``columns=``."""
        if hasattr(self, "feature_names_in_"):
            return list(self.manifest_["columns"])
        return list(self.columns) if self.columns else None

    def _rows(self, X: Any) -> Any:
        """``X`` as a NumPy or Dask array of the fitted features, in the fitted order."""
        self._check_fitted()
        if _is_path(X):
            X = _parquet_rows(os.fspath(X), self._source_columns(), self.storage_options)
        elif hasattr(X, "columns"):
            X = self._table_rows(X)
        elif not hasattr(X, "dask"):
            X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            got = X.shape[1] if X.ndim == 2 else f"shape {X.shape}"
            raise ValueError(
                f"X has {got} features, but this PrivateSubspace was fitted with "
                f"{self.n_features_in_} features"
            )
        return X

    def _table_rows(self, frame: Any) -> Any:
        """A pandas/Dask DataFrame's fitted columns (checked by name and order) as an array."""
        names = [str(c) for c in frame.columns]
        wanted = self._source_columns()
        if self.columns:  # columns= at fit: take them from a wider table
            missing = [c for c in wanted if c not in names]
            if missing:
                raise ValueError(f"X lacks the fitted feature columns {missing} (has {names})")
            frame, names = frame[wanted], wanted
        if wanted is not None and names != wanted:
            raise ValueError(
                f"X's feature names must match those seen in fit, in the same order: expected "
                f"{wanted}, got {names}"
            )
        if hasattr(frame, "to_dask_array"):
            return frame.to_dask_array(lengths=True).astype(np.float64)
        return frame.to_numpy(dtype=np.float64)


def _is_path(X: Any) -> bool:
    return isinstance(X, str | os.PathLike)


def _array_or_none(values: Any) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=np.float64)


def _chosen_release(manifest: dict[str, Any]) -> dict[str, Any]:
    """The release behind the basis: the chosen group's when boosted, else the run's."""
    release = manifest["release"]
    chosen = release.get("chosen_group")
    if chosen is None:
        return release
    return manifest["parameters"]["group_runs"][chosen]["release"]


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
