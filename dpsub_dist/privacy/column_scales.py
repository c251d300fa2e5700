"""Private per-column standardisation: a location and a scale for every column, released with
Gaussian noise, so that the run can estimate the principal subspace of ``(x − μ̂)/σ̂`` (the
correlation matrix's PCA) inside its (ε, δ).

The construction is the coarse-then-fine estimate of private statistics with unknown range
(Karwa & Vadhan 2018, "Finite sample differentially private confidence intervals": a private
histogram over a public geometric grid finds the scale; Kamath, Li, Singhal & Ullman 2019 and
Biswas, Dong, Kamath & Ullman 2020, CoinPress: a coarse private range, then a clipped mean
inside it), done for every column at once with one Gaussian (Dwork & Roth 2014, Thm A.1;
calibrated by :mod:`dpsub_dist.privacy.calibration`). Neighbours: replace one row (n public);
user level is refused by the caller (the row count and each user's row count are private).

Step 1, ``standardize_histogram`` (:func:`column_histograms`, :func:`private_ranges`). Every
row adds one count to each column's histogram over the public signed geometric grid
:data:`GRID` (a bin for ``|x| < 2^LOW``, then for each sign :data:`PER_OCTAVE` bins per factor
of two up to ``2^HIGH``; larger values fall in the last bin). Replacing one row moves each of
the D histograms by −1 in one bin and +1 in another (or not at all), so the stacked D·BINS
counts move by at most √(2D) in L2: one Gaussian at Δ = √(2D) (``coordinates_changed`` 2D).
From each noisy histogram, bins below a public threshold (the noise's 1 %-per-column tail) are
zeroed, and the 25th, 50th and 75th percentile bins give a coarse centre ``m_j`` (the median
bin's value) and spread ``s_j = max(max(v₇₅ − v₂₅, w(m_j))/1.349, r_j/c₁)``: ``w`` the median
bin's width, 1.349σ a normal's IQR, ``r_j`` the reach from ``m_j`` of the farthest bin above a
stricter threshold (:data:`REACH_TAIL`), so that the first round's clip at c₁ spreads covers
those bins, as CoinPress starts from a range that holds the data (a point mass at 0 does not
make s_j vanish). Post-processing of the noisy counts: no further cost.
Where no bin survives the threshold (too few rows for the noise), ``m_j = 0`` and ``s_j = 1``.

Steps 2 and 3, ``standardize_moments`` and ``standardize_refine`` (:func:`clipped_moments`,
:func:`private_location_scale`), one CoinPress round each.
Every row gives ``z_j = clip((x_j − m_j)/s_j, −c, c)`` (c: :data:`CLIPS`), and the run
releases the 2D-vector ``(Σ z_j/(2c), Σ z_j²/c²)_j`` with one Gaussian. Replacing row a by row
b moves coordinate j of the first half by ``(z_a − z_b)/(2c) ∈ [−1, 1]`` and of the second by
``(z_a² − z_b²)/c² ∈ [−1, 1]``, so the vector moves by at most √(2D) in L2 (the true maximum is
√(1.29·D); :func:`moments_sensitivity_bound` checks it). For the fixed released ``m`` and
``s`` (step 1) this is the Gaussian mechanism; then ``μ̂_j = m_j + s_j·z̄_j`` and
``σ̂_j = s_j·√max(E[z_j²] − z̄_j², sd_j, VARIANCE_FLOOR)`` (``sd_j`` below): finite and > 0
for every input, and a column whose variance is below the noise is scaled as if it were at
the noise's level, not blown up by it. Step 3 repeats step 2 around the refined centre ``μ̂``
and spread ``s_j·√(max(v_j, 0) + 2·sd_j)`` (``v_j`` the noisy variance of z, ``sd_j`` its
noise's standard deviation, a public function of σ, c, n and the released z̄): a column whose
spread is far below the grid's resolution at its centre (2 ± 0.01) is resolved in the second
round (CoinPress's shrinking radius). The released μ̂ and σ̂ are the last round's. Clipping
biases them only through rows more than c spreads from the centre.

Privacy of the whole: the three steps compose (basic composition of their grants; each later
step is the Gaussian mechanism for every fixed value of the earlier releases); the rows the
method then reads are ``(x − μ̂)/σ̂`` for the fixed released ``μ̂, σ̂``, a row-by-row map, so
replacing one row still replaces one (standardised) row and every later step's argument holds
at its own grant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import Budget

LOW, HIGH, PER_OCTAVE = -24, 40, 8
"""The grid: magnitudes 2^LOW … 2^HIGH, PER_OCTAVE bins per factor of two (public)."""
MAGNITUDES = (HIGH - LOW) * PER_OCTAVE
BINS = 2 * MAGNITUDES + 1
"""Bins per column: MAGNITUDES negative (most negative first), the centre bin, MAGNITUDES
positive; index order is value order."""
CENTRE_BIN = MAGNITUDES
EDGES = 2.0 ** (LOW + np.arange(MAGNITUDES + 1) / PER_OCTAVE)
"""Magnitude edges: positive bin k holds [EDGES[k], EDGES[k + 1]) (the last one: and beyond)."""
GRID = np.concatenate(
    [-np.sqrt(EDGES[1:] * EDGES[:-1])[::-1], [0.0], np.sqrt(EDGES[1:] * EDGES[:-1])]
)
"""Each bin's value: the geometric middle of its magnitudes, signed; 0 for the centre bin."""
WIDTH = np.concatenate([(EDGES[1:] - EDGES[:-1])[::-1], [2 * EDGES[0]], EDGES[1:] - EDGES[:-1]])
"""Each bin's width."""

