"""Boosting (SS21 Alg. 3, ALGORITHMS.md §5): selection, groups, parallel composition, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpsub_dist.cli import main
from dpsub_dist.context import EstimateResult, RunContext
from dpsub_dist.engine.assign import random_row_subsets
from dpsub_dist.engine.compute import Executor
from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.errors import InputError
from dpsub_dist.job import EstimateConfig, run_estimate, validate
from dpsub_dist.linalg import subspace_error
from dpsub_dist.methods import boost
from dpsub_dist.privacy import mechanism, noise
from dpsub_dist.privacy.accountant import ApproxDP, BudgetExceeded


def _rotated(basis: np.ndarray, angle: float, towards: np.ndarray) -> np.ndarray:
    """Turn the first column of ``basis`` by ``angle`` towards the unit vector ``towards``."""
    turned = basis.copy()
    turned[:, 0] = math.cos(angle) * basis[:, 0] + math.sin(angle) * towards
    return turned


E = np.eye(6)
PLANE = E[:, :2]


@pytest.mark.parametrize(
    ("groups", "needed"), [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2), (10, 5), (11, 6)]
)
def test_agreement_needed_is_ceil_of_0_6_b_minus_1(groups, needed):
    assert boost.agreement_needed(groups) == needed == max(0, math.ceil(0.6 * groups - 1 - 1e-12))


def test_select_first_estimate_with_enough_close_others():
    # B = 5 needs 2 others within 2α = 0.2. Groups 0 and 1 are far; 2, 3, 4 agree.
    bases = [
        E[:, [3, 4]],
        E[:, [4, 5]],
        _rotated(PLANE, 0.05, E[:, 2]),
        PLANE,
        _rotated(PLANE, -0.05, E[:, 3]),
    ]
    chosen, counts = boost.select_stable(bases, alpha=0.1)
    assert chosen == 2
    assert counts == [0, 0, 2, 2, 2]


def test_select_respects_the_2_alpha_boundary_and_bottom():
    near = _rotated(PLANE, math.asin(0.19), E[:, 2])  # distance 0.19 ≤ 0.2
    far = _rotated(PLANE, math.asin(0.21), E[:, 2])  # distance 0.21 > 0.2
    assert subspace_error(near, PLANE) == pytest.approx(0.19)
    assert boost.select_stable([PLANE, near, None], alpha=0.1) == (0, [1, 1, 0])
    assert boost.select_stable([PLANE, far, None], alpha=0.1) == (None, [0, 0, 0])
    assert boost.select_stable([None, None, None], alpha=0.1) == (None, [0, 0, 0])


def test_groups_are_disjoint_cover_rows_and_ignore_values():
    rows = np.random.default_rng(0).standard_normal((1000, 3))
    dataset = array_dataset(rows)
    dataset.parts, dataset.offsets = [rows[:400], rows[400:]], [0, 400]
    seed = boost.group_seed(17)
    sizes = boost.group_sizes([400, 600], seed, 3)
    kept = []
    for g in range(3):
        part = boost.group_dataset(dataset, g, 3, seed, sizes)
        blocks = [part.loader(p)[0] for p in part.parts]
        assert [len(b) for b in blocks] == sizes[:, g].tolist()
        assert part.n_rows == sizes[:, g].sum()
        assert part.offsets == [0, int(sizes[0, g])]  # rows renumbered within the group
        kept.append(np.concatenate(blocks))
    together = np.concatenate(kept)
    assert len(together) == 1000 and len(np.unique(together, axis=0)) == 1000
    # Replacing every value keeps every row's group: assignment depends on positions only.
    moved = boost.group_dataset(array_dataset(rows + 100.0), 1, 3, seed, sizes)
    moved.parts = [(rows[:400] + 100.0, 0), (rows[400:] + 100.0, 400)]
    again = np.concatenate([moved.loader(p)[0] for p in moved.parts])
    assert np.allclose(again - 100.0, kept[1])


def test_user_level_groups_keep_a_user_together():
    units = np.repeat(np.arange(50), 4)
    rows = np.arange(200.0)[:, None]
    seen = []
    for g in range(3):
        loader = boost.GroupLoader(lambda part: part, g, 3, 5, user_level=True)
        _, their_units = loader(((rows, units), 0))
        users, counts = np.unique(their_units, return_counts=True)
        assert set(counts) <= {4}  # whole users only
        seen.extend(users.tolist())
    assert sorted(seen) == list(range(50))  # each user in exactly one group


def test_group_seed_decorrelates_groups_from_subsets():
    # With the run's own seed for both hashes, group 0 of B = 2 would only ever reach
    # even subsets when t is even; with the derived group seed every subset is reached.
    positions = np.arange(20_000)
    seed = 123
    same = random_row_subsets(positions, seed, 2) == 0
    assert len(np.unique(random_row_subsets(positions[same], seed, 100))) == 50
    mine = random_row_subsets(positions, boost.group_seed(seed), 2) == 0
    assert len(np.unique(random_row_subsets(positions[mine], seed, 100))) == 100


def _planned(shares: dict[str, tuple[float, float]]) -> RunContext:
    """A boosted run's context with its plan declared, at (ε, δ) = (1, 1e-6)."""
    config = EstimateConfig(rank=1, epsilon=1.0, delta=1e-6)
    ctx = RunContext(config, array_dataset(np.eye(3)), Executor(None), False, None)
    ctx.plan(shares)
    return ctx


