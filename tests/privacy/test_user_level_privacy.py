"""User level (``--unit-column``): one user lands in one subset, and nothing published
(exit code, output folder, manifest, stdout/stderr, ledger records) depends on the
private row or user count except through the DP release itself."""

from __future__ import annotations

import dataclasses
import json
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsub_dist.cli import main
from dpsub_dist.engine.assign import canonical_unit_ids, unit_subsets
from dpsub_dist.engine.gram import user_scale
from dpsub_dist.engine.sources import parquet_dataset
from dpsub_dist.engine.subsets import SubsetPlan, compute_subset_summaries
from dpsub_dist.errors import InputError
from dpsub_dist.job import ClusterConfig, EstimateConfig, run_cluster, run_estimate
from dpsub_dist.methods.boost import group_seed, groups_of

DIM = 6
FEATURES = [f"f{j}" for j in range(DIM)]


def users_table(ids: list, rng: np.random.Generator, id_type: pa.DataType) -> pa.Table:
    """Isotropic rows (no subspace: sample-and-aggregate ends in ⊥) with a user id column."""
    rows = rng.standard_normal((len(ids), DIM))
    columns = {name: rows[:, j] for j, name in enumerate(FEATURES)}
    return pa.table({**columns, "user": pa.array(ids, type=id_type)})


def write_files(folder: Path, tables: list[pa.Table]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    for i, table in enumerate(tables):
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=1000)
    return folder


def user_ids(n_rows: int, users: int, rng: np.random.Generator) -> list[int]:
    """Ids of ``n_rows`` rows from exactly ``users`` users (each has at least one row)."""
    ids = np.concatenate([np.arange(users), rng.integers(0, users, n_rows - users)])
    rng.shuffle(ids)
    return [int(i) * 7 + 1000 for i in ids]


def open_parquet(folder: Path, unit_column: str | None = "user"):
    return lambda client: parquet_dataset(str(folder), None, unit_column, None, client)


# ----------------------------------------------------------------- canonical assignment


def subsets_holding(folder: Path, seed: int, t: int) -> np.ndarray:
    """Rows of the marked user (feature f0 = 1) per subset, through the engine's shuffle."""
    dataset = open_parquet(folder)(None)
    plan = SubsetPlan(subsets=t, n_rows=dataset.n_rows, seed=seed, user_level=True, buckets=3)
    summaries = compute_subset_summaries(
        dataset.parts,
        dataset.offsets,
        dataset.loader,
        plan,
        lambda rows, _j: np.array([float((rows[:, 0] == 1.0).sum())]),
    )
    return summaries[:, 0]


def test_a_user_split_over_a_file_with_a_null_id_lands_in_one_subset(tmp_path):
    rng = np.random.default_rng(1)
    ids_a = [5, 5, 5, 6, 7, 8, 9]
    ids_b = [5, 5, None, 10, 11]  # a null id: pandas would turn this file's ids into float64
    tables = [users_table(ids, rng, pa.int64()) for ids in (ids_a, ids_b)]
    tables = [
        t.set_column(0, "f0", pa.array([1.0 if u == 5 else 0.0 for u in ids]))
        for t, ids in zip(tables, (ids_a, ids_b), strict=True)
    ]
    folder = write_files(tmp_path / "nulls", tables)
    for seed in range(5):
        per_subset = subsets_holding(folder, seed, t=97)
        assert np.count_nonzero(per_subset) == 1, f"user 5 is split (seed {seed})"
        assert per_subset.sum() == 5


def test_integer_and_integral_float_ids_are_the_same_user():
    as_int = unit_subsets(pa.array([5, 2**40, -3], type=pa.int64()), seed=3, subsets=1009)
    as_float = unit_subsets(pa.array([5.0, 2.0**40, -3.0]), seed=3, subsets=1009)
    as_int32 = unit_subsets(pa.array([5, 7], type=pa.int32()), seed=3, subsets=1009)
    decimals = pa.array([Decimal("5.00"), Decimal("7.00")], type=pa.decimal128(12, 2))
    as_decimal = unit_subsets(decimals, seed=3, subsets=1009)
    np.testing.assert_array_equal(as_int, as_float)
    np.testing.assert_array_equal(as_int32, as_decimal)
    assert as_int32[0] == as_int[0]


