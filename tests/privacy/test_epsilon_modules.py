"""ε reaches every noise draw in at most four module hand-offs, each module entered once
(issue #28): a call-stack count of modules, not of conceptual stages
(tests/privacy/test_epsilon_path.py pins those).

At every draw of every case of the release identity table, the stack is read from the method's
runner down to the draw. The modules whose frames hold the budget in some form — the run's
config (its ``epsilon``/``rho``), a :class:`Budget` (the total or a step's grant) or a
calibrated :class:`Mechanism` — are the hands ε passes through. There must be at most
:data:`MAX_HAND_OFFS` changes of module along them, and no module may be entered twice on the
whole stack below the runner (a step calling back up into its method, or the accountant
entered again, fails). The ``draw`` a step hands to ``RunContext.release`` is the step's own
closure run by the context: that one frame is not counted as entering the step's module again;
nor is a declaration's :class:`~dpsub_dist.methods.spec.Later`, which only imports the code
it names.
Auto's choice and boosting's groups are resolved in the job layer, above the runner (the
chosen method's, or each group's, runner is an ordinary run), so they take no hand-off either.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import pytest

from dpsub_dist.methods.spec import Later
from dpsub_dist.privacy import accountant, mechanism, noise

sys.path.insert(0, str(Path(__file__).parent))
from test_release_checksums import CLUSTERS, ESTIMATES, run_case  # noqa: E402

MAX_HAND_OFFS = 4
ABOVE_THE_RUNNER = ("dpsub_dist.job", "dpsub_dist.cli", "dpsub_dist.api")
"""The doors and the job layer: they hand the config to a method's runner (auto resolved and
boosting's groups split there first, :func:`dpsub_dist.job.run_estimate`)."""


def _holds_budget(frame: Any) -> bool:
    for value in frame.f_locals.values():
        if isinstance(value, accountant.ApproxDP | accountant.ZCDP | mechanism.Mechanism):
            return True
        if hasattr(value, "epsilon") and hasattr(value, "rank"):  # the run's config
            return True
    return False


def _stack(skip: int) -> tuple[list[str], list[str]]:
    """(every dpsub module below the runner, collapsed; those holding the budget, collapsed),
    from ``skip`` frames below this one."""
    frames = [f.frame for f in inspect.stack()[1 + skip :]]
    frames.reverse()  # outermost first
    modules: list[str] = []
    holders: list[str] = []
    caller = ""
    for frame in frames:
        name = frame.f_globals.get("__name__", "")
        called_by_context, caller = caller == "dpsub_dist.context", name
        if not name.startswith("dpsub_dist") or name in ABOVE_THE_RUNNER:
            continue
        if called_by_context and name != "dpsub_dist.context":
            continue  # the draw a step hands to release: its own closure, run by the context
        if frame.f_code is Later.__call__.__code__:
            continue  # a declaration's lazy import of its code, no hand-off
        if not modules or modules[-1] != name:
            modules.append(name)
        if _holds_budget(frame) and (not holders or holders[-1] != name):
            holders.append(name)
    return modules, holders


GRID_DRAWS = [*ESTIMATES, *(c for c in CLUSTERS if c != "cluster gibbs")]
"""Cases whose noise is drawn on the grid (:mod:`noise`); Gibbs samples its exponential
mechanism from the generator itself (tests/privacy/test_release_guard.py holds it to its
release)."""


@pytest.mark.parametrize("name", GRID_DRAWS)
def test_epsilon_reaches_each_draw_in_at_most_four_module_hand_offs(name, monkeypatch) -> None:
    paths: dict[tuple[str, ...], tuple[str, ...]] = {}
    record = noise._record

    def hook(*args: Any, **kwargs: Any) -> None:
        modules, holders = _stack(skip=1)  # below this hook
        paths[tuple(modules)] = tuple(holders)
        record(*args, **kwargs)

    monkeypatch.setattr(noise, "_record", hook)
    monkeypatch.setattr(noise, "_LOGS", [[]])  # _record runs only where a log listens
    run_case(name)
    assert paths, "no draw seen"
    for modules, holders in paths.items():
        path = " → ".join(m.removeprefix("dpsub_dist.") for m in modules)
        assert len(set(modules)) == len(modules), f"a module entered twice: {path}"
        assert len(holders) - 1 <= MAX_HAND_OFFS, f"{len(holders) - 1} hand-offs: {holders}"


def test_the_stack_reader_sees_a_module_entered_twice_and_the_budget_holders() -> None:
    """Module a calls b, b calls back into a: a is entered twice; only b holds a grant."""
    a: dict[str, Any] = {"__name__": "dpsub_dist.a"}
    b: dict[str, Any] = {"__name__": "dpsub_dist.b"}
    exec("def a1():\n    return b1()\ndef a2():\n    return read()\n", a)
    exec("def b1():\n    grant = G\n    return a2()\n", b)
    a.update(b1=b["b1"], read=lambda: _stack(skip=1))
    b.update(a2=a["a2"], G=accountant.ApproxDP(1.0, 0.0))
    modules, holders = a["a1"]()
    assert modules == ["dpsub_dist.a", "dpsub_dist.b", "dpsub_dist.a"]
    assert holders == ["dpsub_dist.b"]
