"""Rows read once and held between the covariance family's passes (engine/row_cache.py, #16).

The cached run must release exactly what re-reading releases (same private noise seed; with
rows held the centred bound and the Gram share a pass, and the noisy Gram, rounded to its noise
grid, comes out the same bytes as the separate passes' here: tests/engine/test_fused_gram.py), read
each partition once where re-reading reads it once per pass, turn itself off where the rows
do not fit the workers' memory limits (and at user level), and work on a real cluster.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from row_helpers import CountingLoader

from dpsub_dist.engine import row_cache
from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.sources import array_dataset, parquet_dataset
from dpsub_dist.job import EstimateConfig, run_estimate

NOISE_SEED = 0xCAC4E
"""Private noise seed planted for these tests only, so cached and uncached runs compare."""


def _rows() -> np.ndarray:
    rng = np.random.default_rng(3)
    basis = np.linalg.qr(rng.standard_normal((6, 2)))[0]
    return (
        rng.standard_normal((30_000, 2)) @ basis.T * 3
        + 1.0
        + 0.05 * rng.standard_normal((30_000, 6))
    )


def _run(options: dict[str, Any], client: Any = None, open_dataset=None):
    config = EstimateConfig(rank=2, epsilon=2.0, delta=1e-6, seed=5, **options)
    return run_estimate(config, open_dataset, client, noise_seed=NOISE_SEED)


def _released(result) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    manifest = result.manifest
    return result.basis.tobytes(), manifest["release"], manifest["parameters"]


@pytest.mark.parametrize(
    ("options", "passes"),
    [
        ({"method": "gauss"}, 4),  # the default: raw norms, mean, centred norms, Gram
        ({"method": "gauss", "row_norm": 4.0}, 2),  # public bound: mean, Gram
        ({"method": "gap-perturb"}, 6),  # + the explained variance's bound and sums
    ],
)
def test_cached_rows_release_the_same_values_and_are_read_once(
    monkeypatch, options: dict[str, Any], passes: int
) -> None:
    data = array_dataset(_rows())
    parts = len(data.parts)
    results, reads = {}, {}
    for cached in (True, False):
        if not cached:  # every pass reads, as before the cache (and without fusing passes)
            monkeypatch.setattr(row_cache, "IN_PROCESS_CACHE_BYTES", 0)
            monkeypatch.setattr("dpsub_dist.methods._norm_pass.LEVEL_SUMS_BYTES", 0)
            monkeypatch.setattr("dpsub_dist.methods._norm_pass.LEVEL_GRAMS_BYTES", 0)
        loader = CountingLoader(data.loader)
        counted = dataclasses.replace(data, loader=loader)
        results[cached] = _released(_run(options, open_dataset=lambda _e, c=counted: c))
        reads[cached] = loader.calls[0]
    assert results[True] == results[False]  # bit for bit: basis, release, parameters
    assert reads == {True: parts, False: passes * parts}


def test_rows_fit_reads_the_workers_memory_limits(dask_client) -> None:
    executor = Executor(dask_client)
    assert executor.memory_limit == 2 * 4 * 2**30  # the session cluster: 2 workers × 4 GiB
    fits = int(row_cache.CACHE_FRACTION * executor.memory_limit) // 8
    assert row_cache.rows_fit(fits, 1, executor)
    assert not row_cache.rows_fit(fits + 1, 1, executor)
    assert row_cache.rows_fit(2**27, 1, Executor())  # in process: up to 1 GiB
    assert not row_cache.rows_fit(2**27 + 1, 1, Executor())


def test_cache_is_off_where_rows_do_not_fit_and_at_user_level(dask_client, small_dataset):
    executor = Executor(dask_client)
    dataset = parquet_dataset(str(small_dataset.path), None, None, None, executor)
    held = row_cache.cache_rows(dataset, executor, user_level=False)
    assert held.loader is row_cache.held_rows and len(held.parts) == len(dataset.parts)
    assert row_cache.cache_rows(dataset, executor, user_level=True) is dataset
    need = dataset.n_rows * dataset.dim * 8
    fits = row_cache.cache_rows(dataset, _Limited(dask_client, limit=4 * need), user_level=False)
    assert fits.loader is row_cache.held_rows
    for limit in (4 * need - 8, 0):  # one row short; a cluster without limits
        too_small = _Limited(dask_client, limit=limit)
        assert row_cache.cache_rows(dataset, too_small, user_level=False) is dataset


@dataclasses.dataclass(frozen=True)
class _Limited(Executor):
    """The cluster's Executor, with smaller memory limits (as a smaller cluster reports)."""

    limit: int = 0

    @property
    def memory_limit(self) -> int | None:
        return self.limit


