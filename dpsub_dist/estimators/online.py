"""Online private PCA (DTTZ14 §4; ALGORITHMS.md §8): a stream of batches, a basis after each.

A stream is created for a horizon of ``T`` batches with its whole privacy budget
(``dpsub stream init``). Each append (``dpsub stream append``, e.g. one day's
partition) reads one batch on the workers, clips every row to the public norm
bound ``B`` and scales it by ``1/B`` (:func:`dpsub_dist.engine.gram.clip_rows`),
reduces ``G_t = Σ aaᵀ`` to one d×d matrix on the workers
(:func:`dpsub_dist.engine.gram.compute_gram`), adds it to the tree of noisy node
sums (:class:`dpsub_dist.privacy.tree_aggregation.TreeAggregator`) and releases the
top-k eigenvectors of the noisy prefix sum (uncentred second moment, as DTTZ14).

Privacy unit: a row, with neighbours that replace one row's values in one batch
(batch sizes are public). User-level privacy is not offered: a user's rows in
different batches could not be scaled jointly without keeping per-user state.

Two files hold a stream, both created owner-only (0600):

- the **stream file** (SQLite, one transaction per append) holds the settings, the
  noisy d×d sums of *closed* tree nodes that later releases still need, the appended
  batches (id, URI, row count, charge) and every released basis with its manifest. It
  is covered by the stream's (ε, δ) claim, like the releases: every node sum in it was
  noised once, when the node closed, and is never changed again.
- the **private file** (``<stream file>.private``, attached to the same transactions)
  holds operator-only state: the exact partial sums of open nodes, which their noise
  is added to when they close, and each batch's file identity (real path, size, ETag
  or SHA-256), used to refuse a file that is already in the stream. Never publish it.

With ``ledger``/``dataset`` at init, the stream's whole budget (every batch up to the
horizon) is charged at once against the dataset's grant; see docs/privacy-streams.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
from dataclasses import asdict, astuple, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dpsub_dist.engine.gram import compute_gram
from dpsub_dist.engine.sources import parquet_dataset
from dpsub_dist.errors import BudgetRefused, InputError
from dpsub_dist.estimators.common import versions
from dpsub_dist.io.parquet import list_parquet_files
from dpsub_dist.io.storage import StorageOptions, filesystem, is_local, with_protocol
from dpsub_dist.ledger.core import (
    LedgerError,
    LedgerUnavailable,
    RunRequest,
    budget_fields,
    canonical_dataset,
    check_run_id,
    dataset_contains,
    dataset_key,
    decode_array,
    encode_array,
    fingerprint,
    now_utc,
)
from dpsub_dist.ledger.sqlite import connect_sqlite, sqlite_transaction
from dpsub_dist.linalg import top_eigenvectors
from dpsub_dist.privacy.accountant import ZCDP, Accountant, ApproxDP, parse_budget
from dpsub_dist.privacy.noise import noise_rng
from dpsub_dist.privacy.tree_aggregation import (
    REPLACE_ONE_SENSITIVITY,
    TreeAggregator,
    last_use,
    node_sigma,
    nodes_containing,
    prefix_nodes,
    rho_for_approx_dp,
    spent_rho,
    tree_levels,
)

APPLICATION = "dpsub_dist online PCA stream"
SCHEMA_VERSION = 2  # 2: closed nodes only in the stream file, open ones in the private file
MAX_HORIZON = 2**20
PRIVATE_SUFFIX = ".private"
UNTRACKED = "not tracked by a ledger: this stream's budget is charged to no grant"
CHUNK_BYTES = 1 << 22

_SCHEMA = [
    "CREATE TABLE dpsub_stream_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE dpsub_stream_nodes (level INTEGER NOT NULL, idx INTEGER NOT NULL, "
    "noisy_sum BLOB NOT NULL, PRIMARY KEY (level, idx))",
    "CREATE TABLE dpsub_stream_batches (step INTEGER PRIMARY KEY, batch_id TEXT NOT NULL UNIQUE, "
    "input TEXT NOT NULL, n_rows INTEGER NOT NULL, charged_rho DOUBLE PRECISION NOT NULL, "
    "appended_at TEXT NOT NULL)",
    "CREATE TABLE dpsub_stream_releases (step INTEGER PRIMARY KEY, basis BLOB NOT NULL, "
    "manifest TEXT NOT NULL)",
    # operator-only, in the attached private file
    "CREATE TABLE private.dpsub_stream_private_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE private.dpsub_stream_open_nodes (level INTEGER NOT NULL, idx INTEGER NOT NULL, "
    "exact_sum BLOB NOT NULL, PRIMARY KEY (level, idx))",
    "CREATE TABLE private.dpsub_stream_files (step INTEGER NOT NULL, path TEXT NOT NULL, "
    "size INTEGER NOT NULL, content TEXT NOT NULL)",
]


def private_path(path: str) -> str:
    """The operator-only file beside a stream file (exact open-node sums, file identities)."""
    return f"{path}{PRIVATE_SUFFIX}"


@dataclass(frozen=True, order=True)
class BatchFile:
    """One input file's identity (operator-only): real location, size, ETag or SHA-256."""

    path: str
    size: int
    content: str


