"""No step is charged by one object and drawn by another (issue #28).

Every method and route of the release identity table (tests/privacy/test_release_checksums.py) runs
with its private generator wrapped so that any use of it outside
:meth:`~dpsub_dist.context.RunContext.release` is recorded, and every noise draw is compared with
the mechanism that release charged: each draw must be the very noise of one of its parts — that
part's sampler, scale per unit of sensitivity and (a truncated Laplace) its own truncation bound,
and a snap its own grid side — not merely fit the whole step: a part drawn at another part's (or the
whole step's) δ moves no scale, only its bound or grid. Then the steps charged must be the steps the
run declared (its manifest's ``budget_shares``): all of them where a basis was released (a stream's
cases append its whole horizon: its last release has charged its whole plan). Every step released is
named by a :class:`~dpsub_dist.methods.steps.Step` member (or numbered: a clustering iteration, a
stream's tree node), not by a string written at the release.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dpsub_dist
from dpsub_dist import context
from dpsub_dist.methods.steps import Step
from dpsub_dist.privacy import gap_max, mechanism, noise

sys.path.insert(0, str(Path(__file__).parent))
from test_release_checksums import CLUSTERS, ESTIMATES, STREAMS, _rows, run_case  # noqa: E402

CASES = [*ESTIMATES, *CLUSTERS, *STREAMS]
NUMBERED = re.compile(r"iteration_\d+|batch \d+")
"""Steps numbered where they are planned: clustering iterations, a stream's tree nodes."""


class GuardedGenerator:
    """A private generator that records every use, made inside or outside a release."""

    def __init__(self, rng: np.random.Generator, outside: list[str], inside: list[str]) -> None:
        self._rng = rng
        self._outside = outside
        self._inside = inside

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._rng, name)
        if not callable(attr):
            return attr

        def guarded(*args: Any, **kwargs: Any) -> Any:
            used = self._outside if context.active_release() is None else self._inside
            used.append(name)
            return attr(*args, **kwargs)

        return guarded


KINDS: dict[type, tuple[str, ...]] = {
    mechanism.Gaussian: ("gaussian", "symmetric_gaussian"),
    mechanism.Laplace: ("laplace",),
    mechanism.TruncatedLaplace: ("truncated_laplace",),
    mechanism.AboveThreshold: ("laplace",),
}
"""The samplers (:mod:`noise`'s draw kinds) each kind of part draws with."""


def _parts(mech: mechanism.Mechanism) -> list[mechanism.Mechanism]:
    """The parts of a composed (or parallel) step, each with its own calibration."""
    if isinstance(mech, mechanism.Composed | mechanism.Parallel):
        return [p for part in mech.parts for p in _parts(part)]
    return [mech]


def _calibrations(part: mechanism.Mechanism) -> list[tuple[float, float]]:
    """(scale, sensitivity) of each draw the part may make: its own, not the step's."""
    if isinstance(part, mechanism.Gaussian):
        return [(part.sigma, part.sensitivity)]
    if isinstance(part, mechanism.Laplace | mechanism.TruncatedLaplace):
        return [(part.scale, part.sensitivity)]
    if isinstance(part, mechanism.AboveThreshold):
        return [
            (part.query_scale, part.sensitivity),
            (part.threshold_scale, part.threshold_sensitivity),
        ]
    return []


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12)


def _drawn_as(
    part: mechanism.Mechanism, kind: str, scale: float, sensitivity: float, units
) -> bool:
    """Whether one draw is the very noise of ``part``: its sampler, its scale per unit of
    sensitivity, and a truncated Laplace's own truncation bound (on the draw's grid)."""
    if kind not in KINDS.get(type(part), ()):
        return False
    ratio = scale / sensitivity
    if not any(_same(ratio, s / d) for s, d in _calibrations(part)):
        return False
    if isinstance(part, mechanism.TruncatedLaplace):  # units: (g, t, changed, ⌊bound/g⌋)
        return units[3] == math.floor(Fraction(part.bound) / Fraction(units[0]))
    return True


