"""Parquet datasets with a known principal subspace (BENCHMARKS.md §1, ALGORITHMS.md §9).

``generate`` writes ``OUT/part-00000.parquet ...`` (columns ``x0..x{dim-1}``) one partition
at a time, so memory stays bounded by one row group whatever ``rows`` is, and the truth
(never read by the estimators) to ``OUT/_truth/``. With ``vector_column=True`` (CLI
``--vector-column``) the features are instead one column ``x`` of type
``fixed_size_list<float32|float64>[dim]`` (the usual layout of embeddings, and the fast one
at large ``dim``: one column chunk per row group instead of ``dim``); rows, values, files,
row groups and truth are the same as in the scalar layout, only ``params.json`` records
``"layout": "vector"`` and ``"columns": "x[0..dim-1]"``.

- ``basis.npy``: the true basis ``U`` (``dim × rank``, float64, orthonormal columns); with
  ``clusters=K`` instead ``basis_0.npy .. basis_{K-1}.npy`` and ``bases.npy`` (``K × dim × rank``);
- ``params.json``: every parameter, the resolved partition sizes and derived constants;
- ``outliers.npy`` (only when ``outlier_fraction > 0``): sorted global indices of outlier rows;
- ``labels.npy`` (only with ``clusters``): int32 cluster of each row, ``-1`` for outliers.

Models (row ``x ∈ R^dim``, ``U`` the true basis, ``k = rank``):

- ``gaussian`` (SS21 Thm 1.2): ``x = U z + e``, ``z ~ N(0, I_k)``,
  ``e ~ N(0, γ² (I − UUᵀ))`` (isotropic noise with its ``U`` component removed, per chunk as
  ``e − U(Uᵀe)``; no ``dim × dim`` matrix is formed). Population covariance has eigenvalues
  ``1`` (×k) and ``γ²`` (×(dim−k)): multiplicative gap ``λ_{k+1}/λ_k = γ²``.
- ``sphere`` (T24 §6): ``x = U u/‖u‖ + e``, ``u ~ N(0, I_k)``, ``e ~ N(0, γ² I)`` isotropic.
- ``exact``: ``x = U z``, ``z ~ N(0, I_k)`` (``γ`` is ignored): rank exactly ``k``, points in
  general position on the subspace (with ``order="random"``).
- ``polynomial`` (wide data without a gap, docs/power.md): ``x ~ N(0, Σ)`` with
  ``Σ = W diag(λ) Wᵀ``, ``λ_i = i^(−decay)`` for ``i = 1 … dim`` (no multiplicative gap;
  ``γ`` is ignored). ``W = C S P`` with ``C`` the orthonormal DCT-II, ``S`` random signs and
  ``P`` a random permutation (from the seed): orthogonal and applied in ``O(dim log dim)`` per
  row, so ``dim = 10⁵`` needs no ``dim × dim`` matrix. The truth ``U`` is the top-``rank``
  eigenvectors of ``Σ`` (the first ``rank`` columns of ``W``); ``_truth/spectrum.npy`` holds
  ``λ``. Random order only, no clusters.

``order="adversarial"`` (T24 §2.1): with ``B = ceil(rows / (4·K·k))`` (``K = clusters`` or 1),
global row ``r`` belongs to block ``b = r // B``; the block's cluster is ``c = b mod K`` and its
direction ``j = (b // K) mod k``. The row is generated as above but with ``z`` (or ``u``)
zeroed except coordinate ``j``, so every block lies along the single direction ``U_c[:, j]``
(plus noise); round-robin, each (cluster, direction) pair gets about 4 blocks. A contiguous
run of at most ``B`` rows touches at most two blocks, hence at most two directions, so
contiguous subsets miss most of the subspace; a random subset of rows does not.

``outlier_fraction=f``: exactly ``round(f·rows)`` rows, at uniformly random positions (split
over partitions by a multivariate hypergeometric draw, then uniform within each), are
replaced by ``s·v`` with ``v`` uniform on the unit sphere of ``R^dim`` and
``s = 1000 × typical norm`` of an inlier row (``sqrt(k + γ²(dim−k))`` gaussian,
``sqrt(1 + γ²·dim)`` sphere, ``sqrt(k)`` exact); ``s`` is in ``params.json``.

``clusters=K`` (WWS15): ``K`` independent uniformly random rank-``k`` subspaces; each row
picks its cluster uniformly at random (or by block with ``order="adversarial"``) and is drawn
from the model with that cluster's basis (gaussian noise is removed along that basis only).

Determinism: the basis comes from ``SeedSequence(seed, spawn_key=(0,))``, the outlier split
from ``spawn_key=(1,)``, partition ``i`` from ``spawn_key=(2, i)``; chunk sizes depend only
on the parameters, so the same parameters give the same bytes on any machine (for a given
NumPy version, recorded in ``params.json``). Row groups hold ``row_group_size`` rows, fewer
only when one row group would exceed 256 MiB (very wide data).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpsub_dist.errors import InputError
from dpsub_dist.io.output import Written, check_replaceable

__all__ = [
    "SynthExistsError",
    "SynthParameterError",
    "SynthResult",
    "generate",
    "read_truth",
]

MODELS = ("gaussian", "sphere", "exact", "polynomial")
ORDERS = ("random", "adversarial")
DTYPES = ("float32", "float64")
FORMAT_VERSION = 1
OUTLIER_SCALE = 1000.0  # outlier norm, in multiples of a typical inlier norm

_TARGET_ROWS_PER_FILE = 1_000_000
_TARGET_BYTES_PER_FILE = 128 * 2**20
_MAX_ROW_GROUP_BYTES = 256 * 2**20  # cap on one row group buffer (output dtype)
_MAX_CHUNK_BYTES = 16 * 2**20  # cap on the generation temporaries


GENERATOR = "dpsub_dist.synth"
"""``_truth/params.json``'s ``generator``: how ``overwrite`` knows a folder synth wrote."""


