"""``dpsub stream``: online private PCA by tree aggregation (DTTZ14 §4; ALGORITHMS.md §8).

The stream's one method, ``online``, declared like every other: its parameter table (the
flags of ``dpsub stream init`` and the fields of :class:`~.config.StreamConfig`), its budget
plan (:func:`plan_shares`: the first batch's ``norm_bound``, ``mean`` and
``centred_norm_bound`` steps, then one ``batch 2^h`` step per tree level) and its runner
(:func:`init`, which creates the stream with that plan; each ``dpsub stream append`` then
releases the plan's steps as their batches arrive,
:func:`dpsub_dist.methods.stream.append_plan`).

Online private PCA (DTTZ14 §4; ALGORITHMS.md §8): a stream of batches, a basis after each.

A stream is created for a horizon of ``T`` batches with its whole privacy budget
(``dpsub stream init``; declared in :mod:`dpsub_dist.methods.stream`). Each append
(``dpsub stream append``, e.g. one day's partition) reads one batch on the workers,
subtracts the stream's mean ``μ̂`` (centred streams), clips every row to the stream's
norm bound ``B`` and scales it by ``1/B`` (:func:`dpsub_dist.engine.gram.clip_rows`),
reduces ``G_t = Σ aaᵀ`` to one d×d matrix on the workers
(:func:`dpsub_dist.engine.gram.compute_gram`), adds it to the tree of noisy node sums
(:class:`dpsub_dist.privacy.tree_aggregation.TreeAggregator`) and releases the top-k
eigenvectors of the noisy prefix sum: the principal subspace around ``μ̂`` (centred, the
default) or of the uncentred second moment (``--no-center``, as DTTZ14).

Privacy unit: a row, with neighbours that replace one row's values in one batch (batch
sizes are public). User-level privacy is not offered: a user's rows in different batches
could not be scaled jointly without keeping per-user state.

Budget plan (declared by the stream method, :func:`dpsub_dist.methods.stream.plan_shares`;
fixed at init, published in every manifest): gauss's shares for the first batch's steps, the
rest split evenly into one step ``batch 2^h`` per tree level ``h < L``:

1. ``norm_bound`` (no ``--clip-norm``): at the first append, a private bound on the first
   batch's raw rows (sparse vector over the public norm grid,
   :mod:`dpsub_dist.privacy.norm_bound`; quantile 0.99 when it only bounds the mean's rows,
   the noise-matched quantile of ``n₁``, D and the node σ when it is the tree's bound).
2. ``mean`` (centred): the Gaussian mean of the first batch's rows clipped to that bound
   (or to ``--clip-norm``), :func:`dpsub_dist.methods._centring.centre` — gauss's step.
3. ``centred_norm_bound`` (centred, no ``--clip-norm``): the private bound of the first
   batch's rows minus ``μ̂``, the bound every batch's centred rows are clipped to.
4. ``batch t`` for t = 1, 2, 4, …, 2^{L−1}: the tree's level log₂ t, whose nodes (each
   ``ρ_tree/L``-zCDP, :func:`~dpsub_dist.privacy.tree_aggregation.node_mechanism`) hold
   disjoint batches; charged when the worst-placed row (one of batch 1) enters the level's
   first node, which closes at append t; the level's later nodes draw again with the
   mechanism charged then (parallel composition), and other appends charge nothing.

Privacy argument. Steps 1–3 read the first batch's rows only, once, at its append; their
outputs ``B`` and ``μ̂`` are then stored in the stream file and published in every manifest,
fixed: for every later batch they are public constants, and the map ``x ↦ clip(x − μ̂, B)/B``
is applied row by row, so replacing one row of any batch moves one ``G_t`` by at most
``√2`` (upper triangle) exactly as with a public bound, and the tree's argument holds
unchanged. Under the stream's neighbour relation a row of batch 1 is read by steps 1–3 and
by at most L tree nodes; a row of a later batch by at most L tree nodes and by nothing
else. Adaptive basic composition (Bun & Steinke 2016, Lemma 2.3; the pure-ε sparse
vector counts as ε²/2-zCDP, Prop 1.4) gives the worst row ``ρ_norm + ρ_mean + ρ_centred +
ρ_tree = ρ``, the stream's whole budget: later batches' rows pay nothing for ``B`` and
``μ̂``, which never read them. Each append declares its part of the plan
(:func:`append_plan`) and releases its steps through its run context
(:meth:`~dpsub_dist.context.RunContext.release`: the mechanism charged is the one that draws).

Streams created before the plan (no ``center`` or ``shares`` in their settings) keep a
public bound and the uncentred second moment; their plan is the tree's steps alone.

Two files hold a stream, both created owner-only (0600):

- the **stream file** (SQLite, one transaction per append) holds the settings (with the
  first batch's released ``B`` and ``μ̂`` once appended), the noisy d×d sums of *closed*
  tree nodes that later releases still need, the appended batches (id, URI, row count,
  charge) and every released basis with its manifest (a batch that failed validation:
  its charge, and a manifest that says only that it failed, :meth:`Stream._record_failure`).
  It is covered by the stream's (ε, δ) claim, like the releases: every node sum in it was
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
import os
import secrets
from collections.abc import Callable
from dataclasses import asdict, astuple, dataclass, replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from dpsub_dist.context import RunContext, versions, width_failure
from dpsub_dist.diagnostics import private_phase
from dpsub_dist.engine.compute import IN_PROCESS, Executor
from dpsub_dist.engine.gram import compute_gram
from dpsub_dist.engine.sources import Dataset, Footers, parquet_dataset
from dpsub_dist.errors import BudgetRefused, DataError, InputError
from dpsub_dist.io.parquet import list_parquet_files
from dpsub_dist.io.storage import StorageOptions, filesystem, is_local, with_protocol
from dpsub_dist.ledger.core import (
    OUTCOME_FAILED,
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
from dpsub_dist.methods import _centring as centring
from dpsub_dist.methods._centring import MEAN_SHARE
from dpsub_dist.methods._norm_pass import NORM_SOURCE
from dpsub_dist.methods.gauss import NORM_SHARE
from dpsub_dist.methods.steps import Step
from dpsub_dist.methods.tables import HORIZON
from dpsub_dist.privacy import mechanism
from dpsub_dist.privacy.accountant import ZCDP, Accountant, ApproxDP, Budget, laplace_epsilon
from dpsub_dist.privacy.covariance_noise import SENSITIVITY
from dpsub_dist.privacy.norm_bound import (
    TooFewForBound,
    margined_quantile,
    noise_matched_quantile,
    norm_bound_mechanism,
)
from dpsub_dist.privacy.tree_aggregation import (
    REPLACE_ONE_SENSITIVITY,
    Node,
    TreeAggregator,
    last_use,
    node_mechanism,
    nodes_containing,
    prefix_nodes,
    release_node,
    rho_for_approx_dp,
    tree_levels,
)

APPLICATION = "dpsub_dist online PCA stream"
SCHEMA_VERSION = 3  # 2: closed nodes only in the stream file; 3: the budget plan in the settings
READABLE_SCHEMAS = ("2", "3")  # a version-2 stream opens and appends as before
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
    uri: str, storage_options: dict[str, Any] | None, executor: Executor
) -> list[BatchFile]:
    """The identities of a batch's files, listed on the driver and hashed on the workers."""
    storage_options = StorageOptions.wrap(storage_options)  # redacted in task keys and reprs
    names = list_parquet_files(uri, storage_options)
    return sorted(executor.map(file_identity, names, storage_options=storage_options))


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
    """What is fixed when a stream is created (all public), and what its first append fixes
    (``first_batch``: the released bound and mean, paid from the plan)."""

    horizon: int
    rank: int
    clip_norm: float | None  # public bound given at init; None: private, from batch 1
    budget: dict[str, float]  # as given: {epsilon, delta} or {rho, delta}
    rho: float  # the whole stream's zCDP budget
    conversion_delta: float  # δ of the reported (ε, δ)-DP guarantee
    levels: int
    node_sigma: float
    sensitivity: float
    created_at: str
    columns: list[str] | None = None  # fixed by init or by the first batch
    ledger: dict[str, Any] | None = None  # where the whole budget was charged; None: untracked
    center: bool = False  # streams made before centring: uncentred
    shares: dict[str, list[float]] | None = None  # the plan; None: the tree's steps alone
    tree_rho: float | None = None  # ρ of the tree's nodes together; None: the whole ρ
    first_batch: dict[str, Any] | None = None  # B, μ̂ and their facts, released at append 1

    @property
    def plan(self) -> dict[str, tuple[float, float]]:
        """The budget plan (older streams: the tree's ``batch 2^h`` steps alone)."""
        if self.shares is None:
            return tree_steps(1.0, self.levels)
        return {step: (p, q) for step, (p, q) in self.shares.items()}

    @property
    def tree_total(self) -> float:
        return self.rho if self.tree_rho is None else self.tree_rho

    @property
    def fixed(self) -> dict[str, Any]:
        """The released bound and mean every batch after the first is read with."""
        if self.first_batch is not None:
            return self.first_batch
        return {"row_norm": self.clip_norm, "row_norm_source": PUBLIC_BOUND, "center": False}


