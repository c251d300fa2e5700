"""``--method auto`` (docs/auto.md): the choice is a function of public facts only, it is
recorded in the manifest, and ⊥ messages name the failed step and what to try."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsub_dist.cli import main
from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error
from dpsub_dist.methods import _sample_aggregate as sa
from dpsub_dist.methods import auto

ROWS, DIM, RANK = 20_000, 8, 2
BUDGET = ["--epsilon", "1", "--delta", "1e-6"]


def write(path: Path, rows: np.ndarray) -> Path:
    pq.write_table(pa.table({f"x{j}": rows[:, j] for j in range(rows.shape[1])}), path)
    return path


def shifted_low_rank(seed: int = 0, n: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    truth, _ = np.linalg.qr(rng.standard_normal((DIM, RANK)))
    rows = 30.0 + (rng.standard_normal((n, RANK)) * [5.0, 3.0]) @ truth.T
    return rows + 0.1 * rng.standard_normal((n, DIM)), truth


def estimate(source: Path, out: Path, scheduler: str, *args: str) -> tuple[int, dict]:
    common = ["--rank", str(RANK), "--seed", "1", "--scheduler", scheduler, "--quiet"]
    code = main(["estimate", str(source), "--out", str(out), *common, *args])
    return code, json.loads((out / "manifest.json").read_text())


def test_auto_runs_gauss_centred_with_a_private_norm_and_says_why(
    tmp_path: Path, scheduler_address: str
) -> None:
    rows, truth = shifted_low_rank()
    source = write(tmp_path / "rows.parquet", rows)
    code, manifest = estimate(
        source, tmp_path / "out", scheduler_address, "--method", "auto", *BUDGET
    )
    assert code == 0
    choice = manifest["method_choice"]
    assert manifest["method"] == "gauss" and choice["requested"] == "auto"
    assert choice["chosen"] == "gauss" and "D = 8" in choice["reason"]
    steps = [s["step"] for s in manifest["privacy"]["budget"]["steps"]]
    assert steps == ["norm_bound", "mean", "centred_norm_bound", "gram_noise"]  # no ⊥ step
    assert manifest["privacy"]["budget"]["spent"]["epsilon"] == pytest.approx(1.0)
    assert subspace_error(np.load(tmp_path / "out" / "basis.npy"), truth) < 0.1


def test_the_choice_is_the_same_on_tables_with_the_same_public_facts(
    tmp_path: Path, scheduler_address: str
) -> None:
    """Same n, D and options, very different values: the same choice and the same reason."""
    rows, _ = shifted_low_rank()
    noise = 1000.0 * np.random.default_rng(9).standard_normal((ROWS, DIM))
    choices = []
    for name, table in (("a", rows), ("b", noise)):
        source = write(tmp_path / f"{name}.parquet", table)
        _, manifest = estimate(
            source, tmp_path / name, scheduler_address, "--method", "auto", *BUDGET
        )
        choices.append(manifest["method_choice"])
    assert choices[0] == choices[1]


def test_the_choice_is_made_before_any_row_is_read(monkeypatch) -> None:
    """``choose`` sees the options and D; at that point the loader has not run."""
    rows, _ = shifted_low_rank()
    dataset = array_dataset(rows)
    loads: list[int] = []
    real_loader = dataset.loader

    def counting_loader(part):
        loads.append(1)
        return real_loader(part)

    dataset.loader = counting_loader
    seen: list[tuple[int, int]] = []
    real_choose = auto.choose

    def spy(config, dim):
        seen.append((len(loads), dim))
        return real_choose(config, dim)

    monkeypatch.setattr(auto, "choose", spy)
    config = EstimateConfig(rank=RANK, epsilon=1.0, delta=1e-6, method="auto", seed=1)
    result = run_estimate(config, lambda client: dataset)
    assert seen == [(0, DIM)] and loads  # chosen from D alone, rows read only afterwards
    assert result.manifest["method_choice"]["chosen"] == "gauss"


def test_boosted_auto_publishes_its_choice_once() -> None:
    """Under --boost the choice is made once for every group (from D) and the boosted
    manifest says which method it was and why, as an unboosted auto run's does."""
    rows, _ = shifted_low_rank()
    config = EstimateConfig(rank=RANK, epsilon=4.0, delta=1e-6, method="auto", boost=2, seed=1)
    manifest = run_estimate(config, lambda client: array_dataset(rows)).manifest
    assert manifest["method_choice"]["requested"] == "auto"
    assert manifest["method_choice"]["chosen"] == "gauss" == manifest["method"]


