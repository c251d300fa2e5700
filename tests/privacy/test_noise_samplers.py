"""Floating-point-safe noise (privacy/noise.py): exact samplers, the grid, the widening, the log.

Exact-probability checks use rational/mpmath references; statistical checks use fixed seeds
(deterministic) with tight p-value bounds. The consumer-level tests at the end run the CLI and
check that every published noisy number lies on the power-of-two grid of its noise scale.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpsub_dist.cli import main
from dpsub_dist.privacy import noise
from dpsub_dist.privacy.noise import Draw


def grid_of(scale: float) -> float:
    """The power of two g with scale/g ∈ [2^30, 2^31), computed here independently."""
    return 2.0 ** (math.floor(math.log2(scale)) - 30)


def on_grid(values, scale: float) -> bool:
    units = np.asarray(values, dtype=np.float64) / grid_of(scale)
    return bool(np.all(units == np.round(units)))


# --------------------------------------------------------------------------- exact pmfs


def _chi_square(samples: np.ndarray, pmf, support: int) -> float:
    """p-value of samples against pmf on −support..support (tails pooled into the end bins)."""
    ks = np.arange(-support, support + 1)
    probs = np.array([float(pmf(int(k))) for k in ks])
    probs[0] += 0.5 * (1 - probs.sum())
    probs[-1] = 1 - probs[:-1].sum()
    counts = np.bincount(np.clip(samples, -support, support) + support, minlength=ks.size)
    return float(stats.chisquare(counts, probs * samples.size).pvalue)


def _dlap_pmf(t: int):
    q = mpmath.exp(mpmath.mpf(-1) / t)
    return lambda k: (1 - q) / (1 + q) * q ** abs(k)


def _dgauss_pmf(sigma: int):
    mpmath.mp.dps = 40
    norm = mpmath.nsum(lambda k: mpmath.exp(-(k**2) / (2 * sigma**2)), [-mpmath.inf, mpmath.inf])
    return lambda k: mpmath.exp(-(mpmath.mpf(k) ** 2) / (2 * sigma**2)) / norm


@pytest.mark.parametrize("t", [1, 3, 10])
def test_discrete_laplace_matches_its_pmf(t: int) -> None:
    samples = noise._discrete_laplace(np.random.default_rng(t), t, 200_000)
    assert _chi_square(samples, _dlap_pmf(t), 6 * t) > 1e-4


@pytest.mark.parametrize("sigma", [1, 2, 7])
def test_discrete_gaussian_matches_its_pmf(sigma: int) -> None:
    samples = noise._discrete_gaussian(np.random.default_rng(sigma), sigma, 200_000)
    assert _chi_square(samples, _dgauss_pmf(sigma), 5 * sigma) > 1e-4
    # the same test rejects a sampler with a 10% larger σ (the test can fail)
    wider = np.round(samples * 1.1).astype(np.int64)
    assert _chi_square(wider, _dgauss_pmf(sigma), 5 * sigma) < 1e-6 or sigma == 1


def test_bernoulli_exp_samplers_hit_their_probabilities() -> None:
    rng = np.random.default_rng(0)
    n = 400_000
    for num, den in [(0, 5), (1, 3), (5, 5), (7, 11)]:
        hits = noise._bernoulli_exp_ratio(rng, np.full(n, num, dtype=np.int64), den).mean()
        assert stats.binomtest(int(hits * n), n, math.exp(-num / den)).pvalue > 1e-4
    for whole, frac in [(0, 2**61), (2, 2**61), (1, 0), (0, 2**62 - 1)]:
        w = np.full(n, whole, dtype=np.int64)
        f = np.full(n, frac, dtype=np.int64)
        hits = noise._bernoulli_exp_dyadic(rng, w, f).mean()
        assert stats.binomtest(int(hits * n), n, math.exp(-(whole + frac / 2**62))).pvalue > 1e-4


@pytest.mark.parametrize("sigma", [1, 3, 1000, 2**30 + 12345, 2**31 - 1, 2**33 + 7])
def test_acceptance_exponent_is_within_eta_of_the_exact_rational(sigma: int) -> None:
    """γ = (|y| − σ²/(σ+1))²/(2σ²) in exact rationals vs the fast path: |γ_f − γ| ≤ ETA."""
    rng = np.random.default_rng(sigma % 1000)
    y = rng.integers(-17 * sigma - 2, 17 * sigma + 3, 2000)
    whole, frac = noise._acceptance_exponent(y, sigma)
    for value, w, f in zip(y.tolist(), whole.tolist(), frac.tolist(), strict=True):
        exact = (abs(value) - Fraction(sigma * sigma, sigma + 1)) ** 2 / (2 * sigma * sigma)
        if exact >= noise.GAMMA_CAP:
            assert w == noise.GAMMA_CAP
            continue
        assert abs(w + Fraction(f, 2**62) - exact) <= noise.ETA + Fraction(1, 2**62)


# --------------------------------------------------------------------------- the grid, widening


@pytest.mark.parametrize("scale", [1e-9, 0.3, 1.0, 4 / 0.3, 2.0**40 / 3])
def test_every_output_lies_on_the_grid_of_its_scale(scale: float) -> None:
    rng = np.random.default_rng(1)
    assert noise.grid_step(scale) == grid_of(scale)
    value = np.random.default_rng(2).standard_normal(50) * scale * 10
    assert on_grid(noise.add_laplace(rng, value, scale, 1.0), scale)
    assert on_grid(noise.add_laplace(rng, float(value[0]), scale, 1.0), scale)
    assert on_grid(noise.add_gaussian(rng, value, scale, 1.0), scale)
    sym = noise.add_symmetric_gaussian(rng, np.outer(value[:6], value[:6]), scale, 1.0)
    assert on_grid(sym, scale) and np.array_equal(sym, sym.T)
    assert on_grid(noise.add_truncated_laplace(rng, float(value[0]), scale, 5 * scale, 2.0), scale)
    assert on_grid(noise.laplace_noise(rng, scale, 7), scale)


def test_widening_covers_the_rounding_and_nothing_more() -> None:
    """t·g ≥ scale·(Δ + g·c)/Δ > (t − 1)·g, and σ_g likewise with ⌈√c⌉ and 1 + size·2^-40."""
    for scale, sens, changed in [(1.0, 1.0, 1), (13.3, 4.0, 1), (0.37, 2.0, 2), (5.0, 0.01, 400)]:
        g, t = noise._laplace_units(scale, sens, changed)
        need = Fraction(scale) * (Fraction(sens) + Fraction(g) * changed) / Fraction(sens)
        assert t * Fraction(g) >= need > (t - 1) * Fraction(g)
        g, sigma_g = noise._gaussian_units(scale, sens, changed, 5 * changed)
        root = math.isqrt(changed - 1) + 1
        need = Fraction(scale) * (Fraction(sens) + Fraction(g) * root) / Fraction(sens)
        need *= 1 + Fraction(5 * changed, 2**40)
        assert sigma_g * Fraction(g) >= need > (sigma_g - 1) * Fraction(g)


def test_noise_does_not_depend_on_the_value() -> None:
    """Same private seed, different values: the noise (output − rounded value) is identical."""
    scale = 0.7
    g = grid_of(scale)
    for add in (noise.add_laplace, noise.add_gaussian):
        a, b = np.array([0.1, -3.0, 1e3]), np.array([7.0, 0.0, -2.5])
        out_a = add(np.random.default_rng(9), a, scale, 1.0)
        out_b = add(np.random.default_rng(9), b, scale, 1.0)
        np.testing.assert_array_equal(out_a - np.rint(a / g) * g, out_b - np.rint(b / g) * g)


def test_private_seed_reproduces_the_release() -> None:
    seed = noise.new_noise_seed()
    value = np.linspace(-1, 1, 1000)
    first = noise.add_gaussian(noise.noise_rng(seed), value, 0.5, 1.0)
    again = noise.add_gaussian(noise.noise_rng(seed), value, 0.5, 1.0)
    other = noise.add_gaussian(noise.noise_rng(seed + 1), value, 0.5, 1.0)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_scale_of_the_released_noise_is_the_callers() -> None:
    rng = np.random.default_rng(3)
    gauss = noise.add_gaussian(rng, np.zeros(200_000), 2.5, 1.0)
    assert gauss.std() == pytest.approx(2.5, rel=0.01)
    assert stats.kstest(gauss / 2.5, "norm").pvalue > 1e-4
    lap = noise.add_laplace(rng, np.zeros(200_000), 2.5, 1.0)
    assert stats.kstest(lap, "laplace", args=(0, 2.5)).pvalue > 1e-4


# --------------------------------------------------------------------------- tails, truncation


@pytest.mark.parametrize(
    "scale,sens,beta", [(4.0, 4.0, 1e-6), (13.3, 4.0, 0.5e-9), (2.0, 2.0, 0.3)]
)
def test_laplace_tail_is_exact_and_tight(scale: float, sens: float, beta: float) -> None:
    g, t = noise._laplace_units(scale, sens, 1)
    x = noise.laplace_tail(scale, sens, beta)
    m = round(x / g)
    assert m * g == x
    mpmath.mp.dps = 40
    q = mpmath.exp(mpmath.mpf(-1) / t)
    tail = lambda k: q**k / (1 + q)  # noqa: E731 - P(K ≥ k) of DLap(t), k ≥ 1
    assert tail(m) <= beta < tail(m - 2)
    assert x == pytest.approx(scale * math.log(1 / (2 * beta)), rel=1e-6)


def test_gaussian_tail_bounds_the_rounded_gaussian_tail() -> None:
    mpmath.mp.dps = 40
    for sigma, beta in [(1.0, 1e-6), (37.5, 1e-9), (2.0, 0.05)]:
        g, sigma_g = noise._gaussian_units(sigma, 1.0, 1, 1)
        m = noise.gaussian_tail(sigma, 1.0, beta) / g
        assert m == round(m)
        # P(K ≥ m) ≤ e^{1e-16}·P(N(0, σ_g²) ≥ m − ½) ≤ β, and not far above the quantile
        tail = mpmath.ncdf(-(mpmath.mpf(m) - 0.5) / sigma_g)
        assert tail * mpmath.exp(1e-16) <= beta
        assert mpmath.ncdf(-(mpmath.mpf(m) - 3) / sigma_g) > beta


def test_truncated_laplace_never_exceeds_its_bound() -> None:
    rng = np.random.default_rng(4)
    for scale, bound in [(1.0, 0.5), (2.0, 27.3), (1e-3, 1e-3)]:
        draws = [noise.add_truncated_laplace(rng, 0.0, scale, bound, 2.0) for _ in range(3000)]
        assert max(abs(d) for d in draws) <= bound
        pure = noise.truncated_laplace(rng, scale, bound, 50_000)
        assert np.abs(pure).max() <= bound


@pytest.mark.parametrize("epsilon,delta", [(0.1, 1e-9), (1.0, 1e-6), (5.0, 0.05)])
def test_truncated_laplace_grid_delta_is_within_its_stated_slack(epsilon, delta) -> None:
    scale, bound = noise.truncated_laplace_calibration(2.0, epsilon, delta)
    grid_delta = noise.truncated_laplace_grid_delta(scale, bound, 2.0)
    assert delta * (1 - 1e-6) <= grid_delta <= delta * (1 + 1e-6)


# --------------------------------------------------------------------------- the draw log


def test_draw_log_records_every_draw_with_the_callers_scale() -> None:
    rng = np.random.default_rng(0)
    with noise.draw_log() as outer:
        noise.add_laplace(rng, np.zeros(3), 2.0, 4.0)
        with noise.draw_log() as inner:
            noise.add_gaussian(rng, 1.0, 0.5, 1.0)
            noise.add_symmetric_gaussian(rng, np.zeros((2, 4, 4)), 0.25, 2.0)
        noise.add_truncated_laplace(rng, 0.0, 1.0, 3.0, 2.0)
        noise.laplace_noise(rng, 8.0, sensitivity=4.0)
    assert inner == [
        Draw("gaussian", 0.5, 1.0, 1),
        Draw("symmetric_gaussian", 0.25, 2.0, 20),  # 2 matrices × 10 upper-triangle entries
    ]
    assert outer == [
        Draw("laplace", 2.0, 4.0, 3),
        *inner,
        Draw("truncated_laplace", 1.0, 2.0, 1),
        Draw("laplace", 8.0, 4.0, 1),
    ]
    noise.add_laplace(rng, 0.0, 1.0, 1.0)
    assert len(outer) == 5  # closed logs record nothing more


def test_samplers_refuse_bad_scales() -> None:
    rng = np.random.default_rng(0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            noise.add_laplace(rng, 0.0, bad, 1.0)
        with pytest.raises(ValueError):
            noise.add_gaussian(rng, 0.0, 1.0, bad)
    with pytest.raises(ValueError, match="non-finite"):
        noise.add_gaussian(rng, math.nan, 1.0, 1.0)


# --------------------------------------------------------------------------- consumers


def _estimate(data: Path, out: Path, scheduler: str, *extra: str) -> int:
    return main(
        ["estimate", str(data), "--rank", "2", "--epsilon", "1", "--delta", "1e-6"]
        + ["--out", str(out), "--seed", "5", "--scheduler", scheduler, "--quiet", *extra]
    )


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_gap_perturb_publishes_gap_and_bound_on_the_grid(
    small_dataset, scheduler_address, tmp_path
) -> None:
    out = tmp_path / "gap"
    args = ("--method", "gap-perturb", "--row-norm", "3")
    assert _estimate(small_dataset.path, out, scheduler_address, *args) in (0, 3)
    release = _manifest(out)["release"]
    scale = release["gap_noise_scale"]
    assert on_grid(release["noisy_gap"], scale)
    assert on_grid(release["gap_lower_bound"], scale)


def test_gauss_center_publishes_the_mean_on_the_grid(
    small_dataset, scheduler_address, tmp_path
) -> None:
    out = tmp_path / "gauss"
    args = ("--method", "gauss", "--row-norm", "3", "--center")
    assert _estimate(small_dataset.path, out, scheduler_address, *args) == 0
    manifest = _manifest(out)
    release = manifest["release"]
    sigma = release["mean_noise_sigma"] * (3.0 / manifest["n_rows"])
    assert on_grid(release["mean"], sigma)


def test_friendly_publishes_the_noisy_core_weight_on_the_grid(
    small_dataset, scheduler_address, tmp_path
) -> None:
    out = tmp_path / "friendly"
    assert _estimate(small_dataset.path, out, scheduler_address, "--radius", "0.5") in (0, 3)
    manifest = _manifest(out)
    steps = {s["step"]: s for s in manifest["privacy"]["budget"]["steps"]}
    scale = 4.0 / steps["core_test"]["epsilon"]
    assert on_grid(manifest["release"]["noisy_core_weight"], scale)
    assert on_grid(manifest["release"]["core_weight_lower_bound"], scale)


def test_a_radius_below_the_precision_floor_is_refused_for_free(
    small_dataset, scheduler_address, tmp_path, capsys
) -> None:
    out = tmp_path / "tiny"
    assert _estimate(small_dataset.path, out, scheduler_address, "--radius", "1e-10") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "precision floor" in err[0] and "--radius ≥" in err[0]
    assert not out.exists()
