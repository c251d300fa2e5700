"""Exact case (SS21 Alg. 1, ALGORITHMS.md §6): truncated Laplace, GAP-MAX, audits, utility, CLI.

The snapped release (step 6 of :mod:`dpsub_dist.privacy.gap_max`) is audited on neighbours
whose member row moved within the tolerance, with the old unsnapped release as a planted
twin the audit must catch.

Slow variant (500 utility runs): ``pytest -m slow tests/methods/test_exact.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from privacy_audit import audit, clopper_pearson
from scipy import stats

from dpsub_dist.cli import main
from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.errors import InputError
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error
from dpsub_dist.methods import exact
from dpsub_dist.privacy import gap_max as gm
from dpsub_dist.privacy.accountant import ZCDP, ApproxDP
from dpsub_dist.privacy.noise import truncated_laplace, truncated_laplace_calibration

# --------------------------------------------------------------------------- truncated Laplace


def _tlap_cdf(x: np.ndarray, scale: float, bound: float) -> np.ndarray:
    """CDF of Laplace(scale) conditioned on |x| ≤ bound, written out independently."""
    x = np.clip(x, -bound, bound)
    mass = 2 * scale * (1 - math.exp(-bound / scale))
    below = scale * (np.exp(x / scale) - math.exp(-bound / scale)) / mass
    above = 0.5 + scale * (1 - np.exp(-x / scale)) / mass
    return np.where(x < 0, below, above)


@pytest.mark.parametrize("sensitivity", [1.0, 2.0])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 0.05])
def test_truncated_laplace_calibration_matches_geng_et_al(sensitivity, epsilon, delta):
    scale, bound = truncated_laplace_calibration(sensitivity, epsilon, delta)
    assert scale == pytest.approx(sensitivity / epsilon)
    # The mass a shift by Δ leaves outside the overlap is (e^ε − 1)/(2(e^{A/λ} − 1)) = δ.
    outside = math.expm1(epsilon) / (2 * math.expm1(bound / scale))
    assert outside == pytest.approx(delta, rel=1e-9)


def test_truncated_laplace_known_bound():
    # TLap(2, 1, 1e-6): A = 2 ln(1 + (e − 1)/2e-6).
    _, bound = truncated_laplace_calibration(2.0, 1.0, 1e-6)
    assert bound == pytest.approx(2 * math.log(1 + (math.e - 1) / 2e-6), rel=1e-12)
    assert bound == pytest.approx(27.3273787919, rel=1e-9)


def test_truncated_laplace_samples_stay_bounded_and_follow_the_law():
    scale, bound = truncated_laplace_calibration(2.0, 1.0, 0.05)
    samples = truncated_laplace(np.random.default_rng(11), scale, bound, 200_000)
    assert np.abs(samples).max() <= bound  # P(|noise| > A) = 0
    assert stats.kstest(samples, lambda x: _tlap_cdf(x, scale, bound)).pvalue > 1e-3
    expected_abs = scale - bound * math.exp(-bound / scale) / (1 - math.exp(-bound / scale))
    assert np.abs(samples).mean() == pytest.approx(expected_abs, rel=0.01)
    # The tail beyond A − Δ is the mass a shift by Δ leaves uncovered: exactly δ = 0.05.
    tail = int((samples > bound - 2.0).sum())
    low, high = clopper_pearson(tail, samples.size, 0.999)
    assert low <= 0.05 <= high
    # The same test rejects a sampler with half the scale (the test can fail).
    narrow = truncated_laplace(np.random.default_rng(12), scale / 2, bound, 200_000)
    assert stats.kstest(narrow, lambda x: _tlap_cdf(x, scale, bound)).pvalue < 1e-6


def test_truncated_laplace_rejects_bad_parameters():
    with pytest.raises(ValueError):
        truncated_laplace_calibration(2.0, 1.0, 0.0)
    with pytest.raises(ValueError):
        truncated_laplace(np.random.default_rng(0), 1.0, 0.0)


# --------------------------------------------------------------------------- scores


def _on_lines(counts: list[int], seed: int = 0) -> np.ndarray:
    """Points in R² on distinct lines through 0, ``counts[i]`` on line i."""
    rng = np.random.default_rng(seed)
    angles = np.linspace(0.1, np.pi - 0.1, len(counts))
    blocks = []
    for angle, m in zip(angles, counts, strict=True):
        direction = np.array([math.cos(angle), math.sin(angle)])
        blocks.append(np.outer(rng.uniform(0.5, 2.0, m) * rng.choice([-1, 1], m), direction))
    return np.concatenate(blocks)


def _low_rank_with_outliers(rng, n=60, dim=10, rank=3, outliers=2):
    basis, _ = np.linalg.qr(rng.standard_normal((dim, rank)))
    rows = rng.standard_normal((n, rank)) @ basis.T
    rows[rng.choice(n, outliers, replace=False)] = 5 * rng.standard_normal((outliers, dim))
    return rows, basis


def test_scores_on_lines_known_answer():
    # k = 1: u(line) = its nonzero points; a zero row is in every subspace and cancels.
    points = np.concatenate([_on_lines([5, 3, 1, 1]), np.zeros((1, 2))])
    spans = gm.score_spans(points, 1)
    assert spans.scores.tolist() == [5, 3, 1, 1]
    assert subspace_error(spans.top_basis, np.array([[math.cos(0.1)], [math.sin(0.1)]])) < 1e-9


def test_scores_of_neighbours_move_by_at_most_one():
    # Replacing one point of line A by a point of line B: u(A) 5 → 4, u(B) 3 → 4.
    before = gm.score_spans(_on_lines([5, 3]), 1).scores.tolist()
    after = gm.score_spans(_on_lines([4, 4]), 1).scores.tolist()
    assert before == [5, 3] and after == [4, 4]


def test_score_of_exact_rank_3_subspace_with_outliers():
    # 58 inliers in general position in a 3-dim subspace: u = 58 − (k − 1) = 56;
    # spans through an outlier hold only their 3 generators: u = 3 − 2 = 1.
    rows, basis = _low_rank_with_outliers(np.random.default_rng(3))
    spans = gm.score_spans(rows, 3, tolerance=1e-9)
    assert spans.scores[0] == 56
    assert set(spans.scores[1:].tolist()) == {1}
    assert subspace_error(spans.top_basis, basis) < 1e-6


def test_scores_in_the_row_space_when_dim_exceeds_rows():
    rng = np.random.default_rng(4)
    basis, _ = np.linalg.qr(rng.standard_normal((30, 2)))
    rows = rng.standard_normal((8, 2)) @ basis.T
    spans = gm.score_spans(rows, 2)
    assert spans.scores.tolist() == [8 - 1]
    assert spans.top_basis.shape == (30, 2)
    assert subspace_error(spans.top_basis, basis) < 1e-6


def test_float32_rounding_does_not_split_the_true_span():
    rng = np.random.default_rng(5)
    rows, basis = _low_rank_with_outliers(rng)
    spans = gm.score_spans(rows.astype(np.float32), 3, tolerance=1e-5)  # covers float32
    assert spans.scores[0] == 56 and spans.scores[1] <= 2
    assert subspace_error(spans.top_basis, basis) < 1e-4


# --------------------------------------------------------------------------- release


def test_null_score_formula():
    assert gm.null_score(2, 2.0, 1e-6) == pytest.approx(2 + 4 * math.log(1e6) / 2 + 1)


def _release(
    spans: gm.SpanScores, epsilon: float, delta: float, outliers: int, rng: np.random.Generator
) -> gm.GapMaxRelease:
    """GAP-MAX's release of ``spans`` by the mechanism an (ε, δ) grant calibrates."""
    grant = ApproxDP(epsilon, delta)
    steps = gm.gap_max_mechanism(grant, spans.tolerance, spans.n_rows, spans.dim, outliers)
    return gm.gap_max_release(spans, steps, rng)


