"""End-to-end noise ledger: every noise draw of a whole run has the scale that the budget the
manifest says was charged for its step buys (docs/testing.md).

Each case runs one method the way a user does (``dpsub estimate``/``cluster``/``stream``/
``run``) while :func:`dpsub_dist.privacy.noise.draw_log` records every draw (kind, the
scale/σ asked for, sensitivity, size). From the published manifest alone (the charged
budget of each step, and the public or released numbers a step's sensitivity depends on)
:data:`STEP_SCALES` recomputes the scales each step may draw, with the package's
calibration functions and the sensitivities of the privacy argument written out here as
literals (ALGORITHMS.md). Then:

- every draw matches a charged step's formula: noise drawn from another step's grant, or
  at a fraction of the calibrated σ, matches none;
- every charged step drew noise (a step charged but never noised is a wiring error too).

Each CLI case runs twice: on a multi-process cluster (``--scheduler``) and without
``--scheduler``, which runs these small tables in process (the printed choice is checked).

A method added to the registries without a case here fails
:func:`test_every_method_has_a_noise_ledger_case`; a step added without a formula fails
the ledger check with its name.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpsub_dist import PrivateSubspace
from dpsub_dist.cli import main
from dpsub_dist.methods import REGISTRY
from dpsub_dist.privacy import mechanism, noise
from dpsub_dist.privacy.accountant import (
    ZCDP,
    Accountant,
    ApproxDP,
    Budget,
    gaussian_sigma,
    laplace_epsilon,
    zcdp_epsilon,
)
from dpsub_dist.synth import generate

NOISE_SEED = 0xD15EA5E
"""Private noise seed planted for these runs only, so that every run reaches its last step."""


def plant_noise_seeds(monkeypatch) -> None:
    """OS entropy (``secrets.randbits``) yields NOISE_SEED, NOISE_SEED + 1, …: every run is
    reproducible and each generator a run builds still gets its own seed."""
    seeds = itertools.count(NOISE_SEED)
    monkeypatch.setattr(noise.secrets, "randbits", lambda bits: next(seeds))


# Sensitivities of the privacy arguments (ALGORITHMS.md), as literals: a changed constant in
# the package must show up as a mismatch, not be reused by the test.
FRIEND_WEIGHT = 4.0  # §3: W moves by ≤ 4 when one of the t points is replaced
MAX_CELL_COUNT = 1.0  # §4: the largest cell count moves by ≤ 1
COUNT_VECTOR = 2.0  # §2: two cell counts move by 1
GRAM = {"replace": math.sqrt(2.0), "add_remove": 1.0}  # §7: upper triangle of AᵀA
ROW_SUM = 2.0  # §7: a − b for unit-norm rows
EIGENGAP = 2.0  # §7: Weyl, λ_k − λ_{k+1} moves by ≤ 2
PROJECTOR = {"replace": (math.sqrt(2.0), 3.0), "add_remove": (1.0, 2.0)}  # c/(L − s)
GAP_MAX_SCORE_GAP = 2.0  # §5: each span score moves by ≤ 1, their gap by ≤ 2
SULQ_GRAM = 2.0  # §9: one unit-norm row moves between clusters' Grams
TREE_NODE = math.sqrt(2.0)  # §8: Σ aaᵀ with ‖a‖ ≤ 1, replace one row
NORM_COUNT = 1.0  # norm_bound: a replaced row moves each count #{‖x‖ ≤ grid_j} by ≤ 1
VARIANCE_SUMS = math.sqrt(2.0)  # Σ ((v_iᵀz)², ‖z‖²) of norm-≤1 rows z, replace one row
POWER_PRODUCT = {"replace": math.sqrt(2.0), "add_remove": 1.0}  # ‖EV‖_F ≤ ‖E‖_F, V orthonormal
STANDARDIZE_PER_COLUMN = 2.0  # each column's histogram (2 bins) or (Σz/2c, Σz²/c²) pair, squared
STANDARDIZE_BINS = 513  # bins per column of the signed grid: 2·(40 + 24)·4 + 1


def _grant(step: dict[str, Any]) -> Budget:
    if "epsilon" in step:
        return ApproxDP(step["epsilon"], step["delta"])
    return ZCDP(step["rho"], step["delta0"])


class Repeated(float):
    """A scale a step may draw one or more times (the sparse vector's queries); any other
    scale a formula lists is drawn exactly once per time it is listed."""


def _sparse_vector(sensitivity: float, step: dict[str, Any], share: float = 1.0) -> list[float]:
    """AboveThreshold (§4): queries Lap(4Δ/ε), threshold Lap(2Δ′/ε), Δ′ = Δ + the query grid."""
    epsilon = share * laplace_epsilon(_grant(step))
    query = 4 * sensitivity / epsilon
    return [Repeated(query), 2 * (sensitivity + noise.grid_step(query)) / epsilon]


USER_COUNT_SHARE = 0.5  # norm_bound at user level: ñ = #users + Lap(1/(ε/2)), the rest searches


def _norm_bound(run: Run, step: dict[str, Any]) -> list[float]:
    """Row level: the sparse vector at ε. User level (n private): the noisy user count at
    half the ε, then the sparse vector at the rest."""
    if not run.user_level:
        return _sparse_vector(NORM_COUNT, step)
    count = NORM_COUNT / (USER_COUNT_SHARE * laplace_epsilon(_grant(step)))
    return [count, *_sparse_vector(NORM_COUNT, step, 1 - USER_COUNT_SHARE)]


def _core_noise(run: Run, step: dict[str, Any]) -> list[float]:
    """§3 step 3: σ for 16r/L, the PTR step's δ shifted by e^{−ε₁} under (ε, δ)."""
    grant = _grant(step)
    if isinstance(grant, ApproxDP):
        eps1 = laplace_epsilon(_grant(run.steps["core_test"]))
        grant = ApproxDP(grant.epsilon, grant.delta * math.exp(-eps1))
    return [
        gaussian_sigma(grant, 16 * r["radius"] / r["core_weight_lower_bound"])
        for r in run.releases
        if r.get("noise_sigma")
    ]


def _gap_test(run: Run, step: dict[str, Any]) -> list[float]:
    grant = _grant(step)
    if isinstance(grant, ZCDP):  # T24 §3.8.4: Gaussian gap under zCDP
        return [gaussian_sigma(grant, EIGENGAP)]
    return [EIGENGAP / laplace_epsilon(grant)]


def _projector_noise(run: Run, step: dict[str, Any]) -> list[float]:
    """One per release (each boosting group's), with its own released gap bound."""
    return [
        gaussian_sigma(_grant(step), scale / (release["gap_lower_bound"] - shift))
        for release in run.releases
        if "gap_lower_bound" in release
        for scale, shift in [PROJECTOR[release["neighbours"]]]
    ]


def _gram_noise(run: Run, step: dict[str, Any]) -> list[float]:
    """One per release (each boosting group's): σ for the Gram's sensitivity."""
    return [
        gaussian_sigma(_grant(step), GRAM[release["neighbours"]])
        for release in run.releases
        if "neighbours" in release
    ]


def _mean(run: Run, step: dict[str, Any]) -> list[float]:
    """§7: σ for the row sum, drawn on the mean: scaled by mean_row_norm/n (n public; a
    stream's mean is its first batch's, mean_n_rows); one per boosting group (each centres
    its own rows)."""
    units = [
        p["mean_row_norm"] / p.get("mean_n_rows", n) for p, n in run.parameters if p.get("center")
    ]
    return [gaussian_sigma(_grant(step), ROW_SUM) * unit for unit in units]


def _refined_mean(run: Run, step: dict[str, Any]) -> list[float]:
    """The refined centre (CoinPress step): σ for the row sum of the rows centred at the coarse
    mean and clipped to refined_row_norm, drawn on the mean: scaled by refined_row_norm/n."""
    units = [p["refined_row_norm"] / n for p, n in run.parameters if p.get("refined_row_norm")]
    return [gaussian_sigma(_grant(step), ROW_SUM) * unit for unit in units]


def _explained_variance(run: Run, step: dict[str, Any]) -> list[float]:
    """σ for the k + 1 sums, drawn on the variances: scaled by C²/n (C = variance_row_norm)."""
    units = [
        r["variance_row_norm"] ** 2 / n
        for (_, n), r in zip(run.parameters, run.releases, strict=True)
        if r.get("variance_row_norm")
    ]
    return [gaussian_sigma(_grant(step), VARIANCE_SUMS) * unit for unit in units]


def _tree_node(run: Run, step: dict[str, Any]) -> list[float]:
    """§8: every node gets ρ_tree/L (each row is in ≤ L released nodes), ρ_tree the tree's
    share of the stream's ρ; step ``batch 2^h`` is charged one node's ρ_tree/L, and each
    node of level h a release uses (even index i, its batches (i+1)·2^h ≤ t appended) draws
    it: disjoint batches, parallel composition."""
    tree = run.manifest["parameters"]["tree_rho"]
    levels = run.manifest["parameters"]["levels"]
    assert math.isclose(step["rho"], tree / levels, rel_tol=1e-12), step
    spans = run.manifest["stream"]["step"] // int(step["step"].split()[1])  # t // 2^h
    return [gaussian_sigma(ZCDP(tree / levels), TREE_NODE)] * ((spans + 1) // 2)


def _power_iterations(run: Run, step: dict[str, Any]) -> list[float]:
    """T Gaussians, iteration t at ρ_t (the manifest's ``rho_per_iteration``, split by
    ``privacy.noisy_power.iteration_shares``): valid only if Σ ρ_t is within the grant (ρ for a zCDP
    grant; for (ε, δ), if (Σ ρ_t)-zCDP implies it: CKS conversion)."""
    grant, release = _grant(step), run.manifest["release"]
    rhos = release["rho_per_iteration"]
    if len(rhos) != run.manifest["parameters"]["iterations"]:
        return []
    total = math.fsum(rhos)
    if isinstance(grant, ZCDP):
        if total > grant.rho * (1 + 1e-9):
            return []  # the T iterations together would overspend the charged grant
    elif zcdp_epsilon(total, grant.delta) > grant.epsilon:
        return []
    return [POWER_PRODUCT[release["neighbours"]] / math.sqrt(2 * rho) for rho in rhos]


def _standardize(run: Run, step: dict[str, Any]) -> list[float]:
    """Each standardisation step: one Gaussian for Δ = √(2D) on its stacked vector."""
    return [gaussian_sigma(_grant(step), math.sqrt(STANDARDIZE_PER_COLUMN * run.manifest["dim"]))]


Formula = Callable[["Run", dict[str, Any]], list[float]]

STEP_SCALES: dict[str, Formula] = {
    "radius_search": lambda run, step: _sparse_vector(FRIEND_WEIGHT, step),
    "cell_search": lambda run, step: _sparse_vector(MAX_CELL_COUNT, step),
    "norm_bound": _norm_bound,
    "variance_norm_bound": lambda run, step: _sparse_vector(NORM_COUNT, step),
    "centred_norm_bound": lambda run, step: _sparse_vector(NORM_COUNT, step),
    "mean_norm_bound": lambda run, step: _sparse_vector(NORM_COUNT, step),
    "refined_mean": _refined_mean,
    "explained_variance": _explained_variance,
    "core_test": lambda run, step: [FRIEND_WEIGHT / laplace_epsilon(_grant(step))],
    "core_noise": _core_noise,
    "histogram": lambda run, step: [COUNT_VECTOR / laplace_epsilon(_grant(step))],
    "gram_noise": _gram_noise,
    "mean": _mean,
    "centred_sum": lambda run, step: [  # §7: the clipped centred rows' sum, drawn on /n
        gaussian_sigma(_grant(step), ROW_SUM) / run.manifest["n_rows"]
    ],
    "gap_test": _gap_test,
    "projector_noise": _projector_noise,
    "gap_max": lambda run, step: [GAP_MAX_SCORE_GAP / laplace_epsilon(_grant(step))],
    r"iteration_\d+": lambda run, step: [gaussian_sigma(_grant(step), SULQ_GRAM)],
    r"batch \d+": _tree_node,
    "power": _power_iterations,
    "standardize_histogram|standardize_moments|standardize_refine": _standardize,
}
"""Step name (a regular expression) → the noise scales that step's charged budget buys."""


@dataclass
class Run:
    """One finished run: its manifest and every noise draw made while it ran."""

    manifest: dict[str, Any]
    draws: list[noise.Draw]

    @property
    def user_level(self) -> bool:
        return self.manifest["parameters"].get("unit_column") is not None

    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        return {s["step"]: s for s in self.manifest["privacy"]["budget"]["steps"]}

    @property
    def parameters(self) -> list[tuple[dict[str, Any], int]]:
        """The run's parameters and n, and each boosting group's."""
        groups = self.manifest["parameters"].get("group_runs", [])
        runs = [(self.manifest["parameters"], self.manifest["n_rows"])]
        return runs + [(g["parameters"], g["n_rows"]) for g in groups]

    @property
    def releases(self) -> list[dict[str, Any]]:
        """The run's release, and each boosting group's."""
        groups = self.manifest["parameters"].get("group_runs", [])
        return [self.manifest["release"], *(g["release"] for g in groups)]


def _formula(step: str) -> Formula:
    matches = [f for pattern, f in STEP_SCALES.items() if re.fullmatch(pattern, step)]
    assert len(matches) == 1, f"no noise formula for step {step!r}: add one to STEP_SCALES"
    return matches[0]


def check_noise_ledger(run: Run) -> None:
    """Every draw is at a scale some charged step buys; every charged step drew."""
    assert run.draws, "no noise was drawn"
    allowed = {name: _formula(name)(run, step) for name, step in run.steps.items()}
    used: set[str] = set()
    for draw in run.draws:
        owners = [
            name
            for name, scales in allowed.items()
            if any(math.isclose(draw.scale, s, rel_tol=1e-12) for s in scales)
        ]
        assert owners, f"{draw} matches no charged step's calibration: {allowed}"
        used.update(owners)
    assert used == set(allowed), f"charged but never noised: {set(allowed) - used}"


# ------------------------------------------------------------- what each step draws, and how

OVERCLUSTER = 4  # §9: SuLQ releases 4K planes' Grams in its first ⌊T/2⌋ iterations, then K


def _triangle(run: Run) -> int:
    return run.manifest["dim"] * (run.manifest["dim"] + 1) // 2


def _sulq_planes(run: Run, name: str) -> int:
    iterations, number = run.manifest["parameters"]["iterations"], int(name.split("_")[1])
    clusters = run.manifest["parameters"]["clusters"]
    return (OVERCLUSTER if number <= iterations // 2 else 1) * clusters


Size = Callable[["Run", str], "int | range"]

STEP_SIZES: dict[str, Size] = {
    "radius_search|cell_search|norm_bound|variance_norm_bound|centred_norm_bound": lambda r, n: 1,
    "mean_norm_bound": lambda run, name: 1,
    "core_test|gap_test|gap_max": lambda run, name: 1,
    "core_noise": lambda run, name: (
        run.manifest["dim"] ** 2 * run.manifest["parameters"].get("clusters", 1)
    ),  # the flattened projector(s)
    "histogram": lambda run, name: range(1, run.manifest["parameters"]["subsets"] + 1),
    "explained_variance": lambda run, name: (
        run.manifest["rank"] * (run.manifest["rank"] + 1) // 2 + 1
    ),
    "mean|centred_sum|refined_mean": lambda run, name: run.manifest["dim"],
    "gram_noise|projector_noise": lambda run, name: _triangle(run),
    r"batch \d+": lambda run, name: _triangle(run),
    r"iteration_\d+": lambda run, name: _sulq_planes(run, name) * _triangle(run),
    "power": lambda run, name: run.manifest["dim"] * run.manifest["parameters"]["width"],
    "standardize_histogram": lambda run, name: run.manifest["dim"] * STANDARDIZE_BINS,
    "standardize_moments|standardize_refine": lambda run, name: 2 * run.manifest["dim"],
}
"""Step name (a regular expression) → how many noise values each of its draws holds, from the
public shape of what the step releases (a range where that count is not public)."""


@dataclass
class Expected:
    step: str
    scale: float
    size: int | range
    repeated: bool
    drawn: int = 0


def _size_rule(step: str) -> Size:
    matches = [f for pattern, f in STEP_SIZES.items() if re.fullmatch(pattern, step)]
    assert len(matches) == 1, f"no draw size for step {step!r}: add one to STEP_SIZES"
    return matches[0]


PER_GROUP = {
    "mean",
    "refined_mean",
    "explained_variance",
    "core_noise",
    "gram_noise",
    "projector_noise",
}
"""Formulas that already list one scale per boosting group (each group's own n or bound)."""


def expected_draws(run: Run) -> list[Expected]:
    """Every draw the charged steps buy: scale, size, and whether it may repeat. Boosting
    charges each step once (parallel composition) and every group draws it."""
    groups = len(run.manifest["parameters"].get("group_runs", [])) or 1
    out = []
    for name, step in run.steps.items():
        size = _size_rule(name)(run, name)
        copies = 1 if name in PER_GROUP else groups
        for scale in _formula(name)(run, step) * copies:
            out.append(Expected(name, float(scale), size, isinstance(scale, Repeated)))
    return out


def _fits(draw: noise.Draw, slot: Expected) -> bool:
    size = slot.size if isinstance(slot.size, range) else range(slot.size, slot.size + 1)
    return math.isclose(draw.scale, slot.scale, rel_tol=1e-12) and draw.size in size


IN_ORDER = "power"
"""Steps whose formula lists one scale per draw in the order they are drawn (iteration t at
σ_t): a draw may not fill a later slot while an earlier one of the step is empty."""


def check_draw_counts(run: Run) -> list[str]:
    """Each draw fills one slot the charged steps buy (scale and number of values), each slot
    is drawn exactly once (a repeated one at least once): a matrix shared across clusters, a
    tree node or an iteration left un-noised, one σ reused for all iterations (or drawn out of
    order), or a step the plan does not hold fail here. Returns each draw's step."""
    slots = expected_draws(run)
    owners = []
    for draw in run.draws:
        free = [s for s in slots if _fits(draw, s) and (s.repeated or not s.drawn)]
        assert free, f"{draw} fills no slot left by the charged steps: {slots}"
        if re.fullmatch(IN_ORDER, free[0].step):
            skipped = [s for s in slots[: slots.index(free[0])] if s.step == free[0].step]
            assert all(s.drawn for s in skipped), f"{draw} drawn before {skipped[0]}"
        free[0].drawn += 1
        owners.append(free[0].step)
    for slot in slots:  # two steps' identical repeated slots share their draws
        twins = [s for s in slots if s.repeated and s.scale == slot.scale and s.size == slot.size]
        if slot.repeated and sum(s.drawn for s in twins) >= len(twins):
            slot.drawn = max(slot.drawn, 1)
    missing = [s for s in slots if not s.drawn]
    assert not missing, f"charged but never drawn: {missing}"
    return owners


# ------------------------------------------------------------- what the sampler really drew


def _grid(scale: float) -> float:
    """The power of two g with scale/g in [2^30, 2^31) (docs/privacy-noise.md), restated."""
    return 2.0 ** (math.floor(math.log2(scale)) - 30)


def _least_parameter(draw: noise.Draw) -> Fraction:
    """The integer noise parameter (grid units) that keeps ``draw.scale`` valid after the
    value is rounded to the grid: t ≥ b(Δ + g·c)/(Δg), σ_g ≥ σ(Δ + g⌈√c⌉)/Δ·(1 + size·2⁻⁴⁰)/g."""
    g, scale = Fraction(draw.grid), Fraction(draw.scale)
    if draw.changed == 0:  # pure noise for a comparison (sparse vector): no rounded value
        return scale / g
    delta = Fraction(draw.sensitivity)
    if "gaussian" in draw.kind:
        widen = (delta + g * math.ceil(math.sqrt(draw.changed))) / delta
        return scale * widen * (1 + Fraction(draw.size, 2**40)) / g
    return scale * (delta + g * draw.changed) / (delta * g)


def _laplace_square(t: int) -> float:
    """E K² of the discrete Laplace P(K = k) ∝ e^{−|k|/t}: 2q/(1 − q)², q = e^{−1/t}."""
    q = math.exp(-1 / t)
    return 2 * q / (1 - q) ** 2


def check_samplers(draws: list[noise.Draw]) -> None:
    """The innermost sampler ran at the grid and integer parameter the asked scale needs, and
    what it drew has that spread: Σ K²/E K² over all values of a run (Gaussians, Laplaces
    apart) within 5 standard errors of the number of values (χ²-like; a sampler narrowed
    inside, reporting the asked σ, fails here)."""
    spread = {"gaussian": [0.0, 0.0, 2.0], "laplace": [0.0, 0.0, 5.0]}  # Σ ratio, N, Var
    for draw in draws:
        assert draw.grid == _grid(draw.scale), f"{draw}: grid {draw.grid}"
        assert draw.param >= _least_parameter(draw), f"{draw}: sampler parameter below the scale"
        family = "gaussian" if "gaussian" in draw.kind else "laplace"
        square = draw.param**2 if family == "gaussian" else _laplace_square(draw.param)
        if draw.bound is not None:
            assert draw.bound >= 10 * draw.param, draw  # truncation leaves the spread as is
        spread[family][0] += draw.square_sum / square
        spread[family][1] += draw.size
    for family, (total, count, variance) in spread.items():
        if count:
            z = (total - count) / math.sqrt(variance * count)
            assert abs(z) < 5, f"{family} noise spread off by {z:.1f} standard errors"


def _laplace_tail(t: int, m: int) -> float:
    """P(K ≥ m) for m ≥ 1 under P(K = k) ∝ e^{−|k|/t}: e^{−m/t}/(1 + e^{−1/t})."""
    return math.exp(-m / t) / (1 + math.exp(-1 / t))


def check_delta(run: Run, owners: list[str]) -> None:
    """δ from what was drawn, within its step's charged δ: a truncated Laplace's mass
    outside the overlap of two supports shifted by ⌈(Δ + g)/g⌉ (its drawn integer bound B and
    t); the stability histogram's chance that a new cell's noise (its drawn t) clears the
    published count threshold, twice (two cells move)."""
    thresholds = iter(r["count_threshold"] for r in run.releases if "count_threshold" in r)
    for draw, name in zip(run.draws, owners, strict=True):
        step = run.steps[name]
        charged = step.get("delta", step.get("delta0"))
        t = draw.param
        if draw.bound is not None:
            shift = math.ceil((GAP_MAX_SCORE_GAP + draw.grid) / draw.grid)
            q = math.exp(-1 / t)
            spent = math.exp(-(draw.bound - shift + 1) / t) * -math.expm1(-shift / t)
            spent /= 1 + q - 2 * math.exp(-(draw.bound + 1) / t)
        elif name == "histogram":
            above = math.floor((next(thresholds) - 1) / draw.grid)  # noise ≥ this clears it
            spent = 2 * _laplace_tail(t, above)
        else:
            continue
        assert spent <= charged * (1 + 1e-6), f"{name}: δ {spent:.3g} drawn, {charged:.3g} charged"


# ------------------------------------------------------------- the data side of each draw


def _diagonal(value: np.ndarray, dim: int) -> float:
    rows, cols = np.triu_indices(dim)
    return float(value.reshape(-1, rows.size)[:, rows == cols].sum())


def _clip_bounds(run: Run, units: int) -> dict[str, Callable[[np.ndarray], float]]:
    """Each step's pre-noise value as a number that rows clipped (and, at user level, each
    user's rows scaled) to norm ≤ 1 keep ≤ ``units``: a Gram's trace, a power product's
    Frobenius norm, a mean's norm over its bound, the variance sums over C²."""
    dim = run.manifest["dim"]
    means = [p["mean_row_norm"] for p, _ in run.parameters if p.get("center")]
    variance = [r["variance_row_norm"] for r in run.releases if r.get("variance_row_norm")]
    bounds = {
        "gram_noise": lambda v: _diagonal(v, dim) / units,
        r"iteration_\d+": lambda v: _diagonal(v, dim) / units,
        r"batch \d+": lambda v: _diagonal(v, dim) / units,
        "power": lambda v: float(np.linalg.norm(v)) / units,
        # (Σz/(2c), Σz²/c²) of z clipped to [−c, c]: each entry at most n/2 or n
        "standardize_moments|standardize_refine": lambda v: float(np.max(np.abs(v))) / units,
    }
    refined = [p["refined_row_norm"] for p, _ in run.parameters if p.get("refined_row_norm")]
    if means:
        bounds["mean"] = lambda v: float(np.linalg.norm(v)) / max(means)
    if refined:
        bounds["refined_mean"] = lambda v: float(np.linalg.norm(v)) / max(refined)
    if variance:
        bounds["explained_variance"] = lambda v: float(np.max(v)) / max(variance) ** 2
    return bounds


def check_clipped(run: Run, owners: list[str], units: int) -> None:
    """Every row (every user) was clipped before it was summed: with a row far above every
    bound in the data, each summed value stays within what clipped rows can reach."""
    bounds = _clip_bounds(run, units)
    for draw, name in zip(run.draws, owners, strict=True):
        rule = [f for pattern, f in bounds.items() if re.fullmatch(pattern, name)]
        if rule and draw.value is not None:
            reach = rule[0](draw.value)
            assert reach <= 1 + 1e-6, f"{name}: summed value at {reach:.3g}× its clipped range"


def check_fresh_noise(draws: list[noise.Draw]) -> None:
    """No two draws reuse one noise stream: their Σ K² (integers of ~2³⁰ grid steps) differ.
    Boosting's groups, or two steps, drawing from generators with one seed fail here."""
    seen: dict[tuple[int, float], noise.Draw] = {}
    for draw in draws:
        key = (draw.size, draw.square_sum)
        assert draw.square_sum == 0 or key not in seen, f"{draw} repeats {seen[key]}'s noise"
        seen[key] = draw


def record_charges(monkeypatch) -> list[tuple[str, Any]]:
    """Every (step, mechanism or budget) charged to any accountant while the test runs."""
    charges: list[tuple[str, Any]] = []
    charge = Accountant.charge

    def recorded(self: Accountant, step: str, cost: Any) -> None:
        charges.append((step, cost))
        charge(self, step, cost)

    monkeypatch.setattr(Accountant, "charge", recorded)
    return charges


def check_charged_gaussians_drew(
    draws: list[noise.Draw], owners: list[str], charges: list[tuple[str, Any]]
) -> None:
    """The object charged is the object that draws: every charged Gaussian's σ/Δ (what its
    privacy map reads) is the σ/Δ of some draw of its step (a Gaussian charged at another
    gate, sensitivity or grant than the one drawn, whose stated cost still fits, fails here)."""
    for step, cost in charges:
        if isinstance(cost, mechanism.Gaussian):
            ratio = cost.sigma / cost.sensitivity
            drawn = [
                d.scale / d.sensitivity for d, o in zip(draws, owners, strict=True) if o == step
            ]
            assert any(math.isclose(r, ratio, rel_tol=1e-9) for r in drawn), (step, ratio, drawn)


def check_run(run: Run, units: int, charges: list[tuple[str, Any]] | None = None) -> None:
    """All of the net's per-run checks (docs/testing.md, "The end-to-end net")."""
    check_noise_ledger(run)
    check_fresh_noise(run.draws)
    owners = check_draw_counts(run)
    check_samplers(run.draws)
    check_delta(run, owners)
    check_clipped(run, owners, units)
    if charges is not None:
        check_charged_gaussians_drew(run.draws, owners, charges)


# ----------------------------------------------------------------------------- the runs


FAR_ROW = 1e6
"""A row this many times longer than the data's typical row sits in the first file of every
dataset: unclipped, it would dominate any sum it reaches (``check_clipped``)."""


def plant_far_row(source: Path) -> Path:
    """Scale the first row of ``source``'s first file by :data:`FAR_ROW`; returns ``source``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = sorted(source.glob("*.parquet"))[0]
    table = pq.read_table(first)
    columns = []
    for name in table.column_names:
        values = table.column(name).to_numpy().copy()
        if np.issubdtype(values.dtype, np.floating):
            values[0] *= FAR_ROW
        columns.append(pa.array(values, type=table.schema.field(name).type))
    pq.write_table(pa.table(columns, schema=table.schema), first)
    return source


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("noise-ledger")
    return {
        name: path if name == "exact" else plant_far_row(path)
        for name, path in _generated(root).items()
    }


def _generated(root: Path) -> dict[str, Path]:
    return {
        "rows": generate(root / "rows", rows=20_000, dim=8, rank=2, partitions=2, seed=1).path,
        "batches": generate(  # one batch per file, STREAM_HORIZON of them: every level closes
            root / "batches", rows=20_000, dim=8, rank=2, partitions=STREAM_HORIZON, seed=1
        ).path,
        "clusters": generate(
            root / "clusters", rows=60_000, dim=8, rank=2, clusters=2, partitions=2, seed=1
        ).path,
        "sampled": generate(  # ≥ 8 partitions, n/8 ≥ 5·10⁴: gauss's sampled centre
            root / "sampled", rows=400_000, dim=8, rank=2, partitions=8, seed=1
        ).path,
        "wide": generate(  # √D·σ/n ≥ 0.1 for the single mean: gauss refines its centre
            root / "wide", rows=1_000, dim=200, rank=2, partitions=2, seed=1
        ).path,
        "exact": generate(  # float64: exact needs rows in their span to ~1e-12
            root / "exact", rows=150, dim=5, rank=2, model="exact", dtype="float64", seed=1
        ).path,
    }


BUDGET = ["--epsilon", "4", "--delta", "1e-6"]
RHO = ["--rho", "1", "--delta", "1e-6"]
COV = ["--row-norm", "5"]


@dataclass(frozen=True)
class Case:
    """How a user runs one method: ``command`` (estimate, cluster, …) and its arguments."""

    method: str
    command: str
    source: str
    args: tuple[str, ...] = ()


def _estimate(method: str, *args: str) -> Case:
    return Case(method, "estimate", "rows", args)


def _cluster(method: str, *args: str) -> Case:
    return Case(f"cluster {method}", "cluster", "clusters", (*BUDGET, "--clusters", "2", *args))


CASES = {
    "friendly": _estimate("friendly", *BUDGET, "--method", "friendly"),
    "friendly zcdp": _estimate("friendly", *RHO, "--method", "friendly"),
    "friendly fixed radius": _estimate("friendly", *BUDGET, "--radius", "0.1"),
    "histogram": _estimate("histogram", *BUDGET, "--method", "histogram"),
    "histogram zcdp": _estimate("histogram", *RHO, "--method", "histogram"),
    "gauss centred": _estimate("gauss", *BUDGET, "--method", "gauss", *COV, "--center"),
    "gauss zcdp": _estimate("gauss", *RHO, "--method", "gauss", *COV),
    "gap-perturb": _estimate("gap-perturb", *BUDGET, "--method", "gap-perturb", *COV),
    "gap-perturb zcdp": _estimate("gap-perturb", *RHO, "--method", "gap-perturb", *COV),
    "gauss private norm": _estimate("gauss", *BUDGET, "--method", "gauss", "--center"),
    "gap-perturb private norm zcdp": _estimate("gap-perturb", *RHO, "--method", "gap-perturb"),
    "auto": _estimate("auto", *BUDGET, "--method", "auto"),  # gauss, private norm, centred
    "gauss wide refined centre": Case("gauss", "estimate", "wide", (*BUDGET, "--method", "gauss")),
    "auto wide refined centre": Case(  # ρ = 0.1: the single mean's √D·σ/n is 0.15 there
        "auto", "estimate", "wide", ("--rho", "0.1", "--delta", "1e-6")
    ),
    "auto sampled centre": Case("auto", "estimate", "sampled", (*BUDGET, "--method", "auto")),
    "power private norm centred": _estimate("power", *BUDGET, "--method", "power", "--center"),
    "power zcdp": _estimate("power", *RHO, "--method", "power", *COV, "--iterations", "3"),
    "gauss standardized": _estimate("gauss", *BUDGET, "--method", "gauss", "--standardize"),
    "power standardized zcdp": _estimate(
        "power", *RHO, "--method", "power", "--standardize", "--iterations", "3"
    ),
    "friendly standardized": _estimate(
        "friendly", *BUDGET, "--method", "friendly", "--standardize"
    ),
    "exact": Case("exact", "api", "exact", (*BUDGET, "--method", "exact")),
    "exact zcdp": Case("exact", "api", "exact", (*RHO, "--method", "exact")),
    "boost": _estimate("boost", *BUDGET, "--method", "friendly", "--boost", "2"),
    "cluster sample-aggregate": _cluster("sample-aggregate"),
    "cluster sample-aggregate histogram": _cluster(
        "sample-aggregate", "--aggregator", "histogram", "--epsilon", "12"
    ),  # at ε = 4 the histogram aggregator ends in ⊥ for about half the noise seeds
    "cluster sulq": _cluster("sulq", "--method", "sulq"),
    "stream": Case("stream online", "stream", "batches", tuple(RHO)),  # private bound, centred
    "stream public bound": Case("stream online", "stream", "batches", (*RHO, "--clip-norm", "5")),
    "stream uncentred": Case("stream online", "stream", "batches", (*BUDGET, "--no-center")),
    "run": Case("run", "run", "rows"),
}
"""Every way to run a method, under (ε, δ) and ρ-zCDP where it has both paths."""

NOT_DP = {
    "cluster gibbs": "a finite Gibbs chain claims no DP guarantee (privacy-exact-gibbs.md): "
    "not a calibrated noise mechanism, so there is no scale to check"
}


def test_every_method_has_a_noise_ledger_case() -> None:
    """Registered methods, boosting, every clustering method, streams and ledgered runs."""
    estimate, cluster, stream = REGISTRY["estimate"], REGISTRY["cluster"], REGISTRY["stream"]
    registered = {*estimate, "boost", "run", *(f"cluster {m}" for m in cluster)}
    registered |= {f"stream {m}" for m in stream}
    assert {case.method for case in CASES.values()} == registered - set(NOT_DP)


def run_case(case: Case, source: Path, tmp: Path, scheduler: str | None) -> tuple[dict, np.ndarray]:
    """Run ``case`` as a user would; its manifest and released basis. ``scheduler``: the
    cluster's address, or None: no --scheduler, so these small tables run in process."""
    if case.command == "api":
        return _api_run(case, source)
    out = _cli_run(case, source, tmp, scheduler)
    return json.loads((out / "manifest.json").read_text()), np.load(out / "basis.npy")


def _api_run(case: Case, source: Path) -> tuple[dict, np.ndarray]:
    """``PrivateSubspace.fit`` without a client: GAP-MAX then draws in this process (with a
    client it draws in its one worker task, out of this log's sight)."""
    import pyarrow.parquet as pq

    args = dict(zip(case.args[::2], case.args[1::2], strict=True))
    rows = np.vstack(
        [pq.read_table(p).to_pandas().to_numpy() for p in sorted(source.glob("*.parquet"))]
    )
    budget = {k.lstrip("-"): float(v) for k, v in args.items() if k != "--method"}
    est = PrivateSubspace(2, method=args["--method"], seed=3, **budget).fit(rows)
    return est.manifest_, est.basis_


def _cli_run(case: Case, source: Path, tmp: Path, scheduler: str | None) -> Path:
    common = ["--scheduler", scheduler, "--quiet"] if scheduler else []
    if case.command == "stream":
        state = tmp / "stream.db"
        init = ["stream", "init", str(state), "--horizon", str(STREAM_HORIZON), "--rank", "2"]
        assert main([*init, *case.args]) == 0
        batches = sorted(source.glob("*.parquet"))
        assert len(batches) == STREAM_HORIZON, "the stream must close its top tree level"
        for i, part in enumerate(batches):
            out = tmp / f"step{i}"
            append = ["stream", "append", str(state), str(part), "--out", str(out)]
            assert main([*append, *common]) == 0
        return out
    if case.command == "run":
        ledger = tmp / "ledger.db"
        grant = ["--ledger", str(ledger), "--dataset", f"{source}/", *BUDGET[:1], "10"]
        assert main(["budget", "init", *grant, "--delta", "1e-5"]) == 0
        job = tmp / "job.yaml"
        job.write_text(
            f"dataset: {source}/\nrank: 2\nmethod: friendly\n"
            "budget: {epsilon: 4.0, delta: 1.0e-6}\n"
            f"output: {tmp}/{{run_id}}\nledger: {ledger}\n"
        )
        assert main(["run", str(job), "--run-id", "r1", *common]) == 0
        return tmp / "r1"
    rank = ["--rank", "2", "--seed", "3", "--out", str(tmp / "out")]
    assert main([case.command, str(source), *rank, *case.args, *common]) == 0
    return tmp / "out"


STREAM_HORIZON = 4
"""A stream case appends its whole horizon (one batch per file of its source): its top tree
level (batch 4 of 3 levels) closes and is drawn, and its last append has charged the whole
plan."""

IN_PROCESS = "in process"
"""The variant of a CLI case run without --scheduler: in process, as a small table runs."""


@pytest.mark.parametrize(
    ("name", "where"),
    [(name, "cluster") for name in sorted(CASES)]
    + [(name, IN_PROCESS) for name in sorted(CASES) if CASES[name].command != "api"],
)
def test_every_draw_has_the_scale_its_charged_budget_buys(
    name: str,
    where: str,
    data: dict[str, Path],
    tmp_path: Path,
    scheduler_address: str,
    monkeypatch,
    capsys,
) -> None:
    case = CASES[name]
    scheduler = None if where == IN_PROCESS else scheduler_address
    plant_noise_seeds(monkeypatch)
    accountants: list[Accountant] = []
    report = Accountant.report
    monkeypatch.setattr(Accountant, "report", lambda self: accountants.append(self) or report(self))
    charges = record_charges(monkeypatch)
    with noise.draw_log() as draws:
        manifest, _ = run_case(case, data[case.source], tmp_path, scheduler)
    assert manifest["outcome"] == "ok", manifest["release"]
    if scheduler is None and case.command != "api":
        chosen = [line for line in capsys.readouterr().err.splitlines() if " rows × " in line]
        assert chosen and chosen[-1].startswith("in process, no cluster ("), chosen
    check_run(Run(manifest, list(draws)), units=manifest["n_rows"], charges=charges)
    check_privacy_maps([a for a in accountants if a._plan is not None])


def check_privacy_maps(planned: list[Accountant]) -> None:
    """Every planned step was charged with a mechanism whose cost, computed from its own
    noise, is its grant: the same ε or ρ (to float rounding), a δ no larger (docs/methods.md,
    "Privacy maps"). Accountants without a plan (ledger, boosting's groups) charge budgets,
    not mechanisms; every method's run, streams included, charges a plan, and runs every
    planned step (a stream's later batches are run by later appends, so only its last
    append, at the end of the horizon, has run them all)."""
    assert planned, "a method's run charged no budget plan"
    for number, accountant in enumerate(planned, start=1):
        charged = dict(accountant._steps)
        assert set(accountant.stated) == set(charged), "a planned step was charged by name"
        later = re.compile(r"batch \d+" if number < len(planned) else "(?!)")
        unrun = {s for s in set(accountant._plan) - set(charged) if not later.fullmatch(s)}
        assert set(charged) <= set(accountant._plan) and not unrun, "steps run ≠ steps planned"
        for step, stated in accountant.stated.items():
            grant = charged[step]
            if isinstance(grant, ApproxDP):
                assert math.isclose(stated.epsilon, grant.epsilon, rel_tol=1e-9), step
                assert stated.delta <= grant.delta * (1 + 1e-9), step
            else:
                assert math.isclose(stated.rho, grant.rho, rel_tol=1e-9), step
                assert stated.delta0 <= grant.delta0 * (1 + 1e-9), step
