"""No step is charged by one object and drawn by another (issue #28).

Every method and route of the release identity table (tests/privacy/test_release_checksums.py) runs
with its private generator wrapped so that any use of it outside
:meth:`~dpsub_dist.context.RunContext.release` is recorded, and every noise draw is compared
with the mechanism that release charged: its scale per unit of sensitivity must be that
mechanism's (or one of its parts'). Then the steps charged must be the steps the run
declared (its manifest's ``budget_shares``): all of them where a basis was released (a
stream's cases append its whole horizon: its last release has charged its whole plan). Every
step released is named by a :class:`~dpsub_dist.methods.steps.Step` member (or numbered:
a clustering iteration, a stream's tree node), not by a string written at the release.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dpsub_dist
from dpsub_dist import context
from dpsub_dist.methods.steps import Step
from dpsub_dist.privacy import mechanism, noise

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


def _ratios(mech: mechanism.Mechanism) -> list[float]:
    """Each noise scale per unit of sensitivity the mechanism (or its parts) may draw."""
    if isinstance(mech, mechanism.Composed):
        return [r for part in mech.parts for r in _ratios(part)]
    if isinstance(mech, mechanism.Gaussian):
        return [mech.sigma / mech.sensitivity]
    if isinstance(mech, mechanism.Laplace | mechanism.TruncatedLaplace):
        return [mech.scale / mech.sensitivity]
    if isinstance(mech, mechanism.AboveThreshold):
        return [
            mech.query_scale / mech.sensitivity,
            mech.threshold_scale / mech.threshold_sensitivity,
        ]
    return []


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
            ratio = scale / sensitivity
            if not any(math.isclose(ratio, r, rel_tol=1e-12) for r in _ratios(mech)):
                seen["unmatched"].append((step, kind, ratio, _ratios(mech)))
        record(kind, scale, sensitivity, *args, **kw)

    monkeypatch.setattr(noise, "_record", checked)
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
    ctx = context.RunContext.__new__(context.RunContext)
    ctx._rng = noise.noise_rng(1)  # type: ignore[attr-defined]
    ctx.accountant = _Free()  # type: ignore[assignment]
    ctx.mechanisms = {}
    half: Callable = lambda m, rng: noise.add_gaussian(rng, np.zeros(3), m.sigma / 2, 1.0)  # noqa: E731
    ctx.release("gram_noise", mechanism.Gaussian(1.0, 2.0, 1.0), half)
    assert guard["unmatched"] and guard["outside"] == []


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
