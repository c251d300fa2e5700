"""Wide data without a gap: ``power`` vs ``gauss`` vs ``friendly`` on a polynomial spectrum.

Data: ``x ~ N(0, diag(λ))`` with ``λᵢ = i^(−α)`` (``--decay α``), float32 blocks of
``--block-rows`` rows generated on the workers (a Dask array: n = D = 10⁵ is 40 GB, more than
this machine holds or writes quickly). The eigenvectors are the coordinate axes: ``power``
(Haar-random start, i.i.d. Gaussian noise, norm clipping) and ``gauss`` (symmetric Gaussian
noise, norm clipping) are rotation-equivariant, so their errors have the same distribution
in any orthonormal frame (``dpsub synth --model polynomial`` writes the same spectrum in a
random-sign DCT frame). Truth: the population top-k, ``e₁ … e_k``.

Per run: subspace error ‖Π̂ − Π‖ against the population top-k, captured-variance ratio
``tr(V̂ᵀΣV̂)/Σ_{i≤k}λᵢ``, wall time (and power's time per pass), the workers' CPU seconds
(user + system, summed: on a shared machine the wall time depends on the others' load, the CPU
seconds much less), peak worker RSS and peak driver RSS (this process, polled). ``gauss`` is
run only while its D×D matrix fits ``--max-gram-gib``; ``friendly`` only
up to ``--max-friendly-dim``.

Example (docs/power.md): ``nice -n 10 python -m bench.power --dims 1000,10000 --rows 100000``;
the speed runs of docs/history.md ("Speed at D = 10⁵") add ``--methods power --center
--memory-limit 2.5GiB``. gauss at D = 10⁴ holds one or two 800 MB Grams per worker (one
accumulator per worker thread) and needs a 3.3 GiB driver; the run on 2 × 4.5 GiB workers is
in docs/scale.md ("gauss at D = 10⁴").
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from bench import common


def spectrum(dim: int, decay: float) -> np.ndarray:
    return np.arange(1, dim + 1, dtype=np.float64) ** -decay


def polynomial_block(seed: int, index: int, rows: int, dim: int, decay: float) -> np.ndarray:
    """Rows ``√λ ⊙ z``, float32, generated on a worker."""
    rng = np.random.default_rng([seed, 2, index])
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    x *= np.sqrt(spectrum(dim, decay)).astype(np.float32)
    return x


def generated_array(rows: int, dim: int, decay: float, seed: int, block_rows: int):
    import dask
    import dask.array as da

    make = dask.delayed(polynomial_block, pure=True)
    blocks = [
        da.from_delayed(
            make(seed, i, min(block_rows, rows - s), dim, decay),
            shape=(min(block_rows, rows - s), dim),
            dtype=np.float32,
        )
        for i, s in enumerate(range(0, rows, block_rows))
    ]
    return da.concatenate(blocks)


class DriverPeak:
    """Peak RSS of this process, polled every 0.1 s."""

    def __enter__(self) -> DriverPeak:
        import psutil

        self.process, self.peak = psutil.Process(os.getpid()), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(0.1)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def worker_cpu_seconds(client: Any) -> float:
    """User + system CPU seconds of the workers' processes so far, summed."""

    def cpu() -> float:
        import psutil

        times = psutil.Process().cpu_times()
        return times.user + times.system

    return float(sum(client.run(cpu).values()))


def passes(record: dict[str, Any]) -> str:
    """The run's pass times (s): the bound (and centring) passes together, then each iteration."""
    timings = record.get("timings") or {}
    steps = sorted((int(k.split("_")[1]), v) for k, v in timings.items() if k.startswith("pass_"))
    each = [f"{v:.1f}" for _, v in steps]
    first = timings.get("norm_bound_s")
    return ("" if first is None else f"prelim {first:.1f} | ") + " ".join(each)


