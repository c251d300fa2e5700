"""The one home of DP noise: generators and floating-point-safe samplers.

DP noise is drawn from a generator seeded from OS entropy (``secrets``), never
from a user-visible seed. A run may pass a *private* noise seed kept in the
ledger's run record so that resuming the same run id reproduces the same
release instead of spending budget twice (ALGORITHMS.md §0).

Every published noisy number comes out of :func:`add_laplace`, :func:`add_gaussian`,
:func:`add_symmetric_gaussian` or :func:`add_truncated_laplace` (or is a function of such
outputs and public values). Each returns ``g·(round(value/g) + K)``: the value rounded to a
power-of-two grid ``g`` (:func:`grid_step`, chosen from the caller's scale alone) plus an
integer ``K`` drawn by an *exact* sampler (Canonne, Kamath & Steinke 2020, "The discrete
Gaussian for differential privacy", Algorithms 1–3) from integer uniform draws of the numpy
``rng``. No output bit depends on the value beyond ``round(value/g)``, which closes the
floating-point channel of textbook samplers (Mironov, CCS 2012). OpenDP ships vetted samplers
of the same algorithms but draws from OS entropy only: they cannot be seeded, so a resumed
run could not reproduce its release from the private seed; we use our own implementation,
tested against exact pmfs (tests/privacy/test_noise_samplers.py).

Rounding the value moves each coordinate by ≤ g/2 on each neighbour, so the sensitivity of
the rounded value grows by ``g`` per changed coordinate (L1: ``g·c``, L2: ``g·√c``, ``c``
coordinates); the samplers widen the caller's scale by ``(Δ + rounding)/Δ`` so a scale
calibrated for ``Δ`` stays valid. The proof and the slack of each sampler are in the docstrings
below and in docs/privacy-noise.md.
"""

from __future__ import annotations

import contextlib
import functools
import math
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from scipy import special

GRID_BITS = 30
"""The grid step ``g`` is the power of two with ``scale/g ∈ [2^30, 2^31)``."""

CHUNK = 2**20
"""Noise values drawn per vectorised batch (bounds the samplers' temporaries)."""

GAMMA_CAP = 128
"""Discrete-Gaussian proposals with acceptance exponent γ ≥ this are rejected outright
(their acceptance probability is < e^-128); the tail mass this removes is in the slack."""

SLACK_WIDENING = 2.0**-40
"""Gaussian σ is widened by ``1 + size·2^-40`` to cover the sampler's float slack (below)."""

ETA = 3e-17
"""Bound on |γ_f − γ| + 2^-62 of the discrete-Gaussian acceptance step (80-bit arithmetic)."""

_EXTENDED = np.finfo(np.longdouble).nmant >= 63


# --------------------------------------------------------------------------- generators


def new_noise_seed() -> int:
    """A fresh 128-bit private seed from OS entropy."""
    return secrets.randbits(128)


def noise_rng(private_seed: int | None = None) -> np.random.Generator:
    """Generator for DP noise: OS entropy, or a private seed from the run record."""
    return np.random.default_rng(new_noise_seed() if private_seed is None else private_seed)


# --------------------------------------------------------------------------- the draw log


@dataclass(frozen=True)
class Draw:
    """One recorded noise draw (test seam: see :func:`draw_log`).

    ``scale`` is the scale/σ the caller asked for, before any internal widening;
    ``size`` the number of independent noise values drawn and ``shape`` their shape. What
    the innermost sampler ran with: ``grid`` (g), ``param`` (the integer DLap ``t`` or
    discrete-Gaussian ``σ_g``, in grid units), ``changed`` (the coordinates the caller
    said a neighbour moves), ``bound`` (truncated Laplace: the integer bound, else None);
    ``square_sum`` is Σ K² of the integer noise actually drawn and ``value`` the rounded
    value it was added to (``round(value/g)·g``), so a test can check the sampler's output
    and the data side of what was noised; ``integers`` are the draws K themselves (with a
    fixed private seed the same on every machine: integer arithmetic only, which
    tests/privacy/test_release_checksums.py pins). Equality compares the first four fields only.
    """

    kind: str
    scale: float
    sensitivity: float
    size: int
    shape: tuple[int, ...] = field(default=(), compare=False)
    grid: float = field(default=math.nan, compare=False)
    param: int = field(default=0, compare=False)
    changed: int = field(default=0, compare=False)
    bound: int | None = field(default=None, compare=False)
    square_sum: float = field(default=math.nan, compare=False)
    value: np.ndarray | None = field(default=None, compare=False, repr=False)
    integers: np.ndarray | None = field(default=None, compare=False, repr=False)


