"""``--method power``: the private bound's pass fused into the first iteration (issue #17,
norm_pass.LevelProducts).

Per bin of the public norm grid the workers keep Σ x(xᵀV₀) and Σ x(xᵀV₀)/‖x‖²; the first
product at any grid value must equal the separate pass's ``Xᵀ(w ⊙ XV₀)`` (float tolerance:
rows are added by bin), the counts must be the separate counting pass's exactly (rows on a
bin's edge, float32 and centred rows included), and a run must release the same bound and
basis as the separate passes with one read of the rows fewer, the per-bin sums never
reaching the driver.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from row_helpers import CountingLoader, assert_close, heavy_rows

from dpsub_dist.engine import row_cache
from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.gram import clip_weights
from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import row_norms
from dpsub_dist.methods import _centring as centring
from dpsub_dist.methods import _norm_pass as norm_pass
from dpsub_dist.methods import power as runner
from dpsub_dist.methods._norm_pass import (
    LevelProducts,
    fuse_level_products,
    level_products,
)
from dpsub_dist.params import DEFAULT_ITERATIONS, DEFAULT_OVERSAMPLE
from dpsub_dist.privacy import noisy_power as power
from dpsub_dist.privacy.norm_bound import GRID, norm_counts

NOISE_SEED = 0x6A40
"""Private noise seed planted for these tests only, so fused and separate runs compare."""


def _separate(rows: np.ndarray, basis: np.ndarray, bound: float) -> np.ndarray:
    """The iteration pass's product of the rows clipped to ``bound`` (float64)."""
    used, weights = clip_weights(rows, bound)
    return runner._product(used, basis, weights)


def test_level_products_give_the_first_product_at_every_grid_value() -> None:
    rows = heavy_rows(dim=7)
    basis = power.start_basis(rows.shape[1], 3, seed=4)
    levels = level_products(rows, row_norms(rows), basis)
    np.testing.assert_array_equal(levels.counts, norm_counts(rows))  # the counting pass's
    assert levels.counts[-1] == 1  # the row past 2^40
    np.testing.assert_array_equal(levels.levels, np.flatnonzero(levels.counts))  # filled only
    assert levels.raw.shape == levels.unit.shape == (len(levels.levels), 7, 3)
    assert len(levels.levels) < len(GRID)
    for bound in GRID:
        assert_close(levels.clipped_product(bound), _separate(rows, basis, bound))
    with pytest.raises(ValueError, match="not a value of the norm grid"):
        levels.clipped_product(3.0)


def test_a_row_on_a_bin_edge_is_kept_whole_at_that_bound() -> None:
    """A row of norm exactly grid_j is in bin j (norm ≤ bound at bound grid_j): at that bound
    and below it is scaled by m/bound², above it by m/‖x‖² — as clip_weights weighs it."""
    basis = np.eye(3)[:, :2]
    for j in (20, 21):
        row = np.zeros((1, 3))
        row[0, 1] = GRID[j]
        levels = level_products(row, row_norms(row), basis)
        assert levels.levels.tolist() == [j]
        for bound in GRID[j - 1 : j + 2]:
            assert_close(levels.clipped_product(bound), _separate(row, basis, bound), 1e-15)


def test_partitions_with_other_bins_and_empty_ones_add_up_to_the_whole() -> None:
    rows = heavy_rows(dim=7)
    basis = power.start_basis(rows.shape[1], 3, seed=4)
    chunks = [rows[:1000], rows[:0], rows[1000:1700] * 1e3, rows[1700:], rows[:0]]
    parts = [level_products(c, row_norms(c), basis) for c in chunks]
    total = sum(parts[1:], parts[0])
    assert isinstance(total, LevelProducts)
    assert parts[1].levels.size == 0 and parts[1].raw.shape == (0, 7, 3)
    everything = np.vstack(chunks)
    np.testing.assert_array_equal(total.counts, norm_counts(everything))
    for bound in GRID[::5]:
        assert_close(total.clipped_product(bound), _separate(everything, basis, bound))


