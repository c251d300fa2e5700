"""A wide table's centre (docs/centring.md, "Wide tables"): a coarse private mean, then the
Gaussian mean of the rows centred at it and clipped to a private bound on their norms (steps
``mean_norm_bound`` and ``refined_mean``), declared by gauss's plan from public facts only."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, plan_budget, run_estimate
from dpsub_dist.methods import _centring as centring
from dpsub_dist.privacy.accountant import gaussian_sigma

REFINED = ("mean_norm_bound", "refined_mean")


def far_table(seed: int, rows: int = 1_000, dim: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Rows 60 units from the origin (‖μ‖ = 60), spread ≈ 6 about μ (two directions of scale
    5 and 3, a bulk of norm 1): the wide table far from the origin, small. Rows, true mean."""
    rng = np.random.default_rng(seed)
    mean = rng.lognormal(0.0, 1.0, dim)
    mean *= 60.0 / np.linalg.norm(mean)
    basis = np.linalg.qr(rng.standard_normal((dim, 2)))[0]
    spread = (rng.standard_normal((rows, 2)) * [5.0, 3.0]) @ basis.T
    table = mean + spread + rng.standard_normal((rows, dim)) / math.sqrt(dim)
    return table, table.mean(axis=0)


def grants(config: EstimateConfig, rows: int, dim: int) -> dict:
    return plan_budget(config, array_dataset(np.zeros((rows, dim))))[1]


def steps(config: EstimateConfig, rows: int, dim: int) -> list[str]:
    return list(grants(config, rows, dim))


def test_wide_and_tall_tables_declare_the_refined_centre_at_their_shares() -> None:
    """A wide table (n ≤ 10·D, the single mean's √D·σ/n = 0.175 at n = 1,000, D = 200, ε = 4)
    refines with 0.25 of the budget per mean; a tall one (n = 20,000, D = 8) with half the
    one-step mean's share per mean, so the two cost the Gram what one did. A tall table whose
    refined mean's √D·σ/n is ≥ 0.1 (n = 5,000, D = 8 at ε = 0.3: 0.2; digits' 1,797 × 61 at
    ε = 1), a public --row-norm or user level keep one step."""
    config = EstimateConfig(2, epsilon=4.0, delta=1e-6, method="gauss")
    wide = steps(config, 1_000, 200)
    assert wide[:5] == [
        "norm_bound",
        "mean",
        "mean_norm_bound",
        "refined_mean",
        "centred_norm_bound",
    ]
    tall = grants(config, 20_000, 8)
    assert list(tall)[:5] == wide[:5]
    single = dataclasses.replace(config, parsed_budget=None, row_norm=5.0)  # one step
    one = grants(single, 20_000, 8)["mean"].epsilon  # no norm bound there: 0.2 of ε
    rest = 1.0 - 0.1  # the norm bounds' share, on the private route
    for step in ("mean", "refined_mean"):
        assert tall[step].epsilon == pytest.approx(one / 2 * rest, rel=1e-12)
    wide_grants = grants(config, 1_000, 200)
    assert wide_grants["mean"].epsilon == pytest.approx(0.25 * rest * 4.0, rel=1e-12)
    few = dataclasses.replace(config, parsed_budget=None, epsilon=0.3)
    assert not set(REFINED) & set(steps(few, 5_000, 8))
    digits = dataclasses.replace(config, parsed_budget=None, epsilon=1.0)
    assert not set(REFINED) & set(steps(digits, 1_797, 61))
    public = dataclasses.replace(config, row_norm=5.0)
    assert not set(REFINED) & set(steps(public, 1_000, 200))
    assert not set(REFINED) & set(steps(public, 20_000, 8))


def test_user_level_keeps_no_centre_on_a_wide_table() -> None:
    """User level: n is private and one user moves a row sum by their row count, so neither
    mean runs (the default is uncentred there; --center is refused before any read)."""
    config = EstimateConfig(2, epsilon=4.0, delta=1e-6, method="gauss", unit_column="user")
    assert not {"mean", *REFINED} & set(steps(config, 1_000, 200))


