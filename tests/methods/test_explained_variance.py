"""Private explained variance for friendly/histogram (docs/centring.md): what a CLI user reads in
the manifest, the components' order, and the mechanism's calibration and privacy audit."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from privacy_audit import audit

from dpsub_dist.cli import main
from dpsub_dist.privacy import mechanism, noise
from dpsub_dist.privacy import variance as var
from dpsub_dist.privacy.accountant import ApproxDP, gaussian_sigma

ROWS, DIM = 40_000, 6
MEAN = np.array([30.0, -20.0, 25.0, 10.0, -15.0, 20.0])
STDS = np.array([6.0, 3.0, 0.3, 0.3, 0.3, 0.3])  # principal variances 36, 9; then 0.09 each


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """Rows ``MEAN + z·diag(STDS)·Qᵀ``: the principal axes are Q's columns, in order."""
    rng = np.random.default_rng(3)
    axes, _ = np.linalg.qr(rng.standard_normal((DIM, DIM)))
    rows = MEAN + (rng.standard_normal((ROWS, DIM)) * STDS) @ axes.T
    path = tmp_path_factory.mktemp("ev") / "rows.parquet"
    pq.write_table(pa.table({f"c{j}": rows[:, j] for j in range(DIM)}), path)
    return path, axes


@pytest.mark.parametrize("method", ["friendly", "histogram", "gap-perturb"])
def test_explained_variance_is_released_ordered_and_close_to_the_truth(
    method: str, table, tmp_path: Path, scheduler_address: str
) -> None:
    path, axes = table
    out = tmp_path / "out"
    args = ["--rank", "2", "--method", method, "--epsilon", "3", "--delta", "1e-6", "--seed", "2"]
    common = ["--out", str(out), "--scheduler", scheduler_address, "--quiet"]
    assert main(["estimate", str(path), *args, *common]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    release = manifest["release"]
    steps = [s["step"] for s in manifest["privacy"]["budget"]["steps"]]
    assert steps[-2:] == ["variance_norm_bound", "explained_variance"]
    variance = np.asarray(release["explained_variance"])
    ratio = np.asarray(release["explained_variance_ratio"])
    total = float((STDS**2).sum())
    np.testing.assert_allclose(variance, [36.0, 9.0], rtol=0.15)
    np.testing.assert_allclose(ratio, [36.0 / total, 9.0 / total], atol=0.05)
    assert ratio[0] >= ratio[1] and ratio.sum() <= 1.0
    basis = np.load(out / "basis.npy")  # components ordered by the released variance
    assert abs(basis[:, 0] @ axes[:, 0]) > 0.95 and abs(basis[:, 1] @ axes[:, 1]) > 0.95


def test_projected_sums_and_the_release_draw_the_formula_sigma() -> None:
    basis = np.eye(3)[:, :2]
    rows = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.5]])  # the first is clipped to norm 1
    # upper triangle of Σ (Vᵀz)(Vᵀz)ᵀ: (0.6, 0.8) ⊗ (0.6, 0.8); then Σ ‖z‖² = 1 + 0.25
    np.testing.assert_allclose(var.projected_sums(rows, basis, 1.0), [0.36, 0.48, 0.64, 1.25])
    grant = ApproxDP(0.5, 1e-5)
    with noise.draw_log() as draws:
        mech = var.variance_mechanism(grant)
        release = var.private_variances(np.ones(4), 100, 2.0, mech, np.random.default_rng(0))
    (draw,) = draws
    unit = 2.0**2 / 100  # C²/n
    assert draw.kind == "gaussian" and draw.size == 4
    assert draw.sensitivity == pytest.approx(math.sqrt(2.0) * unit)
    assert draw.scale == pytest.approx(gaussian_sigma(grant, math.sqrt(2.0)) * unit, rel=1e-12)
    assert release.matrix.shape == (2, 2) and release.sensitivity == math.sqrt(2.0)
    assert release.matrix[0, 1] == release.matrix[1, 0]