def _is_synth_params(data: bytes | None) -> bool:
    try:
        params = json.loads(data or b"")
    except ValueError:
        return False
    return isinstance(params, dict) and params.get("generator") == GENERATOR


SYNTH_OUTPUT = Written("dpsub synth folder", "_truth/params.json", _is_synth_params)


class SynthParameterError(InputError, ValueError):
    """A ``generate`` parameter is out of range (a ``ValueError``; CLI exit 2)."""


class SynthExistsError(InputError, FileExistsError):
    """The output folder exists and is not empty (a ``FileExistsError``; CLI exit 2)."""


@dataclass(frozen=True)
class SynthResult:
    """What ``generate`` wrote: the dataset folder, its files and where the truth is."""

    path: Path
    rows: int
    dim: int
    rank: int
    files: tuple[Path, ...]
    truth_dir: Path
    params_path: Path
    basis_paths: tuple[Path, ...]  # basis.npy, or basis_0.npy.. with clusters
    bases_path: Path | None = None  # K × dim × rank stack, only with clusters
    clusters: int | None = None
    params: dict[str, Any] = field(default_factory=dict, repr=False)

    def load_basis(self) -> np.ndarray:
        """The true basis (``dim × rank``), or the ``K × dim × rank`` stack with clusters."""
        return read_truth(self.path)[0]


def read_truth(path: str | Path) -> tuple[np.ndarray, dict[str, Any]]:
    """Read ``(basis, params)`` of a generated dataset; basis is ``K × dim × rank`` if clustered."""
    truth = Path(path) / "_truth"
    params = json.loads((truth / "params.json").read_text())
    name = "bases.npy" if params.get("clusters") else "basis.npy"
    return np.load(truth / name), params


# --------------------------------------------------------------------------- validation


def _fail(name: str, accepted: str, value: Any) -> SynthParameterError:
    return SynthParameterError(f"{name} must be {accepted}, got {value!r}")


