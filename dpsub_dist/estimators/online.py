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

The state file (SQLite, one transaction per append) holds the settings, the noisy
d×d sums of the tree nodes that later releases still need (at most two per level),
the appended batches and every released basis with its manifest — never rows or
exact sums. The released bases are ρ-zCDP over the whole stream. Keep the state
file private all the same, like the ledger: a node's noise is drawn once when the
node opens, so two copies of the file taken before and after an append differ by
that batch's exact Gram matrix in the still-open nodes.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, astuple, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dpsub_dist.engine.gram import compute_gram
from dpsub_dist.engine.sources import parquet_dataset
from dpsub_dist.errors import BudgetRefused, InputError
from dpsub_dist.job import versions
from dpsub_dist.ledger.core import (
    LedgerError,
    LedgerUnavailable,
    canonical_dataset,
    check_run_id,
    decode_array,
    encode_array,
    now_utc,
)
from dpsub_dist.ledger.sqlite import connect_sqlite, sqlite_transaction
from dpsub_dist.linalg import top_eigenvectors
from dpsub_dist.privacy.accountant import ZCDP, Accountant, parse_budget
from dpsub_dist.privacy.noise import noise_rng
from dpsub_dist.privacy.tree_aggregation import (
    REPLACE_ONE_SENSITIVITY,
    Node,
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
SCHEMA_VERSION = 1
MAX_HORIZON = 2**20

_SCHEMA = [
    "CREATE TABLE dpsub_stream_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE dpsub_stream_nodes (level INTEGER NOT NULL, idx INTEGER NOT NULL, "
    "noisy_sum BLOB NOT NULL, PRIMARY KEY (level, idx))",
    "CREATE TABLE dpsub_stream_batches (step INTEGER PRIMARY KEY, batch_id TEXT NOT NULL UNIQUE, "
    "input TEXT NOT NULL, n_rows INTEGER NOT NULL, charged_rho DOUBLE PRECISION NOT NULL, "
    "appended_at TEXT NOT NULL)",
    "CREATE TABLE dpsub_stream_releases (step INTEGER PRIMARY KEY, basis BLOB NOT NULL, "
    "manifest TEXT NOT NULL)",
]


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
) -> StreamSettings:
    """Create a stream state file for ``horizon`` batches and the whole stream's budget.

    (ε, δ): the stream runs at the largest ρ whose CKS conversion at δ is within ε.
    (ρ, δ): ρ-zCDP, reported as (ε, δ)-DP with the CKS conversion at δ.
    """
    _check_settings(horizon, rank, clip_norm)
    parse_budget(epsilon, delta, rho)  # validates (InputError, exit 2)
    # rank < D is checked at each append, before any row is read: a named column may be a
    # vector column whose width only the footers tell.
    if Path(path).exists():
        raise InputError(f"stream state {path} already exists: choose a new path")
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
    conn, _ = _connect(path, create=True)
    try:
        with sqlite_transaction(conn, path, write=True) as execute:
            for statement in _SCHEMA:
                execute(statement)
            meta = {
                "application": APPLICATION,
                "schema_version": str(SCHEMA_VERSION),
                "settings": json.dumps(asdict(settings)),
            }
            for key, value in meta.items():
                execute("INSERT INTO dpsub_stream_meta (key, value) VALUES (?, ?)", (key, value))
    finally:
        conn.close()
    return settings


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

    def _aggregator(self, execute, step: int, dim: int, nodes: list[Node]) -> TreeAggregator:
        """The tree after ``step`` batches, holding only ``nodes`` (those that exist)."""
        sums = {}
        for level, idx in nodes:
            rows = execute(
                "SELECT noisy_sum FROM dpsub_stream_nodes WHERE level = ? AND idx = ?",
                (level, idx),
            )
            if rows:
                sums[(level, idx)] = decode_array(rows[0][0])
        s = self.settings
        return TreeAggregator(s.horizon, s.node_sigma, dim, step=step, sums=sums)

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

        Appending a batch id that is already in the stream releases that step again
        and changes nothing. The horizon is checked before any data is read.
        """
        started = time.monotonic()
        batch_id = check_run_id(batch_id) if batch_id else canonical_dataset(uri)
        batches = self.batches()
        seen = next((b for b in batches if b.batch_id == batch_id), None)
        if seen is not None:
            again = self.release(seen.step)
            return StreamRelease(again.step, again.basis, again.manifest, already_appended=True)
        s = self.settings
        step = len(batches)
        if step >= s.horizon:
            raise BudgetRefused(
                f"stream {self.path} has taken all {s.horizon} batches of its horizon and spent "
                f"its whole budget (rho={s.rho:.6g}): start a new stream with dpsub stream init"
            )
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
            needed = nodes_containing(batch.step, s.horizon) + prefix_nodes(batch.step)
            tree = self._aggregator(execute, step, dataset.dim, needed)
            touched = tree.add(summary.gram, noise_rng())
            values, basis = top_eigenvectors(tree.prefix(batch.step), s.rank)
            manifest = self._manifest(settings, batch, [*batches, batch], values, dataset.dim)
            manifest["timings"] = {"append_s": time.monotonic() - started}
            manifest["summary_bytes_gathered"] = summary.nbytes
            for level, idx in touched:
                execute(
                    "INSERT OR REPLACE INTO dpsub_stream_nodes (level, idx, noisy_sum) "
                    "VALUES (?, ?, ?)",
                    (level, idx, encode_array(tree.sums[(level, idx)])),
                )
            for level, idx in execute("SELECT level, idx FROM dpsub_stream_nodes"):
                if last_use((level, idx)) <= batch.step:  # no later release uses it
                    execute(
                        "DELETE FROM dpsub_stream_nodes WHERE level = ? AND idx = ?", (level, idx)
                    )
            execute(
                "INSERT INTO dpsub_stream_batches "
                "(step, batch_id, input, n_rows, charged_rho, appended_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                astuple(batch),
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
        return StreamRelease(batch.step, basis, manifest)


def _accountant(settings: StreamSettings, batches: list[StreamBatch]) -> Accountant:
    """Accountant of the whole stream's budget, charged with these appends (basic composition)."""
    accountant = Accountant(ZCDP(settings.rho, 0.0), conversion_delta=settings.conversion_delta)
    for batch in batches:
        accountant.charge(f"batch {batch.step}", ZCDP(batch.charged_rho, 0.0))
    return accountant


def open_stream(path: str) -> Stream:
    """Open an existing stream state file (InputError if missing, corrupt or foreign)."""
    return Stream(path)
