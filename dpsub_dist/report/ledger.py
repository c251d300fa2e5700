"""``dpsub report --ledger L``: the budget of every dataset over time, runs by outcome and
the drift between consecutive released bases of a job.

Everything comes from what ``dpsub budget show/history`` already publishes (grants,
charges, states, outcome categories, reservation times: reservation happens before any
data is read) and from the released bases the ledger keeps for published runs. The
principal angle between two released bases is post-processing: it costs no budget.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

import numpy as np
from scipy.linalg import subspace_angles

from dpsub_dist.ledger import Ledger
from dpsub_dist.ledger.core import (
    CHARGING_STATES,
    RESUMABLE_STATES,
    DatasetStatus,
    RunRecord,
    budget_pair,
    decode_array,
    describe_budget,
)
from dpsub_dist.privacy.accountant import Accountant
from dpsub_dist.report import svg
from dpsub_dist.report.page import document, para, section, table

JUMP_FACTOR = 2.0
JUMP_FLOOR_DEG = 5.0
JUMP_RULE = (
    f"flagged (red) when a drift exceeds both {JUMP_FLOOR_DEG:g}° and {JUMP_FACTOR:g}× the median "
    "of the job's earlier drifts; the job's first drift has no baseline and is never flagged"
)
FREE = (
    "Everything on this page is what dpsub budget show and dpsub budget history publish "
    "(grants, charges, run states and outcomes, reservation times) and the released bases of "
    "published runs; the subspace drift is computed from released bases only. Showing it costs "
    "no privacy budget."
)
OUTCOMES = ("published", "⊥ no stable subspace", "failed", "unfinished", "returned")
OUTCOME_HELP = (
    "published: a basis; ⊥: published without a basis (charged); failed: failed after reading its "
    "data (charged); unfinished: reserved or publishing, resumable (charged); returned: "
    "public bad input, charge given back. Refused runs are not recorded: a refusal reserves "
    "nothing."
)


@dataclass(frozen=True)
class Drift:
    """The largest principal angle between one published basis of a job and the next."""

    job: str
    before: str
    after: str
    degrees: float
    flagged: bool


def outcome_of(record: RunRecord) -> str:
    """The record's category on this page (one of :data:`OUTCOMES`)."""
    if record.state == "published":
        return "published" if record.outcome == "ok" else "⊥ no stable subspace"
    if record.state in RESUMABLE_STATES:
        return "unfinished"
    return record.state  # failed | returned


def remaining_over_time(status: DatasetStatus, runs: list[RunRecord]) -> list[tuple[float, float]]:
    """(time, share of the grant's ε or ρ remaining) after each charging run, replaying the
    ledger's own composition (:class:`Accountant`) in reservation order."""
    accountant = Accountant(status.grant.total)
    total = budget_pair(status.grant.total)[0]
    points = [(_time(status.grant.granted_at), 1.0)]
    for run in runs:
        if run.state in CHARGING_STATES:
            accountant.charge(run.run_id, run.charge)
            points.append((_time(run.reserved_at), budget_pair(accountant.remaining)[0] / total))
    return points


def drifts(book: Ledger, runs: list[RunRecord]) -> list[Drift]:
    """Consecutive published bases of each job (its name in the manifest), oldest first."""
    last: dict[str, tuple[str, np.ndarray]] = {}
    found: list[Drift] = []
    for run in runs:
        if run.state != "published" or run.outcome != "ok":
            continue
        record = book.lookup(run.dataset, run.run_id, with_release=True)
        if record is None or record.basis is None:
            continue
        basis, job = decode_array(record.basis), job_name(record)
        previous = last.get(job)
        if basis.ndim == 2 and previous is not None and previous[1].shape == basis.shape:
            angle = math.degrees(float(np.max(subspace_angles(previous[1], basis))))
            earlier = [d.degrees for d in found if d.job == job]
            limit = max(JUMP_FLOOR_DEG, JUMP_FACTOR * statistics.median(earlier or [0.0]))
            found.append(
                Drift(job, previous[0], run.run_id, angle, bool(earlier) and angle > limit)
            )
        last[job] = (run.run_id, basis)
    return found