class _NativeReads:
    """An array source's loader, counting its native (float32) reads."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.reads = inner, 0

    def __call__(self, part: Any) -> tuple[np.ndarray, Any]:
        return self.inner(part)

    def native(self, part: Any) -> tuple[np.ndarray, Any]:
        self.reads += 1
        return self.inner.native(part)


@pytest.mark.parametrize("centred", [False, True])
def test_float32_rows_are_binned_as_the_counting_pass_bins_them(centred: bool) -> None:
    """The counting pass takes the norms of the loader's float64 rows; the fused pass reads
    the float32 rows (as an iteration does) and must give the same norms bit for bit, rows
    exactly on bin edges included."""
    rows = heavy_rows(500, 9).astype(np.float32)
    rows[7] = 0.0
    rows[7, 3] = np.float32(GRID[22])  # an even exponent: exact in float32
    source = _NativeReads(array_dataset(rows).loader)
    loader: Any = source
    if centred:
        loader = centring.CentredLoader(source, np.full(9, 1e-3))
        rows[8] = loader.mean
        rows[8, 0] += np.float32(GRID[18])
    native, norms = runner._counted_rows(loader, rows)
    assert native.dtype == np.float32
    assert source.reads == 1  # the partition is read once, centred or not
    np.testing.assert_array_equal(norms, row_norms(loader(rows)[0]))
    np.testing.assert_array_equal(
        norm_counts(loader(rows)[0]),
        np.bincount(norm_pass.norm_bins(norms), minlength=len(GRID) + 1),
    )


def test_fusion_is_decided_by_public_facts_only(monkeypatch) -> None:
    """D and k′ alone bound the per-bin products (every bin filled); held rows keep the
    separate pass (it costs no read there)."""
    assert fuse_level_products(100_000, 11)  # issue #17's run, default k′
    assert not fuse_level_products(100_000, 14)
    worst = 2 * (len(GRID) + 1) * 100_000 * 11 * 8
    assert worst <= norm_pass.LEVEL_PRODUCTS_BYTES < worst * 14 / 11
    data = array_dataset(np.ones((10, 4)))
    held = runner.RowPasses(data, data.loader, None, Executor(), False)
    assert held.cached and not runner.fuse_bound(held, 3)
    monkeypatch.setattr(row_cache, "IN_PROCESS_CACHE_BYTES", 0)
    read = runner.RowPasses(data, data.loader, None, Executor(), False)
    assert not read.cached and runner.fuse_bound(read, 3)


def _rows() -> np.ndarray:
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((24_000, 12)) * np.arange(1, 13) ** -1.0
    rows *= np.exp(0.6 * rng.standard_normal((24_000, 1)))  # norms over several bins
    rows[:2000] = 0.0  # norm exactly 1.0 = GRID[20]: on a bin's edge
    rows[np.arange(2000), np.arange(2000) % 12] = np.where(np.arange(2000) % 2, 1.0, -1.0)
    return rows


def _with_empty_parts(data: Any) -> Any:
    """Two empty partitions, first and last (of two dtypes: equal ones would be one task)."""
    parts = [data.parts[0][:0], *data.parts, data.parts[0][:0].astype(np.float32)]
    offsets = [0, *data.offsets, data.n_rows]
    return dataclasses.replace(data, parts=parts, offsets=offsets)


def _run_both(monkeypatch, data: Any, options: dict[str, Any], client: Any = None):
    results, reads = {}, {}
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(norm_pass, "LEVEL_PRODUCTS_BYTES", 0)
        loader = CountingLoader(data.loader)
        counted = dataclasses.replace(data, loader=loader)
        config = EstimateConfig(
            rank=2, method="power", **{"epsilon": 2.0, "delta": 1e-6, "seed": 5, **options}
        )
        results[fused] = run_estimate(
            config, lambda _e, c=counted: c, client, noise_seed=NOISE_SEED
        )
        reads[fused] = loader.calls[0]
    return results[True], results[False], reads


@pytest.mark.parametrize(
    "options",
    [
        {},  # the default: uncentred, the raw rows' bound fused with the first iteration
        {"center": True},  # the centred rows' bound fused (the mean's passes as before)
        {"rho": 0.5, "epsilon": None, "iterations": 3},
    ],
)
def test_fused_run_releases_what_the_separate_passes_do_with_one_read_fewer(
    monkeypatch, options: dict[str, Any]
) -> None:
    monkeypatch.setattr(row_cache, "IN_PROCESS_CACHE_BYTES", 0)  # every pass reads
    data = _with_empty_parts(array_dataset(_rows()))
    fused, apart, reads = _run_both(monkeypatch, data, options)
    assert fused.timings["fused_bound"] and not apart.timings["fused_bound"]
    assert fused.manifest["parameters"]["row_norm"] == apart.manifest["parameters"]["row_norm"]
    # the same bound, budget and noise; each noisy product is on its noise grid
    assert fused.manifest["parameters"] == apart.manifest["parameters"]
    assert fused.manifest["privacy"] == apart.manifest["privacy"]
    assert fused.manifest["release"] == apart.manifest["release"]
    assert np.abs(fused.basis - apart.basis).max() <= 1e-10
    steps = options.get("iterations", DEFAULT_ITERATIONS)
    assert fused.manifest["parameters"]["passes"] == steps  # C·V products, as before
    parts = len(data.parts)
    before = reads[False] - (steps + 1) * parts  # the mean's reads when centred, else 0
    assert before == (parts if options.get("center") else 0)  # the mean: one fused read
    assert reads[True] == before + steps * parts  # T reads instead of T + 1


def test_float32_source_releases_the_same_bound_and_a_basis_within_sgemm_rounding(
    monkeypatch,
) -> None:
    """float32 rows: the same counts (hence bound); the products differ by SGEMM rounding
    (rows added by bin), ≲ 10⁻⁷ relative, so the basis agrees to ~10⁻⁶."""
    monkeypatch.setattr(row_cache, "IN_PROCESS_CACHE_BYTES", 0)
    data = array_dataset(_rows().astype(np.float32))
    fused, apart, _ = _run_both(monkeypatch, data, {})
    assert fused.manifest["parameters"] == apart.manifest["parameters"]
    assert np.abs(fused.basis - apart.basis).max() <= 1e-5


def test_only_counts_and_one_product_per_pass_reach_the_driver(monkeypatch, dask_client) -> None:
    """On a cluster: what the driver receives in the fused pass is the 102 counts and the one
    D × k′ product at the released bound, never a per-bin sum; the release is the in-process
    one's."""
    monkeypatch.setattr(row_cache, "CACHE_FRACTION", 0.0)
    rows = _rows()
    data = array_dataset(rows)
    width = 2 + DEFAULT_OVERSAMPLE
    received: list[Any] = []
    real = Executor.run

    def run(self, *args, **kwargs):
        results = real(self, *args, **kwargs)
        received.extend(results)
        return results

    monkeypatch.setattr(Executor, "run", run)
    config = EstimateConfig(rank=2, method="power", epsilon=2.0, delta=1e-6, seed=5)
    result = run_estimate(config, lambda _e: data, dask_client, noise_seed=NOISE_SEED)
    assert result.timings["fused_bound"]
    assert not any(isinstance(r, norm_pass.LevelGrams) for r in received)
    sizes = sorted(np.asarray(r).nbytes for r in received)
    assert sizes == [(len(GRID) + 1) * 8] + [rows.shape[1] * width * 8] * 6
    monkeypatch.setattr(row_cache, "IN_PROCESS_CACHE_BYTES", 0)
    local = run_estimate(config, lambda _e: data, None, noise_seed=NOISE_SEED)
    assert local.timings["fused_bound"]
    assert np.abs(result.basis - local.basis).max() <= 1e-10