def file_identity(name: str, storage_options: dict[str, Any] | None = None) -> BatchFile:
    """Identity of a listed file: symlinks and spellings resolved; the object's ETag, else
    the SHA-256 of its bytes (runs where the file is readable: on a worker)."""
    fs, path = filesystem(name, storage_options)
    try:
        info = fs.info(path)
        etag = info.get("ETag") or info.get("etag")
        if etag:
            content = f"etag:{str(etag).strip(chr(34))}"
        else:
            digest = hashlib.sha256()
            with fs.open(path, "rb") as handle:
                while chunk := handle.read(CHUNK_BYTES):
                    digest.update(chunk)
            content = f"sha256:{digest.hexdigest()}"
    except OSError as err:
        raise InputError(f"cannot read input file {name} to identify it: {err}") from None
    where = os.path.realpath(path) if is_local(name) else canonical_dataset(with_protocol(fs, path))
    return BatchFile(where, int(info.get("size") or 0), content)


def batch_files(
    uri: str, storage_options: dict[str, Any] | None, client: Any | None
) -> list[BatchFile]:
    """The identities of a batch's files, listed on the driver and hashed on the workers."""
    storage_options = StorageOptions.wrap(storage_options)  # redacted in task keys and reprs
    names = list_parquet_files(uri, storage_options)
    if client is None:
        return sorted(file_identity(n, storage_options) for n in names)
    futures = client.map(file_identity, names, storage_options=storage_options, pure=False)
    return sorted(client.gather(futures))