def captured(basis: np.ndarray, lam: np.ndarray, rank: int) -> float:
    """tr(V̂ᵀΣV̂)/Σ_{i≤k}λᵢ for Σ = diag(λ)."""
    return float(np.sum(lam[:, None] * basis**2) / lam[:rank].sum())


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("power", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[100_000])
    parser.add_argument("--dims", type=common.int_list, default=[1000, 10_000, 100_000])
    parser.add_argument("--rank", type=int, default=3)
    parser.add_argument("--decay", type=float, default=2.0)
    parser.add_argument("--methods", type=common.str_list, default=["power", "gauss", "friendly"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--block-rows", type=int, default=2000)
    parser.add_argument("--iterations", type=int, help="power: T (default: the library's)")
    parser.add_argument("--oversample", type=int, help="power: k' − k (default: the library's)")
    parser.add_argument("--max-gram-gib", type=float, default=1.0)
    parser.add_argument("--max-friendly-dim", type=int, default=10_000)
    parser.add_argument("--center", action="store_true", help="power: --center (3 more passes)")
    parser.add_argument("--memory-limit", help="per worker, e.g. 2.5GiB (default: Dask's share)")
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("power", args)
    from dpsub_dist.engine.cluster import dask_client
    from dpsub_dist.engine.sources import array_dataset

    records: list[dict[str, Any]] = []
    cluster = dask_client(None, quiet=True, workers=args.workers, memory_limit=args.memory_limit)
    with cluster as client:
        for n in args.rows:
            for d in args.dims:
                lam = spectrum(d, args.decay)
                truth = np.zeros((d, args.rank))
                truth[np.arange(args.rank), np.arange(args.rank)] = 1.0  # e₁ … e_k
                array = generated_array(n, d, args.decay, args.seed, args.block_rows)
                for method in common.available_methods(args.methods):
                    base = {"rows": n, "dim": d, "method": method}
                    if method == "gauss" and 8 * d * d / 2**30 > args.max_gram_gib:
                        records.append({**base, "status": "not_run_gram_too_large"})
                        continue
                    if method == "friendly" and d > args.max_friendly_dim:
                        records.append({**base, "status": "not_run_dim"})
                        continue
                    extra = {}
                    if method == "power":
                        extra = {"iterations": args.iterations, "oversample": args.oversample}
                        extra["center"] = True if args.center else None
                    cpu, load = worker_cpu_seconds(client), os.getloadavg()[0]
                    with common.PeakMemory(client) as memory, DriverPeak() as driver:
                        record = common.run_dpsub(
                            method,
                            lambda client, a=array: array_dataset(a),
                            rank=args.rank,
                            epsilon=args.epsilon,
                            delta=args.delta,
                            seed=args.seed,
                            truth=truth,
                            client=client,
                            **extra,
                        )
                    basis = record.get("basis")
                    record = {**base, **common.drop_arrays(record), **memory.report()}
                    record["peak_driver_rss_mib"] = round(driver.peak / 2**20, 1)
                    record["worker_cpu_s"] = round(worker_cpu_seconds(client) - cpu, 1)
                    # the others' load on the shared cores: 1-minute averages at start and end
                    record["load_average"] = [round(load, 2), round(os.getloadavg()[0], 2)]
                    record["captured_variance"] = (
                        None if basis is None else captured(basis, lam, args.rank)
                    )
                    records.append(record)
                    common.log(
                        f"n={n} d={d} {method}: {record['status']} "
                        f"captured={record['captured_variance']} error={record.get('error')} "
                        f"{record['wall_s']:.1f}s (worker CPU {record['worker_cpu_s']}s) "
                        f"driver {record['peak_driver_rss_mib']} MiB "
                        f"worker {record['peak_worker_rss_mib']} MiB passes {passes(record)} "
                        f"load {record['load_average']}"
                    )
    parameters = {
        "rows": args.rows,
        "dims": args.dims,
        "rank": args.rank,
        "decay": args.decay,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "workers": args.workers,
        "memory_limit": args.memory_limit,
        "center": args.center,
        "block_rows": args.block_rows,
        "iterations": args.iterations or "library default",
        "oversample": args.oversample or "library default",
    }
    run.write(parameters, records, None, ())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
