"""The privacy-budget ledger: what each dataset was granted and what each run charged.

One row per dataset (its key, see :func:`dataset_key`) records the
total budget granted and the privacy unit it was granted for; one row per (dataset,
run id) records that run's charge and state; one row per run in ``dpsub_leases`` names
the attempt that currently holds the run. A run moves through these states::

    (none) ─reserve─▶ reserved ─begin_publishing─▶ publishing ─publish─▶ published
                        │   │                          │
     public bad input,  │   │ data failed validation   │ data failed validation
     first attempt,     ▼   ▼                          ▼
     lease held     returned  failed ◀─────────────────┘

- **reserve** runs in one transaction that locks the dataset's grant (SQLite
  ``BEGIN IMMEDIATE``, PostgreSQL advisory lock and ``SELECT … FOR UPDATE``), so two
  concurrent runs cannot both take the last of the budget. It happens before any data
  is read. ``reserved``, ``publishing``, ``published`` and ``failed`` runs charge the
  grant; their charges compose by basic composition through
  :class:`~dpsub_dist.privacy.accountant.Accountant`. A run that does not fit is refused.
- Every reserve hands the attempt a fresh random **lease**. Resuming a ``reserved`` or
  ``publishing`` run (same run id, same job, same input) takes the lease over and counts
  an attempt; it reuses the run's private noise seed, so it reproduces the same release
  without a second charge. Every later transition is a compare-and-set on the lease: an
  attempt that lost its lease can neither write, publish, fail nor return the run.
- **begin_publishing** moves the run to ``publishing`` (compare-and-set) *before* any
  output is written; **publish** then stores the outcome, manifest and basis, so a
  published run id returns the same result again and charges nothing.
- **return_reservation** gives the charge back only for a public-cause failure (bad
  paths, schema, parameters, footers) on a run's *first* attempt, lease still held, state
  still ``reserved``: nothing was written and the failure does not depend on private
  values. A resumed run is never refunded; neither is a storage or network failure
  (the run stays ``reserved``; resume it).
- **fail** records a failure after the data was read (``failed``): the charge stays, and
  the record says only ``failed: the run failed after reading its data``, whether the
  data failed validation or another error occurred (a bug, a missing module): which of
  the two it was can depend on the data.
  Running the id again reports the same and charges nothing.

Outcomes stored and printed are categories (:data:`OUTCOME_CATEGORIES`), never error
text that could depend on the data. The private noise seed lives only in the run's
ledger row: it is never printed, logged, or written to an output or manifest. Treat the
ledger like a secret (the SQLite file is created with mode 0600).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np

from dpsub_dist.errors import BudgetRefused, DataError, DpsubError, InputError
from dpsub_dist.privacy.accountant import ZCDP, Accountant, ApproxDP, Budget
from dpsub_dist.privacy.noise import new_noise_seed

SCHEMA_VERSION = 2
"""Version 2 adds ``dpsub_leases``; a version-1 ledger is upgraded in place when opened."""
APPLICATION = "dpsub_dist privacy-budget ledger"

RunState = Literal["reserved", "publishing", "published", "returned", "failed"]
CHARGING_STATES = ("reserved", "publishing", "published", "failed")
"""States whose charge counts against the dataset's total."""
RESUMABLE_STATES = ("reserved", "publishing")
"""States a new attempt may take over (same run id, job and input)."""

OUTCOME_BAD_INPUT = "bad input: public"
OUTCOME_FAILED = f"failed: {DataError.public_message}"
OUTCOME_ABORTED = "aborted: resumable"
OUTCOME_CATEGORIES = (
    "ok",
    "no_stable_subspace",
    OUTCOME_BAD_INPUT,
    OUTCOME_FAILED,
    OUTCOME_ABORTED,
)
"""Every outcome the ledger stores or prints: categories, never data-dependent text."""

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:+@=-]{0,199}$")


class LedgerError(InputError):
    """The ledger is missing, corrupt, of another schema, or disagrees with the job (exit 2)."""


class LedgerUnavailable(DpsubError):
    """The ledger server could not be reached: a transient failure worth retrying (exit 1)."""


class LeaseLost(DpsubError):
    """Another attempt took this run over (or finished it): this one stops, writing nothing
    more (exit 5). The run's charge and release are the other attempt's."""

    exit_code = 5