_LOGS: list[list[Draw]] = []
_LOGS_LOCK = threading.Lock()


@contextlib.contextmanager
def draw_log() -> Iterator[list[Draw]]:
    """Record every draw made by this module (any thread) while the block runs."""
    log: list[Draw] = []
    with _LOGS_LOCK:
        _LOGS.append(log)
    try:
        yield log
    finally:
        with _LOGS_LOCK:
            _LOGS.remove(log)


def _record(
    kind: str,
    scale: float,
    sensitivity: float,
    shape: tuple[int, ...],
    units: tuple[float, int, int, int | None],
    integers: np.ndarray,
    value=None,
) -> None:
    """Log one draw where a test listens: a no-op (one list check) otherwise.

    ``units`` is (g, integer parameter, coordinates changed, integer bound or None).
    """
    if not _LOGS:
        return
    grid, param, changed, bound = units
    rounded = None if value is None else np.rint(np.asarray(value, dtype=np.float64) / grid) * grid
    draw = Draw(
        kind,
        float(scale),
        float(sensitivity),
        int(integers.size),
        tuple(int(x) for x in shape),
        float(grid),
        int(param),
        int(changed),
        bound,
        float(np.sum(np.square(integers, dtype=np.float64))),
        rounded,
        integers,
    )
    with _LOGS_LOCK:
        for log in _LOGS:
            log.append(draw)


# --------------------------------------------------------------------------- the grid


def grid_step(scale: float) -> float:
    """The power of two ``g`` with ``scale/g ∈ [2^30, 2^31)``: the grid of a draw at ``scale``."""
    _check_scale("noise scale", scale)
    mantissa, exponent = math.frexp(scale)  # scale = mantissa·2^exponent, mantissa ∈ [½, 1)
    return math.ldexp(1.0, exponent - 1 - GRID_BITS)


def _check_scale(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.floating)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _ceil_sqrt(count: int) -> int:
    root = math.isqrt(count)
    return root if root * root == count else root + 1


@functools.lru_cache(maxsize=1024)
def _laplace_units(scale: float, sensitivity: float, changed: int) -> tuple[float, int]:
    """Grid ``g`` and integer DLap parameter ``t ≥ scale·(Δ + g·c)/(Δ·g)`` (exact rationals)."""
    _check_scale("Laplace scale", scale)
    _check_scale("sensitivity", sensitivity)
    g = grid_step(scale)
    delta, step = Fraction(sensitivity), Fraction(g)
    return g, math.ceil(Fraction(scale) * (delta + step * changed) / (delta * step))


@functools.lru_cache(maxsize=1024)
def _gaussian_units(sigma: float, sensitivity: float, changed: int, size: int) -> tuple[float, int]:
    """Grid ``g`` and integer σ_g ≥ σ·(Δ + g·⌈√c⌉)/Δ·(1 + size·2^-40)/g (exact rationals)."""
    _check_scale("Gaussian sigma", sigma)
    _check_scale("sensitivity", sensitivity)
    g = grid_step(sigma)
    delta, step = Fraction(sensitivity), Fraction(g)
    widened = Fraction(sigma) * (delta + step * _ceil_sqrt(changed)) / delta
    return g, math.ceil(widened * (1 + Fraction(size) * Fraction(SLACK_WIDENING)) / step)


def _on_grid(value, g: float, noise: np.ndarray):
    """``g·(round(value/g) + K)``: float or array like ``value`` (dyadic, so exact)."""
    arr = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("cannot add noise to a non-finite value")
    out = (np.rint(arr / g) + noise.reshape(arr.shape)) * g
    return float(out) if out.ndim == 0 else out


# --------------------------------------------------------------------------- exact Bernoullis


