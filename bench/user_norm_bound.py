"""How often does the user-level private bound fire below every user's norm?

``python -m bench.user_norm_bound [--users 500,5000] [--reps 20] [--epsilon 1]`` prints, for
``--method gauss`` at user level (δ = 1e-6, D = 5, six rows per user, rows N(10, diag(5, 3, 1,
0.5, 0.2)²)), the bounds the step ``norm_bound`` released over R noise draws against the
users' median norm √Σ‖x‖². It runs the step's own functions in-process (the noisy user count,
the noise-matched quantile from ñ, the sparse vector over the public grid), with the grants a
run without ``--row-norm`` gets. A draw whose ñ is too small for the bound's margins
(:func:`norm_bound.margined_quantile`; the run ends in ⊥) counts as ``failed``.
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from dpsub_dist.methods.gauss import bound_quantile, budget_plan
from dpsub_dist.privacy.accountant import Accountant, ApproxDP
from dpsub_dist.privacy.norm_bound import (
    TooFewForBound,
    norm_histogram,
    private_user_norm_bound,
    user_norm_bound_mechanism,
)

DIM, ROWS_PER_USER, DELTA = 5, 6, 1e-6


def user_norms(users: int, rng: np.random.Generator) -> np.ndarray:
    """√Σ‖x‖² of each user's rows."""
    rows = rng.standard_normal((users * ROWS_PER_USER, DIM)) @ np.diag([5, 3, 1, 0.5, 0.2]) + 10
    ids = np.repeat(np.arange(users), ROWS_PER_USER)
    return np.sqrt(np.bincount(ids, weights=(rows**2).sum(axis=1)))


def released_bounds(users: int, epsilon: float, reps: int, seed: int) -> tuple[float, list]:
    """The users' median norm and the bounds of ``reps`` draws of the step (None: ⊥)."""
    rng = np.random.default_rng(seed)
    norms = user_norms(users, rng)
    grants = Accountant(ApproxDP(epsilon, DELTA)).split(budget_plan("gauss", False, False, True))
    counts = norm_histogram(norms)
    mech = user_norm_bound_mechanism(grants["norm_bound"])

    def quantile(noisy_users: float, search_epsilon: float) -> float:
        return bound_quantile("gauss", grants, "add_remove", noisy_users, DIM, search_epsilon)

    def draw() -> float | None:
        try:
            return private_user_norm_bound(counts, mech, rng, quantile).bound
        except TooFewForBound:
            return None

    bounds = [draw() for _ in range(reps)]
    return float(np.median(norms)), bounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="500,5000", help="comma-separated user counts")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for users in (int(u) for u in args.users.split(",")):
        median, bounds = released_bounds(users, args.epsilon, args.reps, args.seed)
        released = [b for b in bounds if b is not None]
        below = sum(b < median / 2 for b in released)
        seen = sorted(Counter(round(b, 4) for b in released).items())
        failed = len(bounds) - len(released)
        print(
            f"users={users} median_norm={median:.4g} below_half={below}/{args.reps} "
            f"failed={failed}/{args.reps} {seen}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
