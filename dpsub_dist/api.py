"""scikit-learn-style Python API mirroring ``dpsub estimate``.

>>> est = PrivateSubspace(rank=4, epsilon=1.0, delta=1e-6).fit(X)   # doctest: +SKIP
>>> Z = est.transform(X)                                           # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from dpsub_dist.engine.sources import array_dataset, parquet_dataset
from dpsub_dist.errors import NoStableSubspace
from dpsub_dist.job import EstimateConfig, run_estimate


class PrivateSubspace:
    """Differentially private top-k principal subspace (sample and aggregate by default).

    Parameters mirror the CLI: ``rank``, ``epsilon``/``delta`` or ``rho`` (+ ``delta``),
    ``method``, ``subsets``, ``ref_points``, ``assign``, ``unit_column``, ``columns``,
    ``seed`` (public randomness only), ``scale`` (public radius / cell side),
    ``row_norm``/``center`` (gauss, gap-perturb), ``outliers``/``tolerance`` (exact),
    ``boost``/``boost_alpha`` (SS21 Alg. 3 around any method), and ``client`` (a
    ``distributed.Client``; without one, NumPy input runs in-process and Dask input on
    Dask's default scheduler).

    Attributes after ``fit``: ``components_`` (k×d, orthonormal rows, like scikit-learn
    PCA), ``basis_`` (d×k), ``manifest_`` (what was spent and released).
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
        """Estimate from a NumPy/Dask array, a pandas/Dask DataFrame, or a Parquet path/URI."""
        config = self._config()
        if isinstance(X, str):

            def open_dataset(client):
                return parquet_dataset(
                    X, config.columns, config.unit_column, config.storage_options, client
                )
        else:
            if self.unit_column is not None:
                raise ValueError("unit_column needs a Parquet input that holds that column")

            def open_dataset(client):
                return array_dataset(X, config.columns)

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
        return self

    def transform(self, X: Any) -> Any:
        """Project rows onto the private basis (post-processing: no extra privacy cost)."""
        if not hasattr(self, "components_"):
            raise AttributeError("call fit before transform")
        if hasattr(X, "to_dask_array"):
            X = X.to_dask_array(lengths=True)
        if hasattr(X, "columns"):
            X = X.to_numpy()
        return X @ self.basis_ if hasattr(X, "dask") else np.asarray(X) @ self.basis_

    def fit_transform(self, X: Any, y: None = None) -> Any:
        return self.fit(X).transform(X)
