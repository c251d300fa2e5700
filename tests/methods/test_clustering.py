"""Private subspace clustering (issue 8, ALGORITHMS.md §9): local step, reduction to the
aggregator, SuLQ and Gibbs runners, utility with known subspaces, the CLI on a real cluster,
and bad input. Audits and calibration are in tests/privacy/test_clustering_audit.py.

Slow (``pytest -m slow tests/methods/test_clustering.py``): the issue's utility claim, K = 3 planes
of rank 2 in R²⁰, n = 300,000, ε = 1, median of 5 seeds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from dpsub_shim import dpsub

from dpsub_dist.cli import main
from dpsub_dist.engine.sources import Dataset, array_dataset, parquet_dataset
from dpsub_dist.engine.subsets import SubsetPlan, compute_subset_summaries
from dpsub_dist.errors import InputError
from dpsub_dist.job import ClusterConfig, run_cluster
from dpsub_dist.methods import _clustering as cl
from dpsub_dist.methods._clustering import (
    KPlaneStep,
    canonical_order,
    k_plane_clustering,
    matched_subspace_errors,
    merge_grams,
)
from dpsub_dist.privacy.subspace_clustering import random_bases
from dpsub_dist.synth import generate


def union_of_subspaces(
    n: int, dim: int, rank: int, clusters: int, seed: int, gamma: float = 0.01
) -> tuple[np.ndarray, np.ndarray]:
    """Rows x = U_c z + e (e ⟂ U_c, std γ), c uniform; returns rows and the K×d×q truth."""
    rng = np.random.default_rng(seed)
    bases = random_bases(rng, clusters, dim, rank)
    own = bases[rng.integers(0, clusters, n)]
    noise = gamma * rng.standard_normal((n, dim))
    noise -= np.einsum("ndq,nq->nd", own, np.einsum("ndq,nd->nq", own, noise))
    return np.einsum("ndq,nq->nd", own, rng.standard_normal((n, rank))) + noise, bases


def fit(
    rows: np.ndarray, client=None, noise_seed: int | None = None, **config
) -> tuple[np.ndarray | None, dict]:
    """``run_cluster`` on in-memory rows; ``noise_seed`` is the private seed a ledger run
    record would pass (OS entropy without it)."""
    cfg = ClusterConfig(**{"epsilon": 1.0, "delta": 1e-6, **config})
    result = run_cluster(cfg, lambda c: array_dataset(rows), client, noise_seed=noise_seed)
    return result.basis, result.manifest


# ----------------------------------------------------------------------------- local step


@pytest.mark.parametrize("seed", range(8))
def test_k_plane_clustering_recovers_planted_subspaces(seed: int) -> None:
    rows, truth = union_of_subspaces(600, 20, 2, 3, seed)
    bases = k_plane_clustering(rows, 3, 2, np.random.default_rng(seed))
    assert bases.shape == (3, 20, 2)
    assert matched_subspace_errors(bases, truth).max() < 0.02


def test_k_plane_clustering_is_robust_to_a_few_huge_rows() -> None:
    rows, truth = union_of_subspaces(600, 20, 2, 3, 11)
    rows[:6] = 1e6 * np.random.default_rng(0).standard_normal((6, 20))
    bases = k_plane_clustering(rows, 3, 2, np.random.default_rng(0))
    assert matched_subspace_errors(bases, truth).max() < 0.05


def test_local_step_emits_the_null_point_when_rows_cannot_fill_the_clusters() -> None:
    step = KPlaneStep(clusters=3, rank=2, dim=5, ref_points=4, seed=1)
    assert np.array_equal(step(np.ones((5, 5)), 0), np.zeros(3 * 5 * 4))  # 5 < K·q rows
    collinear = np.outer(np.arange(1.0, 41.0), np.ones(5))  # rank 1 < q
    assert np.array_equal(step(collinear, 0), np.zeros(3 * 5 * 4))
    assert step(union_of_subspaces(300, 5, 1, 3, 0)[0], 0).any()


def test_canonical_order_depends_only_on_the_set_of_subspaces() -> None:
    bases = random_bases(np.random.default_rng(4), 4, 10, 2)
    probe = np.random.default_rng(5).standard_normal(10)
    ordered = bases[canonical_order(bases, probe)]
    for perm in ([1, 0, 3, 2], [3, 2, 1, 0], [2, 0, 1, 3]):
        shuffled = bases[perm]
        np.testing.assert_array_equal(shuffled[canonical_order(shuffled, probe)], ordered)
    keys = [np.linalg.norm(b.T @ probe) for b in ordered]
    assert keys == sorted(keys)


def test_subsets_of_the_same_union_emit_nearly_the_same_point() -> None:
    """The aggregator needs agreement: disjoint subsets, different labels, one point."""
    step = KPlaneStep(clusters=3, rank=2, dim=20, ref_points=8, seed=9)
    rows, _ = union_of_subspaces(2400, 20, 2, 3, 8)
    points = np.stack([step(rows[i::4], i) for i in range(4)])
    spread = np.linalg.norm(points - points.mean(axis=0), axis=1)
    assert spread.max() < 0.05 * np.linalg.norm(points[0])


def test_changing_one_row_changes_exactly_one_summary() -> None:
    """§1: the whole method is as private as the aggregator once this holds."""
    rows, _ = union_of_subspaces(6000, 8, 1, 2, 3)
    changed = rows.copy()
    changed[1234] = 1e3 * np.arange(8)
    plan = SubsetPlan(subsets=12, n_rows=6000, seed=21, buckets=3)
    step = KPlaneStep(clusters=2, rank=1, dim=8, ref_points=4, seed=21)

    def summaries(data: np.ndarray) -> np.ndarray:
        dataset = array_dataset(data)
        return compute_subset_summaries(dataset.parts, dataset.offsets, dataset.loader, plan, step)

    before, after = summaries(rows), summaries(changed)
    differs = np.flatnonzero(np.any(before != after, axis=1))
    assert differs.tolist() == plan.subset_of(np.array([1234]), None).tolist()


def test_split_release_reads_bases_reports_blends_and_refuses_null_points() -> None:
    reference = np.random.default_rng(0).standard_normal((12, 8))
    bases = random_bases(np.random.default_rng(1), 2, 12, 2)
    blocks = np.stack([b @ (b.T @ reference) for b in bases])
    found, details = cl.split_release(blocks.ravel(), reference, 2, 2)
    assert matched_subspace_errors(found, bases).max() < 1e-6
    assert max(details["projection_residual"]) < 1e-6
    blend = (blocks + blocks[::-1]) / 2  # half the subsets had the two clusters swapped
    assert min(cl.split_release(blend.ravel(), reference, 2, 2)[1]["projection_residual"]) > 0.4
    found, details = cl.split_release(np.zeros(blocks.size), reference, 2, 2)
    assert found is None and details["failed_step"] == "null_check"


# ----------------------------------------------------------------------------- SuLQ pieces


def test_merge_grams_groups_planes_of_the_same_subspace() -> None:
    rows, truth = union_of_subspaces(3000, 12, 2, 2, 6)
    units = cl.unit_bounded(rows, None)
    labels = np.argmin(cl.squared_distances(units, truth), axis=1)
    grams = []
    for c in range(2):  # split each true cluster into three sectors by angle
        members = units[labels == c]
        angle = np.arctan2(*(members @ truth[c]).T)
        for sector in np.array_split(np.argsort(angle), 3):
            grams.append(members[sector].T @ members[sector])
    merged = merge_grams(np.stack(grams)[[0, 3, 1, 4, 2, 5]], 2, 2)
    bases = np.stack([np.linalg.eigh(g)[1][:, -2:] for g in merged])
    assert matched_subspace_errors(bases, truth).max() < 0.02


def test_unit_bounded_rows() -> None:
    rows = np.array([[3.0, 4.0], [0.0, 0.0], [0.3, 0.4]])
    np.testing.assert_allclose(cl.unit_bounded(rows, None), [[0.6, 0.8], [0, 0], [0.6, 0.8]])
    np.testing.assert_allclose(cl.unit_bounded(rows, 1.0), [[0.6, 0.8], [0, 0], [0.3, 0.4]])
    np.testing.assert_allclose(cl.unit_bounded(rows, 10.0), rows / 10)


# ----------------------------------------------------------------------------- runners


def test_sulq_recovers_the_subspaces_and_charges_every_iteration() -> None:
    rows, truth = union_of_subspaces(100_000, 20, 2, 3, 2)
    bases, manifest = fit(rows, clusters=3, rank=2, method="sulq", seed=5)
    assert bases.shape == (3, 20, 2)
    np.testing.assert_allclose(
        np.einsum("kdq,kdr->kqr", bases, bases), np.stack([np.eye(2)] * 3), atol=1e-10
    )
    assert matched_subspace_errors(bases, truth).max() < 0.1
    budget = manifest["privacy"]["budget"]
    assert [s["step"] for s in budget["steps"]] == [f"iteration_{i}" for i in range(1, 7)]
    assert budget["spent"] == pytest.approx({"epsilon": 1.0, "delta": 1e-6})
    sigmas = manifest["release"]["noise_sigma_per_iteration"]
    assert len(sigmas) == 6 and len(set(sigmas)) == 1
    assert manifest["method"] == "sulq" and manifest["clusters"] == 3
    assert manifest["summary_bytes_gathered"] < 6 * 12 * 20 * 20 * 8 + 1


def test_sulq_in_zcdp_mode_composes_rho() -> None:
    rows, truth = union_of_subspaces(60_000, 12, 2, 2, 3)
    bases, manifest = fit(
        rows, clusters=2, rank=2, method="sulq", iterations=5, epsilon=None, rho=0.5, seed=1
    )
    budget = manifest["privacy"]["budget"]
    assert budget["mode"] == "zcdp" and budget["spent"]["rho"] == pytest.approx(0.5)
    assert [s["rho"] for s in budget["steps"]] == pytest.approx([0.1] * 5)
    assert matched_subspace_errors(bases, truth).max() < 0.1


def test_gibbs_recovers_two_lines_at_a_large_epsilon() -> None:
    """The sampler's target is biased at small ε and its chain can stick in a local mode
    when ε·n is large (docs/clustering.md); on two lines at ε = 10 it is close (measured
    ≤ 0.04 in 40 chains)."""
    rows, truth = union_of_subspaces(3000, 10, 1, 2, 5)
    bases, manifest = fit(rows, clusters=2, rank=1, method="gibbs", epsilon=10.0)
    assert matched_subspace_errors(bases, truth).max() < 0.1
    assert manifest["privacy"]["budget"] is None  # a finite chain: nothing charged as DP
    assert manifest["privacy"]["guarantee"].startswith("none")


def test_sample_aggregate_recovers_the_subspaces(dask_client) -> None:
    """Small version of the issue's claim (the full one is marked slow below): typically
    ≈ 0.05; the private radius search sometimes lands one grid step higher (≈ 0.1–0.12).

    With OS-entropy noise about 1 run in 8 ends in ⊥ at the core test (measured: noise
    seeds 1–8 gave ⊥ once, errors 0.058–0.081 otherwise), which made this test flaky; the
    fixed private noise seed makes it deterministic. The ⊥ rate is a utility property,
    measured by the slow test below, not by CI."""
    rows, truth = union_of_subspaces(100_000, 20, 2, 3, 1)
    bases, manifest = fit(rows, dask_client, noise_seed=1, clusters=3, rank=2, epsilon=3.0, seed=2)
    assert manifest["outcome"] == "ok", manifest["release"]
    assert matched_subspace_errors(bases, truth).max() < 0.2
    assert max(manifest["release"]["projection_residual"]) < 0.3
    assert manifest["method"] == "sample-aggregate"
    assert manifest["parameters"]["subsets"] >= 225
    assert {s["step"] for s in manifest["privacy"]["budget"]["steps"]} == {
        "radius_search",
        "core_test",
        "core_noise",
    }


@pytest.mark.slow
def test_sample_aggregate_utility_claim(dask_client, tmp_path) -> None:
    """Issue 8: K = 3, q = 2, D = 20, n = 300,000, ε = 1: every subspace within 0.1 after
    matching, median over 5 seeds (measured ≈ 0.05, with one seed near 0.14)."""
    worst = []
    for seed in range(5):
        data = generate(tmp_path / f"d{seed}", rows=300_000, dim=20, rank=2, clusters=3, seed=seed)
        config = ClusterConfig(clusters=3, rank=2, epsilon=1.0, delta=1e-6, seed=seed)
        result = run_cluster(
            config, lambda c, p=data.path: parquet_dataset(str(p), None, None, None, c), dask_client
        )
        truth = np.load(data.bases_path)
        worst.append(
            1.0 if result.basis is None else matched_subspace_errors(result.basis, truth).max()
        )
    assert np.median(worst) <= 0.1, worst


# ----------------------------------------------------------------------------- bad input


class NeverRead:
    """A loader that fails the test if any partition is read."""

    def __call__(self, part):
        raise AssertionError("data was read")


def unread_dataset(n: int, dim: int) -> Dataset:
    return Dataset([0], [0], NeverRead(), [f"x{j}" for j in range(dim)], n, "mem")


@pytest.mark.parametrize(
    "config, message",
    [
        ({"clusters": 5, "rank": 2}, "clusters × rank = 5×2 = 10"),
        ({"clusters": 2, "rank": 10}, "rank 10 must be smaller"),
        ({"clusters": 0, "rank": 2}, "clusters must be a positive integer"),
        ({"clusters": 2, "rank": 2, "method": "kmeans"}, "unknown method"),
        ({"clusters": 2, "rank": 2, "aggregator": "mean"}, "unknown aggregator"),
        ({"clusters": 2, "rank": 2, "row_norm": 1.0}, "--row-norm does not apply"),
        ({"clusters": 2, "rank": 2, "method": "sulq", "subsets": 50}, "--subsets does not"),
        ({"clusters": 2, "rank": 2, "method": "gibbs", "iterations": 3}, "--iterations does"),
        ({"clusters": 2, "rank": 2, "method": "sulq", "unit_column": "u"}, "--unit-column"),
        ({"clusters": 2, "rank": 2, "method": "sulq", "row_norm": -1.0}, "row-norm must be"),
        ({"clusters": 2, "rank": 2, "epsilon": None}, "no privacy budget"),
        ({"clusters": 2, "rank": 2, "method": "gibbs", "sweeps": 0}, "sweeps must be"),
    ],
)
def test_bad_parameters_fail_before_reading(config, message) -> None:
    cfg = ClusterConfig(**{"epsilon": 1.0, "delta": 1e-6, **config})
    with pytest.raises(InputError, match=message):
        run_cluster(cfg, lambda c: unread_dataset(10_000, 10))


def test_gibbs_refuses_large_inputs_before_reading() -> None:
    cfg = ClusterConfig(clusters=2, rank=2, epsilon=1.0, delta=1e-6, method="gibbs")
    with pytest.raises(InputError, match="--method gibbs is for small data"):
        run_cluster(cfg, lambda c: unread_dataset(cl.GIBBS_MAX_ROWS + 1, 10))


# ----------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def clustered_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("clustered") / "data"
    done = dpsub(
        "synth",
        str(out),
        "--rows",
        "40000",
        "--dim",
        "12",
        "--rank",
        "2",
        "--clusters",
        "2",
        "--partitions",
        "3",
        "--quiet",
    )
    assert done.returncode == 0, done.stderr
    return out


def test_cli_cluster_and_evaluate_on_the_shared_cluster(
    clustered_dataset, scheduler_address, tmp_path, capsys
) -> None:
    """Both methods end to end. sample-aggregate at t = 178 subsets returns ⊥ (exit 3) in
    a few percent of runs, when the private radius search stops early: a normal outcome."""
    common = ["--clusters", "2", "--rank", "2", "--scheduler", scheduler_address, "--seed", "4"]
    for method, budget in (("sample-aggregate", "4"), ("sulq", "1")):
        out = tmp_path / method
        done = dpsub(
            "cluster",
            str(clustered_dataset),
            *common,
            "--method",
            method,
            "--epsilon",
            budget,
            "--delta",
            "1e-6",
            "--out",
            str(out),
        )
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["method"] == method and manifest["clusters"] == 2
        assert manifest["rank"] == 2 and manifest["n_rows"] == 40_000
        assert manifest["privacy"]["budget"]["spent"]["epsilon"] == pytest.approx(float(budget))
        if done.returncode == 3 and method == "sample-aggregate":
            assert manifest["outcome"] == "no_stable_subspace" and "no stable" in done.stderr
            assert not (out / "basis.npy").exists()
            continue
        assert done.returncode == 0, done.stderr
        assert "basis.npy (2×12×2)" in done.stdout and manifest["outcome"] == "ok"
        assert np.load(out / "basis.npy").shape == (2, 12, 2)
        truth = str(clustered_dataset / "_truth" / "bases.npy")
        assert main(["evaluate", str(out), "--truth", truth]) == 0
        scored = capsys.readouterr().out
        assert float(scored.split()[0].split("=")[1]) < 0.15, scored
        assert scored.count(",") == 1  # two per-cluster errors


def test_cli_bad_input_exits_2_and_writes_nothing(
    clustered_dataset, scheduler_address, tmp_path, capsys, monkeypatch
) -> None:
    out = tmp_path / "never"
    base = ["cluster", str(clustered_dataset), "--epsilon", "1", "--delta", "1e-6"]
    base += ["--out", str(out), "--quiet", "--scheduler", scheduler_address]
    assert main([*base, "--clusters", "6", "--rank", "2"]) == 2
    assert "clusters × rank = 6×2 = 12 must be smaller than the number of columns (12)" in (
        capsys.readouterr().err
    )
    assert main([*base, "--clusters", "2", "--rank", "2", "--row-norm", "3"]) == 2
    assert "--row-norm does not apply to --method sample-aggregate" in capsys.readouterr().err
    monkeypatch.setattr(cl, "GIBBS_MAX_ROWS", 1000)
    assert main([*base, "--clusters", "2", "--rank", "2", "--method", "gibbs"]) == 2
    assert "40000 rows" in capsys.readouterr().err
    assert not out.exists()
    assert not list(tmp_path.glob(".never*"))


def test_error_vs_n_bench_writes_its_table(scheduler_address, tmp_path, capsys) -> None:
    """Smoke run of bench/clustering_error_vs_n.py (the docs/clustering.md table)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench import clustering_error_vs_n

    argv = ["--rows", "3000", "--seeds", "1", "--methods", "sample-aggregate,sulq,gibbs"]
    argv += ["--dim", "8", "--clusters", "2", "--epsilon", "10", "--no-plot"]
    argv += ["--scheduler", scheduler_address]
    for name in ("results", "img", "data"):
        argv += [f"--{name}-dir", str(tmp_path / name)]
    assert clustering_error_vs_n.main(argv) == 0
    document = json.loads((tmp_path / "results" / "clustering_error_vs_n.json").read_text())
    assert {r["method"] for r in document["records"]} == {"sample-aggregate", "sulq", "gibbs"}
    assert "| 3,000 |" in capsys.readouterr().out


def test_user_level_default_subsets_do_not_depend_on_the_private_row_count():
    from dpsub_dist.job import plan_budget
    from dpsub_dist.methods import _sample_aggregate as sa

    config = ClusterConfig(clusters=3, rank=2, epsilon=1.0, delta=1e-6, unit_column="u")
    _, grants = plan_budget(config)
    at_user_level = cl.default_subsets(config, grants, None)
    assert at_user_level == sa.minimum_subsets(config.aggregator, grants)
    assert cl.default_subsets(config, grants, 10**6) > at_user_level  # rows public: grows
