"""``dpsub evaluate``: how good is a released basis? Against a known truth, or on data.

Two checks, both for the operator who holds the data; neither is a release:

* **Against a truth** (``--truth``): ``‖Π̂ − Π‖``, the sine of the largest principal angle
  (:func:`dpsub_dist.linalg.subspace_error`). It is only meaningful for an orthonormal truth,
  so a truth whose columns are not orthonormal is refused (:func:`check_orthonormal`).
* **On data** (``--data``), for users without a truth: the *captured-variance ratio*
  ``tr(V̂ᵀ Σ V̂) / Σ_{i≤k} λᵢ(Σ)`` of the released basis ``V̂`` on the given rows, against the
  non-private top-k PCA of the same rows (Σ centred by default, as scikit-learn's and
  dask-ml's ``PCA``; uncentred: the second-moment matrix). 1.0 means the basis captures as
  much variance as exact PCA; unlike the subspace error it stays meaningful when the k-th
  eigengap is small (then many bases capture almost all of it).

The data check reads every row without any privacy: its numbers describe the data and
must not be published. It writes nothing (in particular, nothing into the run's folder).

How Σ is computed: each partition returns its row count, mean and centred scatter matrix
(D×D) on the worker; these are merged pairwise on the workers (Chan et al.'s update, stable
where ``XᵀX − n μμᵀ`` would cancel on columns with a large mean, such as a year), and only
the merged D×D reaches the driver, which takes its exact eigenvalues. Exact, one pass, and
for D up to a few thousand cheaper than dask-ml's ``PCA``, which factors the n×D array
itself (tall-skinny QR or randomized SVD) and needs it in memory as a Dask array
(measured in docs/real-data.md). For much wider data the D×D matrix would not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np

from dpsub_dist.engine.compute import IN_PROCESS, Executor, tree_sum
from dpsub_dist.engine.gram import gram_of
from dpsub_dist.errors import InputError
from dpsub_dist.linalg import subspace_error, top_eigenvectors

ORTHONORMAL_TOLERANCE = 1e-6
"""Largest ``‖UᵀU − I‖₂`` accepted for a truth (float32 bases reach ~1e-7)."""


def orthonormality_gap(basis: np.ndarray) -> float:
    """``‖UᵀU − I‖₂`` (largest over the bases of a K×d×q stack)."""
    stack = basis[None] if basis.ndim == 2 else basis
    gaps = [np.linalg.norm(u.T @ u - np.eye(u.shape[1]), 2) for u in np.asarray(stack, np.float64)]
    return float(max(gaps))


def check_orthonormal(truth: np.ndarray, what: str) -> None:
    """Refuse a truth whose columns are not orthonormal (the error would be meaningless)."""
    gap = orthonormality_gap(truth)
    if not gap <= ORTHONORMAL_TOLERANCE:  # also catches NaN
        raise InputError(
            f"{what} is not orthonormal (‖UᵀU − I‖ = {gap:.3g}, tolerance "
            f"{ORTHONORMAL_TOLERANCE:g}): orthonormalise its columns first, e.g. "
            "numpy.linalg.qr(U)[0], and save that"
        )


@dataclass(frozen=True)
class Moments:
    """Row count, mean and centred scatter ``Σ (x − μ)(x − μ)ᵀ`` of some rows."""

    rows: int
    mean: np.ndarray
    scatter: np.ndarray

    def __add__(self, other: Moments) -> Moments:
        """Merge two disjoint sets of rows (Chan, Golub & LeVeque's pairwise update)."""
        if not other.rows:
            return self
        if not self.rows:
            return other
        rows = self.rows + other.rows
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.rows / rows)
        scatter = self.scatter + other.scatter
        scatter += np.outer(delta, delta) * (self.rows * other.rows / rows)
        return Moments(rows, mean, scatter)

    def covariance(self, center: bool) -> np.ndarray:
        """Σ over n (centred, as PCA) or the second moment ``XᵀX / n`` (uncentred)."""
        cov = self.scatter / self.rows
        return cov if center else cov + np.outer(self.mean, self.mean)


def partition_moments(loader: Callable[[Any], tuple[np.ndarray, Any]], part: Any) -> Moments:
    """One partition's :class:`Moments` (runs on a worker; only D + D² numbers leave it)."""
    rows = np.asarray(loader(part)[0], dtype=np.float64)
    if not len(rows):
        d = rows.shape[1]
        return Moments(0, np.zeros(d), np.zeros((d, d)))
    mean = rows.mean(axis=0)
    return Moments(len(rows), mean, gram_of(rows - mean))


def merge_moments(a: Moments, b: Moments) -> Moments:
    """``a + b`` as a plain function for the reduction tree."""
    return a + b


def data_moments(dataset: Any, executor: Executor = IN_PROCESS, progress: bool = False) -> Moments:
    """The :class:`Moments` of every row of a Dataset, merged on the workers."""
    if not dataset.parts:
        raise InputError("the data has no rows: pass a dataset with at least one row")
    task = dask.delayed(partition_moments, pure=True)
    tasks = [task(dataset.loader, part) for part in dataset.parts]
    root = tree_sum(tasks, dask.delayed(merge_moments, pure=True), tasks)
    return executor.compute(root, tasks, "evaluate", progress)


@dataclass(frozen=True)
class DataCheck:
    """The captured-variance check of a basis on data (operator-only numbers)."""

    rows: int
    rank: int
    center: bool
    captured: float
    """``tr(V̂ᵀ Σ V̂)``: variance the basis captures."""
    best: float
    """``Σ_{i≤k} λᵢ``: what the non-private top-k PCA captures."""
    total: float
    """``tr Σ``: all the variance."""
    error_vs_pca: float
    """``‖Π̂ − Π_pca‖`` against the non-private top-k PCA of the same rows."""

    @property
    def ratio(self) -> float:
        """Captured-variance ratio (1.0: as good as exact PCA)."""
        return self.captured / self.best if self.best > 0 else float("nan")

    def line(self) -> str:
        """The ``key=value`` line ``dpsub evaluate --data`` prints."""
        return (
            f"captured_variance_ratio={self.ratio:.6f} "
            f"subspace_error_vs_pca={self.error_vs_pca:.6f} "
            f"explained_variance_fraction={self.captured / self.total:.6f} "
            f"pca_explained_variance_fraction={self.best / self.total:.6f}"
        )


def captured_variance(basis: np.ndarray, moments: Moments, center: bool = True) -> DataCheck:
    """Compare ``basis`` (d×k, orthonormal) with the exact top-k PCA of the rows' Σ."""
    cov = moments.covariance(center)
    if basis.ndim != 2 or basis.shape[0] != cov.shape[0]:
        raise InputError(
            f"the basis has shape {basis.shape} but the data has {cov.shape[0]} features: "
            "pass the data the run was fitted on (the same columns)"
        )
    k = basis.shape[1]
    values, vectors = top_eigenvectors(cov, k)
    captured = float(np.einsum("ij,ij->", basis, cov @ basis))
    return DataCheck(
        rows=moments.rows,
        rank=k,
        center=center,
        captured=captured,
        best=float(np.sum(values)),
        total=float(np.trace(cov)),
        error_vs_pca=subspace_error(basis, vectors),
    )
