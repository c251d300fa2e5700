"""The covariance family's private bound and Gram in one read (issue #16, norm_pass.LevelGrams).

Per bin of the public norm grid the workers keep Σ yyᵀ and Σ yyᵀ/‖y‖²; the Gram at any grid
value must equal the separate pass's Gram of the clipped rows (float tolerance: rows are
added by bin), the counts must be the separate counting pass's exactly (rows on a bin's edge
included), and a default run must release what the separate passes release, with one read of
the rows fewer, where rows are re-read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from row_helpers import CountingLoader, assert_close, heavy_rows

from dpsub_dist.engine import row_cache
from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.gram import clip_rows, gram_of
from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.methods import _norm_pass as norm_pass
from dpsub_dist.methods._norm_pass import (
    LevelGrams,
    compute_level_grams,
    fuse_level_grams,
    gather_clipped_gram,
    partition_level_grams,
)
from dpsub_dist.methods.gauss import fused_gram
from dpsub_dist.privacy.norm_bound import GRID, norm_counts

NOISE_SEED = 0x6A3F
"""Private noise seed planted for these tests only, so fused and separate runs compare."""


def _own(part: Any) -> tuple[np.ndarray, None]:
    return part, None


def _assert_gram_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert_close(actual, expected)
    np.testing.assert_array_equal(actual, actual.T)  # symmetric, as gram_of's


@pytest.mark.parametrize("chunk_bytes", [norm_pass.LEVEL_GRAMS_CHUNK_BYTES, 8 * 5 * 7])
def test_level_grams_give_the_clipped_gram_at_every_grid_value(
    monkeypatch, chunk_bytes: int
) -> None:
    """In one block of rows, and in blocks of 7 rows (bins split across blocks)."""
    monkeypatch.setattr(norm_pass, "LEVEL_GRAMS_CHUNK_BYTES", chunk_bytes)
    rows = heavy_rows()
    grams = partition_level_grams(_own, rows)
    np.testing.assert_array_equal(grams.counts, norm_counts(rows))  # the counting pass's
    assert grams.counts[-1] == 1  # the row past 2^40
    np.testing.assert_array_equal(grams.levels, np.flatnonzero(grams.counts))  # non-empty only
    assert grams.raw.shape == grams.unit.shape == (len(grams.levels), 5, 5)
    assert len(grams.levels) < len(GRID)  # empty bins are not stored
    for bound in GRID:
        _assert_gram_close(grams.clipped_gram(bound), gram_of(clip_rows(rows, bound)))
    with pytest.raises(ValueError, match="not a value of the norm grid"):
        grams.clipped_gram(3.0)


def test_rows_on_a_bin_edge_count_below_it_and_clip_to_themselves() -> None:
    """A row of norm exactly grid_j is in bin j (norm ≤ bound at bound grid_j): counted as the
    counting pass counts it, and at that bound kept whole, scaled by 1/bound."""
    for j in (20, 21):
        row = np.zeros((1, 3))
        row[0, 1] = GRID[j]
        grams = partition_level_grams(_own, row)
        assert grams.levels.tolist() == [j] and grams.counts[j] == 1
        np.testing.assert_array_equal(grams.counts, norm_counts(row))
        at_edge = grams.clipped_gram(GRID[j])
        assert at_edge[1, 1] == pytest.approx(1.0, rel=1e-15)
        assert grams.clipped_gram(GRID[j - 1])[1, 1] == pytest.approx(1.0, rel=1e-15)
        assert grams.clipped_gram(GRID[j + 1])[1, 1] == pytest.approx(0.5, rel=1e-15)


def test_partitions_with_other_bins_and_empty_ones_add_up_to_the_whole() -> None:
    rows = heavy_rows()
    chunks = [rows[:1000], rows[1000:1000], rows[1000:1700] * 1e3, rows[1700:], rows[:0]]
    total = sum(
        (partition_level_grams(_own, c) for c in chunks[1:]), partition_level_grams(_own, chunks[0])
    )
    assert isinstance(total, LevelGrams)
    empty = partition_level_grams(_own, rows[:0])
    assert empty.levels.size == 0 and empty.raw.shape == (0, 5, 5) and not empty.counts.any()
    everything = np.vstack(chunks)
    np.testing.assert_array_equal(total.counts, norm_counts(everything))
    for bound in GRID[::7]:
        _assert_gram_close(total.clipped_gram(bound), gram_of(clip_rows(everything, bound)))


def test_the_pass_on_a_cluster_sends_the_counts_then_the_gram_at_one_bound(dask_client) -> None:
    rows = heavy_rows(4000, 6)
    parts = [rows[:1500], rows[1500:1500], rows[1500:]]
    executor = Executor(dask_client)
    counts, held = compute_level_grams(parts, _own, executor, False)
    np.testing.assert_array_equal(counts, norm_counts(rows))
    bound = float(GRID[24])
    _assert_gram_close(gather_clipped_gram(held, bound, executor), gram_of(clip_rows(rows, bound)))


def test_fusion_is_decided_by_public_facts_only() -> None:
    """D alone decides the fusion's memory (the worst case, every bin filled); held rows
    fuse too (a round of tasks saved)."""
    assert fuse_level_grams(202) and not fuse_level_grams(203)
    worst = 2 * (len(GRID) + 1) * 202 * 202 * 8
    assert worst <= norm_pass.LEVEL_GRAMS_BYTES
    data = array_dataset(np.ones((10, 4)))
    assert fused_gram(data)
    held = row_cache.cache_rows(data, Executor(), user_level=False)
    assert held is not data and fused_gram(held)
    assert not fused_gram(array_dataset(np.ones((10, 203))))


def _rows() -> np.ndarray:
    rng = np.random.default_rng(3)
    basis = np.linalg.qr(rng.standard_normal((6, 2)))[0]
    noise = 0.05 * rng.standard_normal((30_000, 6))
    tail = np.exp(rng.standard_normal((30_000, 1)))  # norms over several bins
    return (rng.standard_normal((30_000, 2)) @ basis.T * 3 + 1.0 + noise) * tail


@pytest.mark.parametrize(
    "options",
    [
        {"method": "gauss"},  # the default: centred, the centred rows' bound and Gram fused
        {"method": "gauss", "center": False},  # the raw rows' bound and Gram fused
        {"method": "gap-perturb"},
        {"method": "gauss", "rho": 0.5, "epsilon": None},
    ],
)
def test_fused_run_releases_what_the_separate_passes_do_with_one_read_fewer(
    monkeypatch, options: dict[str, Any]
) -> None:
    monkeypatch.setattr(row_cache, "IN_PROCESS_CACHE_BYTES", 0)  # every pass reads
    data = array_dataset(_rows())
    results, reads = {}, {}
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(norm_pass, "LEVEL_GRAMS_BYTES", 0)
        loader = CountingLoader(data.loader)
        counted = dataclasses.replace(data, loader=loader)
        config = EstimateConfig(rank=2, **{"epsilon": 2.0, "delta": 1e-6, "seed": 5, **options})
        results[fused] = run_estimate(config, lambda _e, c=counted: c, None, noise_seed=NOISE_SEED)
        reads[fused] = loader.calls[0] // len(data.parts)
    fused, apart = (results[k] for k in (True, False))
    assert fused.timings["fused_gram"] and not apart.timings["fused_gram"]
    # the same bounds and budget; the noisy Gram is on its noise grid: the same release
    assert fused.manifest["parameters"] == apart.manifest["parameters"]
    assert fused.manifest["privacy"] == apart.manifest["privacy"]
    assert fused.manifest["release"] == apart.manifest["release"]
    np.testing.assert_array_equal(fused.basis, apart.basis)
    assert reads[True] == reads[False] - 1  # one read of the rows fewer


def test_default_route_reads_the_rows_twice_where_they_are_not_held(monkeypatch) -> None:
    """Raw rows: norm counts + clipped sums (the mean); centred rows: norm counts + per-bin
    Grams. Before issue #16 the same run read them four times."""
    monkeypatch.setattr(row_cache, "IN_PROCESS_CACHE_BYTES", 0)
    data = array_dataset(_rows())
    loader = CountingLoader(data.loader)
    counted = dataclasses.replace(data, loader=loader)
    config = EstimateConfig(rank=2, epsilon=2.0, delta=1e-6, seed=5)  # --method auto
    result = run_estimate(config, lambda _e: counted, None, noise_seed=NOISE_SEED)
    assert result.manifest["method"] == "gauss" and result.timings["fused_gram"]
    assert loader.calls[0] == 2 * len(data.parts)


@pytest.mark.parametrize("dim", [1, 3, 4, 5, 11])
def test_gram_is_symmetrised_in_place_across_strip_edges(monkeypatch, dim: int) -> None:
    """``gram_of`` fills the lower triangle from the upper in strips of SYMMETRIC_BLOCK
    columns: exactly symmetric, XᵀX's values, on both sides of every strip edge."""
    from dpsub_dist.engine import gram

    monkeypatch.setattr(gram, "SYMMETRIC_BLOCK", 4)
    rows = np.random.default_rng(dim).standard_normal((30, dim))
    result = gram_of(rows)
    np.testing.assert_array_equal(result, result.T)
    np.testing.assert_allclose(result, rows.T @ rows, rtol=1e-12, atol=1e-12)
