"""The sampled-centre route of the default covariance run (issue #16, covariance.centre_sample).

The mean's steps and the centred rows' bound run on a public sample S of partitions; one
full read then releases the centred rows' Gram and their clipped sum (step
``centred_sum``), and gauss releases ``G̃ − s̃s̃ᵀ/n``. These tests check: the rule reads
public facts only and keeps today's route below its threshold; the bound is a function of
S's rows alone, searched for at the capped quantile; the full pass's Gram and sum are the
separate passes' at the released centre and bound; the rows are read once plus S's
partitions twice, none held;
data sorted across partitions (a biased sample centre) still gives the right subspace,
which it does not without the correction; the new step is calibrated, charged and audited.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pytest
from contexts import planned
from privacy_audit import audit, scale_samplers
from row_helpers import CountingLoader

from dpsub_dist.engine import row_cache, sources
from dpsub_dist.engine.gram import clip_rows, gram_of
from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, plan_budget, run_estimate, with_defaults
from dpsub_dist.methods import _centring as centring
from dpsub_dist.methods import gauss as cov
from dpsub_dist.privacy import mechanism, norm_bound
from dpsub_dist.privacy.accountant import ApproxDP, gaussian_sigma, laplace_epsilon

NOISE_SEED = 0x5A3C
"""Private noise seed planted for these tests only, so that their outcome is fixed."""

PART_ROWS = 5_000


def _config(**options: Any) -> EstimateConfig:
    settings = {"rank": 2, "epsilon": 2.0, "delta": 1e-6, "seed": 5, **options}
    return with_defaults(EstimateConfig(**settings))


def _drift_rows(n: int = 160_000, sort: bool = True, seed: int = 0) -> tuple[np.ndarray, Any]:
    """Top-2 standard deviations 3 and 2 in a plane, 0.2 noise, an offset, and a drift of
    amplitude 6 along w ⟂ the plane over the row order (variance 3 < 2²): sorted, the
    partitions' means differ along w, so a sample of a few is biased along it."""
    rng = np.random.default_rng(seed)
    q = np.linalg.qr(rng.standard_normal((8, 3)))[0]
    plane, w = q[:, :2], q[:, 2]
    t = np.linspace(0.0, 1.0, n) if sort else rng.random(n)
    z = rng.standard_normal((n, 2)) * [3.0, 2.0]
    rows = z @ plane.T + 0.2 * rng.standard_normal((n, 8)) + 1.5 + 6.0 * np.outer(t, w)
    return rows, plane


@pytest.fixture()
def small_route(monkeypatch) -> None:
    """The rule's row targets lowered to this test data (20 partitions of 5,000 rows or
    more); the rule itself is unchanged."""
    monkeypatch.setattr(sources, "ARRAY_PART_ROWS", PART_ROWS)
    monkeypatch.setattr(cov, "SAMPLE_MIN_ROWS", 5_000)
    monkeypatch.setattr(cov, "SAMPLE_NOISE", 1.0)


def _sin(basis: np.ndarray, plane: np.ndarray) -> float:
    return float(np.linalg.norm(basis - plane @ (plane.T @ basis), 2))


