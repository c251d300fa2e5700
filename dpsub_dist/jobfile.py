"""Job files (``pipelines/*.yaml``) and ``dpsub run``: validate, reserve, estimate, publish.

A job file names a dataset, the estimator and its parameters, the budget of one
run, where the result goes and which ledger accounts for it::

    dataset: /data/events/          # local path or s3:// URI
    rank: 3
    method: auto                    # the default; see docs/auto.md
    budget: {epsilon: 1.0, delta: 1.0e-6}
    output: /results/events-basis/{run_id}
    ledger: /state/ledger.db        # or a postgresql:// URL

The whole file is validated before the ledger is opened or any data is read;
every error names the field. A run then (1) reserves its budget in the ledger
(refused with exit code 4 when the dataset's grant cannot cover it) and gets a
lease, (2) runs the estimator with the private noise seed and the public seed of
the run's ledger record, (3) moves the run to 'publishing' (compare-and-set on the
lease), (4) writes the output atomically and (5) marks the run published. Data that
fails validation after it was read marks the run 'failed' (charged, exit 6). See
:mod:`dpsub_dist.ledger.core` for what happens on re-runs and failures.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dpsub_dist.diagnostics import keep_run_timings, private_phase
from dpsub_dist.engine.cluster import check_scheduler
from dpsub_dist.errors import (
    DataError,
    InputError,
    RunAborted,
    StorageFailure,
    did_you_mean,
)
from dpsub_dist.io.output import check_output_dir, read_run, write_run
from dpsub_dist.io.storage import (
    STORAGE_ERRORS,
    StorageOptions,
    filesystem,
    is_local,
    storage_error,
)
from dpsub_dist.job import METHODS, run_estimate, validate
from dpsub_dist.ledger import (
    RunRecord,
    RunRequest,
    check_run_id,
    dataset_key,
    open_ledger,
    unit_name,
)
from dpsub_dist.ledger.core import (
    RESUMABLE_STATES,
    budget_fields,
    decode_array,
    encode_array,
    fingerprint,
)
from dpsub_dist.methods import DEFAULTS, check_given, declared
from dpsub_dist.params import (
    BUDGET,
    COLUMNS,
    EXCLUDE_COLUMNS,
    RANK,
    REQUIRED,
    SEED,
    STANDARDIZE,
    STORAGE_OPTIONS,
    UNIT_COLUMN,
    EstimateConfig,
    Param,
)
from dpsub_dist.privacy.accountant import Budget, parse_budget
from dpsub_dist.privacy.subspace_clustering import GIBBS_GUARANTEE

TOP_LEVEL = (RANK, COLUMNS, EXCLUDE_COLUMNS, UNIT_COLUMN, STORAGE_OPTIONS, STANDARDIZE)
"""The run-level parameters a job file gives as top-level keys; the budget is ``budget:``
and the public seed ``parameters.seed`` (:data:`dpsub_dist.params.RUN_PARAMS`)."""

JOB_FIELDS: dict[str, str] = {
    "name": "job name, used in default run ids (default: the file name without .yaml)",
    "dataset": "Parquet file, folder or glob (local path or s3:// URI)",
    **{param.name: param.help for param in TOP_LEVEL},
    "method": f"estimator (default {DEFAULTS['estimate']}; one of {sorted(METHODS)})",
    "parameters": "the method's parameters (as its CLI flags: subsets, radius, row_norm…) and "
    "seed, the public seed",
    "budget": "this run's budget: {epsilon, delta} or {rho, delta}",
    "output": "output folder; {run_id} is replaced by the run id",
    "overwrite": "replace an existing output folder (default false)",
    "ledger": "SQLite ledger file or postgresql:// URL (or pass --ledger)",
    "scheduler": "tcp://host:port of a Dask scheduler, local-cluster or in-process (default: "
    "in-process for a small table at row level, else a local cluster; see dpsub run --help)",
    "workers": "workers of the local cluster (default: one per core)",
}
"""Accepted top-level keys of a job file."""


@dataclass(frozen=True)
class Job:
    """A validated job file."""

    path: str
    name: str
    dataset: str
    rank: int
    budget: Budget
    budget_values: dict[str, float]
    output: str
    ledger: str | None = None
    method: str = DEFAULTS["estimate"]
    columns: list[str] | None = None
    exclude_columns: list[str] | None = None
    unit_column: str | None = None
    standardize: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
    overwrite: bool = False
    storage_options: dict[str, Any] = field(default_factory=dict)
    scheduler: str | None = None
    workers: int | None = None

    def config(self, public_seed: int | None = None) -> EstimateConfig:
        """The estimator configuration (``public_seed`` fills in an unset ``seed``)."""
        params = dict(self.parameters)
        if public_seed is not None and params.get("seed") is None:
            params["seed"] = public_seed
        return EstimateConfig(
            self.rank,
            method=self.method,
            columns=self.columns,
            exclude_columns=self.exclude_columns,
            unit_column=self.unit_column,
            standardize=self.standardize,
            storage_options=dict(self.storage_options),
            **self.budget_values,
            parsed_budget=self.budget,  # parsed once, by _budget
            **params,
        )

    @property
    def dataset_key(self) -> str:
        """The dataset as the ledger names it."""
        return dataset_key(self.dataset)

    @property
    def unit(self) -> str:
        return unit_name(self.unit_column)

    def fingerprint(self) -> str:
        """Hash of everything that determines the release (not output, ledger or cluster)."""
        excluded = {"exclude_columns": self.exclude_columns} if self.exclude_columns else {}
        standardized = {"standardize": True} if self.standardize else {}
        return fingerprint(
            {
                **excluded,  # only when set: older jobs keep their run ids
                **standardized,
                "dataset": self.dataset_key,
                "columns": self.columns,
                "unit_column": self.unit_column,
                "rank": self.rank,
                "method": self.method,
                "parameters": self.parameters,
                "budget": self.budget_values,
            }
        )

    def default_run_id(self, now: datetime | None = None) -> str:
        """``<name>-<UTC date>-<job hash>``: one release per job and UTC day unless told."""
        day = (now or datetime.now(UTC)).strftime("%Y-%m-%d")
        return f"{self.name}-{day}-{self.fingerprint()[:8]}"

    def output_for(self, run_id: str) -> str:
        """The output folder of a run."""
        return self.output.replace("{run_id}", run_id)


def load_job(path: str | Path) -> Job:
    """Read and validate a job file; InputError names the file and the field."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"job file not found: {where}: pass the path of a job .yaml") from None
    except OSError as err:
        raise InputError(f"cannot read job file {where}: {err.strerror or err}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "syntax error"
        raise InputError(f"{where}: not valid YAML{line} ({problem}): fix the syntax") from None
    return parse_job(document, where, default_name=Path(path).stem)


def parse_job(document: Any, where: str = "job", default_name: str = "job") -> Job:
    """Validate a parsed job document (a mapping)."""
    if not isinstance(document, dict):
        raise InputError(f"{where}: a job file must be a YAML mapping of fields such as dataset:")
    unknown = sorted(str(k) for k in document if k not in JOB_FIELDS)
    if unknown:
        hint = did_you_mean(unknown[0], JOB_FIELDS)
        raise InputError(
            f"{where}: unknown field {unknown[0]!r}{hint}: accepted fields are "
            f"{', '.join(JOB_FIELDS)}"
        )
    fields = _Fields(document, where)
    name = fields.text("name", required=False) or default_name
    if not _is_run_id(name):
        raise InputError(
            f"{where}: job name {name!r} (from name: or the file name) may only use letters, "
            "digits and ._-: set name: to such a string (it starts default run ids)"
        )
    budget_values, budget = _budget(document.get("budget"), where)
    method = fields.text("method", required=False) or DEFAULTS["estimate"]
    if method == "gibbs":
        raise InputError(
            f"{where}: method gibbs has no privacy guarantee ({GIBBS_GUARANTEE}): the ledger "
            "only runs differentially private methods; use sulq or sample-aggregate"
        )
    if method not in METHODS:
        hint = did_you_mean(method, METHODS)
        raise InputError(
            f"{where}: method {method!r} is unknown{hint}: use one of {sorted(METHODS)}"
        )
    job = Job(
        path=where,
        name=name,
        dataset=fields.text("dataset"),
        rank=fields.param(RANK),
        budget=budget,
        budget_values=budget_values,
        output=_output(fields.text("output"), where),
        ledger=fields.text("ledger", required=False),
        method=method,
        columns=fields.param(COLUMNS),
        exclude_columns=fields.param(EXCLUDE_COLUMNS),
        unit_column=fields.param(UNIT_COLUMN),
        standardize=bool(fields.param(STANDARDIZE)),
        parameters=_parameters(document.get("parameters"), method, where),
        overwrite=fields.boolean("overwrite"),
        storage_options=fields.param(STORAGE_OPTIONS) or {},
        scheduler=fields.text("scheduler", required=False),
        workers=fields.positive_int("workers", required=False),
    )
    try:
        validate(job.config())
        check_scheduler(job.scheduler)
    except InputError as err:
        raise InputError(f"{where}: {err}") from None
    return job


class _Fields:
    """Typed access to top-level fields with errors that name them."""

    def __init__(self, document: dict, where: str) -> None:
        self.document = document
        self.where = where

    def _fail(self, name: str, need: str, value: Any) -> InputError:
        return InputError(f"{self.where}: {name} must be {need} (got {value!r})")

    def _given(self, name: str, required: bool) -> Any:
        """The field's value; None if absent and optional; InputError if absent and required."""
        value = self.document.get(name)
        if value is None and required:
            raise InputError(f"{self.where}: {name} is required ({JOB_FIELDS[name]})")
        return value

    def text(self, name: str, required: bool = True) -> Any:
        value = self._given(name, required)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise self._fail(name, "a non-empty string", value)
        return None if value is None else value.strip()

    def positive_int(self, name: str, required: bool = True) -> Any:
        value = self._given(name, required)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise self._fail(name, "a positive integer", value)
        return value

    def boolean(self, name: str) -> bool:
        value = self.document.get(name, False)
        if not isinstance(value, bool):
            raise self._fail(name, "true or false", value)
        return value

    def param(self, param: Param) -> Any:
        """A run-level parameter, checked by its table entry (text read by its ``parse``)."""
        value = self._given(param.name, param.name in REQUIRED)
        if isinstance(value, str) and param.parse is not None:
            value = param.parse(value)
        elif isinstance(value, str):
            value = value.strip()
        if value is None:
            return None
        try:
            return param.typed(value, param.name)
        except InputError as err:
            raise InputError(f"{self.where}: {err}") from None


BUDGET_NAMES = {param.name: f"budget.{param.name}" for param in BUDGET}
"""How a job file names the budget's values (for :func:`parse_budget`'s messages)."""


def _budget(value: Any, where: str) -> tuple[dict[str, float], Budget]:
    """The run's budget from ``budget: {epsilon, delta}`` or ``{rho, delta}``: the mapping's
    shape here, its values by :func:`parse_budget`, the one check of a budget."""
    if value is None:
        raise InputError(f"{where}: budget is required: budget: {{epsilon: 1.0, delta: 1.0e-6}}")
    if not isinstance(value, dict):
        raise InputError(
            f"{where}: budget must be a mapping such as {{epsilon: 1.0, delta: 1.0e-6}} "
            f"(got {value!r})"
        )
    unknown = sorted(str(k) for k in value if k not in BUDGET_NAMES)
    if unknown:
        raise InputError(f"{where}: budget.{unknown[0]} is unknown: use epsilon, delta or rho")
    try:
        budget = parse_budget(
            value.get("epsilon"), value.get("delta"), value.get("rho"), BUDGET_NAMES
        )
    except InputError as err:
        raise InputError(f"{where}: {err}") from None
    return {k: float(v) for k, v in value.items() if v is not None}, budget


def _parameters(value: Any, method: str, where: str) -> dict[str, Any]:
    """``parameters:``: the public ``seed`` and the method's declared parameters (the keys
    are the names of its table, :mod:`dpsub_dist.methods`), by config attribute."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{where}: parameters must be a mapping (got {value!r})")
    params = declared("estimate")
    out: dict[str, Any] = {}
    given: dict[str, Any] = {}
    for key, item in value.items():
        if key == SEED.name:
            out[SEED.field] = None if item is None else _checked(SEED, item, where)
        elif key not in params:
            names = sorted([*params, SEED.name])
            raise InputError(
                f"{where}: parameters.{key} is unknown{did_you_mean(str(key), names)}: "
                f"accepted parameters are {names}"
            )
        elif item is not None:  # PyYAML reads 1e-6 as a string: numbers may be quoted
            given[key] = _yaml_number(item) if params[key].kind is float else item
    try:
        fields = check_given("estimate", method, given, lambda p: f"parameters.{p.name}")
    except InputError as err:
        raise InputError(f"{where}: {err}") from None
    return {**fields, **out}


def _checked(param: Param, value: Any, where: str) -> Any:
    try:
        return param.typed(value, f"parameters.{param.name}")
    except InputError as err:
        raise InputError(f"{where}: {err}") from None


def _yaml_number(value: Any) -> Any:
    """A quoted number as the number (PyYAML reads 1e-6 as a string); anything else as is,
    for the table's check to refuse."""
    if not isinstance(value, str):
        return value
    try:
        return float(value)
    except ValueError:
        return value


def _output(value: str, where: str) -> str:
    try:
        names = {n for _, n, _, _ in string.Formatter().parse(value) if n is not None}
    except ValueError as err:
        raise InputError(f"{where}: output has unbalanced braces ({err})") from None
    if names - {"run_id"}:
        raise InputError(
            f"{where}: output may only use the placeholder {{run_id}} (got {sorted(names)})"
        )
    return value


def _is_run_id(text: str) -> bool:
    try:
        check_run_id(text)
    except InputError:
        return False
    return ":" not in text


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class RunOutcome:
    """What ``dpsub run`` did."""

    run_id: str
    status: str  # published | resumed | already_published
    outcome: str  # ok | no_stable_subspace
    output: str
    charge: Budget
    remaining: Budget
    restored: bool = False

    @property
    def exit_code(self) -> int:
        return 0 if self.outcome == "ok" else 3


CONTENT_KEYS = ("ETag", "etag", "md5Hash", "crc32c", "checksum", "VersionId", "version_id")
"""Object-store metadata that changes whenever an object's content does."""
FOOTER_TAIL = 8  # a Parquet file ends with the footer's length (4 bytes) and b"PAR1"


def input_fingerprint(uri: str, storage_options: Mapping[str, Any]) -> str:
    """Identity of the input's contents, so that a resumed run reuses its noise on the same data.

    Object stores: every object's name, size and ETag (a hash of its content; a rewrite
    changes it even at the same size and time) or other checksum and version. Local
    files: name, size, inode, modification and status-change times (``ctime``: every
    write moves it and ``os.utime`` cannot set it back) and a hash of the Parquet footer
    (schema, row groups, column statistics and page offsets; public at row level). No
    rows are read: about a millisecond per file, against 0.6–1.8 s per GiB to hash contents.
    """
    from dpsub_dist.io.parquet import list_parquet_files

    files = list_parquet_files(uri, storage_options)
    fs, _ = filesystem(files[0], storage_options)
    local = is_local(files[0])
    described = []
    for name in files:
        try:
            if local:
                described.append([name, *_local_identity(name)])
                continue
            info = fs.info(name)
        except STORAGE_ERRORS as err:
            raise storage_error(err, name, "checking the input of") from None
        content = {key: str(info[key]) for key in CONTENT_KEYS if info.get(key)}
        if not content:  # no content hash on this store: fall back to the time stamp
            content = {"stamp": str(info.get("mtime") or info.get("LastModified"))}
        described.append([name, info.get("size"), content])
    return fingerprint(described)


def _local_identity(name: str) -> list[Any]:
    """Size, inode, mtime, ctime (ns) and the footer's SHA-256 of a local file."""
    path = name.removeprefix("file://")
    info = os.stat(path)
    with open(path, "rb") as handle:
        footer = b""
        if info.st_size >= FOOTER_TAIL:
            handle.seek(info.st_size - FOOTER_TAIL)
            tail = handle.read(FOOTER_TAIL)
            length = int.from_bytes(tail[:4], "little")
            if tail[4:] == b"PAR1" and length <= info.st_size - FOOTER_TAIL:
                handle.seek(info.st_size - FOOTER_TAIL - length)
                footer = handle.read(length)
    digest = hashlib.sha256(footer).hexdigest()
    return [info.st_size, info.st_ino, info.st_mtime_ns, info.st_ctime_ns, digest]


def run_job(
    job: Job,
    run_id: str | None = None,
    ledger: str | None = None,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    quiet: bool = True,
    client: Any | None = None,
) -> RunOutcome:
    """Run a job under the ledger: reserve → estimate → begin publishing → write → publish.

    ``client`` (a Dask client) overrides ``scheduler``/``workers`` and the job's own. Every
    step after reserve is a compare-and-set on this attempt's lease: an attempt overtaken
    by a resume of the same run id stops with :class:`LeaseLost` and writes nothing.
    """
    run_id = check_run_id(run_id) if run_id is not None else job.default_run_id()
    # Every runner's Accountant is created with this total, so a run can never spend more
    # than the charge the ledger reserves for it.
    charge = job.budget
    output = job.output_for(run_id)
    location = ledger or job.ledger
    if not location:
        raise InputError(f"{job.path}: ledger is required: set ledger: in the job or pass --ledger")
    options = StorageOptions.wrap(job.storage_options)
    with open_ledger(location) as book:
        dataset = book.covering_grant(job.dataset_key)
        known = book.lookup(dataset, run_id)
        if known is not None and known.state in ("published", "failed"):
            return _finished(book, job, dataset, run_id, options)
        resuming = known is not None and known.state in RESUMABLE_STATES
        adopt = resuming and own_unpublished_output(output, dataset, run_id, options)
        if not adopt:
            check_output_dir(output, job.overwrite, options, [job.dataset, location])
        request = RunRequest(
            dataset=dataset,
            unit=job.unit,
            run_id=run_id,
            charge=charge,
            job_fingerprint=job.fingerprint(),
            input_fingerprint=input_fingerprint(job.dataset, options),
            output=output,
            public_seed=job.parameters.get("seed"),
        )
        reservation = book.reserve(request)
        if reservation.kind in ("published", "failed"):
            return _finished(book, job, dataset, run_id, options)
        attempt = _Attempt(book, dataset, run_id, reservation.lease or "")
        if adopt and reservation.kind == "resume":
            basis, manifest = read_run(output, options)
            attempt.begin_publishing()  # the output is already on disk: adopt it
            attempt.publish(manifest["outcome"], json.dumps(manifest), basis)
            return RunOutcome(
                run_id, "resumed", manifest["outcome"], output, charge, reservation.remaining
            )
        result = attempt.estimate(job, reservation, scheduler, workers, quiet, client, options)
        manifest = dict(result.manifest)
        manifest["ledger"] = _manifest_entry(job, reservation.record)
        attempt.begin_publishing()  # before anything is written
        write_run(output, result.basis, manifest, job.overwrite, options)
        _, published = read_run(output, options)  # as written, with the outputs' checksums
        attempt.publish(result.outcome, json.dumps(published), result.basis)
        keep_run_timings(output, manifest, result.timings)  # operator-only, after publishing
    status = "published" if reservation.kind == "new" else "resumed"
    return RunOutcome(run_id, status, result.outcome, output, charge, reservation.remaining)


@dataclass(frozen=True)
class _Attempt:
    """One attempt at a reserved run, holding its lease (never printed)."""

    book: Any
    dataset: str
    run_id: str
    lease: str = field(repr=False)

    def begin_publishing(self) -> None:
        """Move the run to 'publishing' (compare-and-set on the lease; LeaseLost if lost)."""
        self.book.begin_publishing(self.dataset, self.run_id, self.lease)

    def publish(self, outcome: str, manifest: str, basis: np.ndarray | None) -> None:
        """Mark the 'publishing' run published with its release."""
        self.book.publish(self.dataset, self.run_id, self.lease, outcome, manifest, _npy(basis))

    def estimate(self, job, reservation, scheduler, workers, quiet, client, options):
        """Run the estimator with the run's seeds; settle the ledger if it fails.

        Data that fails validation after it was read: the run is 'failed' and stays
        charged. Public bad input on a first attempt: the charge is returned (only if this
        attempt still holds the lease and the run was never resumed). Storage or cluster
        failures: the run stays reserved, to be resumed. An unexpected error (not a
        :class:`DpsubError`: a bug, a missing module): the data may have been read, so the
        run is 'failed' (charged) and :class:`RunFailed` carries the traceback for the
        operator only.
        """
        from dpsub_dist.engine.cluster import run_place
        from dpsub_dist.engine.sources import parquet_dataset

        record = reservation.record
        config = job.config(public_seed=record.public_seed)

        def open_dataset(dask):
            return parquet_dataset(
                job.dataset, job.columns, job.unit_column, options, dask, job.exclude_columns
            )

        try:
            with private_phase("run"):  # an unexpected error: RunFailed, a data failure
                if client is not None:
                    return run_estimate(config, open_dataset, client, not quiet, record.noise_seed)
                where = (scheduler or job.scheduler, open_dataset, job.unit_column is None, quiet)
                with run_place(*where, workers or job.workers) as (dask, opened):
                    return run_estimate(config, opened, dask, not quiet, record.noise_seed)
        except DataError:
            self.book.fail(self.dataset, self.run_id, self.lease)
            raise
        except (StorageFailure, RunAborted):
            self.book.note_aborted(self.dataset, self.run_id, self.lease)
            raise
        except InputError:
            if reservation.kind == "new":
                self.book.return_reservation(self.dataset, self.run_id, self.lease)
            raise


def _manifest_entry(job: Job, record: RunRecord) -> dict[str, Any]:
    """The ledger facts a published manifest carries (never the noise seed)."""
    return {
        "run_id": record.run_id,
        "dataset": record.dataset,
        "privacy_unit": job.unit,
        "charged": budget_fields(record.charge),
        "job": job.name,
        "reserved_at": record.reserved_at,
    }


def own_unpublished_output(
    output: str, dataset: str, run_id: str, options: Mapping[str, Any]
) -> bool:
    """Whether ``output`` already holds this run's release (written, then the publish failed)."""
    try:
        _, manifest = read_run(output, options)
    except (InputError, OSError, ValueError):
        return False
    entry = manifest.get("ledger") or {}
    return entry.get("run_id") == run_id and entry.get("dataset") == dataset


def _finished(book, job: Job, dataset: str, run_id: str, options: Mapping[str, Any]) -> RunOutcome:
    """A published run: nothing is charged; its output is restored from the ledger if gone.

    A failed run raises :class:`DataError` again (nothing charged, nothing more said).
    """
    record = book.lookup(dataset, run_id, with_release=True)
    if record.job_fingerprint != job.fingerprint():
        raise InputError(
            f"run id {run_id} was used for a different job on {record.dataset}: "
            "pass a run id that names this job, e.g. --run-id <job>-<date>"
        )
    if record.state == "failed":
        raise DataError(
            f"run {run_id} already failed after reading its data (the detail was written to "
            "the diagnostics file of the failed attempt); fix the cause and start a new run id"
        )
    restored = False
    if record.manifest is not None and not _readable_run(record.output, options):
        basis = decode_array(record.basis) if record.basis is not None else None
        write_run(record.output, basis, json.loads(record.manifest), False, options)
        restored = True
    status = book.status(record.dataset)[0]
    return RunOutcome(
        run_id,
        "already_published",
        record.outcome or "ok",
        record.output,
        record.charge,
        status.remaining,
        restored=restored,
    )


def _readable_run(output: str, options: Mapping[str, Any]) -> bool:
    try:
        read_run(output, options)
    except InputError:
        return False
    return True


def _npy(basis: np.ndarray | None) -> bytes | None:
    return None if basis is None else encode_array(basis)


def describe_outcome(outcome: RunOutcome) -> str:
    """The line ``dpsub run`` prints."""
    from dpsub_dist.ledger.core import describe_budget

    left = f"remaining ({describe_budget(outcome.remaining)})"
    if outcome.status == "already_published":
        again = " (output restored from the ledger)" if outcome.restored else ""
        return (
            f"run {outcome.run_id} was already published at {outcome.output}{again}: "
            f"nothing charged; {left}"
        )
    verb = "resumed and published" if outcome.status == "resumed" else "published"
    what = "basis.npy and manifest.json" if outcome.outcome == "ok" else "manifest.json (no basis)"
    return (
        f"{verb} run {outcome.run_id}: {what} in {outcome.output}; charged "
        f"({describe_budget(outcome.charge)}); {left}"
    )
