"""Private standardisation (``--standardize``): calibration of its three steps, the scales it
finds on the columns real tables hold, the basis it gives on a mixed-unit table, a huge finite
value, and its doors (CLI in a subprocess, job file, API, refusals)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dpsub_shim import dpsub

from dpsub_dist import PrivateSubspace
from dpsub_dist.errors import InputError, NoStableSubspace
from dpsub_dist.jobfile import parse_job
from dpsub_dist.methods import _standardize as standardize
from dpsub_dist.privacy import column_scales as private
from dpsub_dist.privacy.accountant import ApproxDP, gaussian_sigma

UNITS = np.array([1e4, 3.0, 0.01, 250.0, 7.0])
OFFSETS = np.array([5e4, -10.0, 0.2, 1000.0, 0.0])
CORRELATION = np.array(
    [
        [1.0, 0.8, 0.2, 0.0, 0.0],
        [0.8, 1.0, 0.1, 0.0, 0.0],
        [0.2, 0.1, 1.0, 0.6, 0.0],
        [0.0, 0.0, 0.6, 1.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 1.0],
    ]
)


ROWS = 1_000_000
"""Rows of the basis tests. σ̂'s noise falls like 1/n: at ε = 1 on 200,000 rows the worst
column's σ̂ was 7 % off in the median run and past 20 % in 1 of 100, enough for the
uncorrelated column (eigenvalue 1.0) to overtake the second component (1.53) in 3 of 100
runs, the documented small-table cost (docs/centring.md). On 10⁶ rows, 200 fresh-noise
runs: worst location error ≤ 0.010 spreads, worst σ̂ ≤ 2.0 % off, basis error ≤ 0.021."""


def mixed_units(n: int, seed: int = 0) -> pd.DataFrame:
    """Correlated columns in units 10⁶ apart, with offsets far from 0."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, 5)) @ np.linalg.cholesky(CORRELATION).T
    return pd.DataFrame(z * UNITS + OFFSETS, columns=["income", "temp", "ratio", "height", "x"])


def correlation_pca(frame: pd.DataFrame, k: int) -> np.ndarray:
    _, vectors = np.linalg.eigh(np.corrcoef(frame.to_numpy(), rowvar=False))
    return vectors[:, ::-1][:, :k]


def subspace_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a @ a.T - b @ b.T, 2))


# ----------------------------------------------------------------------------- calibration


def test_one_replaced_row_moves_the_stacked_histograms_by_at_most_sqrt_2d() -> None:
    """Replace-one moves each column's histogram in ≤ 2 bins by 1: ‖ΔH‖₂ ≤ √(2D), reached
    when every column's value changes bin."""
    rng = np.random.default_rng(1)
    dim = 6
    rows = rng.standard_normal((50, dim)) * 10.0 ** rng.integers(-3, 4, dim)
    base = private.column_histograms(rows)
    worst = 0.0
    for value in (0.0, 1e-30, -3.0, 7e5, -(2.0**45), 1.0):
        for i in range(0, 50, 7):
            other = rows.copy()
            other[i] = value
            worst = max(worst, float(np.linalg.norm(private.column_histograms(other) - base)))
    assert worst <= private.sensitivity(dim) + 1e-12
    assert math.isclose(worst, math.sqrt(2 * dim))  # reached: the bound is the sensitivity


def test_one_replaced_row_moves_the_moment_sums_by_at_most_sqrt_2d() -> None:
    """(Σz/(2c), Σz²/c²) moves by ≤ 1 per coordinate pair's entries: the grid maximum of one
    pair's squared move is ≤ 2 (it is 1.29), and random far rows stay within √(2D)."""
    for clip in private.CLIPS:
        assert 1.25 < private.moments_sensitivity_bound(clip) <= 2.0  # ≤ 2, and not vacuous
    rng = np.random.default_rng(2)
    dim = 4
    centre, spread = rng.standard_normal(dim), rng.uniform(0.1, 2.0, dim)
    rows = rng.standard_normal((30, dim))
    for clip in private.CLIPS:
        base = private.clipped_moments(rows, centre, spread, clip)
        for far in (1e9, -1e9, 0.0, 3.0):
            other = rows.copy()
            other[0] = far
            moved = np.linalg.norm(private.clipped_moments(other, centre, spread, clip) - base)
            assert moved <= private.sensitivity(dim) + 1e-12


