"""``--method power``: the private noisy power method (dpsub_dist/privacy/noisy_power.py,
docs/power.md).

Calibration of one iteration's noise, an empirical audit of one iteration with a planted
under-noised twin, composition across iterations against dp-accounting, utility on the
polynomial-spectrum model with a known answer, memory (nothing D×D), the CLI end to end and
the ``dpsub synth --model polynomial`` truth.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from privacy_audit import epsilon_lower_bound

from dpsub_dist import synth
from dpsub_dist.cli import main
from dpsub_dist.engine import gram, row_cache
from dpsub_dist.engine.assign import UnitIds
from dpsub_dist.engine.gram import clip_rows, user_squared_norms
from dpsub_dist.engine.sources import array_dataset, load_native, parquet_dataset
from dpsub_dist.errors import DataError, InputError
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error
from dpsub_dist.methods import _centring as centring
from dpsub_dist.methods import gauss as covariance
from dpsub_dist.methods import power as runner
from dpsub_dist.params import DEFAULT_ITERATIONS
from dpsub_dist.privacy import noise
from dpsub_dist.privacy import noisy_power as power
from dpsub_dist.privacy.accountant import ZCDP, ApproxDP, gaussian_sigma, zcdp_epsilon

SQRT2 = math.sqrt(2.0)  # ‖aaᵀV − bbᵀV‖_F ≤ ‖aaᵀ − bbᵀ‖_F ≤ √2 for unit a, b (replace one row)


def _zero_product(dim: int, width: int):
    return lambda basis, t: np.zeros((dim, width))


# --- calibration ------------------------------------------------------------------------------


@pytest.mark.parametrize("relation,delta_y", [("replace", SQRT2), ("add_remove", 1.0)])
def test_each_iteration_draws_sigma_t_for_its_share_of_rho(relation, delta_y) -> None:
    """T iterations of a ρ-zCDP grant: T draws of D·k' values, draw t at σ_t = Δ/√(2ρ_t) with
    ρ_t = ρ·g^(t−1)/Σ_s g^(s−1) (g = SPLIT_GROWTH > 1: later iterations less noise), Σ ρ_t = ρ."""
    dim, width, steps, rho = 30, 4, 5, 0.2
    start = power.start_basis(dim, width, seed=1)
    mechanism = power.power_mechanism(ZCDP(rho), steps, relation)
    with noise.draw_log() as log:
        release = power.noisy_power_method(
            _zero_product(dim, width), start, 2, mechanism, np.random.default_rng(0)
        )
    growth = power.SPLIT_GROWTH
    assert growth > 1
    rhos = [rho * growth**t / sum(growth**s for s in range(steps)) for t in range(steps)]
    sigmas = [delta_y / math.sqrt(2 * r) for r in rhos]
    assert [(d.kind, d.size, d.sensitivity) for d in log] == [
        ("gaussian", dim * width, delta_y)
    ] * 5
    assert [d.scale for d in log] == pytest.approx(sigmas, rel=1e-12)
    assert release.sigmas == pytest.approx(sigmas, rel=1e-12)
    assert release.rho_per_iteration == pytest.approx(rhos, rel=1e-12)
    assert math.fsum(release.rho_per_iteration) == pytest.approx(rho, rel=1e-12)
    assert mechanism.cost().rho == pytest.approx(rho, rel=1e-12)
    assert mechanism.sigma == pytest.approx(delta_y / math.sqrt(2 * rho / steps), rel=1e-12)
    assert release.basis.shape == (dim, 2)
    assert np.allclose(release.basis.T @ release.basis, np.eye(2))


def test_each_iterate_is_the_orthonormalised_release_not_the_exact_product() -> None:
    """Adaptive composition holds only if ``V_t`` is a function of the releases: iteration
    t + 1 multiplies ``orth(Ŷ_t)``, the noisy release (its value plus the drawn noise), never
    the exact ``C V_t`` (which would reach the next release, and the output, un-noised)."""
    dim, width, steps = 12, 3, 4
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((200, dim)) * np.linspace(3.0, 0.5, dim)
    gram_matrix = rows.T @ rows / 200
    multiplied: list[np.ndarray] = []

    def multiply(basis: np.ndarray, t: int) -> np.ndarray:
        multiplied.append(basis)
        return gram_matrix @ basis

    start = power.start_basis(dim, width, seed=2)
    with noise.draw_log() as log:
        power.noisy_power_method(
            multiply, start, 2, power.power_mechanism(ZCDP(0.5), steps, "replace"), rng
        )
    released = [d.value + d.grid * d.integers.reshape(d.shape) for d in log]
    assert len(released) == steps and np.array_equal(multiplied[0], start)
    for t in range(1, steps):
        np.testing.assert_allclose(multiplied[t], power.orthonormalise(released[t - 1]))
        exact = power.orthonormalise(gram_matrix @ multiplied[t - 1])
        assert not np.allclose(multiplied[t], exact, atol=1e-3)  # the noise is visible


def _same_plan(plan: dict, expected: dict) -> None:
    assert list(plan) == list(expected)
    assert all(plan[step] == pytest.approx(shares) for step, shares in expected.items())
    assert math.fsum(p for p, _ in plan.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("zcdp", [False, True])
def test_plan_gives_the_private_bound_powers_own_share(zcdp) -> None:
    """Power's plan: its bound share (NORM_SHARE, not gauss's), halved between the two bounds
    when centring, the mean's share of the rest, the power step the remainder; ε (or ρ)
    shares sum to 1, δ goes to the Gaussians only (none under zCDP)."""
    share, mean = runner.NORM_SHARE, centring.MEAN_SHARE
    assert share < covariance.NORM_SHARE
    delta = 0.0 if zcdp else 1.0
    plan = runner.budget_plan(False, zcdp, True)
    _same_plan(plan, {"norm_bound": (share, 0.0), "power": (1 - share, delta)})
    centred = {
        "norm_bound": (share / 2, 0.0),
        "mean": (mean * (1 - share), mean * delta),
        "centred_norm_bound": (share / 2, 0.0),
        "power": ((1 - mean) * (1 - share), (1 - mean) * delta),
    }
    _same_plan(runner.budget_plan(True, zcdp, True), centred)
    _same_plan(runner.budget_plan(False, zcdp, False), {"power": (1.0, delta)})


def test_one_iteration_noise_has_the_calibrated_spread() -> None:
    """The released noise (on the grid) has standard deviation σ, mean 0."""
    one = power.power_mechanism(ZCDP(0.05), 1, "replace")
    released = one.release(np.random.default_rng(2), np.zeros((400, 50)), 1)
    sigma = SQRT2 / math.sqrt(0.1)
    assert abs(released.mean()) < 5 * sigma / math.sqrt(released.size)
    assert released.std() == pytest.approx(sigma, rel=0.01)


@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-6), (1.0, 1e-6), (4.0, 1e-9)])
def test_approx_dp_grant_converts_to_the_largest_rho_that_fits(epsilon, delta) -> None:
    rho = power.rho_for(ApproxDP(epsilon, delta))
    assert zcdp_epsilon(rho, delta) <= epsilon
    assert zcdp_epsilon(rho * (1 + 1e-6), delta) > epsilon


def test_sensitivity_of_one_row_contribution_is_the_frobenius_bound() -> None:
    """‖aaᵀV − bbᵀV‖_F ≤ √2 over random unit rows and orthonormal V, and √2 is reached."""
    rng = np.random.default_rng(3)
    worst = 0.0
    for _ in range(2000):
        basis = power.orthonormalise(rng.standard_normal((6, 3)))
        a, b = (v / np.linalg.norm(v) for v in rng.standard_normal((2, 6)))
        worst = max(worst, np.linalg.norm(np.outer(a, a @ basis) - np.outer(b, b @ basis)))
    assert worst <= SQRT2 + 1e-12
    basis = np.eye(6)[:, :3]
    e1, e2 = basis[:, 0], basis[:, 1]
    reached = np.linalg.norm(np.outer(e1, e1 @ basis) - np.outer(e2, e2 @ basis))
    assert reached == pytest.approx(power.product_sensitivity("replace")) == pytest.approx(SQRT2)
    assert power.product_sensitivity("add_remove") == 1.0


# --- audit ------------------------------------------------------------------------------------

AUDIT_EPSILON, AUDIT_DELTA = 2.0, 1e-5
AUDIT_RUNS = 200_000
"""One iteration at (ε, δ) = (2, 1e-5); planned with the Gaussian tails: honest bound ≈ 1.2,
half-noise twin ≈ 2.6 at a threshold 3.5 twin-σ out, over 2·10⁵ runs per input."""


def test_one_iteration_audit_catches_half_noise(monkeypatch) -> None:
    """Replace row e₁ by e₂ with V = I₂: C·V moves by diag(−1, 1), norm √2 = Δ.

    The mechanism is the run's own chain for one iteration: the rows clipped as on a worker,
    ``Xᵀ(XV)`` (methods.power) and the noise of an (ε, δ) grant converted to ρ
    (privacy.noisy_power). The runs are drawn as one stack of independent copies of the
    ``2 × 2`` release (the noise is i.i.d. per entry), so 2·10⁵ runs take a second.
    """
    grant = power.iteration_grants(ApproxDP(AUDIT_EPSILON, AUDIT_DELTA), 1)[0]
    factor = {"value": 1.0}
    real = gaussian_sigma
    monkeypatch.setattr(power, "gaussian_sigma", lambda g, s: factor["value"] * real(g, s))
    rng = np.random.default_rng(12345)
    basis = np.eye(2)

    def hits(rows: np.ndarray, threshold: float) -> int:
        product = runner._product(clip_rows(rows, 1.0), basis)
        stack = np.broadcast_to(product, (AUDIT_RUNS, 2, 2))
        one = power.power_mechanism(ApproxDP(AUDIT_EPSILON, AUDIT_DELTA), 1, "replace")
        released = one.release(rng, stack, 1)
        return int(np.count_nonzero(released[:, 0, 0] - released[:, 1, 1] > threshold))

    def bound(value: float) -> float:
        factor["value"] = value
        threshold = -1.0 + 3.5 * SQRT2 * real(grant, SQRT2) / 2  # 3.5 σ of the twin's Y₁₁ − Y₂₂
        a, b = hits(np.array([[1.0, 0.0]]), threshold), hits(np.array([[0.0, 1.0]]), threshold)
        return epsilon_lower_bound(a, b, AUDIT_RUNS, AUDIT_DELTA, 0.95)

    honest, twin = bound(1.0), bound(0.5)
    assert honest < AUDIT_EPSILON < twin, (honest, twin)


# --- clipping weights and float32 rows --------------------------------------------------------


def _exact_squared_norm(row: np.ndarray) -> Fraction:
    return sum((Fraction(float(v)) ** 2 for v in row), Fraction(0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_weights_keep_rows_at_the_bound_inside_the_unit_ball_exactly(dtype) -> None:
    """Rows whose norm is the bound (rounded to the dtype: on either side of it), above it and
    below it: every weighted row's squared norm ``w‖x‖²`` is ≤ 1 in exact rational arithmetic
    of the floats used (a plain ``1/max(‖x‖, B)²`` exceeds 1 on some of these rows)."""
    rng = np.random.default_rng(5)
    bound = 3.0
    directions = rng.standard_normal((120, 200))
    at_bound = directions * (bound / np.linalg.norm(directions, axis=1))[:, None]
    rows = np.vstack(
        [at_bound, 10 * at_bound[:20], 0.5 * at_bound[:20], [[bound] + [0.0] * 199]]
    ).astype(dtype)
    used, weights = gram.clip_weights(rows, bound)
    assert weights.dtype == np.float64 and used is rows
    pairs = zip(weights, rows, strict=True)
    exact = [Fraction(float(w)) * _exact_squared_norm(row) for w, row in pairs]
    assert max(exact) <= 1
    assert float(max(exact)) > 1 - 1e-7  # the margin is tiny: the rows at the bound stay ~1
    plain = [
        Fraction(float(1.0 / np.maximum(np.linalg.norm(r.astype(np.float64)), bound) ** 2))
        * _exact_squared_norm(r)
        for r in rows
    ]
    assert max(plain) > 1  # what the margin is for


@pytest.mark.filterwarnings("error")
def test_clip_weights_of_huge_rows_are_their_clipped_rows_without_overflow() -> None:
    """Rows of norm 1e200 and of entries 1e308 (norm inf in float64): the rows and weights
    used give the Gram matrix and the product of the rows clipped to the bound (their
    directions), ``w‖x‖² ≤ 1``, and no overflow warning (a one-bit channel on stderr)."""
    rng = np.random.default_rng(6)
    rows = rng.standard_normal((50, 6))
    rows[3] *= 1e200 / np.linalg.norm(rows[3])
    rows[7] = 1e308
    bound, basis = 2.0, np.linalg.qr(rng.standard_normal((6, 2)))[0]
    used, weights = gram.clip_weights(rows, bound)
    assert rows[7, 0] == 1e308 and np.isfinite(used).all() and np.isfinite(weights).all()
    clipped = gram.clip_rows(rows, bound)
    for huge in (3, 7):  # clipped: the direction (norm 1 after the 1/bound scaling)
        direction = rows[huge] / np.abs(rows[huge]).max()
        clipped[huge] = direction / np.linalg.norm(direction)
    want = clipped.T @ clipped
    assert np.allclose((used * weights[:, None]).T @ used, want, rtol=1e-6, atol=1e-12)
    assert np.allclose(runner._product(used, basis, weights), want @ basis, rtol=1e-6)
    exact = [
        Fraction(float(w)) * _exact_squared_norm(r) for w, r in zip(weights, used, strict=True)
    ]
    assert max(exact) <= 1


def test_float32_rows_give_the_float64_product_within_1e_5() -> None:
    """A float32 source stays float32 (no float64 copy of the rows: SGEMM) and its partition
    product ``Xᵀ diag(w) X V`` agrees with the float64 product of the same values to 10⁻⁵ of
    the largest entry (float32 rounding, ≲ √D·2⁻²⁴); both equal the clipped rows' ``Zᵀ(Z V)``."""
    rng = np.random.default_rng(11)
    dim, width, bound = 3000, 11, 4.0
    rows32 = (rng.standard_normal((500, dim)) * np.arange(1, dim + 1) ** -0.5).astype(np.float32)
    basis = power.orthonormalise(rng.standard_normal((dim, width)))
    loaded, _ = load_native(array_dataset(rows32).loader, rows32)
    assert loaded.dtype == np.float32 and np.shares_memory(loaded, rows32)  # no copy
    product32 = runner._load_product(array_dataset(rows32).loader, bound, rows32, None, basis)
    rows64 = rows32.astype(np.float64)
    product64 = runner._load_product(array_dataset(rows64).loader, bound, rows64, None, basis)
    clipped = clip_rows(rows64, bound)
    reference = clipped.T @ (clipped @ basis)
    scale = np.abs(reference).max()
    assert product32.dtype == np.float64
    assert np.abs(product32 - reference).max() <= 1e-5 * scale
    assert np.abs(product64 - reference).max() <= 1e-7 * scale  # only the 2⁻²⁴ margin
    assert np.abs(product32 - product64).max() > 0  # it did run in float32