@pytest.fixture
def guard(monkeypatch) -> dict[str, list]:
    """Wrap every private generator a run makes; returns what was seen."""
    seen: dict[str, list] = {"outside": [], "inside": [], "unmatched": [], "draws": [], "steps": []}
    make = noise.noise_rng

    def guarded_rng(private_seed: int | None = None) -> GuardedGenerator:
        rng = make(private_seed)
        return GuardedGenerator(rng, seen["outside"], seen["inside"])  # type: ignore[return-value]

    for name, module in list(sys.modules.items()):
        if name.startswith("dpsub_dist") and getattr(module, "noise_rng", None) is make:
            monkeypatch.setattr(module, "noise_rng", guarded_rng)
    record = noise._record

    def checked(kind: str, scale: float, sensitivity: float, *args: Any, **kw: Any) -> None:
        active = context.active_release()
        seen["draws"].append(kind)
        if active is None:
            seen["outside"].append(kind)
        else:
            step, mech = active
            seen["steps"].append(step)
            if not any(_drawn_as(p, kind, scale, sensitivity, args[1]) for p in _parts(mech)):
                seen["unmatched"].append((step, kind, scale, sensitivity, args[1], mech))
        record(kind, scale, sensitivity, *args, **kw)

    monkeypatch.setattr(noise, "_record", checked)
    snap = gap_max.snap_symmetric

    def snapped(matrix: np.ndarray, side: float, rng: Any) -> np.ndarray:
        """A snap's grid must be its own part's (the side its δ share was charged for)."""
        active = context.active_release()
        sides = (
            []
            if active is None
            else [p.side for p in _parts(active[1]) if isinstance(p, mechanism.Snap)]
        )
        seen["draws"].append("snap")
        if active is None:
            seen["outside"].append("snap")
        elif not any(_same(side, s) for s in sides):
            seen["unmatched"].append((active[0], "snap", side, sides))
        return snap(matrix, side, rng)

    monkeypatch.setattr(gap_max, "snap_symmetric", snapped)
    monkeypatch.setattr(noise, "_LOGS", [[]])  # _record runs only where a log listens
    return seen


@pytest.mark.parametrize("name", CASES)
def test_every_draw_is_the_noise_of_the_mechanism_its_release_charged(name, guard) -> None:
    basis, manifest = run_case(name)
    # gibbs's chain draws from the generator itself, not through a noise sampler
    assert guard["draws"] or guard["inside"], "the run drew no noise: the guard saw nothing"
    assert guard["outside"] == [], f"private randomness used outside a release: {guard}"
    assert guard["unmatched"] == [], f"a draw not calibrated as its charged mechanism: {guard}"
    unnamed = {s for s in guard["steps"] if not (isinstance(s, Step) or NUMBERED.fullmatch(s))}
    assert not unnamed, f"steps released under a name that is not a Step member: {unnamed}"
    _charged_are_declared(basis, manifest)


def _charged_are_declared(basis: np.ndarray | None, manifest: dict[str, Any]) -> None:
    if manifest["privacy"]["budget"] is None:  # gibbs: not DP, so no plan nor charge published
        assert manifest["privacy"]["guarantee"].startswith("none")
        return
    parameters = manifest["parameters"]
    if "group_runs" in parameters:  # boosted: the plan every group declared is the run's
        parameters = parameters["group_runs"][0]["parameters"]
    declared = list(parameters["budget_shares"])
    charged = [s["step"] for s in manifest["privacy"]["budget"]["steps"]]
    if basis is not None:
        assert sorted(charged) == sorted(declared)
    else:
        assert set(charged) <= set(declared)


def test_a_failed_stream_append_draws_inside_releases(guard, tmp_path) -> None:
    """An append whose batch fails validation (a NaN) is charged as it would have been and
    closes its tree node with noise on a zero matrix; that draw, and the next append's
    (a level charged at append 1, drawn again), happen inside releases at the scale of the
    mechanism charged."""
    import pandas as pd

    from dpsub_dist.errors import DataError
    from dpsub_dist.job import StreamConfig, init_stream
    from dpsub_dist.methods.stream import open_stream

    state = str(tmp_path / "s.stream")
    init_stream(state, StreamConfig(rank=2, horizon=4, rho=1.0, delta=1e-6, clip_norm=5.0))
    with open_stream(state) as stream:
        for t in range(3):
            rows = _rows(6 + t, 2_000, 8, 2)
            rows[7, 3] = np.nan if t == 1 else rows[7, 3]
            path = tmp_path / f"batch-{t}.parquet"
            pd.DataFrame(rows, columns=[f"x{i}" for i in range(8)]).to_parquet(path)
            if t == 1:
                with pytest.raises(DataError):
                    stream.append(str(path))
            else:
                stream.append(str(path))
        steps = [s["step"] for s in stream.release(2).manifest["privacy"]["budget"]["steps"]]
    assert steps == ["mean", "batch 1", "batch 2"]
    assert guard["draws"].count("symmetric_gaussian") == 3
    assert guard["outside"] == [] and guard["unmatched"] == [], guard


