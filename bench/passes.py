"""Where the default route's time goes, per partition: Parquet decode vs each pass's row work.

For one partition of a ``bench.speed`` dataset, times (median of ``--repeats`` rounds of every
step in turn, in process, one BLAS thread) the loader alone and each per-partition function of
the default ``dpsub estimate`` (gauss, centred, private row-norm bound), and the floor's tasks
on the same rows (``floor_task``: pyarrow, columns converted one at a time, XᵀX;
``floor_stacked_task``: the same with dpsub's stacked column decode, ``bench.speed``'s
``floor_stacked``). ``full_pass_task`` is the default's one full-pass task on the
sampled-centre route (decode, centring, clipping at a known bound, one ``syrk`` per block and
the row sum), to set beside ``floor_stacked_task``; ``level_grams`` and ``level_sums`` are
the fused bound-and-Gram and bound-and-sum tasks of the routes that hold or re-read rows.
``subset_grams_task`` and ``subset_sketch_task`` are ``--method friendly``'s partition tasks
at ``--subsets`` t (hashed subsets): the per-subset Gram route's one pass and the sketch
route's first pass, against the public test matrix; ``subset_sketch_stacked_task`` is one of
its later passes, against per-subset bases (``sketch_route_task``: all
:data:`~dpsub_dist.engine.sketch.PASSES` of them). Each ``subset_*`` task is also timed as
``*_loop`` with :func:`looped_partition_grams`, the per-subset loop that the engine's stacked
products replaced, in the same rounds; ``*_over_floor_stacked`` are ratios to the floor's task.

Example: ``python -m bench.passes --rows 1000000 --dim 32``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from scipy.linalg.blas import dsyrk

from bench import common, speed

GRAM_TASK_BYTES = 2**30
"""``subset_grams_task`` is timed only where its t·D² floats take at most this many bytes."""


def timed(steps: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall seconds of each step, the steps taken in turn in each of ``repeats`` rounds
    (a change in a shared machine's load then hits every step alike)."""
    walls: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            walls[name].append(time.perf_counter() - started)
    return {name: statistics.median(times) for name, times in walls.items()}


def looped_partition_grams(
    plan: Any, loader: Any, part: Any, offset: int, right: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``engine.subsets.partition_grams`` as it was before the stacked route: per subset in
    Python, a gather, a peak and a ``syrk`` (or Bᵀ(B·R)); the same values and scaling."""
    from dpsub_dist.engine.subsets import EMPTY_EXPONENT, SAFE_EXPONENT, scaled, subset_order

    rows, units = loader(part)
    order, counts, bounds = subset_order(plan, rows.shape[0], units, offset)
    width = rows.shape[1] if right is None else right.shape[-1]
    grams = np.zeros((plan.subsets, rows.shape[1], width))
    exponents = np.full(plan.subsets, EMPTY_EXPONENT, dtype=np.int64)
    shift = np.zeros(plan.subsets, dtype=np.int64)
    for j in np.flatnonzero(counts):
        block = rows[order[bounds[j] : bounds[j + 1]]]
        peak = max(block.max(), -block.min())
        if peak > 0:
            exponents[j] = np.frexp(peak)[1]
            if abs(exponents[j]) >= SAFE_EXPONENT:
                block = np.ldexp(block, -exponents[j])
            else:
                shift[j] = -2 * exponents[j]
        if right is None:
            grams[j] = dsyrk(1.0, block.T, lower=0)
        else:
            grams[j] = block.T @ (block @ (right if right.ndim == 2 else right[j]))
    if right is None:
        upper = np.triu_indices(rows.shape[1], 1)
        grams[:, upper[1], upper[0]] = grams[:, upper[0], upper[1]]
    return scaled(grams, shift), counts, exponents


def profile(path: Any, repeats: int, subsets: int, rank: int) -> dict[str, float]:
    """Seconds per step on the dataset's first partition."""
    from threadpoolctl import threadpool_limits

    from dpsub_dist.engine.gram import clip_rows, gram_of, partition_gram
    from dpsub_dist.engine.sketch import PASSES, sketch_width, test_matrix
    from dpsub_dist.engine.sources import parquet_dataset
    from dpsub_dist.engine.subsets import SubsetPlan, partition_grams
    from dpsub_dist.methods._centring import CentredLoader
    from dpsub_dist.methods._norm_pass import partition_level_grams, partition_level_sums
    from dpsub_dist.privacy.norm_bound import norm_counts

    dataset = parquet_dataset(str(path), None, None, None, None)
    part = dataset.parts[0]
    rows = dataset.loader(part)[0]
    mean = rows.mean(axis=0)
    plan = SubsetPlan(subsets, dataset.n_rows, seed=1)
    omega = test_matrix(1, dataset.dim, sketch_width(rank, dataset.dim))
    bases = np.linalg.qr(np.random.default_rng(1).standard_normal((subsets, *omega.shape)))[0]
    steps = {
        "floor_task": lambda: speed.floor_gram(part.path),
        "floor_stacked_task": lambda: speed.floor_gram(part.path, stacked=True),
        "decode": lambda: dataset.loader(part),
        "norm_counts": lambda: norm_counts(rows),
        "centre": lambda: rows - mean,
        "gram": lambda: gram_of(clip_rows(rows - mean, 1.0)),
        "level_sums": lambda: partition_level_sums(lambda part: (part, None), rows),
        "level_grams": lambda: partition_level_grams(lambda part: (part - mean, None), rows),
        # The sampled-centre route's whole full-pass task, decode included (the default's one
        # read: the centred rows clipped at a bound released from the sample, Gram and sum).
        "full_pass_task": lambda: partition_gram(
            CentredLoader(dataset.loader, mean), 1.0, True, part
        ),
    }
    rights = {"subset_sketch_task": omega, "subset_sketch_stacked_task": bases}
    if subsets * dataset.dim**2 * 8 <= GRAM_TASK_BYTES:
        rights["subset_grams_task"] = None
    for name, right in rights.items():
        for suffix, grams in (("", partition_grams), ("_loop", looped_partition_grams)):
            steps[name + suffix] = partial(grams, plan, dataset.loader, part, 0, right)
    with threadpool_limits(limits=1, user_api="blas"):
        seconds = timed(steps, repeats)
    seconds["full_pass_over_floor_stacked"] = (
        seconds["full_pass_task"] / seconds["floor_stacked_task"]
    )
    for suffix in ("", "_loop"):
        seconds["sketch_route_task" + suffix] = (
            seconds["subset_sketch_task" + suffix]
            + (PASSES - 1) * seconds["subset_sketch_stacked_task" + suffix]
        )
    floor = seconds["floor_stacked_task"]
    for name in [n for n in seconds if n.startswith(("subset_", "sketch_route"))]:
        seconds[f"{name}_over_floor_stacked"] = seconds[name] / floor
    seconds["rows"] = float(len(rows))
    seconds["partitions"] = float(len(dataset.parts))
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("passes", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--min-files", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--subsets", type=int, default=4000, help="t of the subset tasks")
    args = common.parse_args(parser, argv)
    path, _ = speed.speed_dataset(argparse.Namespace(**vars(args)), args.rows, args.dim)
    seconds = profile(path, args.repeats, args.subsets, args.rank)
    for name, value in seconds.items():
        common.log(f"{name:>28}: {value:.6g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
