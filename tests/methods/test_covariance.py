"""Covariance family (DTTZ14; ALGORITHMS.md §7): sensitivities, calibration, engine, runner, CLI.

Audits of the mechanisms are in test_covariance_audit.py. The utility test at the issue's size
(n = 10⁶, D = 200) is marked slow:
``.venv/bin/python -m pytest -m slow tests/methods/test_covariance.py``.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from contexts import planned

from dpsub_dist.cli import main
from dpsub_dist.context import RunContext
from dpsub_dist.engine.compute import IN_PROCESS, Executor
from dpsub_dist.engine.gram import GramSummary, clip_rows, compute_gram
from dpsub_dist.engine.sources import array_dataset, parquet_dataset
from dpsub_dist.errors import InputError
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error
from dpsub_dist.methods.gauss import budget_plan, perturb_subspace
from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import ZCDP, ApproxDP
from dpsub_dist.privacy.calibration import classic_gaussian_sigma, gaussian_delta
from dpsub_dist.privacy.covariance_noise import (
    SENSITIVITY,
    analyze_gauss,
    gap_failure,
    gap_test_mechanism,
    gaussian_mean,
    noisy_gap_lower_bound,
)


def _top_projector(matrix: np.ndarray, k: int) -> np.ndarray:
    values, vectors = np.linalg.eigh(matrix)
    top = vectors[:, np.argsort(values)[::-1][:k]]
    return top @ top.T


def _gap(matrix: np.ndarray, k: int) -> float:
    values = np.sort(np.linalg.eigvalsh(matrix))[::-1]
    return float(values[k - 1] - values[k])


def _unit(rng: np.random.Generator, dim: int) -> np.ndarray:
    v = rng.standard_normal(dim)
    return v / np.linalg.norm(v) * rng.uniform(0.2, 1.0)


def _upper_norm(matrix: np.ndarray) -> float:
    return float(np.linalg.norm(matrix[np.triu_indices(matrix.shape[0])]))


def _rotated_pair(gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Replace-one neighbours whose top eigenvector turns as far as a unit row can turn it."""
    u = np.array([1.0, 1.0]) / math.sqrt(2)
    base = gap * np.outer(u, u)
    return base + np.diag([0.0, 1.0]), base + np.diag([1.0, 0.0])


# --- sensitivities (the module docstring's derivation, checked numerically) -----------------


def test_replace_one_sensitivities_hold_on_random_and_adversarial_neighbours() -> None:
    rng = np.random.default_rng(1)
    sens = SENSITIVITY["replace"]
    worst_ratio = 0.0
    for trial in range(400):
        dim, k = int(rng.integers(2, 7)), 1
        k = int(rng.integers(1, dim))
        rows = np.array([_unit(rng, dim) for _ in range(int(rng.integers(3, 30)))])
        scale = rng.uniform(1, 60) if trial % 2 else 1.0
        base = scale * rows.T @ rows
        a, b = _unit(rng, dim), _unit(rng, dim)
        g0, g1 = base + np.outer(b, b), base + np.outer(a, a)
        assert _upper_norm(g1 - g0) <= sens.gram + 1e-12
        assert abs(_gap(g1, k) - _gap(g0, k)) <= sens.gap + 1e-9
        bound = sens.projector(_gap(g0, k))
        if bound is not None:
            moved = np.linalg.norm(_top_projector(g1, k) - _top_projector(g0, k))
            assert moved <= bound + 1e-9
            worst_ratio = max(worst_ratio, moved / bound)
    for gap in (4.0, 10.0, 100.0, 1e4):
        g0, g1 = _rotated_pair(gap)
        moved = _upper_norm(_top_projector(g1, 1) - _top_projector(g0, 1))
        assert moved <= sens.projector(_gap(g0, 1)) + 1e-12
    # at a large gap the √2/(gap − 3) bound is nearly attained (so the audit can be tight)
    g0, g1 = _rotated_pair(1e4)
    moved = _upper_norm(_top_projector(g1, 1) - _top_projector(g0, 1))
    assert moved >= 0.99 * sens.projector(_gap(g0, 1))
    assert worst_ratio > 0


