"""Private noisy power method (Hardt & Price 2014; Balcan, Du, Wang & Yu 2016): ``--method power``.

The algorithm (Hardt & Price 2014, "The noisy power method", Alg. 1, and its private instance
in §1.2): start from a public random ``D × k'`` matrix ``V₀`` with orthonormal
columns (``k' ≥ k``, the oversampled width); for ``t = 1 … T``

1. ``Y_t = C V_{t−1}`` with ``C = AᵀA`` the Gram matrix of the rows clipped to norm ≤ ``B`` and
   scaled by ``1/B`` (every row has norm ≤ 1), computed on the workers as ``Xᵀ diag(w) X V``
   with per-row weights ``w = m/max(‖x‖, B)²`` (:func:`dpsub_dist.engine.gram.clip_weights`,
   :mod:`dpsub_dist.methods.power`): ``D × k'`` numbers, never ``D × D``;
2. release ``Ŷ_t = Y_t + G_t``, ``G_t`` i.i.d. Gaussian (:meth:`PowerIterations.release`);
3. ``V_t = orth(Ŷ_t − n·μ̂(μ̂ᵀV_{t−1}))`` (QR; the centring term uses the released mean μ̂ only).

The output is the top-``k`` left singular vectors of the last release ``Ŷ_T − n·μ̂(μ̂ᵀV_{T−1})``
(a Rayleigh–Ritz step inside the span of ``V_T``), and their singular values estimate the top
eigenvalues of the centred ``C``. Everything after the noise is post-processing of released
values and of ``V_{t−1}`` (itself released), so it costs nothing. Where the runner fuses the
private bound's counting pass into the first iteration
(:meth:`dpsub_dist.methods.power.RowPasses.fused_first`), ``Y_1`` is computed from per-bin
sums after ``B`` is released, the same function of the rows and ``B`` up to float rounding:
nothing below changes.

**Privacy (sensitivity of one iteration).** Neighbours change ``C`` by ``E = C′ − C``:
replace one row ``a`` by ``b`` (row level) gives ``E = bbᵀ − aaᵀ`` with ``‖a‖, ‖b‖ ≤ 1``, so
``‖E‖_F² = ‖a‖⁴ + ‖b‖⁴ − 2(a·b)² ≤ 2``; adding or removing one row gives ``E = ±aaᵀ``,
``‖E‖_F ≤ 1``. The released quantity moves by ``EV`` and, ``V`` having orthonormal columns
(``‖V‖₂ = 1``), ``‖EV‖_F ≤ ‖E‖_F‖V‖₂ = ‖E‖_F``. For one row this is exact arithmetic:
``‖aaᵀV‖_F = ‖a‖·‖Vᵀa‖ ≤ ‖a‖² ≤ 1``. So the ℓ2 sensitivity of ``Y_t`` (all ``D·k'`` entries
together) is the same constant as the Gram matrix's Frobenius bound of Analyze Gauss —
:data:`dpsub_dist.privacy.covariance_noise.SENSITIVITY` ``.gram``: √2 replace-one, 1 add/remove
— whatever ``V_{t−1}`` is, because ``V_{t−1}`` is a function of earlier releases only
(adaptive composition). ``V₀`` is public randomness (the run's public seed), not DP noise.

**The clip in floating point.** The rows are never rounded after clipping: each row ``x`` (the
source's floats, float32 kept as float32) enters ``C`` as ``w·xxᵀ``, i.e. as the row
``a = √w·x``, with ``w = m/max(‖x‖, B)²`` computed in float64 (the norms too, for float32
rows) and ``m = 1 − 2⁻²⁴`` (:data:`dpsub_dist.engine.gram.CLIP_MARGIN`) covering the float64
rounding of ``‖x‖``, ``w`` and the user totals, so ``‖a‖² = w‖x‖² ≤ 1`` holds *exactly* for
the floats used, not only up to rounding (tests/methods/test_power.py checks it in rational
arithmetic on rows at the bound; a plain ``1/max(‖x‖, B)²`` exceeds 1 there by ~10⁻¹⁶, and
float32 rows clipped and then rounded would by ~10⁻⁷). What is not exact, here as in every
floating-point sum of this library, is the product's own rounding: float32 sources are
multiplied in float32 (relative error ≲ √D·2⁻²⁴ of the entries' magnitude per partition,
summed in float64), float64 sources in float64.

**User level** (``--unit-column``: neighbours add or remove all rows of one user). Every row
is clipped to ``B`` and scaled by ``1/B``, then all rows ``x_1 … x_m`` of one user are
multiplied by ``1/√max(1, Σ_r‖x_r‖²)`` (the same scaling as gauss's
:func:`dpsub_dist.engine.gram.user_scale`; here the row weight ``w`` is divided by
``max(1, Σ_r‖x_r‖²)``, and the margin ``m`` covers that total's rounding), so
``Σ_r‖x_r‖² ≤ 1``; the factor depends on that user's rows only, so the
other users' scaled rows are identical in both neighbours. The user changes ``C`` by
``E = ±Σ_r x_r x_rᵀ``, positive semidefinite with ``‖E‖_F ≤ tr E = Σ_r‖x_r‖² ≤ 1``, and the
release moves by ``EV`` with ``‖EV‖_F ≤ ‖E‖_F‖V‖₂ ≤ 1``: Δ = 1
(``SENSITIVITY["add_remove"].gram``), whatever ``V`` is and however many rows the user has.
Nothing else changes: ``σ = Δ/√(2ρ_it)`` and the composition below. The bound ``B`` is the
private user-level bound of gauss (a noisy user count, then the sparse vector over the users'
``√Σ‖x‖²``), charged as ``norm_bound``; ``n`` is private, so the eigenvalue estimates (which
divide by n) are not published and an empty input is released as ``C = 0`` plus noise.

**Composition (uneven split).** Iteration ``t`` adds ``N(0, σ_t²)`` to every entry with
``σ_t = Δ/√(2ρ_t)``: ``ρ_t``-zCDP (Bun & Steinke 2016, Prop. 1.6), and ``T`` adaptively
chosen iterations are ``(Σ_t ρ_t)``-zCDP (Lemma 2.3; each iteration's Gaussian at its own
σ_t, chosen before any data is read). The power step's ρ is split as
``ρ_t = ρ·g^(t−1)/Σ_s g^(s−1)`` with the public growth ``g =`` :data:`SPLIT_GROWTH`
(:func:`iteration_shares`; later iterations get more: an early iteration's noise is contracted
by the iterations after it, the last one's enters the output as it is), so ``Σ_t ρ_t = ρ``. A
zCDP run splits its power share ``ρ_power``; an (ε, δ) run converts its power share
``(ε_p, δ_p)`` to the largest ``ρ_p`` whose Canonne–Kamath–Steinke conversion at ``δ_p`` is at
most ``ε_p`` (:func:`rho_for`) and splits that, so the ``T`` iterations together are
``(ε_p, δ_p)``-DP. Either way the T iterations are charged once, as one step, by the mechanism
that holds the σ_t (:class:`PowerIterations`: its cost is ``Σ_t Δ²/(2σ_t²)``), and that same
object draws every iteration's noise (:func:`noisy_power_method`). The noise is drawn on the
power-of-two grid by :func:`dpsub_dist.privacy.noise.add_gaussian` (floating-point safe).

**Utility** (Hardt & Price 2014, Thm 1.1 and its private-PCA corollary, sharpened by
Balcan et al. 2016 to the gap between ``λ_k`` and ``λ_{q+1}`` for any ``k ≤ q ≤ k'``).
Write ``λ_i`` for the eigenvalues of the centred covariance of the clipped rows (input
units) and ``σ_it`` the per-entry noise std (the even split's ``Δ√(T/(2ρ))``; the uneven
split gives the last iterations less). If ``T = O(λ_k/(λ_k − λ_{q+1})·log(D/α))``
and the noise satisfies ``‖G_t‖₂ ≲ α·n(λ_k − λ_{q+1})/B²`` and ``‖U_kᵀG_t‖₂ ≲
n(λ_k − λ_{q+1})/B²·(√k' − √(q−1))/√D`` — with high probability
``‖G_t‖₂ ≈ σ_it(√D + √k')`` — then ``‖sin Θ(U_k, V_T)‖₂ ≤ α``. With
``σ_it = Δ√(T/(2ρ))`` this reads (up to constants and log factors)

    α ≈ B²·Δ·√(D·T/ρ) / (n·(λ_k − λ_{q+1})),   ρ ≈ ε²/(4 ln(1/δ)) for small ε,

that is: error growing like √D (not D as for Analyze Gauss' ``D × D`` noise), shrinking like
1/n and 1/ε, and governed by the *additive* gap ``λ_k − λ_{q+1}`` to an oversampled index:
a polynomially decaying spectrum has no multiplicative gap but ``λ_k − λ_{2k}`` is a constant
fraction of ``λ_k``. The captured variance ``tr(V̂ᵀΣV̂)`` loses at most ``α²·Σ_{i≤k}λ_i``
plus the tail mass inside the span (Balcan et al. 2016 §4).

Pure NumPy; DP noise only from :mod:`dpsub_dist.privacy.noise`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpsub_dist.privacy import mechanism, noise
from dpsub_dist.privacy.accountant import ZCDP, ApproxDP, Budget, gaussian_sigma, zcdp_epsilon
from dpsub_dist.privacy.covariance_noise import SENSITIVITY, Neighbours

SPLIT_GROWTH = 1.3
"""g: iteration t (1 … T) gets ρ·g^(t−1)/Σ_s g^(s−1) of the power step's ρ (module doc).
Simulated (power_sim, docs/history.md: λᵢ = i⁻², D = n = 10⁵, ε = 1, k = 3, T = 6, 5 runs,
docs/power.md "The defaults"): g = 1 (even), 1.3, 1.6, 2 captured 0.901, 0.911, 0.910, 0.901
of the top-3 variance with the other defaults (0.892, 0.903, 0.902, 0.888 with a 10% bound
share); at g = 2 the first iterations are too noisy to leave the random start."""


def product_sensitivity(relation: Neighbours) -> float:
    """ℓ2 sensitivity of ``C V`` for orthonormal ``V``: ``‖EV‖_F ≤ ‖E‖_F`` (module doc)."""
    return SENSITIVITY[relation].gram


def rho_for(grant: Budget) -> float:
    """zCDP ρ that the whole power step may spend under ``grant``.

    ZCDP → its ρ. (ε, δ) → the largest ρ (bisection to 1e-9 relative) with
    ``zcdp_epsilon(ρ, δ) ≤ ε`` (Canonne–Kamath–Steinke conversion): ρ-zCDP then implies the
    grant, so charging the grant covers all T iterations.
    """
    if isinstance(grant, ZCDP):
        return grant.rho
    if not isinstance(grant, ApproxDP) or not 0 < grant.delta < 1 or grant.epsilon <= 0:
        raise ValueError("the power method needs an (epsilon, delta) grant with delta in (0, 1)")
    low, high = 0.0, max(grant.epsilon, 1.0)
    while zcdp_epsilon(high, grant.delta) <= grant.epsilon:
        high *= 2.0
    while high - low > 1e-9 * high:
        mid = 0.5 * (low + high)
        if zcdp_epsilon(mid, grant.delta) <= grant.epsilon:
            low = mid
        else:
            high = mid
    if low <= 0.0:
        raise ValueError(f"no zCDP ρ > 0 fits {grant}: raise the budget")
    return low


def iteration_shares(iterations: int) -> tuple[float, ...]:
    """Each iteration's share of the power step's ρ: ``g^(t−1)/Σ_s g^(s−1)``, g =
    :data:`SPLIT_GROWTH` (public; they sum to 1)."""
    if iterations < 1:
        raise ValueError(f"iterations must be ≥ 1 (got {iterations})")
    weights = [SPLIT_GROWTH**t for t in range(iterations)]
    total = math.fsum(weights)
    return tuple(weight / total for weight in weights)


def iteration_grants(grant: Budget, iterations: int) -> tuple[ZCDP, ...]:
    """The zCDP budget of each iteration: ``ρ_t = ρ_power·share_t`` (composition, module doc);
    raises where no ρ fits ``grant``."""
    rho = rho_for(grant)
    return tuple(ZCDP(rho * share) for share in iteration_shares(iterations))


@dataclass(frozen=True)
class PowerIterations(mechanism.Composed):
    """The T Gaussian releases of ``C V``, iteration t by part t (σ_t, ℓ2 sensitivity Δ): its
    privacy map is zCDP composition, ρ = Σ_t Δ²/(2σ_t²) (Bun & Steinke 2016, Prop 1.6 and
    Lemma 2.3), stated as (ε, δ) by the CKS conversion at ``delta`` when the grant is (ε, δ).
    The run charges this object once and draws every iteration's noise with it
    (:func:`noisy_power_method`)."""

    parts: tuple[mechanism.Gaussian, ...]
    delta: float | None = None

    @property
    def sensitivity(self) -> float:
        return self.parts[0].sensitivity

    @property
    def sigmas(self) -> tuple[float, ...]:
        return tuple(part.sigma for part in self.parts)

    @property
    def iterations(self) -> int:
        return len(self.parts)

    @property
    def sigma(self) -> float:
        """The even split's σ for the same ρ: ``(mean_t σ_t⁻²)^(−1/2)`` (public; the bound's
        noise-matched quantile reads it)."""
        return math.sqrt(self.iterations / math.fsum(s**-2.0 for s in self.sigmas))

    def rhos(self) -> list[float]:
        """Each iteration's ρ_t = Δ²/(2σ_t²)."""
        return [self.sensitivity**2 / (2.0 * sigma**2) for sigma in self.sigmas]

    def cost(self) -> Budget:
        rho = math.fsum(self.rhos())
        if self.delta is None:
            return ZCDP(rho, 0.0)
        return ApproxDP(zcdp_epsilon(rho, self.delta), self.delta)

    def release(self, rng: np.random.Generator, product: np.ndarray, t: int) -> np.ndarray:
        """Iteration ``t``'s ``Y + G`` (t = 1 … T), ``G`` i.i.d. ``N_Z(0, σ_t²)`` on the grid."""
        return noise.add_gaussian(rng, product, self.sigmas[t - 1], self.sensitivity)