def public_outcome(state: str, outcome: str | None) -> str | None:
    """The outcome as published: a known category, else one derived from the state.

    Ledgers written before outcomes were categories may hold error text; it is never shown.
    """
    if outcome is None or outcome in OUTCOME_CATEGORIES:
        return outcome
    return {"returned": OUTCOME_BAD_INPUT, "failed": OUTCOME_FAILED}.get(state)


def now_utc() -> str:
    """Current UTC time as ISO 8601 (second precision)."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def check_run_id(run_id: str) -> str:
    """A run id usable as a ledger key and a folder name, or InputError."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise InputError(
            f"invalid run id {run_id!r}: use 1–200 characters from letters, digits and ._:+@=- "
            "(no '/' or spaces, not starting with '.'), e.g. events-2024-06-01"
        )
    return run_id


def budget_mode(budget: Budget) -> str:
    """'approx_dp' or 'zcdp'."""
    return "approx_dp" if isinstance(budget, ApproxDP) else "zcdp"


def budget_pair(budget: Budget) -> tuple[float, float]:
    """(ε, δ) or (ρ, δ₀) as stored in the ledger."""
    if isinstance(budget, ApproxDP):
        return budget.epsilon, budget.delta
    return budget.rho, budget.delta0


def budget_from_pair(mode: str, privacy: float, delta: float) -> Budget:
    """Inverse of :func:`budget_pair`."""
    if mode == "approx_dp":
        return ApproxDP(privacy, delta)
    if mode == "zcdp":
        return ZCDP(privacy, delta)
    raise LedgerError(f"unknown budget mode {mode!r} in the ledger: is it a dpsub ledger?")


def describe_budget(budget: Budget) -> str:
    """Human-readable budget for messages and tables."""
    if isinstance(budget, ApproxDP):
        return f"epsilon={budget.epsilon:.6g}, delta={budget.delta:.3g}"
    return f"rho={budget.rho:.6g}, delta0={budget.delta0:.3g}"


def budget_fields(budget: Budget) -> dict[str, float]:
    """JSON-ready fields of a budget."""
    if isinstance(budget, ApproxDP):
        return {"epsilon": budget.epsilon, "delta": budget.delta}
    return {"rho": budget.rho, "delta0": budget.delta0}


def unit_name(unit_column: str | None) -> str:
    """The privacy unit as recorded in the ledger: 'row' or 'user:<column>'."""
    return f"user:{unit_column}" if unit_column else "row"


def canonical_dataset(uri: str) -> str:
    """A URI as written, normalised: scheme-qualified URIs as given (scheme lower-cased),
    local paths absolute; no trailing '/'. Not the budget's identity: see :func:`dataset_key`.
    """
    text = str(uri).strip()
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme.lower() == "file":
            text = rest
        else:
            return f"{scheme.lower()}://{rest.rstrip('/')}"
    return os.path.abspath(os.path.expanduser(text)).rstrip("/") or "/"


GLOB_CHARACTERS = "*?["
S3_SCHEMES = {"s3": "s3", "s3a": "s3", "s3n": "s3"}


def dataset_key(uri: str) -> str:
    """The dataset key a grant and its runs are accounted under.

    A *dataset* is a file or a folder: local paths are made absolute with symlinks
    resolved; ``file://`` is dropped; ``s3a://``/``s3n://`` become ``s3://``; repeated and
    trailing ``/`` are removed. A glob names the folder before its first wildcard, so
    ``/data/ev/*.parquet``, ``/data/ev/`` and a symlink to ``/data/ev`` are one dataset.
    A run on a file or folder *inside* a granted folder is charged to that grant
    (:meth:`Ledger.covering_grant`).
    """
    text = str(uri).strip()
    scheme = ""
    if "://" in text:
        scheme, _, text = text.partition("://")
        scheme = scheme.lower()
        if scheme == "file":
            scheme = ""
    if any(ch in text for ch in GLOB_CHARACTERS):
        before = re.split(r"[*?\[]", text, maxsplit=1)[0]
        text = before.rsplit("/", 1)[0] if "/" in before else ""
    if scheme:
        scheme = S3_SCHEMES.get(scheme, scheme)
        return f"{scheme}://{re.sub('/+', '/', text).strip('/')}"
    return os.path.realpath(os.path.expanduser(text or ".")).rstrip("/") or "/"