def test_negative_and_positive_zero_ids_are_one_user():
    """-0.0 and 0.0 are one id: as two, one user's rows would be scaled as two users (each to
    Σ‖x‖² ≤ 1, twice the sensitivity) and hashed twice."""
    keep, ids = canonical_unit_ids(pa.array([0.0, -0.0, 1.0, -0.0]))
    assert keep is None and len(ids.keys) == 2
    np.testing.assert_array_equal(ids.inverse, [0, 0, 1, 0])


def test_user_scale_brings_each_heavy_user_to_unit_total_and_leaves_light_ones():
    """Per-user scaling ``1/√max(1, Σ‖x‖²)``: a user above 1 ends at Σ‖x‖² = 1 exactly (not
    below: less signal for no privacy), a user below 1 is untouched."""
    rows = np.array([[1.0, 1.0], [1.0, -1.0], [0.3, 0.0], [0.0, 0.4]])
    _, units = canonical_unit_ids(pa.array([7, 7, 9, 9]))
    totals = pd.Series(
        np.bincount(units.inverse, weights=(rows**2).sum(axis=1)),
        index=pd.Index(units.keys, dtype=object),
    )
    scaled = rows * user_scale(units, totals)[:, None]
    per_user = np.bincount(units.inverse, weights=(scaled**2).sum(axis=1))
    np.testing.assert_allclose(per_user, [1.0, 0.25], rtol=1e-12)


def test_an_id_column_of_another_type_is_refused_from_the_schema(tmp_path):
    table = pa.table({"f0": [1.0, 2.0], "f1": [0.5, 0.1], "user": [True, False]})
    folder = write_files(tmp_path / "flags", [table])
    with pytest.raises(InputError, match="unit column 'user' has type bool"):
        open_parquet(folder)(None)


def test_the_public_seed_keys_the_hash_of_numeric_ids():
    ids = pa.array(np.arange(20_000, dtype=np.int64))
    first = unit_subsets(ids, seed=1, subsets=97)
    assert (first != unit_subsets(ids, seed=2, subsets=97)).mean() > 0.9
    # Boosting's groups use a key of their own: groups and subsets are independent.
    groups = groups_of(None, ids, group_seed(1), 2, user_level=True)
    halves = unit_subsets(ids, seed=1, subsets=2)
    assert 0.45 < (groups == halves).mean() < 0.55


def test_group_hash_is_keyed_apart_from_the_subsets_even_at_one_seed():
    """Boosting's groups hash with a purpose of their own, so even one public seed for both
    assignments leaves groups and subsets independent (not one the other mod 2)."""
    ids = pa.array(np.arange(20_000, dtype=np.int64))
    groups = groups_of(None, ids, 1, 2, user_level=True)
    assert 0.45 < (groups == unit_subsets(ids, seed=1, subsets=2)).mean() < 0.55


def test_ids_that_collide_as_floats_are_two_users_in_the_covariance_path(tmp_path):
    rng = np.random.default_rng(2)
    big = 2**53  # 2⁵³ and 2⁵³ + 1 are the same float64
    tables = [
        users_table([big, big + 1, 3, 4], rng, pa.int64()),
        users_table([big + 1, None, 5], rng, pa.int64()),
    ]
    folder = write_files(tmp_path / "collide", tables)
    config = EstimateConfig(
        rank=1, method="gauss", epsilon=1.0, delta=1e-6, row_norm=3.0, unit_column="user"
    )
    result = run_estimate(config, open_parquet(folder), None, noise_seed=5)
    assert result.outcome == "ok"


