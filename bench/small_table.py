"""A small table end to end through the CLI: process start to exit, in process vs a local cluster.

Each repeat runs ``dpsub estimate`` (default method, ε = 1, δ = 10⁻⁶) on the same cached
Parquet table once per ``--schedulers`` entry, in a fresh Python process, the order rotating
between repeats: ``default`` (no --scheduler: chosen from the footers, in process for a table
this size), ``local-cluster`` and ``in-process`` (forced). Wall time is from the process start
to its exit (imports, footers, the fit, writing the output), with the CPU seconds of the
process and of the processes it waited for (a local cluster's workers): on a shared machine
the CPU time shows what the wall time would be without the wait for a core. Medians and the
ratio to ``local-cluster`` are printed as a table.

The subprocess runs in a scratch folder, so ``PYTHONPATH=CHECKOUT`` times another checkout's
CLI with the same command (``--schedulers default`` for one without the choice).

    python -m bench.small_table                     # docs/scale.md, "Small tables"
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

SCHEDULERS = ("default", "local-cluster", "in-process")


def run_once(path: Path, scheduler: str, args, scratch: Path) -> tuple[float, float]:
    """Wall seconds from the start of one ``dpsub estimate`` process to its exit (exit 0
    checked), and its CPU seconds (user + system, with the children it waited for)."""
    command = [sys.executable, "-m", "dpsub_dist.cli", "estimate", str(path)]
    command += ["--rank", str(args.rank), "--epsilon", str(args.epsilon)]
    command += ["--delta", str(args.delta), "--out", str(scratch / "out"), "--overwrite"]
    command += ["--quiet"] + ([] if scheduler == "default" else ["--scheduler", scheduler])
    before, started = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, cwd=scratch, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - started, _children_cpu() - before
    if done.returncode != 0:
        raise SystemExit(f"dpsub estimate failed ({scheduler}): {done.stderr.strip()}")
    return seconds, cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("small_table", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=20)
    parser.add_argument("--rank", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--schedulers", type=common.str_list, default=list(SCHEDULERS))
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("small_table", args)
    path, _ = common.dataset(
        args.data_dir, rows=args.rows, dim=args.dim, rank=args.rank, gamma=0.01, partitions=1
    )
    records = []
    with tempfile.TemporaryDirectory(prefix="dpsub-small-table-") as scratch:
        for repeat in range(args.repeats):
            turn = repeat % len(args.schedulers)
            for scheduler in args.schedulers[turn:] + args.schedulers[:turn]:
                seconds, cpu = run_once(path, scheduler, args, Path(scratch))
                record = {"repeat": repeat, "scheduler": scheduler, "wall_s": seconds}
                records.append({**record, "cpu_s": cpu})
                common.log(f"{scheduler}: {seconds:.2f} s, {cpu:.2f} CPU s")
    medians = {
        s: {
            key: common.median([r[key] for r in records if r["scheduler"] == s])
            for key in ("wall_s", "cpu_s")
        }
        for s in args.schedulers
    }
    cluster = medians.get("local-cluster", {}).get("wall_s")
    print(
        f"| --scheduler | wall s, median of {args.repeats} | CPU s | wall ratio to local-cluster |"
    )
    print("|---|---|---|---|")
    for scheduler, median in medians.items():
        ratio = f"{median['wall_s'] / cluster:.2f}" if cluster else "–"
        print(f"| {scheduler} | {median['wall_s']:.2f} | {median['cpu_s']:.2f} | {ratio} |")
    parameters = {"rows": args.rows, "dim": args.dim, "rank": args.rank}
    run.write({**parameters, "repeats": args.repeats}, records, {"medians": medians})
    return 0


if __name__ == "__main__":
    sys.exit(main())
