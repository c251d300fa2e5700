"""A dataset larger than the cluster's memory, and a worker killed mid-run, through the CLI.

Runs the real command on a Parquet dataset written by ``dpsub synth`` (its ``_truth/``
gives the error), polling every 0.2 s the resident memory of every process of the run:

- default: ``dpsub estimate DATA --workers W --memory-limit L`` (its own local cluster:
  driver, nannies, workers);
- ``--command-line-cluster``: ``dask scheduler`` and W × ``dask worker --memory-limit L
  --no-nanny`` processes (``tests/daskprocs.py``), the budget granted in a fresh SQLite
  ledger, and ``dpsub run JOB --ledger LEDGER --scheduler ADDRESS --run-id scale-1``; with
  ``--kill-at-mib M`` the first worker whose RSS passes M MiB is sent SIGKILL (what the
  kernel's OOM killer does), then the same run id is run again. The ledger's records for
  the run id and the published budget are reported after each attempt. With
  ``--oom-limit-mib M`` instead, the last worker is moved into its own memory cgroup
  (cgroup v1, ``memory.limit_in_bytes`` = M MiB; needs root) and the **kernel's OOM
  killer** ends it when its memory passes M — a real out-of-memory kill, not a signal
  sent by the bench (:class:`MemoryCgroup`).

Reported per attempt: exit code, wall time, peak RSS per process (driver, scheduler,
each worker), the manifest's route and bytes gathered to the driver, and the error
(sin of the largest principal angle) against the true basis.

Example: ``python -m bench.beyond_memory /work/scale-data/d128 --memory-limit 1GiB``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import common

ROOT = Path(__file__).resolve().parents[1]
DPSUB = str(Path(sys.executable).with_name("dpsub"))


class TreeMemory:
    """Peak RSS of named processes and of every descendant of ``root`` (polled)."""

    def __init__(self, named: dict[str, int], root: int | None, interval: float = 0.2) -> None:
        self.named, self.root, self.interval = dict(named), root, interval
        self.peak: dict[str, int] = {}
        self.kill_at: int | None = None
        self.killed: dict[str, Any] | None = None
        self.gone: dict[str, float] = {}  # named processes that ended: seconds after the start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._started = time.monotonic()

    def _processes(self) -> dict[str, Any]:
        import psutil

        found = {}
        for name, pid in self.named.items():
            try:
                proc = psutil.Process(pid)
                if proc.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(pid)
                found[name] = proc
            except psutil.NoSuchProcess:
                self.gone.setdefault(name, round(time.monotonic() - self._started, 1))
                continue
        if self.root is not None:
            try:
                root = psutil.Process(self.root)
                found["driver"] = root
                for child in root.children(recursive=True):
                    found[f"child-{child.pid}-{_role(child)}"] = child
            except psutil.NoSuchProcess:
                pass
        return found

    def _loop(self) -> None:
        while not self._stop.is_set():
            for name, proc in self._processes().items():
                try:
                    rss = proc.memory_info().rss
                except Exception:  # noqa: BLE001 - a process ending must not stop the poller
                    continue
                self.peak[name] = max(self.peak.get(name, 0), rss)
                if (
                    self.kill_at is not None
                    and self.killed is None
                    and name.startswith("worker")
                    and rss > self.kill_at
                ):
                    os.kill(proc.pid, signal.SIGKILL)
                    after = round(time.monotonic() - self._started, 1)
                    self.killed = {"worker": name, "rss_mib": _mib(rss), "after_s": after}
                    common.log(f"SIGKILL {name} (pid {proc.pid}) at {_mib(rss)} MiB, {after} s")
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def report(self) -> dict[str, float]:
        return {name: _mib(rss) for name, rss in sorted(self.peak.items())}


CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


class MemoryCgroup:
    """A cgroup-v1 memory cgroup with a hard limit: the kernel OOM-kills a process in it that
    passes the limit (``memory.oom_control`` counts the kills)."""

    def __init__(self, limit_mib: float) -> None:
        if not (CGROUP_ROOT / "memory.limit_in_bytes").exists() or os.geteuid() != 0:
            raise SystemExit(
                f"--oom-limit-mib needs root and the cgroup-v1 memory controller at {CGROUP_ROOT}"
            )
        self.path = CGROUP_ROOT / f"dpsub-bench-{os.getpid()}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(int(limit_mib * 2**20)))
        self.limit_mib = limit_mib

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        fields = dict(
            line.split() for line in (self.path / "memory.oom_control").read_text().splitlines()
        )
        return int(fields.get("oom_kill", 0))

    def peak_mib(self) -> float:
        return _mib(int((self.path / "memory.max_usage_in_bytes").read_text()))

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError as err:  # a process still inside: leave it for the operator
            common.log(f"could not remove {self.path}: {err}")


def _role(proc: Any) -> str:
    try:
        line = " ".join(proc.cmdline())
    except Exception:  # noqa: BLE001
        return "process"
    if "spawn_main" in line or "multiprocessing" in line:
        return "worker-or-nanny"
    return Path(proc.name()).name


def _mib(value: int) -> float:
    return round(value / 2**20, 1)


def _release(out: Path, truth: np.ndarray) -> dict[str, Any]:
    """The manifest's route, bytes gathered and outcome, and the error vs the truth."""
    from dpsub_dist.io.output import read_run
    from dpsub_dist.linalg import subspace_error

    if not (out / "manifest.json").exists():
        return {"output": "absent"}
    basis, manifest = read_run(str(out))
    parameters = manifest.get("parameters", {})
    found = {
        "output": "complete",
        "method": manifest.get("method") or parameters.get("method"),
        "local_route": parameters.get("local_route"),
        "bytes_gathered": manifest.get("summary_bytes_gathered"),
        "outcome": manifest.get("outcome"),
    }
    if basis is not None:
        found["error"] = float(subspace_error(np.linalg.qr(basis)[0], truth))
    return found