def test_native_loaders_keep_float32_and_refuse_nan() -> None:
    """The array loader's native rows: float32 as is, other types as float64, NaN refused;
    centred: float32 rows minus the float32-rounded mean, the caller's array untouched."""
    block32 = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    loader = array_dataset(block32).loader
    assert load_native(loader, block32)[0].dtype == np.float32
    assert load_native(loader, block32.astype(np.int64))[0].dtype == np.float64
    assert loader(block32)[0].dtype == np.float64  # the Loader contract is unchanged
    for bad in (np.nan, np.inf):
        with pytest.raises(DataError, match="column x1 has 1 NaN or infinite"):
            load_native(loader, np.array([[1.0, bad], [1.0, 2.0]], dtype=np.float32))
    huge = np.array([[1e308, 1e308]])  # finite, though its row sum overflows: accepted
    assert np.array_equal(load_native(loader, huge)[0], huge)
    before = block32.copy()
    centred, _ = load_native(centring.CentredLoader(loader, np.array([1.0, 1.0])), block32)
    assert centred.dtype == np.float32 and np.array_equal(centred, block32 - 1)
    assert np.array_equal(block32, before)


# --- user level -------------------------------------------------------------------------------


def _user_loader(rows: np.ndarray, users: list[int]):
    """An in-memory loader of one partition whose rows belong to ``users`` (canonical ids)."""
    ids = np.asarray(users)
    distinct, inverse = np.unique(ids, return_inverse=True)
    keys = np.array([f"i:{u}".encode() for u in distinct], dtype=object)
    return lambda part: (rows, UnitIds(keys, inverse.astype(np.int64)))