def _group(**charged: mechanism.Mechanism) -> EstimateResult:
    """A group's result that charged ``charged`` (step → mechanism), in that order."""
    return EstimateResult(None, {}, {}, charged)


def test_parallel_composition_charges_each_step_once_and_draws_nothing():
    """Each step once, in the groups' order, by the groups' mechanisms composed in parallel;
    the groups drew their noise, the boosted run draws none."""
    ctx = _planned({"search": (0.2, 0.0), "release": (0.8, 1.0)})
    search = mechanism.laplace(ApproxDP(0.2, 0.0), 1.0)
    gauss = mechanism.gaussian(ApproxDP(0.8, 1e-6), 1.0)
    groups = [_group(search=search), _group(search=search, release=gauss)]  # one stopped early
    with noise.draw_log() as log:
        boost.charge_parallel(ctx, groups)
    assert log == []
    assert ctx.charged == ["search", "release"]
    assert ctx.accountant.spent == ApproxDP(1.0, 1e-6)
    assert ctx.mechanisms["release"] == mechanism.Parallel((gauss,))


def test_parallel_composition_covers_every_group_s_total():
    """Groups whose steps cost differently: the step's cost is its largest over the groups,
    so a group that spent more than the step's grant is refused, not hidden by the others."""
    cheap, dear = (mechanism.laplace(ApproxDP(eps, 0.0), 1.0) for eps in (0.1, 0.3))
    assert mechanism.Parallel((cheap, dear)).cost().epsilon == pytest.approx(0.3)
    ctx = _planned({"search": (0.2, 0.0), "release": (0.8, 1.0)})
    with pytest.raises(BudgetExceeded):
        boost.charge_parallel(ctx, [_group(search=cheap), _group(search=dear)])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"boost": 1}, "--boost must be an integer ≥ 2"),
        ({"boost": 3, "boost_alpha": 0.5}, "--boost-alpha must be in"),
        ({"boost_alpha": 0.1}, "applies with --boost"),
    ],
)
def test_boost_options_are_validated(fields, message):
    config = EstimateConfig(rank=2, epsilon=1.0, delta=1e-6, **fields)
    with pytest.raises(InputError, match=message):
        validate(config)


def test_boosted_exact_in_library_agrees_and_reports_budget_once():
    rng = np.random.default_rng(9)
    basis, _ = np.linalg.qr(rng.standard_normal((8, 2)))
    rows = rng.standard_normal((200, 2)) @ basis.T  # ~67 rows per group: a clear gap
    config = EstimateConfig(rank=2, epsilon=2.0, delta=1e-6, method="exact", boost=3, seed=4)
    result = run_estimate(config, lambda client: array_dataset(rows), None)
    assert result.outcome == "ok" and subspace_error(result.basis, basis) < 0.01  # snapped release
    assert result.manifest["release"]["agreeing_groups"] == [2, 2, 2]
    runs = result.manifest["parameters"]["group_runs"]
    assert sum(r["n_rows"] for r in runs) == 200
    assert result.manifest["privacy"]["budget"]["spent"] == {"epsilon": 2.0, "delta": 1e-6}


