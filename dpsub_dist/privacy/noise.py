"""The one home of DP noise: generators and samplers.

DP noise is drawn from a generator seeded from OS entropy (``secrets``), never
from a user-visible seed. A run may pass a *private* noise seed kept in the
ledger's run record so that resuming the same run id reproduces the same
release instead of spending budget twice (ALGORITHMS.md §0).

Known limitation: these samplers use floating-point arithmetic, which leaks
through the low-order bits of released values (Mironov, CCS 2012). Released
quantities here are post-processed (projections, eigenvectors, cell centres),
which blurs but does not provably remove that channel; see docs/privacy.md.
"""

from __future__ import annotations

import math
import secrets

import numpy as np


def new_noise_seed() -> int:
    """A fresh 128-bit private seed from OS entropy."""
    return secrets.randbits(128)


def noise_rng(private_seed: int | None = None) -> np.random.Generator:
    """Generator for DP noise: OS entropy, or a private seed from the run record."""
    return np.random.default_rng(new_noise_seed() if private_seed is None else private_seed)


def laplace(rng: np.random.Generator, scale: float, size: int | tuple[int, ...] | None = None):
    """Laplace noise with the given scale (b = sensitivity / ε)."""
    if not scale > 0:
        raise ValueError(f"Laplace scale must be > 0, got {scale}")
    return rng.laplace(0.0, scale, size)


def gaussian(rng: np.random.Generator, sigma: float, size: int | tuple[int, ...]):
    """I.i.d. N(0, σ²) noise."""
    if not sigma > 0:
        raise ValueError(f"Gaussian sigma must be > 0, got {sigma}")
    return rng.normal(0.0, sigma, size)


def symmetric_gaussian(rng: np.random.Generator, sigma: float, dim: int) -> np.ndarray:
    """Symmetric d×d matrix, upper triangle and diagonal i.i.d. N(0, σ²) (DTTZ14 Alg. 1)."""
    upper = np.triu(gaussian(rng, sigma, (dim, dim)))
    return upper + np.triu(upper, 1).T


def truncated_laplace_calibration(
    sensitivity: float, epsilon: float, delta: float
) -> tuple[float, float]:
    """Scale λ and truncation bound A of TLap(Δ, ε, δ) (Geng, Ding, Guo & Kumar 2020; SS21 §3).

    λ = Δ/ε and A = (Δ/ε)·ln(1 + (e^ε − 1)/(2δ)). Density ∝ exp(−|x|/λ) on [−A, A].
    Adding it to a statistic of sensitivity Δ is (ε, δ)-DP: where both shifted densities
    are positive their ratio is ≤ e^{Δ/λ} = e^ε, and the mass outside the overlap is
    (e^ε − 1)/(2(e^{A/λ} − 1)) = δ. It is also δ-approximately ε²/2-zCDP (condition each
    side on landing in the overlap, an event of probability 1 − δ), so a zCDP grant may
    run it with ε = √(2ρ) and δ = δ₀.
    """
    if not (sensitivity > 0 and epsilon > 0 and 0 < delta < 1):
        raise ValueError(
            f"truncated Laplace needs Δ > 0, ε > 0 and δ in (0, 1); got {sensitivity}, "
            f"{epsilon}, {delta}"
        )
    scale = sensitivity / epsilon
    return scale, scale * math.log1p(math.expm1(epsilon) / (2 * delta))


def truncated_laplace(
    rng: np.random.Generator, scale: float, bound: float, size: int | tuple[int, ...] | None = None
):
    """Laplace(scale) noise conditioned on |x| ≤ bound (inverse CDF; never exceeds the bound)."""
    if not (scale > 0 and bound > 0):
        raise ValueError(f"truncated Laplace needs scale > 0 and bound > 0, got {scale}, {bound}")
    # |x| has CDF (1 − e^{−a/λ}) / (1 − e^{−A/λ}) on [0, A]; invert it, then draw a sign.
    magnitude = -scale * np.log1p(rng.uniform(0.0, 1.0, size) * np.expm1(-bound / scale))
    sign = np.where(rng.uniform(0.0, 1.0, size) < 0.5, -1.0, 1.0)
    return sign * np.minimum(magnitude, bound)


def coarsen(value: float, noise_scale: float, steps_per_scale: int = 64) -> float:
    """Round a released noisy scalar to a grid of ``noise_scale / steps_per_scale``.

    Post-processing that drops the low-order floating-point bits through which a raw
    Laplace/Gaussian sample can leak its input (Mironov 2012); the grid is far finer
    than the noise, so utility does not change.
    """
    step = noise_scale / steps_per_scale
    return float(np.round(value / step) * step)