def test_add_remove_sensitivities_hold_for_a_users_rescaled_rows() -> None:
    rng = np.random.default_rng(2)
    sens = SENSITIVITY["add_remove"]
    for _ in range(300):
        dim = int(rng.integers(2, 6))
        k = int(rng.integers(1, dim))
        rows = np.array([_unit(rng, dim) for _ in range(int(rng.integers(3, 20)))])
        base = rng.uniform(1, 40) * rows.T @ rows
        user = np.array([_unit(rng, dim) for _ in range(int(rng.integers(1, 5)))])
        user /= max(1.0, math.sqrt(float((user**2).sum())))  # squared norms sum to ≤ 1
        added = base + user.T @ user
        assert _upper_norm(added - base) <= sens.gram + 1e-12
        assert abs(_gap(added, k) - _gap(base, k)) <= sens.gap + 1e-9
        for g0, g1 in ((base, added), (added, base)):
            bound = sens.projector(_gap(g0, k))
            if bound is not None:
                assert np.linalg.norm(_top_projector(g1, k) - _top_projector(g0, k)) <= bound
    assert sens.row_sum is None


def test_projector_sensitivity_is_none_without_room() -> None:
    for relation, shift in (("replace", 3.0), ("add_remove", 2.0)):
        sens = SENSITIVITY[relation]
        assert sens.projector(shift) is None
        assert sens.projector(shift - 5) is None
        assert sens.projector(math.nan) is None
        assert sens.projector(shift + 1) == pytest.approx(sens.projector_scale)


# --- calibration ------------------------------------------------------------------------------


@pytest.mark.parametrize("relation,delta_g", [("replace", math.sqrt(2)), ("add_remove", 1.0)])
@pytest.mark.parametrize("epsilon,delta", [(0.3, 1e-6), (0.9, 1e-8), (1.0, 1e-6), (4.0, 1e-5)])
def test_analyze_gauss_sigma_for_approx_dp(relation, delta_g, epsilon, delta) -> None:
    sens = SENSITIVITY[relation].gram
    assert sens == pytest.approx(delta_g)
    release = analyze_gauss(
        np.eye(3), mechanism.gaussian(ApproxDP(epsilon, delta), sens), np.random.default_rng(0)
    )
    # the achieved δ at the target ε never exceeds the target (Balle & Wang 2018, Thm 8)
    assert gaussian_delta(sens, release.sigma, epsilon) <= delta * (1 + 1e-9)
    if epsilon < 1:  # never more noise than the classic formula
        assert release.sigma <= classic_gaussian_sigma(sens, epsilon, delta) * (1 + 1e-12)
    # and strictly less than the classic σ at ε = 0.9 (the analytic one wins there)
    if epsilon == 0.9:
        assert release.sigma < 0.95 * classic_gaussian_sigma(sens, epsilon, delta)


@pytest.mark.parametrize("relation", ["replace", "add_remove"])
@pytest.mark.parametrize("rho", [0.01, 0.5, 3.0])
def test_analyze_gauss_sigma_for_zcdp(relation, rho) -> None:
    sens = SENSITIVITY[relation].gram
    release = analyze_gauss(
        np.zeros((2, 2)), mechanism.gaussian(ZCDP(rho, 0.0), sens), np.random.default_rng(0)
    )
    assert release.sigma == pytest.approx(sens / math.sqrt(2 * rho), rel=1e-12)