def test_the_rule_reads_public_facts_and_keeps_todays_route_below_it(small_route) -> None:
    rows, _ = _drift_rows(100_000)
    data = array_dataset(rows)
    assert len(data.parts) == 20
    sample = cov.centre_sample(_config(method="gauss"), data)
    assert sample is not None
    s = sample.dataset
    assert s.n_rows == len(s.parts) * PART_ROWS <= data.n_rows / 8
    assert s.n_rows >= max(cov.SAMPLE_MIN_ROWS, data.n_rows * cov.SAMPLE_FRACTION)
    assert s.offsets == sorted(s.offsets)  # file order
    for part, offset in zip(s.parts, s.offsets, strict=True):
        np.testing.assert_array_equal(part, rows[offset : offset + PART_ROWS])
    again = cov.centre_sample(_config(method="gauss"), data)
    assert again is not None and again.dataset.offsets == s.offsets  # the public seed's
    other = cov.centre_sample(_config(method="gauss", seed=6), data)
    assert other is not None and other.dataset.offsets != s.offsets
    assert sample.parameters()["centre_sample"]["rows"] == s.n_rows
    # today's route: too few partitions, the other methods, options and user level
    assert cov.centre_sample(_config(method="gauss"), array_dataset(rows[:35_000])) is None
    for options in (
        {"method": "gap-perturb"},
        {"method": "gauss", "center": False},
        {"method": "gauss", "row_norm": 10.0},
        {"method": "gauss", "unit_column": "u"},
    ):
        assert cov.centre_sample(_config(**options), data) is None, options
    # wider than the fused Gram's D ≤ 202: the route needs no per-bin Grams
    assert cov.centre_sample(_config(method="gauss"), array_dataset(np.ones((10**5, 203))))


def test_the_rule_refuses_a_sample_over_an_eighth_of_the_rows(small_route, monkeypatch) -> None:
    data = array_dataset(_drift_rows(100_000)[0])
    monkeypatch.setattr(cov, "SAMPLE_MIN_ROWS", 12_501)  # 3 partitions of 20 > 1/8
    assert cov.centre_sample(_config(method="gauss"), data) is None
    monkeypatch.setattr(cov, "SAMPLE_MIN_ROWS", 10_000)
    assert cov.centre_sample(_config(method="gauss"), data) is not None
    monkeypatch.setattr(cov, "SAMPLE_NOISE", 1e-6)  # the mean's noise asks for more rows
    assert cov.centre_sample(_config(method="gauss"), data) is None


def test_the_plan_declared_for_the_dataset_is_the_plan_the_sampled_route_charges(
    small_route,
) -> None:
    """``job.plan_budget`` on the opened dataset (its footers decide the route) declares the
    steps the run charges, ``centred_sum`` included, and the manifest publishes that plan."""
    data = array_dataset(_drift_rows(100_000)[0])
    config = _config(method="gauss")
    _, grants = plan_budget(config, data)
    result = run_estimate(config, lambda _e: data, None, noise_seed=NOISE_SEED)
    manifest = result.manifest
    assert manifest["parameters"]["centre_sample"]["rows"] < data.n_rows  # the sampled route
    charged = [step["step"] for step in manifest["privacy"]["budget"]["steps"]]
    assert "centred_sum" in grants
    assert sorted(grants) == sorted(charged) == sorted(manifest["parameters"]["budget_shares"])