def test_rows_with_a_null_id_belong_to_no_user_and_are_ignored(tmp_path):
    rng = np.random.default_rng(3)
    ids = user_ids(400, 60, rng)
    base = users_table(ids, rng, pa.int64())
    strays = users_table([None] * 25, np.random.default_rng(4), pa.int64())
    config = EstimateConfig(
        rank=1, method="gauss", epsilon=1.0, delta=1e-6, row_norm=3.0, unit_column="user"
    )
    without = run_estimate(
        config, open_parquet(write_files(tmp_path / "a", [base])), None, noise_seed=9
    )
    with_strays = run_estimate(
        config, open_parquet(write_files(tmp_path / "b", [base, strays])), None, noise_seed=9
    )
    np.testing.assert_array_equal(without.basis, with_strays.basis)


# ------------------------------------------------------------ neighbours and published bits


def published_manifest(manifest: dict) -> dict:
    """A manifest without its DP release (and the release of each boosted group)."""
    kept = {k: v for k, v in manifest.items() if k != "release"}
    runs = kept.get("parameters", {}).get("group_runs")
    if runs:
        runs = [{k: v for k, v in r.items() if k not in ("release", "outcome")} for r in runs]
        kept["parameters"] = {**kept["parameters"], "group_runs": runs}
    kept.pop("outcome")
    return kept


NEIGHBOUR_RUNS = {
    "friendly": EstimateConfig(rank=1, method="friendly", epsilon=1.0, delta=1e-6, seed=4),
    "auto (the default)": EstimateConfig(rank=1, epsilon=1.0, delta=1e-6, seed=4),
    "histogram": EstimateConfig(rank=1, method="histogram", epsilon=1.0, delta=1e-6, seed=4),
    "gauss": EstimateConfig(rank=1, method="gauss", epsilon=1.0, delta=1e-6, row_norm=3.0),
    "boosted gauss": EstimateConfig(
        rank=1, method="gauss", epsilon=1.0, delta=1e-6, row_norm=3.0, boost=3, seed=4
    ),
    "power": EstimateConfig(rank=1, method="power", epsilon=1.0, delta=1e-6, row_norm=3.0, seed=4),
    "cluster": ClusterConfig(clusters=2, rank=1, epsilon=1.0, delta=1e-6, seed=4),
}


@pytest.mark.parametrize("name", list(NEIGHBOUR_RUNS))
def test_neighbours_differing_by_one_user_publish_the_same_manifest(tmp_path, name):
    rng = np.random.default_rng(5)
    ids = user_ids(1200, 150, rng)
    base = users_table(ids, rng, pa.int64())
    newcomer = users_table([99] * 40, rng, pa.int64())  # 40 rows of one more user
    config = dataclasses.replace(NEIGHBOUR_RUNS[name], unit_column="user")
    run = run_cluster if isinstance(config, ClusterConfig) else run_estimate
    folder = tmp_path / "data"  # the same path for both neighbours
    manifests = []
    for tables in ([base], [pa.concat_tables([base, newcomer])]):
        write_files(folder, tables)
        manifests.append(run(config, open_parquet(folder), None, noise_seed=11).manifest)
    for manifest in manifests:
        assert manifest["n_rows"] is None
        assert "timings" not in manifest and "partitions" not in manifest["parameters"]
        assert "shuffle_buckets" not in manifest["parameters"]
    assert published_manifest(manifests[0]) == published_manifest(manifests[1])