def _attempt(command: list[str], memory: TreeMemory, log: Path) -> dict[str, Any]:
    started = time.monotonic()
    with open(log, "ab") as handle:
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        memory.root = proc.pid
        with memory:
            code = proc.wait()
    wall = round(time.monotonic() - started, 1)
    common.log(f"exit {code} after {wall} s: {' '.join(command)}")
    return {"exit_code": code, "wall_s": wall, "peak_rss_mib": memory.report()}


def run_local(args: Any, truth: np.ndarray, work: Path) -> list[dict[str, Any]]:
    out = work / "out"
    command = [DPSUB, "estimate", str(args.data), "--rank", str(args.rank)]
    command += ["--epsilon", str(args.epsilon), "--delta", str(args.delta), "--seed", "1"]
    command += ["--workers", str(args.workers), "--memory-limit", args.memory_limit]
    command += ["--out", str(out)] + (["--method", args.method] if args.method else [])
    record = _attempt(command, TreeMemory({}, None), work / "dpsub.log")
    record.update(_release(out, truth))
    return [record]


def _ledger_records(ledger: str, dataset: str) -> dict[str, Any]:
    from dpsub_dist.ledger import open_ledger

    with open_ledger(ledger) as book:
        history = book.history()
        status = book.status()
    return {
        "ledger_records": [(r.run_id, r.state) for r in history],
        "published_budget": [str(s.published) for s in status],
        "runs": [s.runs for s in status],
    }