def test_each_step_draws_at_the_sigma_its_grant_buys_for_sqrt_2d() -> None:
    grant = ApproxDP(0.5, 1e-7)
    for build in (private.histogram_mechanism, private.moments_mechanism):
        mech = build(grant, 9)
        assert mech.sensitivity == math.sqrt(18)
        assert mech.sigma == gaussian_sigma(grant, math.sqrt(18))
        assert mech.cost().epsilon == 0.5 and mech.cost().delta <= 1e-7 * (1 + 1e-9)


def test_the_last_rounds_clip_is_the_widest_its_public_noise_allows() -> None:
    """c²σ/n ≤ 0.02: wide on a tall table (less bias on heavy tails), 3 on a small one; a
    function of n and σ only (public)."""
    assert private.clips(10**6, 100.0) == (8.0, 8.0)
    assert private.clips(100_000, 100.0) == (8.0, 4.0)  # 6²·100/10⁵ = 0.036 > 0.02
    assert private.clips(1_000, 100.0) == (8.0, 3.0)  # none fits


def test_released_location_and_scale_are_finite_and_positive_for_any_noise() -> None:
    """σ̂ > 0 and finite however the noise falls (the floor), on an empty table's noise."""
    mech = private.moments_mechanism(ApproxDP(0.01, 1e-9), 3)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        hist = private.histogram_mechanism(ApproxDP(0.01, 1e-9), 3)
        ranges = private.private_ranges(np.zeros((3, private.BINS)), 1, hist, rng)
        assert np.all(np.isfinite(ranges.centre)) and np.all(ranges.spread > 0)
        out = private.private_location_scale(np.zeros(6), 1, ranges, 8.0, mech, rng)
        assert np.all(np.isfinite(out.location)) and np.all(out.scale > 0)
        assert np.all(np.isfinite(out.scale))


def test_the_refine_round_resolves_a_spread_far_below_the_grid_resolution() -> None:
    """A column 2 ± 0.01 lies in one grid bin (width 0.18): the first round's variance of z is
    below its noise, the second, around the refined spread, finds σ within 15 %."""
    rng = np.random.default_rng(4)
    rows = np.column_stack([2 + 0.01 * rng.standard_normal(10**6), rng.standard_normal(10**6)])
    grant = ApproxDP(0.2, 1e-7)
    ranges = private.private_ranges(
        private.column_histograms(rows), 10**6, private.histogram_mechanism(grant, 2), rng
    )
    assert ranges.spread[0] > 0.1  # the bin's width, 10× the spread
    mech = private.moments_mechanism(grant, 2)
    first_clip, second_clip = private.CLIPS
    sums = private.clipped_moments(rows, ranges.centre, ranges.spread, first_clip)
    first = private.private_location_scale(sums, 10**6, ranges, first_clip, mech, rng)
    around = first.refined
    sums = private.clipped_moments(rows, around.centre, around.spread, second_clip)
    second = private.private_location_scale(sums, 10**6, around, second_clip, mech, rng)
    assert abs(second.scale[0] / 0.01 - 1) < 0.15
    assert abs(second.scale[1] - 1) < 0.05 and abs(second.location[0] - 2) < 1e-3


def test_the_coarse_centre_and_spread_are_post_processing_of_the_noisy_counts() -> None:
    """Step 1 reads nothing but its noisy histogram: the same noisy counts give the same
    ranges, whatever the rows were (the rng is the only other input, for the noise)."""
    rng = np.random.default_rng(7)
    rows = np.column_stack([rng.lognormal(5, 1, 5000), rng.integers(0, 2, 5000)])
    mech = private.histogram_mechanism(ApproxDP(1.0, 1e-7), 2)
    first = private.private_ranges(
        private.column_histograms(rows), 5000, mech, np.random.default_rng(3)
    )
    again = private.private_ranges(
        private.column_histograms(rows), 5000, mech, np.random.default_rng(3)
    )
    np.testing.assert_array_equal(first.counts, again.counts)
    np.testing.assert_array_equal(first.spread, again.spread)
    shuffled = private.column_histograms(rows[::-1])
    other = private.private_ranges(shuffled, 5000, mech, np.random.default_rng(3))
    np.testing.assert_array_equal(first.centre, other.centre)