CLIPS = (16.0, 8.0)
"""c of each moments round: each coordinate is clipped to c spreads around the centre; wide
in the first round (the coarse spread of a heavy-tailed column is a fraction of σ), narrower
around the refined spread (the variance's noise grows with c²)."""
VARIANCE_FLOOR = 2.0**-10
"""The released variance of z is at least this (σ̂_j ≥ s_j/32): finite and positive."""
IQR_PER_SD = 1.349
"""The interquartile range of a normal distribution, in standard deviations."""
TAIL_PER_COLUMN = 0.01
"""Chance that one column's histogram keeps a bin whose true count is 0 (the threshold)."""
REACH_TAIL = 1e-9
"""The same chance for the bins the coarse spread must reach: one false far bin would make the
spread, and then σ̂, as large as its magnitude."""

HISTOGRAM_SENSITIVITY = "√(2D): each of the D histograms moves by ±1 in at most two bins"
MOMENTS_SENSITIVITY = "√(2D): each (Σz/(2c), Σz²/c²) coordinate moves by ≤ 1"


def sensitivity(dim: int) -> float:
    """The L2 sensitivity of both steps' released vectors: √(2D) (module docstring)."""
    return math.sqrt(2.0 * dim)


def histogram_mechanism(grant: Budget, dim: int) -> mechanism.Gaussian:
    """Step ``standardize_histogram``: the Gaussian for the D stacked histograms."""
    return mechanism.gaussian(grant, sensitivity(dim))


def moments_mechanism(grant: Budget, dim: int) -> mechanism.Gaussian:
    """Step ``standardize_moments``: the Gaussian for the 2D clipped moment sums."""
    return mechanism.gaussian(grant, sensitivity(dim))


def bin_index(rows: np.ndarray) -> np.ndarray:
    """Each value's bin on :data:`GRID` (same shape, int64), by comparisons with the public
    :data:`EDGES` only (the same bin on every machine)."""
    values = np.asarray(rows, dtype=np.float64)
    offset = np.minimum(np.searchsorted(EDGES, np.abs(values), side="right"), MAGNITUDES)
    return CENTRE_BIN + np.where(values < 0, -offset, offset).astype(np.int64)


def column_histograms(rows: np.ndarray) -> np.ndarray:
    """The D × BINS counts of one block of rows (n × D): row i adds one to bin
    ``bin_index(x_ij)`` of column j's histogram."""
    rows = np.asarray(rows)
    dim = rows.shape[1]
    flat = (bin_index(rows) + BINS * np.arange(dim)).ravel()
    return np.bincount(flat, minlength=dim * BINS).reshape(dim, BINS).astype(np.int64)


@dataclass(frozen=True)
class Ranges:
    """Step 1's release: the noisy histograms and the coarse centres and spreads read off them
    (post-processing)."""

    counts: np.ndarray
    centre: np.ndarray
    spread: np.ndarray
    sigma: float
    sensitivity: float


def threshold(sigma: float, tail: float = TAIL_PER_COLUMN) -> float:
    """Counts below this are zeroed: the noise's ``tail`` over BINS bins (per column)."""
    from scipy import stats  # --standardize only: not imported by every run (1 CPU s)

    return float(sigma * stats.norm.isf(tail / BINS))