def _scored(scores: list[int], basis: np.ndarray, conditioning: float = 50.0) -> gm.SpanScores:
    """Scores as score_spans would hand them over, for 60 rows at the default tolerance."""
    dim = basis.shape[0]
    return gm.SpanScores(np.array(scores), basis, conditioning, 100, 60, dim, gm.DEFAULT_TOLERANCE)


def test_clear_winner_is_released_and_null_wins_otherwise():
    rng = np.random.default_rng(6)
    spans = _scored([56, 1, 1], np.eye(10)[:, :3])
    releases = [_release(spans, 2.0, 1e-6, 2, rng) for _ in range(200)]
    assert all(r.reason == "released" for r in releases)
    assert all(subspace_error(r.basis, np.eye(10)[:, :3]) < 10 * r.snap_side for r in releases)
    weak = _scored([3, 1], np.eye(10)[:, :3])  # NULL (32) wins clearly
    releases = [_release(weak, 2.0, 1e-6, 2, rng) for _ in range(200)]
    assert all(r.basis is None for r in releases)
    assert {r.reason for r in releases} == {"null"}


def test_tied_top_is_never_released():
    # f = 0 must never release whatever the noise: that is why the threshold is A.
    rng = np.random.default_rng(7)
    tied = _scored([40, 40], np.eye(4)[:, :1])
    releases = [_release(tied, 5.0, 0.1, 0, rng) for _ in range(5000)]
    assert all(r.basis is None and r.noisy_gap <= r.threshold for r in releases)


