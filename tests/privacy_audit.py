"""Empirical privacy audit (ALGORITHMS.md §10): a lower bound on ε from neighbouring inputs.

Run a mechanism many times on neighbouring inputs Y and Y′, count how often an
output event S happens, bound both probabilities with exact Clopper–Pearson
intervals, and turn them into a lower bound on the ε any (ε, δ) guarantee must
have: P[S | Y] ≤ e^ε P[S | Y′] + δ  ⇒  ε ≥ ln((p_lo(Y) − δ) / p_hi(Y′)).
Both directions (S and its complement, Y and Y′ swapped) are tried.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import beta


def clopper_pearson(hits: int, runs: int, confidence: float) -> tuple[float, float]:
    """Exact two-sided interval for a binomial proportion."""
    alpha = 1 - confidence
    low = 0.0 if hits == 0 else float(beta.ppf(alpha / 2, hits, runs - hits + 1))
    high = 1.0 if hits == runs else float(beta.ppf(1 - alpha / 2, hits + 1, runs - hits))
    return low, high


def epsilon_lower_bound(
    hits_a: int, hits_b: int, runs: int, delta: float, confidence: float
) -> float:
    """Largest ε lower bound implied by event counts under Y (a) and Y′ (b), both ways."""
    best = 0.0
    # Bonferroni over the two probabilities in each of the four event/direction pairs.
    level = 1 - (1 - confidence) / 4
    for x, y in (
        (hits_a, hits_b),
        (hits_b, hits_a),
        (runs - hits_a, runs - hits_b),
        (runs - hits_b, runs - hits_a),
    ):
        p_lo = clopper_pearson(x, runs, level)[0]
        q_hi = clopper_pearson(y, runs, level)[1]
        if p_lo - delta > 0 and q_hi > 0:
            best = max(best, math.log((p_lo - delta) / q_hi))
    return best


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower: float
    rate_a: float
    rate_b: float
    runs: int


def audit(
    mechanism: Callable[[Any, np.random.Generator], Any],
    input_a: Any,
    input_b: Any,
    event: Callable[[Any], bool],
    runs: int,
    delta: float,
    confidence: float = 0.95,
    seed: int = 12345,
) -> AuditResult:
    """Run ``mechanism(input, rng)`` ``runs`` times on each input and bound ε from ``event``.

    The audit's own generator is seeded for reproducible tests; the mechanism under
    test receives it only because auditing needs many independent draws.
    """
    rng = np.random.default_rng(seed)
    hits_a = sum(bool(event(mechanism(input_a, rng))) for _ in range(runs))
    hits_b = sum(bool(event(mechanism(input_b, rng))) for _ in range(runs))
    bound = epsilon_lower_bound(hits_a, hits_b, runs, delta, confidence)
    return AuditResult(bound, hits_a / runs, hits_b / runs, runs)


SCALE_ARGUMENT = {
    "add_gaussian": 2,
    "add_symmetric_gaussian": 2,
    "add_laplace": 2,
    "laplace_noise": 1,
}
"""Position of the noise scale (σ or b) in each sampler of ``dpsub_dist.privacy.noise``."""


def scale_samplers(monkeypatch: Any, *names: str) -> Callable[[float], None]:
    """Multiply the scale of the named samplers by a factor, below the accountant (which cannot
    refuse it): the planted under-noised twin. Returns the factor's setter (1.0: honest)."""
    from dpsub_dist.privacy import noise

    factor = [1.0]

    def scaled(real: Callable[..., Any], at: int) -> Callable[..., Any]:
        def sampler(*args: Any, **kw: Any) -> Any:
            return real(*args[:at], factor[0] * args[at], *args[at + 1 :], **kw)

        return sampler

    for name in names:
        monkeypatch.setattr(noise, name, scaled(getattr(noise, name), SCALE_ARGUMENT[name]))

    def set_factor(value: float) -> None:
        factor[0] = value

    return set_factor