def release_scales(rows: np.ndarray, epsilon: float, rng: np.random.Generator) -> tuple:
    """The three steps as a run at ``epsilon`` (δ = 10⁻⁶) gives them: (location, scale)."""
    n, dim = rows.shape
    shares = [standardize.SHARES[step][0] for step in standardize.SHARES]
    grant = lambda share: ApproxDP(epsilon * share, 1e-6 * share)  # noqa: E731
    histogram = private.histogram_mechanism(grant(shares[0]), dim)
    around = private.private_ranges(private.column_histograms(rows), n, histogram, rng)
    clips = private.clips(n, private.moments_mechanism(grant(shares[-1]), dim).sigma)
    for share, clip in zip(shares[1:], clips, strict=True):
        sums = private.clipped_moments(rows, around.centre, around.spread, clip)
        mech = private.moments_mechanism(grant(share), dim)
        released = private.private_location_scale(sums, n, around, clip, mech, rng)
        around = released.refined
    return released.location, released.scale


def real_columns(n: int, seed: int) -> np.ndarray:
    """The columns --standardize once collapsed or blew up on (issue #37), 6 of them: money
    40 % exact zeros and lognormal dollars otherwise (sd ≈ 1,150), a 0/1 flag (p = 0.3), a
    rarer flag (p = 0.08), integer codes 1…50, years ≈ 1961 ± 12, and zero-inflated counts."""
    rng = np.random.default_rng(seed)
    return np.column_stack(
        [
            np.where(rng.random(n) < 0.4, 0.0, rng.lognormal(6.0, 1.0, n)),
            (rng.random(n) < 0.3).astype(float),
            (rng.random(n) < 0.08).astype(float),
            rng.integers(1, 51, n).astype(float),
            1961.0 + rng.integers(-20, 21, n),
            rng.negative_binomial(0.5, 0.3, n).astype(float),
        ]
    )


SCALE_RUNS = 40
"""Fresh-noise runs of the scale test. Over 200 runs at ε = 1 the released σ̂/σ per column
(money, flag, rare flag, codes, years, counts) lay in [0.40, 0.71], [0.84, 1.43],
[0.60, 2.49], [0.86, 1.16], [2.5, 10.9] and [0.54, 0.96]: the bounds below are 4× the worst
of those on each side, the target's [0.1, 10] on every column but the years, whose spread the
rounds cannot resolve below the grid's 19 % bin at 1961 (2.5–11σ, docs/centring.md)."""


def test_scales_of_real_kinds_of_column_stay_within_a_factor_of_their_sd() -> None:
    """20,000 × 6 at ε = 1 (the issue's table: the money column's scale was 4·10⁻⁶ × its sd):
    no column's scale collapses or blows up in any run ([0.1, 10] × its sd; the years
    [0.6, 44]), the median run's flag and codes within 10 % and the money's within [0.3, 1],
    and the median location within a spread."""
    rows = real_columns(20_000, 0)
    sd, mean = rows.std(axis=0), rows.mean(axis=0)
    ratios, offsets = [], []
    for _ in range(SCALE_RUNS):
        location, scale = release_scales(rows, 1.0, np.random.default_rng())
        ratios.append(scale / sd)
        offsets.append(np.abs(location - mean) / sd)
    ratios, offsets = np.array(ratios), np.array(offsets)
    others = np.delete(ratios, 4, axis=1)
    assert np.all((others > 0.1) & (others < 10)), (ratios.min(axis=0), ratios.max(axis=0))
    assert np.all((ratios[:, 4] > 0.6) & (ratios[:, 4] < 44)), ratios[:, 4]
    median = np.median(ratios, axis=0)
    assert np.all(np.abs(median[[1, 3]] - 1) < 0.1) and 0.3 < median[0] < 1.0, median
    assert np.all(np.median(offsets, axis=0) < 1.0), np.median(offsets, axis=0)


def test_a_constant_column_gets_a_finite_positive_scale_and_values_near_zero() -> None:
    """sd 0: the scale is floored (finite, > 0) and the standardised column stays within a
    few units of 0, so it adds nothing to the basis."""
    rng = np.random.default_rng(2)
    rows = np.column_stack([np.full(20_000, 3.0), rng.standard_normal(20_000)])
    for _ in range(20):
        location, scale = release_scales(rows, 1.0, np.random.default_rng())
        assert np.all(np.isfinite(scale)) and np.all(scale > 0)
        z = private.standardise(rows[:5], location, scale)
        assert np.all(np.abs(z[:, 0]) < 2.0), (location, scale)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_standardised_values_are_finite_and_clipped_for_any_finite_value(dtype) -> None:
    """Privacy review 4, item 1: 10³⁰⁸ divided by a released scale was inf. The loader clips
    x to location ± BOUND·scale before dividing: finite, within ±BOUND, no warning."""
    big = float(np.finfo(dtype).max)
    rows = np.array([[big, 1.0], [-big, 2.0], [3e306 if dtype is np.float64 else 3e37, 1e-6]])
    location, scale = np.array([1.0, 0.0]), np.array([1e-6, 1e-6])
    with np.errstate(all="raise"):  # an overflow or invalid value would raise here
        z = private.standardise(rows.astype(dtype), location, scale)
    assert z.dtype == dtype and np.all(np.isfinite(z))
    assert np.all(np.abs(z) <= private.BOUND)
    bound = [private.BOUND, -private.BOUND, private.BOUND]
    np.testing.assert_allclose(z[:, 0], bound, rtol=1e-2)  # float32 rounds 1 ± 1.6·10⁻⁵
    np.testing.assert_allclose(z[2, 1], 1.0, rtol=1e-6)  # an ordinary value: (x − μ)/σ
    assert z[1, 1] == private.BOUND  # 2/10⁻⁶ = 2·10⁶, clipped


