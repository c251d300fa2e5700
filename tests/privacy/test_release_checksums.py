"""Releases for fixed seeds do not move: a refactor must not move the noise or a public choice.

Every method (and boosting, every clustering method and a stream's appends) runs in-process
(and a few of them on a multi-process cluster as well: :data:`ON_A_CLUSTER`) on a small
synthetic array with a fixed public seed and a fixed *private* noise seed (the way
a ledger run record resumes a run; a stream takes one per append). What is the same on every
machine is pinned exactly, in tests/privacy/release_identity.json:

- every noise draw (:func:`dpsub_dist.privacy.noise.draw_log`): its kind, the scale the
  caller asked for and its sensitivity (bit for bit: a one-ulp change to a noise scale
  fails, :func:`test_one_ulp_change_of_a_noise_scale_is_caught`), its size, grid and
  integer parameter, and a hash of its integer draws K (integer arithmetic only), grouped
  in runs of draws with the same parameters (a sparse vector draws hundreds);
- the published choices and accounting: outcome, method and why, the parameters (bounds
  chosen from their public grids, quantiles, group runs), the budget charged per step.

The released floats (basis, explained variance, means, residuals: anything under a
``release`` key) go through BLAS/LAPACK, whose kernels differ by CPU (OpenBLAS picks
SkylakeX, Haswell, … at start-up), so they are compared within :data:`RTOL`/:data:`ATOL`
and the basis up to sign and rotation by its subspace distance (:data:`SUBSPACE_TOL`).
Between OpenBLAS's Haswell, SandyBridge and Prescott kernels they differ by < 2e-14
relative and the Gibbs basis by < 1e-11; .ci/run runs this file under two kernels.

A deliberate change to a mechanism rewrites the JSON in the same commit, with the reason:
``.venv/bin/python tests/privacy/test_release_checksums.py`` writes it.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import pytest

from dpsub_dist.engine.sources import Dataset, array_dataset, parquet_dataset
from dpsub_dist.job import (
    ClusterConfig,
    EstimateConfig,
    StreamConfig,
    init_stream,
    run_cluster,
    run_estimate,
)
from dpsub_dist.methods.stream import open_stream
from dpsub_dist.privacy import calibration, noise

EXPECTED_FILE = Path(__file__).with_name("release_identity.json")
RTOL, ATOL = 1e-9, 1e-12
"""Tolerance of a released float: 10⁵× the largest difference seen between kernels."""
SUBSPACE_TOL = 1e-9
"""Largest ‖P − P'‖₂ between the released and the recorded basis's projections."""
PUBLISHED = ("outcome", "method", "method_choice", "rank", "n_rows", "parameters", "privacy")
"""The manifest's sections compared (no versions, paths or output checksums)."""

NOISE_SEED = 0x5EED_0F_DEC1
PUBLIC_SEED = 11


def _rows(seed: int, n: int, dim: int, rank: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((dim, rank)))[0]
    return rng.standard_normal((n, rank)) @ basis.T * 3 + 0.01 * rng.standard_normal((n, dim))


