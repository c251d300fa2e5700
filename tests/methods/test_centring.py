"""Private centring of friendly and histogram, as a CLI user sees it (docs/centring.md).

On rows with a large mean offset and a known centred subspace: centring (the default) recovers
the principal subspace and publishes the private mean; ``--no-center`` returns the uncentred
subspace, which holds the mean's direction, and says so. User level refuses ``--center``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsub_dist.cli import main
from dpsub_dist.linalg import subspace_error

ROWS, DIM, RANK = 40_000, 8, 2
MEAN = np.array([30.0, -20.0, 25.0, 10.0, -15.0, 20.0, 5.0, -10.0])
SCALES = np.array([5.0, 3.0])
BUDGET = ["--epsilon", "3", "--delta", "1e-6"]


@pytest.fixture(scope="module")
def shifted(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """Rows ``MEAN + z·diag(SCALES)·Wᵀ + noise`` in two Parquet files, and the truth ``W``."""
    rng = np.random.default_rng(0)
    truth, _ = np.linalg.qr(rng.standard_normal((DIM, RANK)))
    rows = MEAN + (rng.standard_normal((ROWS, RANK)) * SCALES) @ truth.T
    rows += 0.1 * rng.standard_normal((ROWS, DIM))
    root = tmp_path_factory.mktemp("shifted")
    for i, half in enumerate(np.array_split(rows, 2)):
        table = pa.table({f"x{j}": half[:, j] for j in range(DIM)})
        pq.write_table(table, root / f"part-{i}.parquet")
    return root, truth


def estimate(source: Path, out: Path, scheduler: str, *args: str) -> int:
    common = ["--rank", str(RANK), "--seed", "1", "--scheduler", scheduler, "--quiet"]
    return main(["estimate", str(source), "--out", str(out), *common, *BUDGET, *args])


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.parametrize("method", ["friendly", "histogram"])
def test_centred_by_default_recovers_the_principal_subspace(
    method: str, shifted, tmp_path: Path, scheduler_address: str
) -> None:
    source, truth = shifted
    out = tmp_path / "centred"
    assert estimate(source, out, scheduler_address, "--method", method) == 0
    found = manifest(out)
    assert found["parameters"]["center"] is True
    assert {"norm_bound", "mean"} <= {s["step"] for s in found["privacy"]["budget"]["steps"]}
    assert np.linalg.norm(np.asarray(found["release"]["mean"]) - MEAN) < 0.5
    assert subspace_error(np.load(out / "basis.npy"), truth) < 0.2


def test_no_center_gives_the_uncentred_subspace_and_says_so(
    shifted, tmp_path: Path, scheduler_address: str
) -> None:
    source, truth = shifted
    out = tmp_path / "uncentred"
    assert estimate(source, out, scheduler_address, "--no-center") == 0
    found = manifest(out)
    assert found["parameters"]["center"] is False and "mean" not in found["release"]
    assert "uncentred" in found["parameters"]["center_note"]
    basis = np.load(out / "basis.npy")
    direction = MEAN / np.linalg.norm(MEAN)
    assert np.linalg.norm(basis.T @ direction) > 0.95  # the mean's direction is in the basis
    assert subspace_error(basis, truth) > 0.5  # and the principal subspace is not


def test_public_row_norm_skips_the_private_bound(
    shifted, tmp_path: Path, scheduler_address: str
) -> None:
    source, _ = shifted
    out = tmp_path / "public-norm"
    assert estimate(source, out, scheduler_address, "--row-norm", "100") == 0
    found = manifest(out)
    steps = [s["step"] for s in found["privacy"]["budget"]["steps"]]
    assert "norm_bound" not in steps and steps[0] == "mean"
    assert found["parameters"]["mean_row_norm"] == 100.0
    assert found["parameters"]["mean_row_norm_source"] == "public (--row-norm)"


def test_centring_at_user_level_is_refused_before_reading(tmp_path: Path, capsys) -> None:
    source = tmp_path / "users.parquet"
    pq.write_table(pa.table({"u": [1, 2, 3], "a": [1.0, 2.0, 3.0], "b": [0.0, 1.0, 0.0]}), source)
    args = ["--rank", "1", "--unit-column", "u", "--center", *BUDGET]
    assert main(["estimate", str(source), "--out", str(tmp_path / "o"), *args]) == 2
    assert "--center is row level only" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