def dataset_contains(parent: str, child: str) -> bool:
    """Whether dataset key ``child`` is ``parent`` or lies inside it."""
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def fingerprint(value: Any) -> str:
    """SHA-256 of the canonical JSON of ``value``."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class Grant:
    """A dataset's total budget and the privacy unit it was granted for."""

    dataset: str
    unit: str
    total: Budget
    granted_at: str


@dataclass(frozen=True)
class RunRecord:
    """One run's ledger row. ``noise_seed`` is private: never print or write it."""

    dataset: str
    run_id: str
    state: RunState
    charge: Budget
    job_fingerprint: str
    input_fingerprint: str | None
    public_seed: int
    noise_seed: int
    output: str
    outcome: str | None
    reserved_at: str
    updated_at: str
    published_at: str | None
    manifest: str | None = None
    basis: bytes | None = None

    def public_view(self) -> dict[str, Any]:
        """What ``budget history`` publishes, JSON-ready: not the private noise seed, the
        stored release, or when the run finished (``published_at``/``updated_at`` minus
        ``reserved_at`` is the run's duration, which depends on the data — on n at user
        level). Reservation happens before any data is read, so its time is public."""
        return {
            "dataset": self.dataset,
            "run_id": self.run_id,
            "state": self.state,
            "charge": budget_fields(self.charge),
            "public_seed": self.public_seed,
            "output": self.output,
            "outcome": public_outcome(self.state, self.outcome),
            "reserved_at": self.reserved_at,
        }

    def __repr__(self) -> str:  # keep the private seed out of logs and tracebacks
        return f"RunRecord(dataset={self.dataset!r}, run_id={self.run_id!r}, state={self.state!r})"


@dataclass(frozen=True)
class RunRequest:
    """What a run asks the ledger for, computed before any data is read."""

    dataset: str
    unit: str
    run_id: str
    charge: Budget
    job_fingerprint: str
    input_fingerprint: str | None
    output: str
    public_seed: int | None = None  # the job's; None: a fresh one is recorded


@dataclass(frozen=True)
class Reservation:
    """The ledger's answer: a new or resumed reservation, or an already published run."""

    kind: Literal["new", "resume", "published", "failed"]
    record: RunRecord
    remaining: Budget
    lease: str | None = None  # this attempt's lease (new/resume); never printed


@dataclass(frozen=True)
class DatasetStatus:
    """A grant with what its runs have spent."""

    grant: Grant
    published: Budget
    reserved: Budget  # reserved or publishing: unfinished, resumable
    failed: Budget  # the data failed validation: charged, nothing released
    remaining: Budget
    runs: dict[str, int]
    report: dict[str, Any]


GRANT_SELECT = (
    "SELECT dataset, unit, mode, total_privacy, total_delta, granted_at FROM dpsub_datasets"
)
"""A grant row, as :func:`_grant_from_row` reads it."""

_RUN_COLUMNS = (
    "dataset, run_id, state, mode, charge_privacy, charge_delta, job_fingerprint, "
    "input_fingerprint, public_seed, noise_seed, output, outcome, reserved_at, updated_at, "
    "published_at"
)