def _user_rows(rows: np.ndarray, users: list[int], bound: float, scaled: bool = True):
    """The rows a worker multiplies at user level: clipped, scaled by 1/B and (unless the
    planted bug drops it) each user's rows scaled jointly to Σ‖x‖² ≤ 1 (methods.power)."""
    loader = _user_loader(rows, users)
    totals = user_squared_norms(loader, bound, 0) if scaled else None
    rows, weights = runner._load_weighted(loader, bound, 0, totals)
    return rows * np.sqrt(weights)[:, None]  # the rows whose Σ xxᵀ the worker's weights give


def test_user_level_contribution_moves_the_product_by_at_most_one() -> None:
    """Add/remove one user (any number of rows, any norms): ‖E V‖_F ≤ 1 for E the user's
    Σ x xᵀ after the per-user scaling, over random users and orthonormal V; reached by a user
    with two rows e₁ (the unscaled sum would be 2)."""
    rng = np.random.default_rng(7)
    worst = 0.0
    for _ in range(500):
        m = int(rng.integers(1, 30))
        rows = rng.standard_normal((m, 6)) * rng.exponential(3.0, size=(m, 1))
        scaled = _user_rows(rows, [4] * m, bound=2.0)
        basis = power.orthonormalise(rng.standard_normal((6, 3)))
        worst = max(worst, np.linalg.norm(scaled.T @ (scaled @ basis)))
    assert worst <= 1.0 + 1e-12
    twice = _user_rows(np.array([[1.0, 0.0], [1.0, 0.0]]), [9, 9], bound=1.0)
    assert np.linalg.norm(runner._product(twice, np.eye(2))) == pytest.approx(1.0)
    assert power.product_sensitivity("add_remove") == 1.0
    unscaled = _user_rows(np.array([[1.0, 0.0], [1.0, 0.0]]), [9, 9], 1.0, scaled=False)
    assert np.linalg.norm(runner._product(unscaled, np.eye(2))) == pytest.approx(2.0)


