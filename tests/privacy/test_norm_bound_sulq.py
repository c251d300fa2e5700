"""``dpsub cluster --method sulq --private-norm``: the private row-norm bound of
privacy/norm_bound.py before the SuLQ iterations (its share in the method's plan)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsub_dist.cli import main
from dpsub_dist.linalg import subspace_error
from dpsub_dist.privacy.norm_bound import GRID


@pytest.fixture(scope="module")
def two_planes(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """20,000 rows on two 2-planes of R^8 (coefficients N(0, 3²)), as one Parquet file."""
    rng = np.random.default_rng(3)
    bases = np.stack([np.linalg.qr(rng.standard_normal((8, 2)))[0] for _ in range(2)])
    labels = rng.integers(0, 2, 20_000)
    rows = np.einsum("nij,nj->ni", bases[labels], 3.0 * rng.standard_normal((20_000, 2)))
    path = tmp_path_factory.mktemp("sulq") / "rows.parquet"
    pd.DataFrame(rows, columns=[f"x{i}" for i in range(8)]).to_parquet(path)
    return path, bases


def _cluster(path: Path, out: Path, scheduler: str, *args: str) -> int:
    return main(
        ["cluster", str(path), "--out", str(out), "--clusters", "2", "--rank", "2", "--quiet"]
        + ["--method", "sulq", "--epsilon", "2", "--delta", "1e-6", "--seed", "4"]
        + ["--scheduler", scheduler, *args]
    )


def test_sulq_private_norm_publishes_the_bound_and_charges_its_share(
    two_planes, scheduler_address, tmp_path
) -> None:
    path, bases = two_planes
    out = tmp_path / "out"
    assert _cluster(path, out, scheduler_address, "--private-norm") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    parameters = manifest["parameters"]
    assert parameters["row_norm"] in GRID and parameters["row_norm_source"].startswith("private")
    assert parameters["budget_shares"]["norm_bound"] == [0.1, 0.0]
    steps = {s["step"]: s for s in manifest["privacy"]["budget"]["steps"]}
    assert (
        steps["norm_bound"]["epsilon"] == pytest.approx(0.2) and steps["norm_bound"]["delta"] == 0
    )
    assert manifest["privacy"]["budget"]["spent"]["epsilon"] == pytest.approx(2.0)
    found = np.load(out / "basis.npy")
    errors = [[subspace_error(f, b) for b in bases] for f in found]
    assert max(min(row) for row in errors) < 0.2, errors  # each plane found


def test_sulq_private_norm_with_a_public_row_norm_exits_2(
    two_planes, scheduler_address, tmp_path, capsys
) -> None:
    out = tmp_path / "out"
    code = _cluster(two_planes[0], out, scheduler_address, "--private-norm", "--row-norm", "5")
    assert code == 2 and "--private-norm" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("private_norm", [True, False])
def test_sulq_on_a_table_without_rows_is_bad_input_before_any_read(
    tmp_path, monkeypatch, private_norm
) -> None:
    """n = 0 is public (footers) at row level, the only level SuLQ runs at: exit 2 with a
    one-line fix, before any partition is read or noise drawn (was a ValueError traceback,
    exit 1, after the private-norm step had been charged)."""
    from dpsub_dist.engine.sources import parquet_dataset
    from dpsub_dist.errors import InputError
    from dpsub_dist.job import ClusterConfig, run_cluster
    from dpsub_dist.methods import _clustering as clustering

    path = tmp_path / "empty.parquet"
    pd.DataFrame({f"x{i}": pd.Series([], dtype=float) for i in range(4)}).to_parquet(path)
    monkeypatch.setattr(clustering, "compute_norm_counts", lambda *a: pytest.fail("read"))
    config = ClusterConfig(
        clusters=2, rank=1, epsilon=1.0, delta=1e-6, method="sulq", private_norm=private_norm
    )
    with pytest.raises(InputError, match="has no rows"):
        run_cluster(config, lambda client: parquet_dataset(str(path), None, None, None, client))