def test_one_row_moves_the_projected_sums_by_at_most_sqrt_2() -> None:
    """Δ = √2 of ``projected_sums`` (privacy/variance.py) by brute force: 20,000 random pairs of
    rows (inside, on and far outside the bound C, along and across V) never move the sums by
    more than √2, and the pairs the proof names (v₁C vs 0, v₁C vs v₂C) reach it."""
    rng = np.random.default_rng(11)
    basis = np.linalg.qr(rng.standard_normal((6, 3)))[0]
    bound = 2.5
    largest = 0.0
    for _ in range(20_000):
        pair = rng.standard_normal((2, 6)) * rng.choice([0.1, 1.0, 3.0, 100.0], (2, 1))
        if rng.random() < 0.3:  # rows inside span(V), where ‖Vᵀz‖ = ‖z‖
            pair = rng.standard_normal((2, 3)) @ basis.T * rng.choice([0.5, 2.5, 9.0], (2, 1))
        u = [var.projected_sums(row[None], basis, bound) for row in pair]
        largest = max(largest, float(np.linalg.norm(u[0] - u[1])))
    assert largest <= var.SENSITIVITY * (1 + 1e-12)
    for a, b in ((basis[:, 0] * bound, np.zeros(6)), (basis[:, 0] * bound, basis[:, 1] * bound)):
        moved = var.projected_sums(a[None], basis, bound) - var.projected_sums(
            b[None], basis, bound
        )
        assert np.linalg.norm(moved) == pytest.approx(var.SENSITIVITY, rel=1e-12)


@pytest.fixture()
def noise_factor(monkeypatch):
    """The real calibration, memoised, times a factor (0.5: the under-noised twin)."""
    real = functools.lru_cache(maxsize=None)(gaussian_sigma)
    factor = {"value": 1.0}
    patched = lambda g, s: factor["value"] * s * real(g, 1.0)  # noqa: E731
    monkeypatch.setattr(mechanism, "gaussian_sigma", patched)  # the variance step calibrates there

    def set_factor(value: float) -> None:
        factor["value"] = value

    return set_factor


@pytest.mark.slow  # 1.2·10⁵ exact discrete-Gaussian draws: ~2 minutes on 2 shared cores
def test_variance_audit_catches_half_noise(noise_factor) -> None:
    """Row v₁ replaced by the zero row (k = 1): the sums move by (1, 1), L2 norm √2 = Δ. The event
    reads the sum of both noisy values, where the whole shift shows."""
    grant = ApproxDP(2.0, 1e-5)
    twin_spread = math.sqrt(2.0) * gaussian_sigma(grant, math.sqrt(2.0)) / 2

    def run(factor: float):
        noise_factor(factor)
        return audit(
            lambda sums, rng: var.private_variances(
                sums, 1, 1.0, var.variance_mechanism(grant), rng
            ),
            np.array([1.0, 1.0]),
            np.array([0.0, 0.0]),
            lambda r: r.matrix[0, 0] + r.total > 3.0 * twin_spread,
            30_000,
            1e-5,
        )

    honest, twin = run(1.0), run(0.5)
    assert honest.epsilon_lower < 2.0, honest
    assert twin.epsilon_lower > 2.0, twin


def test_pure_noise_is_not_called_all_of_the_variance(tmp_path: Path, scheduler_address: str):
    """A table with no variance at all (here all zeros, uncentred, public row norm): gauss
    releases only its Gram noise. Its ratio was normalised to the top-k sum whenever the
    noisy trace fell below it, so one component got ``[1.0]``; against the sum of all the
    released eigenvalues clipped at 0 it gets a share of the noise (D = 20: about 0.2)."""
    path = tmp_path / "zeros.parquet"
    pq.write_table(pa.table({f"c{j}": np.zeros(5_000) for j in range(20)}), path)
    out = tmp_path / "out"
    args = ["--rank", "1", "--method", "gauss", "--no-center", "--row-norm", "1"]
    budget = ["--epsilon", "1", "--delta", "1e-6", "--out", str(out)]
    assert main(["estimate", str(path), *args, *budget, "--scheduler", scheduler_address]) == 0
    release = json.loads((out / "manifest.json").read_text())["release"]
    (ratio,) = release["explained_variance_ratio"]
    assert 0.0 < ratio < 0.6, release  # top eigenvalue of a 20×20 noise matrix: ~0.2 of Σλ⁺
    assert "sum of all its eigenvalues clipped at 0" in release["explained_variance_note"]


def test_psd_total_clips_every_eigenvalue():
    matrix = np.diag([4.0, 1.0, -3.0])
    assert var.psd_total(matrix) == 5.0  # the trace is 2: a ratio to it would be 4/2
    details = var.released_variance(np.array([4.0]), var.psd_total(matrix), 1.0, 10, "replace")
    assert details["explained_variance_ratio"] == [0.8]