def test_the_bound_is_a_function_of_the_samples_rows_at_the_capped_quantile(
    small_route, monkeypatch
) -> None:
    """B₂ (and c) come from S's rows only: with the same private noise, the rows of a
    partition outside S made 10 times longer leave them identical, while the released basis
    moves (those rows are in the full pass); the same change to a partition of S moves B₂.
    The sparse vector runs on n_S rows at q capped at 1 − 20/(ε_norm·n_S)."""
    rows, _ = _drift_rows(100_000)
    thresholds: list[tuple[int, float, int]] = []
    real_release = centring.release_bound

    def spy(ctx, step, counts, n_rows, quantile=norm_bound.NORM_QUANTILE):
        if step == "centred_norm_bound":
            thresholds.append((n_rows, quantile, int(counts.sum())))
        return real_release(ctx, step, counts, n_rows, quantile)

    monkeypatch.setattr(centring, "release_bound", spy)

    def run(data: np.ndarray) -> Any:
        return run_estimate(_config(), lambda _e: array_dataset(data), None, noise_seed=NOISE_SEED)

    first = run(rows)
    parameters = first.manifest["parameters"]
    n_sample = parameters["centre_sample"]["rows"]
    gauss = _config(method="gauss")
    grants = cov.plan(gauss, cov.route_shares(gauss, sampled=True))[1]
    full_quantile = cov.bound_quantile(
        "gauss", grants, "replace", len(rows), rows.shape[1],
        laplace_epsilon(grants["centred_norm_bound"]),
    )  # fmt: skip
    epsilon = laplace_epsilon(grants["centred_norm_bound"])
    capped = norm_bound.margined_quantile(full_quantile, n_sample, epsilon, "rows")
    assert capped == pytest.approx(1 - norm_bound.SV_MARGIN / (epsilon * n_sample))
    assert capped < full_quantile  # the cap binds at n_S
    assert thresholds == [(n_sample, capped, n_sample)]
    assert f"q = {capped:.6g}" in parameters["row_norm_source"]
    assert "centre_sample's partitions" in parameters["row_norm_source"]
    sampled = {o // PART_ROWS for o in sample_offsets(rows)}
    outside = next(i for i in range(20) if i not in sampled) * PART_ROWS
    inside = min(sampled) * PART_ROWS
    for where, moves in ((outside, False), (inside, True)):
        changed = rows.copy()
        changed[where : where + PART_ROWS] *= 10.0
        second = run(changed)
        same_bound = second.manifest["parameters"]["row_norm"] == parameters["row_norm"]
        assert same_bound is not moves, where
        if not moves:
            release, again = first.manifest["release"], second.manifest["release"]
            assert again["centre_sample_mean"] == release["centre_sample_mean"]
            assert not np.array_equal(first.basis, second.basis)


def sample_offsets(rows: np.ndarray) -> list[int]:
    sample = cov.centre_sample(_config(method="gauss"), array_dataset(rows))
    assert sample is not None
    return sample.dataset.offsets


def test_the_sampled_run_reads_every_partition_once(small_route, monkeypatch) -> None:
    """The whole dataset is not held on this route; S's partitions are (they fit), so S's two
    passes and the full pass read each partition once, with the releases of reading S three
    times (the row cache off: the same run on the same noise seed)."""
    data = array_dataset(_drift_rows(100_000)[0])
    loader = CountingLoader(data.loader)
    counted = dataclasses.replace(data, loader=loader)
    held = []
    monkeypatch.setattr(cov, "cache_rows", lambda *a, **k: held.append(a) or a[0])
    result = run_estimate(_config(), lambda _e: counted, None, noise_seed=NOISE_SEED)
    assert result.manifest["method"] == "gauss"
    sample = result.manifest["parameters"]["centre_sample"]
    assert 1 <= sample["partitions"] < len(data.parts) / 8 + 1
    assert loader.calls[0] == len(data.parts)
    assert held == []  # the row cache is not asked for the whole dataset
    shares = result.manifest["parameters"]["budget_shares"]
    assert set(shares) == {"norm_bound", "mean", "centred_norm_bound", "gram_noise", "centred_sum"}
    charged = {c["step"] for c in result.manifest["privacy"]["budget"]["steps"]}
    assert charged == set(shares)
    monkeypatch.setattr(row_cache, "rows_fit", lambda *a: False)  # S read three times
    reread = CountingLoader(data.loader)
    again = run_estimate(
        _config(), lambda _e: dataclasses.replace(data, loader=reread), None,
        noise_seed=NOISE_SEED,
    )  # fmt: skip
    assert reread.calls[0] == len(data.parts) + 2 * sample["partitions"]
    assert again.manifest["release"] == result.manifest["release"]
    np.testing.assert_array_equal(again.basis, result.basis)


def test_the_full_pass_releases_the_gram_and_sum_of_the_separate_passes(
    small_route, monkeypatch
) -> None:
    """At the released centre c and bound B₂, the Gram that gets the noise and the sum that
    gets ``centred_sum``'s noise are the separate passes' (clip, then sum): within 10⁻¹²."""
    rows, _ = _drift_rows(100_000)
    seen: dict[str, Any] = {}
    real_gauss, real_mean = cov.analyze_gauss, cov.release_centred_mean

    def spy_gauss(gram, *args):
        seen["gram"] = gram
        return real_gauss(gram, *args)

    def spy_mean(ctx, clipped_sum, *args):
        seen["sum"] = clipped_sum
        return real_mean(ctx, clipped_sum, *args)

    monkeypatch.setattr(cov, "analyze_gauss", spy_gauss)
    monkeypatch.setattr(cov, "release_centred_mean", spy_mean)
    data = array_dataset(rows)
    result = run_estimate(_config(), lambda _e: data, None, noise_seed=NOISE_SEED)
    release, parameters = result.manifest["release"], result.manifest["parameters"]
    centre = np.asarray(release["centre_sample_mean"])
    bound = parameters["row_norm"]
    clipped = clip_rows(rows - centre, bound)  # scaled by 1/B₂ too
    expected = gram_of(clipped)
    assert np.abs(seen["gram"] - expected).max() <= 1e-12 * np.abs(expected).max()
    np.testing.assert_allclose(seen["sum"], clipped.sum(axis=0), rtol=1e-10, atol=1e-9)
    # the published mean: the centre plus B₂ × the released mean of the clipped rows
    assert np.abs(np.asarray(release["mean"]) - rows.mean(axis=0)).max() < 0.05


def test_the_correction_removes_the_bias_of_a_sample_of_sorted_partitions(
    small_route, monkeypatch
) -> None:
    """Known answer: rows sorted by a drift ⟂ the top-2 plane. The sample's centre is off
    along the drift; with ``centred_sum`` the released plane is the true one, without it
    (the shift dropped) n·eeᵀ pulls the drift into the plane."""
    rows, plane = _drift_rows()
    data = array_dataset(rows)
    run = functools.partial(run_estimate, _config(), lambda _e: data, None)
    corrected = run(noise_seed=NOISE_SEED)
    sample_mean = np.asarray(corrected.manifest["release"]["centre_sample_mean"])
    offset = float(np.linalg.norm(sample_mean - rows.mean(axis=0)))
    assert offset > 1.5  # the sample is biased: its centre is ≥ 1.5 off
    assert _sin(corrected.basis, plane) < 0.05
    real = cov.bound_gram_and_correction

    def no_shift(*args: Any) -> Any:
        bound, quantile, gram, shift, centred = real(*args)
        return bound, quantile, gram, np.zeros_like(shift), centred

    monkeypatch.setattr(cov, "bound_gram_and_correction", no_shift)
    assert _sin(run(noise_seed=NOISE_SEED).basis, plane) > 0.5


def test_the_correction_step_is_calibrated_and_charged_at_its_grant() -> None:
    grant = ApproxDP(0.3, 1e-7)
    ctx = planned({"centred_sum": (0.3, 0.1), "rest": (0.7, 0.9)}, 2, epsilon=1.0, delta=1e-6)
    assert ctx.grant("centred_sum") == grant
    n, dim = 1000, 20_000
    release = cov.release_centred_mean(ctx, np.zeros(dim), n)
    accountant = ctx.accountant
    sigma = gaussian_sigma(grant, 2.0)
    assert release.sensitivity == 2.0 and release.sigma == pytest.approx(sigma)
    # the noise on the mean of the scaled rows: σ/n per coordinate, centred
    assert np.std(release.mean) == pytest.approx(sigma / n, rel=0.03)
    assert abs(np.mean(release.mean)) < 4 * sigma / n / np.sqrt(dim)
    stated = accountant.stated["centred_sum"]
    assert stated.epsilon == grant.epsilon and stated.delta <= grant.delta * (1 + 1e-9)
    assert [s["step"] for s in accountant.report()["steps"]] == ["centred_sum"]


def test_centred_sum_audit_catches_an_under_noised_twin(monkeypatch) -> None:
    """Neighbours: one clipped row −e₁ replaced by +e₁ moves s by 2 = Δ. The honest step's
    ε lower bound stays under its claim; a twin with half the noise (below the accountant,
    which cannot refuse it) is caught."""
    epsilon, delta = 2.0, 1e-5
    memo = functools.lru_cache(maxsize=None)(gaussian_sigma)
    monkeypatch.setattr(mechanism, "gaussian_sigma", memo)
    set_factor = scale_samplers(monkeypatch, "add_gaussian")
    spread = gaussian_sigma(ApproxDP(epsilon, delta), 2.0) / 2

    def step(row_sum: np.ndarray, rng: np.random.Generator) -> float:
        seed = int(rng.integers(2**63))  # the audit's generator seeds the run's private one
        ctx = planned({"centred_sum": (1.0, 1.0)}, seed, epsilon=epsilon, delta=delta)
        return float(cov.release_centred_mean(ctx, row_sum, 1).mean[0])

    def run(factor: float):
        set_factor(factor)
        event = lambda mean: mean > -1.0 + 3.0 * spread  # noqa: E731
        return audit(step, np.array([1.0]), np.array([-1.0]), event, 30_000, delta)

    honest, twin = run(1.0), run(0.5)
    assert honest.epsilon_lower < epsilon, honest
    assert twin.epsilon_lower > epsilon, twin


def test_the_sample_is_in_file_order_and_holds_the_target() -> None:
    data = array_dataset(np.arange(60.0).reshape(30, 2))
    data = dataclasses.replace(
        data,
        parts=[data.parts[0][i : i + 3] for i in range(0, 30, 3)],
        offsets=list(range(0, 30, 3)),
    )
    sample = centring.sample_partitions(data, 7, seed=4)
    assert sample.n_rows == 9 and len(sample.parts) == 3
    assert sample.offsets == sorted(sample.offsets)
    for part, offset in zip(sample.parts, sample.offsets, strict=True):
        np.testing.assert_array_equal(part, data.parts[offset // 3])
    assert centring.sample_partitions(data, 10**6, seed=4).n_rows == 30  # all of them


def test_below_the_threshold_the_run_is_todays_bit_for_bit(monkeypatch) -> None:
    """Too few partitions: the same manifest and basis as with the route switched off."""
    monkeypatch.setattr(row_cache, "IN_PROCESS_CACHE_BYTES", 0)
    data = array_dataset(_drift_rows(30_000)[0])
    first = run_estimate(_config(), lambda _e: data, None, noise_seed=NOISE_SEED)
    monkeypatch.setattr(cov, "SAMPLE_MIN_PARTITIONS", 10**9)
    second = run_estimate(_config(), lambda _e: data, None, noise_seed=NOISE_SEED)
    assert "centre_sample" not in first.manifest["parameters"]
    assert first.manifest["release"] == second.manifest["release"]
    np.testing.assert_array_equal(first.basis, second.basis)


def test_on_a_cluster_only_counts_sums_and_the_gram_reach_the_driver(
    small_route, dask_client
) -> None:
    """The per-bin sums (a bin may hold one row) stay on the workers: what the driver
    gathers is the sample's two passes' 102 counts, its clipped sum, the Gram and the
    centred rows' clipped sum (plus pickling), far below one partition of rows."""
    from bench.common import GatherMeter

    rows, plane = _drift_rows(100_000)
    data = array_dataset(rows)
    with GatherMeter() as meter:
        result = run_estimate(_config(), lambda _e: data, dask_client, noise_seed=NOISE_SEED)
    assert "centre_sample" in result.manifest["parameters"]
    assert _sin(result.basis, plane) < 0.05
    dim = rows.shape[1]
    summaries = 2 * 102 * 8 + 2 * dim * 8 + dim * dim * 8
    assert meter.calls >= 4
    assert summaries <= meter.bytes <= summaries + 8_192, meter.bytes
    assert meter.bytes < PART_ROWS * dim * 8 / 20
