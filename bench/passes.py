"""Where the default route's time goes, per partition: Parquet decode vs each pass's row work.

For one partition of a ``bench.speed`` dataset, times (median of ``--repeats``, in process,
one BLAS thread) the loader alone and each per-partition function of the default
``dpsub estimate`` (gauss, centred, private row-norm bound), and the floor's task on the
same rows. The per-pass cost is decode + its row work, so the sum over passes beside the
floor shows how much of the gap is re-reading and how much is work per row.
``full_pass_task`` is the default's one full-pass task on the sampled-centre route (decode,
centring, clipping at a known bound, one ``syrk`` and the sum), to set beside ``floor_task``.
``centred_counts_then_gram`` (the centred rows' counting pass and Gram pass, decode left out)
beside ``centred_level_grams`` (the fused pass, :class:`norm_pass.LevelGrams`) is the row
work the fusion trades for one decode.

Example: ``python -m bench.passes --rows 2000000 --dim 32``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import common, speed


def timed(function: Callable[[], Any], repeats: int) -> float:
    """Median wall seconds of ``function()``."""
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


def profile(path: Any, repeats: int) -> dict[str, float]:
    """Seconds per step on the dataset's first partition."""
    from threadpoolctl import threadpool_limits

    from dpsub_dist.engine.gram import clip_rows, gram_of, partition_gram
    from dpsub_dist.engine.sources import parquet_dataset
    from dpsub_dist.estimators.centring import CentredLoader
    from dpsub_dist.estimators.norm_pass import partition_level_grams, partition_level_sums
    from dpsub_dist.privacy.norm_bound import norm_counts

    dataset = parquet_dataset(str(path), None, None, None, None)
    part = dataset.parts[0]
    rows = dataset.loader(part)[0]
    mean = rows.mean(axis=0)
    steps = {
        "floor_task": lambda: speed.floor_gram(part.path),
        "decode": lambda: dataset.loader(part),
        "norm_counts": lambda: norm_counts(rows),
        "clipped_sum": lambda: clip_rows(rows, 1.0).sum(axis=0),
        "level_sums": lambda: partition_level_sums(lambda part: (part, None), rows),
        "centre": lambda: rows - mean,
        "gram": lambda: gram_of(clip_rows(rows - mean, 1.0)),
        "level_grams": lambda: partition_level_grams(lambda part: (part - mean, None), rows),
        # The sampled-centre route's whole full-pass task, decode included (the default's one
        # read: the centred rows clipped at a bound released from the sample, Gram and sum).
        "full_pass_task": lambda: partition_gram(
            CentredLoader(dataset.loader, mean), 1.0, True, part
        ),
    }
    with threadpool_limits(limits=1, user_api="blas"):
        seconds = {name: timed(step, repeats) for name, step in steps.items()}
    seconds["centred_counts_then_gram"] = (
        2 * seconds["centre"] + seconds["norm_counts"] + seconds["gram"]
    )
    seconds["centred_level_grams"] = seconds["level_grams"]  # centring included
    seconds["rows"] = float(len(rows))
    seconds["partitions"] = float(len(dataset.parts))
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("passes", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--min-files", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = common.parse_args(parser, argv)
    path, _ = speed.speed_dataset(argparse.Namespace(**vars(args)), args.rows, args.dim)
    seconds = profile(path, args.repeats)
    for name, value in seconds.items():
        common.log(f"{name:>12}: {value:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