def _create_owner_only(path: Path) -> None:
    """Create an empty file readable and writable by its owner only (0600), or InputError."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        raise InputError(f"stream state {path} already exists: choose a new path") from None
    except OSError as err:
        raise InputError(f"cannot create stream state {path}: {err}") from None
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StreamSettings:
    """What is fixed when a stream is created (all public)."""

    horizon: int
    rank: int
    clip_norm: float
    budget: dict[str, float]  # as given: {epsilon, delta} or {rho, delta}
    rho: float  # the whole stream's zCDP budget
    conversion_delta: float  # δ of the reported (ε, δ)-DP guarantee
    levels: int
    node_sigma: float
    sensitivity: float
    created_at: str
    columns: list[str] | None = None  # fixed by init or by the first batch
    ledger: dict[str, Any] | None = None  # where the whole budget was charged; None: untracked


@dataclass(frozen=True)
class StreamBatch:
    step: int
    batch_id: str
    input: str
    n_rows: int
    charged_rho: float
    appended_at: str


@dataclass(frozen=True)
class StreamRelease:
    """The basis released after ``step`` batches and its manifest."""

    step: int
    basis: np.ndarray
    manifest: dict[str, Any]
    already_appended: bool = False
    charged_rho: float = 0.0  # what this append charged (0 for a re-release)


def _check_settings(horizon: int, rank: int, clip_norm: float) -> None:
    if isinstance(horizon, bool) or not isinstance(horizon, int) or not 1 <= horizon <= MAX_HORIZON:
        raise InputError(
            f"horizon must be an integer in 1..{MAX_HORIZON} (got {horizon!r}): pass --horizon T, "
            "the number of batches the stream will take"
        )
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InputError(f"rank must be a positive integer (got {rank!r}): pass --rank K")
    if not (isinstance(clip_norm, int | float) and math.isfinite(clip_norm) and clip_norm > 0):
        raise InputError(
            f"clip norm must be a positive number (got {clip_norm!r}): pass --clip-norm B, a "
            "public bound on row norms (longer rows are scaled down to it)"
        )


def init_stream(
    path: str,
    horizon: int,
    rank: int,
    clip_norm: float,
    epsilon: float | None = None,
    delta: float | None = None,
    rho: float | None = None,
    columns: list[str] | None = None,
    ledger: str | None = None,
    dataset: str | None = None,
) -> StreamSettings:
    """Create a stream's two files (0600) for ``horizon`` batches and its whole budget.

    (ε, δ): the stream runs at the largest ρ whose CKS conversion at δ is within ε.
    (ρ, δ): ρ-zCDP, reported as (ε, δ)-DP with the CKS conversion at δ.
    ``ledger`` and ``dataset``: the whole budget — (ε, δ), or (ρ, δ₀ = 0) — is reserved
    and published at once against the dataset's row-level grant before any file is made
    (LedgerError, exit 2: no grant; BudgetRefused, exit 4: not enough left). Without them
    the stream is not tracked by any ledger.
    """
    _check_settings(horizon, rank, clip_norm)
    parse_budget(epsilon, delta, rho)  # validates (InputError, exit 2)
    if (ledger is None) != (dataset is None):
        raise InputError(
            "--dataset needs --ledger (and --ledger needs --dataset): pass both to charge the "
            "stream's whole budget to the dataset's grant, or neither for an untracked stream"
        )
    # rank < D is checked at each append, before any row is read: a named column may be a
    # vector column whose width only the footers tell.
    files = [Path(path), Path(private_path(path))]
    for file in files:
        if file.exists() or file.is_symlink():
            raise InputError(f"stream state {file} already exists: choose a new path")
    if not files[0].parent.is_dir():
        raise InputError(f"parent folder of {path} does not exist: create it first")
    if not os.access(files[0].parent, os.W_OK):
        raise InputError(f"cannot create files in {files[0].parent}: choose a writable folder")
    total_rho = rho if rho is not None else rho_for_approx_dp(float(epsilon), float(delta))
    values = {"epsilon": epsilon} if epsilon is not None else {"rho": rho}
    settings = StreamSettings(
        horizon=horizon,
        rank=rank,
        clip_norm=float(clip_norm),
        budget={**{k: float(v) for k, v in values.items()}, "delta": float(delta)},
        rho=float(total_rho),
        conversion_delta=float(delta),
        levels=tree_levels(horizon),
        node_sigma=node_sigma(float(total_rho), horizon, REPLACE_ONE_SENSITIVITY),
        sensitivity=REPLACE_ONE_SENSITIVITY,
        created_at=now_utc(),
        columns=list(columns) if columns else None,
    )
    if ledger is not None:
        settings = _charge_ledger(settings, ledger, str(dataset), str(files[0].resolve()))
    stream_id = secrets.token_hex(16)
    made: list[Path] = []
    try:
        for file in files:
            _create_owner_only(file)
            made.append(file)
        conn, _ = _connect(path, create=True)
        try:
            _attach_private(conn, path)
            with sqlite_transaction(conn, path, write=True) as execute:
                for statement in _SCHEMA:
                    execute(statement)
                meta = {
                    "application": APPLICATION,
                    "schema_version": str(SCHEMA_VERSION),
                    "settings": json.dumps(asdict(settings)),
                }
                for key, value in [*meta.items(), ("stream_id", stream_id)]:
                    execute(
                        "INSERT INTO dpsub_stream_meta (key, value) VALUES (?, ?)", (key, value)
                    )
                execute(
                    "INSERT INTO private.dpsub_stream_private_meta (key, value) VALUES (?, ?)",
                    ("stream_id", stream_id),
                )
        finally:
            conn.close()
    except BaseException:
        for file in made:  # nothing was read: leave no half-made stream behind
            file.unlink(missing_ok=True)
        raise
    return settings


def ledger_charge(settings: StreamSettings) -> ApproxDP | ZCDP:
    """What a stream charges a grant: its whole horizon's (ε, δ), or (ρ, δ₀ = 0) — the tree
    mechanism is ρ-zCDP with no failure probability."""
    if settings.budget.get("epsilon") is not None:
        return ApproxDP(settings.budget["epsilon"], settings.conversion_delta)
    return ZCDP(settings.rho, 0.0)


def _charge_ledger(settings: StreamSettings, location: str, dataset: str, output: str):
    """Reserve and publish the stream's whole budget against ``dataset``'s row-level grant.

    The charge is the horizon's total, so every later append is already paid for: the
    stream never spends more than the grant allowed it, and a second stream on the same
    dataset is charged again (exit 4 when the grant cannot pay for it).
    """
    from dpsub_dist.ledger import open_ledger

    charge = ledger_charge(settings)
    key = dataset_key(dataset)
    run_id = f"stream-{secrets.token_hex(6)}"
    public = {k: v for k, v in asdict(settings).items() if k != "created_at"}
    request = RunRequest(
        dataset=key,
        unit="row",
        run_id=run_id,
        charge=charge,
        job_fingerprint=fingerprint({"stream": public}),
        input_fingerprint=None,
        output=output,
    )
    with open_ledger(location) as book:
        key = book.covering_grant(key)
        request = replace(request, dataset=key)
        reservation = book.reserve(request)
        entry = {
            "location": book.location,
            "dataset": key,
            "run_id": run_id,
            "privacy_unit": "row",
            "charged": budget_fields(charge),
        }
        settings = replace(settings, ledger=entry)
        lease = reservation.lease or ""
        book.begin_publishing(key, run_id, lease)
        book.publish(
            key, run_id, lease, "stream", json.dumps({"stream": output, **asdict(settings)}), None
        )
    return settings


def _attach_private(conn, path: str) -> None:
    """Attach the private file to ``conn`` (one transaction spans both files)."""
    private = private_path(path)
    if not Path(private).is_file():
        raise LedgerError(
            f"the private file of stream {path} is missing ({private}): it holds the open tree "
            "nodes' exact sums, so the stream cannot take more batches without it; restore it "
            "from a backup"
        )
    conn.execute("ATTACH DATABASE ? AS private", (private,))


def _connect(path: str, create: bool):
    return connect_sqlite(
        path,
        create,
        meta_table="dpsub_stream_meta",
        kind="a dpsub stream",
        missing=f"no stream state at {path}: create it with dpsub stream init",
        role="pass the state file made by dpsub stream init",
    )


class Stream:
    """An open stream state file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn, _ = _connect(path, create=False)
        self._private = False
        try:
            self.settings = self._read_settings()
        except BaseException:
            self._conn.close()
            raise

    def _read_settings(self) -> StreamSettings:
        path = self.path
        with sqlite_transaction(self._conn, path, write=False) as execute:
            meta = dict(execute("SELECT key, value FROM dpsub_stream_meta"))
        if meta.get("application") != APPLICATION:
            raise LedgerError(f"{path} is not a dpsub stream: pass the file made by stream init")
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            raise LedgerError(
                f"stream {path} has schema version {meta.get('schema_version')!r}, this dpsub "
                f"reads version {SCHEMA_VERSION}: use a matching dpsub release"
            )
        try:
            return StreamSettings(**json.loads(meta["settings"]))
        except (KeyError, TypeError, ValueError) as err:
            raise LedgerError(f"stream {path} has unreadable settings ({err})") from None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading state --------------------------------------------------------

    def batches(self) -> list[StreamBatch]:
        with sqlite_transaction(self._conn, self.path, write=False) as execute:
            rows = execute(
                "SELECT step, batch_id, input, n_rows, charged_rho, appended_at "
                "FROM dpsub_stream_batches ORDER BY step"
            )
        return [StreamBatch(*r) for r in rows]

    def _attach_private(self) -> None:
        """Attach the operator-only file (once), checking it belongs to this stream."""
        if self._private:
            return
        _attach_private(self._conn, self.path)
        self._private = True
        with sqlite_transaction(self._conn, self.path, write=False) as execute:
            mine = execute("SELECT value FROM dpsub_stream_meta WHERE key = 'stream_id'")
            theirs = execute(
                "SELECT value FROM private.dpsub_stream_private_meta WHERE key = 'stream_id'"
            )
        if not mine or mine != theirs:
            raise LedgerError(
                f"{private_path(self.path)} is not the private file of stream {self.path}: "
                "restore the file made with it by dpsub stream init"
            )

    def _files(self) -> dict[int, list[BatchFile]]:
        """Each appended step's file identities (operator-only)."""
        self._attach_private()
        with sqlite_transaction(self._conn, self.path, write=False) as execute:
            rows = execute("SELECT step, path, size, content FROM private.dpsub_stream_files")
        out: dict[int, list[BatchFile]] = {}
        for step, *identity in rows:
            out.setdefault(step, []).append(BatchFile(*identity))
        return {step: sorted(files) for step, files in out.items()}

    def _aggregator(self, execute, step: int, dim: int) -> TreeAggregator:
        """The tree after ``step`` batches, holding what batch ``step + 1`` needs: the closed
        nodes of its prefix and the exact partial sums of the open nodes it enters."""
        closed, partial = {}, {}
        for node in prefix_nodes(step + 1):
            rows = execute(
                "SELECT noisy_sum FROM dpsub_stream_nodes WHERE level = ? AND idx = ?", node
            )
            if rows:
                closed[node] = decode_array(rows[0][0])
        for node in nodes_containing(step + 1, self.settings.horizon):
            rows = execute(
                "SELECT exact_sum FROM private.dpsub_stream_open_nodes WHERE level = ? AND idx = ?",
                node,
            )
            if rows:
                partial[node] = decode_array(rows[0][0])
        s = self.settings
        return TreeAggregator(s.horizon, s.node_sigma, dim, step, closed, partial)

    def accountant(self) -> Accountant:
        """The stream's accountant, charged with every append so far."""
        return _accountant(self.settings, self.batches())

    def status(self) -> dict[str, Any]:
        """Public facts: settings, progress, budget report and the appended batches."""
        batches = self.batches()
        return {
            "state": self.path,
            "step": len(batches),
            "settings": asdict(self.settings),
            "budget": self.accountant().report(),
            "batches": [asdict(b) for b in batches],
        }

    def release(self, step: int | None = None) -> StreamRelease:
        """The basis and manifest released after ``step`` batches (default: the latest)."""
        with sqlite_transaction(self._conn, self.path, write=False) as execute:
            latest = execute("SELECT COUNT(*) FROM dpsub_stream_batches")[0][0]
            step = latest if step is None else step
            rows = execute(
                "SELECT basis, manifest FROM dpsub_stream_releases WHERE step = ?", (step,)
            )
        if not rows:
            raise InputError(
                f"stream {self.path} has {latest} batches: nothing was released at step {step}"
            )
        return StreamRelease(step, decode_array(rows[0][0]), json.loads(rows[0][1]))

    @staticmethod
    def _manifest(
        s: StreamSettings,
        batch: StreamBatch,
        upto: list[StreamBatch],
        values: np.ndarray,
        dim: int,
    ) -> dict[str, Any]:
        """The manifest of the release after ``batch`` (public facts only)."""
        columns = s.columns or []
        return {
            "outcome": "ok",
            "method": "online",
            "input": batch.input,
            "columns": columns,
            "n_rows": batch.n_rows,
            "n_rows_note": "rows of this batch, from the Parquet footers; public under "
            "replace-one neighbours",
            "dim": dim,  # total width: a vector column counts its width
            "rank": s.rank,
            "stream": {
                "step": batch.step,
                "horizon": s.horizon,
                "batch_id": batch.batch_id,
                "rows_so_far": sum(b.n_rows for b in upto),
                "nodes_released": [list(n) for n in prefix_nodes(batch.step)],
            },
            "parameters": {
                "clip_norm": s.clip_norm,
                "levels": s.levels,
                "node_sigma": s.node_sigma,
                "centred": False,
            },
            "release": {"eigenvalues": [float(v) for v in values]},
            "privacy": {
                "unit": "row",
                "neighbours": "replace one row's values in one batch (batch sizes are public)",
                "mechanism": "tree aggregation (binary mechanism) of clipped Σ aaᵀ, symmetric "
                "Gaussian noise per node with rho/L (DTTZ14 §4)",
                "sensitivity": s.sensitivity,
                "budget": _accountant(s, upto).report(),
                "ledger": s.ledger or UNTRACKED,
            },
            "versions": versions(),
        }

    # -- appending --------------------------------------------------------------

    def append(
        self,
        uri: str,
        batch_id: str | None = None,
        storage_options: dict[str, Any] | None = None,
        client: Any | None = None,
        progress: bool = False,
    ) -> StreamRelease:
        """Read one batch on the workers, add its noisy contribution, release the new basis.

        Appending a batch id that is already in the stream, with the same files, releases
        that step again and changes nothing. Before any row is read (InputError, exit 2,
        nothing charged): a batch outside the ledger's dataset, a batch id reused for other
        files, and any file already in the stream (by real path or by size and ETag/SHA-256)
        or twice in this batch; then the horizon (BudgetRefused, exit 4).
        """
        batch_id = check_run_id(batch_id) if batch_id else canonical_dataset(uri)
        s = self.settings
        self._check_in_dataset(uri)
        batches = self.batches()
        seen = next((b for b in batches if b.batch_id == batch_id), None)
        known = self._files()
        if seen is not None:
            if known.get(seen.step) != batch_files(uri, storage_options, client):
                raise InputError(
                    f"batch id {batch_id} was appended at step {seen.step} from other files (or "
                    "they changed since): give this batch its own --batch-id"
                )
            again = self.release(seen.step)
            return StreamRelease(again.step, again.basis, again.manifest, already_appended=True)
        step = len(batches)
        if step >= s.horizon:
            raise BudgetRefused(
                f"stream {self.path} has taken all {s.horizon} batches of its horizon and spent "
                f"its whole budget (rho={s.rho:.6g}): start a new stream with dpsub stream init"
            )
        files = batch_files(uri, storage_options, client)
        _check_new_files(uri, files, known, {b.step: b.batch_id for b in batches})
        dataset = parquet_dataset(uri, s.columns, None, storage_options or {}, client)
        if s.columns is not None and dataset.columns != s.columns:
            raise InputError(
                f"{uri} has columns {dataset.columns[:20]} but the stream uses {s.columns[:20]}"
            )
        if s.rank >= dataset.dim:
            raise InputError(
                f"rank {s.rank} must be smaller than the number of features ({dataset.dim}): "
                "pass more columns at stream init"
            )
        if batches:
            before = self.release(step).manifest.get("dim", dataset.dim)
            if before != dataset.dim:
                raise InputError(
                    f"{uri} has {dataset.dim} features but the stream's earlier batches have "
                    f"{before}: vector columns must keep their width across batches"
                )
        summary = compute_gram(
            dataset.parts, dataset.loader, s.clip_norm, client=client, progress=progress
        )
        charge = spent_rho(step + 1, s.rho, s.horizon) - spent_rho(step, s.rho, s.horizon)
        settings = s if s.columns is not None else replace(s, columns=list(dataset.columns))
        batch = StreamBatch(step + 1, batch_id, uri, int(dataset.n_rows), charge, now_utc())
        with sqlite_transaction(self._conn, self.path, write=True) as execute:
            now = execute("SELECT COUNT(*) FROM dpsub_stream_batches")[0][0]
            if now != step or execute(
                "SELECT 1 FROM dpsub_stream_batches WHERE batch_id = ?", (batch_id,)
            ):
                raise LedgerUnavailable(
                    f"another append changed stream {self.path} while this batch was read; "
                    "nothing was added: run this append again"
                )
            tree = self._aggregator(execute, step, dataset.dim)
            closed = tree.add(summary.gram, noise_rng())
            values, basis = top_eigenvectors(tree.prefix(batch.step), s.rank)
            manifest = self._manifest(settings, batch, [*batches, batch], values, dataset.dim)
            manifest["summary_bytes_gathered"] = summary.nbytes
            self._store_tree(execute, tree, closed)
            execute(
                "INSERT INTO dpsub_stream_batches "
                "(step, batch_id, input, n_rows, charged_rho, appended_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                astuple(batch),
            )
            for file in files:
                execute(
                    "INSERT INTO private.dpsub_stream_files (step, path, size, content) "
                    "VALUES (?, ?, ?, ?)",
                    (batch.step, *astuple(file)),
                )
            execute(
                "INSERT INTO dpsub_stream_releases (step, basis, manifest) VALUES (?, ?, ?)",
                (batch.step, encode_array(basis), json.dumps(manifest, sort_keys=True)),
            )
            if settings is not s:
                execute(
                    "UPDATE dpsub_stream_meta SET value = ? WHERE key = 'settings'",
                    (json.dumps(asdict(settings)),),
                )
        self.settings = settings
        return StreamRelease(batch.step, basis, manifest, charged_rho=charge)

    @staticmethod
    def _store_tree(execute, tree: TreeAggregator, closed: list) -> None:
        """Persist a tree after an append: nodes closed now go, noisy, to the stream file
        while a later release needs them; open nodes' exact sums stay in the private file."""
        for node in closed:
            execute("DELETE FROM private.dpsub_stream_open_nodes WHERE level = ? AND idx = ?", node)
            if last_use(node) > tree.step:
                execute(
                    "INSERT INTO dpsub_stream_nodes (level, idx, noisy_sum) VALUES (?, ?, ?)",
                    (*node, encode_array(tree.closed[node])),
                )
        for node, exact in tree.partial.items():
            execute(
                "INSERT OR REPLACE INTO private.dpsub_stream_open_nodes (level, idx, exact_sum) "
                "VALUES (?, ?, ?)",
                (*node, encode_array(exact)),
            )
        for node in execute("SELECT level, idx FROM dpsub_stream_nodes"):
            if last_use(node) <= tree.step:  # no later release uses it
                execute("DELETE FROM dpsub_stream_nodes WHERE level = ? AND idx = ?", node)

    def _check_in_dataset(self, uri: str) -> None:
        """A stream charged to a dataset's grant takes batches from that dataset only."""
        if self.settings.ledger is None:
            return
        dataset = self.settings.ledger["dataset"]
        if not dataset_contains(dataset, dataset_key(uri)):
            raise InputError(
                f"batch {uri} is outside the dataset {dataset} whose grant pays for this stream: "
                "append batches of that dataset, or start a stream charged to this one"
            )