def _user_audit(runs: int) -> tuple[float, float]:
    """(honest, twin) ε lower bounds of one iteration at user level (module-level audit doc)."""
    grant = power.iteration_grants(ApproxDP(AUDIT_EPSILON, AUDIT_DELTA), 1)[0]
    sensitivity = power.product_sensitivity("add_remove")
    sigma = gaussian_sigma(grant, sensitivity)
    rng = np.random.default_rng(2024)
    basis = np.eye(2)
    smaller = (np.array([[0.0, 1.0]]), [1])
    larger = (np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]), [1, 2, 2])  # + user 2: e₁, e₁
    threshold = 3.5 * sigma  # Y₁₁: mean 0 (smaller), 1 (larger; the twin: 2)

    def hits(data: tuple[np.ndarray, list[int]], scaled: bool) -> int:
        product = runner._product(_user_rows(*data, bound=1.0, scaled=scaled), basis)
        stack = np.broadcast_to(product, (runs, 2, 2))
        one = power.power_mechanism(ApproxDP(AUDIT_EPSILON, AUDIT_DELTA), 1, "add_remove")
        released = one.release(rng, stack, 1)
        return int(np.count_nonzero(released[:, 0, 0] > threshold))

    def bound(scaled: bool) -> float:
        a, b = hits(smaller, scaled), hits(larger, scaled)
        return epsilon_lower_bound(a, b, runs, AUDIT_DELTA, 0.95)

    return bound(True), bound(False)