def job_name(record: RunRecord) -> str:
    """The job that published ``record`` (its manifest's ledger entry), else its fingerprint."""
    entry = (json.loads(record.manifest) if record.manifest else {}).get("ledger") or {}
    return str(entry.get("job") or f"job {record.job_fingerprint[:8]}")


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _status_table(statuses: list[DatasetStatus]) -> str:
    rows = []
    for s in statuses:
        unfinished = s.runs.get("reserved", 0) + s.runs.get("publishing", 0)
        cells = [s.grant.dataset, s.grant.unit, describe_budget(s.grant.total)]
        cells += [describe_budget(b) for b in (s.published, s.reserved, s.failed, s.remaining)]
        rows.append([escape(c) for c in cells])
        rows[-1][4] += f" ({unfinished} runs)"
    header = ["dataset", "unit", "granted", "published", "unfinished", "failed", "remaining"]
    return table(header, rows, "budget-table")


def ledger_page(book: Ledger, dataset: str | None = None) -> str:
    """The ledger's page: every dataset's budget over time, outcomes and drift."""
    statuses = book.status(dataset)
    histories = {s.grant.dataset: book.history(s.grant.dataset) for s in statuses}
    series = {s.grant.dataset: remaining_over_time(s, histories[s.grant.dataset]) for s in statuses}
    times = [t for points in series.values() for t, _ in points]
    span = time_labels(min(times), max(times)) if times else ("", "")
    counts = {o: 0 for o in OUTCOMES}
    per_dataset = []
    for name, runs in histories.items():
        mine = {o: 0 for o in OUTCOMES}
        for run in runs:
            mine[outcome_of(run)] += 1
            counts[outcome_of(run)] += 1
        per_dataset.append([escape(name)] + [str(mine[o]) for o in OUTCOMES])
    found = [d for runs in histories.values() for d in drifts(book, runs)]
    sections = [
        f'<p class="free" id="free">{escape(FREE)}</p>',
        section(
            "budget",
            "Budget per dataset",
            svg.lines(
                "Share of each dataset's grant (ε or ρ) remaining, by reservation time",
                series,
                span,
                (0.0, 1.0),
                ("0%", "100%"),
                steps=True,
            ),
            _status_table(statuses),
        ),
        section(
            "outcomes",
            "Runs by outcome",
            svg.bars(
                "Runs by outcome (all datasets)", list(OUTCOMES), [counts[o] for o in OUTCOMES]
            ),
            table(["dataset", *OUTCOMES], per_dataset, "outcome-table"),
            para(OUTCOME_HELP, "muted"),
        ),
        _drift_section(found),
    ]
    title = "dpsub ledger report" + (f": {dataset}" if dataset else "")
    return document(title, sections)


def _drift_section(found: list[Drift]) -> str:
    if not found:
        return section(
            "drift",
            "Subspace drift",
            para("No job has two consecutive published bases yet.", "muted"),
        )
    by_job: dict[str, list[Drift]] = {}
    for d in found:
        by_job.setdefault(d.job, []).append(d)
    series = {job: [(float(i), d.degrees) for i, d in enumerate(ds)] for job, ds in by_job.items()}
    top = angle_axis(max(d.degrees for d in found))
    flags = {job: [d.flagged for d in ds] for job, ds in by_job.items()}
    rows = [
        [
            escape(d.job),
            escape(d.before),
            escape(d.after),
            svg.number(d.degrees),
            '<span class="flag">jump</span>' if d.flagged else "",
        ]
        for d in found
    ]
    return section(
        "drift",
        "Subspace drift between consecutive published runs",
        svg.lines(
            "Largest principal angle to the job's previous basis (degrees)",
            series,
            ("first pair", "latest pair"),
            (0.0, top),
            ("0°", f"{top:g}°"),
            flags,
        ),
        table(["job", "from run", "to run", "largest angle (°)", ""], rows, "drift-table"),
        para(JUMP_RULE, "muted"),
    )


AXIS_STEPS = (1.0, 2.0, 5.0)


def angle_axis(largest: float) -> float:
    """The drift axis's top: the first of 1, 2, 5 × 10ᵏ degrees at or above the largest
    drift (a 0.3–0.7° series fills the chart instead of lying flat on 0–90°), at most 90."""
    if not largest > 0:
        return 1.0
    scale = 10.0 ** math.floor(math.log10(largest))
    top = next((m * scale for m in (*AXIS_STEPS, 10.0) if m * scale >= largest), 10 * scale)
    return min(float(f"{top:.3g}"), 90.0)


TIME_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S")


def time_labels(first: float, last: float) -> tuple[str, str]:
    """The time axis's two end labels (UTC): to the minute, or to the second (the ledger's
    precision) where the minute would print the same label twice."""
    for form in TIME_FORMATS:
        labels = tuple(datetime.fromtimestamp(t, UTC).strftime(form) for t in (first, last))
        if labels[0] != labels[1]:
            break
    return labels[0], labels[1]