class Ledger(ABC):
    """Budget ledger over a SQL database; subclasses supply the connection and locking."""

    blob_type = "BLOB"
    _conn: Any  # the driver's connection, set by subclasses

    def __init__(self, location: str) -> None:
        self.location = location  # already redacted of passwords

    # -- dialect hooks ----------------------------------------------------

    @abstractmethod
    def _transaction(self, write: bool) -> contextlib.AbstractContextManager:
        """A context manager yielding ``execute(sql, params) -> list[tuple]`` in one transaction.

        With ``write`` the transaction takes the ledger's write lock up front.
        """

    @abstractmethod
    def _lock_dataset(self, execute, dataset: str) -> tuple | None:
        """Lock and return the dataset's grant row inside a write transaction."""

    def close(self) -> None:
        """Release the connection."""
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema -----------------------------------------------------------

    def _schema(self) -> list[str]:
        return [
            "CREATE TABLE IF NOT EXISTS dpsub_ledger_meta ("
            "key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS dpsub_datasets ("
            "dataset TEXT PRIMARY KEY, unit TEXT NOT NULL, mode TEXT NOT NULL, "
            "total_privacy DOUBLE PRECISION NOT NULL, total_delta DOUBLE PRECISION NOT NULL, "
            "granted_at TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS dpsub_runs ("
            "dataset TEXT NOT NULL REFERENCES dpsub_datasets(dataset), run_id TEXT NOT NULL, "
            "state TEXT NOT NULL, mode TEXT NOT NULL, charge_privacy DOUBLE PRECISION NOT NULL, "
            "charge_delta DOUBLE PRECISION NOT NULL, job_fingerprint TEXT NOT NULL, "
            "input_fingerprint TEXT, public_seed TEXT NOT NULL, noise_seed TEXT NOT NULL, "
            "output TEXT NOT NULL, outcome TEXT, reserved_at TEXT NOT NULL, "
            "updated_at TEXT NOT NULL, published_at TEXT, manifest TEXT, "
            f"basis {self.blob_type}, PRIMARY KEY (dataset, run_id))",
            *self._upgrade_statements(),
        ]

    @staticmethod
    def _upgrade_statements() -> list[str]:
        """Version 1 → 2: the attempts' leases (idempotent)."""
        return [
            "CREATE TABLE IF NOT EXISTS dpsub_leases ("
            "dataset TEXT NOT NULL, run_id TEXT NOT NULL, lease TEXT NOT NULL, "
            "attempts INTEGER NOT NULL, PRIMARY KEY (dataset, run_id))",
        ]

    def _open_existing(self, meta: dict[str, str]) -> None:
        """Check an existing ledger's stamp; upgrade a version-1 ledger in place."""
        if meta.get("application") == APPLICATION and meta.get("schema_version") == "1":
            with self._transaction(write=True) as execute:
                for statement in self._upgrade_statements():
                    execute(statement, ())
                execute(
                    "UPDATE dpsub_ledger_meta SET value = ? WHERE key = 'schema_version'",
                    (str(SCHEMA_VERSION),),
                )
            meta = {**meta, "schema_version": str(SCHEMA_VERSION)}
        self._check_meta(meta)

    def create_schema(self) -> None:
        """Create the tables (idempotent) and stamp the schema version."""
        with self._transaction(write=True) as execute:
            for statement in self._schema():
                execute(statement, ())
            rows = execute("SELECT key, value FROM dpsub_ledger_meta", ())
            if not rows:
                execute(
                    "INSERT INTO dpsub_ledger_meta (key, value) VALUES (?, ?), (?, ?)",
                    ("application", APPLICATION, "schema_version", str(SCHEMA_VERSION)),
                )
        if rows:
            self._open_existing(dict(rows))

    def _check_meta(self, meta: dict[str, str]) -> None:
        if meta.get("application") != APPLICATION:
            raise LedgerError(
                f"{self.location} is not a dpsub ledger (application "
                f"{meta.get('application')!r}): point --ledger at a ledger made by "
                "dpsub budget init"
            )
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            raise LedgerError(
                f"ledger {self.location} has schema version {meta.get('schema_version')!r}, "
                f"this dpsub reads version {SCHEMA_VERSION}: use a matching dpsub release"
            )

    # -- grants -----------------------------------------------------------

    def grant(self, dataset: str, unit: str, total: Budget) -> tuple[Grant, bool]:
        """Grant a dataset its total budget; (grant, created). Re-granting the same is a no-op."""
        privacy, delta = budget_pair(total)
        with self._transaction(write=True) as execute:
            row = self._lock_dataset(execute, dataset)
            overlap = [
                g.dataset
                for g in (_grant_from_row(r) for r in execute(GRANT_SELECT, ()))
                if g.dataset != dataset
                and (dataset_contains(g.dataset, dataset) or dataset_contains(dataset, g.dataset))
            ]
            if row is None and overlap:
                raise LedgerError(
                    f"{dataset} overlaps the granted dataset {overlap[0]}: one datum has one "
                    "budget, so a folder and the files inside it cannot both be granted; run "
                    f"jobs on {dataset} under the grant of {overlap[0]}"
                )
            if row is None:
                stamp = now_utc()
                execute(
                    "INSERT INTO dpsub_datasets "
                    "(dataset, unit, mode, total_privacy, total_delta, granted_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (dataset, unit, budget_mode(total), privacy, delta, stamp),
                )
                return Grant(dataset, unit, total, stamp), True
        existing = _grant_from_row(row)
        if existing.unit != unit or existing.total != total:
            raise LedgerError(
                f"{dataset} is already granted ({describe_budget(existing.total)}) for unit "
                f"{existing.unit}: a grant cannot be changed, so that runs stay accountable; "
                "use another ledger or dataset URI for a new budget"
            )
        return existing, False

    def covering_grant(self, dataset: str) -> str:
        """The granted dataset that holds ``dataset`` (itself, or a granted folder above it).

        A run on a file or sub-folder of a granted folder is charged to that folder's grant;
        without one the key itself is returned (and reserve refuses it, naming the fix).
        """
        holders = [g.dataset for g in self.grants() if dataset_contains(g.dataset, dataset)]
        return max(holders, key=len) if holders else dataset

    def grants(self) -> list[Grant]:
        with self._transaction(write=False) as execute:
            rows = execute(f"{GRANT_SELECT} ORDER BY dataset", ())
        return [_grant_from_row(r) for r in rows]

    def status(self, dataset: str | None = None) -> list[DatasetStatus]:
        """Granted, published, reserved and remaining budget per dataset."""
        out = []
        for grant in self.grants():
            if dataset is not None and grant.dataset != dataset:
                continue
            runs = self.history(grant.dataset)
            out.append(_status(grant, runs))
        if dataset is not None and not out:
            raise LedgerError(
                f"{dataset} has no grant in {self.location}: grant it with "
                f"dpsub budget init --ledger LEDGER --dataset {dataset} --epsilon E --delta D"
            )
        return out

    def history(self, dataset: str | None = None) -> list[RunRecord]:
        """Run records, oldest first (the release itself is not loaded)."""
        sql = f"SELECT {_RUN_COLUMNS} FROM dpsub_runs"
        params: tuple = ()
        if dataset is not None:
            sql += " WHERE dataset = ?"
            params = (dataset,)
        with self._transaction(write=False) as execute:
            rows = execute(sql + " ORDER BY reserved_at, run_id", params)
        return [_run_from_row(r) for r in rows]

    def lookup(self, dataset: str, run_id: str, with_release: bool = False) -> RunRecord | None:
        """One run's record, or None."""
        columns = _RUN_COLUMNS + (", manifest, basis" if with_release else "")
        with self._transaction(write=False) as execute:
            rows = execute(
                f"SELECT {columns} FROM dpsub_runs WHERE dataset = ? AND run_id = ?",
                (dataset, run_id),
            )
        return _run_from_row(rows[0]) if rows else None

    # -- runs ---------------------------------------------------------------

    def reserve(self, request: RunRequest) -> Reservation:
        """Reserve the run's charge (or find it reserved/published), in one locked transaction."""
        with self._transaction(write=True) as execute:
            row = self._lock_dataset(execute, request.dataset)
            if row is None:
                raise LedgerError(
                    f"{request.dataset} has no budget in ledger {self.location}: grant it with "
                    f"dpsub budget init --ledger LEDGER --dataset {request.dataset} "
                    "--epsilon E --delta D"
                )
            grant = _grant_from_row(row)
            check_compatible(grant, request)
            rows = execute(
                f"SELECT {_RUN_COLUMNS} FROM dpsub_runs WHERE dataset = ?", (grant.dataset,)
            )
            runs = [_run_from_row(r) for r in rows]
            mine = next((r for r in runs if r.run_id == request.run_id), None)
            accountant = charged_accountant(grant, runs)
            if mine is not None and mine.job_fingerprint != request.job_fingerprint:
                raise LedgerError(
                    f"run id {request.run_id} was used for a different job on {grant.dataset}: "
                    "pass a run id that names this job, e.g. --run-id <job>-<date>"
                )
            if mine is not None and mine.state == "published":
                record = self._with_release(execute, mine)
                return Reservation("published", record, accountant.remaining)
            if mine is not None and mine.state == "failed":
                return Reservation("failed", mine, accountant.remaining)
            if mine is not None and mine.state in RESUMABLE_STATES:
                if mine.input_fingerprint != request.input_fingerprint:
                    raise LedgerError(
                        f"the input of run {request.run_id} changed since it first started "
                        "(file contents, names or sizes differ); resuming would reuse its noise "
                        "on other data: restore the input, or start a new run id (this run's "
                        "budget stays reserved)"
                    )
                execute(
                    "UPDATE dpsub_runs SET output = ?, updated_at = ? "
                    "WHERE dataset = ? AND run_id = ?",
                    (request.output, now_utc(), grant.dataset, request.run_id),
                )
                lease = self._take_lease(execute, grant.dataset, request.run_id, first=False)
                return Reservation("resume", mine, accountant.remaining, lease)
            if not accountant.can_afford({request.run_id: request.charge}):
                raise BudgetRefused(
                    f"budget refused for run {request.run_id} on {grant.dataset}: it asks for "
                    f"{describe_budget(request.charge)} but only "
                    f"{describe_budget(accountant.remaining)} remains of "
                    f"{describe_budget(grant.total)} (see dpsub budget show)"
                )
            record = self._insert_reservation(execute, request, grant, mine)
            lease = self._take_lease(execute, grant.dataset, request.run_id, first=True)
            accountant.charge(request.run_id, request.charge)
            return Reservation("new", record, accountant.remaining, lease)

    @staticmethod
    def _take_lease(execute, dataset: str, run_id: str, first: bool) -> str:
        """A fresh lease for this attempt; ``first`` restarts the attempt count at 1."""
        lease = secrets.token_hex(16)
        rows = execute(
            "SELECT attempts FROM dpsub_leases WHERE dataset = ? AND run_id = ?", (dataset, run_id)
        )
        attempts = 1 if first or not rows else int(rows[0][0]) + 1
        if rows:
            execute(
                "UPDATE dpsub_leases SET lease = ?, attempts = ? WHERE dataset = ? AND run_id = ?",
                (lease, attempts, dataset, run_id),
            )
        else:
            execute(
                "INSERT INTO dpsub_leases (dataset, run_id, lease, attempts) VALUES (?, ?, ?, ?)",
                (dataset, run_id, lease, attempts),
            )
        return lease

    def _insert_reservation(
        self, execute, request: RunRequest, grant: Grant, returned: RunRecord | None
    ) -> RunRecord:
        stamp = now_utc()
        privacy, delta = budget_pair(request.charge)
        public_seed = (
            request.public_seed if request.public_seed is not None else new_noise_seed() % 2**63
        )
        noise_seed = new_noise_seed()
        values = (
            "reserved",
            budget_mode(request.charge),
            privacy,
            delta,
            request.job_fingerprint,
            request.input_fingerprint,
            str(public_seed),
            str(noise_seed),
            request.output,
            stamp,
        )
        if returned is None:
            execute(
                "INSERT INTO dpsub_runs (state, mode, charge_privacy, charge_delta, "
                "job_fingerprint, input_fingerprint, public_seed, noise_seed, output, "
                "updated_at, reserved_at, dataset, run_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*values, stamp, grant.dataset, request.run_id),
            )
        else:
            execute(
                "UPDATE dpsub_runs SET state = ?, mode = ?, charge_privacy = ?, charge_delta = ?, "
                "job_fingerprint = ?, input_fingerprint = ?, public_seed = ?, noise_seed = ?, "
                "output = ?, updated_at = ?, reserved_at = ?, outcome = NULL "
                "WHERE dataset = ? AND run_id = ?",
                (*values, stamp, grant.dataset, request.run_id),
            )
        return RunRecord(
            dataset=grant.dataset,
            run_id=request.run_id,
            state="reserved",
            charge=request.charge,
            job_fingerprint=request.job_fingerprint,
            input_fingerprint=request.input_fingerprint,
            public_seed=public_seed,
            noise_seed=noise_seed,
            output=request.output,
            outcome=None,
            reserved_at=stamp,
            updated_at=stamp,
            published_at=None,
        )

    def _with_release(self, execute, record: RunRecord) -> RunRecord:
        rows = execute(
            f"SELECT {_RUN_COLUMNS}, manifest, basis FROM dpsub_runs "
            "WHERE dataset = ? AND run_id = ?",
            (record.dataset, record.run_id),
        )
        return _run_from_row(rows[0])

    def _transition(
        self,
        dataset: str,
        run_id: str,
        lease: str,
        allowed: tuple[str, ...],
        assignments: str,
        params: tuple,
        first_attempt_only: bool = False,
    ) -> str | None:
        """Compare-and-set: apply ``assignments`` if the run is in ``allowed`` and ``lease``
        is still the current one (and, with ``first_attempt_only``, it was never resumed).

        Returns None when applied, else the run's state as found ('lease lost' when another
        attempt holds it, 'resumed' when it was resumed). One locked transaction.
        """
        with self._transaction(write=True) as execute:
            self._lock_dataset(execute, dataset)
            rows = execute(
                "SELECT r.state, l.lease, l.attempts FROM dpsub_runs r LEFT JOIN dpsub_leases l "
                "ON l.dataset = r.dataset AND l.run_id = r.run_id "
                "WHERE r.dataset = ? AND r.run_id = ?",
                (dataset, run_id),
            )
            if not rows:
                return "missing"
            state, held, attempts = rows[0]
            if state not in allowed:
                return state
            if held != lease:
                return "lease lost"
            if first_attempt_only and int(attempts) != 1:
                return "resumed"
            execute(
                f"UPDATE dpsub_runs SET {assignments}, updated_at = ? "
                "WHERE dataset = ? AND run_id = ?",
                (*params, now_utc(), dataset, run_id),
            )
        return None

    def begin_publishing(self, dataset: str, run_id: str, lease: str) -> None:
        """Move the run to 'publishing' before any output is written; LeaseLost if this
        attempt no longer holds it (resumed by another, or already finished)."""
        found = self._transition(
            dataset, run_id, lease, RESUMABLE_STATES, "state = 'publishing'", ()
        )
        if found is not None:
            raise LeaseLost(_lost(run_id, found))

    def publish(
        self,
        dataset: str,
        run_id: str,
        lease: str,
        outcome: str,
        manifest: str,
        basis: bytes | None,
    ) -> None:
        """Mark a 'publishing' run published with its release (compare-and-set on the lease)."""
        found = self._transition(
            dataset,
            run_id,
            lease,
            ("publishing",),
            "state = 'published', outcome = ?, manifest = ?, basis = ?, published_at = ?",
            (outcome, manifest, basis, now_utc()),
        )
        if found is not None:
            raise LeaseLost(_lost(run_id, found))

    def fail(self, dataset: str, run_id: str, lease: str) -> bool:
        """Record that the run failed after its data was read: 'failed', still charged.

        The record says only :data:`OUTCOME_FAILED`, whatever the error (validation or
        another): which it was can depend on the data. False if the lease was lost.
        """
        found = self._transition(
            dataset,
            run_id,
            lease,
            RESUMABLE_STATES,
            "state = 'failed', outcome = ?",
            (OUTCOME_FAILED,),
        )
        return found is None

    def note_aborted(self, dataset: str, run_id: str, lease: str) -> bool:
        """Record that this attempt stopped (storage, cluster): the run stays reserved."""
        found = self._transition(
            dataset, run_id, lease, RESUMABLE_STATES, "outcome = ?", (OUTCOME_ABORTED,)
        )
        return found is None

    def return_reservation(self, dataset: str, run_id: str, lease: str) -> bool:
        """Give back the charge of a run whose *first* attempt stopped on public bad input
        before anything was written. Refused (False) when the run was resumed, another
        attempt holds the lease, or the run is no longer 'reserved'."""
        found = self._transition(
            dataset,
            run_id,
            lease,
            ("reserved",),
            "state = 'returned', outcome = ?",
            (OUTCOME_BAD_INPUT,),
            first_attempt_only=True,
        )
        return found is None