def test_cached_and_fused_runs_on_a_cluster_release_what_rereading_does(
    dask_client, small_dataset, monkeypatch
) -> None:
    def open_dataset(executor: Executor):
        return parquet_dataset(str(small_dataset.path), None, None, None, executor)

    cached = _run({"method": "gauss"}, dask_client, open_dataset)
    monkeypatch.setattr(row_cache, "CACHE_FRACTION", 0.0)
    fused = _run({"method": "gauss"}, dask_client, open_dataset)  # level sums held there
    monkeypatch.setattr("dpsub_dist.methods._norm_pass.LEVEL_SUMS_BYTES", 0)
    monkeypatch.setattr("dpsub_dist.methods._norm_pass.LEVEL_GRAMS_BYTES", 0)
    reread = _run({"method": "gauss"}, dask_client, open_dataset)
    assert _released(cached) == _released(reread)
    assert fused.timings["fused_gram"] and not reread.timings["fused_gram"]
    assert fused.manifest["parameters"] == reread.manifest["parameters"]
    np.testing.assert_allclose(fused.basis, reread.basis, atol=1e-6)
    mean = (fused.manifest["release"]["mean"], reread.manifest["release"]["mean"])
    np.testing.assert_allclose(*mean, rtol=1e-9)


@pytest.mark.parametrize("method", ["gauss", "friendly"])
def test_fused_mean_releases_what_the_separate_passes_do(monkeypatch, method: str) -> None:
    """Rows not held: the mean's bound and clipped sum take one read (norm_pass.LevelSums).
    Same counts, so the same released bound; the sum differs by rounding only."""
    from dpsub_dist.methods import _norm_pass as norm_pass

    monkeypatch.setattr(row_cache, "IN_PROCESS_CACHE_BYTES", 0)  # every pass reads
    data = array_dataset(_rows())
    results, reads = {}, {}
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(norm_pass, "LEVEL_SUMS_BYTES", 0)
        loader = CountingLoader(data.loader)
        counted = dataclasses.replace(data, loader=loader)
        results[fused] = _run({"method": method}, open_dataset=lambda _e, c=counted: c)
        reads[fused] = loader.calls[0] // len(data.parts)
    fused, apart = (results[k].manifest for k in (True, False))
    assert fused["parameters"] == apart["parameters"]  # the same released bounds
    assert fused["parameters"]["mean_row_norm"] == apart["parameters"]["mean_row_norm"]
    np.testing.assert_allclose(fused["release"]["mean"], apart["release"]["mean"], rtol=1e-9)
    np.testing.assert_allclose(results[True].basis, results[False].basis, atol=1e-6)
    assert reads[True] == reads[False] - 1  # one read of the rows fewer


def test_level_sums_give_the_clipped_sum_at_every_grid_value() -> None:
    from dpsub_dist.engine.gram import clip_rows
    from dpsub_dist.methods._norm_pass import partition_level_sums
    from dpsub_dist.privacy.norm_bound import GRID, norm_counts

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((3000, 5)) * np.exp(3 * rng.standard_normal((3000, 1)))
    rows[0], rows[1] = 0.0, 2.0**45  # a zero row; a row past the grid's top (overflow bin)
    sums = partition_level_sums(lambda part: (part, None), rows)
    np.testing.assert_array_equal(sums.counts, norm_counts(rows))
    for bound in GRID:
        expected = clip_rows(rows, bound).sum(axis=0)
        np.testing.assert_allclose(sums.clipped_sum(bound), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="not a value of the norm grid"):
        sums.clipped_sum(3.0)