def test_analyze_gauss_noise_is_symmetric_with_the_calibrated_spread() -> None:
    dim = 60
    gram = np.diag(np.arange(dim, dtype=float))
    release = analyze_gauss(
        gram, mechanism.gaussian(ApproxDP(1.0, 1e-6), math.sqrt(2)), np.random.default_rng(3)
    )
    noise = release.matrix - gram
    assert np.array_equal(noise, noise.T)
    upper = noise[np.triu_indices(dim)]  # 1830 i.i.d. draws
    assert np.std(upper) == pytest.approx(release.sigma, rel=0.06)
    assert abs(np.mean(upper)) < 4 * release.sigma / math.sqrt(upper.size)


def test_gap_lower_bound_laplace_margin_and_scale() -> None:
    grant = ApproxDP(0.5, 1e-4)
    rng = np.random.default_rng(4)
    test, failure = gap_test_mechanism(grant, 2.0), gap_failure(grant)
    draws = [noisy_gap_lower_bound(10.0, test, failure, rng) for _ in range(4000)]
    noisy = np.array([d[0] for d in draws])
    lower = np.array([d[1] for d in draws])
    assert {d[2] for d in draws} == {"laplace"} and draws[0][3] == pytest.approx(4.0)
    assert np.allclose(noisy - lower, 4.0 * math.log(1e4))  # (Δ/ε) ln(1/δ)
    assert np.mean(np.abs(noisy - 10.0)) == pytest.approx(4.0, rel=0.06)  # E|Lap(b)| = b


def test_gap_lower_bound_zcdp_is_gaussian_and_fails_with_probability_delta0() -> None:
    grant = ZCDP(0.08, 0.05)
    rng = np.random.default_rng(5)
    test, failure = gap_test_mechanism(grant, 2.0), gap_failure(grant)
    draws = np.array([noisy_gap_lower_bound(0.0, test, failure, rng)[:2] for _ in range(20000)])
    scale = 2.0 / math.sqrt(2 * 0.08)
    assert np.std(draws[:, 0]) == pytest.approx(scale, rel=0.03)
    # Gaussian, not Laplace: the excess kurtosis is ≈ 0 (a Laplace's is 3)
    z = draws[:, 0] / np.std(draws[:, 0])
    assert abs(np.mean(z**4) - 3.0) < 0.3
    failures = np.mean(draws[:, 1] > 0.0)  # the lower bound exceeded the true gap
    assert failures == pytest.approx(0.05, abs=0.006)


def test_gap_perturbation_calibrates_to_the_noisy_gap() -> None:
    rng = np.random.default_rng(6)
    rows = rng.standard_normal((500, 4)) * np.array([3.0, 2.0, 0.1, 0.1])
    gram = rows.T @ rows
    for seed, (budget, relation) in enumerate(
        (
            ({"epsilon": 1.0, "delta": 1e-6}, "replace"),
            ({"epsilon": 1.0, "delta": 1e-6}, "add_remove"),
            ({"rho": 0.1, "delta": 2e-6}, "replace"),
        )
    ):
        shares = budget_plan("gap-perturb", False, "rho" in budget)
        ctx = planned(shares, seed, **budget)
        release = perturb_subspace(ctx, gram, 2, relation)
        sens = SENSITIVITY[relation]
        expected = sens.projector_scale / (release.gap_lower_bound - sens.projector_shift)
        assert release.projector_sensitivity == pytest.approx(expected)
        from dpsub_dist.privacy.accountant import gaussian_sigma

        noise_grant = ctx.grant("projector_noise")
        assert release.sigma == pytest.approx(gaussian_sigma(noise_grant, expected))
        assert release.basis.shape == (4, 2)
        assert np.allclose(release.basis.T @ release.basis, np.eye(2))
        noise = release.noisy_projector - _top_projector(gram, 2)
        assert np.allclose(noise, noise.T)