# ----------------------------------------------------------------------------- the basis


def test_api_on_a_mixed_unit_dataframe_approaches_the_correlation_pca() -> None:
    """A pandas table in mixed units: with standardize=True the private basis is close to the
    non-private correlation-matrix PCA (and to the basis of z-scoring by hand); without it,
    the basis is the raw covariance's (the 10⁴-unit column), far from it."""
    frame = mixed_units(ROWS)
    truth = correlation_pca(frame, 2)
    est = PrivateSubspace(2, epsilon=1.0, standardize=True, seed=1).fit(frame)
    assert subspace_error(est.basis_, truth) < 0.08
    raw = PrivateSubspace(2, epsilon=1.0, seed=1).fit(frame)
    assert subspace_error(raw.basis_, truth) > 0.5
    # The released location and scale are the columns' within a few percent of their spread
    # (four times the worst of 200 runs, ROWS), and transform standardises with them.
    mean, std = frame.mean().to_numpy(), frame.std().to_numpy()
    assert np.all(np.abs(est.mean_ - mean) / std < 0.04), (est.mean_, mean)
    np.testing.assert_allclose(est.scale_, std, rtol=0.08)
    rows = frame.to_numpy()[:5]
    np.testing.assert_allclose(
        est.transform(frame.iloc[:5]), (rows - est.mean_) / est.scale_ @ est.basis_
    )
    steps = [s["step"] for s in est.manifest_["privacy"]["budget"]["steps"]]
    assert steps[:3] == ["standardize_histogram", "standardize_moments", "standardize_refine"]
    assert "mean" not in steps  # the location centres the rows: no second private mean


def test_power_and_friendly_take_it_too() -> None:
    frame = mixed_units(ROWS, seed=3)
    truth = correlation_pca(frame, 2)
    est = PrivateSubspace(2, epsilon=1.0, standardize=True, method="power", seed=1).fit(frame)
    assert subspace_error(est.basis_, truth) < 0.08
    manifest = est.manifest_
    assert manifest["parameters"]["standardize"] is True
    assert len(manifest["release"]["location"]) == 5 == len(manifest["release"]["scale"])


# ----------------------------------------------------------------------------- the doors


def test_cli_standardize_in_a_subprocess(tmp_path: Path) -> None:
    data = tmp_path / "mixed.parquet"
    frame = mixed_units(ROWS)
    frame.to_parquet(data)
    out = tmp_path / "run"
    proc = dpsub(
        "estimate", str(data), "--rank", "2", "--epsilon", "1", "--delta", "1e-6",
        "--standardize", "--out", str(out), "--workers", "1", "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parameters"]["standardize"] is True
    steps = {s["step"]: s for s in manifest["privacy"]["budget"]["steps"]}
    shares = manifest["parameters"]["budget_shares"]
    assert math.fsum(shares[s][0] for s in private_steps()) == pytest.approx(0.20)
    assert set(private_steps()) <= set(steps)
    basis = np.load(out / "basis.npy")
    assert subspace_error(basis, correlation_pca(frame, 2)) < 0.08
    assert "standardize" in dpsub("estimate", "--help").stdout


def huge_neighbours(tmp_path: Path) -> tuple[Path, Path]:
    """Two tables that differ in one row: an ordinary one, or 10³⁰⁸ (privacy review 4)."""
    frame = mixed_units(20_000, seed=5)
    ordinary = tmp_path / "ordinary.parquet"
    frame.to_parquet(ordinary)
    frame.iloc[7, 2] = 1e308  # the ratio column (sd 0.01): 10³⁰⁸/σ̂ overflowed
    huge = tmp_path / "huge.parquet"
    frame.to_parquet(huge)
    return ordinary, huge


