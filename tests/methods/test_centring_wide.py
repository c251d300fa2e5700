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


def steps(config: EstimateConfig, rows: int, dim: int) -> list[str]:
    _, grants = plan_budget(config, array_dataset(np.zeros((rows, dim))))
    return list(grants)


def test_a_wide_table_declares_the_refined_centre_and_a_tall_one_does_not() -> None:
    """Shape and √D·σ/n of the single mean decide (public): n ≤ 10·D and 0.175 at n = 1,000,
    D = 200, ε = 4; 0.0017 at n = 20,000, D = 8; digits' shape (n/D = 28) keeps one step.
    A public --row-norm or user level keeps today's route."""
    config = EstimateConfig(2, epsilon=4.0, delta=1e-6, method="gauss")
    wide = steps(config, 1_000, 200)
    assert wide[:5] == [
        "norm_bound",
        "mean",
        "mean_norm_bound",
        "refined_mean",
        "centred_norm_bound",
    ]
    assert not set(REFINED) & set(steps(config, 20_000, 8))
    digits = dataclasses.replace(config, parsed_budget=None, epsilon=1.0)  # κ = 0.20, n/D = 28
    assert not set(REFINED) & set(steps(digits, 1_797, 64))
    public = dataclasses.replace(config, row_norm=5.0)
    assert not set(REFINED) & set(steps(public, 1_000, 200))


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


def test_the_refined_mean_draws_at_its_grant_and_searches_the_published_quantile() -> None:
    """Calibration: the published σ is the Gaussian's for Δ = 2 at the step's charge, the
    centre is the coarse mean plus the refined release, and the bound's quantile is
    1 − min(4√D·σ/n, 0.5) with the margins (:func:`centring.refined_quantile`)."""
    rows, _ = far_table(0)
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
    assert np.linalg.norm(refined) < parameters["refined_row_norm"] + 6 * step * math.sqrt(200)
