"""Shared plumbing of the bench commands: machine facts, cached data, runs, JSON and plots.

Every bench command writes ``RESULTS/<name>.json`` with the command line, the machine,
the versions, the parameters and one record per measurement, and its plots to
``IMG/<name>*.png`` with the same facts printed under each figure (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
IMG_DIR = ROOT / "docs" / "img"
DATA_DIR = RESULTS_DIR / "data"
EPSILON = 1.0
DELTA = 1e-6


# --------------------------------------------------------------------------- machine, versions


def machine_info() -> dict[str, Any]:
    """Cores, memory, CPU model and load: printed next to every figure."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 0
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(memory / 2**30, 1),
        "cpu": model,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "shared": "machine shared with other engineers while measuring (noisy)",
    }


def bench_versions() -> dict[str, str]:
    """The project's versions (job.versions) plus the peers' libraries in this environment."""
    from importlib.metadata import PackageNotFoundError, version

    from dpsub_dist.job import versions

    found = dict(versions())
    found["git"] = git_revision()
    for package in ("distributed", "dask-ml", "scikit-learn", "matplotlib", "psutil"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def git_revision() -> str:
    """The checkout's commit, with ``-dirty`` when tracked files have local changes."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() or "unknown"


def machine_line(machine: dict[str, Any], found_versions: dict[str, str]) -> str:
    """One line for a figure: machine and the versions that matter."""
    return (
        f"{machine['nproc']} cores, {machine['memory_gib']} GiB, {machine['cpu']} (shared, noisy); "
        f"dpsub {found_versions.get('dpsub_dist')}, numpy {found_versions.get('numpy')}, "
        f"dask {found_versions.get('dask')}"
    )


# --------------------------------------------------------------------------- CLI and results


def base_parser(name: str, description: str) -> argparse.ArgumentParser:
    """Options every bench command shares (where results, plots and cached data go)."""
    parser = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=description)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="JSON output folder")
    parser.add_argument("--img-dir", type=Path, default=IMG_DIR, help="PNG output folder")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="generated data cache")
    parser.add_argument("--no-plot", action="store_true", help="write the JSON only")
    parser.add_argument("--tag", help="suffix of the output names (NAME-TAG.json, NAME-TAG.png)")
    parser.add_argument(
        "--replot",
        type=Path,
        help="redraw the plots from this JSON (its records, command and machine); run nothing",
    )
    parser.add_argument("--epsilon", type=float, default=EPSILON)
    parser.add_argument("--delta", type=float, default=DELTA)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse argv; with ``--replot JSON``, the JSON's own command line (so plots match it)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if args.replot:
        command = json.loads(Path(args.replot).read_text())["command"]
        original = shlex.split(command)[3:]  # drop "python -m bench.NAME"
        args = parser.parse_args(
            [*original, "--replot", str(args.replot), "--img-dir", str(args.img_dir)]
        )
        args.argv = original
    return args


def int_list(text: str) -> list[int]:
    """Comma-separated integers; accepts 1e5-style values."""
    return [int(float(v)) for v in text.split(",") if v.strip()]


def str_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


@dataclass
class BenchRun:
    """One bench invocation: its name, argv, machine and versions, captured at start."""

    name: str
    args: argparse.Namespace
    machine: dict[str, Any]
    versions: dict[str, str]
    started: str
    started_s: float
    replayed: dict[str, Any] | None = None

    @classmethod
    def start(cls, name: str, args: argparse.Namespace) -> BenchRun:
        if getattr(args, "replot", None):
            document = json.loads(Path(args.replot).read_text())
            run = cls(name, args, document["machine"], document["versions"], "", 0.0, document)
            return run
        for folder in (args.results_dir, args.data_dir):
            Path(folder).mkdir(parents=True, exist_ok=True)
        return cls(
            name,
            args,
            machine_info(),
            bench_versions(),
            datetime.now(UTC).isoformat(timespec="seconds"),
            time.monotonic(),
        )

    @property
    def stem(self) -> str:
        """Output file name without extension: the bench name, plus ``-TAG`` if given."""
        tag = getattr(self.args, "tag", None)
        return f"{self.name}-{tag}" if tag else self.name

    @property
    def command(self) -> str:
        if self.replayed:
            return self.replayed["command"]
        argv = getattr(self.args, "argv", sys.argv[1:])
        return "python -m bench." + self.name + " " + shlex.join(argv)

    def footer(self, parameters: str) -> str:
        """Text printed under a figure: command, machine, versions, parameters."""
        return f"{self.command}\n{machine_line(self.machine, self.versions)}\n{parameters}"

    def write(
        self,
        parameters: dict[str, Any],
        records: list[dict[str, Any]],
        summary: Any,
        plots: Sequence[str] = (),
    ) -> Path:
        """Write RESULTS/<name>.json and return its path (a replot writes nothing)."""
        out = Path(self.args.results_dir) / f"{self.stem}.json"
        if self.replayed:
            return Path(self.args.replot)
        document = {
            "bench": self.name,
            "command": self.command,
            "started": self.started,
            "wall_s": round(time.monotonic() - self.started_s, 1),
            "machine": self.machine,
            "versions": self.versions,
            "parameters": parameters,
            "records": records,
            "summary": summary,
            "plots": [str(p) for p in plots],
        }
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(document, indent=1, default=_json_default) + "\n")
        tmp.replace(out)
        print(f"wrote {out}", file=sys.stderr)
        return out


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- statistics


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """Median and 90th percentile (linear interpolation), None when empty."""
    if not values:
        return {"median": None, "p90": None, "count": 0}
    data = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(data)),
        "p90": float(np.quantile(data, 0.9)),
        "count": int(data.size),
    }


def median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


# --------------------------------------------------------------------------- data


def dataset(
    data_dir: Path,
    *,
    rows: int,
    dim: int,
    rank: int,
    gamma: float,
    model: str = "gaussian",
    seed: int = 0,
    dtype: str = "float32",
    partitions: int | None = None,
    vector_column: bool = False,
) -> tuple[Path, np.ndarray]:
    """A cached synthetic Parquet dataset (dpsub_dist.synth) and its true basis."""
    from dpsub_dist.synth import generate, read_truth

    name = f"{model}-n{rows}-d{dim}-k{rank}-g{gamma:.3g}-s{seed}-{dtype}-p{partitions or 'auto'}"
    name += "-vector" if vector_column else ""
    path = Path(data_dir) / name
    if not (path / "_truth" / "params.json").exists():
        log(f"generating {name}")
        generate(
            path,
            rows=rows,
            dim=dim,
            rank=rank,
            gamma=gamma,
            model=model,
            seed=seed,
            dtype=dtype,
            partitions=partitions,
            vector_column=vector_column,
            overwrite=True,
        )
    basis, _ = read_truth(path)
    return path, basis


def load_rows(path: Path) -> np.ndarray:
    """All feature rows of a generated dataset as a float64 array (in-memory benches)."""
    import pyarrow.parquet as pq

    table = pq.read_table(sorted(str(p) for p in Path(path).glob("*.parquet")))
    return np.column_stack([c.to_numpy() for c in table.columns]).astype(np.float64, copy=False)


def available_methods(wanted: Sequence[str]) -> list[str]:
    """The wanted dpsub methods that this version registers in ``job.METHODS``."""
    from dpsub_dist.job import METHODS

    missing = [m for m in wanted if m not in METHODS]
    if missing:
        log(f"not registered in dpsub_dist.job.METHODS (skipped): {', '.join(missing)}")
    return [m for m in wanted if m in METHODS]


def run_dpsub(
    method: str,
    open_dataset: Callable[[Any], Any],
    *,
    rank: int,
    epsilon: float,
    delta: float,
    seed: int,
    truth: np.ndarray | None = None,
    client: Any | None = None,
    **config: Any,
) -> dict[str, Any]:
    """One ``dpsub estimate`` through the library (job.run_estimate); error vs ``truth``."""
    from dpsub_dist.errors import DpsubError
    from dpsub_dist.job import EstimateConfig, run_estimate
    from dpsub_dist.linalg import subspace_error

    cfg = EstimateConfig(
        rank=rank, epsilon=epsilon, delta=delta, method=method, seed=seed, **config
    )
    started = time.monotonic()
    try:
        result = run_estimate(cfg, open_dataset, client)
    except DpsubError as err:
        return {"status": "error", "message": str(err), "wall_s": time.monotonic() - started}
    except MemoryError as err:
        return {
            "status": "out_of_memory",
            "message": str(err),
            "wall_s": time.monotonic() - started,
        }
    wall = time.monotonic() - started
    manifest = result.manifest
    record: dict[str, Any] = {
        "status": "ok" if result.basis is not None else "bottom",
        "method": manifest["method"],  # what ran (--method auto: the method it chose)
        "wall_s": wall,
        "timings": result.timings,
        "summary_bytes_gathered": manifest.get("summary_bytes_gathered"),
        "subsets": manifest["parameters"].get("subsets"),
        "local_route": manifest["parameters"].get("local_route"),
        "failed_step": manifest.get("release", {}).get("failed_step"),
        "row_norm_used": manifest["parameters"].get("row_norm"),  # public or private bound
    }
    if truth is not None:
        record["error"] = 1.0 if result.basis is None else subspace_error(result.basis, truth)
    record["basis"] = result.basis
    return record


def parquet_opener(path: Path) -> Callable[[Any], Any]:
    """``open_dataset`` for job.run_estimate: the generated Parquet folder."""
    from dpsub_dist.engine.sources import parquet_dataset

    def open_dataset(client: Any) -> Any:
        return parquet_dataset(str(path), None, None, None, client)

    return open_dataset


def array_opener(rows: np.ndarray) -> Callable[[Any], Any]:
    """``open_dataset`` for job.run_estimate: an in-memory array."""
    from dpsub_dist.engine.sources import array_dataset

    return lambda client: array_dataset(rows)


def drop_arrays(record: dict[str, Any]) -> dict[str, Any]:
    """The record without NumPy arrays (for JSON)."""
    return {k: v for k, v in record.items() if not isinstance(v, np.ndarray) and k != "basis"}


# --------------------------------------------------------------------------- cluster, memory


@contextmanager
def local_cluster(workers: int, scheduler: str | None = None) -> Iterator[Any]:
    """The project's local process cluster (engine.cluster.dask_client), or ``scheduler``'s.

    Peak memory is read from the worker processes, so a given scheduler must run its
    workers on this machine.
    """
    from dpsub_dist.engine.cluster import dask_client

    with dask_client(scheduler, quiet=True, workers=workers) as client:
        yield client


class PeakMemory:
    """Polls the resident memory of the local workers' processes; peak per worker.

    Reads ``psutil.Process(pid).memory_info().rss`` from the driver (no Dask traffic),
    every ``interval`` seconds, for the worker processes of a *local* cluster.
    """

    def __init__(self, client: Any, interval: float = 0.1) -> None:
        import psutil

        self.interval = interval
        pids = client.run(os.getpid)
        self.processes = {addr: psutil.Process(pid) for addr, pid in pids.items()}
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        for addr, proc in self.processes.items():
            try:
                rss = proc.memory_info().rss
            except Exception:  # noqa: BLE001 - a worker restarting must not stop the poller
                continue
            self.peak[addr] = max(self.peak.get(addr, 0), rss)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self.peak = {}
        self._sample()
        self.baseline = dict(self.peak)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def report(self) -> dict[str, float]:
        """Peak and baseline RSS in MiB (maximum over workers)."""
        return {
            "peak_worker_rss_mib": round(max(self.peak.values(), default=0) / 2**20, 1),
            "baseline_worker_rss_mib": round(max(self.baseline.values(), default=0) / 2**20, 1),
        }


class GatherMeter:
    """Counts the pickled bytes of everything ``Client.gather`` and ``Future.result`` return
    in this process while it is entered: what the driver actually received from the cluster
    (footers, summaries), to set beside the manifest's ``summary_bytes_gathered``;
    tests/privacy/test_no_raw_data.py holds the package to it."""

    def __enter__(self) -> GatherMeter:
        import pickle

        from distributed import Client, Future

        self.bytes = 0
        self.calls = 0
        self._saved = Client.gather, Future.result

        def counted(method: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                value = method(*args, **kwargs)
                self.calls += 1
                self.bytes += len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
                return value

            return call

        Client.gather, Future.result = (counted(m) for m in self._saved)
        return self

    def __exit__(self, *exc: object) -> None:
        from distributed import Client, Future

        Client.gather, Future.result = self._saved


# --------------------------------------------------------------------------- plots


def figure(run: BenchRun, footer: str, ncols: int = 1, width: float = 7.0, height: float = 4.2):
    """A matplotlib figure (Agg) with the command, machine and parameters printed under it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols**0.8, height), squeeze=False)
    fig.text(0.01, 0.01, run.footer(footer), fontsize=6.5, family="monospace", va="bottom")
    fig.subplots_adjust(bottom=0.30, wspace=0.3)
    return fig, list(axes[0])


def save(fig: Any, run: BenchRun, suffix: str = "") -> Path:
    """Save the figure as IMG/<name><suffix>.png and close it."""
    import matplotlib.pyplot as plt

    Path(run.args.img_dir).mkdir(parents=True, exist_ok=True)
    out = Path(run.args.img_dir) / f"{run.stem}{suffix}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    log(f"wrote {out}")
    return out