def test_user_level_audit_catches_a_missing_per_user_scaling() -> None:
    """Neighbours differing in one user's rows: {u₁: e₂} and {u₁: e₂, u₂: e₁, e₁}, V = I₂.

    The chain is the run's own for one iteration at user level (rows clipped, each user's
    rows scaled jointly as on a worker, ``Xᵀ(XV)``, the noise of Δ = 1). The planted twin
    forgets the per-user scaling: user u₂ then moves ``C·V`` by 2 under noise calibrated for
    Δ = 1, an under-noised release the audit must catch (the same design as the row-level
    audit above: honest bound ≈ 1.2, twin ≈ 2.6 at 2·10⁵ runs)."""
    honest, twin = _user_audit(AUDIT_RUNS)
    assert honest < AUDIT_EPSILON < twin, (honest, twin)


@pytest.mark.slow
def test_user_level_audit_with_more_runs() -> None:
    """The same audit over 2·10⁶ runs per input: the twin's bound rises, the honest one stays
    below the claim."""
    honest, twin = _user_audit(10 * AUDIT_RUNS)
    assert honest < AUDIT_EPSILON < twin, (honest, twin)


def _user_table(path: Path, rows: np.ndarray, users: np.ndarray) -> Path:
    columns = {f"x{j}": rows[:, j] for j in range(rows.shape[1])}
    pq.write_table(pa.table({**columns, "user": users}), path)
    return path


def test_user_level_run_scales_users_and_publishes_nothing_from_n(tmp_path) -> None:
    """End to end at user level, private bound: steps norm_bound then power, every draw at
    Δ = 1 with σ_t = 1/√(2ρ_t), no n, no eigenvalue estimates (they divide by n); the top
    direction of a 1/i² spectrum is found."""
    rng = np.random.default_rng(8)
    rows = rng.standard_normal((20_000, 30)) * np.arange(1, 31) ** -1.0
    source = _user_table(tmp_path / "u.parquet", rows, rng.integers(0, 4000, 20_000))
    config = EstimateConfig(
        rank=2, method="power", epsilon=2.0, delta=1e-6, unit_column="user", iterations=3
    )
    with noise.draw_log() as log:
        result = run_estimate(
            config, lambda client: parquet_dataset(str(source), None, "user", None, client), None
        )
    manifest = result.manifest
    assert [s["step"] for s in manifest["privacy"]["budget"]["steps"]] == ["norm_bound", "power"]
    gaussians = [d for d in log if d.kind == "gaussian"]
    rho_it = manifest["release"]["rho_per_iteration"]
    assert len(gaussians) == 3 == len(rho_it)
    assert all(d.sensitivity == 1.0 for d in gaussians)
    assert [d.scale for d in gaussians] == pytest.approx([1 / math.sqrt(2 * r) for r in rho_it])
    assert manifest["release"]["noise_sigma"] == pytest.approx([d.scale for d in gaussians])
    assert manifest["n_rows"] is None and "partitions" not in manifest["parameters"]
    assert manifest["release"]["explained_variance"] is None
    assert manifest["parameters"]["row_norm_source"].startswith("private at user level")
    assert abs(result.basis[0, 0]) > 0.95  # e₁, the top eigenvector


# --- runs -------------------------------------------------------------------------------------


