"""Tree aggregation (the binary mechanism): private prefix sums of a stream of matrices.

Dwork, Naor, Pitassi & Rothblum (STOC 2010) and Chan, Shi & Song (TISSEC 2011,
"binary mechanism"); DTTZ14 §4 runs it on ``Σ aaᵀ`` for online PCA (ALGORITHMS.md §8).

- **Input domain**: a stream of ``T`` batches (``T``, the horizon, is fixed in advance);
  batch ``t`` contributes ``G_t = Σ aaᵀ`` over its rows, each row of norm ≤ 1.
- **Neighbours**: one row's values replaced in one batch (batch sizes are public).
  Then one ``G_t`` moves by ``aaᵀ − a′a′ᵀ``, whose upper triangle (with diagonal) has
  L2 norm ≤ ‖aaᵀ − a′a′ᵀ‖_F ≤ √2 (:data:`REPLACE_ONE_SENSITIVITY`; DTTZ14 Alg. 1).
- **Tree**: node ``(h, i)`` covers batches ``i·2^h + 1 … (i+1)·2^h``. The dyadic
  decomposition of ``1..t`` only ever uses nodes with an even index ``i`` that end by
  ``t``, so only those nodes (ending within the horizon) are kept: batch ``t`` lies in
  at most ``L = ⌊log₂ T⌋ + 1`` of them (one per level ``h`` with ``2^h ≤ T``; batch 1
  in all of them). ALGORITHMS.md §8 writes ``⌈log₂ T⌉ + 1``; the two agree when ``T``
  is a power of two, and otherwise the top level's node ends after ``T``, would never
  be released, and is not kept.
- **Privacy map**: each kept node's sum gets independent symmetric discrete Gaussian
  noise on a power-of-two grid (:func:`release_node`) with ``σ = Δ/√(2ρ/L)``, so each
  node is ``ρ/L``-zCDP (Bun & Steinke 2016, Prop 1.6); a row is in at most ``L`` nodes,
  so the whole stream of node sums is ``ρ``-zCDP (Lemma 2.3). An ``(ε, δ)`` budget
  uses the largest ``ρ`` whose Canonne–Kamath–Steinke conversion at ``δ`` is within ``ε``.
  The sampler widens σ to cover the rounding of the exact sum to its grid, and its values
  are grid multiples, so sums of node values are exact (floating-point safe, CKS 2020).
- **Release** after ``t`` batches: the sum of the ≤ L complete nodes of ``t``'s dyadic
  decomposition (post-processing).

A node's noise is drawn once, when the node *closes* (its last batch arrives), and added
to its exact sum then. Until it closes a node exists only as an exact partial sum, which
is private operator state (:attr:`TreeAggregator.partial`): it must never be published,
and no published value is ever noised again. (Drawing the noise when the node opens and
publishing the running noisy sum would let two snapshots around an append subtract to
that batch's exact Gram matrix.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import ZCDP, zcdp_epsilon

Node = tuple[int, int]
"""(level h, index i): the node covering batches i·2^h + 1 … (i+1)·2^h."""

REPLACE_ONE_SENSITIVITY = math.sqrt(2.0)
"""L2 sensitivity of a symmetric release of Σ aaᵀ (‖a‖ ≤ 1) when one row is replaced."""


def _check_horizon(horizon: int) -> int:
    if isinstance(horizon, bool) or not isinstance(horizon, int | np.integer) or horizon < 1:
        raise ValueError(f"horizon must be a positive integer (got {horizon!r})")
    return int(horizon)


def tree_levels(horizon: int) -> int:
    """L: the most kept nodes any batch lies in, ⌊log₂ T⌋ + 1."""
    return _check_horizon(horizon).bit_length()


def node_span(node: Node) -> tuple[int, int]:
    """First and last batch (1-based, inclusive) a node covers."""
    level, index = node
    return (index << level) + 1, (index + 1) << level


def nodes_containing(batch: int, horizon: int) -> list[Node]:
    """The kept nodes that batch ``batch`` (1-based) contributes to, lowest level first.

    Kept: nodes some prefix release uses (even index) that end within the horizon.
    """
    horizon = _check_horizon(horizon)
    if not 1 <= batch <= horizon:
        raise ValueError(f"batch {batch} is outside the horizon 1..{horizon}")
    nodes = [(h, (batch - 1) >> h) for h in range(tree_levels(horizon))]
    return [n for n in nodes if n[1] % 2 == 0 and node_span(n)[1] <= horizon]


def last_use(node: Node) -> int:
    """The last t whose prefix release uses ``node`` (it is used for t in end..last_use)."""
    return node_span(node)[1] + (1 << node[0]) - 1


def prefix_nodes(t: int) -> list[Node]:
    """Dyadic decomposition of batches 1..t: one complete node per set bit of ``t``."""
    if t < 0:
        raise ValueError(f"t must be ≥ 0 (got {t})")
    nodes, start = [], 0
    for level in reversed(range(t.bit_length())):
        if t >> level & 1:
            nodes.append((level, start >> level))
            start += 1 << level
    return nodes


def node_sigma(rho: float, horizon: int, sensitivity: float = REPLACE_ONE_SENSITIVITY) -> float:
    """Per-node noise std: each node ρ/L-zCDP, σ = Δ/√(2ρ/L)."""
    return node_mechanism(rho, horizon, sensitivity).sigma


def node_mechanism(
    rho: float, horizon: int, sensitivity: float = REPLACE_ONE_SENSITIVITY
) -> mechanism.Gaussian:
    """One node's release: symmetric Gaussian calibrated to ρ/L; its stated cost is ρ/L-zCDP
    (a row is in ≤ L nodes, so the stream composes to ρ). The stream's batches are charged
    their ``spent_rho`` increments, multiples of this cost (no plan is split there)."""
    return mechanism.gaussian(ZCDP(rho / tree_levels(horizon)), sensitivity)


def spent_rho(t: int, rho: float, horizon: int) -> float:
    """ρ spent on the worst-placed row after ``t`` releases.

    A row of batch 1 lies in the most complete nodes: one per level h with 2^h ≤ t.
    After ``T`` batches this is the whole ``ρ``.
    """
    levels = tree_levels(horizon)
    return rho * min(t.bit_length(), levels) / levels


def rho_for_approx_dp(epsilon: float, delta: float) -> float:
    """Largest ρ (to 1e-12 relative) whose CKS conversion at δ is (≤ ε, δ)-DP."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need epsilon > 0 and delta in (0, 1) (got {epsilon}, {delta})")
    low, high = 0.0, max(epsilon, 1.0)
    while zcdp_epsilon(high, delta) <= epsilon:
        low, high = high, 2 * high
    for _ in range(200):
        mid = (low + high) / 2
        if zcdp_epsilon(mid, delta) <= epsilon:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return low