def test_gap_perturbation_returns_bottom_and_never_divides_by_a_non_positive_number() -> None:
    halves = {"gap_test": (0.5, 0.5), "projector_noise": (0.5, 0.5)}
    budget = {"epsilon": 1.0, "delta": 2e-6}
    seen_bottom = seen_basis = 0
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        for gap in np.linspace(0.0, 120.0, 241):
            gram = np.diag([gap + 1.0, 1.0, 0.5])
            for relation in ("replace", "add_remove"):
                ctx = planned(halves, seen_bottom + seen_basis, **budget)
                release = perturb_subspace(ctx, gram, 1, relation)
                if release.basis is None:
                    seen_bottom += 1
                    shift = SENSITIVITY[relation].projector_shift
                    assert release.gap_lower_bound <= shift
                    assert release.sigma is None and release.noisy_projector is None
                else:
                    seen_basis += 1
                    assert release.gap_lower_bound > SENSITIVITY[relation].projector_shift
                    assert np.isfinite(release.basis).all() and release.sigma > 0
    assert seen_bottom > 50 and seen_basis > 50
    with pytest.raises(ValueError, match="k must be"):
        perturb_subspace(planned(halves, 0, **budget), np.eye(3), 3, "replace")


def test_gaussian_mean_calibration() -> None:
    rng = np.random.default_rng(8)
    approx, zcdp = mechanism.gaussian(ApproxDP(0.5, 1e-6), 2.0), mechanism.gaussian(ZCDP(0.5), 2.0)
    release = gaussian_mean(np.full(2000, 50.0), 100, approx, rng)
    assert gaussian_delta(2.0, release.sigma, 0.5) <= 1e-6 * (1 + 1e-9)
    assert np.std(release.mean * 100) == pytest.approx(release.sigma, rel=0.05)
    assert np.mean(release.mean) == pytest.approx(0.5, abs=4 * release.sigma / 100 / 40)
    zc = gaussian_mean(np.zeros(3), 10, zcdp, rng)
    assert zc.sigma == pytest.approx(2.0)
    with pytest.raises(ValueError, match="n_rows"):
        gaussian_mean(np.zeros(3), 0, zcdp, rng)


# --- Gram engine ------------------------------------------------------------------------------


def test_clip_rows_scales_to_unit_ball_and_leaves_the_input_alone() -> None:
    rows = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [-30.0, 40.0]])
    before = rows.copy()
    clipped = clip_rows(rows, 2.0)
    assert np.array_equal(rows, before)
    assert np.allclose(clipped[1], [0.15, 0.2])  # short rows: divided by B only
    assert np.allclose(clipped[0], [0.6, 0.8]) and np.allclose(clipped[3], [-0.6, 0.8])
    assert np.array_equal(clipped[2], [0.0, 0.0])
    assert np.all(np.linalg.norm(clipped, axis=1) <= 1 + 1e-15)