def test_loosely_determined_span_is_never_released():
    # A clear winner whose members barely determine it (λ ≤ c₀): h = 0, so never released.
    rng = np.random.default_rng(8)
    floor = gm.conditioning_floor(gm.DEFAULT_TOLERANCE, 60)
    loose = _scored([56, 1], np.eye(10)[:, :3], conditioning=floor)
    releases = [_release(loose, 2.0, 1e-6, 2, rng) for _ in range(2000)]
    assert all(r.basis is None and r.reason == "gap" for r in releases)


def test_delta_is_split_between_the_decision_and_the_snap():
    gap_delta, snap_delta = gm.split_delta(1e-6)
    assert gap_delta + snap_delta == pytest.approx(1e-6) and snap_delta > 0
    # w = √D·3√2·τ√n/δ_snap, D = d(d+1)/2 upper-triangle entries.
    side = gm.snap_side(1e-12, 60, 10, snap_delta)
    assert side == pytest.approx(math.sqrt(55) * 3 * math.sqrt(2) * 1e-12 * math.sqrt(60) / 5e-7)


def test_zcdp_grant_runs_with_sqrt_2rho():
    assert gm.gap_max_parameters(ZCDP(0.5, 1e-7)) == (1.0, 1e-7)
    assert gm.gap_max_parameters(ApproxDP(0.7, 1e-6)) == (0.7, 1e-6)


# --------------------------------------------------------------------------- audit

AUDIT_EPSILON, AUDIT_DELTA, AUDIT_RUNS = 1.0, 1e-3, 5000


def _neighbours(gap: int) -> tuple[gm.SpanScores, gm.SpanScores]:
    """Y: lines A, B with u(A) − u(B) − 1 = gap, B above NULL; Y′: one A point moved to B.

    In Y′ u(A) drops by 1 and u(B) rises by 1, so the gap statistic moves by the full
    sensitivity 2 (ℓ = 0: NULL = 4 ln(1/δ_gap)/ε + 1 ≈ 31.4 < u(B) = 33).
    """
    b = 33
    a = b + 1 + gap
    return gm.score_spans(_on_lines([a, b]), 1), gm.score_spans(_on_lines([a - 1, b + 1]), 1)