def _clustered(seed: int, n: int, dim: int) -> np.ndarray:
    return np.vstack([_rows(seed + c, n // 2, dim, 2) for c in range(2)])


def _exact(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((5, 2)))[0]
    inliers = rng.standard_normal((140, 2)) @ basis.T
    return np.vstack([inliers, rng.standard_normal((10, 5))])


EPS = {"epsilon": 4.0, "delta": 1e-6}
RHO = {"rho": 1.0, "delta": 1e-6}
ESTIMATES: dict[str, tuple[str, dict[str, Any]]] = {
    "friendly": ("rows", {**EPS, "method": "friendly"}),
    "friendly zcdp radius contiguous": (
        "rows",
        {**RHO, "method": "friendly", "scale": 0.5, "assign": "contiguous", "ref_points": 4},
    ),
    "histogram": ("rows", {**EPS, "method": "histogram"}),
    "histogram zcdp cell": ("rows", {**RHO, "method": "histogram", "scale": 0.05}),
    "gauss centred": ("rows", {**EPS, "method": "gauss", "row_norm": 5.0, "center": True}),
    "gauss zcdp private norm": ("rows", {**RHO, "method": "gauss"}),
    "gap-perturb": ("rows", {**EPS, "method": "gap-perturb", "row_norm": 5.0}),
    "gap-perturb zcdp private norm": ("rows", {**RHO, "method": "gap-perturb"}),
    "exact": ("exact", {**EPS, "method": "exact", "outliers": 1}),
    "exact zcdp": ("exact", {**RHO, "method": "exact", "tolerance": 1e-8}),
    "boost friendly": ("rows", {**EPS, "method": "friendly", "boost": 2}),
    "auto": ("rows", {**EPS}),
    "boost gauss": ("rows", {**EPS, "method": "gauss", "row_norm": 5.0, "boost": 3}),
    "power": ("rows", {**EPS, "method": "power", "row_norm": 5.0, "iterations": 3}),
    "power zcdp private norm": ("rows", {**RHO, "method": "power", "iterations": 2}),
    "gauss sampled centre": ("partitions", {**EPS, "method": "gauss"}),
    "gauss wide refined centre": ("wide", {**EPS, "method": "gauss"}),
    "gauss user level": ("users", {**EPS, "method": "gauss", "unit_column": "user"}),
    "power user level": (
        "users",
        {**EPS, "method": "power", "unit_column": "user", "iterations": 2},
    ),
    "friendly user level": ("users", {**EPS, "method": "friendly", "unit_column": "user"}),
    "gauss standardized": ("rows", {**EPS, "method": "gauss", "standardize": True}),
}
CLUSTERS: dict[str, dict[str, Any]] = {
    "cluster sample-aggregate": {**EPS},
    "cluster sample-aggregate histogram": {**EPS, "epsilon": 12.0, "aggregator": "histogram"},
    "cluster sulq": {**EPS, "method": "sulq", "iterations": 4},
    "cluster gibbs": {**EPS, "method": "gibbs", "sweeps": 3, "row_norm": 4.0},
}
STREAMS: dict[str, dict[str, Any]] = {  # horizon 3: append 3 draws a level charged at append 1
    "stream centred private bound": {**RHO},
    "stream clip norm": {**EPS, "clip_norm": 5.0},
}
STREAM_HORIZON, STREAM_BATCH_ROWS = 3, 5_000


def _data(source: str) -> Dataset:
    if source == "rows":
        return array_dataset(_rows(1, 20_000, 8, 2))
    if source == "wide":  # n ≤ 10·D, √D·σ/n = 0.175: gauss refines its centre
        return array_dataset(_rows(7, 1_000, 200, 2) + 20.0)
    if source == "partitions":  # 40 partitions: the sampled-centre route of gauss
        return array_dataset(da.from_array(_rows(4, 800_000, 8, 2), chunks=(20_000, 8)))
    if source == "users":  # 2,000 users of 10 rows each
        path = Path(tempfile.mkdtemp(prefix="dpsub-identity-")) / "users.parquet"
        table = pd.DataFrame(_rows(5, 20_000, 8, 2), columns=[f"x{i}" for i in range(8)])
        table["user"] = np.repeat(np.arange(2_000), 10)
        table.to_parquet(path, index=False)
        return parquet_dataset(str(path), None, "user", None, None)
    return array_dataset(_exact(2))


def run_stream(options: dict[str, Any], client: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
    """A stream made for :data:`STREAM_HORIZON` batches and appended that many: the last
    release (its manifest holds the first batch's bound and mean and every charge)."""
    folder = Path(tempfile.mkdtemp(prefix="dpsub-identity-stream-"))
    state = str(folder / "events.stream")
    init_stream(state, StreamConfig(rank=2, horizon=STREAM_HORIZON, **options))
    with open_stream(state) as stream:
        for t in range(STREAM_HORIZON):
            path = folder / f"batch-{t}.parquet"
            rows = _rows(6 + t, STREAM_BATCH_ROWS, 8, 2)
            pd.DataFrame(rows, columns=[f"x{i}" for i in range(8)]).to_parquet(path, index=False)
            release = stream.append(str(path), client=client, noise_seed=NOISE_SEED + t)
    return release.basis, release.manifest


def run_case(name: str, client: Any = None) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Case ``name`` run in process (``client`` None) or on ``client``'s cluster."""
    if name in STREAMS:
        return run_stream(STREAMS[name], client)
    if name in ESTIMATES:
        source, options = ESTIMATES[name]
        data = _data(source)
        config = EstimateConfig(rank=2, seed=PUBLIC_SEED, **options)
        result = run_estimate(config, lambda _client: data, client, noise_seed=NOISE_SEED)
    else:
        data = array_dataset(_clustered(3, 40_000 if "gibbs" not in name else 600, 8))
        config = ClusterConfig(clusters=2, rank=2, seed=PUBLIC_SEED, **CLUSTERS[name])
        result = run_cluster(config, lambda _client: data, client, noise_seed=NOISE_SEED)
    return result.basis, result.manifest


def _split(value: Any, released: dict[str, float], path: str = "", in_release: bool = False):
    """``value`` with every float under a ``release`` key moved to ``released[path]``."""
    if isinstance(value, dict):
        return {
            k: _split(v, released, f"{path}/{k}", in_release or k == "release")
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_split(v, released, f"{path}[{i}]", in_release) for i, v in enumerate(value)]
    if in_release and isinstance(value, float):
        released[path] = value
        return "<released float>"
    return value


def identity(name: str, client: Any = None) -> dict[str, Any]:
    """What case ``name`` publishes, split into the exact part and the released floats."""
    with noise.draw_log() as log:
        basis, manifest = run_case(name, client)
    draws: list[list] = []  # runs of draws with the same parameters: the count, one hash of K
    integers: list[np.ndarray] = []
    for d in log:
        params = [d.kind, d.scale, d.sensitivity, d.size, d.grid, d.param]
        if draws and draws[-1][:6] == params:
            draws[-1][6] += 1
        else:
            draws.append([*params, 1, ""])
            integers.append(np.empty(0, dtype=np.int64))
        integers[-1] = np.concatenate([integers[-1], d.integers])
    for run, values in zip(draws, integers, strict=True):
        run[7] = _integers_hash(values)
    released: dict[str, float] = {}
    public = _split({k: manifest[k] for k in PUBLISHED if k in manifest}, released)
    basis_list = None if basis is None else np.asarray(basis, dtype=np.float64).tolist()
    found = {"draws": draws, "public": public, "released": released, "basis": basis_list}
    return json.loads(json.dumps(found))  # as stored: tuples become lists


def _integers_hash(integers: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(integers, dtype="<i8").tobytes()).hexdigest()[:16]


def _subspace_distance(a: np.ndarray, b: np.ndarray) -> float:
    """‖AAᵀ − BBᵀ‖₂ for D×K orthonormal columns (for a stack of them: the largest)."""
    pairs = zip(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), strict=True)
    return max(float(np.linalg.norm(x @ x.T - y @ y.T, 2)) for x, y in pairs)


def check_identity(found: dict[str, Any], expected: dict[str, Any]) -> None:
    """AssertionError naming the first thing that moved."""
    assert len(found["draws"]) == len(expected["draws"]), "the number of noise draws moved"
    for i, (got, want) in enumerate(zip(found["draws"], expected["draws"], strict=True)):
        assert got == want, f"noise draw run {i} moved: {got} != {want}"
    assert found["public"] == expected["public"], "a published choice or charge moved"
    assert found["released"].keys() == expected["released"].keys()
    for path, want in expected["released"].items():
        got = found["released"][path]
        same_nan = math.isnan(want) and math.isnan(got)
        assert same_nan or math.isclose(got, want, rel_tol=RTOL, abs_tol=ATOL), (path, got, want)
    assert (found["basis"] is None) == (expected["basis"] is None), "⊥ or not moved"
    if expected["basis"] is not None:
        got, want = np.asarray(found["basis"]), np.asarray(expected["basis"])
        assert got.shape == want.shape
        assert _subspace_distance(got, want) <= SUBSPACE_TOL, _subspace_distance(got, want)


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    return json.loads(EXPECTED_FILE.read_text())


@pytest.mark.parametrize("name", [*ESTIMATES, *CLUSTERS, *STREAMS])
def test_release_identity_for_fixed_seeds(name: str, expected: dict[str, Any]) -> None:
    check_identity(identity(name), expected[name])


ON_A_CLUSTER = (
    "friendly",
    "gauss centred",
    "auto",
    "power zcdp private norm",
    "gauss user level",
    "cluster sulq",
    "stream clip norm",
)
"""Cases run on a multi-process cluster too: each route that spreads work by the cluster's
size (the partition groups of the Grams, the shuffle's buckets and method, the row cache's
limit), at row and user level, and a stream's appends."""


@pytest.mark.parametrize("name", ON_A_CLUSTER)
def test_release_identity_does_not_depend_on_where_tasks_run(
    name: str, expected: dict[str, Any], dask_client
) -> None:
    """The CLI runs a small table in process and a large one on a cluster (``--scheduler``
    chosen from the footers): the same seeds publish the same pinned values on either."""
    check_identity(identity(name, dask_client), expected[name])


def test_one_ulp_change_of_a_noise_scale_is_caught(monkeypatch, expected) -> None:
    """The Gaussian σ one ulp larger (as a refactor of its calibration might make it): σ_g
    is a ceiling, so the integer draws K almost surely stay the same, but the pinned scale
    moves and the identity fails."""
    calibrate = calibration.gaussian_sigma_approx_dp
    monkeypatch.setattr(
        calibration,
        "gaussian_sigma_approx_dp",
        lambda *args: math.nextafter(calibrate(*args), math.inf),
    )
    with pytest.raises(AssertionError, match="noise draw run 0 moved"):
        check_identity(identity("gauss centred"), expected["gauss centred"])


if __name__ == "__main__":  # write the table (after a deliberate mechanism change)
    lines = []
    for case in [*ESTIMATES, *CLUSTERS, *STREAMS]:
        parts = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in identity(case).items()]
        lines.append(f" {json.dumps(case)}: {{\n" + ",\n".join(parts) + "\n }")
    EXPECTED_FILE.write_text("{\n" + ",\n".join(lines) + "\n}\n")