def power_mechanism(grant: Budget, iterations: int, relation: Neighbours) -> PowerIterations:
    """Step ``power``: T iterations, iteration t at ``ρ_t`` (:func:`iteration_grants`); raises
    where no ρ fits ``grant`` (before any read: the runner builds it first)."""
    sensitivity = product_sensitivity(relation)
    sigmas = tuple(gaussian_sigma(g, sensitivity) for g in iteration_grants(grant, iterations))
    delta = None if isinstance(grant, ZCDP) else grant.delta
    return PowerIterations(tuple(mechanism.Gaussian(sensitivity, s) for s in sigmas), delta)


def start_basis(dim: int, width: int, seed: int) -> np.ndarray:
    """Public ``V₀``: Haar-random orthonormal ``dim × width`` from the run's public seed."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(17,)))
    return orthonormalise(rng.standard_normal((dim, width)))


def orthonormalise(matrix: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the columns (thin QR, signs fixed by R's diagonal): post-processing."""
    q, r = np.linalg.qr(np.asarray(matrix, dtype=np.float64))
    signs = np.sign(np.diag(r))
    signs[signs == 0] = 1.0
    return q * signs


@dataclass(frozen=True)
class PowerRelease:
    """The released basis (``D × k``), its eigenvalue estimates (scaled units) and the noise
    (each iteration's σ_t and ρ_t)."""

    basis: np.ndarray
    values: np.ndarray
    sigmas: list[float]
    sensitivity: float
    rho_per_iteration: list[float]


