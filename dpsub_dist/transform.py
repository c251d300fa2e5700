"""``dpsub transform``: project Parquet rows onto a published basis, on the Dask workers.

A run publishes its basis V (``basis.npy``, D×k) and, in its manifest, the centre it subtracted
(``release.mean``) or, with ``--standardize``, the location and scale it standardised with
(``release.location``, ``release.scale``). :class:`Projection` applies exactly that map to
new rows, ``z = clip((x − location) / scale, ±standardize_bound) V`` (or ``(x − mean) V``, or
``x V`` for an uncentred run), in float64 as the run's loaders did
(``methods/_centring.py: CentredLoader``, ``methods/_standardize.py: StandardisedLoader``).
The Python API's ``transform`` and ``PrivateSubspace.from_run`` use the same
:class:`Projection`.

Privacy: every number the map uses is a released value of the run, so the map is
post-processing of the run's (ε, δ) release: it needs no budget and charges nothing (no ledger
is opened). Its output is different: one row per input row, computed from the rows without
any noise. It is the operator's data, as the input is, never a private release.

The output folder holds one Parquet file per input partition (``part-00000.parquet``, …: runs
of row groups of one file, in file order, so reading the folder in name order gives the input's
row order), written by the workers, then ``_transform.json`` (what was projected with what;
Parquet readers skip names that start with ``_``), written last, atomically as every dpsub
output (:func:`dpsub_dist.io.output.staged_output`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsub_dist.errors import DataError, InputError, RunAborted
from dpsub_dist.io.output import (
    TRANSFORM_MANIFEST,
    TRANSFORM_OUTPUT,
    check_output_dir,
    json_bytes,
    read_run,
    staged_output,
)
from dpsub_dist.io.parquet import FileInfo, Part, PartReader
from dpsub_dist.io.storage import STORAGE_ERRORS, filesystem, join, short_error
from dpsub_dist.privacy import column_scales

COMPONENT_PREFIX = "pc"
"""Output columns: ``pc1`` … ``pck``, the projections on the basis's columns in order."""


def prepared(rows: Any, centre: Any | None, scale: Any | None) -> Any:
    """``rows − centre``, or with a ``scale`` the standardised rows the run read
    (``(rows − centre)/scale`` clipped to the public bound,
    :func:`dpsub_dist.privacy.column_scales.standardise`), each step only where the run took
    it (NumPy or Dask arrays alike): the map a run applied to its rows before estimating."""
    if scale is not None:
        return column_scales.standardise(rows, centre, scale)
    return rows if centre is None else rows - centre


def project(rows: Any, basis: Any, centre: Any | None, scale: Any | None) -> Any:
    """:func:`prepared` rows projected on the released basis: the run's scores."""
    return prepared(rows, centre, scale) @ basis


def unproject(scores: Any, components: Any, centre: Any | None, scale: Any | None) -> Any:
    """The inverse of :func:`project` on the span of the basis: ``scores @ components``,
    times ``scale``, plus ``centre``."""
    out = scores @ components
    if scale is not None:
        out = out * scale
    return out if centre is None else out + centre