def _polynomial(tmp_path: Path, rows: int, dim: int, rank: int, decay: float, **kw):
    return synth.generate(
        tmp_path / f"poly-{rows}-{dim}",
        rows=rows,
        dim=dim,
        rank=rank,
        model="polynomial",
        decay=decay,
        seed=5,
        **kw,
    )


def _rows(path: Path) -> np.ndarray:
    dataset = parquet_dataset(str(path), None, None, None, None)
    return np.vstack([dataset.loader(part)[0] for part in dataset.parts]).astype(np.float64)


def _open(path: Path):
    return lambda client: parquet_dataset(str(path), None, None, None, client)


def test_composition_matches_dp_accounting(tmp_path) -> None:
    """The T Gaussians actually drawn (each at its own σ_t) spend exactly the power step's ρ,
    split as documented (ρ_t = ρ·g^(t−1)/Σ g^(s−1), in iteration order) and as the manifest
    states; they compose (zCDP) to the (ε, δ) that dp-accounting's RDP accountant gives for
    them; under an (ε, δ) total they are within the power step's (ε_p, δ_p) by dp-accounting
    too. A split whose shares do not sum to 1, or out of order, or a σ_t other than the one
    stated, fails here."""
    dp_accounting = pytest.importorskip("dp_accounting")
    data = _polynomial(tmp_path, 2000, 12, 2, 1.0)

    def run(**budget):
        config = EstimateConfig(
            rank=2, method="power", row_norm=2.0, iterations=7, oversample=2, **budget
        )
        with noise.draw_log() as log:
            result = run_estimate(config, _open(data.path), None)
        return result.manifest, [d.scale / d.sensitivity for d in log]

    def rdp_epsilon(multipliers, delta):
        acc = dp_accounting.rdp.RdpAccountant()
        for z in multipliers:
            acc.compose(dp_accounting.GaussianDpEvent(z))
        return acc.get_epsilon(delta)

    manifest, multipliers = run(rho=0.7, delta=1e-6)
    budget = manifest["privacy"]["budget"]
    (step,) = budget["steps"]  # one step: its mechanism states the T iterations' composition
    assert step["step"] == "power" and step["rho"] == pytest.approx(0.7)
    assert len(multipliers) == 7 and manifest["parameters"]["passes"] == 7
    drawn = [1 / (2 * z**2) for z in multipliers]  # ρ_t = Δ²/(2σ_t²) of each draw
    assert drawn == pytest.approx(manifest["release"]["rho_per_iteration"], rel=1e-9)
    assert math.fsum(drawn) == pytest.approx(0.7, rel=1e-9)
    growth = power.SPLIT_GROWTH
    assert drawn == pytest.approx(
        [0.7 * growth**t / sum(growth**s for s in range(7)) for t in range(7)], rel=1e-9
    )
    ours = budget["spent_as_approx_dp"]["epsilon"]
    theirs = rdp_epsilon(multipliers, budget["conversion_delta"])
    assert ours <= theirs * (1 + 1e-6) and ours >= theirs / 1.1

    manifest, multipliers = run(epsilon=1.0, delta=1e-6)
    (step,) = manifest["privacy"]["budget"]["steps"]
    assert step["step"] == "power" and step["epsilon"] == pytest.approx(1.0)
    assert len(multipliers) == 7
    assert rdp_epsilon(multipliers, step["delta"]) <= 1.0 * 1.1  # RDP grid is a bit looser
    drawn = math.fsum(1 / (2 * z**2) for z in multipliers)
    assert drawn == pytest.approx(power.rho_for(ApproxDP(1.0, 1e-6)), rel=1e-9)
    assert zcdp_epsilon(drawn, step["delta"]) <= 1.0


def test_huge_budget_recovers_the_exact_top_k(tmp_path) -> None:
    """Known answer: with negligible noise the method returns the non-private top-k
    eigenvectors of the centred rows' Gram matrix: rows centred by the mean of the rows clipped
    to the bound, then clipped to it themselves (docs/centring.md)."""
    data = _polynomial(tmp_path, 3000, 40, 3, 1.5)
    raw = _rows(data.path)
    mean = (clip_rows(raw, 3.0) * 3.0).mean(axis=0)
    rows = clip_rows(raw - mean, 3.0) * 3.0
    centred = rows
    exact = np.linalg.eigh(centred.T @ centred)[1][:, ::-1][:, :3]
    config = EstimateConfig(
        rank=3,
        method="power",
        rho=1e18,
        delta=1e-6,
        row_norm=3.0,
        center=True,
        iterations=30,
    )
    result = run_estimate(config, _open(data.path), None)
    assert subspace_error(result.basis, exact) < 1e-6
    values = np.linalg.eigvalsh(centred.T @ centred / len(rows))[::-1][:3]
    assert np.allclose(result.manifest["release"]["explained_variance"], values, rtol=1e-6)