def _estimate(small_dataset, out, scheduler, *extra):
    return main(
        [
            "estimate",
            str(small_dataset.path),
            "--rank",
            "2",
            "--epsilon",
            "2",
            "--delta",
            "1e-6",
            "--out",
            str(out),
            "--seed",
            "3",
            "--scheduler",
            scheduler,
            "--quiet",
            *extra,
        ]
    )


def test_cli_boost_3_on_cluster(small_dataset, scheduler_address, tmp_path):
    out = tmp_path / "run"
    # A public radius (about the spread of the subsets' points here) keeps each group's
    # friendly-core run reliable at n/3 rows; the wiring, not the aggregator, is under test.
    # --no-center (the data have mean 0): each group's noisy mean would widen the spread.
    args = ("--boost", "3", "--radius", "0.2", "--no-center")
    assert _estimate(small_dataset, out, scheduler_address, *args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    budget = manifest["privacy"]["budget"]
    assert budget["spent"] == {"epsilon": 2.0, "delta": 1e-6}  # once, not 3 times
    assert "parallel" in manifest["privacy"]["composition"]
    assert manifest["parameters"]["boost"]["groups"] == 3
    assert [r["outcome"] for r in manifest["parameters"]["group_runs"]] == ["ok"] * 3
    assert sum(r["n_rows"] for r in manifest["parameters"]["group_runs"]) == 20_000
    truth = np.load(small_dataset.truth_dir / "basis.npy")
    assert subspace_error(np.load(out / "basis.npy"), truth) < 0.15


def test_cli_boost_without_agreement_exits_3(small_dataset, scheduler_address, tmp_path, capsys):
    out = tmp_path / "run"
    code = _estimate(small_dataset, out, scheduler_address, "--boost", "2", "--boost-alpha", "1e-9")
    assert code == 3
    assert "boost_agreement" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["outcome"] == "no_stable_subspace"
    assert manifest["release"]["chosen_group"] is None
    assert not (out / "basis.npy").exists()


@pytest.mark.parametrize("method", ["gauss", "auto"])  # auto chooses gauss in each group
def test_cli_boost_charges_the_budget_when_groups_straddle_the_sampled_centre(
    tmp_path, scheduler_address, capsys, monkeypatch, method
):
    """Gauss's sampled-centre route splits the mean's charge (``mean`` + ``centred_sum``) and
    is decided from a group's public row count. With its row threshold lowered to this
    table's size, the three groups fall on both sides of it; the run must still charge its
    budget once (every group on one plan), not refuse with exit 4 after drawing noise."""
    from dpsub_dist.engine.sources import parquet_dataset
    from dpsub_dist.methods import gauss as covariance
    from dpsub_dist.synth import generate

    monkeypatch.setattr(covariance, "SAMPLE_MIN_ROWS", 1950)
    data = tmp_path / "data"
    generate(data, rows=48_000, dim=4, rank=1, partitions=16, seed=1)
    config = EstimateConfig(1, epsilon=20.0, delta=1e-6, method="gauss", center=True, seed=0)
    dataset = parquet_dataset(str(data), None, None, None, None)
    seed = boost.group_seed(0)
    sizes = boost.group_sizes(boost._part_rows(dataset), seed, 3)
    parts = [boost.group_dataset(dataset, g, 3, seed, sizes) for g in range(3)]
    routes = [covariance.centre_sample(config, part) is not None for part in parts]
    assert routes == [True, False, False]  # the precondition: the groups straddle the route
    out = tmp_path / "out"
    code = main(
        ["estimate", str(data), "--rank", "1", "--epsilon", "20", "--delta", "1e-6"]
        + ["--method", method, "--boost", "3", "--seed", "0", "--out", str(out)]
        + ["--scheduler", scheduler_address, "--quiet"]
    )
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    budget = manifest["privacy"]["budget"]
    assert budget["spent"]["epsilon"] == pytest.approx(20.0)
    assert budget["spent"]["delta"] == pytest.approx(1e-6)
    plans = {
        tuple(sorted(run["parameters"])) + ("centre_sample" in run["parameters"],)
        for run in manifest["parameters"]["group_runs"]
    }
    assert len(plans) == 1, plans  # one route for every group
