"""The end-to-end privacy net at user level, and the data side of every run (docs/testing.md).

Each case fits a method that accepts ``unit_column`` on a Parquet dataset with a user column,
through ``PrivateSubspace``/``PrivateSubspaceClustering`` in this process (no Dask client), so
that the test sees both sides of the run:

- the noise: every draw goes through the checks of :func:`test_noise_ledger.check_run` (its
  scale is what the charged step buys, the number of values is what the step releases, the
  sampler drew at that spread, a truncated Laplace's δ, the steps run are the planned ones);
- the data: every user reaches exactly one subset (``SubsetPlan.subset_of`` as the loaders
  call it) and, under boosting, exactly one group (``GroupLoader`` as each group's run reads
  it); every Gram or power product stays within what users scaled to norm ≤ 1 can reach,
  with one user far above every bound (many rows, each 10⁶ times too long);
- the sensitivity: with a public row norm, the first summed value of the run on the data
  and on the data without that heavy user differ by no more than the step's sensitivity.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import test_noise_ledger as ledger

from dpsub_dist import PrivateSubspace, PrivateSubspaceClustering, api
from dpsub_dist.context import RunContext
from dpsub_dist.engine.subsets import SubsetPlan
from dpsub_dist.errors import InputError
from dpsub_dist.methods import REGISTRY, boost
from dpsub_dist.privacy import noise
from dpsub_dist.privacy.accountant import Accountant
from dpsub_dist.synth import generate

USERS = 3000
HEAVY_USER = USERS  # one more user, with HEAVY_ROWS rows each FAR_ROW times too long
HEAVY_ROWS = 200
BUDGET = {"epsilon": 4.0, "delta": 1e-6}


def _write(root: Path, source: Path, heavy: bool) -> Path:
    """``source``'s rows with a user column (USERS users, one to ~13 rows each), plus the
    heavy user's rows in the first file when ``heavy``."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(11)
    for i, part in enumerate(sorted(source.glob("*.parquet"))):
        table = pq.read_table(part)
        users = rng.integers(0, USERS, table.num_rows)
        if heavy and i == 0:
            far = table.slice(0, HEAVY_ROWS).to_pandas() * ledger.FAR_ROW
            table = pa.concat_tables(
                [pa.Table.from_pandas(far, schema=table.schema, preserve_index=False), table]
            )
            users = np.concatenate([np.full(HEAVY_ROWS, HEAVY_USER), users])
        table = table.append_column("user", pa.array(users, pa.int64()))
        pq.write_table(table, root / f"part-{i}.parquet")
    return root