PUBLIC_BOUND = "public (--clip-norm)"


def bound_and_centre(settings: StreamSettings) -> dict[str, Any]:
    """The bound B and the centre μ̂ every batch is read with, summarised for ``stream show``:
    values released by the first append (and paid for there) or public settings, so showing
    them costs nothing. ``row_norm`` (or ``mean_norm``) is None until the first append releases
    it; old stream files (no first-batch values) have their public ``--clip-norm`` and no
    centring."""
    fixed = settings.first_batch
    if fixed is None:  # nothing appended yet, or a stream file from before the first batch's
        bound, center, mean = settings.clip_norm, settings.center, None
        public = bound is not None
    else:
        bound, center, mean = fixed["row_norm"], bool(fixed.get("center")), fixed.get("mean")
        public = fixed["row_norm_source"] == PUBLIC_BOUND
    return {
        "row_norm": bound,
        "row_norm_source": PUBLIC_BOUND if public else "private, from the first batch",
        "center": center,
        "mean_norm": None if mean is None else float(np.linalg.norm(mean)),
        "mean_dim": None if mean is None else len(mean),
    }


def describe_bound_and_centre(shown: dict[str, Any]) -> list[str]:
    """:func:`bound_and_centre` as the lines of ``stream show``."""
    bound = shown["row_norm"]
    lines = [
        f"row-norm bound B = {bound:.6g}, {shown['row_norm_source']}"
        if bound is not None
        else "row-norm bound B: private, released by the first append (none yet)"
    ]
    if not shown["center"]:
        lines.append("uncentred: rows are read as they are (no mean subtracted)")
    elif shown["mean_norm"] is None:
        lines.append("centred: the private mean μ̂ is released by the first append (none yet)")
    else:
        lines.append(
            f"centred at the first batch's private mean μ̂: ‖μ̂‖ = {shown['mean_norm']:.6g}, "
            f"{shown['mean_dim']} dimensions (in full: --json)"
        )
    return lines