def _reference_gram(rows: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    norms = np.linalg.norm(rows, axis=1)
    scaled = rows / np.maximum(norms, bound)[:, None]
    return scaled.T @ scaled, scaled.sum(axis=0)


def _read_rows(dataset) -> np.ndarray:
    return np.concatenate([dataset.loader(p)[0] for p in dataset.parts])


def test_gram_matches_numpy_and_the_driver_receives_only_a_d_by_d_summary(
    small_dataset, dask_client
) -> None:
    dataset = parquet_dataset(str(small_dataset.path), None, None, None, dask_client)
    assert len(dataset.parts) == 4
    gathered: list = []
    real_gather = dask_client.gather

    def recording_gather(futures, *args, **kwargs):
        result = real_gather(futures, *args, **kwargs)
        gathered.append(result)
        return result

    dask_client.gather = recording_gather
    try:
        summary = compute_gram(
            dataset.parts, dataset.loader, 1.5, True, executor=Executor(dask_client)
        )
    finally:
        del dask_client.gather
    dim = dataset.dim
    assert len(gathered) == 1 and len(gathered[0]) == 1  # one gather, of the root only
    (received,) = gathered[0]
    assert isinstance(received, GramSummary)
    assert received.gram.shape == (dim, dim) and received.row_sum.shape == (dim,)
    assert summary.nbytes == (dim * dim + dim) * 8  # 20,000 rows read, 880 bytes gathered
    gram, row_sum = _reference_gram(_read_rows(dataset), 1.5)
    assert np.allclose(summary.gram, gram, rtol=1e-10, atol=1e-9)
    assert np.allclose(summary.row_sum, row_sum, rtol=1e-10, atol=1e-9)
    local = compute_gram(dataset.parts, dataset.loader, 1.5, False)
    assert local.row_sum is None and np.allclose(local.gram, gram, rtol=1e-10, atol=1e-9)


def _user_table(tmp_path: Path) -> tuple[Path, pd.DataFrame]:
    """Two files; users spread over both, one with many long rows, some null ids."""
    rng = np.random.default_rng(9)
    n = 600
    users = rng.choice(np.array(["ann", "bob", "cy", "dee", None], dtype=object), size=n)
    users[:200] = "whale"
    frame = pd.DataFrame(rng.standard_normal((n, 3)) * 2.0, columns=["a", "b", "c"])
    frame["user"] = users
    folder = tmp_path / "users"
    folder.mkdir()
    pq.write_table(
        pa.Table.from_pandas(frame.iloc[::2], preserve_index=False), folder / "p0.parquet"
    )
    pq.write_table(
        pa.Table.from_pandas(frame.iloc[1::2], preserve_index=False), folder / "p1.parquet"
    )
    return folder, frame


def test_user_level_gram_scales_each_user_to_trace_at_most_one(tmp_path, dask_client) -> None:
    folder, frame = _user_table(tmp_path)
    dataset = parquet_dataset(str(folder), ["a", "b", "c"], "user", None, dask_client)
    summary = compute_gram(
        dataset.parts, dataset.loader, 1.0, user_level=True, executor=Executor(dask_client)
    )
    frame = frame[frame["user"].notna()]  # rows with a null id belong to no user: ignored
    rows = frame[["a", "b", "c"]].to_numpy()
    scaled = rows / np.maximum(np.linalg.norm(rows, axis=1), 1.0)[:, None]
    keys = frame["user"]
    expected = np.zeros((3, 3))
    for _, idx in frame.groupby(keys).indices.items():
        block = scaled[idx]
        block = block / math.sqrt(max(1.0, float((block**2).sum())))
        assert np.trace(block.T @ block) <= 1 + 1e-12
        expected += block.T @ block
    assert np.allclose(summary.gram, expected, rtol=1e-10)
    with pytest.raises(InputError, match="user level"):
        compute_gram(dataset.parts, dataset.loader, 1.0, True, user_level=True)


def test_gram_rejects_empty_input_and_bad_bounds() -> None:
    with pytest.raises(InputError, match="no rows"):
        compute_gram([], None, 1.0)
    dataset = array_dataset(np.ones((3, 2)))
    for bound in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(InputError, match="positive"):
            compute_gram(dataset.parts, dataset.loader, bound)


# --- runner -----------------------------------------------------------------------------------


def _planted(n: int, dim: int, rank: int, seed: int, gamma: float = 0.01, offset: float = 0.0):
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((dim, rank)))[0]
    rows = rng.standard_normal((n, rank)) @ basis.T + gamma * rng.standard_normal((n, dim))
    return rows + offset * basis[:, 0], basis