@pytest.mark.parametrize(
    "options,dim,method,reason",
    [
        ({}, 10, "gauss", "fit the driver"),
        ({}, 20_000, "power", "exceed the driver budget"),
        ({}, 9_459, "gauss", "fit the driver"),  # 3·8·D² ≤ 2 GiB up to D = 9,459
        ({}, 9_460, "power", "exceed the driver budget"),
        ({"unit_column": "u"}, 20_000, "power", "exceed the driver budget"),
        ({"subsets": 400}, 20_000, "friendly", "--subsets given"),
        ({"unit_column": "u"}, 10, "gauss", "fit the driver"),  # a private user-level bound
        ({"unit_column": "u", "row_norm": 5.0}, 10, "gauss", "fit the driver"),
        ({"subsets": 400}, 10, "friendly", "--subsets given"),
        ({"assign": "contiguous"}, 10, "friendly", "--assign given"),
    ],
)
def test_rule(options: dict, dim: int, method: str, reason: str) -> None:
    config = EstimateConfig(rank=2, epsilon=1.0, delta=1e-6, method="auto", **options)
    chosen, why = auto.choose(config, dim)
    assert chosen == method and reason in why


def test_friendly_bottom_names_the_step_and_what_to_try(
    tmp_path: Path, scheduler_address: str, capsys
) -> None:
    """Isotropic rows have no stable rank-2 subspace: friendly's ⊥ message says which step
    failed and suggests gauss, more rows or more ε, and blames no rank deficiency."""
    rows = np.random.default_rng(4).standard_normal((ROWS, DIM))
    source = write(tmp_path / "iso.parquet", rows)
    code, manifest = estimate(
        source,
        tmp_path / "out",
        scheduler_address,
        *("--epsilon", "0.3", "--delta", "1e-6", "--method", "friendly"),
    )
    err = capsys.readouterr().err
    assert code == 3, err
    step = manifest["release"]["failed_step"]
    assert f"no stable subspace (step {step})" in err
    assert "--method gauss" in err and "more rows" in err and "rank-deficient" not in err


def test_null_check_reason_tells_noise_from_null_points() -> None:
    reference = np.ones((50, 8))  # D = 50, q = 8; a real projection has energy ≈ k·q = 16
    loud = sa.Aggregate(np.zeros(400), {"noise_sigma": 0.2})  # σ²·D·q = 16
    assert sa.null_release_reason(loud, reference, 2) == sa.NOISE_RELEASE_REASON
    quiet = sa.Aggregate(np.zeros(400), {"noise_sigma": 0.01})  # 0.04: ŷ ≈ 0 without noise
    assert sa.null_release_reason(quiet, reference, 2) == sa.NULL_RELEASE_REASON
    histogram = sa.Aggregate(np.zeros(400), {"cell_side": 1.0})  # no Gaussian noise
    assert sa.null_release_reason(histogram, reference, 2) == sa.NULL_RELEASE_REASON


def test_auto_runs_power_where_gauss_does_not_fit(monkeypatch) -> None:
    """With the driver budget below one D×D matrix (a public fact: D), auto runs the noisy
    power method, centred at row level like every auto choice, and says why; the run is
    power's own (its steps, nothing D×D).

    2·10⁵ rows, not 2·10⁴: at 2·10⁴ the mean's bound (the fixed 0.99 quantile, 200 rows below
    n, closer than the sparse vector's margin of 20/ε_norm rows) overshot up to 32× in 6 of 100
    runs, and the centre's noise with it (errors 0.12–0.94 against < 0.01 at 2·10⁵)."""
    monkeypatch.setattr(auto, "DRIVER_BYTES", 3 * 8 * DIM * DIM - 1)
    rows, truth = shifted_low_rank(n=200_000)
    config = EstimateConfig(rank=RANK, epsilon=1.0, delta=1e-6, method="auto", seed=1)
    result = run_estimate(config, lambda client: array_dataset(rows))
    manifest = result.manifest
    assert manifest["method"] == "power" and manifest["method_choice"]["chosen"] == "power"
    assert "exceed the driver budget" in manifest["method_choice"]["reason"]
    steps = [s["step"] for s in manifest["privacy"]["budget"]["steps"]]
    assert steps == ["norm_bound", "mean", "centred_norm_bound", "power"]
    assert manifest["privacy"]["budget"]["spent"]["epsilon"] == pytest.approx(1.0)
    assert subspace_error(result.basis, truth) < 0.1