def level_step(level: int) -> str:
    """The step of the tree's level h: ``batch 2^h``, charged at the append that closes the
    level's first node (the one holding batch 1)."""
    return f"batch {1 << level}"


def tree_steps(share: float, levels: int) -> dict[str, tuple[float, float]]:
    """The tree's steps: ``batch 2^h`` for each level h < L, ``share/L`` each (no δ)."""
    return {level_step(h): (share / levels, 0.0) for h in range(levels)}


def resolve_center(config: Any) -> bool:
    """``--center``/``--no-center`` as given; on by default."""
    return True if config.center is None else bool(config.center)


FIRST_BATCH_STEPS = (Step.NORM_BOUND, Step.MEAN, Step.CENTRED_NORM_BOUND)


def step_mechanism(settings: StreamSettings, step: str, grant: Budget) -> mechanism.Mechanism:
    """The mechanism of each planned step: the one its append releases (charges and draws
    with), and the one an earlier append's charge is counted with (:func:`_accountant`)."""
    if step in (Step.NORM_BOUND, Step.CENTRED_NORM_BOUND):
        return norm_bound_mechanism(grant)
    if step == Step.MEAN:
        return mechanism.gaussian(grant, SENSITIVITY["replace"].row_sum)
    return node_mechanism(settings.tree_total, settings.horizon)


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


