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