@pytest.fixture(scope="module")
def users(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("privacy-net")
    rows = generate(root / "rows", rows=20_000, dim=8, rank=2, partitions=2, seed=1).path
    clusters = generate(
        root / "clusters", rows=60_000, dim=8, rank=2, clusters=2, partitions=2, seed=1
    ).path
    return {
        "rows": _write(root / "users", rows, heavy=True),
        "without heavy user": _write(root / "neighbour", rows, heavy=False),
        "clusters": _write(root / "cluster users", clusters, heavy=True),
    }


@dataclass(frozen=True)
class Case:
    method: str
    source: str
    options: dict[str, Any]
    subsets: bool = False  # the method assigns users to subsets (sample and aggregate)


CASES = {
    "friendly": Case("friendly", "rows", {"method": "friendly"}, subsets=True),
    "histogram": Case(
        "histogram", "rows", {"method": "histogram", "epsilon": 12.0, "subsets": 200}, True
    ),
    "gauss": Case("gauss", "rows", {"method": "gauss"}),
    "gauss public norm": Case("gauss", "rows", {"method": "gauss", "row_norm": 5.0}),
    "gap-perturb": Case("gap-perturb", "rows", {"method": "gap-perturb"}),
    "power": Case("power", "rows", {"method": "power"}),
    "power public norm": Case("power", "rows", {"method": "power", "row_norm": 5.0}),
    "auto": Case("auto", "rows", {"method": "auto"}),
    "boost friendly": Case("boost", "rows", {"method": "friendly", "boost": 2}, subsets=True),
    "boost gauss": Case("boost", "rows", {"method": "gauss", "boost": 2}),
    "cluster sample-aggregate": Case("cluster sample-aggregate", "clusters", {}, subsets=True),
}
"""Every method that accepts ``unit_column`` (and boosting around it), at user level."""


def test_every_user_level_method_has_a_case() -> None:
    estimate, cluster = REGISTRY["estimate"], REGISTRY["cluster"]
    user_level = {m for m, spec in estimate.items() if not spec.row_level_only}
    user_level |= {f"cluster {m}" for m, spec in cluster.items() if not spec.row_level_only}
    assert {case.method for case in CASES.values()} == user_level | {"boost"}


# ----------------------------------------------------------------------------- the data side


@dataclass
class DataSide:
    """Which subset and which boosting group each user's rows reached, as the loaders ran."""

    subsets: dict[tuple[SubsetPlan, bytes], set[int]]
    groups: dict[bytes, set[int]]
    users: set[bytes]


def _keys(units: Any) -> np.ndarray:
    return units.keys[units.inverse]


def record_data_side(monkeypatch) -> DataSide:
    side = DataSide(defaultdict(set), defaultdict(set), set())
    subset_of = SubsetPlan.subset_of

    def subsets(plan: SubsetPlan, positions: np.ndarray, units: Any) -> np.ndarray:
        out = subset_of(plan, positions, units)
        for key, subset in zip(_keys(units), out, strict=True):
            side.subsets[plan, key].add(int(subset))
        return out

    call = boost.GroupLoader.__call__

    def group(loader: boost.GroupLoader, part_at: tuple[Any, int]) -> tuple[np.ndarray, Any]:
        rows, units = call(loader, part_at)
        for key in set(_keys(units)):
            side.groups[key].add(loader.group)
        return rows, units

    monkeypatch.setattr(SubsetPlan, "subset_of", subsets)
    monkeypatch.setattr(boost.GroupLoader, "__call__", group)
    monkeypatch.setattr(api._PrivateEstimator, "_client", lambda self, X: None)  # in-process
    return side


def check_data_side(side: DataSide, case: Case, all_users: set[bytes]) -> None:
    """Each user reaches exactly one subset of each plan and exactly one boosting group."""
    if case.subsets:
        reached = {key for _, key in side.subsets}
        assert reached == all_users, f"{len(all_users - reached)} users reached no subset"
        split = [k for k, s in side.subsets.items() if len(s) != 1]
        assert not split, f"{len(split)} users reached more than one subset, e.g. {split[0]}"
    if "boost" in case.options:
        assert set(side.groups) == all_users, "a user reached no group"
        split = [k for k, g in side.groups.items() if len(g) != 1]
        assert not split, f"{len(split)} users reached more than one group, e.g. {split[0]}"


# ----------------------------------------------------------------------------- the runs


def fit(case: Case, source: Path) -> tuple[dict, list[noise.Draw], list[Accountant]]:
    options = {**BUDGET, "unit_column": "user", "seed": 3, **case.options}
    accountants: list[Accountant] = []
    report = Accountant.report

    def recorded(self: Accountant) -> dict:
        accountants.append(self)
        return report(self)

    with pytest.MonkeyPatch.context() as patch, noise.draw_log() as draws:
        patch.setattr(Accountant, "report", recorded)
        if case.method.startswith("cluster"):
            estimator: Any = PrivateSubspaceClustering(2, n_components=2, **options)
        else:
            estimator = PrivateSubspace(2, **options)
        estimator.fit(source)
    return estimator.manifest_, list(draws), accountants


def _all_users(source: Path) -> set[bytes]:
    from dpsub_dist.engine.assign import canonical_unit_ids

    ids = [
        canonical_unit_ids(pq.read_table(p, columns=["user"])["user"])[1]
        for p in sorted(source.glob("*.parquet"))
    ]
    return {key for unit in ids for key in unit.keys}


@pytest.mark.parametrize("name", sorted(CASES))
def test_user_level_run_draws_what_it_charges_and_keeps_each_user_in_one_place(
    name: str, users: dict[str, Path], monkeypatch
) -> None:
    case = CASES[name]
    ledger.plant_noise_seeds(monkeypatch)
    side = record_data_side(monkeypatch)
    charges = ledger.record_charges(monkeypatch)
    manifest, draws, accountants = fit(case, users[case.source])
    assert manifest["outcome"] == "ok", manifest["release"]
    assert manifest["parameters"]["unit_column"] == "user"
    ledger.check_run(ledger.Run(manifest, draws), units=USERS + 1, charges=charges)
    ledger.check_privacy_maps([a for a in accountants if a._plan is not None])
    check_data_side(side, case, _all_users(users[case.source]))


# ----------------------------------------------------------------------------- sensitivity

SENSITIVITY: dict[str, Callable[[noise.Draw], float]] = {
    "gauss public norm": lambda draw: 1.0,  # §7: add/remove one user of Σ‖x‖² ≤ 1: ‖uuᵀ‖_F ≤ 1
    "power public norm": lambda draw: 1.0,  # ‖(Σ uuᵀ)V‖_F ≤ 1 for V orthonormal
}
"""Cases whose first draw sums the data with a public bound, and that sum's L2 sensitivity
under adding or removing one user (the privacy argument's, as literals)."""


@pytest.mark.parametrize("name", sorted(SENSITIVITY))
def test_removing_the_heavy_user_moves_the_first_sum_by_its_sensitivity_at_most(
    name: str, users: dict[str, Path], monkeypatch
) -> None:
    """Per-user scaling end to end: the heavy user (HEAVY_ROWS rows, each FAR_ROW times too
    long) moves the summed value by at most Δ, however many rows and however long."""
    ledger.plant_noise_seeds(monkeypatch)
    record_data_side(monkeypatch)
    case = CASES[name]
    _, with_heavy, _ = fit(case, users["rows"])
    _, without, _ = fit(case, users["without heavy user"])
    first, other = with_heavy[0], without[0]
    assert first.value is not None and other.value is not None
    moved = float(np.linalg.norm(first.value - other.value))
    slack = first.grid * math.sqrt(first.size)  # both values are rounded to the grid
    assert 0 < moved <= SENSITIVITY[name](first) + slack, f"moved by {moved}"


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("method", ["auto", "gauss", "power", "friendly"])
def test_standardize_is_refused_at_user_level_before_any_read(
    method: str, users: dict[str, Path], monkeypatch
) -> None:
    """The private location needs the public row count: ``standardize=True`` with a unit
    column is bad input (exit 2 at the CLI), raised before a row is read or a step charged."""
    charges = ledger.record_charges(monkeypatch)
    opened = []
    monkeypatch.setattr(RunContext, "open", lambda *a, **k: opened.append(a))
    estimator = PrivateSubspace(
        2, **BUDGET, method=method, unit_column="user", standardize=True, seed=3
    )
    with pytest.raises(InputError, match="standardize is row level only"):
        estimator.fit(str(users["rows"]))
    assert not charges and not opened