def _released(spans: gm.SpanScores, rng: np.random.Generator) -> bool:
    return _release(spans, AUDIT_EPSILON, AUDIT_DELTA, 0, rng).basis is not None


@pytest.mark.parametrize("gap", [14, 6])  # 14 ≈ A − 1 (worst pair for TLap(2)), 6 for TLap(1)
def test_gap_max_audit_stays_below_epsilon(gap):
    y, y_prime = _neighbours(gap)
    assert y.scores[0] - y.scores[1] - 1 == gap
    result = audit(_released, y, y_prime, bool, AUDIT_RUNS, AUDIT_DELTA)
    assert 0 < result.rate_b < result.rate_a  # the pair is informative
    assert result.epsilon_lower < AUDIT_EPSILON


def test_gap_max_audit_catches_under_noised_twin(monkeypatch):
    # Planted bug: noise calibrated for sensitivity 1 instead of 2 (half the scale).
    monkeypatch.setattr(gm, "GAP_SENSITIVITY", 1.0)
    y, y_prime = _neighbours(6)
    result = audit(_released, y, y_prime, bool, AUDIT_RUNS, AUDIT_DELTA)
    assert result.epsilon_lower > AUDIT_EPSILON


# --------------------------------------------------------------------------- snapped release

SNAP_TOLERANCE = 1e-6
"""Large enough that the old release (projector rounded to 1e-10) moves visibly."""


def _moved_member_neighbours() -> tuple[gm.SpanScores, gm.SpanScores]:
    """Y: 80 points on a line in R²; Y′: one of them turned by τ/2, still a member.

    Scores, member sets and conditioning agree, so GAP-MAX decides alike; only the fit
    of the members moves (by about τ/160), which is what the old release published.
    """
    line = _on_lines([80])
    moved = line.copy()
    turn = SNAP_TOLERANCE / 2
    rotation = np.array([[math.cos(turn), -math.sin(turn)], [math.sin(turn), math.cos(turn)]])
    moved[0] = rotation @ moved[0]
    y, y_prime = (gm.score_spans(rows, 1, SNAP_TOLERANCE) for rows in (line, moved))
    assert y.scores.tolist() == y_prime.scores.tolist() == [80]
    assert 0 < subspace_error(y.top_basis, y_prime.top_basis) < SNAP_TOLERANCE
    return y, y_prime


def _closer_to(reference: np.ndarray, other: np.ndarray):
    """Event: a release that is a basis strictly closer to ``reference`` than to ``other``."""

    def event(release: gm.GapMaxRelease) -> bool:
        basis = release.basis
        return basis is not None and subspace_error(basis, reference) < subspace_error(basis, other)

    return event


def _snapped_release(spans: gm.SpanScores, rng: np.random.Generator) -> gm.GapMaxRelease:
    return _release(spans, AUDIT_EPSILON, AUDIT_DELTA, 0, rng)


def test_snapped_release_audit_stays_below_epsilon():
    y, y_prime = _moved_member_neighbours()
    event = _closer_to(y.top_basis, y_prime.top_basis)
    result = audit(_snapped_release, y, y_prime, event, AUDIT_RUNS, AUDIT_DELTA)
    assert result.rate_a > 0.2  # released, and the event is not trivially empty
    assert result.epsilon_lower < AUDIT_EPSILON, result


def test_snapped_release_audit_catches_the_unsnapped_twin(monkeypatch):
    # Planted bug: the old release, the members' projector rounded to 10 decimals.
    monkeypatch.setattr(gm, "snap_symmetric", lambda matrix, side, rng: np.round(matrix, 10))
    y, y_prime = _moved_member_neighbours()
    event = _closer_to(y.top_basis, y_prime.top_basis)
    result = audit(_snapped_release, y, y_prime, event, AUDIT_RUNS, AUDIT_DELTA)
    assert result.rate_a == 1.0 and result.rate_b == 0.0  # told apart with certainty
    assert result.epsilon_lower > AUDIT_EPSILON, result