@pytest.mark.parametrize("name", list(NEIGHBOUR_RUNS))
@pytest.mark.parametrize(
    "route", ["per-subset Gram matrices", "per-subset sketches", "row shuffle"]
)
def test_an_input_without_rows_is_released_not_refused_at_user_level(
    tmp_path, monkeypatch, name, route
):
    """n = 0 is as private as any other n: the run releases (⊥ or noise) instead of exit 2,
    on every route for hashed subsets (the route sizes lowered to force the wider ones)."""
    if route != "per-subset Gram matrices":
        monkeypatch.setattr("dpsub_dist.engine.routes.GRAM_ROUTE_BYTES", 0)
    if route == "row shuffle":
        monkeypatch.setattr("dpsub_dist.engine.routes.SKETCH_ROUTE_BYTES", 0)
    empty = users_table([], np.random.default_rng(0), pa.int64())
    folder = write_files(tmp_path / "empty", [empty])
    config = dataclasses.replace(NEIGHBOUR_RUNS[name], unit_column="user")
    run = run_cluster if isinstance(config, ClusterConfig) else run_estimate
    result = run(config, open_parquet(folder), None, noise_seed=3)
    assert result.outcome in ("ok", "no_stable_subspace")
    assert result.manifest["n_rows"] is None
    if name in ("friendly", "histogram"):
        assert result.manifest["parameters"]["local_route"] == route


_WORKER_LOG = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ - distributed\.", flags=re.M)


