"""Read time of one part: the same rows as D scalar columns vs one vector column.

Writes ``--rows`` × ``--dim`` float32 rows twice with ``dpsub synth`` (one file, one part;
``x0..x{D-1}`` and ``--vector-column``), then in this one process opens each dataset
(footers and planning) and reads its part ``--repeats`` times through the real loader
(``PartReader``), printing the median wall and CPU time. Both layouts must give the same
rows (checked).

Example (the numbers in the README): ``python -m bench.vector_read --rows 2000 --dim 10000``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from dpsub_dist.engine.sources import parquet_dataset
from dpsub_dist.synth import generate


def measure(path: Path, repeats: int) -> tuple[dict[str, float], np.ndarray]:
    started = time.perf_counter()
    dataset = parquet_dataset(str(path), None, None, None, None)
    opened = time.perf_counter() - started
    if len(dataset.parts) != 1:
        raise SystemExit(f"expected one part, got {len(dataset.parts)}: lower --rows")
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        rows, _ = dataset.loader(dataset.parts[0])
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    timing = {
        "open_s": opened,
        "read_median_s": statistics.median(walls),
        "read_cpu_median_s": statistics.median(cpus),
    }
    return timing, rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in ("scalar", "vector"):
            path = Path(tmp) / layout
            generate(
                path,
                rows=args.rows,
                dim=args.dim,
                rank=4,
                partitions=1,
                seed=1,
                vector_column=layout == "vector",
            )
            timing, rows = measure(path, args.repeats)
            results[layout] = rows
            print(
                f"{layout:6s} {args.rows} × {args.dim} float32: open (footers, plan) "
                f"{timing['open_s']:.3f} s, read one part {timing['read_median_s']:.3f} s "
                f"(median of {args.repeats}; CPU {timing['read_cpu_median_s']:.3f} s)",
                flush=True,
            )
    if not np.array_equal(results["scalar"], results["vector"]):
        raise SystemExit("the two layouts read to different rows")


if __name__ == "__main__":
    main()