def test_neighbours_with_a_member_moved_within_tolerance_publish_the_same_basis():
    """Consumer level: the same private noise seed, neighbouring tables (one member row
    turned by τ/2), identical basis bytes; the truth is recovered to within the grid."""
    rng = np.random.default_rng(9)
    truth = np.linalg.qr(rng.standard_normal((3, 1)))[0]
    rows = rng.uniform(0.5, 2.0, (80, 1)) * rng.choice([-1, 1], (80, 1)) @ truth.T
    moved = rows.copy()
    moved[0] += 0.5e-7 * np.linalg.norm(rows[0]) * np.linalg.qr(np.c_[truth, np.eye(3)])[0][:, 1]
    config = EstimateConfig(rank=1, epsilon=2.0, delta=1e-3, method="exact", tolerance=1e-7)
    runs = [
        run_estimate(config, lambda client, r=r: array_dataset(r), None, noise_seed=2026)
        for r in (rows, moved)
    ]
    assert [r.outcome for r in runs] == ["ok", "ok"]
    assert runs[0].basis.tobytes() == runs[1].basis.tobytes()
    side = runs[0].manifest["parameters"]["snap_side"]
    assert side == pytest.approx(gm.snap_side(1e-7, 80, 3, 5e-4))
    assert subspace_error(runs[0].basis, truth) < 3 * side


# --------------------------------------------------------------------------- utility


RECOVERED = 0.01
"""Largest subspace error counted as recovered: the release is snapped to a grid of side
w ≈ 5e-4 at τ = 1e-12, n = 60, d = 10 (measured errors ≈ 5e-4)."""


def _recovery_rate(runs: int, seed: int) -> tuple[int, int]:
    data_rng, noise_rng = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    grant = ApproxDP(2.0, 1e-6)
    successes = 0
    for _ in range(runs):
        rows, basis = _low_rank_with_outliers(data_rng)
        release = gm.gap_max(rows, 3, grant, noise_rng, outliers=2)
        successes += release.basis is not None and subspace_error(release.basis, basis) < RECOVERED
    return successes, runs


def _assert_at_least_95_percent(successes: int, runs: int) -> None:
    low, _ = clopper_pearson(successes, runs, 0.90)  # one-sided 95% lower bound
    assert low >= 0.95, f"{successes}/{runs} recovered: lower bound {low:.3f} < 0.95"


def test_exact_recovers_rank_3_subspace_in_95_percent_of_runs():
    # D = 10, 60 points, ℓ = 2 outliers, ε = 2, δ = 1e-6: 60/60 successes are needed for a
    # one-sided 95% Clopper–Pearson lower bound ≥ 0.95.
    _assert_at_least_95_percent(*_recovery_rate(60, seed=2021))


@pytest.mark.slow
def test_exact_recovery_rate_many_runs():
    _assert_at_least_95_percent(*_recovery_rate(500, seed=2022))


# --------------------------------------------------------------------------- runner and CLI


def test_size_limits():
    assert exact.check_size(60, 3) == math.comb(60, 3)
    with pytest.raises(InputError, match="limit.*--method histogram"):
        exact.check_size(exact.MAX_ROWS + 1, 1)
    with pytest.raises(InputError, match=r"C\(120, 3\) = 280840"):
        exact.check_size(120, 3)
    with pytest.raises(InputError, match="at least rank"):
        exact.check_size(2, 3)