def noisy_power_method(
    multiply: Callable[[np.ndarray, int], np.ndarray],
    start: np.ndarray,
    rank: int,
    steps: PowerIterations,
    rng: np.random.Generator,
    shift: Callable[[np.ndarray], np.ndarray] | None = None,
) -> PowerRelease:
    """Hardt & Price Alg. 1 with private releases (module doc), ``T = steps.iterations``.

    ``multiply(V, t)`` returns ``C V`` (exact, from the workers); iteration ``t``'s noise is
    drawn by ``steps`` (the mechanism its caller charged for all T iterations together);
    ``shift(V)`` (centring) returns ``n·μ̂(μ̂ᵀV)`` from the released mean, subtracted after
    the noise.
    """
    width = start.shape[1]
    if not 1 <= rank <= width:
        raise ValueError(f"rank must be in [1, {width}] (got {rank})")
    basis = start
    released = start
    for t in range(1, steps.iterations + 1):
        product = multiply(basis, t)
        released = steps.release(rng, np.asarray(product, dtype=np.float64), t)
        if shift is not None:
            released = released - shift(basis)
        if t < steps.iterations:
            basis = orthonormalise(released)
    left, values, _ = np.linalg.svd(released, full_matrices=False)  # Rayleigh–Ritz in span
    return PowerRelease(
        left[:, :rank],
        values[:rank],
        list(steps.sigmas),
        steps.sensitivity,
        steps.rhos(),
    )