def test_the_guard_sees_a_draw_outside_a_release(guard) -> None:
    """The wrapped generator and the draw check report a draw made outside any release."""
    rng = noise.noise_rng(1)
    noise.add_gaussian(rng, np.zeros(3), 1.0, 1.0)
    assert guard["outside"], "a draw outside a release went unseen"


def test_the_guard_sees_a_draw_at_another_scale(guard) -> None:
    """A release whose draw uses a scale other than its charged mechanism's is reported."""
    ctx = _free_context()
    half: Callable = lambda m, rng: noise.add_gaussian(rng, np.zeros(3), m.sigma / 2, 1.0)  # noqa: E731
    ctx.release("gram_noise", mechanism.Gaussian(1.0, 2.0, 1.0), half)
    assert guard["unmatched"] and guard["outside"] == []


def _gap_max_step() -> gap_max.GapMax:
    from dpsub_dist.privacy.accountant import ApproxDP

    return gap_max.gap_max_mechanism(ApproxDP(1.0, 1e-6), 1e-8, 60, 4)


def test_the_guard_sees_a_part_drawn_at_the_whole_steps_delta(guard) -> None:
    """GAP-MAX's truncated Laplace drawn with the bound of the whole step's δ (its scale,
    Δ/ε, is its part's: only the truncation moved) is reported; its own bound is not."""
    steps = _gap_max_step()
    decision = steps.decision
    whole = mechanism.truncated_laplace(decision.sensitivity, 1.0, steps.cost().delta)
    assert whole.scale == decision.scale and whole.bound < decision.bound
    ctx = _free_context()
    own: Callable = lambda m, rng: m.decision.release(rng, 0.0)  # noqa: E731
    ctx.release(Step.GAP_MAX, steps, own)
    assert guard["unmatched"] == []
    other: Callable = lambda m, rng: whole.release(rng, 0.0)  # noqa: E731
    ctx.release(Step.GAP_MAX, steps, other)
    assert [u[1] for u in guard["unmatched"]] == ["truncated_laplace"]


def test_the_guard_sees_a_snap_on_another_grid(guard) -> None:
    """A snap on a grid other than its part's side (its δ share) is reported."""
    steps = _gap_max_step()
    ctx = _free_context()
    for side in (steps.snap.side, steps.snap.side / 2):
        ctx.release(
            Step.GAP_MAX, steps, lambda m, rng, w=side: gap_max.snap_symmetric(np.eye(4), w, rng)
        )
    assert [u[1:3] for u in guard["unmatched"]] == [("snap", steps.snap.side / 2)]


def _free_context() -> context.RunContext:
    """A run context that charges nothing (a draw's calibration is what is under test)."""
    ctx = context.RunContext.__new__(context.RunContext)
    ctx._rng = noise.noise_rng(1)  # type: ignore[attr-defined]
    ctx.accountant = _Free()  # type: ignore[assignment]
    ctx.mechanisms = {}
    return ctx


class _Free:
    def charge(self, step: str, cost: Any) -> None:
        pass


def test_every_case_is_guarded() -> None:
    """The guard runs over every method of every command (a new method joins the table)."""
    from dpsub_dist.methods import REGISTRY

    methods = {o.get("method", "auto") for _, o in ESTIMATES.values()}
    methods |= {o.get("method", "sample-aggregate") for o in CLUSTERS.values()}
    methods |= {o.get("method", "online") for o in STREAMS.values()}
    everything = set(REGISTRY["estimate"]) | set(REGISTRY["cluster"]) | set(REGISTRY["stream"])
    assert methods >= everything, dpsub_dist.__name__