def release_node(exact: np.ndarray, mech: mechanism.Gaussian, rng: np.random.Generator):
    """A closed node's noisy sum: ``exact`` rounded to a power-of-two grid plus ``mech``'s
    symmetric discrete Gaussian noise (std ≥ its σ; floating-point safe, CKS 2020).

    Cost: ``mech``'s, ρ/L-zCDP per node for :func:`node_mechanism` (sensitivity √2, see the
    module docstring); called once per node, on its exact sum, when the node closes.
    """
    return mech.release_symmetric(rng, exact)


@dataclass
class TreeAggregator:
    """The binary mechanism's state for a stream of d×d symmetric matrices.

    ``closed``: noisy sums of closed nodes (publishable; each noised exactly once).
    ``partial``: exact partial sums of open nodes — private operator state, never published.
    Values may carry leading axes (a stack of independent streams, e.g. for audits).
    """

    horizon: int
    dim: int
    step: int = 0
    closed: dict[Node, np.ndarray] = field(default_factory=dict)
    partial: dict[Node, np.ndarray] = field(default_factory=dict)

    def add(
        self, value: np.ndarray, noised: Callable[[Node, np.ndarray], np.ndarray]
    ) -> list[Node]:
        """Add batch ``step + 1``; each node it closes takes ``noised(node, exact sum)``, its
        noisy sum (:func:`release_node`, drawn where the node's level is charged). Returns
        the nodes it closed (to persist)."""
        value = np.asarray(value, dtype=np.float64)
        if value.shape[-2:] != (self.dim, self.dim):
            raise ValueError(f"expected {self.dim}×{self.dim} matrices, got {value.shape}")
        batch = self.step + 1
        closed = []
        for node in nodes_containing(batch, self.horizon):
            exact = self.partial.pop(node, 0.0) + value
            if node_span(node)[1] == batch:  # the node's last batch: noise it, once
                self.closed[node] = noised(node, exact)
                closed.append(node)
            else:
                self.partial[node] = exact
        self.step = batch
        return closed

    def prefix(self, t: int | None = None) -> np.ndarray:
        """The private estimate of Σ_{s ≤ t} G_s (default t = step), from closed nodes only."""
        t = self.step if t is None else t
        if not 0 <= t <= self.step:
            raise ValueError(f"t must be in 0..{self.step} (got {t})")
        total = np.zeros((self.dim, self.dim))
        for node in prefix_nodes(t):
            total = total + self.closed[node]
        return total