def _lost(run_id: str, found: str) -> str:
    return (
        f"run {run_id} was taken over by another attempt or finished ({found}): this attempt "
        "stopped and wrote nothing more; see dpsub budget history"
    )


def _grant_from_row(row: tuple) -> Grant:
    dataset, unit, mode, privacy, delta, granted_at = row
    return Grant(dataset, unit, budget_from_pair(mode, float(privacy), float(delta)), granted_at)


def _run_from_row(row: tuple) -> RunRecord:
    (
        dataset,
        run_id,
        state,
        mode,
        privacy,
        delta,
        job_fp,
        input_fp,
        public_seed,
        noise_seed,
        output,
        outcome,
        reserved_at,
        updated_at,
        published_at,
        *release,
    ) = row
    manifest, basis = release if release else (None, None)
    return RunRecord(
        dataset=dataset,
        run_id=run_id,
        state=state,
        charge=budget_from_pair(mode, float(privacy), float(delta)),
        job_fingerprint=job_fp,
        input_fingerprint=input_fp,
        public_seed=int(public_seed),
        noise_seed=int(noise_seed),
        output=output,
        outcome=outcome,
        reserved_at=reserved_at,
        updated_at=updated_at,
        published_at=published_at,
        manifest=manifest,
        basis=bytes(basis) if basis is not None else None,
    )