@pytest.mark.parametrize("method", ["gauss", "gap-perturb"])
@pytest.mark.parametrize("budget", [{"epsilon": 1.0, "delta": 1e-6}, {"rho": 0.1, "delta": 1e-6}])
@pytest.mark.parametrize("center", [False, True])
def test_runner_on_an_in_memory_array(method, budget, center) -> None:
    rows, basis = _planted(100_000, 20, 3, seed=10, offset=2.0 if center else 0.0)
    before = rows.copy()
    config = EstimateConfig(rank=3, method=method, row_norm=4.0, center=center, **budget)
    result = run_estimate(config, lambda client: array_dataset(rows), None)
    assert np.array_equal(rows, before)  # the caller's array is never modified
    assert result.outcome == "ok"
    # measured: errors 0.001-0.004 over these cases; an offset without --center would rotate
    assert subspace_error(result.basis, basis) < 0.03
    manifest = result.manifest
    assert manifest["parameters"]["row_norm"] == 4.0 and manifest["parameters"]["center"] is center
    assert manifest["summary_bytes_gathered"] == (400 + (20 if center else 0)) * 8
    release = manifest["release"]
    assert release["neighbours"] == "replace"
    if method == "gauss":
        assert release["gram_sensitivity"] == pytest.approx(math.sqrt(2))
    else:
        assert release["gap_sensitivity"] == 2.0 and release["projector_sensitivity"] > 0
    if center:
        assert release["mean_sensitivity"] == 2.0
        assert np.allclose(release["mean"], 2.0 * basis[:, 0], atol=0.05)
    budget_report = manifest["privacy"]["budget"]
    assert "assignment" not in manifest["privacy"]
    if "rho" in budget:
        assert budget_report["mode"] == "zcdp" and budget_report["spent"]["rho"] == pytest.approx(
            0.1
        )
        assert budget_report["total_as_approx_dp"]["delta"] == pytest.approx(1e-6)
        assert (
            0
            < budget_report["total_as_approx_dp"]["epsilon"]
            < 0.1 + 2 * math.sqrt(0.1 * math.log(2e6))
        )
    else:
        assert budget_report["spent"]["epsilon"] == pytest.approx(1.0)
        assert budget_report["spent"]["delta"] <= 1e-6 * (1 + 1e-9)


def test_centring_matters_for_off_centre_data() -> None:
    rows, basis = _planted(200_000, 10, 2, seed=11, gamma=0.3)
    rows = rows + 5.0 * np.linalg.qr(np.random.default_rng(12).standard_normal((10, 1)))[0][:, 0]
    result = {}
    for center in (False, True):
        config = EstimateConfig(rank=2, method="gauss", epsilon=1, delta=1e-6, row_norm=8.0)
        config.center = center
        result[center] = subspace_error(
            run_estimate(config, lambda c: array_dataset(rows)).basis, basis
        )
    assert result[True] < 0.05 < 0.5 < result[False]


def test_gap_perturb_without_an_eigengap_is_no_stable_subspace() -> None:
    """Isotropic rows (no gap after the top 2 at all): ⊥ at the gap test, exit 3."""
    rows = np.random.default_rng(13).standard_normal((2000, 10))
    config = EstimateConfig(rank=2, method="gap-perturb", epsilon=1, delta=1e-6, row_norm=2.0)
    result = run_estimate(config, lambda client: array_dataset(rows), None)
    assert result.basis is None and result.outcome == "no_stable_subspace"
    assert result.manifest["release"]["failed_step"] == "gap_test"
    assert result.manifest["release"]["gap_lower_bound"] <= 0.0


def test_gap_perturb_on_too_few_rows_is_no_stable_subspace() -> None:
    """40 rows at ε = 1: ⊥ at the gap test (the explained variance, whose private bound needs
    1,842 rows here, is never reached)."""
    rows, _ = _planted(40, 10, 2, seed=13)
    config = EstimateConfig(rank=2, method="gap-perturb", epsilon=1, delta=1e-6, row_norm=2.0)
    result = run_estimate(config, lambda client: array_dataset(rows), None)
    assert result.basis is None and result.outcome == "no_stable_subspace"
    assert result.manifest["release"]["failed_step"] == "gap_test"
    assert result.manifest["release"]["gap_lower_bound"] <= 3.0


