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
The noise per count is σ whatever the grid, and one column's share of it is the same as if
each column's histogram had its own Gaussian at ρ/D (zCDP composes the D parts to the same
ρ): the √D is the price of D columns, not of the stacking; what the grid decides is how many
rows a bin gathers against that σ. So each column's noisy counts are read at
:data:`LEVELS` groupings (1, 2, 4, … bins of one sign summed; the bin at 0 alone; a sum of g
counts has noise σ√g), a group kept where its sum passes the noise's
:data:`TAIL_PER_COLUMN` tail over all the column's groups, and the finest grouping whose
kept groups hold :data:`SEEN` of the n rows (public; else the one that holds the most) is
read: the coarse centre ``m_j`` is the kept mass's mean
(group values: geometric middles), the coarse spread ``s_j`` its standard deviation with each
group's own ``width²/12`` added. Where only the bin at 0 is kept (a rare flag or count whose
other rows are too few to see), ``s_j`` is :data:`UNIT`; where nothing is kept, the finest
of the groupings of 2 to 8 octaves whose largest sum passes a looser cut
(:data:`FALLBACK_TAIL`) places the column (that group's middle and own spread), else
``m_j = 0``, ``s_j = UNIT``. A mass at 0 never makes the spread
vanish, and a column spread too thin for any single bin is seen in octave groups.
Post-processing of the noisy counts: no further cost.

Steps 2 and 3, ``standardize_moments`` and ``standardize_refine`` (:func:`clipped_moments`,
:func:`private_location_scale`), one CoinPress round each.
Every row gives ``z_j = clip((x_j − m_j)/s_j, −c, c)`` (c: :func:`clips`; ``x`` is clipped to
``m ± c·s`` before dividing, so z is finite for every finite x), and the run releases the
2D-vector ``(Σ z_j/(2c), Σ z_j²/c²)_j`` with one Gaussian. Replacing row a by row b moves
coordinate j of the first half by ``(z_a − z_b)/(2c) ∈ [−1, 1]`` and of the second by
``(z_a² − z_b²)/c² ∈ [−1, 1]``, so the vector moves by at most √(2D) in L2 (the true maximum is
√(1.29·D); :func:`moments_sensitivity_bound` checks it). For the fixed released ``m`` and
``s`` (step 1) this is the Gaussian mechanism; then ``μ̂_j = m_j + s_j·z̄_j`` (z̄ clipped to
±c) and ``σ̂_j = s_j·√v_j``: ``v_j`` is the noisy variance ``E[z²] − z̄²`` where it exceeds
2τ_j (``τ_j`` the noise's standard deviation in that variance, a public function of σ, c, n
and the released z̄); below, where the round cannot tell it from noise, 1 (the spread it
clipped around is kept) unless ``v + 4τ`` is lower (noise puts the truth above it in
3·10⁻⁵ of rounds); always in
``[VARIANCE_FLOOR, c²]`` (a round never blows a column up, nor shrinks it to the floor, on
noise alone). Step 3 repeats step 2 around ``μ̂`` and ``σ̂``, clipped at the widest c of
:data:`REFINE_CLIPS` whose noise c²σ/n is small (public n and σ; 3 where none is: a heavy
tail loses less of its σ where the rows allow), (CoinPress's shrinking range: a
column 2 ± 0.01, far below the grid's resolution at its centre, is resolved there). The
released μ̂ and σ̂ are the last round's; clipping biases them only through rows more than c
spreads from the centre.

The method then reads :func:`standardise`'s rows: ``(x − μ̂)/σ̂`` clipped to ±:data:`BOUND`
(x clipped to ``μ̂ ± BOUND·σ̂`` first: finite for every finite x, e.g. a row of 10³⁰⁸).

Privacy of the whole: the three steps compose (basic composition of their grants; each later
step is the Gaussian mechanism for every fixed value of the earlier releases); the rows the
method then reads are ``clip((x − μ̂)/σ̂, ±BOUND)`` for the fixed released ``μ̂, σ̂`` and the
public BOUND, a row-by-row map, so replacing one row still replaces one (standardised) row
and every later step's argument holds at its own grant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import Budget

LOW, HIGH, PER_OCTAVE = -24, 40, 4
"""The grid: magnitudes 2^LOW … 2^HIGH, PER_OCTAVE bins per factor of two (public). Coarse
enough that a column spread over several octaves (money) puts its rows in bins above the
noise, fine enough that a column far from 0 (years) is located within 19 %."""
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

CLIPS = (8.0, 3.0)
"""c of each moments round: each coordinate is clipped to c spreads around the centre; wider
in the first round (around the histogram's spread), narrower around the refined spread (the
variance's noise grows with c²). The last round's is the widest of :data:`REFINE_CLIPS` its
noise allows (:func:`clips`); 3 where none does."""
REFINE_CLIPS = (8.0, 6.0, 4.0)
"""The last round's clip, widest first: a heavy tail clipped at 3 spreads loses a quarter of
its σ (flights' delays), at 8 a few percent."""
REFINE_NOISE = 0.02
"""The last round's clip is the widest whose c²·σ/n (the variance's noise, in variances of
z) is at most this: σ̂ within about 1 % from the noise."""


def clips(n_rows: int, refine_sigma: float) -> tuple[float, float]:
    """Both rounds' clips, from public facts only (n, the last round's σ): :data:`CLIPS`'s
    first, and the widest of :data:`REFINE_CLIPS` whose noise c²σ/n ≤ :data:`REFINE_NOISE`."""
    fits = [c for c in REFINE_CLIPS if c * c * refine_sigma / n_rows <= REFINE_NOISE]
    return CLIPS[0], fits[0] if fits else CLIPS[1]


VARIANCE_FLOOR = 2.0**-10
"""The released variance of z is at least this (σ̂_j ≥ s_j/32): finite and positive."""
TAIL_PER_COLUMN = 1e-4
"""Chance that one column's histogram keeps a bin whose true count is 0 (the threshold): a
false far bin makes the coarse spread, and then σ̂, as large as its distance."""
UNIT = 1.0
"""The coarse spread of a column whose only bin above the noise is the one at 0 (mostly exact
zeros, the rest too thin to see: a rare flag or count), or with no such bin: the unit of
counts and flags. The moments rounds then measure the rest around it."""
BOUND = 16.0
"""Standardised values are clipped to ±BOUND (:func:`standardise`): public, so every row the
method reads has norm ≤ BOUND·√D whatever the data hold."""

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


LEVELS = 4
"""Group sizes 1, 2, 4, … 2^(LEVELS−1) bins of one sign (up to 2 octaves): a column whose rows
are spread too thin for any single bin is seen in groups of bins (noise grows as √size)."""
TESTS = sum(BINS // 2**level + 1 for level in range(LEVELS))
"""How many group sums one column's reading compares with its cut (at most)."""
SEEN = 0.75
"""The finest grouping whose kept groups hold this share of the rows is read (coarser ones
only add noise and lose resolution); where none does, the one that holds the most."""
FALLBACK_TAIL = 0.01
"""Where no group passes the threshold, the largest noisy sum of a coarser grouping (2 to 8
octaves, :data:`FALLBACK_LEVELS`) still places the column if noise alone would pass its cut
in this share of columns: a column whose rows are spread over many octaves gets a spread of
its magnitude, not the unit (which would clip all its rows and collapse its scale)."""
FALLBACK_LEVELS = 6
"""Group sizes up to 2^(FALLBACK_LEVELS−1) bins (8 octaves) for that last look."""


def cut(sigma: float, size: float = 1.0) -> float:
    """A sum of ``size`` noisy counts is kept above this: noise alone passes it in
    :data:`TAIL_PER_COLUMN` of columns, over all :data:`TESTS` sums."""
    return float(sigma * math.sqrt(size) * _normal_isf(TAIL_PER_COLUMN / TESTS))


def _normal_isf(tail: float) -> float:
    """The standard normal's upper ``tail`` quantile."""
    from scipy import stats  # --standardize only: not imported by every run (1 CPU s)

    return float(stats.norm.isf(tail))


def _groups(noisy: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One column's noisy counts summed in aligned groups of ``size`` magnitude bins of each
    sign (the bin at 0 alone): (sums, values, variances within), in value order."""
    edges = EDGES[::size]
    low, high = edges[:-1], edges[1:]
    value, within = np.sqrt(low * high), (high - low) ** 2 / 12.0
    positive = noisy[CENTRE_BIN + 1 :].reshape(-1, size).sum(axis=1)
    negative = noisy[:CENTRE_BIN][::-1].reshape(-1, size).sum(axis=1)
    sums = np.concatenate([negative[::-1], noisy[CENTRE_BIN : CENTRE_BIN + 1], positive])
    values = np.concatenate([-value[::-1], [0.0], value])
    variances = np.concatenate([within[::-1], [WIDTH[CENTRE_BIN] ** 2 / 12.0], within])
    return sums, values, variances


def private_ranges(
    counts: np.ndarray, n_rows: int, mech: mechanism.Gaussian, rng: np.random.Generator
) -> Ranges:
    """Step 1: the ``mech`` Gaussian on the D × BINS ``counts`` of ``n_rows`` rows (public at
    row level; 2D coordinates move), then each column's coarse centre and spread (module
    docstring): post-processing only."""
    counts = np.asarray(counts, dtype=np.float64)
    dim = counts.shape[0]
    noisy = mech.release(rng, counts, coordinates_changed=2 * dim)
    centre, spread = np.zeros(dim), np.full(dim, UNIT)
    for j, column in enumerate(noisy):
        seen = []
        for level in range(LEVELS):
            sums, values, variances = _groups(column, 2**level)
            size = np.where(values == 0.0, 1.0, 2.0**level)
            weights = np.where(sums >= cut(mech.sigma) * np.sqrt(size), sums, 0.0)
            seen.append((weights, values, variances))
        mass = np.array([w.sum() for w, *_ in seen])
        if mass.max() > 0:  # the finest grouping that sees SEEN of the rows, else the most
            enough = mass >= SEEN * n_rows
            weights, values, variances = seen[int(np.argmax(enough if enough.any() else mass))]
        else:  # nothing above the noise: the finest of the coarse groupings whose largest
            for level in range(LEVELS - 1, FALLBACK_LEVELS):  # sum stands out (looser cut)
                sums, values, variances = _groups(column, 2**level)
                best = int(np.argmax(sums))
                size = 1.0 if values[best] == 0.0 else 2.0**level
                loose = _normal_isf(FALLBACK_TAIL / (sums.size * FALLBACK_LEVELS))
                if sums[best] >= loose * mech.sigma * math.sqrt(size):
                    weights = np.zeros_like(sums)
                    weights[best] = 1.0
                    break
            else:
                continue  # the unit around 0
        share = weights / weights.sum()  # exactly 1 on a single kept group
        largest = int(np.argmax(share))
        centre[j] = values[largest] + float(share @ (values - values[largest]))
        if share[values == 0.0].sum() < 1.0:  # not only the bin at 0: else the unit
            spread[j] = math.sqrt(float(share @ ((values - centre[j]) ** 2 + variances)))
    return Ranges(noisy, centre, spread, mech.sigma, mech.sensitivity)


def clipped(rows: np.ndarray, centre: np.ndarray, spread: np.ndarray, clip: float) -> np.ndarray:
    """``clip((x − centre)/spread, −c, c)``, clipping ``x`` to ``centre ± c·spread`` before
    dividing: finite for every finite ``x`` (no overflow, no warning), in ``rows``' dtype
    (NumPy or Dask arrays alike)."""
    rows = rows if hasattr(rows, "dtype") else np.asarray(rows)
    centre, spread = centre.astype(rows.dtype), spread.astype(rows.dtype)
    reach = spread * rows.dtype.type(clip)
    return (np.clip(rows, centre - reach, centre + reach) - centre) / spread


def standardise(rows: np.ndarray, location: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The rows the method reads: ``(x − location)/scale`` clipped to ±:data:`BOUND`, a
    row-wise map of public values (every later sensitivity argument holds as for ``x``);
    within ±BOUND exactly, whatever the rounding of the division."""
    return np.clip(clipped(rows, location, scale, BOUND), -BOUND, BOUND)


def clipped_moments(
    rows: np.ndarray, centre: np.ndarray, spread: np.ndarray, clip: float
) -> np.ndarray:
    """One block's 2D sums ``(Σ z/(2c), Σ z²/c²)``, z = clip((x − centre)/spread, −c, c)."""
    z = clipped(np.asarray(rows, dtype=np.float64), centre, spread, clip)
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
    mean_z = np.clip(2 * clip * noisy[:dim] / n_rows, -clip, clip)
    square_z = clip**2 * noisy[dim:] / n_rows
    variance = square_z - mean_z**2
    location = ranges.centre + ranges.spread * mean_z
    # The noise's standard deviation τ in the variance of z (σ on Σz²/c², and on Σz/(2c)
    # through z̄²). A variance above 2τ is read as measured; below, the round cannot tell it
    # from noise, and the spread it clipped around (1) is kept unless it lies above v + 4τ
    # (then that: the truth is above it in 3·10⁻⁵ of rounds): neither blown up nor shrunk to
    # the floor on noise alone.
    noise_sd = (clip**2 + 4 * clip * np.abs(mean_z)) * mech.sigma / n_rows
    unresolved = np.clip(1.0, VARIANCE_FLOOR, variance + 4 * noise_sd)
    plausible = np.where(variance > 2 * noise_sd, variance, unresolved)
    scale = ranges.spread * np.sqrt(np.clip(plausible, VARIANCE_FLOOR, clip**2))
    spread = scale
    refined = Ranges(ranges.counts, location, spread, ranges.sigma, ranges.sensitivity)
    return LocationScale(location, scale, refined, mech.sigma, mech.sensitivity)


def moments_sensitivity_bound(clip: float = CLIPS[0], points: int = 401) -> float:
    """max over z_a, z_b ∈ [−c, c] of one coordinate's squared move
    ((z_a − z_b)/(2c))² + ((z_a² − z_b²)/c²)², on a grid: ≤ 2 (the calibration's bound)."""
    z = np.linspace(-clip, clip, points)
    a, b = np.meshgrid(z, z)
    return float(np.max(((a - b) / (2 * clip)) ** 2 + ((a * a - b * b) / clip**2) ** 2))
