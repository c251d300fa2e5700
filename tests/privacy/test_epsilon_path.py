"""ε from the CLI to each noise draw in four hops (issue #15), pinned on real CLI runs:

1. the flags → the run's Budget: ``parse_budget``, once (``config.budget()``);
2. that Budget → each step's grant: one ``Accountant.split`` of that very object, by the
   method's declared plan;
3. a grant → a calibrated :class:`~dpsub_dist.privacy.mechanism.Mechanism`, charged under
   its step;
4. that Mechanism → the noise: every draw is at the noise multiplier (scale/sensitivity)
   a charged mechanism states.

The frames between (``cli`` → ``job.run_estimate`` → the method's runner → its step → the
privacy function: 7 to 10 in all) hand the config or the grant on unchanged. A second parse,
a second split, or a draw at a multiplier that no charged mechanism states (noise
calibrated off the path) fails here.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from dpsub_dist import jobfile
from dpsub_dist.cli import main
from dpsub_dist.privacy import accountant, mechanism, noise
from dpsub_dist.synth import generate

RUNS = {
    "gauss": ["estimate", "--method", "gauss"],
    "gap-perturb": ["estimate", "--method", "gap-perturb"],
    "friendly": ["estimate", "--method", "friendly"],
    "histogram": ["estimate", "--method", "histogram"],
    "power": ["estimate", "--method", "power"],
    "auto": ["estimate"],
    "user-level gauss": ["estimate", "--method", "gauss", "--unit-column", "x0"],
    "cluster sample-aggregate": ["cluster", "--clusters", "2"],
    "boost": ["estimate", "--method", "gauss", "--boost", "3"],
    "exact": ["estimate", "--method", "exact"],
    "cluster sulq": ["cluster", "--clusters", "2", "--method", "sulq", "--private-norm"],
}
"""One CLI run per kind of path (the default, each family, user level, boosting, clustering)."""

SPLITS = {"boost": 4}
"""Runs whose Budget is split more than once: ``--boost 3`` runs its method's plan on each of
3 disjoint groups (parallel composition), each split of the same Budget, and the boosted run
declares that one plan again to charge each step with the groups' mechanisms in parallel."""


@dataclasses.dataclass
class Path4:
    """What each hop produced in one run."""

    parsed: list = dataclasses.field(default_factory=list)
    totals: list = dataclasses.field(default_factory=list)
    splits: list = dataclasses.field(default_factory=list)
    charged: list = dataclasses.field(default_factory=list)


@pytest.fixture
def hops(monkeypatch) -> Path4:
    seen = Path4()
    parse, init, split, charge = (
        accountant.parse_budget,
        accountant.Accountant.__init__,
        accountant.Accountant.split,
        accountant.Accountant.charge,
    )

    def parsed(*args):
        seen.parsed.append(parse(*args))
        return seen.parsed[-1]

    def made(self, total, *args, **kwargs):
        seen.totals.append(total)
        init(self, total, *args, **kwargs)

    def split_once(self, shares):
        grants = split(self, shares)
        seen.splits.append((self, grants))
        return grants

    def charged(self, step, cost):
        seen.charged.append((self, step, cost))
        return charge(self, step, cost)

    for module in (accountant, jobfile):  # params and cli import it from accountant at each call
        monkeypatch.setattr(module, "parse_budget", parsed)
    monkeypatch.setattr(accountant.Accountant, "__init__", made)
    monkeypatch.setattr(accountant.Accountant, "split", split_once)
    monkeypatch.setattr(accountant.Accountant, "charge", charged)
    return seen


def stated_multipliers(mech: object) -> set[tuple[str, float]]:
    """The (noise family, scale/sensitivity) of each draw a mechanism makes, by its own
    fields: its privacy map reads only that ratio, so a release may draw in other units
    (Δ and σ both scaled by a public factor, as the mean's unit/n) but not at another ratio."""
    if isinstance(mech, mechanism.Composed):
        return set().union(*(stated_multipliers(part) for part in mech.parts))
    if isinstance(mech, mechanism.AboveThreshold):
        return {
            ("laplace", mech.query_scale / mech.sensitivity),
            ("laplace", mech.threshold_scale / mech.threshold_sensitivity),
        }
    if isinstance(mech, mechanism.TruncatedLaplace):
        return {("truncated_laplace", mech.scale / mech.sensitivity)}
    if hasattr(mech, "sigmas"):  # the power method's T Gaussian releases, each at its σ_t
        return {("gaussian", sigma / mech.sensitivity) for sigma in mech.sigmas}
    if hasattr(mech, "sigma"):  # Gaussian
        return {("gaussian", mech.sigma / mech.sensitivity)}
    scale = getattr(mech, "scale", None)  # Laplace
    return set() if scale is None else {("laplace", scale / mech.sensitivity)}