def run_command_line(args: Any, truth: np.ndarray, work: Path) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from daskprocs import start_cluster

    ledger = str(work / "ledger.sqlite")
    dataset = str(Path(args.data).resolve())
    grant = [DPSUB, "budget", "init", "--ledger", ledger, "--dataset", dataset]
    subprocess.run(grant + ["--epsilon", "10", "--delta", "1e-5"], check=True)
    (work / "out").mkdir(exist_ok=True)
    job = work / "job.yaml"
    method = f"method: {args.method}\n" if args.method else ""
    job.write_text(
        f"dataset: {dataset}\nrank: {args.rank}\n{method}"
        f"budget: {{epsilon: {args.epsilon}, delta: {args.delta}}}\n"
        f"output: {work}/out/{{run_id}}\n"
    )
    records = []
    cluster = start_cluster(
        work / "cluster", workers=args.workers, nanny=False, memory_limit=args.memory_limit
    )
    cgroup = MemoryCgroup(args.oom_limit_mib) if args.oom_limit_mib else None
    try:
        named = {"scheduler": cluster.scheduler.pid}
        named.update({f"worker-{i}": p.pid for i, p in enumerate(cluster.workers)})
        victim = f"worker-{len(cluster.workers) - 1}"  # the last worker
        if cgroup is not None:  # the kernel kills it past the limit
            cgroup.add(cluster.workers[-1].pid)
            common.log(f"{victim} in {cgroup.path}")
        command = [DPSUB, "run", str(job), "--ledger", ledger, "--scheduler", cluster.address]
        command += ["--run-id", "scale-1"]
        for attempt in ("first", "again"):
            memory = TreeMemory(named, None)
            memory.kill_at = args.kill_at_mib * 2**20 if args.kill_at_mib else None
            if attempt == "again":
                memory.kill_at = None
            record = {"attempt": attempt, **_attempt(command, memory, work / "dpsub.log")}
            record["killed"] = memory.killed
            if cgroup is not None:
                record["kernel_oom"] = {
                    "worker": victim,
                    "limit_mib": cgroup.limit_mib,
                    "oom_kills": cgroup.oom_kills(),
                    "cgroup_peak_mib": cgroup.peak_mib(),
                    "worker_exit": cluster.workers[-1].poll(),
                    "ended_after_s": memory.gone.get(victim),
                }
            record["workers_left"] = len(cluster.worker_pids())
            record.update(_release(work / "out" / "scale-1", truth))
            record.update(_ledger_records(ledger, dataset))
            common.log(json.dumps(record))
            records.append(record)
    finally:
        cluster.stop()
        if cgroup is not None:
            cgroup.remove()
    return records


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("beyond_memory", __doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="a dpsub synth folder (with _truth/)")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--method", help="dpsub's --method (default: the CLI's default)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="1GiB", help="per worker")
    parser.add_argument("--command-line-cluster", action="store_true")
    parser.add_argument("--kill-at-mib", type=float, help="SIGKILL a worker past this RSS")
    parser.add_argument(
        "--oom-limit-mib",
        type=float,
        help="with --command-line-cluster: a memory cgroup of this size for the last worker, "
        "so that the kernel's OOM killer ends it (root, cgroup v1)",
    )
    parser.add_argument("--work-dir", type=Path, help="outputs and logs (default: a temp dir)")
    args = common.parse_args(parser, argv)
    if args.oom_limit_mib and not args.command_line_cluster:
        parser.error("--oom-limit-mib needs --command-line-cluster (its workers have no nanny)")
    run = common.BenchRun.start("beyond_memory", args)
    truth = np.load(args.data / "_truth" / "basis.npy")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="beyond-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    data_bytes = sum(p.stat().st_size for p in args.data.glob("*.parquet"))
    common.log(f"{data_bytes / 1e9:.2f} GB of Parquet; work folder {work}")
    runner = run_command_line if args.command_line_cluster else run_local
    records = runner(args, truth, work)
    parameters = {
        "data": str(args.data),
        "data_bytes": data_bytes,
        "rank": args.rank,
        "method": args.method or "default",
        "workers": args.workers,
        "memory_limit": args.memory_limit,
        "command_line_cluster": args.command_line_cluster,
        "kill_at_mib": args.kill_at_mib,
        "oom_limit_mib": args.oom_limit_mib,
        "epsilon": args.epsilon,
        "delta": args.delta,
    }
    for record in records:
        common.log(json.dumps(record))
    run.write(parameters, records, None, [])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
