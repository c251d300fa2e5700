"""The accountant holds every charge to the method's budget plan (issue #15): once the plan
is split, a step outside it, a step charged twice or a charge above its grant is refused
(nothing charged), even when the total could still cover it."""

from __future__ import annotations

import pytest
from stated_cost import Stated

from dpsub_dist.privacy.accountant import (
    ZCDP,
    Accountant,
    ApproxDP,
    BudgetExceeded,
    UnstatedCost,
)

SHARES = {"search": (0.2, 0.0), "release": (0.8, 1.0)}


@pytest.mark.parametrize("total", [ApproxDP(1.0, 1e-6), ZCDP(0.5, 1e-6)])
def test_charges_must_match_the_plan(total) -> None:
    accountant = Accountant(total)
    grants = accountant.split(SHARES)
    small = ApproxDP(0.01, 0.0) if isinstance(total, ApproxDP) else ZCDP(0.001, 0.0)
    with pytest.raises(BudgetExceeded, match="not in the budget plan"):
        accountant.charge("unplanned", Stated(small))
    with pytest.raises(UnstatedCost, match="without a mechanism"):
        accountant.charge("search", grants["search"])  # a bare grant states no cost
    accountant.charge("search", Stated(grants["search"]))
    with pytest.raises(BudgetExceeded, match="already charged"):
        accountant.charge("search", Stated(small))
    over = (
        ApproxDP(grants["release"].epsilon * 1.01, grants["release"].delta)
        if isinstance(total, ApproxDP)
        else ZCDP(grants["release"].rho, grants["release"].delta0 * 1.01)
    )
    with pytest.raises(BudgetExceeded, match="its plan grants"):
        accountant.charge("release", Stated(over))
    accountant.charge("release", Stated(grants["release"]))
    assert [s["step"] for s in accountant.report()["steps"]] == ["search", "release"]


def test_without_a_plan_only_the_total_binds() -> None:
    """The ledger and boosting charge whole runs or parallel groups: no plan is split there."""
    accountant = Accountant(ApproxDP(1.0, 1e-6))
    accountant.charge("run-1", ApproxDP(0.5, 0.0))
    accountant.charge("run-1", ApproxDP(0.5, 0.0))
    with pytest.raises(BudgetExceeded):
        accountant.charge("run-2", ApproxDP(0.1, 0.0))