class _Capture:
    """An executor that records the graph of what it is asked to compute (never runs it)."""

    client = None
    memory_limit = None

    def __init__(self) -> None:
        self.graph: dict[Any, Any] = {}

    def compute(self, root: Any, tasks: list[Any], label: str, progress: bool) -> Any:
        for task in [root, *tasks]:
            self.graph.update(dict(task.__dask_graph__()))
        return np.zeros(len(GRID) + 1)

    def persist(self, tasks: list[Any]) -> list[Any]:
        self.compute(tasks[0], tasks, "", False)
        return tasks


def test_the_loader_is_one_key_of_a_pass_not_a_copy_in_every_task() -> None:
    """Wide array sources carry D column names in their loader: passed to every task, Dask
    walked them once per task on the driver (≈ 0.26 s per task at D = 10⁵, docs/power.md "Where
    the workers wait") and shipped them in every task. Each pass's graph holds them once."""
    import pickle

    rows = np.ones((40, 3000))
    data = array_dataset(rows, [f"feature_{j}_marker" for j in range(3000)])
    data = dataclasses.replace(data, parts=[rows[:10], rows[10:25], rows[25:]])
    marker = b"feature_2999_marker"
    basis = power.start_basis(3000, 2, seed=1)

    def holding(graph: dict[Any, Any]) -> int:
        return sum(marker in pickle.dumps(value) for value in graph.values())

    executor = _Capture()
    passes = runner.RowPasses(data, data.loader, 1.0, executor, False)  # type: ignore[arg-type]
    passes.cached = False
    passes(basis)
    assert holding(executor.graph) == 1
    executor = _Capture()
    norm_pass.compute_norm_counts(data.parts, data.loader, executor, False)  # type: ignore[arg-type]
    assert holding(executor.graph) == 1
    executor = _Capture()
    passes = runner.RowPasses(data, data.loader, None, executor, False)  # type: ignore[arg-type]
    passes.fused_first(basis, lambda counts: 1.0)
    assert holding(executor.graph) == 1
