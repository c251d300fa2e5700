"""``dpsub report RUN_DIR``: one run's page, drawn from its published manifest and basis.

Every value shown is a released value or a public fact: the manifest and the basis (which
the privacy contract already covers), the input's schema (public: names and types only) and numbers
computed from those. Drawing them is post-processing and costs no budget. Step timings
are not published (they depend on the data); they appear only on the operator's page,
written to the owner-only diagnostics folder, never beside the run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from dpsub_dist.io.output import REPORT
from dpsub_dist.report import svg
from dpsub_dist.report.page import document, para, section, table

FREE = (
    "Everything on this page is read from the run's published manifest.json and basis.npy "
    "(and the input's schema: column names and types), or computed from those values alone. "
    "Showing it is "
    "post-processing of released values: it costs no privacy budget."
)
BUDGET_KEYS = {"epsilon": "ε", "delta": "δ", "rho": "ρ", "delta0": "δ₀"}


def noise_ratio(manifest: Mapping[str, Any]) -> tuple[float | None, str]:
    """The Gram noise's typical top eigenvalue in explained-variance-ratio units, and how.

    A symmetric Gaussian D×D matrix of entry scale σ has its largest eigenvalue near
    2σ√D; the released ratio λᵢ/Σⱼ max(λⱼ, 0) is over the noisy Gram of rows scaled by 1/B,
    whose eigenvalues clipped at 0 sum to n·ev₁/(B²·ratio₁). All of σ, D, B, n, ev₁ and
    ratio₁ must be published: at user level n and the variance are not, so no line is drawn.
    """
    release, parameters = manifest.get("release") or {}, manifest.get("parameters") or {}
    sigma, bound = release.get("gram_noise_sigma"), parameters.get("row_norm")
    n, dim = manifest.get("n_rows"), manifest.get("dim")
    variance, ratio = release.get("explained_variance"), release.get("explained_variance_ratio")
    if sigma is None:
        return None, "this method publishes no Gram noise scale, so no noise line is drawn"
    if not (n and bound and dim and variance and ratio and variance[0] > 0):
        return None, (
            "no noise line: it needs the row count and the explained variance, which this "
            "run does not publish (private at user level)"
        )
    total = n * variance[0] / (bound**2 * ratio[0])
    return 2 * sigma * math.sqrt(dim) / total, (
        "dashed line: 2σ√D / Σ max(λ, 0), the typical largest eigenvalue of the Gram noise alone "
        f"(σ = {svg.number(sigma)}, D = {dim}); components near or below it are "
        "indistinguishable from the noise"
    )


def left_out_columns(
    manifest: Mapping[str, Any], storage_options: Mapping[str, Any] | None = None
) -> list[tuple[str, str, str]] | None:
    """(name, type, why) of the input's columns that are not features: the manifest's
    ``columns_left_out`` (the default rule's reasons) and the rest of the input's schema
    (the first file's footer: public); None if the input cannot be read now."""
    from dpsub_dist.errors import DpsubError
    from dpsub_dist.io.parquet import inspect_file, list_parquet_files

    try:
        first = list_parquet_files(str(manifest["input"]), storage_options)[0]
        schema = inspect_file(first, storage_options).columns
    except (DpsubError, OSError, KeyError, IndexError):
        return None
    used = set(manifest.get("columns") or [])
    unit = (manifest.get("parameters") or {}).get("unit_column")
    recorded = manifest.get("columns_left_out") or {}
    out = []
    for column in schema:
        if column.name in used:
            continue
        if column.name == unit:
            why = "the user id: the privacy unit, never a feature"
        elif column.name in recorded:
            why = recorded[column.name]
        elif not column.numeric:
            why = "not numeric"
        else:
            why = "not in --columns, or removed by --exclude-columns"
        out.append((column.name, column.type, why))
    return out


LOADING_ROWS = 30
"""At most this many features are drawn in the loadings view: those with the largest."""


def loadings(
    manifest: Mapping[str, Any], basis: Any
) -> tuple[list[str], list[list[float]], int] | None:
    """The loadings view of a one-basis run: each drawn feature's name and its entries in
    the published basis (D×k), the :data:`LOADING_ROWS` features with the largest
    ``max |entry|`` first when D is larger, and D; None without a D×k basis."""
    import numpy as np

    from dpsub_dist.io.parquet import feature_name

    if basis is None or np.ndim(basis) != 2:
        return None
    columns = list(manifest.get("columns") or [])
    vectors = manifest.get("vector_columns") or {}
    widths = [vectors.get(c) for c in columns] if vectors else None
    dim = basis.shape[0]
    order = np.argsort(-np.abs(basis).max(axis=1), kind="stable")
    drawn = order[:LOADING_ROWS] if dim > LOADING_ROWS else np.arange(dim)
    try:
        names = [feature_name(columns, widths, int(j)) for j in drawn]
    except (IndexError, ValueError):  # a manifest without its columns: positions then
        names = [f"feature {int(j) + 1}" for j in drawn]
    return names, [[float(v) for v in basis[j]] for j in drawn], dim


def _loadings_section(manifest: Mapping[str, Any], basis: Any) -> str:
    shown = loadings(manifest, basis)
    if shown is None:
        why = (
            "a cluster run's K bases are not drawn here"
            if basis is not None
            else "this run published no basis"
        )
        return section("loadings", "Loadings", para(f"No loadings view: {why}.", "muted"))
    names, values, dim = shown
    rank = len(values[0]) if values else 0
    which = (
        f"the {len(names)} of {dim} features with the largest entries"
        if len(names) < dim
        else f"all {dim} features"
    )
    chart = svg.heatmap(
        "Published basis: each feature's entry in each component",
        names,
        [f"PC{i + 1}" for i in range(rank)],
        values,
    )
    note = (
        f"Rows: {which}. A column is one released component (basis.npy); a large entry, of "
        "either sign, means the feature drives that component (blue positive, orange "
        "negative). A component's sign is arbitrary: flipping a whole column changes nothing."
    )
    return section("loadings", "Loadings: which columns drive each component", chart, para(note))


def _budget_section(manifest: Mapping[str, Any]) -> str:
    budget = (manifest.get("privacy") or {}).get("budget") or {}
    steps = budget.get("steps") or []
    totals = [("spent", budget.get("spent") or {}), ("granted", budget.get("total_granted") or {})]
    keys = [k for k in BUDGET_KEYS if any(k in row for row in [*steps, *dict(totals).values()])]
    charts = []
    for k in keys:
        charged = [s for s in steps if k in s]
        if any(s[k] > 0 for s in charged):
            labels, values = [s["step"] for s in charged], [s[k] for s in charged]
            charts.append(svg.bars(f"{BUDGET_KEYS[k]} by step", labels, values))

    def cells(values: Mapping[str, float]) -> list[str]:
        return [svg.number(values[k]) if k in values else "" for k in keys]

    rows = [[escape(s["step"]), *cells(s)] for s in steps]
    rows += [[f"<b>{name}</b>", *(f"<b>{c}</b>" for c in cells(t))] for name, t in totals]
    as_dp = budget.get("spent_as_approx_dp") or {}
    note = (
        para(
            f"As (ε, δ)-DP ({budget.get('conversion', 'conversion')}): ε = "
            f"{svg.number(as_dp['epsilon'])}, δ = {svg.number(as_dp['delta'])}."
        )
        if budget.get("mode") == "zcdp" and as_dp
        else ""
    )
    return section(
        "budget",
        f"Budget by step ({budget.get('mode', '')})",
        *charts,
        table(["step", *(BUDGET_KEYS[k] for k in keys)], rows, "budget-table"),
        note,
    )


def _scree_section(view: Mapping[str, Any]) -> str:
    release = view.get("release") or {}
    ratios = release.get("explained_variance_ratio")
    variance = release.get("explained_variance")
    note = para(str(release.get("explained_variance_note", "")), "muted")
    if ratios and None not in ratios:
        noise, how = noise_ratio(view)
        label = f"noise ≈ {svg.number(noise)}" if noise is not None else ""
        title = "Share of the noisy matrix's eigenvalues (clipped at 0) per component"
        chart = svg.scree(title, ratios, noise, label)
        heading = "Explained-variance ratio of the released components"
        return section("scree", heading, chart, para(how, "muted"), note)
    if variance and None not in variance:
        chart = svg.scree("Explained variance per component (released estimate)", variance, None)
        return section("scree", "Explained variance of the released components", chart, note)
    return section(
        "scree", "Explained variance", para("This run released no explained variance."), note
    )


def _columns_section(manifest: Mapping[str, Any], left_out: list | None) -> str:
    used = manifest.get("columns") or []
    widths = manifest.get("vector_columns") or {}
    shown = ", ".join(escape(f"{c} (vector of {widths[c]})" if c in widths else c) for c in used)
    parts = [f"<p>Used ({len(used)} columns, D = {manifest.get('dim')}): {shown}</p>"]
    if left_out is None:
        parts.append(para("Left out: the input's schema could not be read now.", "muted"))
    elif not left_out:
        parts.append(para("Left out: none (every column of the input is a feature)."))
    else:
        from dpsub_dist.io.parquet import human_type

        rows = [[escape(n), escape(human_type(t)), escape(w)] for n, t, w in left_out]
        parts.append(table(["left out", "type", "why"], rows, "left-out"))
    return section("columns", "Columns", *parts)


def _outcome_section(manifest: Mapping[str, Any]) -> str:
    release = manifest.get("release") or {}
    outcome = manifest.get("outcome", "")
    if outcome == "ok":
        said = "published a basis"
    else:
        step = release.get("failed_step", "aggregation")
        said = f"⊥ no stable subspace (step {step}): {release.get('failure_reason', '')}"
    choice = manifest.get("method_choice") or {}
    parameters = manifest.get("parameters") or {}
    privacy = manifest.get("privacy") or {}
    n = manifest.get("n_rows")
    rows = [
        ["outcome", f'<b id="outcome">{escape(said)}</b>'],
        ["method", escape(str(manifest.get("method")))],
        ["requested", escape(str(choice.get("requested", manifest.get("method"))))],
        ["why this method", escape(str(choice.get("reason", "named by the caller")))],
        ["privacy unit", escape(str(privacy.get("unit", "")))],
        ["neighbours", escape(str(privacy.get("neighbours", "")))],
        ["rank k", escape(str(manifest.get("rank")))],
        ["rows n", escape(str(n)) if n is not None else escape(manifest.get("n_rows_note", ""))],
    ]
    for key in ("local_route", "center", "row_norm_source"):
        if parameters.get(key) is not None:
            rows.append([escape(key), escape(str(parameters[key]))])
    boost = parameters.get("boost")
    if boost and release.get("chosen_group") is not None:
        chosen = f"group {release['chosen_group']} of {boost['groups']} (its release is shown)"
        rows.append(["boosted", escape(chosen)])
    ledger = manifest.get("ledger") or {}
    if ledger:
        rows.append(["run id", escape(f"{ledger.get('run_id')} (job {ledger.get('job')})")])
    return section("route", "Outcome, method and route", table(["", ""], rows, "route-table"))


def _versions_section(manifest: Mapping[str, Any]) -> str:
    rows = [
        [escape(k), escape(str(v))] for k, v in sorted((manifest.get("versions") or {}).items())
    ]
    return section("versions", "Versions", table(["package", "version"], rows))


def _operator_section(timings: Mapping[str, Any] | None) -> str:
    warning = para(
        "OPERATOR ONLY: not published, not covered by the privacy claim. Step timings depend "
        "on the data (on n at user level, on the data's spread everywhere); do not share "
        "this page.",
        "flag",
    )
    if not timings:
        body = para(
            "No timings were kept for this release: dpsub estimate, cluster and run keep them "
            "in the owner-only diagnostics folder ($DPSUB_DIAGNOSTICS_DIR, else "
            "~/.dpsub/diagnostics) of the machine that ran them. From Python, pass them to "
            "dpsub_dist.report.run_page(manifest, timings=result.timings, operator=True)."
        )
    else:
        body = table(
            ["step", "value"], [[escape(k), escape(str(v))] for k, v in timings.items()], "timings"
        )
    return section("operator", "Operator only: timings", warning, body, css="operator")


def run_page(
    manifest: Mapping[str, Any],
    left_out: list[tuple[str, str, str]] | None = None,
    *,
    operator: bool = False,
    timings: Mapping[str, Any] | None = None,
    basis: Any = None,
) -> str:
    """The run's report page; the loadings view with the published ``basis``; the operator
    section only with ``operator=True``."""
    title = f"dpsub run report: {manifest.get('method')} on {manifest.get('input')}"
    from dpsub_dist.methods.boost import chosen_view

    sections = [
        f'<p class="free" id="free">{escape(FREE)}</p>',
        _outcome_section(manifest),
        _budget_section(manifest),
        _scree_section(chosen_view(manifest)),
        _loadings_section(manifest, basis),
        _columns_section(manifest, left_out),
        _versions_section(manifest),
    ]
    if operator:
        sections.append(_operator_section(timings))
    return document(title, sections)


def write_run_report(
    run: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    operator: bool = False,
    timings: Mapping[str, Any] | None = None,
) -> str:
    """Write the run's page: ``RUN/report.html``, or with ``operator`` an owner-only file in
    the diagnostics folder (never beside the published run), with the timings given or those
    the run kept there. Returns where it went."""
    from dpsub_dist.diagnostics import read_run_diagnostics
    from dpsub_dist.io.output import read_run
    from dpsub_dist.io.storage import join

    basis, manifest = read_run(run, storage_options)
    if operator and timings is None:
        timings = read_run_diagnostics(run, manifest)
    left_out = left_out_columns(manifest, storage_options)
    html = run_page(manifest, left_out, operator=operator, timings=timings, basis=basis)
    if operator:
        from dpsub_dist.diagnostics import write_diagnostics_file

        return str(write_diagnostics_file("report", html, ".html"))
    where = join(run, REPORT)
    write_text(where, html, storage_options)
    return where


def write_text(where: str, text: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Write a page in one step: a local temporary sibling renamed in place, or one PUT."""
    from dpsub_dist.io.storage import filesystem, is_local

    if not is_local(where):
        fs, path = filesystem(where, storage_options)
        fs.pipe_file(path, text.encode())
        return
    path = Path(where.removeprefix("file://"))
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
