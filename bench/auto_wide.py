"""Where gauss's D×D does not fit the driver: ``power`` vs ``friendly`` (and ``auto``'s pick).

Two models written by ``dpsub synth`` (Parquet, cached under ``--data-dir``): ``gaussian`` (the
default gap model: K = rank directions of variance 1 over a noise floor γ = 0.01·50/D, where
sample and aggregate shines) and ``polynomial`` (λᵢ = i^(−decay), no multiplicative gap).
``--driver-mib`` lowers :data:`dpsub_dist.methods.auto.DRIVER_BYTES` for this process (a
bench knob: it makes ``auto`` take its wide-data branch at D ~ 10³, where runs are short);
``power`` and ``friendly`` run with their defaults. ε = 1, δ = 10⁻⁶.

Per run: subspace error ‖Π̂ − Π‖ against the model's top-k, captured variance
``Σᵢ λᵢ‖V̂ᵀuᵢ‖²/Σ_{i≤k}λᵢ`` over the recorded truth (polynomial; a lower bound: the tail
is not counted), ⊥ for friendly's no-release outcome, wall time.

Example (docs/auto.md):
``nice -n 19 python -m bench.auto_wide --dims 2000 --rows 100000 --runs 2 --driver-mib 16``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import common


def data(folder: Path, model: str, rows: int, dim: int, rank: int, decay: float) -> Path:
    """A cached ``dpsub synth`` dataset."""
    from dpsub_dist.synth import generate

    path = folder / f"{model}-n{rows}-d{dim}-k{rank}-a{decay:g}"
    if not (path / "_truth" / "params.json").exists():
        common.log(f"generating {path.name}")
        extra = {"decay": decay} if model == "polynomial" else {"gamma": 0.01 * 50 / dim}
        generate(path, rows=rows, dim=dim, rank=rank, model=model, overwrite=True, **extra)
    return path


def score(basis: np.ndarray | None, path: Path) -> dict[str, Any]:
    from dpsub_dist.linalg import subspace_error
    from dpsub_dist.synth import read_truth

    if basis is None:
        return {"error": None, "captured_variance": None}
    truth = read_truth(path)[0]
    spectrum_file = path / "_truth" / "spectrum.npy"
    captured = None
    if spectrum_file.exists():
        lam = np.load(spectrum_file)[: truth.shape[1]]
        captured = float(np.sum(lam * np.sum((truth.T @ basis) ** 2, axis=1)) / lam.sum())
    return {"error": float(subspace_error(basis, truth)), "captured_variance": captured}


def run_all(args: argparse.Namespace, records: list[dict[str, Any]]) -> None:
    """Every (model, n, D, method, run), appended to ``records`` as each finishes."""
    from dpsub_dist.job import EstimateConfig, run_estimate

    with common.local_cluster(args.workers, args.scheduler) as client:
        for model in args.models:
            for rows in args.rows:
                for dim in args.dims:
                    path = data(args.data_dir, model, rows, dim, args.rank, args.decay)
                    for method in args.methods:
                        for run in range(args.runs):
                            config = EstimateConfig(
                                rank=args.rank, method=method, epsilon=1.0, delta=1e-6, seed=run
                            )
                            started = time.monotonic()
                            result = run_estimate(config, common.parquet_opener(path), client)
                            record = {
                                "model": model,
                                "rows": rows,
                                "dim": dim,
                                "method": method,
                                "ran": result.manifest["method"],
                                "run": run,
                                "wall_s": round(time.monotonic() - started, 1),
                                **score(result.basis, path),
                            }
                            records.append(record)
                            common.log(json.dumps(record))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=common.int_list, default=[2000])
    parser.add_argument("--rows", type=common.int_list, default=[100_000])
    parser.add_argument("--rank", type=int, default=3)
    parser.add_argument("--decay", type=float, default=2.0)
    parser.add_argument("--models", type=common.str_list, default=["gaussian", "polynomial"])
    parser.add_argument("--methods", type=common.str_list, default=["power", "friendly", "auto"])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scheduler", help="tcp:// address of a running local cluster")
    parser.add_argument("--driver-mib", type=float, help="lower auto's driver budget (MiB)")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/dpsub-auto-wide"))
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    from dpsub_dist.methods import auto

    records: list[dict[str, Any]] = []
    saved = auto.DRIVER_BYTES  # the bench knob holds for this run only
    if args.driver_mib is not None:
        auto.DRIVER_BYTES = int(args.driver_mib * 2**20)
    try:
        run_all(args, records)
    finally:
        auto.DRIVER_BYTES = saved
    if args.json:
        args.json.write_text(json.dumps({"argv": argv, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