def test_user_level_run_is_add_remove(tmp_path) -> None:
    folder, _ = _user_table(tmp_path)
    config = EstimateConfig(
        rank=1, method="gauss", rho=0.5, delta=1e-6, row_norm=1.0, unit_column="user"
    )
    result = run_estimate(
        config, lambda client: parquet_dataset(str(folder), None, "user", None, client), None
    )
    assert result.manifest["release"]["neighbours"] == "add_remove"
    assert result.manifest["release"]["gram_sensitivity"] == 1.0
    assert result.manifest["n_rows"] is None
    assert "each user's rows" in result.manifest["parameters"]["row_scaling"]


BAD_CONFIGS = [
    ({"method": "gap-perturb", "row_norm": 0.0}, "positive finite"),
    ({"method": "gauss", "row_norm": -2.0}, "positive finite"),
    ({"method": "gauss", "row_norm": math.nan}, "positive finite"),
    ({"method": "gauss", "row_norm": math.inf}, "positive finite"),
    ({"method": "gauss", "row_norm": "ten"}, "positive finite"),
    ({"method": "friendly", "row_norm": 1.0, "center": False}, "it needs centring"),
    ({"method": "exact", "center": True}, "--center does not apply"),
    ({"method": "histogram", "center": True, "unit_column": "u"}, "row level only"),
    ({"method": "gauss", "row_norm": 1.0, "center": True, "unit_column": "u"}, "row level only"),
    ({"method": "gauss", "row_norm": 1.0, "subsets": 10}, "--subsets does not apply"),
    ({"method": "gap-perturb", "row_norm": 1.0, "scale": 0.5}, "--radius/--cell-side"),
    ({"method": "gauss", "row_norm": 1.0, "epsilon": None}, "no privacy budget"),
]


@pytest.mark.parametrize("options,message", BAD_CONFIGS)
def test_bad_options_fail_before_any_data_is_read(options, message) -> None:
    def open_dataset(client):
        raise AssertionError("the data was opened before the parameters were checked")

    config = EstimateConfig(rank=2, **{"epsilon": 1.0, "delta": 1e-6, **options})
    with pytest.raises(InputError, match=message):
        run_estimate(config, open_dataset, None)


# --- CLI on the shared real cluster -------------------------------------------------------------


def _estimate(data: Path, out: Path, scheduler: str, *extra: str, rank: int = 2) -> int:
    return main(
        ["estimate", str(data), "--out", str(out), "--rank", str(rank), "--scheduler", scheduler]
        + ["--quiet", *extra]
    )


def test_cli_gauss_and_gap_perturb_end_to_end(small_dataset, scheduler_address, tmp_path, capsys):
    truth = small_dataset.truth_dir / "basis.npy"
    runs = {
        "gauss": ["--method", "gauss", "--row-norm", "3", "--epsilon", "1", "--delta", "1e-6"],
        "gap": ["--method", "gap-perturb", "--row-norm", "3", "--rho", "0.2", "--delta", "1e-6"],
        "centred": ["--method", "gauss", "--row-norm", "3", "--center", "--rho", "0.2"]
        + ["--delta", "1e-6"],
    }
    for name, args in runs.items():
        out = tmp_path / name
        assert _estimate(small_dataset.path, out, scheduler_address, *args) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["outcome"] == "ok" and manifest["method"] == args[1]
        assert manifest["parameters"]["row_norm"] == 3.0
        assert manifest["summary_bytes_gathered"] <= (10 * 10 + 10) * 8
        capsys.readouterr()
        assert main(["evaluate", str(out), "--truth", str(truth)]) == 0
        error = float(capsys.readouterr().out.strip().split("=")[1])
        assert error < 0.05  # measured ≈ 0.002-0.01 on these 20,000 rows