def off_path(charged: list, draws: list) -> set[tuple[str, float]]:
    """The draws (kind, scale/sensitivity) at a ratio that no charged mechanism states."""
    stated = set().union(*(stated_multipliers(cost) for cost in charged))
    drawn = {
        ("gaussian" if "gaussian" in d.kind else d.kind, d.scale / d.sensitivity) for d in draws
    }
    return {
        (kind, ratio)
        for kind, ratio in drawn
        if not any(k == kind and math.isclose(r, ratio, rel_tol=1e-9) for k, r in stated)
    }


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """3,000 rows for every run; 100 exactly rank-1 rows for --method exact (n ≤ 200)."""
    root = tmp_path_factory.mktemp("epsilon-path")
    rows = generate(root / "rows", rows=3_000, dim=6, rank=1, partitions=2, seed=3).path
    exact = generate(root / "exact", rows=100, dim=6, rank=1, model="exact", seed=3).path
    return {"rows": rows, "exact": exact}


@pytest.fixture(scope="module")
def source(sources) -> Path:
    return sources["rows"]


@pytest.mark.parametrize("run", list(RUNS))
def test_epsilon_reaches_every_draw_in_four_hops(
    run, hops, sources, tmp_path, scheduler_address
) -> None:
    command, *options = RUNS[run]
    args = [
        command,
        str(sources["exact" if run == "exact" else "rows"]),
        "--rank",
        "1",
        "--epsilon",
        "4",
        "--delta",
        "1e-6",
        *options,
    ]
    args += ["--out", str(tmp_path / "out"), "--quiet", "--scheduler", scheduler_address]
    with noise.draw_log() as draws:
        assert main(args) in (0, 3)  # 3: ⊥, still a private release
    # 1: one parse of the flags.
    assert len(hops.parsed) == 1, hops.parsed
    budget = hops.parsed[0]
    # 2: every accountant holds that Budget (not a copy); one split per plan run.
    assert hops.totals and all(total is budget for total in hops.totals), hops.totals
    assert len(hops.splits) == SPLITS.get(run, 1), hops.splits
    # 3: every charge under a plan is a mechanism, under a step of its split (boost's own
    # charges are the parallel composition of its groups' mechanisms: no draw of its own).
    grants = {id(acc): grants for acc, grants in hops.splits}
    planned = [
        (grants[id(acc)], step, cost) for acc, step, cost in hops.charged if id(acc) in grants
    ]
    assert planned, "a private run charges its steps"
    for steps, step, cost in planned:
        assert isinstance(cost, mechanism.Mechanism), (step, cost)
        assert step in steps, (step, sorted(steps))
    # 4: every draw at a noise multiplier a charged mechanism states.
    assert draws, "a private run draws noise"
    assert not off_path([cost for _, _, cost in planned], draws), (
        "draws at scales no charged mechanism states"
    )


def test_a_draw_off_the_path_is_seen(hops, source, tmp_path, scheduler_address, monkeypatch):
    """The planted bug: a release that draws at a σ of its own (2× the charged one)."""

    def doubled(self, rng, value, **kwargs):
        return noise.add_gaussian(rng, value, 2 * self.sigma, self.sensitivity)

    monkeypatch.setattr(mechanism.Gaussian, "release", doubled)
    args = ["estimate", str(source), "--rank", "1", "--epsilon", "4", "--delta", "1e-6"]
    args += ["--method", "gauss", "--out", str(tmp_path / "out"), "--quiet"]
    with noise.draw_log() as draws:
        assert main([*args, "--scheduler", scheduler_address]) == 0
    charged = [cost for _, _, cost in hops.charged]
    assert {kind for kind, _ in off_path(charged, draws)} == {"gaussian"}