def init_stream(path: str, config: Any, shares: dict[str, tuple[float, float]]) -> StreamSettings:
    """Create a stream's two files (0600) for ``config.horizon`` batches and its whole budget,
    split by ``shares``, the plan the stream method declares
    (:func:`dpsub_dist.methods.stream.plan_shares`).

    ``config`` is a checked :class:`~dpsub_dist.params.StreamConfig` (read by
    attribute; :func:`dpsub_dist.job.init_stream` checks it against the method's table).
    (ε, δ): the stream runs at the largest ρ whose CKS conversion at δ is within ε.
    (ρ, δ): ρ-zCDP, reported as (ε, δ)-DP with the CKS conversion at δ.
    ``ledger`` and ``dataset``: the whole budget — (ε, δ), or (ρ, δ₀ = 0) — is reserved
    and published at once against the dataset's row-level grant before any file is made
    (LedgerError, exit 2: no grant; BudgetRefused, exit 4: not enough left). Without them
    the stream is not tracked by any ledger.
    """
    epsilon, delta, rho = config.epsilon, config.delta, config.rho
    horizon, ledger, dataset = int(config.horizon), config.ledger, config.dataset
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
    grants = Accountant(ZCDP(float(total_rho), 0.0), conversion_delta=float(delta)).split(shares)
    levels = tree_levels(horizon)
    tree_rho = grants["batch 1"].rho * levels
    settings = StreamSettings(
        horizon=horizon,
        rank=int(config.rank),
        clip_norm=None if config.clip_norm is None else float(config.clip_norm),
        budget={**{k: float(v) for k, v in values.items()}, "delta": float(delta)},
        rho=float(total_rho),
        conversion_delta=float(delta),
        levels=levels,
        node_sigma=node_mechanism(tree_rho, horizon, REPLACE_ONE_SENSITIVITY).sigma,
        sensitivity=REPLACE_ONE_SENSITIVITY,
        created_at=now_utc(),
        columns=list(config.columns) if config.columns else None,
        center=resolve_center(config),
        shares={step: [p, q] for step, (p, q) in shares.items()},
        tree_rho=tree_rho,
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
        if meta.get("schema_version") not in READABLE_SCHEMAS:
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
        return TreeAggregator(s.horizon, dim, step, closed, partial)

    def accountant(self) -> Accountant:
        """The stream's accountant, charged with every append so far."""
        return _accountant(self.settings, len(self.batches()))[0]

    def status(self) -> dict[str, Any]:
        """Public facts: settings, progress, budget report and the appended batches."""
        batches = self.batches()
        return {
            "state": self.path,
            "step": len(batches),
            "settings": asdict(self.settings),
            "budget": self.accountant().report(),
            "bound_and_centre": bound_and_centre(self.settings),
            "batches": [asdict(b) for b in batches],
        }

    def release(self, step: int) -> StreamRelease:
        """What was released after ``step`` batches: a basis, or a failed append's record (its
        manifest's outcome says so, its basis is empty)."""
        with sqlite_transaction(self._conn, self.path, write=False) as execute:
            latest = execute("SELECT COUNT(*) FROM dpsub_stream_batches")[0][0]
            rows = execute(
                "SELECT basis, manifest FROM dpsub_stream_releases WHERE step = ?", (step,)
            )
        if not rows:
            raise InputError(
                f"stream {self.path} has {latest} batches: nothing was released at step {step}"
            )
        return StreamRelease(step, decode_array(rows[0][0]), json.loads(rows[0][1]))

    def latest_release(self) -> StreamRelease | None:
        """The latest basis released (None while no append has succeeded)."""
        with sqlite_transaction(self._conn, self.path, write=False) as execute:
            rows = execute(
                "SELECT step FROM dpsub_stream_releases "
                "WHERE COALESCE(json_extract(manifest, '$.outcome'), 'ok') = 'ok' "
                "ORDER BY step DESC LIMIT 1"
            )
        return self.release(rows[0][0]) if rows else None

    @staticmethod
    def _manifest(
        s: StreamSettings,
        batch: StreamBatch,
        accountant: Accountant,
        values: np.ndarray,
        dim: int,
        rows_so_far: int,
    ) -> dict[str, Any]:
        """The manifest of the release after ``batch`` (public facts and released values)."""
        columns = s.columns or []
        fixed = s.fixed
        released = {k: v for k, v in fixed.items() if k in MEAN_RELEASE}
        centred = {k: v for k, v in fixed.items() if k not in MEAN_RELEASE}
        scaling = "each row clipped to norm ≤ row_norm, then divided by row_norm"
        if fixed.get("center"):
            scaling = "the released mean subtracted from each row, then " + scaling
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
                "rows_so_far": rows_so_far,
                "nodes_released": [list(n) for n in prefix_nodes(batch.step)],
            },
            "parameters": {
                "clip_norm": s.clip_norm,
                **centred,
                "row_scaling": scaling,
                "budget_shares": s.plan,
                "levels": s.levels,
                "tree_rho": s.tree_total,
                "node_sigma": s.node_sigma,
            },
            "release": {"eigenvalues": [float(v) for v in values], **released},
            "privacy": {
                "unit": "row",
                "neighbours": "replace one row's values in one batch (batch sizes are public)",
                "mechanism": "the first batch's private norm bound and mean (when not given "
                "or turned off), then tree aggregation (binary mechanism) of the clipped "
                "Σ aaᵀ, symmetric Gaussian noise per node with tree_rho/L (DTTZ14 §4)",
                "sensitivity": s.sensitivity,
                "budget": accountant.report(),
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
        noise_seed: int | None = None,
        footers: Footers | None = None,
    ) -> StreamRelease:
        """Read one batch on the workers, add its noisy contribution, release the new basis.

        Appending a batch id that is already in the stream, from the same paths, releases that step
        again and changes nothing (or fails again, if it failed); the files' bytes are not compared
        (that would tell, free, whether a guessed file is the batch). Before any row is read
        (InputError, exit 2, nothing charged): a batch outside the ledger's dataset, a batch id
        reused for other files, the horizon (BudgetRefused, exit 4), a stream whose first batch
        failed, a file already in the stream (by real path) or twice in this batch, and what the
        footers tell (columns, a schema width against the rank). From the first row read on, data
        that fails validation (a variable list's width, nulls, NaN, a file whose bytes are already
        in the stream) raises :class:`DataError`, and any other error
        :class:`~dpsub_dist.errors.RunFailed` (:func:`private_phase`), after :meth:`_record_failure`
        took its step and charged it.

        The append's private steps run in its :class:`~dpsub_dist.context.RunContext`
        (:func:`append_context`). ``noise_seed`` is a *private* seed for their noise, as
        :func:`~dpsub_dist.job.run_estimate` takes a ledger run record's (tests pin releases
        with it); no user flag sets it. None: a fresh one. ``footers``: the batch's, already
        read (:func:`~dpsub_dist.engine.cluster.batch_place`), so they are not read again.
        """
        batch_id = check_run_id(batch_id) if batch_id else canonical_dataset(uri)
        executor = Executor(client)
        s = self.settings
        self._check_in_dataset(uri)
        batches = self.batches()
        seen = next((b for b in batches if b.batch_id == batch_id), None)
        known = self._files()
        if seen is not None:  # decided by the id and the paths: never by the files' bytes
            if _paths(known.get(seen.step, [])) != _paths(
                batch_files(uri, storage_options, executor)
            ):
                raise InputError(
                    f"batch id {batch_id} was appended at step {seen.step} from other files: "
                    "give this batch its own --batch-id"
                )
            again = self.release(seen.step)
            if again.manifest["outcome"] != "ok":
                raise DataError(
                    f"batch id {batch_id} already failed at step {seen.step} after reading its "
                    "data (the detail is in that append's diagnostics file)"
                )
            return StreamRelease(again.step, again.basis, again.manifest, already_appended=True)
        step = len(batches)
        if step >= s.horizon:
            raise BudgetRefused(
                f"stream {self.path} has taken all {s.horizon} batches of its horizon and spent "
                f"its whole budget (rho={s.rho:.6g}): start a new stream with dpsub stream init"
            )
        earlier = self.latest_release()
        if batches and earlier is None:
            raise InputError(
                f"the first batch of stream {self.path} failed validation; the first batch fixes "
                "what every batch is read with (its width, the private bound and mean), so the "
                "stream takes no more batches: start a new stream with dpsub stream init"
            )
        files = batch_files(uri, storage_options, executor)
        ids = {b.step: b.batch_id for b in batches}
        _check_new_paths(uri, files, known, ids)
        try:  # from the first row read on, any failure is published as such and charged
            with private_phase("stream append"):  # an unexpected error: RunFailed
                dataset = parquet_dataset(
                    uri, s.columns, None, storage_options or {}, executor, footers=footers
                )
                if s.rank >= dataset.dim:
                    raise width_failure(
                        dataset,
                        f"rank {s.rank} must be smaller than the number of features ({dataset.dim})"
                        ": pass more columns at stream init",
                    )
                before = dataset.dim if earlier is None else earlier.basis.shape[0]
                if before != dataset.dim:
                    raise width_failure(
                        dataset,
                        f"{uri} has {dataset.dim} features but the stream's earlier batches have "
                        f"{before}: vector columns must keep their width across batches",
                    )
                ctx = append_context(s, step + 1, dataset, executor, progress, noise_seed)
                if step == 0:  # public refusals (row count, width) before the bytes are compared
                    first_batch_quantile(s, dataset, ctx.grants)
                _check_new_contents(uri, files, known, ids)
                spent_before = ctx.accountant.spent.rho
                settings = s if s.columns is not None else replace(s, columns=list(dataset.columns))
                if step == 0:
                    fixed = first_batch(ctx, s)
                    settings = replace(settings, first_batch=fixed)
                else:
                    fixed = s.fixed
                loader = batch_loader(fixed, dataset)
                summary = compute_gram(
                    dataset.parts, loader, fixed["row_norm"], executor=executor, progress=progress
                )
                with sqlite_transaction(self._conn, self.path, write=True) as execute:
                    self._check_unchanged(execute, step, batch_id)
                    tree = self._aggregator(execute, step, dataset.dim)
                    closed = tree.add(summary.gram, noised_nodes(ctx, s))
                    ctx.check_charged()
                    charge = ctx.accountant.spent.rho - spent_before
                    batch = StreamBatch(
                        step + 1, batch_id, uri, int(dataset.n_rows), charge, now_utc()
                    )
                    values, basis = top_eigenvectors(tree.prefix(batch.step), s.rank)
                    rows = sum(b.n_rows for b in batches) + batch.n_rows
                    manifest = self._manifest(
                        settings, batch, ctx.accountant, values, dataset.dim, rows
                    )
                    manifest["summary_bytes_gathered"] = summary.nbytes
                    self._store_tree(execute, tree, closed)
                    self._insert_batch(execute, batch, files, basis, manifest)
                    if settings is not s:
                        execute(
                            "UPDATE dpsub_stream_meta SET value = ? WHERE key = 'settings'",
                            (json.dumps(asdict(settings)),),
                        )
        except DataError:
            self._record_failure(step, batch_id, uri, files, earlier, noise_seed)
            raise
        self.settings = settings
        return StreamRelease(batch.step, basis, manifest, charged_rho=charge)

    def _record_failure(
        self,
        step: int,
        batch_id: str,
        uri: str,
        files: list[BatchFile],
        earlier: StreamRelease | None,
        noise_seed: int | None,
    ) -> None:
        """Take step ``step + 1`` for a batch whose data failed validation, charged as the
        append would have been (a data-dependent failure is never a free retry): its files
        enter the stream (no row of them is summed), the tree adds a zero matrix so its nodes
        close on schedule, with their noise, the append's other steps are forgone (charged,
        nothing drawn: :meth:`~dpsub_dist.context.RunContext.forgo`), and the release says only
        that it failed. A failed first batch fixes no width, bound or mean: the stream takes no
        more batches (its tree is never read, so its nodes draw nothing)."""
        s = self.settings
        ctx = append_context(s, step + 1, None, IN_PROCESS, False, noise_seed)
        before = ctx.accountant.spent.rho
        with sqlite_transaction(self._conn, self.path, write=True) as execute:
            self._check_unchanged(execute, step, batch_id)
            if earlier is not None:
                dim = earlier.basis.shape[0]
                tree = self._aggregator(execute, step, dim)
                closed = tree.add(np.zeros((dim, dim)), noised_nodes(ctx, s))
                self._store_tree(execute, tree, closed)
            for name in ctx.shares:
                if name not in ctx.charged:
                    ctx.forgo(name, step_mechanism(s, name, ctx.grant(name)))
            ctx.check_charged()
            charge = ctx.accountant.spent.rho - before
            batch = StreamBatch(step + 1, batch_id, uri, 0, charge, now_utc())
            manifest = {
                "outcome": OUTCOME_FAILED,
                "method": "online",
                "input": uri,
                "n_rows_note": "no row of this batch entered the stream",
                "stream": {"step": batch.step, "horizon": s.horizon, "batch_id": batch_id},
                "privacy": {"budget": ctx.accountant.report(), "ledger": s.ledger or UNTRACKED},
                "versions": versions(),
            }
            self._insert_batch(execute, batch, files, np.zeros((0, s.rank)), manifest)

    def _check_unchanged(self, execute, step: int, batch_id: str) -> None:
        """Refuse to write step ``step + 1`` if another append took a step meanwhile."""
        now = execute("SELECT COUNT(*) FROM dpsub_stream_batches")[0][0]
        if now != step or execute(
            "SELECT 1 FROM dpsub_stream_batches WHERE batch_id = ?", (batch_id,)
        ):
            raise LedgerUnavailable(
                f"another append changed stream {self.path} while this batch was read; "
                "nothing was added: run this append again"
            )

    @staticmethod
    def _insert_batch(
        execute, batch: StreamBatch, files: list[BatchFile], basis: np.ndarray, manifest: dict
    ) -> None:
        """Record an append: the batch, its files (operator-only) and its release."""
        execute(
            "INSERT INTO dpsub_stream_batches "
            "(step, batch_id, input, n_rows, charged_rho, appended_at) VALUES (?, ?, ?, ?, ?, ?)",
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


def _paths(files: list[BatchFile]) -> list[str]:
    """A batch's real paths, in order: what a re-append is compared by. Comparing bytes too
    would answer, for free, whether a guessed file equals the batch appended (its rows)."""
    return [f.path for f in files]


def _check_new_paths(
    uri: str, files: list[BatchFile], known: dict[int, list[BatchFile]], ids: dict[int, str]
) -> None:
    """Refuse a file already in the stream or twice in this batch by its real path (public:
    exit 2, nothing read or charged): its rows would enter the tree twice."""
    for step, earlier in sorted(known.items()):
        paths = {f.path for f in earlier}
        for file in files:
            if file.path in paths:
                raise InputError(
                    f"{file.path} (in {uri}) is already in this stream (batch id {ids[step]}, "
                    f"step {step}): a row may enter a stream once; nothing was read or charged"
                )
    for one, other in zip(files, files[1:], strict=False):
        if one.path == other.path:
            raise InputError(
                f"{one.path} is twice in this batch ({uri}), e.g. through a symlink: "
                "a row may enter a stream once; nothing was read or charged"
            )


def _check_new_contents(
    uri: str, files: list[BatchFile], known: dict[int, list[BatchFile]], ids: dict[int, str]
) -> None:
    """Refuse a file whose bytes (size and ETag/SHA-256) are already in the stream or twice in
    this batch. Whether two files' bytes match depends on their rows, so this is a
    :class:`DataError`: published as a failure and charged, or comparing a guessed file with
    an earlier batch would be a free probe of its rows."""
    earlier = {(f.size, f.content): step for step, fs in known.items() for f in fs}
    for file in files:
        if (file.size, file.content) in earlier:
            step = earlier[(file.size, file.content)]
            raise DataError(
                f"{file.path} (in {uri}) has the same bytes as a file of batch id {ids[step]} "
                f"(step {step}): a row may enter a stream once"
            )
    contents = [(f.size, f.content) for f in files]
    if len(set(contents)) != len(contents):
        raise DataError(f"{uri} holds two files with the same bytes: a row may enter a stream once")


def _accountant(settings: StreamSettings, appends: int) -> tuple[Accountant, dict[str, Budget]]:
    """The stream's accountant under its plan (basic composition), counting the steps of its
    first ``appends`` appends, each with the mechanism its append released; the grants."""
    accountant = Accountant(ZCDP(settings.rho, 0.0), conversion_delta=settings.conversion_delta)
    grants = accountant.split(settings.plan)
    for t in range(1, appends + 1):
        for step in append_plan(settings, t):
            accountant.charge(step, step_mechanism(settings, step, grants[step]))
    return accountant, grants


def append_plan(settings: StreamSettings, t: int) -> dict[str, tuple[float, float]]:
    """The part of the stream's plan append ``t`` declares and releases: the first batch's
    private bound and mean (t = 1), then ``batch t`` when t = 2^h (batch 1's rows enter
    their next node: the first node of level h closes)."""
    steps = [*FIRST_BATCH_STEPS, "batch 1"] if t == 1 else [f"batch {t}"]
    return {step: share for step, share in settings.plan.items() if step in steps}


def append_context(
    settings: StreamSettings,
    t: int,
    dataset: Dataset | None,
    executor: Executor,
    progress: bool,
    noise_seed: int | None,
) -> RunContext:
    """Append ``t``'s run context: the stream's accountant counting appends 1…t−1 (their
    noise was drawn then), resumed with this append's part of the plan (:func:`append_plan`)
    declared; ``dataset`` is its batch (None: a failed batch, no row read)."""
    options = SimpleNamespace(
        center=settings.center, row_norm=settings.clip_norm, unit_column=None, method="online"
    )
    ctx = RunContext(options, dataset, executor, progress, noise_seed)
    ctx.resume(*_accountant(settings, t - 1), append_plan(settings, t))
    return ctx


def noised_nodes(
    ctx: RunContext, settings: StreamSettings
) -> Callable[[Node, np.ndarray], np.ndarray]:
    """How an append noises the tree's nodes it closes (:meth:`TreeAggregator.add`): each as
    the step of its level, ``batch 2^h``, with that step's mechanism. The level's first node
    (index 0, holding batch 1) releases the step: charged, then drawn. Its later nodes hold
    later batches only, one node per row (parallel composition), so they draw again with the
    mechanism charged then (:meth:`~dpsub_dist.context.RunContext.redraw`), charging nothing."""

    def noised(node: Node, exact: np.ndarray) -> np.ndarray:
        step = level_step(node[0])
        release = ctx.release if node[1] == 0 else ctx.redraw
        return release(
            step, step_mechanism(settings, step, ctx.grant(step)), partial(release_node, exact)
        )

    return noised


MEAN_RELEASE = ("mean", "mean_note", "mean_sensitivity", "mean_noise_sigma")
"""The first batch's released mean: published under ``release`` in every manifest."""


def first_batch(ctx: RunContext, settings: StreamSettings) -> dict[str, Any]:
    """Steps ``norm_bound``, ``mean`` and ``centred_norm_bound`` on the first batch's rows
    (``ctx.dataset``; module docstring): the bound ``B`` and the mean ``μ̂`` every batch is
    read with, each released through ``ctx``. Public from then on (stream file, manifests).
    Reads the first batch only; a stream with a public bound and no centring reads nothing
    here."""
    dataset = ctx.dataset
    private_norm = settings.clip_norm is None
    step = Step.CENTRED_NORM_BOUND if settings.center else Step.NORM_BOUND
    quantile = first_batch_quantile(settings, dataset, ctx.grants)
    loader, centred, mean_release = centring.centre(ctx)
    if private_norm:
        bound = centring.private_bound(ctx, step, dataset, loader, quantile)
        source = NORM_SOURCE.format(q=quantile, step=step) + ", n of the first batch"
        source += ", its rows centred at the mean" if settings.center else ""
    else:
        bound, source = float(settings.clip_norm), PUBLIC_BOUND
    fixed = {"row_norm": bound, "row_norm_source": source, **centred, **mean_release}
    if settings.center:
        fixed["mean_n_rows"] = int(dataset.n_rows)
        if not private_norm:
            fixed["mean_row_norm_source"] = PUBLIC_BOUND
    return fixed


def first_batch_quantile(
    settings: StreamSettings, dataset: Dataset, grants: dict[str, Budget]
) -> float | None:
    """The quantile the first batch's private bound is taken at (None: a public bound), after
    refusing a first batch too small for its mean or bound. From the public row count and
    width alone, so before any row is read (InputError, exit 2, free) unless a variable
    list's row gave the width (:func:`~dpsub_dist.context.width_failure`)."""
    private_norm = settings.clip_norm is None
    if dataset.n_rows < 1 and (settings.center or private_norm):
        raise InputError(
            f"{dataset.input} has no rows: the first batch fixes the stream's private mean and "
            "norm bound from the public row count, so it needs at least one row"
        )
    if not private_norm:
        return None
    epsilon = laplace_epsilon(
        grants[Step.CENTRED_NORM_BOUND if settings.center else Step.NORM_BOUND]
    )
    quantile = noise_matched_quantile(dataset.n_rows, dataset.dim, settings.node_sigma, epsilon)
    try:
        return margined_quantile(quantile, dataset.n_rows, epsilon, "rows")
    except TooFewForBound as err:
        raise width_failure(dataset, f"the first batch: {err}") from None


def batch_loader(fixed: dict[str, Any], dataset: Dataset) -> Any:
    """The loader of a batch's rows as the tree reads them: minus ``μ̂`` when centred."""
    if not fixed.get("center"):
        return dataset.loader
    return centring.CentredLoader(dataset.loader, np.asarray(fixed["mean"], dtype=np.float64))


def open_stream(path: str) -> Stream:
    """Open an existing stream state file (InputError if missing, corrupt or foreign)."""
    return Stream(path)


def check_stream(config: Any) -> None:
    """A horizon is required; the ledger and its dataset go together."""
    if config.horizon is None:
        HORIZON.typed(config.horizon, HORIZON.flag)
    if (config.ledger is None) != (config.dataset is None):
        raise InputError(
            "--dataset needs --ledger (and --ledger needs --dataset): pass both to charge the "
            "stream's whole budget to the dataset's grant, or neither for an untracked stream"
        )


def plan_shares(config: Any) -> dict[str, tuple[float, float]]:
    """The stream's plan, all of ρ (zCDP: no δ share). Without ``--clip-norm``,
    :data:`NORM_SHARE` for the first batch's private bound (halved between the raw rows'
    ``norm_bound``, for the mean, and the centred rows' ``centred_norm_bound`` when centred);
    centred, ``mean`` takes :data:`MEAN_SHARE` of the rest (gauss's shares); the tree takes
    what is left, evenly over its L levels (``batch 2^h``, :func:`tree_steps`)."""
    centred = resolve_center(config)
    norm = NORM_SHARE if config.clip_norm is None else 0.0
    first: dict[str, tuple[float, float]] = {}
    if norm:
        first[Step.NORM_BOUND] = (norm / 2 if centred else norm, 0.0)
    if centred:
        first[Step.MEAN] = (MEAN_SHARE * (1.0 - norm), 0.0)
    if norm and centred:
        first[Step.CENTRED_NORM_BOUND] = (norm / 2, 0.0)
    tree = (1.0 - MEAN_SHARE if centred else 1.0) * (1.0 - norm)
    return {**first, **tree_steps(tree, tree_levels(config.horizon))}


def init(path: str, config: Any) -> StreamSettings:
    """Create the stream at ``path`` with the plan declared here
    (:func:`init_stream`)."""
    return init_stream(path, config, plan_shares(config))