def check_compatible(grant: Grant, request: RunRequest) -> None:
    if grant.unit != request.unit:
        raise LedgerError(
            f"{grant.dataset} is granted for privacy unit {grant.unit} but the job uses "
            f"{request.unit}: set unit_column to match the grant, or grant the data separately"
        )
    if budget_mode(grant.total) != budget_mode(request.charge):
        want = "epsilon and delta" if isinstance(grant.total, ApproxDP) else "rho and delta"
        raise LedgerError(
            f"{grant.dataset} is granted in {budget_mode(grant.total)} but the job's budget is "
            f"{budget_mode(request.charge)}: give the job's budget as {want}"
        )


def charged_accountant(grant: Grant, runs: list[RunRecord]) -> Accountant:
    """An accountant for the grant, charged with every reserved or published run."""
    accountant = Accountant(grant.total)
    for run in runs:
        if run.state not in CHARGING_STATES:
            continue
        try:
            accountant.charge(run.run_id, run.charge)
        except BudgetRefused:
            raise LedgerError(
                f"the ledger's runs on {grant.dataset} overspend its grant "
                f"({describe_budget(grant.total)}): the ledger was edited by hand; restore it "
                "from a backup"
            ) from None
    return accountant


def _sum_budgets(mode: str, runs: list[RunRecord]) -> Budget:
    privacy = math.fsum(budget_pair(r.charge)[0] for r in runs)
    delta = math.fsum(budget_pair(r.charge)[1] for r in runs)
    return budget_from_pair(mode, privacy, delta)