def run(rows: np.ndarray, seed: int, refine: bool) -> dict:
    dataset = dataclasses.replace(array_dataset(rows), refined_centre=refine)
    config = EstimateConfig(2, epsilon=4.0, delta=1e-6, method="gauss", seed=seed)
    return run_estimate(config, lambda _client: dataset, None).manifest


def test_the_refined_centre_is_closer_than_one_step_on_a_wide_table_far_from_the_origin() -> None:
    """The single mean's error grows with its bound (the raw rows', ≈ 60 here); the refined
    one's with the spread around the coarse centre (≈ 6 plus the coarse error)."""
    errors = {True: [], False: []}
    for seed in range(3):
        rows, mean = far_table(seed)
        for refine in errors:
            manifest = run(rows, seed, refine)
            assert ("refined_mean" in manifest["parameters"]["budget_shares"]) is refine
            errors[refine].append(np.linalg.norm(np.asarray(manifest["release"]["mean"]) - mean))
    assert np.median(errors[True]) < 0.6 * np.median(errors[False]), errors


@pytest.mark.parametrize("shape", [(1_000, 200), (20_000, 8)], ids=["wide", "tall"])
def test_the_refined_mean_draws_at_its_grant_and_searches_the_published_quantile(shape) -> None:
    """Calibration, on a wide and a tall table (each mean at its share): the published σ is
    the Gaussian's for Δ = 2 at the step's charge, the centre is the coarse mean plus the
    refined release, and the bound's quantile is 1 − min(4√D·σ/n, 0.5) with the margins
    (:func:`centring.refined_quantile`)."""
    rows, _ = far_table(0, *shape)
    manifest = run(rows, 0, True)
    parameters, release = manifest["parameters"], manifest["release"]
    _, grants = plan_budget(
        EstimateConfig(2, epsilon=4.0, delta=1e-6, method="gauss"), array_dataset(rows)
    )
    assert release["refined_mean_sensitivity"] == 2.0
    assert release["refined_mean_noise_sigma"] == pytest.approx(
        gaussian_sigma(grants["refined_mean"], 2.0), rel=1e-12
    )
    kappa = centring.mean_noise_ratio(grants["refined_mean"], len(rows), rows.shape[1])
    quantile = centring.refined_quantile(grants, len(rows), rows.shape[1])
    assert quantile == pytest.approx(1 - min(4 * kappa, 0.5))
    searched = re.search(r"q = ([0-9.]+)", parameters["refined_row_norm_source"])
    assert searched and float(searched.group(1)) == pytest.approx(quantile, abs=1e-3)
    refined = np.asarray(release["mean"]) - np.asarray(release["coarse_mean"])
    step = release["refined_mean_noise_sigma"] * parameters["refined_row_norm"] / len(rows)
    bound = parameters["refined_row_norm"] + 6 * step * math.sqrt(shape[1])
    assert np.linalg.norm(refined) < bound


def test_the_refined_centre_is_closer_than_one_step_on_a_tall_table_far_from_the_origin() -> None:
    """A year-like column: 20,000 rows ≈ 2,000 from the origin, spread ≈ 10 about the mean
    (issue #37's rwm5yr). The one-step mean's noise grows with the raw rows' bound (≈ 2,000),
    the refined one's with the spread around the coarse centre: at ε = 1 the tall route's
    half shares still bring the centre well within the spread."""
    errors: dict[bool, list[float]] = {True: [], False: []}
    for seed in range(3):
        rng = np.random.default_rng(seed)
        rows = rng.standard_normal((20_000, 8)) * [10, 6, 4, 2, 1, 1, 1, 1]
        rows[:, 0] += 2_000.0
        for refine in errors:
            dataset = dataclasses.replace(array_dataset(rows), refined_centre=refine)
            config = EstimateConfig(2, epsilon=1.0, delta=1e-6, method="gauss", seed=seed)
            manifest = run_estimate(config, lambda _client, d=dataset: d, None).manifest
            assert ("refined_mean" in manifest["parameters"]["budget_shares"]) is refine
            found = np.asarray(manifest["release"]["mean"]) - rows.mean(axis=0)
            errors[refine].append(float(np.linalg.norm(found)))
    assert np.median(errors[True]) < 0.3 * np.median(errors[False]), errors
