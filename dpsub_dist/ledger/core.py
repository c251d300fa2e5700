"""The privacy-budget ledger: what each dataset was granted and what each run charged.

One row per dataset (its canonical URI) records the total budget granted and the
privacy unit it was granted for; one row per (dataset, run id) records that run's
charge and state. A run moves through these states::

    (none) ──reserve──▶ reserved ──publish──▶ published
                          │  ▲
          bad input on a  │  │ reserve again
          first attempt   ▼  │
                         returned

- **reserve** runs in one transaction that locks the dataset's grant (SQLite
  ``BEGIN IMMEDIATE``, PostgreSQL ``SELECT … FOR UPDATE``), so two concurrent runs
  cannot both take the last of the budget. It happens before any data is read.
  The charges of ``reserved`` and ``published`` runs compose by basic composition
  through :class:`~dpsub_dist.privacy.accountant.Accountant` (ε and δ add, or ρ and
  δ₀ add); a run that does not fit is refused with the remaining budget.
- A ``reserved`` run that stopped without publishing (crash, lost worker, full
  disk) keeps its charge: it may have drawn its noise, so giving the budget back
  would let a retry draw fresh noise for the same data — an averaging attack.
  Resuming it under the same run id reuses its private noise seed and public seed
  and reproduces the same release without a second charge.
- A run whose *first* attempt stopped on bad input (exit code 2) before anything
  was written is ``returned``: nothing noisy left the process, so its charge no
  longer counts. A returned run can be reserved again.
- **publish** records the outcome, the manifest and the basis, so that running a
  published run id again returns the same result (restoring the output folder if
  it was deleted) and charges nothing.

The private noise seed lives only in the run's ledger row: it is never printed,
logged, or written to an output or manifest. Treat the ledger like a secret.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np

from dpsub_dist.errors import BudgetRefused, DpsubError, InputError
from dpsub_dist.privacy.accountant import ZCDP, Accountant, ApproxDP, Budget
from dpsub_dist.privacy.noise import new_noise_seed

SCHEMA_VERSION = 1
APPLICATION = "dpsub_dist privacy-budget ledger"

RunState = Literal["reserved", "published", "returned"]
CHARGING_STATES = ("reserved", "published")
"""States whose charge counts against the dataset's total."""

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:+@=-]{0,199}$")


class LedgerError(InputError):
    """The ledger is missing, corrupt, of another schema, or disagrees with the job (exit 2)."""


class LedgerUnavailable(DpsubError):
    """The ledger server could not be reached: a transient failure worth retrying (exit 1)."""


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
    """The dataset key: scheme-qualified URIs as given, local paths absolute; no trailing '/'."""
    import os

    text = str(uri).strip()
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme.lower() == "file":
            text = rest
        else:
            return f"{scheme.lower()}://{rest.rstrip('/')}"
    return os.path.abspath(os.path.expanduser(text)).rstrip("/") or "/"


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
        """Everything but the private noise seed and the stored release, JSON-ready."""
        return {
            "dataset": self.dataset,
            "run_id": self.run_id,
            "state": self.state,
            "charge": budget_fields(self.charge),
            "public_seed": self.public_seed,
            "output": self.output,
            "outcome": self.outcome,
            "reserved_at": self.reserved_at,
            "updated_at": self.updated_at,
            "published_at": self.published_at,
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

    kind: Literal["new", "resume", "published"]
    record: RunRecord
    remaining: Budget


@dataclass(frozen=True)
class DatasetStatus:
    """A grant with what its runs have spent."""

    grant: Grant
    published: Budget
    reserved: Budget
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
        ]

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
            else:
                self._check_meta(dict(rows))

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
            _check_compatible(grant, request)
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
            if mine is not None and mine.state == "reserved":
                if (
                    mine.input_fingerprint is not None
                    and request.input_fingerprint is not None
                    and mine.input_fingerprint != request.input_fingerprint
                ):
                    raise LedgerError(
                        f"the input of run {request.run_id} changed since it first started "
                        "(files or sizes differ); resuming would reuse its noise on other data: "
                        "restore the input, or start a new run id (this run's budget stays "
                        "reserved)"
                    )
                execute(
                    "UPDATE dpsub_runs SET output = ?, updated_at = ? "
                    "WHERE dataset = ? AND run_id = ?",
                    (request.output, now_utc(), grant.dataset, request.run_id),
                )
                return Reservation("resume", mine, accountant.remaining)
            if not accountant.can_afford({request.run_id: request.charge}):
                raise BudgetRefused(
                    f"budget refused for run {request.run_id} on {grant.dataset}: it asks for "
                    f"{describe_budget(request.charge)} but only "
                    f"{describe_budget(accountant.remaining)} remains of "
                    f"{describe_budget(grant.total)} (see dpsub budget show)"
                )
            record = self._insert_reservation(execute, request, grant, mine)
            accountant.charge(request.run_id, request.charge)
            return Reservation("new", record, accountant.remaining)

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

    def publish(
        self, dataset: str, run_id: str, outcome: str, manifest: str, basis: bytes | None
    ) -> None:
        """Mark a reserved run published, storing its public release (manifest and basis)."""
        stamp = now_utc()
        with self._transaction(write=True) as execute:
            rows = execute(
                "SELECT state FROM dpsub_runs WHERE dataset = ? AND run_id = ?", (dataset, run_id)
            )
            if not rows or rows[0][0] not in ("reserved", "published"):
                state = rows[0][0] if rows else "missing"
                raise LedgerError(
                    f"cannot publish run {run_id} on {dataset}: its ledger state is {state}"
                )
            if rows[0][0] == "published":
                return
            execute(
                "UPDATE dpsub_runs SET state = 'published', outcome = ?, manifest = ?, basis = ?, "
                "published_at = ?, updated_at = ? WHERE dataset = ? AND run_id = ?",
                (outcome, manifest, basis, stamp, stamp, dataset, run_id),
            )

    def return_reservation(self, dataset: str, run_id: str, reason: str) -> None:
        """Give back a reserved charge whose first attempt stopped on bad input, nothing written."""
        with self._transaction(write=True) as execute:
            execute(
                "UPDATE dpsub_runs SET state = 'returned', outcome = ?, updated_at = ? "
                "WHERE dataset = ? AND run_id = ? AND state = 'reserved'",
                (f"bad input: {reason}"[:500], now_utc(), dataset, run_id),
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


def _check_compatible(grant: Grant, request: RunRequest) -> None:
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
        reserved=_sum_budgets(mode, [r for r in runs if r.state == "reserved"]),
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