def _check_new_files(
    uri: str, files: list[BatchFile], known: dict[int, list[BatchFile]], ids: dict[int, str]
) -> None:
    """Refuse a file already in the stream (by real path, or by size and content) or twice
    in this batch: its rows would enter the tree twice while one charge is reported."""
    for step, earlier in sorted(known.items()):
        paths = {f.path for f in earlier}
        contents = {(f.size, f.content) for f in earlier}
        for file in files:
            if file.path in paths or (file.size, file.content) in contents:
                raise InputError(
                    f"{file.path} (in {uri}) is already in this stream (batch id {ids[step]}, "
                    f"step {step}){'' if file.path in paths else ' as a file with the same bytes'}"
                    ": a row may enter a stream once; nothing was read or charged"
                )
    for one, other in zip(files, files[1:], strict=False):
        if one.path == other.path or (one.size, one.content) == (other.size, other.content):
            raise InputError(
                f"{one.path} is twice in this batch ({uri}), e.g. through a symlink or a copy: "
                "a row may enter a stream once; nothing was read or charged"
            )


def _accountant(settings: StreamSettings, batches: list[StreamBatch]) -> Accountant:
    """Accountant of the whole stream's budget, charged with these appends (basic composition)."""
    accountant = Accountant(ZCDP(settings.rho, 0.0), conversion_delta=settings.conversion_delta)
    for batch in batches:
        accountant.charge(f"batch {batch.step}", ZCDP(batch.charged_rho, 0.0))
    return accountant


def open_stream(path: str) -> Stream:
    """Open an existing stream state file (InputError if missing, corrupt or foreign)."""
    return Stream(path)