def _status(grant: Grant, runs: list[RunRecord]) -> DatasetStatus:
    mode = budget_mode(grant.total)
    accountant = charged_accountant(grant, runs)
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.state] = counts.get(r.state, 0) + 1
    return DatasetStatus(
        grant=grant,
        published=_sum_budgets(mode, [r for r in runs if r.state == "published"]),
        reserved=_sum_budgets(mode, [r for r in runs if r.state in RESUMABLE_STATES]),
        failed=_sum_budgets(mode, [r for r in runs if r.state == "failed"]),
        remaining=accountant.remaining,
        runs=counts,
        report=accountant.report(),
    )


@contextlib.contextmanager
def translate_errors(location: str, *errors: type[BaseException]) -> Iterator[None]:
    """Turn a driver's errors into LedgerError (unreadable) or LedgerUnavailable (busy)."""
    try:
        yield
    except errors as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "locked" in first or "busy" in first:
            raise LedgerUnavailable(
                f"{location} stayed locked by another run ({first}): retry later"
            ) from None
        raise LedgerError(
            f"{location} is unreadable ({first}): point at a file made by dpsub "
            "(dpsub budget init, dpsub stream init)"
        ) from None


def encode_array(array: np.ndarray) -> bytes:
    """An array as .npy bytes (float64), for BLOB columns."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=np.float64), allow_pickle=False)
    return buffer.getvalue()


def decode_array(blob: bytes) -> np.ndarray:
    """Inverse of :func:`encode_array`."""
    return np.load(io.BytesIO(bytes(blob)), allow_pickle=False)