def _bernoulli_exp_ratio(rng: np.random.Generator, num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(−num/den)) for integers 0 ≤ num ≤ den (CKS Alg. 1, γ ≤ 1), exact.

    K = 1; while Bernoulli(γ/K): K += 1; return K odd. Bernoulli(γ/K) is ``U < num`` for
    ``U`` uniform on {0, …, den·K − 1}. All live draws share K, so each round is one call.
    """
    out = np.zeros(num.shape[0], dtype=bool)
    live = np.arange(num.shape[0])
    k = 1
    while live.size:
        hit = rng.integers(0, den * k, live.size) < num[live]
        out[live[~hit]] = k % 2 == 1
        live = live[hit]
        k += 1
    return out


def _bernoulli_exp_minus_one(rng: np.random.Generator, n: int) -> np.ndarray:
    """Bernoulli(1/e), exact (CKS Alg. 1 with γ = 1)."""
    return _bernoulli_exp_ratio(rng, np.ones(n, dtype=np.int64), 1)


def _bernoulli_exp_dyadic(rng: np.random.Generator, whole: np.ndarray, frac: np.ndarray):
    """Bernoulli(exp(−(whole + frac/2^62))), exact: ``whole`` Bernoulli(1/e) and CKS Alg. 1.

    Bernoulli(γ/K) for γ = frac/2^62 is Bernoulli(frac/2^62) and Bernoulli(1/K) together.
    """
    n = whole.shape[0]
    ok = np.ones(n, dtype=bool)
    for level in range(int(whole.max(initial=0))):
        live = np.flatnonzero(ok & (whole > level))
        ok[live] = _bernoulli_exp_minus_one(rng, live.size)
    odd = np.zeros(n, dtype=bool)
    live = np.flatnonzero(ok)
    k = 1
    while live.size:
        hit = (rng.integers(0, 2**62, live.size) < frac[live]) & (
            rng.integers(0, k, live.size) == 0
        )
        odd[live[~hit]] = k % 2 == 1
        live = live[hit]
        k += 1
    return ok & odd


# --------------------------------------------------------------------------- integer samplers


def _discrete_laplace(rng: np.random.Generator, t: int, n: int) -> np.ndarray:
    """n i.i.d. draws of P(K = k) ∝ exp(−|k|/t), integer t ≥ 1 (CKS Alg. 2), exact."""
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    while pending.size:
        m = pending.size
        u = rng.integers(0, t, m)
        keep = _bernoulli_exp_ratio(rng, u, t)
        v = np.zeros(m, dtype=np.int64)
        live = np.arange(m)
        while live.size:
            live = live[_bernoulli_exp_minus_one(rng, live.size)]
            v[live] += 1
        negative = rng.integers(0, 2, m) == 1
        keep &= ~(negative & (u == 0) & (v == 0))
        x = u + t * v
        out[pending[keep]] = np.where(negative, -x, x)[keep]
        pending = pending[~keep]
    return out


def _acceptance_exponent(y: np.ndarray, sigma: int) -> tuple[np.ndarray, np.ndarray]:
    """γ = (|y| − σ²/t)²/(2σ²), t = σ + 1, as (⌊γ⌋, ⌊frac(γ)·2^62⌋), with |γ_f − γ| ≤ ETA.

    σ²/t = σ − 1 + 1/(σ+1). With 64-bit-mantissa long doubles the relative error of γ is
    ≤ 2^-62, i.e. ≤ 2^-55 for γ < 128, as long as σ² < 2^64 is exact; else exact integer
    arithmetic (slow path).
    """
    if _EXTENDED and sigma < 2**32:
        shift = np.abs(y).astype(np.longdouble) - np.longdouble(sigma - 1)
        d = shift - np.longdouble(1) / np.longdouble(sigma + 1)
        gamma = d * d / (np.longdouble(2) * np.longdouble(sigma) * np.longdouble(sigma))
        gamma = np.minimum(gamma, np.longdouble(GAMMA_CAP))
        whole = np.floor(gamma)
        frac = np.floor((gamma - whole) * np.longdouble(2.0**62))
        return whole.astype(np.int64), frac.astype(np.int64)
    den = 2 * sigma * sigma * (sigma + 1) ** 2
    whole, frac = np.empty(y.size, np.int64), np.empty(y.size, np.int64)
    for i, value in enumerate(y.tolist()):
        num = ((abs(value) - sigma + 1) * (sigma + 1) - 1) ** 2
        q, r = divmod(num, den)
        whole[i], frac[i] = min(q, GAMMA_CAP), (r << 62) // den
    return whole, frac


def _discrete_gaussian(rng: np.random.Generator, sigma: int, n: int) -> np.ndarray:
    """n i.i.d. draws of P(K = k) ∝ exp(−k²/(2σ²)), integer σ ≥ 1 (CKS Alg. 3).

    Propose Y ~ DLap(t = σ + 1), accept with probability exp(−(|Y| − σ²/t)²/(2σ²)). The
    acceptance exponent is computed to within ETA and sampled exactly from that dyadic
    value; proposals with γ ≥ GAMMA_CAP (|Y| ≳ 17σ) are rejected. Hence the pmf is within
    a factor e^{±2·ETA} of the discrete Gaussian on |k| < 17σ and zero beyond, where the
    discrete Gaussian has mass < e^-140.
    """
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    while pending.size:
        y = _discrete_laplace(rng, sigma + 1, pending.size)
        whole, frac = _acceptance_exponent(y, sigma)
        keep = (whole < GAMMA_CAP) & _bernoulli_exp_dyadic(rng, whole, frac)
        out[pending[keep]] = y[keep]
        pending = pending[~keep]
    return out


def _chunked(sampler, rng: np.random.Generator, param: int, n: int) -> np.ndarray:
    """``sampler(rng, param, m)`` in batches of ≤ CHUNK values (bounded temporaries)."""
    if n <= CHUNK:
        return sampler(rng, param, n)
    return np.concatenate(
        [sampler(rng, param, min(CHUNK, n - start)) for start in range(0, n, CHUNK)]
    )


def _size(size: int | tuple[int, ...] | None) -> int:
    return int(np.prod(size)) if size is not None else 1


# --------------------------------------------------------------------------- the public API


def add_laplace(
    rng: np.random.Generator,
    value,
    scale: float,
    l1_sensitivity: float,
    *,
    coordinates_changed: int | None = None,
):
    """Laplace mechanism on the grid: ``g·(round(value/g) + K)``, K ~ DLap(t) (CKS Alg. 2).

    Privacy (pure ε, no float slack): for neighbours whose values differ by ≤ Δ in L1 on at
    most ``c`` coordinates (default: all of them), the rounded values differ by an integer
    vector of L1 norm ≤ (Δ + g·c)/g; DLap(t) with integer ``t ≥ scale·(Δ + g·c)/(Δ·g)``
    has pmf ratio ≤ exp(‖shift‖₁/t) ≤ exp(Δ/scale) = e^ε for a scale calibrated as Δ/ε.
    The cost (ε = Δ/scale) is charged by the caller. Tails: :func:`laplace_tail`.
    """
    arr = np.asarray(value, dtype=np.float64)
    changed = arr.size if coordinates_changed is None else coordinates_changed
    g, t = _laplace_units(scale, l1_sensitivity, max(changed, 1))
    draws = _chunked(_discrete_laplace, rng, t, arr.size)
    _record("laplace", scale, l1_sensitivity, arr.shape, (g, t, changed, None), draws, arr)
    return _on_grid(arr, g, draws)


def laplace_noise(
    rng: np.random.Generator,
    scale: float,
    size: int | tuple[int, ...] | None = None,
    *,
    sensitivity: float = math.nan,
):
    """Pure discrete Laplace noise ``g·K``, K ~ DLap(⌈scale/g⌉), for comparisons (sparse vector).

    No value is rounded, so no widening: the caller accounts for the grid (values compared
    against this noise must themselves lie on a multiple of ``g``). ``sensitivity`` is
    recorded in the draw log only.
    """
    g, t = _laplace_units(scale, 1.0, 0)
    n = _size(size)
    draws = _chunked(_discrete_laplace, rng, t, n)
    shape = () if size is None else (size,) if isinstance(size, int) else tuple(size)
    _record("laplace", scale, sensitivity, shape, (g, t, 0, None), draws)
    noise = draws.astype(np.float64) * g
    return float(noise[0]) if size is None else noise.reshape(size)


def laplace_tail(
    scale: float, l1_sensitivity: float, beta: float, *, coordinates_changed: int = 1
) -> float:
    """A grid value ``x`` with P(noise ≥ x) ≤ β for one coordinate of :func:`add_laplace`.

    DLap(t): P(K ≥ m) = e^{−m/t}/(1 + e^{−1/t}) for m ≥ 1; ``m`` is the smallest integer
    making that ≤ β, plus one for the float evaluation. ``x = g·m`` is on the grid, so
    ``noisy − x`` is computed exactly (no rounding towards the wrong side).
    """
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    g, t = _laplace_units(scale, l1_sensitivity, max(coordinates_changed, 1))
    m = math.ceil(t * (math.log(1 / beta) - math.log1p(math.exp(-1 / t)))) + 1
    return max(m, 1) * g


def add_gaussian(
    rng: np.random.Generator,
    value,
    sigma: float,
    l2_sensitivity: float,
    *,
    coordinates_changed: int | None = None,
):
    """Gaussian mechanism on the grid: ``g·(round(value/g) + K)``, K discrete Gaussian (CKS Alg. 3).

    Calibration (caller's σ for Δ, by :func:`accountant.gaussian_sigma`): the rounded values
    differ by an integer vector of L2 norm ≤ Δ_g = (Δ + g·⌈√c⌉)/g; σ_g is σ widened by
    ``(Δ + g⌈√c⌉)/Δ·(1 + size·2^-40)`` in grid units, so Δ_g/σ_g ≤ (Δ/σ)/(1 + size·2^-40).
    zCDP: N_Z(0, σ_g²) with integer shift Δ_g is Δ_g²/(2σ_g²)-zCDP (CKS Thm 14), within ρ.
    (ε, δ): N_Z(0, σ_g²) is within e^{±b}, b ≤ 13/σ_g² ≤ 1.2e-17, of the continuous Gaussian
    rounded to the grid (midpoint rule on |k| ≤ 17σ_g), a post-processing of the continuous
    mechanism the caller calibrated. Sampler slack: pmf within e^{±2·ETA} per coordinate, zero
    beyond 17σ_g (discrete-Gaussian mass < e^-140 there). Total: with a = size·(2·ETA + b) ≤
    size·7.5e-17, δ(ε) ≤ e^a·δ_ref(ε − 2a); the 1 + size·2^-40 widening absorbs the 2a in ε
    whenever ε ≥ 2e-4; the factor e^a on δ (≤ 1 + 4e-9 at 5·10⁷ values) and ε below 2e-4 are
    explicit slack (docs/privacy-noise.md).
    """
    arr = np.asarray(value, dtype=np.float64)
    changed = arr.size if coordinates_changed is None else coordinates_changed
    g, sigma_g = _gaussian_units(sigma, l2_sensitivity, max(changed, 1), arr.size)
    draws = _chunked(_discrete_gaussian, rng, sigma_g, arr.size)
    _record("gaussian", sigma, l2_sensitivity, arr.shape, (g, sigma_g, changed, None), draws, arr)
    return _on_grid(arr, g, draws)


def gaussian_tail(sigma: float, l2_sensitivity: float, beta: float, size: int = 1) -> float:
    """A grid value ``x`` with P(noise ≥ x) ≤ β for one coordinate of :func:`add_gaussian`.

    The sampler's pmf is within e^{±(2·ETA + b)} ≤ e^{1e-16} of the continuous N(0, σ_g²)
    rounded to integers on its support (|k| < 17σ_g; :func:`add_gaussian`), so
    P(K ≥ m) ≤ e^{1e-16}·Φ̄((m − ½)/σ_g); ``m = ⌈σ_g Φ̄⁻¹(β(1 − 1e-9)) + ½⌉ + 1`` (the 1e-9
    and the +1 cover that factor and the float evaluation).
    """
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    g, sigma_g = _gaussian_units(sigma, l2_sensitivity, size, size)
    quantile = -float(special.ndtri(beta * (1 - 1e-9)))  # Φ̄⁻¹, accurate for small β
    return (math.ceil(sigma_g * quantile + 0.5) + 1) * g


def add_symmetric_gaussian(
    rng: np.random.Generator, matrix: np.ndarray, sigma: float, l2_sensitivity: float
) -> np.ndarray:
    """``matrix`` (d×d, or a stack …×d×d) plus symmetric discrete Gaussian noise (DTTZ14 Alg. 1).

    The upper triangles with diagonal are released by :func:`add_gaussian` (L2 sensitivity Δ
    of the concatenated triangles, same argument) and mirrored: post-processing.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    dim = matrix.shape[-1]
    if matrix.ndim < 2 or matrix.shape[-2] != dim:
        raise ValueError(f"expected square matrices, got shape {matrix.shape}")
    rows, cols = np.triu_indices(dim)
    upper = matrix[..., rows, cols]
    g, sigma_g = _gaussian_units(sigma, l2_sensitivity, upper.size, upper.size)
    draws = _chunked(_discrete_gaussian, rng, sigma_g, upper.size)
    units = (g, sigma_g, upper.size, None)
    _record("symmetric_gaussian", sigma, l2_sensitivity, upper.shape, units, draws, upper)
    noisy_upper = _on_grid(upper, g, draws)
    out = np.empty_like(matrix)
    out[..., rows, cols] = noisy_upper
    out[..., cols, rows] = noisy_upper
    return out


def add_truncated_laplace(
    rng: np.random.Generator, value: float, scale: float, bound: float, sensitivity: float
) -> float:
    """``g·(round(value/g) + K)``, K ~ DLap(t) conditioned on |K| ≤ B = ⌊bound/g⌋ (SS21 TLap).

    Rejection from :func:`add_laplace`'s DLap(t): the noise never exceeds ``B·g ≤ bound``, so a
    caller releasing only when ``noisy > bound`` never releases on a zero statistic. On the
    grid: where both shifted pmfs are positive their ratio is ≤ e^{Δ_g/t} ≤ e^{Δ/scale} = e^ε
    (t widened as in :func:`add_laplace`); the mass outside the overlap is
    :func:`truncated_laplace_grid_delta`, within a factor 1 + 1e-6 of the continuous δ of
    :func:`truncated_laplace_calibration` (docs/privacy-noise.md).
    """
    g, t = _laplace_units(scale, sensitivity, 1)
    _check_scale("truncation bound", bound)
    limit = math.floor(Fraction(bound) / Fraction(g))
    draws = _truncated_discrete_laplace(rng, t, limit, 1)
    _record("truncated_laplace", scale, sensitivity, (), (g, t, 1, limit), draws, value)
    return _on_grid(value, g, draws)


def _truncated_discrete_laplace(rng: np.random.Generator, t: int, limit: int, n: int):
    """n draws of DLap(t) conditioned on |K| ≤ limit (rejection), exact."""
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    while pending.size:
        k = _discrete_laplace(rng, t, pending.size)
        keep = np.abs(k) <= limit
        out[pending[keep]] = k[keep]
        pending = pending[~keep]
    return out


def truncated_laplace_grid_delta(scale: float, bound: float, sensitivity: float) -> float:
    """Mass of :func:`add_truncated_laplace`'s noise outside the overlap of two shifted supports.

    P(K > B − s) with s = ⌈(Δ + g)/g⌉ the largest integer shift, for P(K = k) ∝ e^{−|k|/t} on
    |k| ≤ B: e^{−(B−s+1)/t}(1 − e^{−s/t}) / (1 + e^{−1/t} − 2e^{−(B+1)/t}).
    """
    g, t = _laplace_units(scale, sensitivity, 1)
    limit = math.floor(Fraction(bound) / Fraction(g))
    shift = math.ceil((Fraction(sensitivity) + Fraction(g)) / Fraction(g))
    q = math.exp(-1 / t)
    return (
        math.exp(-(limit - shift + 1) / t)
        * -math.expm1(-shift / t)
        / (1 + q - 2 * math.exp(-(limit + 1) / t))
    )


def truncated_laplace_calibration(
    sensitivity: float, epsilon: float, delta: float
) -> tuple[float, float]:
    """Scale λ and truncation bound A of TLap(Δ, ε, δ) (Geng, Ding, Guo & Kumar 2020; SS21 §3).

    λ = Δ/ε and A = (Δ/ε)·ln(1 + (e^ε − 1)/(2δ)). Density ∝ exp(−|x|/λ) on [−A, A].
    Adding it to a statistic of sensitivity Δ is (ε, δ)-DP: where both shifted densities
    are positive their ratio is ≤ e^{Δ/λ} = e^ε, and the mass outside the overlap is
    (e^ε − 1)/(2(e^{A/λ} − 1)) = δ. It is also δ-approximately ε²/2-zCDP (condition each
    side on landing in the overlap, an event of probability 1 − δ), so a zCDP grant may
    run it with ε = √(2ρ) and δ = δ₀. On the grid see :func:`add_truncated_laplace`.
    """
    if not (sensitivity > 0 and epsilon > 0 and 0 < delta < 1):
        raise ValueError(
            f"truncated Laplace needs Δ > 0, ε > 0 and δ in (0, 1); got {sensitivity}, "
            f"{epsilon}, {delta}"
        )
    scale = sensitivity / epsilon
    return scale, scale * math.log1p(math.expm1(epsilon) / (2 * delta))


# --------------------------------------------------------------------------- test helpers


def truncated_laplace(
    rng: np.random.Generator, scale: float, bound: float, size: int | tuple[int, ...] | None = None
):
    """Pure noise of :func:`add_truncated_laplace` (its distribution tests); never published."""
    g, t = _laplace_units(scale, scale, 1)
    _check_scale("truncation bound", bound)
    limit = math.floor(Fraction(bound) / Fraction(g))
    noise = _truncated_discrete_laplace(rng, t, limit, _size(size)).astype(np.float64) * g
    return float(noise[0]) if size is None else noise.reshape(size)