def test_cli_gap_perturb_bottom_exits_3(tmp_path, scheduler_address, capsys) -> None:
    from dpsub_dist.synth import generate

    # Noise (γ = 3) swamps the planted 2-plane: no eigengap.
    tiny = generate(tmp_path / "tiny", rows=2000, dim=8, rank=2, gamma=3.0, partitions=2, seed=3)
    out = tmp_path / "run"
    args = ["--method", "gap-perturb", "--row-norm", "3", "--epsilon", "1", "--delta", "1e-6"]
    assert _estimate(tiny.path, out, scheduler_address, *args) == 3
    assert "eigengap" in capsys.readouterr().err
    assert not (out / "basis.npy").exists()
    assert json.loads((out / "manifest.json").read_text())["outcome"] == "no_stable_subspace"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--method", "gauss", "--row-norm", "0"], "--row-norm"),
        (["--method", "gap-perturb", "--row-norm", "-1"], "--row-norm"),
        (["--method", "friendly", "--row-norm", "3", "--no-center"], "it needs centring"),
        (["--method", "gauss", "--row-norm", "3", "--center", "--unit-column", "x0"], "row level"),
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(
    args, message, small_dataset, tmp_path, capsys
) -> None:
    out = tmp_path / "out"
    code = main(
        ["estimate", str(small_dataset.path), "--out", str(out), "--rank", "2", "--quiet"]
        + ["--epsilon", "1", "--delta", "1e-6", *args]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


# --- utility (ALGORITHMS.md §10; BENCHMARKS.md §1) ---------------------------------------------


def _utility_errors(data, scheduler: str, tmp_path: Path, runs: int, row_norm: float) -> list:
    """One end-to-end CLI run, then more noise draws on the same Gram (what re-runs would see)."""
    from dpsub_dist.job import with_defaults
    from dpsub_dist.methods.gauss import plan_shares, release_basis

    truth = np.load(data.truth_dir / "basis.npy")
    rank = truth.shape[1]
    out = tmp_path / "run"
    args = ["--method", "gauss", "--row-norm", str(row_norm), "--epsilon", "1", "--delta", "1e-6"]
    assert _estimate(data.path, out, scheduler, *args, rank=rank) == 0
    errors = [subspace_error(np.load(out / "basis.npy"), truth)]
    dataset = parquet_dataset(str(data.path), None, None, None, None)
    summary = compute_gram(dataset.parts, dataset.loader, row_norm)
    config = EstimateConfig(rank=rank, method="gauss", epsilon=1, delta=1e-6, row_norm=row_norm)
    config = with_defaults(config)
    for seed in range(runs - 1):  # a test's private seeds; the runner uses OS entropy
        ctx = RunContext(config, dataset, IN_PROCESS, False, seed)
        ctx.plan(plan_shares(config, dataset))
        basis, _ = release_basis(ctx, summary)
        errors.append(subspace_error(basis, truth))
    return errors


def test_gauss_utility_at_a_tenth_of_the_issue_size(tmp_path, scheduler_address) -> None:
    """n = 10⁵, D = 200, K = 4, γ = 0.01·50/D, ε = 1, δ = 1e-6 (measured median ≈ 0.005)."""
    from dpsub_dist.synth import generate

    data = generate(tmp_path / "d", rows=100_000, dim=200, rank=4, gamma=0.0025, partitions=4)
    errors = _utility_errors(data, scheduler_address, tmp_path, runs=5, row_norm=2.0)
    assert np.median(errors) <= 0.01


@pytest.mark.slow
def test_gauss_utility_at_the_issue_size(tmp_path, scheduler_address) -> None:
    """Issue 3: n = 10⁶, D = 200, K = 4, ε = 1, δ = 1e-6 → median error ≤ 0.05."""
    from dpsub_dist.synth import generate

    data = generate(tmp_path / "d", rows=1_000_000, dim=200, rank=4, gamma=0.0025, partitions=8)
    errors = _utility_errors(data, scheduler_address, tmp_path, runs=5, row_norm=2.0)
    assert np.median(errors) <= 0.05