def captured_variance(basis: np.ndarray, truth: np.ndarray, spectrum: np.ndarray) -> float:
    """tr(V̂ᵀΣV̂)/Σ_{i≤k}λᵢ with Σ the population covariance: Σ's top-k part from the truth
    and the tail bounded by λ_{k+1} (a lower bound on the true ratio)."""
    k = truth.shape[1]
    top = np.sum(spectrum[:k] * np.sum((truth.T @ basis) ** 2, axis=1))
    return float(top / spectrum[:k].sum())


def test_utility_on_a_polynomial_spectrum(tmp_path) -> None:
    """λᵢ = i⁻², D = 300, n = 40 000, ε = 1: ≥ 90% of the top-3 variance captured (measured
    ≈ 0.97), where the spectrum has no multiplicative gap (λ₄/λ₃ = 0.56)."""
    data = _polynomial(tmp_path, 40_000, 300, 3, 2.0)
    spectrum = np.load(data.truth_dir / "spectrum.npy")
    config = EstimateConfig(rank=3, method="power", epsilon=1.0, delta=1e-6)
    result = run_estimate(config, _open(data.path), None)
    assert captured_variance(result.basis, data.load_basis(), spectrum) >= 0.9
    assert result.manifest["parameters"]["passes"] == DEFAULT_ITERATIONS  # C·V passes


