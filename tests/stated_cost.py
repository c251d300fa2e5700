"""A test-only mechanism that states a given cost, for tests of the accountant's plan checks
(which look only at the stated cost); real mechanisms compute theirs from their noise."""

from __future__ import annotations

from dataclasses import dataclass

from dpsub_dist.privacy.accountant import Budget
from dpsub_dist.privacy.mechanism import Mechanism


@dataclass(frozen=True)
class Stated(Mechanism):
    """States ``stated`` as its cost."""

    stated: Budget

    def cost(self) -> Budget:
        return self.stated