def test_library_run_without_cluster_releases_basis_and_manifest():
    rows, basis = _low_rank_with_outliers(np.random.default_rng(8))
    config = EstimateConfig(rank=3, epsilon=2.0, delta=1e-6, method="exact", outliers=2)
    result = run_estimate(config, lambda client: array_dataset(rows), None)
    assert result.outcome == "ok" and subspace_error(result.basis, basis) < RECOVERED
    assert result.manifest["privacy"]["budget"]["spent"] == {"epsilon": 2.0, "delta": 1e-6}
    assert result.manifest["release"]["reason"] == "released"
    # only the two best scores and the best span's d×k fit came back from the worker
    assert result.manifest["summary_bytes_gathered"] == 2 * 8 + 10 * 3 * 8


@pytest.fixture(scope="module")
def exact_data(tmp_path_factory) -> Path:
    from dpsub_dist.synth import generate

    out = tmp_path_factory.mktemp("exact") / "rank3"
    generate(
        out,
        rows=60,
        dim=10,
        rank=3,
        model="exact",
        outlier_fraction=2 / 60,
        partitions=2,
        dtype="float64",
        seed=3,
    )
    return out


def _estimate(data: Path, out: Path, scheduler: str, *extra: str) -> int:
    return main(
        [
            "estimate",
            str(data),
            "--rank",
            "3",
            "--epsilon",
            "2",
            "--delta",
            "1e-6",
            "--out",
            str(out),
            "--scheduler",
            scheduler,
            "--quiet",
            *extra,
        ]
    )


def test_cli_exact_on_cluster(exact_data, scheduler_address, tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        _estimate(exact_data, out, scheduler_address, "--method", "exact", "--outliers", "2") == 0
    )
    truth = np.load(exact_data / "_truth" / "basis.npy")
    assert subspace_error(np.load(out / "basis.npy"), truth) < RECOVERED
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == "exact"
    assert manifest["parameters"]["candidate_subsets"] == math.comb(60, 3)
    assert manifest["summary_bytes_gathered"] == 2 * 8 + 10 * 3 * 8


@pytest.mark.parametrize(("rows", "rank", "shown"), [(201, 1, "n ≤ 200"), (120, 3, "C(120, 3)")])
def test_cli_exact_refuses_large_inputs(scheduler_address, tmp_path, capsys, rows, rank, shown):
    from dpsub_dist.synth import generate

    data, out = tmp_path / "data", tmp_path / "run"
    generate(data, rows=rows, dim=5, rank=rank, model="exact", seed=1)
    code = main(
        [
            "estimate",
            str(data),
            "--rank",
            str(rank),
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--out",
            str(out),
            "--scheduler",
            scheduler_address,
            "--quiet",
            "--method",
            "exact",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert shown in err and "--method histogram with a small --cell-side" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "exact", "--unit-column", "id"], "row-level only"),
        (["--method", "friendly", "--outliers", "2"], "applies to --method exact"),
        (["--method", "exact", "--tolerance", "0.5"], "--tolerance must be"),
        (["--method", "exact", "--outliers", "-1"], "--outliers must be"),
    ],
)
def test_cli_exact_option_refusals(exact_data, scheduler_address, tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    assert _estimate(exact_data, out, scheduler_address, *extra) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_documented_scale_route_recovers_exact_low_rank_data(tmp_path):
    # ALGORITHMS.md §6: at scale, exactly low-rank data is the histogram with a tiny cell.
    from dpsub_dist.engine.sources import parquet_dataset
    from dpsub_dist.synth import generate

    data = generate(
        tmp_path / "big",
        rows=20_000,
        dim=10,
        rank=2,
        model="exact",
        outlier_fraction=0.001,
        partitions=2,
        seed=5,
    )
    config = EstimateConfig(  # a subspace through 0, not PCA: uncentred (exact.SCALE_ROUTE)
        rank=2, epsilon=1.0, delta=1e-6, method="histogram", scale=1e-3, center=False
    )
    result = run_estimate(
        config, lambda client: parquet_dataset(str(data.path), None, None, {}, None), None
    )
    assert result.outcome == "ok"
    assert subspace_error(result.basis, np.load(data.truth_dir / "basis.npy")) < 0.01
