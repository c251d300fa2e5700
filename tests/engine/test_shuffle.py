"""The engine's row shuffle: each local step sees exactly its subset's rows, in order."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pytest

from bench.passes import looped_partition_grams
from dpsub_dist.engine import subsets
from dpsub_dist.engine.subsets import (
    SubsetPlan,
    bucket_range,
    compute_subset_summaries,
    shipping_rows,
    split_partition,
)
from dpsub_dist.methods._sample_aggregate import ProjectedReferenceStep

SIZES = [700, 0, 1300, 37, 1963]  # unequal partitions and an empty one
DIM = 5


@dataclass(frozen=True)
class DigestStep:
    """A local step whose summary pins the exact bytes, order, shape and dtype it saw."""

    def __call__(self, rows: np.ndarray, subset: int) -> np.ndarray:
        assert rows.dtype == np.float64 and rows.ndim == 2 and rows.shape[1] == DIM
        digest = hashlib.sha256(np.ascontiguousarray(rows).tobytes()).digest()
        return np.array([subset, rows.shape[0], *np.frombuffer(digest, np.uint8)], float)


def unit_loader(part: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(part[0], dtype=np.float64), part[1]


def partitions(rows: np.ndarray, units: np.ndarray):
    ends = np.cumsum(SIZES)
    offsets = [int(e) for e in ends - SIZES]
    parts = [(rows[o:e], units[o:e]) for o, e in zip(offsets, ends, strict=True)]
    return parts, offsets


def reference(rows, units, plan, step) -> np.ndarray:
    """The plain definition: subset j's rows in position order, as float64."""
    subset = plan.subset_of(np.arange(rows.shape[0], dtype=np.int64), units)
    return np.stack(
        [step(np.asarray(rows[subset == j], dtype=np.float64), j) for j in range(plan.subsets)]
    )


