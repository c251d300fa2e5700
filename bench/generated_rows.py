"""Rows generated on the workers: ``PrivateSubspace(...).fit(dask_array)``, no Parquet.

Each chunk of ``--chunk-rows`` rows is drawn on the worker that computes it, from a seed
of its own (public seed, chunk index): x = U z + γ e with z ~ N(0, I_k), e ~ N(0, I_D),
U a fixed D×k orthonormal basis (the truth), float32 — ``dpsub synth``'s Gaussian model
up to the in-subspace noise term. The Dask array goes through
``dpsub_dist.engine.sources.array_dataset``, so everything after the reader is the code
path of a Parquet run. Every pass over the rows draws them again (same seeds, same rows).

Per n in ``--rows``, on a fresh local cluster of ``--workers`` × ``--memory-limit``
(``engine.cluster.dask_client``): wall time, rows/s (n / wall), peak worker RSS
(``bench.common.PeakMemory``), the manifest's bytes gathered to the driver and method,
and the error (sin of the largest principal angle) against U.

``--row-norm C --no-center`` gives gauss a public row-norm bound and no private mean, so
it reads the rows once instead of four times.

``--parquet DIR`` instead writes the same rows (chunk i is the array's chunk i) to Parquet
under ``DIR/n{n}-d{D}-…/``, then fits that folder as a user would (``fit(path)``): scalar
float32 columns ``x0 …``, one row group per chunk, files of about ``--file-mib`` MiB
(128: what Parquet writers produce), written one chunk at a time (memory: one chunk), into
a temporary folder renamed into place when complete; a complete folder is reused, and
``write_s`` says how long it took to write. ``--memory-limit default`` gives the workers
dpsub's default limit (80 % of the machine's memory shared among them).
``received_bytes`` counts what the driver actually received (:class:`common.GatherMeter`),
beside the manifest's ``summary_bytes_gathered``.

Examples: ``python -m bench.generated_rows --rows 1e7,1e8 --dim 32``;
``python -m bench.generated_rows --rows 1e8 --dim 8 --parquet /work/big --memory-limit default``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import common


def truth(dim: int, rank: int, seed: int) -> np.ndarray:
    """The public D×k orthonormal basis the rows lie near."""
    rng = np.random.default_rng([seed, 0])
    return np.linalg.qr(rng.standard_normal((dim, rank)))[0]


def _chunk(block_id: tuple[int, int], rows: int, basis: np.ndarray, gamma: float, seed: int):
    rng = np.random.default_rng([seed, 1, block_id[0]])
    dim, rank = basis.shape
    z = rng.standard_normal((rows, rank), dtype=np.float32)
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    x *= np.float32(gamma)
    x += z @ basis.T.astype(np.float32)
    return x


def generated_rows(n: int, dim: int, rank: int, gamma: float, chunk_rows: int, seed: int):
    """A lazy n×D float32 Dask array, each chunk drawn where it is computed."""
    import dask.array as da

    sizes = [chunk_rows] * (n // chunk_rows) + ([n % chunk_rows] if n % chunk_rows else [])
    basis = truth(dim, rank, seed)

    def block(block_id: tuple[int, int] = (0, 0)) -> np.ndarray:
        return _chunk(block_id, sizes[block_id[0]], basis, gamma, seed)

    return da.map_blocks(block, dtype=np.float32, chunks=(tuple(sizes), (dim,)))


def write_parquet(
    root: Path,
    n: int,
    dim: int,
    rank: int,
    gamma: float,
    chunk_rows: int,
    seed: int,
    file_mib: float,
) -> Path:
    """The rows of :func:`generated_rows` as Parquet files under ``root`` (module docstring);
    a folder already complete is returned as it is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = f"n{n}-d{dim}-k{rank}-g{gamma:g}-c{chunk_rows}-s{seed}-f{file_mib:g}"
    folder = Path(root) / name
    if folder.exists():
        return folder
    partial = Path(root) / f"{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # what an interrupted write left
    partial.mkdir(parents=True)
    basis = truth(dim, rank, seed)
    chunks_per_file = max(1, int(file_mib * 2**20) // (chunk_rows * dim * 4))
    chunks = -(-n // chunk_rows)
    names = [f"x{j}" for j in range(dim)]
    for first in range(0, chunks, chunks_per_file):
        path = partial / f"part-{first // chunks_per_file:05d}.parquet"
        schema = pa.schema([(c, pa.float32()) for c in names])
        # Random floats do not dictionary-encode (dpsub_dist.synth): trying only costs time.
        with pq.ParquetWriter(path, schema, use_dictionary=False) as writer:
            for index in range(first, min(first + chunks_per_file, chunks)):
                rows = min(chunk_rows, n - index * chunk_rows)
                columns = _chunk((index, 0), rows, basis, gamma, seed).T
                writer.write_table(pa.Table.from_arrays(list(columns), names=names))
    partial.rename(folder)
    return folder


def run_one(args: Any, n: int) -> dict[str, Any]:
    from dpsub_dist.api import PrivateSubspace
    from dpsub_dist.engine.cluster import dask_client
    from dpsub_dist.linalg import subspace_error

    written: dict[str, Any] = {}
    if args.parquet:
        started = time.monotonic()
        source = write_parquet(
            args.parquet,
            n,
            args.dim,
            args.rank,
            args.gamma,
            args.chunk_rows,
            args.seed,
            args.file_mib,
        )
        files = sorted(source.glob("*.parquet"))
        written = {
            "parquet": str(source),
            "write_s": round(time.monotonic() - started, 1),  # ~0 where the folder was reused
            "files": len(files),
            "parquet_bytes": sum(f.stat().st_size for f in files),
        }
    else:
        source = generated_rows(n, args.dim, args.rank, args.gamma, args.chunk_rows, args.seed)
    limit = None if args.memory_limit == "default" else args.memory_limit
    with dask_client(None, True, args.workers, limit) as client:
        limits = {w["memory_limit"] for w in client.scheduler_info()["workers"].values()}
        with common.PeakMemory(client, interval=0.2) as memory, common.GatherMeter() as meter:
            started = time.monotonic()
            model = PrivateSubspace(
                args.rank, epsilon=args.epsilon, delta=args.delta, seed=args.seed, client=client
            )
            if args.method:
                model.set_params(method=args.method)
            if args.row_norm is not None:  # a public bound: gauss skips its private norm pass
                model.set_params(row_norm=args.row_norm)
            if args.no_center:  # no private mean: gauss skips its centring passes
                model.set_params(center=False)
            model.fit(str(source) if args.parquet else source)
            wall = time.monotonic() - started
    manifest = model.manifest_
    error = subspace_error(model.basis_, truth(args.dim, args.rank, args.seed))
    return {
        "rows": n,
        "dim": args.dim,
        "wall_s": round(wall, 1),
        "rows_per_s": round(n / wall),
        "method": manifest.get("method"),
        # The default gauss route's public sample of partitions for the centre (None: no
        # sample, e.g. with --no-center); its rows are read once more besides the full pass.
        "centre_sample": manifest.get("parameters", {}).get("centre_sample"),
        "bytes_gathered": manifest.get("summary_bytes_gathered"),
        "received_bytes": meter.bytes,
        "error": float(error),
        "worker_memory_limit_mib": sorted(round(x / 2**20) for x in limits),
        **written,
        **memory.report(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("generated_rows", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[10**7, 10**8])
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--gamma", type=float, default=0.01)
    parser.add_argument("--method", help="PrivateSubspace's method (default: its default)")
    parser.add_argument("--row-norm", type=float, help="public row-norm bound (default: private)")
    parser.add_argument("--no-center", action="store_true", help="no private mean (one pass)")
    parser.add_argument("--chunk-rows", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="1GiB", help="per worker, or 'default'")
    parser.add_argument("--parquet", type=Path, help="write the rows to Parquet here, read them")
    parser.add_argument("--file-mib", type=float, default=128, help="--parquet's file size")
    parser.add_argument("--seed", type=int, default=1)
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("generated_rows", args)
    records = []
    for n in args.rows:
        record = run_one(args, n)
        common.log(str(record))
        records.append(record)
    parameters = {
        "rows": args.rows,
        "dim": args.dim,
        "rank": args.rank,
        "gamma": args.gamma,
        "method": args.method or "default",
        "row_norm": args.row_norm,
        "center": not args.no_center,
        "chunk_rows": args.chunk_rows,
        "workers": args.workers,
        "threads_per_worker": 1,
        "memory_limit": args.memory_limit,
        "parquet": args.parquet,
        "file_mib": args.file_mib if args.parquet else None,
        "epsilon": args.epsilon,
        "delta": args.delta,
    }
    run.write(parameters, records, None, [])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