def test_nothing_d_by_d_is_formed(tmp_path, monkeypatch) -> None:
    """D = 20 000 (a D×D float64 matrix is 3.2 GB): only D×k' arrays are gathered, and the
    whole run's peak traced memory stays far below one D×D matrix."""
    dim, width = 20_000, 5
    data = _polynomial(tmp_path, 200, dim, 2, 1.0, vector_column=True)
    shapes: list[tuple[int, ...]] = []
    real = runner.RowPasses.__call__

    def gathered(self, basis):
        shapes.append(basis.shape)  # what the workers get…
        product = real(self, basis)
        shapes.append(product.shape)  # … and what reaches the driver
        return product

    monkeypatch.setattr(runner.RowPasses, "__call__", gathered)
    config = EstimateConfig(
        rank=2, method="power", rho=1.0, delta=1e-6, row_norm=5.0, iterations=3, oversample=3
    )
    tracemalloc.start()
    try:
        result = run_estimate(config, _open(data.path), None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert shapes == [(dim, width)] * 6
    assert result.manifest["summary_bytes_gathered"] == 3 * dim * width * 8
    assert peak < 0.1 * dim * dim * 8, peak


def test_cached_and_streamed_passes_release_the_same_basis(tmp_path, dask_client, monkeypatch):
    """On the cluster: rows cached on the workers, or re-read every pass, same release."""
    data = _polynomial(tmp_path, 4000, 30, 2, 1.0, partitions=3)
    config = EstimateConfig(rank=2, method="power", rho=0.5, delta=1e-6, row_norm=3.0, seed=3)
    cached = run_estimate(config, _open(data.path), dask_client, noise_seed=11)
    monkeypatch.setattr(row_cache, "CACHE_FRACTION", 0.0)
    streamed = run_estimate(config, _open(data.path), dask_client, noise_seed=11)
    assert cached.timings["cached_rows"] and not streamed.timings["cached_rows"]
    assert np.allclose(cached.basis, streamed.basis, atol=1e-9)


def test_user_level_passes_agree_on_the_cluster_and_in_process(tmp_path, dask_client, monkeypatch):
    """User level: the per-user table persisted on the workers, rows cached or re-read every
    pass, and the in-process run release the same basis (one user's rows span partitions)."""
    rng = np.random.default_rng(12)
    rows = rng.standard_normal((6000, 20)) * np.arange(1, 21) ** -1.0
    users = rng.integers(0, 300, 6000)
    (tmp_path / "parts").mkdir()
    (tmp_path / "one").mkdir()
    for part in range(3):
        block = slice(2000 * part, 2000 * (part + 1))
        _user_table(tmp_path / "parts" / f"{part}.parquet", rows[block], users[block])
    _user_table(tmp_path / "one" / "all.parquet", rows, users)
    config = EstimateConfig(
        rank=2, method="power", rho=0.5, delta=1e-6, row_norm=2.0, unit_column="user", seed=3
    )

    def run(client, folder="parts"):
        path = str(tmp_path / folder)
        opener = lambda c: parquet_dataset(path, None, "user", None, c)  # noqa: E731
        return run_estimate(config, opener, client, noise_seed=11)

    whole, local, cached = run(None, "one"), run(None), run(dask_client)
    monkeypatch.setattr(row_cache, "CACHE_FRACTION", 0.0)
    streamed = run(dask_client)
    assert cached.timings["cached_rows"] and not streamed.timings["cached_rows"]
    for other in (streamed, local, whole):  # whole: a user scaled by all its rows, not per file
        assert np.allclose(cached.basis, other.basis, atol=1e-9)


def test_cli_end_to_end(tmp_path, scheduler_address, capsys) -> None:
    data = tmp_path / "poly"
    assert (
        main(
            [
                "synth",
                str(data),
                "--rows",
                "5000",
                "--dim",
                "60",
                "--rank",
                "2",
                "--model",
                "polynomial",
                "--decay",
                "2",
                "--quiet",
            ]
        )
        == 0
    )
    out = tmp_path / "run"
    argv = [
        "estimate",
        str(data),
        "--out",
        str(out),
        "--rank",
        "2",
        "--method",
        "power",
        "--epsilon",
        "2",
        "--delta",
        "1e-6",
        "--iterations",
        "4",
        "--oversample",
        "3",
        "--center",
        "--quiet",
        "--scheduler",
        scheduler_address,
    ]
    assert main(argv) == 0
    basis = np.load(out / "basis.npy")
    manifest = json.loads((out / "manifest.json").read_text())
    assert basis.shape == (60, 2) and manifest["method"] == "power"
    params = manifest["parameters"]
    assert (params["iterations"], params["width"], params["passes"]) == (4, 5, 4)
    steps = [s["step"] for s in manifest["privacy"]["budget"]["steps"]]
    assert steps == ["norm_bound", "mean", "centred_norm_bound", "power"]
    assert manifest["privacy"]["budget"]["spent"]["epsilon"] == pytest.approx(2.0)
    spectrum = np.load(data / "_truth" / "spectrum.npy")
    assert captured_variance(basis, synth.read_truth(data)[0], spectrum) > 0.6, manifest


@pytest.mark.parametrize(
    "change,message",
    [
        ({"iterations": 0}, "--iterations must be an integer ≥ 1"),
        ({"oversample": -1}, "--oversample must be an integer ≥ 0"),
        ({"unit_column": "user", "center": True}, "--center is row level only"),
        ({"method": "gauss", "iterations": 3}, "--iterations does not apply to --method gauss"),
        ({"subsets": 10}, "--subsets does not apply to --method power"),
    ],
)
def test_bad_parameters_are_refused_before_reading(change, message) -> None:
    config = EstimateConfig(**{"rank": 2, "method": "power", "epsilon": 1, "delta": 1e-6, **change})
    with pytest.raises(InputError, match=message):
        run_estimate(config, lambda client: pytest.fail("read before refusing"), None)


def test_cli_refusal_is_exit_2(tmp_path, capsys) -> None:
    """A refusal from public parameters: exit 2, nothing written."""
    out = tmp_path / "run"
    code = main(
        [
            "estimate",
            str(tmp_path),
            "--out",
            str(out),
            "--rank",
            "1",
            "--method",
            "power",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--iterations",
            "0",
        ]
    )
    assert code == 2 and not out.exists()
    assert "--iterations must be an integer" in capsys.readouterr().err


# --- synth ------------------------------------------------------------------------------------


def test_synth_polynomial_truth(tmp_path) -> None:
    """The rows' covariance has eigenvalues i^(−decay) along the recorded truth."""
    data = _polynomial(tmp_path, 60_000, 16, 3, 1.0, dtype="float64")
    rows = _rows(data.path)
    spectrum = np.load(data.truth_dir / "spectrum.npy")
    assert np.allclose(spectrum, np.arange(1, 17) ** -1.0)
    truth = data.load_basis()
    assert np.allclose(truth.T @ truth, np.eye(3), atol=1e-12)
    covariance = rows.T @ rows / len(rows)
    assert np.allclose(np.diag(truth.T @ covariance @ truth), spectrum[:3], rtol=0.03)
    top = np.linalg.eigh(covariance)[1][:, ::-1][:, :1]
    assert subspace_error(top, truth[:, :1]) < 0.05
    assert data.params["decay"] == 1.0 and data.params["model"] == "polynomial"
    again = _polynomial(tmp_path / "again", 60_000, 16, 3, 1.0, dtype="float64")
    assert np.array_equal(_rows(again.path), rows)
    with pytest.raises(InputError, match="polynomial"):
        synth.generate(tmp_path / "x", rows=10, dim=4, rank=1, model="polynomial", clusters=2)


def test_python_api_takes_the_power_parameters() -> None:
    from dpsub_dist import PrivateSubspace

    rows = np.random.default_rng(0).standard_normal((5000, 20)) * np.arange(1, 21) ** -1.0
    est = PrivateSubspace(2, epsilon=1, delta=1e-6, method="power", iterations=4, oversample=2)
    est.fit(rows)
    assert est.basis_.shape == (20, 2) and len(est.explained_variance_) == 2
    assert (est.manifest_["parameters"]["passes"], est.manifest_["parameters"]["width"]) == (4, 4)