def data(float32_valued: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    rows = rng.standard_normal((sum(SIZES), DIM)) @ rng.standard_normal((DIM, DIM))
    if float32_valued:
        rows = rows.astype(np.float32).astype(np.float64)
    units = rng.integers(0, 30, rows.shape[0])  # 30 users: most of 50 subsets stay empty
    return rows, units


PLANS = [
    dict(assign="random", user_level=False),
    dict(assign="contiguous", user_level=False),
    dict(assign="random", user_level=True),
]


@pytest.fixture(params=["joined", "gathered"])
def build(request, monkeypatch):
    """Force either way of building a bucket's blocks (chosen by mean slice size)."""
    monkeypatch.setattr(subsets, "SLICE_MIN_VALUES", 0 if request.param == "joined" else 10**9)
    return request.param


@pytest.mark.parametrize("float32_valued", [True, False])
@pytest.mark.parametrize("how", PLANS, ids=["random", "contiguous", "users"])
@pytest.mark.parametrize("buckets", [1, 3, 7, 40, 50])
def test_shuffle_gives_every_subset_its_rows_in_position_order(how, buckets, float32_valued, build):
    rows, units = data(float32_valued)
    plan = SubsetPlan(subsets=50, n_rows=rows.shape[0], seed=3, buckets=buckets, **how)
    parts, offsets = partitions(rows, units)
    for step in (DigestStep(), ProjectedReferenceStep(rank=2, dim=DIM, ref_points=4, seed=3)):
        got = compute_subset_summaries(parts, offsets, unit_loader, plan, step)
        assert np.array_equal(got, reference(rows, units, plan, step))
    if how["user_level"]:  # at most 30 subsets have rows: some buckets hold only empty ones
        assert np.count_nonzero(np.bincount(plan.subset_of(None, units), minlength=50)) <= 30


def test_partitions_in_any_order_are_joined_in_position_order(build):
    rows, units = data(True)
    plan = SubsetPlan(subsets=20, n_rows=rows.shape[0], seed=5, buckets=3)
    parts, offsets = partitions(rows, units)
    step = DigestStep()
    got = compute_subset_summaries(parts[::-1], offsets[::-1], unit_loader, plan, step)
    assert np.array_equal(got, reference(rows, units, plan, step))


def test_shards_ship_float32_only_when_exact(build):
    rows, units = data(True)
    plan = SubsetPlan(subsets=20, n_rows=rows.shape[0], seed=5, buckets=3)
    exact = split_partition(plan, unit_loader, (rows[:700], units[:700]), 0)
    assert [s.rows.dtype for s in exact] == [np.float32] * 3
    rows[5, 2] = 0.1  # not a float32 value: this partition ships float64
    inexact = split_partition(plan, unit_loader, (rows[:700], units[:700]), 0)
    assert [s.rows.dtype for s in inexact] == [np.float64] * 3
    subset = plan.subset_of(np.arange(700), None)
    changed = int(subset[5]) * plan.buckets // plan.subsets  # the bucket holding row 5
    for b, (a, c) in enumerate(zip(exact, inexact, strict=True)):
        assert np.array_equal(a.rows, c.rows) == (b != changed)
    # each shard: its bucket's subsets, ascending, with their row counts
    for b, shard in enumerate(inexact):
        lo, hi = bucket_range(plan, b)
        assert shard.subsets.tolist() == sorted(set(subset[(subset >= lo) & (subset < hi)]))
        assert shard.counts.tolist() == [np.count_nonzero(subset == j) for j in shard.subsets]
        assert shard.rows.shape == (shard.counts.sum(), DIM) and shard.offset == 0
    # a bucket mixing float32 and float64 shards still sees the exact float64 values
    parts, offsets = partitions(rows, units)
    step = DigestStep()
    got = compute_subset_summaries(parts, offsets, unit_loader, plan, step)
    assert np.array_equal(got, reference(rows, units, plan, step))


@pytest.mark.filterwarnings("error")
def test_float32_shipping_is_refused_for_values_it_would_round():
    rows = np.random.default_rng(1).standard_normal((3000, 7)).astype(np.float32).astype(float)
    assert shipping_rows(rows).dtype == np.float32 and np.array_equal(shipping_rows(rows), rows)
    tiny = float(np.finfo(np.float32).smallest_subnormal)
    for value in (0.1, 1e300, -1e300, 1e-320, tiny / 2, 2.0**-1000):
        changed = rows.copy()
        changed[2999, 6] = value  # in the last block checked
        assert shipping_rows(changed) is changed
    for value in (-0.0, tiny, float(np.finfo(np.float32).max), 2.0**-140):
        changed = rows.copy()
        changed[5, 0] = value
        assert np.array_equal(shipping_rows(changed).astype(float), changed)
    assert shipping_rows(changed).dtype == np.float32
    assert np.signbit(shipping_rows(np.array([[-0.0]]))[0, 0])
    assert shipping_rows(np.empty((0, 7))).shape == (0, 7)


def test_bucket_ranges_cover_every_subset_once():
    for t, b in [(1, 1), (7, 3), (50, 50), (3906, 8), (20_000, 13)]:
        plan = SubsetPlan(subsets=t, n_rows=10 * t, seed=0, buckets=b)
        ranges = [bucket_range(plan, i) for i in range(b)]
        assert ranges[0][0] == 0 and ranges[-1][1] == t
        assert all(lo < hi for lo, hi in ranges)
        assert all(r[1] == s[0] for r, s in zip(ranges, ranges[1:], strict=False))
        j = np.arange(t)
        for i, (lo, hi) in enumerate(ranges):
            assert np.array_equal(j[(j * b) // t == i], np.arange(lo, hi))


def test_workers_count_a_shards_rows():
    """Dask sizes results to decide spilling: a shard must weigh what its rows weigh."""
    from dask.sizeof import sizeof

    shard = subsets.Shard(0, np.arange(3), np.array([1, 1, 998]), np.ones((1000, 10)))
    assert sizeof(shard) >= shard.rows.nbytes


def _reference_grams(plan, rows):
    """Per subset: rows in position order, scaled to a largest |x| in [½, 1), then XᵀX."""
    subset = plan.subset_of(np.arange(rows.shape[0]), None)
    grams = np.zeros((plan.subsets, rows.shape[1], rows.shape[1]))
    exponents = np.full(plan.subsets, subsets.EMPTY_EXPONENT)
    for j in range(plan.subsets):
        block = rows[subset == j]
        if block.any():
            exponents[j] = np.frexp(np.max(np.abs(block)))[1]
            scaled = np.ldexp(block, -exponents[j])
            grams[j] = scaled.T @ scaled
    return grams, np.bincount(subset, minlength=plan.subsets), exponents


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e200, 1e-200, 1e-310])
def test_partition_grams_equal_a_per_subset_reference(scale):
    """Raw products scaled afterwards equal rows scaled first, at any magnitude."""
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((3000, 7)) * scale
    if scale == 1.0:
        rows[rng.random(3000) < 0.3] *= 1e250  # some subsets beyond the raw route's range
    rows[:200] = 0.0
    plan = subsets.SubsetPlan(subsets=50, n_rows=3000, seed=2)
    grams, counts, exponents = subsets.partition_grams(plan, lambda part: (rows, None), 0, 0)
    expected = _reference_grams(plan, rows)
    np.testing.assert_array_equal(counts, expected[1])
    np.testing.assert_array_equal(exponents, expected[2])
    np.testing.assert_allclose(grams, expected[0], rtol=1e-13, atol=0)


def awkward_rows(rows: int, dim: int, seed: int) -> np.ndarray:
    """Rows of mixed magnitudes: some 10³⁰⁰, some 10⁻³⁰⁰ (beyond SAFE_EXPONENT either way),
    some 10⁻³¹⁰ (subnormal), some zero, the rest about 1."""
    rng = np.random.default_rng(seed)
    out = rng.standard_normal((rows, dim))
    scale = rng.choice([1.0, 1e300, 1e-300, 1e-310, 0.0], size=rows, p=[0.6, 0.1, 0.1, 0.1, 0.1])
    return out * scale[:, None]


@pytest.mark.parametrize("stack_floats", [24, subsets.STACK_FLOATS])
@pytest.mark.parametrize("right_shape", [None, "shared", "stacked"])
def test_stacked_products_equal_the_per_subset_loop(monkeypatch, stack_floats, right_shape):
    """The batched products (subsets stacked largest first, zero-padded) equal the per-subset
    loop's on awkward subsets: empty ones, single rows, all-zero ones, extreme magnitudes
    (the SAFE_EXPONENT path), and a stack too small for even one subset's rows (24 floats)."""
    monkeypatch.setattr(subsets, "STACK_FLOATS", stack_floats)
    dim, width, plan = 6, 3, SubsetPlan(subsets=200, n_rows=700, seed=4)
    rows = awkward_rows(plan.n_rows, dim, seed=5)
    rng = np.random.default_rng(6)
    right = {
        None: None,
        "shared": rng.standard_normal((dim, width)),
        "stacked": np.linalg.qr(rng.standard_normal((plan.subsets, dim, width)))[0],
    }[right_shape]
    loader = lambda part: (rows[part], None)  # noqa: E731
    got = subsets.partition_grams(plan, loader, slice(100, 400), 100, right)
    want = looped_partition_grams(plan, loader, slice(100, 400), 100, right)
    counts = want[1]
    assert {0, 1} <= set(counts.tolist()) and counts.max() >= 4  # empty, one-row, larger
    assert (want[2] >= subsets.SAFE_EXPONENT).any() and (want[2] <= -subsets.SAFE_EXPONENT).any()
    assert ((counts > 0) & (want[2] == subsets.EMPTY_EXPONENT)).any()  # a subset of zero rows
    np.testing.assert_array_equal(got[1], counts)
    np.testing.assert_array_equal(got[2], want[2])
    largest = np.abs(want[0]).max(axis=(1, 2), keepdims=True)
    assert np.all(np.abs(got[0] - want[0]) <= 1e-12 * largest)
    assert np.isfinite(got[0]).all() and (largest[want[2] != subsets.EMPTY_EXPONENT] > 0).all()
    if right is None:
        np.testing.assert_array_equal(got[0], got[0].transpose(0, 2, 1))