def released_centring(manifest: dict[str, Any]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The centre and scale a run applied to its rows before estimating, from its manifest's
    released values (a boosted run's: the chosen group's): ``--standardize``'s location and
    scale, else the private mean of a centred run, else neither."""
    from dpsub_dist.methods.boost import chosen_view

    release = chosen_view(manifest)["release"]
    centre = release.get("location", release.get("mean"))
    scale = release.get("scale")
    return (
        None if centre is None else np.asarray(centre, dtype=np.float64),
        None if scale is None else np.asarray(scale, dtype=np.float64),
    )


@dataclass(frozen=True)
class Projection:
    """A run's map from rows to scores (:func:`project`), with the columns it reads."""

    basis: np.ndarray
    centre: np.ndarray | None
    scale: np.ndarray | None
    columns: tuple[str, ...]
    widths: tuple[int | None, ...]

    @property
    def rank(self) -> int:
        return int(self.basis.shape[1])

    @property
    def names(self) -> list[str]:
        """The output's component columns: ``pc1`` … ``pck``."""
        return [f"{COMPONENT_PREFIX}{j + 1}" for j in range(self.rank)]

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return project(rows, self.basis, self.centre, self.scale)


def run_projection(run: str, storage_options: Any = None) -> tuple[Projection, dict[str, Any]]:
    """The projection a published run defines, and its manifest; bad input (exit 2) for a
    folder that holds no basis, a clustering run's K bases or a release that names no
    columns."""
    basis, manifest = read_run(run, storage_options)
    if basis is None:
        raise InputError(
            f"{run} released no basis (outcome {manifest.get('outcome')}): nothing to project "
            "on; transform with a run that released one"
        )
    if basis.ndim != 2:
        raise InputError(
            f"{run} is a clustering run ({basis.shape[0]} bases): transform projects on one "
            "basis; use PrivateSubspaceClustering's transform/predict for distances to each"
        )
    columns = list(manifest.get("columns") or [])
    if not columns:
        raise InputError(
            f"the manifest of {run} names no columns (a stream started without --columns), so "
            "the input's columns cannot be matched to the basis: start the stream with --columns"
        )
    vectors = manifest.get("vector_columns") or {}
    widths = tuple(vectors.get(name) for name in columns)
    centre, scale = released_centring(manifest)
    dim = sum(1 if w is None else int(w) for w in widths)
    if basis.shape[0] != dim:
        raise InputError(
            f"{run}: basis.npy has {basis.shape[0]} rows but the manifest's columns give "
            f"{dim} features: the folder is not one run's output; re-run the estimate"
        )
    return Projection(basis, centre, scale, tuple(columns), widths), manifest


def check_columns(info: FileInfo, projection: Projection, where: str) -> None:
    """Refuse (exit 2, from the footer alone) an input without the run's columns, or with one
    of another kind: non-numeric, or a scalar where the run read a list or back, or a
    fixed_size_list of another width."""
    by_name = {column.name: column for column in info.columns}
    missing = [name for name in projection.columns if name not in by_name]
    if missing:
        shown = ", ".join(projection.columns[:12]) + (", …" if len(projection.columns) > 12 else "")
        raise InputError(
            f"{where} lacks the run's column(s) {missing}: the basis projects exactly the "
            f"columns the run read ({shown}), so add or rename them in the input"
        )
    for name, width in zip(projection.columns, projection.widths, strict=True):
        column = by_name[name]
        if not column.numeric:
            raise InputError(
                f"column {name} of {where} is {column.type}, but the run read numbers there: "
                "convert it to a numeric type"
            )
        if width is None and column.vector:
            raise InputError(
                f"column {name} of {where} is a list ({column.type}) but a scalar column in the "
                "run: write it as one number per row"
            )
        if width is not None and not column.vector:
            raise InputError(
                f"column {name} of {where} is a scalar ({column.type}) but a list of {width} "
                f"values per row in the run: write it as fixed_size_list of {width} numbers"
            )
        if width is not None and column.width is not None and column.width != width:
            raise InputError(
                f"list column {name} of {where} has {column.width} values per row but the run's "
                f"had {width}: transform data of the run's shape"
            )


def check_keep(info: FileInfo, keep: Sequence[str], projection: Projection, where: str) -> None:
    """Refuse (exit 2) kept columns the input lacks, repeated, or named like a component."""
    names = [column.name for column in info.columns]
    missing = [name for name in keep if name not in names]
    if missing:
        raise InputError(
            f"--keep-columns {missing} not in {where}: available columns are {names[:20]}"
        )
    if len(set(keep)) != len(keep):
        raise InputError("--keep-columns names a column twice: name each once")
    clash = [name for name in keep if name in projection.names]
    if clash:
        raise InputError(
            f"--keep-columns {clash} would clash with the component columns "
            f"{projection.names[0]}…{projection.names[-1]}: rename the column in the input"
        )


def part_name(index: int, parts: int) -> str:
    """``part-00007.parquet``: zero-padded so that name order is input order."""
    return f"part-{index:0{max(5, len(str(parts - 1)))}d}.parquet"


@dataclass(frozen=True)
class PartWriter:
    """Picklable task body: read one input partition's feature (and kept) columns, project
    the rows, write the scores and the kept columns to one Parquet file (on a worker)."""

    reader: PartReader
    projection: Projection
    keep: tuple[str, ...]
    folder: str
    storage_options: Any = None

    def __call__(self, part: Part, name: str) -> tuple[int, int]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table, file_row = self.reader.read_table(part, self.keep)
        scores = self.projection(self.reader.table_rows(table, part.path, file_row))
        columns = {name: table.column(name) for name in self.keep}
        columns |= {pc: pa.array(scores[:, j]) for j, pc in enumerate(self.projection.names)}
        target = join(self.folder, name)
        try:
            fs, path = filesystem(target, self.storage_options)
            with fs.open(path, "wb") as handle:
                pq.write_table(pa.table(columns), handle)
            written = int(fs.size(path))
        except STORAGE_ERRORS as err:
            raise RunAborted(
                f"cannot write {target} ({short_error(err)}): nothing was written; free space "
                "or fix the output's permissions, then re-run"
            ) from None
        return table.num_rows, written


@dataclass(frozen=True)
class TransformResult:
    out: str
    rows: int
    files: int
    rank: int
    row_level: bool
    """Whether the run was at row level, where row counts are public and may be printed."""
    manifest: dict[str, Any]


def transform_table(
    run: str,
    uri: str,
    out: str,
    keep: Sequence[str] = (),
    overwrite: bool = False,
    storage_options: Any = None,
    scheduler: str | None = None,
    workers: int | None = None,
    memory_limit: str | None = None,
    quiet: bool = False,
) -> TransformResult:
    """Project the Parquet rows of ``uri`` on the basis of ``run`` into the folder ``out``
    (module docstring); the public checks (run, columns, output) come before any row is read.
    """
    from dpsub_dist.context import versions
    from dpsub_dist.engine.cluster import run_place
    from dpsub_dist.engine.compute import IN_PROCESS, Executor
    from dpsub_dist.engine.sources import parquet_dataset, read_footers
    from dpsub_dist.io.storage import StorageOptions

    options = StorageOptions.wrap(storage_options)
    projection, manifest = run_projection(run, options)
    check_output_dir(out, overwrite, options, inputs=(uri, run), written=TRANSFORM_OUTPUT)
    footers = read_footers(uri, options, IN_PROCESS)
    check_columns(footers.infos[0], projection, uri)
    check_keep(footers.infos[0], keep, projection, uri)
    if not footers.n_rows:
        raise InputError(f"{uri} has no rows: nothing to transform")
    row_level = manifest.get("privacy", {}).get("unit") == "row"

    def open_dataset(executor: Executor):
        columns = list(projection.columns)
        dataset = parquet_dataset(uri, columns, None, options, executor, footers=footers)
        if tuple(dataset.widths or (None,) * len(dataset.columns)) != projection.widths:
            raise DataError(
                f"the list columns of {uri} have widths {dataset.vector_columns} in their first "
                f"rows but the run's had {manifest.get('vector_columns')}: transform data of "
                "the run's shape"
            )
        return dataset

    where = (scheduler, open_dataset, row_level, quiet, workers, memory_limit)
    with run_place(*where) as (client, opened):
        import dask

        executor = Executor(client)
        dataset = opened(executor)
        with staged_output(out, overwrite, options, TRANSFORM_OUTPUT) as staging:
            writer = PartWriter(dataset.loader, projection, tuple(keep), staging.uri, options)
            names = [part_name(i, len(dataset.parts)) for i in range(len(dataset.parts))]
            task = dask.delayed(writer, pure=False)
            tasks = [task(part, name) for part, name in zip(dataset.parts, names, strict=True)]
            label = f"{len(tasks)} partitions → {out}"
            shown = not quiet and row_level  # task counts follow n: public at row level only
            done = executor.run([], tasks, label, shown, rows=dataset.n_rows if shown else None)
            check_written(staging.sizes(), names, done, out, scheduler)
            files = [
                {"name": name, "rows": rows, "bytes": size}
                for name, (rows, size) in zip(names, done, strict=True)
            ]
            record = transform_manifest(run, manifest, uri, projection, keep, files)
            record["versions"] = versions()
            staging.write(TRANSFORM_MANIFEST, json_bytes(record))
    total = sum(rows for rows, _ in done)
    return TransformResult(staging.final, total, len(files), projection.rank, row_level, record)


def check_written(
    found: dict[str, int],
    names: list[str],
    done: list[tuple[int, int]],
    out: str,
    scheduler: str | None,
) -> None:
    """Every part the workers wrote is where this process will move it from, at its size: a
    cluster on other machines writes a local ``--out`` to its own disks (RunAborted, exit 5)."""
    lost = [name for name, (_, size) in zip(names, done, strict=True) if found.get(name) != size]
    if lost:
        raise RunAborted(
            f"{len(lost)} of the {len(names)} files the workers wrote are not in {out} as seen "
            f"from here (workers of {scheduler or 'the cluster'} on other machines write a "
            "local folder on their own disks): nothing was written; pass an s3:// --out or a "
            "folder every worker and this machine share"
        )


def transform_manifest(
    run: str,
    manifest: dict[str, Any],
    uri: str,
    projection: Projection,
    keep: Sequence[str],
    files: list[dict[str, Any]],
) -> dict[str, Any]:
    """``_transform.json``: what was projected, with which release, into which files."""
    centring = (
        "standardised: (x − location) / scale"
        if projection.scale is not None
        else "centred: x − mean"
        if projection.centre is not None
        else "uncentred: x as read"
    )
    ledger = manifest.get("ledger")  # dpsub run: the ledger's record of the run
    return {
        "kind": "transform",
        "outcome": "ok",
        "run": run,
        "run_id": ledger.get("run_id") if isinstance(ledger, dict) else None,
        "run_manifest_sha256": hashlib.sha256(
            json.dumps(manifest, sort_keys=True).encode()
        ).hexdigest(),
        "input": uri,
        "columns": list(projection.columns),
        "vector_columns": {
            name: width
            for name, width in zip(projection.columns, projection.widths, strict=True)
            if width is not None
        },
        "components": projection.names,
        "keep_columns": list(keep),
        "centring": f"{centring}, with the run's released values (its manifest's release)",
        "n_rows": sum(f["rows"] for f in files),
        "files": files,
        "privacy": "post-processing of the run's release: no budget spent, nothing charged; "
        "the rows are the input's, projected without noise: the operator's data, not a release",
    }


def cmd_transform(args: Any) -> int:
    """``dpsub transform RUN INPUT --out OUTPUT``: the CLI's door (cli.py registers it)."""
    from dpsub_dist.io.storage import StorageOptions

    keep = [name.strip() for name in (args.keep_columns or "").split(",") if name.strip()]
    result = transform_table(
        args.run,
        args.input,
        args.out,
        keep,
        args.overwrite,
        StorageOptions.from_pairs(args.storage_option),
        args.scheduler,
        args.workers,
        args.memory_limit,
        args.quiet,
    )
    kept = f" and {', '.join(keep)}" if keep else ""
    rows = f"{result.rows:,} rows × " if result.row_level else ""
    print(
        f"wrote {result.out.rstrip('/')}: {rows}pc1…{COMPONENT_PREFIX}{result.rank}{kept} in "
        f"{result.files} Parquet file(s) and {TRANSFORM_MANIFEST}; no budget spent "
        "(post-processing of the run's release)"
    )
    return 0