def private_ranges(
    counts: np.ndarray, mech: mechanism.Gaussian, rng: np.random.Generator
) -> Ranges:
    """Step 1: the ``mech`` Gaussian on the D × BINS ``counts`` (2D coordinates move), then
    each column's coarse centre and spread (module docstring)."""
    counts = np.asarray(counts, dtype=np.float64)
    dim = counts.shape[0]
    noisy = mech.release(rng, counts, coordinates_changed=2 * dim)
    kept = np.where(noisy >= threshold(mech.sigma), noisy, 0.0)
    far = noisy >= threshold(mech.sigma, REACH_TAIL)
    centre, spread = np.zeros(dim), np.ones(dim)
    for j, column in enumerate(kept):
        total = column.sum()
        if not total > 0:
            continue
        cumulative = np.cumsum(column)
        q25, q50, q75 = (int(np.searchsorted(cumulative, q * total)) for q in (0.25, 0.5, 0.75))
        centre[j] = GRID[q50]
        reached = np.flatnonzero(far[j])
        reach = np.max(np.abs(GRID[reached] - centre[j]) + WIDTH[reached], initial=0.0)
        iqr = max(GRID[q75] - GRID[q25], WIDTH[q50]) / IQR_PER_SD
        spread[j] = max(iqr, reach / CLIPS[0])  # the first round's clip covers the far bins
    return Ranges(noisy, centre, spread, mech.sigma, mech.sensitivity)


def clipped_moments(
    rows: np.ndarray, centre: np.ndarray, spread: np.ndarray, clip: float
) -> np.ndarray:
    """One block's 2D sums ``(Σ z/(2c), Σ z²/c²)``, z = clip((x − centre)/spread, −c, c)."""
    z = np.clip((np.asarray(rows, dtype=np.float64) - centre) / spread, -clip, clip)
    return np.concatenate([z.sum(axis=0) / (2 * clip), (z * z).sum(axis=0) / clip**2])


@dataclass(frozen=True)
class LocationScale:
    """A moments step's release: the private location μ̂ and scale σ̂ of every column, and
    the refined centre and spread the next round clips around (:func:`refined`)."""

    location: np.ndarray
    scale: np.ndarray
    refined: Ranges
    sigma: float
    sensitivity: float


def private_location_scale(
    sums: np.ndarray,
    n_rows: int,
    ranges: Ranges,
    clip: float,
    mech: mechanism.Gaussian,
    rng: np.random.Generator,
) -> LocationScale:
    """A moments step: the ``mech`` Gaussian on the 2D moment ``sums`` of ``n_rows`` rows
    (public at row level) clipped at ``clip`` around ``ranges``, then μ̂ and σ̂ and the next round's
    centre and spread (post-processing; module docstring)."""
    if n_rows < 1:
        raise ValueError(f"n_rows must be ≥ 1 (got {n_rows})")
    noisy = mech.release(rng, np.asarray(sums, dtype=np.float64))
    dim = noisy.size // 2
    mean_z = 2 * clip * noisy[:dim] / n_rows
    square_z = clip**2 * noisy[dim:] / n_rows
    variance = square_z - mean_z**2
    location = ranges.centre + ranges.spread * mean_z
    # The noise's standard deviation in the variance of z (σ₂ on Σz²/c², and on Σz/(2c)
    # through z̄²): a variance below it is read as it (a column is never scaled up by noise
    # alone), and the next spread keeps two of them.
    noise_sd = (clip**2 + 4 * clip * np.abs(mean_z)) * mech.sigma / n_rows
    scale = ranges.spread * np.sqrt(np.maximum(variance, np.maximum(noise_sd, VARIANCE_FLOOR)))
    upper = np.clip(np.maximum(variance, 0.0) + 2 * noise_sd, VARIANCE_FLOOR, clip**2)
    spread = ranges.spread * np.sqrt(upper)
    refined = Ranges(ranges.counts, location, spread, ranges.sigma, ranges.sensitivity)
    return LocationScale(location, scale, refined, mech.sigma, mech.sensitivity)


def moments_sensitivity_bound(clip: float = CLIPS[0], points: int = 401) -> float:
    """max over z_a, z_b ∈ [−c, c] of one coordinate's squared move
    ((z_a − z_b)/(2c))² + ((z_a² − z_b²)/c²)², on a grid: ≤ 2 (the calibration's bound)."""
    z = np.linspace(-clip, clip, points)
    a, b = np.meshgrid(z, z)
    return float(np.max(((a - b) / (2 * clip)) ** 2 + ((a * a - b * b) / clip**2) ** 2))