def _int(name: str, value: Any, lo: int, hi: int | None, accepted: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise _fail(name, accepted, value)
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise _fail(name, accepted, value)
    return value


def _float(name: str, value: Any, ok: Callable[[float], bool], accepted: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise _fail(name, accepted, value)
    value = float(value)
    if not math.isfinite(value) or not ok(value):
        raise _fail(name, accepted, value)
    return value


def _choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise _fail(name, "one of " + ", ".join(repr(o) for o in options), value)
    return value


def default_partitions(rows: int, dim: int, dtype: str) -> int:
    """Files of about 1,000,000 rows or 128 MiB, whichever holds fewer rows (at least 1)."""
    row_bytes = dim * np.dtype(dtype).itemsize
    per_file = max(1, min(_TARGET_ROWS_PER_FILE, _TARGET_BYTES_PER_FILE // row_bytes))
    return max(1, min(rows, -(-rows // per_file)))


# --------------------------------------------------------------------------- generation


@dataclass(frozen=True)
class _Plan:
    rows: int
    dim: int
    rank: int
    gamma: float
    model: str
    adversarial: bool
    n_clusters: int  # 1 without clusters
    block: int  # adversarial block size (rows)
    dtype: np.dtype
    row_group_rows: int
    chunk_rows: int
    outlier_scale: float
    bases: np.ndarray  # K × dim × rank in the generation dtype
    scales: np.ndarray | None = None  # polynomial: s_j·√λ of coordinate j before the DCT


def _polynomial_spectrum(dim: int, decay: float) -> np.ndarray:
    """``λ_i = i^(−decay)``, i = 1 … dim (descending)."""
    return np.arange(1, dim + 1, dtype=np.float64) ** -decay


def _polynomial_basis(
    rng: np.random.Generator, dim: int, rank: int, decay: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(U, scales)``: the top-``rank`` eigenvectors ``C S e_{π(i)}`` and the coefficients
    ``s_j √λ_{π⁻¹(j)}`` that turn ``z ~ N(0, I)`` into ``x = C(scales ⊙ z) ~ N(0, Σ)``."""
    from scipy.fft import dct

    perm = rng.permutation(dim)  # eigenvalue i sits on coordinate perm[i]
    signs = rng.choice(np.array([-1.0, 1.0]), size=dim)
    scales = np.empty(dim)
    scales[perm] = np.sqrt(_polynomial_spectrum(dim, decay))
    scales *= signs
    unit = np.zeros((dim, rank))
    unit[perm[:rank], np.arange(rank)] = signs[perm[:rank]]
    return dct(unit, type=2, norm="ortho", axis=0), scales


def _random_basis(rng: np.random.Generator, dim: int, rank: int) -> np.ndarray:
    """Haar-uniform orthonormal ``dim × rank`` basis: QR of a Gaussian matrix, sign-fixed."""
    q, r = np.linalg.qr(rng.standard_normal((dim, rank)))
    signs = np.sign(np.diag(r))
    signs[signs == 0] = 1.0
    return q * signs


def _chunk(plan: _Plan, rng: np.random.Generator, start: int, m: int, outliers: np.ndarray):
    """Rows ``start .. start+m`` of the dataset, transposed (``dim × m``), and their labels.

    ``outliers`` holds the global indices (sorted) of outlier rows inside this chunk.
    """
    k, d, dt = plan.rank, plan.dim, plan.dtype
    if plan.scales is not None:  # polynomial: x = C (scales ⊙ z), one DCT per row
        from scipy.fft import dct

        xt = dct(rng.standard_normal((d, m)) * plan.scales[:, None], type=2, norm="ortho", axis=0)
        xt = xt.astype(dt, copy=False)
        labels = np.zeros(m, dtype=np.int32)
        return _plant_outliers(plan, rng, xt, labels, start, outliers)
    rows_idx = np.arange(start, start + m, dtype=np.int64)
    if plan.adversarial:
        blocks = rows_idx // plan.block
        labels = (blocks % plan.n_clusters).astype(np.int32)
        direction = (blocks // plan.n_clusters) % k
    else:
        direction = None
        if plan.n_clusters > 1:
            labels = rng.integers(0, plan.n_clusters, size=m).astype(np.int32)
        else:
            labels = np.zeros(m, dtype=np.int32)

    zt = rng.standard_normal((k, m), dtype=dt)  # latent coordinates, one column per row
    if direction is not None:
        zt *= np.arange(k)[:, None] == direction[None, :]
    if plan.model == "sphere":
        zt /= np.maximum(np.linalg.norm(zt, axis=0), np.finfo(dt).tiny)

    if plan.model == "exact" or plan.gamma == 0.0:
        xt = np.zeros((d, m), dtype=dt)
    else:
        xt = rng.standard_normal((d, m), dtype=dt)
        xt *= dt.type(plan.gamma)
    for c in range(plan.n_clusters):
        u = plan.bases[c]
        cols = slice(None) if plan.n_clusters == 1 else np.flatnonzero(labels == c)
        if plan.n_clusters > 1 and cols.size == 0:
            continue
        z = zt[:, cols]
        if plan.model == "gaussian":  # x = e − U(Uᵀe) + U z = e + U (z − Uᵀe)
            z = z - u.T @ xt[:, cols]
        xt[:, cols] += u @ z

    return _plant_outliers(plan, rng, xt, labels, start, outliers)


def _plant_outliers(plan: _Plan, rng, xt: np.ndarray, labels: np.ndarray, start: int, outliers):
    """Replace the chunk's outlier rows by ``outlier_scale·v``, ``v`` uniform on the sphere."""
    d, dt = plan.dim, plan.dtype
    if outliers.size:
        pos = outliers - start
        v = rng.standard_normal((d, pos.size), dtype=dt)
        v *= dt.type(plan.outlier_scale) / np.linalg.norm(v, axis=0)
        xt[:, pos] = v
        labels[pos] = -1
    return xt, labels


def _write_partition(
    plan: _Plan,
    path: Path,
    rng: np.random.Generator,
    start: int,
    n: int,
    n_outliers: int,
    schema: pa.Schema,
    vector: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Write rows ``start .. start+n`` to ``path``; return (outlier indices, labels)."""
    if n_outliers:
        outliers = np.sort(rng.choice(n, size=n_outliers, replace=False)).astype(np.int64) + start
    else:
        outliers = np.empty(0, dtype=np.int64)
    labels = np.empty(n, dtype=np.int32)
    names = schema.names
    # Random floats do not dictionary-encode: trying costs 5x the write time and 1.5x the size.
    with pq.ParquetWriter(path, schema, compression="snappy", use_dictionary=False) as writer:
        for g0 in range(start, start + n, plan.row_group_rows):
            g = min(plan.row_group_rows, start + n - g0)
            # scalar layout: column j is buf[j], contiguous; vector layout: row i is buf[i]
            shape = (g, plan.dim) if vector else (plan.dim, g)
            buf = np.empty(shape, dtype=plan.dtype)
            for c0 in range(g0, g0 + g, plan.chunk_rows):
                m = min(plan.chunk_rows, g0 + g - c0)
                lo, hi = np.searchsorted(outliers, [c0, c0 + m])
                xt, lab = _chunk(plan, rng, c0, m, outliers[lo:hi])
                if vector:
                    buf[c0 - g0 : c0 - g0 + m] = xt.T
                else:
                    buf[:, c0 - g0 : c0 - g0 + m] = xt
                labels[c0 - start : c0 - start + m] = lab
            if vector:
                values = pa.FixedSizeListArray.from_arrays(pa.array(buf.reshape(-1)), plan.dim)
                table = pa.Table.from_arrays([values], schema=schema)
            else:
                arrays = [pa.array(buf[j]) for j in range(plan.dim)]
                table = pa.Table.from_arrays(arrays, names=names)
            writer.write_table(table, row_group_size=g)
            del table, buf
    return outliers, labels


class _NpyAppender:
    """Write a 1-D ``.npy`` of known length piece by piece (bounded memory)."""

    def __init__(self, path: Path, dtype: str, length: int) -> None:
        self._f = open(path, "wb")  # closed in close()
        self._dtype = np.dtype(dtype)
        self._left = length
        header = {"descr": self._dtype.str, "fortran_order": False, "shape": (length,)}
        np.lib.format.write_array_header_1_0(self._f, header)

    def append(self, values: np.ndarray) -> None:
        self._f.write(np.ascontiguousarray(values, dtype=self._dtype).tobytes())
        self._left -= values.size

    def close(self) -> None:
        self._f.close()
        if self._left != 0:
            raise RuntimeError(f"npy writer: {self._left} values missing")


def _typical_norm(model: str, dim: int, rank: int, gamma: float, decay: float = 1.0) -> float:
    if model == "polynomial":
        return math.sqrt(float(_polynomial_spectrum(dim, decay).sum()))
    if model == "gaussian":
        return math.sqrt(rank + gamma**2 * (dim - rank))
    if model == "sphere":
        return math.sqrt(1.0 + gamma**2 * dim)
    return math.sqrt(rank)


def generate(
    out: str | Path,
    *,
    rows: int,
    dim: int,
    rank: int,
    gamma: float = 0.01,
    model: Literal["gaussian", "sphere", "exact", "polynomial"] = "gaussian",
    order: Literal["random", "adversarial"] = "random",
    outlier_fraction: float = 0.0,
    partitions: int | None = None,
    dtype: Literal["float32", "float64"] = "float32",
    seed: int = 0,
    clusters: int | None = None,
    row_group_size: int = 65536,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
    vector_column: bool = False,
    decay: float = 1.0,
) -> SynthResult:
    """Write a Parquet dataset with a known subspace (BENCHMARKS.md §1); see the module doc.

    Builds everything in a sibling ``OUT.tmp-*`` folder and renames it into place at the end,
    so ``OUT`` is either absent/untouched or complete. ``progress(done, total)`` is called
    with 0 before the first partition file (the clock of its rate starts there) and after
    each. ``vector_column=True`` writes the features as one
    ``fixed_size_list`` column ``x`` instead of ``dim`` scalar columns. Raises ``ValueError``
    (``SynthParameterError``) for a bad parameter and ``FileExistsError``
    (``SynthExistsError``) if ``OUT`` is not empty and ``overwrite`` is false, or if it is
    not a folder ``generate`` wrote (``overwrite`` replaces nothing else).
    """
    rows = _int("rows", rows, 1, None, "an integer >= 1")
    dim = _int("dim", dim, 2, None, "an integer >= 2")
    rank = _int("rank", rank, 1, dim - 1, f"an integer in [1, dim-1] = [1, {dim - 1}]")
    gamma = _float("gamma", gamma, lambda g: g >= 0, "a finite number >= 0")
    model = _choice("model", model, MODELS)
    order = _choice("order", order, ORDERS)
    outlier_fraction = _float(
        "outlier_fraction", outlier_fraction, lambda f: 0 <= f < 1, "a number in [0, 1)"
    )
    dtype = _choice("dtype", dtype, DTYPES)
    if partitions is None:
        partitions = default_partitions(rows, dim, dtype)
    partitions = _int("partitions", partitions, 1, rows, f"an integer in [1, rows] = [1, {rows}]")
    seed = _int("seed", seed, 0, None, "an integer >= 0")
    if clusters is not None:
        hi = dim // rank
        clusters = _int(
            "clusters", clusters, 1, hi, f"an integer in [1, dim // rank] = [1, {hi}] or None"
        )
    row_group_size = _int("row_group_size", row_group_size, 1, None, "an integer >= 1")
    if progress is not None and not callable(progress):
        raise _fail("progress", "a callable (done, total) or None", progress)
    if not isinstance(vector_column, bool | np.bool_):
        raise _fail("vector_column", "True or False", vector_column)
    vector_column = bool(vector_column)
    decay = _float("decay", decay, lambda a: a > 0, "a finite number > 0")
    if model == "polynomial" and (clusters is not None or order != "random"):
        raise _fail("model", "polynomial with order='random' and no clusters", model)

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SynthExistsError(f"output {out} exists and is a file; choose a new folder path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise SynthExistsError(
            f"output folder {out} exists and is not empty; choose a new path "
            "(or pass overwrite=True / --overwrite to replace it)"
        )
    _check_replaceable(out)

    k_clusters = clusters or 1
    np_dtype = np.dtype(dtype)
    row_bytes = dim * np_dtype.itemsize
    row_group_rows = max(1, min(row_group_size, _MAX_ROW_GROUP_BYTES // row_bytes))
    chunk_rows = max(1, min(row_group_rows, _MAX_CHUNK_BYTES // row_bytes))
    block = -(-rows // (4 * k_clusters * rank))
    n_outliers = int(round(outlier_fraction * rows))
    typical = _typical_norm(model, dim, rank, gamma, decay)
    base, extra = divmod(rows, partitions)
    part_rows = [base + (1 if i < extra else 0) for i in range(partitions)]

    basis_rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(0,))))
    scales = None
    if model == "polynomial":
        top, scales = _polynomial_basis(basis_rng, dim, rank, decay)
        bases = top[None]
    else:
        bases = np.stack([_random_basis(basis_rng, dim, rank) for _ in range(k_clusters)])
    split_rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(1,))))
    if n_outliers:
        part_outliers = split_rng.multivariate_hypergeometric(part_rows, n_outliers).tolist()
    else:
        part_outliers = [0] * partitions

    plan = _Plan(
        rows=rows,
        dim=dim,
        rank=rank,
        gamma=gamma,
        model=model,
        adversarial=order == "adversarial",
        n_clusters=k_clusters,
        block=block,
        dtype=np_dtype,
        row_group_rows=row_group_rows,
        chunk_rows=chunk_rows,
        outlier_scale=OUTLIER_SCALE * typical,
        bases=bases.astype(np_dtype),
        scales=scales,
    )
    params: dict[str, Any] = {
        "generator": GENERATOR,
        "format_version": FORMAT_VERSION,
        "rows": rows,
        "dim": dim,
        "rank": rank,
        "gamma": gamma,
        "model": model,
        "order": order,
        "outlier_fraction": outlier_fraction,
        "partitions": partitions,
        "dtype": dtype,
        "seed": seed,
        "clusters": clusters,
        "row_group_size": row_group_size,
        "row_group_rows": row_group_rows,
        "rows_per_partition": part_rows,
        "layout": "vector" if vector_column else "scalar",
        "columns": f"x[0..{dim - 1}]" if vector_column else f"x0..x{dim - 1}",
        "adversarial_block_rows": block if order == "adversarial" else None,
        "outlier_count": n_outliers,
        "outliers_per_partition": part_outliers,
        "outlier_norm": plan.outlier_scale if n_outliers else None,
        "typical_norm": typical,
        "noise_std": 0.0 if model == "exact" else gamma,
        "multiplicative_gap": gamma**2 if model == "gaussian" else None,
        "decay": decay if model == "polynomial" else None,
        "numpy_version": np.__version__,
        "seed_derivation": "SeedSequence(seed, spawn_key=(0,)) basis, (1,) outlier split, "
        "(2, i) partition i",
    }

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        truth = tmp / "_truth"
        truth.mkdir()
        if clusters is None:
            np.save(truth / "basis.npy", bases[0])
            if model == "polynomial":
                np.save(truth / "spectrum.npy", _polynomial_spectrum(dim, decay))
        else:
            for c in range(k_clusters):
                np.save(truth / f"basis_{c}.npy", bases[c])
            np.save(truth / "bases.npy", bases)
        out_writer = (
            _NpyAppender(truth / "outliers.npy", "int64", n_outliers) if n_outliers else None
        )
        lab_writer = _NpyAppender(truth / "labels.npy", "int32", rows) if clusters else None

        value_type = pa.from_numpy_dtype(np_dtype)
        if vector_column:
            schema = pa.schema([pa.field("x", pa.list_(value_type, dim), nullable=False)])
        else:
            schema = pa.schema([pa.field(f"x{j}", value_type) for j in range(dim)])
        names: list[str] = []
        start = 0
        if progress is not None:
            progress(0, partitions)
        for i, n in enumerate(part_rows):
            name = f"part-{i:05d}.parquet"
            ss = np.random.SeedSequence(seed, spawn_key=(2, i))
            rng = np.random.Generator(np.random.PCG64(ss))
            outl, labels = _write_partition(
                plan, tmp / name, rng, start, n, part_outliers[i], schema, vector_column
            )
            if out_writer is not None:
                out_writer.append(outl)
            if lab_writer is not None:
                lab_writer.append(labels)
            names.append(name)
            start += n
            if progress is not None:
                progress(i + 1, partitions)
        for w in (out_writer, lab_writer):
            if w is not None:
                w.close()
        (truth / "params.json").write_text(json.dumps(params, indent=2) + "\n")
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    truth = out / "_truth"
    if clusters is None:
        basis_paths: tuple[Path, ...] = (truth / "basis.npy",)
        bases_path = None
    else:
        basis_paths = tuple(truth / f"basis_{c}.npy" for c in range(k_clusters))
        bases_path = truth / "bases.npy"
    return SynthResult(
        path=out,
        rows=rows,
        dim=dim,
        rank=rank,
        files=tuple(out / n for n in names),
        truth_dir=truth,
        params_path=truth / "params.json",
        basis_paths=basis_paths,
        bases_path=bases_path,
        clusters=clusters,
        params=params,
    )


def _check_replaceable(out: Path) -> None:
    """Refuse an ``out`` that ``generate`` did not write (the rule of every ``--overwrite``)."""
    try:
        check_replaceable(str(out), SYNTH_OUTPUT)
    except InputError as err:
        raise SynthExistsError(str(err)) from None


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is set aside first and removed after."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if not any(out.iterdir()):
        out.rmdir()
        os.rename(tmp, out)
        return
    _check_replaceable(out)  # again: it may have changed while the rows were written
    old = Path(tempfile.mkdtemp(prefix=out.name + ".old-", dir=out.parent))
    old.rmdir()
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