@pytest.mark.parametrize("method", ["gauss", "power", "gap-perturb"])
def test_a_row_of_1e308_publishes_as_its_neighbour_does(tmp_path: Path, method: str) -> None:
    """The standardised loader turned 10³⁰⁸ into inf and the run crashed (exit 1 and a
    traceback) where the neighbour without that row published: now both publish (a basis,
    or gap-perturb's ⊥ on noise alone): a manifest, nothing on stderr, and the same stdout
    (its path aside) where both came out the same way (gap-perturb's ⊥ is drawn afresh)."""
    outcomes = []
    for data in huge_neighbours(tmp_path):
        out = tmp_path / f"run-{data.stem}"
        proc = dpsub(
            "estimate", str(data), "--rank", "2", "--epsilon", "1", "--delta", "1e-6",
            "--standardize", "--method", method, "--out", str(out), "--workers", "1",
            "--quiet",
        )  # fmt: skip
        assert proc.returncode in (0, 3), proc.stderr  # published: a basis or ⊥ (exit 3)
        files = sorted(p.name for p in out.iterdir())
        outcomes.append(
            (
                proc.returncode,
                proc.stdout.replace(str(out), "OUT"),
                proc.stderr,
                "manifest.json" in files,
            )
        )
    assert all(outcome[2:] == ("", True) for outcome in outcomes), outcomes
    if outcomes[0][0] == outcomes[1][0]:  # gap-perturb's ⊥ or basis is the noise's choice
        assert outcomes[0][1] == outcomes[1][1], outcomes


@pytest.mark.parametrize("method", ["gauss", "power", "gap-perturb"])
def test_huge_values_in_a_narrow_column_publish_in_process(method: str) -> None:
    """The review's other cases: 3·10³⁰⁶, and 10³⁰³ in a column of spread 10⁻⁶; each run
    publishes (a finite basis, or ⊥ as NoStableSubspace), as its neighbour without the row
    does; nothing else is raised."""
    rng = np.random.default_rng(9)
    rows = np.column_stack([rng.standard_normal(5_000), 1e-6 * rng.standard_normal(5_000)])
    for column, value in ((0, 3e306), (1, 1e303)):
        huge = rows.copy()
        huge[3, column] = value
        for table in (rows, huge):
            try:
                est = PrivateSubspace(1, epsilon=1.0, method=method, standardize=True).fit(table)
            except NoStableSubspace:  # gap-perturb's ⊥ on noise alone: published as ⊥
                continue
            assert est.manifest_["outcome"] == "ok" and np.all(np.isfinite(est.basis_))


def private_steps() -> tuple[str, ...]:
    return ("standardize_histogram", "standardize_moments", "standardize_refine")


def test_cli_refuses_standardize_at_user_level_before_reading(tmp_path: Path) -> None:
    data = tmp_path / "users.parquet"
    frame = mixed_units(1_000)
    frame["user"] = np.arange(1_000) % 50
    frame.to_parquet(data)
    out = tmp_path / "run"
    proc = dpsub(
        "estimate", str(data), "--rank", "2", "--epsilon", "1", "--delta", "1e-6",
        "--standardize", "--unit-column", "user", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--standardize is row level only" in proc.stderr
    assert not out.exists()


def test_cluster_command_has_no_standardize(tmp_path: Path) -> None:
    proc = dpsub(
        "cluster", "x.parquet", "--clusters", "2", "--rank", "1", "--epsilon", "1",
        "--standardize", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert proc.returncode == 2 and "--standardize" in proc.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"method": "exact"}, "standardize does not apply to method='exact'"),
        ({"method": "gauss", "boost": 2}, "standardize does not combine with boost"),
        ({"center": True}, "leave center unset"),
        ({"center": False}, "leave center unset"),
    ],
)
def test_api_refusals_are_public_and_spend_nothing(options, message) -> None:
    frame = mixed_units(100)
    with pytest.raises(InputError, match=message):
        PrivateSubspace(1, epsilon=1.0, standardize=True, **options).fit(frame)


def test_job_file_key(tmp_path: Path) -> None:
    document = {
        "dataset": "data/",
        "rank": 2,
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "output": str(tmp_path / "{run_id}"),
    }
    plain = parse_job(dict(document))
    job = parse_job({**document, "standardize": True})
    assert job.config().standardize is True and plain.config().standardize is False
    assert job.fingerprint() != plain.fingerprint()
    with pytest.raises(InputError, match="standardize must be true or false"):
        parse_job({**document, "standardize": "yes"})