def run_cli(capfd, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``dpsub argv`` (in process). Log lines of the test
    cluster's worker processes (GC or event-loop warnings under load) share the captured
    stderr here; a CLI run never prints them, so they are left out."""
    code = main(list(argv))
    captured = capfd.readouterr()
    err = "".join(
        line for line in captured.err.splitlines(keepends=True) if not _WORKER_LOG.match(line)
    )
    return code, captured.out, err


def test_cli_neighbours_get_the_same_exit_code_and_lines(tmp_path, scheduler_address, capfd):
    """t·k = 1352 (the default t at this budget): one neighbour has exactly that many rows,
    the other 3 fewer (today the second one exits 2 naming its row count)."""
    smaller = user_ids(1349, 300, np.random.default_rng(6))
    ids = smaller + [5, 5, 5]  # one more user, with 3 rows
    folder = tmp_path / "data"
    results = []
    for rows in (ids, smaller):
        write_files(folder, [users_table(rows, np.random.default_rng(7), pa.int64())])
        out = tmp_path / "out"
        code, stdout, stderr = run_cli(
            capfd,
            "estimate", str(folder), "--out", str(out), "--overwrite", "--rank", "1",
            "--epsilon", "1", "--delta", "1e-6", "--unit-column", "user", "--seed", "3",
            "--scheduler", scheduler_address, "--method", "friendly",
        )  # fmt: skip
        results.append((code, stdout, stderr))
    assert results[0][0] == results[1][0] == 3  # ⊥ both times: isotropic rows
    # Which step ended in ⊥, and its reason, come from the DP release: they may differ.
    lines = [
        [re.sub(r"\(step [^)]*\): .*; manifest", "(step …): …; manifest", text) for text in r[1:]]
        for r in results
    ]
    assert lines[0] == lines[1], results


# ------------------------------------------------------------------------ the grep test

N_ROWS, USERS = 7919, 1613
_INTEGER = re.compile(r"(?<![\w.])-?\d+(?:\.0+)?(?![\w.])")


def integers_in(text: str) -> set[int]:
    """Integer tokens of a text (``7919`` and ``7919.0``, not digits inside ``0.7919``)."""
    return {int(float(token)) for token in _INTEGER.findall(text)}


def private_numbers(subsets: list[int]) -> set[int]:
    """The row and user counts, n·d and n // t for each published t (when ≥ 100, as smaller
    integers are everywhere: ranks, counts of steps…)."""
    found = {N_ROWS, USERS, N_ROWS * DIM, N_ROWS - 1, N_ROWS + 1}
    return found | {N_ROWS // t for t in subsets if N_ROWS // t >= 100}


def published_subsets(text: str) -> list[int]:
    return [int(t) for t in re.findall(r'"subsets": (\d+)', text)]


def test_no_published_artifact_holds_the_row_or_user_count(tmp_path, scheduler_address, capfd):
    rng = np.random.default_rng(8)
    ids = user_ids(N_ROWS, USERS, rng)
    table = users_table(ids, rng, pa.int64())
    data = write_files(tmp_path / "users", [table.slice(0, 3000), table.slice(3000)])
    common = ["--unit-column", "user", "--seed", "11", "--scheduler", scheduler_address]
    runs = {
        # t·k = 8000 > n: today a "too few rows" exit 2 that prints n.
        "friendly": ["--rank", "4", "--subsets", "2000", "--epsilon", "1", "--delta", "1e-6"],
        "histogram": ["--rank", "1", "--method", "histogram", "--epsilon", "1", "--delta", "1e-6"],
        "gauss": ["--rank", "1", "--method", "gauss", "--row-norm", "3", "--epsilon", "1",
                  "--delta", "1e-6"],
        "boost": ["--rank", "1", "--method", "gauss", "--row-norm", "3", "--boost", "3",
                  "--epsilon", "1", "--delta", "1e-6"],
    }  # fmt: skip
    published: dict[str, str] = {}
    for name, args in runs.items():
        out = tmp_path / f"out-{name}"
        code, stdout, stderr = run_cli(
            capfd, "estimate", str(data), "--out", str(out), *args, *common
        )
        assert code in (0, 3), f"{name}: exit {code}: {stderr}"
        published[name] = f"exit {code}\n{stdout}\n{stderr}\n" + folder_text(out)
    out = tmp_path / "out-cluster"
    code, stdout, stderr = run_cli(
        capfd, "cluster", str(data), "--out", str(out), "--clusters", "2", "--rank", "1",
        "--epsilon", "1", "--delta", "1e-6", *common,
    )  # fmt: skip
    assert code in (0, 3), stderr
    published["cluster"] = f"exit {code}\n{stdout}\n{stderr}\n" + folder_text(out)

    ledger = tmp_path / "ledger.db"
    (tmp_path / "runs").mkdir()
    job = tmp_path / "daily.yaml"
    job.write_text(
        f"name: daily\ndataset: {data}\nunit_column: user\nrank: 4\nmethod: friendly\n"
        "parameters: {subsets: 2000, seed: 11}\nbudget: {epsilon: 1, delta: 1e-6}\n"
        f"output: {tmp_path}/runs/{{run_id}}\nledger: {ledger}\n"
    )
    code, *lines = run_cli(
        capfd, "budget", "init", "--ledger", str(ledger), "--dataset", str(data),
        "--unit-column", "user", "--epsilon", "5", "--delta", "1e-5",
    )  # fmt: skip
    assert code == 0
    code, stdout, stderr = run_cli(
        capfd, "run", str(job), "--run-id", "r1", "--scheduler", scheduler_address
    )
    assert code in (0, 3), stderr
    published["run"] = f"exit {code}\n{stdout}\n{stderr}\n" + folder_text(tmp_path / "runs")
    for view in ("history", "show"):
        code, stdout, stderr = run_cli(capfd, "budget", view, "--ledger", str(ledger), "--json")
        assert code == 0
        published[f"budget {view}"] = stdout + stderr

    for name, text in published.items():
        text = text.replace(str(tmp_path), "<tmp>")  # pytest-<number> is not ours
        forbidden = private_numbers(published_subsets(text))
        leaked = sorted(integers_in(text) & forbidden)
        assert not leaked, f"{name} publishes {leaked}:\n{text}"
        for line in re.findall(r"^manifest.json:(.*)$", text, flags=re.M):
            manifest = json.loads(line)
            assert manifest["n_rows"] is None and "timings" not in manifest, name
            assert not {"partitions", "shuffle_buckets"} & set(manifest["parameters"]), name


def folder_text(folder: Path) -> str:
    """The names of the files under ``folder`` and each JSON file on one line."""
    lines = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        lines.append(f"file {path.relative_to(folder)}")
        if path.suffix == ".json":
            lines.append(f"{path.name}:" + json.dumps(json.loads(path.read_text())))
    return "\n".join(lines)
